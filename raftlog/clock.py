"""The node's wall clock, with an offset a fault-injection harness can move at run time.

Jepsen's clock nemesis skews a node's clock. Moving the machine's clock would skew every node
(and the harness), and libfaketime hangs Python 3.11's threading timeouts, so a node started
with ``RAFTLOG_CLOCK_OFFSET_FILE=<path>`` instead adds the number of seconds written in that
file (a float, re-read every ``POLL_INTERVAL_S``; a missing or unreadable file means 0) to
``time.time()`` and ``time.time_ns()`` for the whole process, so every wall-clock reading of
the node moves (e.g. produced record timestamps, retention, segment.ms, flush.ms, ISR lag,
transaction timeouts, producer-id expiry). Monotonic clocks (trio deadlines, broker leases,
Raft timers) stay untouched, as they would on a real machine whose wall clock is stepped; so
does a :class:`SteadyWallClock` once built (the group coordinator's clock), which takes the
wall clock only at construction. Without the variable nothing is patched.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import trio

ENV_OFFSET_FILE: Final = "RAFTLOG_CLOCK_OFFSET_FILE"
POLL_INTERVAL_S: Final = 0.2

_real_time = time.time
_real_time_ns = time.time_ns
_offset_ns = 0


def _time() -> float:
    return _real_time() + _offset_ns / 1e9


def _time_ns() -> int:
    return _real_time_ns() + _offset_ns


def set_offset_s(offset_s: float) -> None:
    """Skew this process's wall clock by ``offset_s`` seconds (0 restores it)."""
    global _offset_ns
    _offset_ns = int(offset_s * 1e9)
    time.time = _time  # deliberate: this process's wall clock
    time.time_ns = _time_ns


def read_offset_s(path: Path) -> float:
    try:
        return float(path.read_text(encoding="utf-8").strip() or 0)
    except (OSError, ValueError):
        return 0.0


async def follow_offset_file() -> None:
    """Apply the offset in ``$RAFTLOG_CLOCK_OFFSET_FILE`` until cancelled (returns at once
    when the variable is unset)."""
    name = os.environ.get(ENV_OFFSET_FILE)
    if not name:
        return
    path = Path(name)
    while True:
        offset_s = read_offset_s(path)
        if int(offset_s * 1e9) != _offset_ns or time.time is not _time:
            set_offset_s(offset_s)
        await trio.sleep(POLL_INTERVAL_S)


class SteadyWallClock:
    """Epoch milliseconds that never jump: the wall clock read once, then advanced by the
    monotonic clock only. For deadlines that must survive a stepped wall clock (an NTP step,
    a Jepsen clock fault) while the timestamps they sit next to still read as dates. Kafka's
    group coordinator times heartbeats and rebalances with a monotonic clock for the same
    reason: a forward step would evict every member at once, a backward one would keep a
    dead member's partitions unassigned for the length of the step."""

    def __init__(self, wall_s: Callable[[], float] | None = None,
                 monotonic_s: Callable[[], float] = time.monotonic) -> None:
        self._monotonic_s = monotonic_s
        wall = (wall_s or time.time)()
        self._origin_ms = wall * 1000 - monotonic_s() * 1000

    def now_ms(self) -> int:
        return int(self._origin_ms + self._monotonic_s() * 1000)
