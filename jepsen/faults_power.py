"""The ``power-loss`` fault: lose every write a node had not fsynced.

A power cut loses the page cache. With each node's data directory on its own LazyFS mount
(:mod:`jepsen.lazyfs`), the fault is: SIGKILL the victims, then tell each victim's LazyFS to
drop every write not yet fsynced (``lazyfs::clear-cache``); the victims restart when the fault
stops (like ``kill``). Targets: ``one``, ``minority``, ``majority``, ``all`` (a whole-cluster
power cut: the case where only fsync stands between an acknowledged write and its loss, since
with replication a minority's losses are repaired from the others).

``--nemesis power-loss`` (or ``all`` where LazyFS is available) mounts the data directories
on LazyFS at cluster creation and unmounts them at teardown.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, Final

POWER_LOSS: Final = "power-loss"
POWER_TARGETS: Final = ("one", "minority", "majority", "all")


def kinds_in(nemesis: str) -> tuple[str, ...]:
    """The fault kinds named in ``--nemesis`` (``all`` is not expanded here)."""
    return tuple(k.strip() for k in nemesis.split(",") if k.strip())


def wants_power_loss(nemesis: str) -> bool:
    """``power-loss`` is named explicitly (so LazyFS is required)."""
    return POWER_LOSS in kinds_in(nemesis)


def power_victims(target: str, nodes: Sequence[int], rng: random.Random) -> list[int]:
    """The nodes a power-loss fault with ``target`` hits (sorted)."""
    n = len(nodes)
    count = {"one": 1, "minority": (n - 1) // 2, "majority": n // 2 + 1, "all": n}.get(target)
    if count is None:
        raise ValueError(f"unknown power-loss target {target!r}; choose from "
                         + ", ".join(POWER_TARGETS))
    return sorted(rng.sample(list(nodes), max(1, count)))


def apply_power_loss(victims: Sequence[int], kill: Callable[[int], None],
                     clear_cache: Callable[[int], None]) -> dict[str, Any]:
    """Kill every victim first (a power cut hits them at once), then drop each one's
    unsynced writes. Returns what happened, for the history (``errors``: the victims whose
    cache could not be cleared; they still restart when the fault stops)."""
    for n in victims:
        kill(n)
    cleared, errors = [], {}
    for n in victims:
        try:
            clear_cache(n)
            cleared.append(n)
        except Exception as exc:  # recorded below; the others still lose their caches
            errors[str(n)] = f"{type(exc).__name__}: {exc}"
    out: dict[str, Any] = {"nodes": list(victims), "cleared": cleared}
    if errors:
        out["errors"] = errors
    return out

