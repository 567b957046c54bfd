"""The node's wall clock, with an offset a fault-injection harness can move at run time.

Jepsen's clock nemesis skews a node's clock. Moving the machine's clock would skew every node
(and the harness), and libfaketime hangs Python 3.11's threading timeouts, so a node started
with ``RAFTLOG_CLOCK_OFFSET_FILE=<path>`` instead adds the number of seconds written in that
file (a float, re-read every ``POLL_INTERVAL_S``; a missing or unreadable file means 0) to
``time.time()`` and ``time.time_ns()`` for the whole process: exactly the places where the
node reads wall-clock time (record timestamps, retention, group and offset expiry, broker
heartbeat times). Monotonic clocks (trio deadlines, session timeouts, Raft timers) stay
untouched, as they would on a real machine whose wall clock is stepped. Without the variable
nothing is patched.
"""

from __future__ import annotations

import os
import time
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
