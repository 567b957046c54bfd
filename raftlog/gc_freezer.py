"""Keep CPython's cyclic garbage collector from walking the whole long-lived heap.

Why: a node holding thousands of partitions has millions of GC-tracked objects (segments,
indexes, replica state, the metadata image), all long-lived. Every full (generation 2)
collection walks them all while holding the GIL: measured during a 10,000-partition create,
150-280 ms per collection, two or three of them every 5 s on each node. pysyncobj's tick
thread sends the Raft heartbeats; it cannot run meanwhile, so followers' election timeouts
(0.35-0.9 s) fired and the controller moved in the middle of CreateTopics.

What: at the end of every full collection, everything that survived it is moved to the
permanent generation (``gc.freeze()``), so the next full collections walk only what was
allocated since. Reference counting still frees frozen objects; what the permanent
generation keeps are reference cycles among frozen objects that became garbage later (a
deleted partition's objects, a closed connection that had lived through a collection). So
every ``thaw_interval_s`` (an hour) the next full collection is made to walk everything again
(``gc.unfreeze()`` at the end of the one before it): one long pause per interval instead of
one every few seconds, and the cycles are reclaimed within about two intervals.

:class:`FreezePolicy` is the decision (pure, clock passed in); :func:`gc_freezer` installs it
as a ``gc.callbacks`` hook for the life of a process (``raftlog.node.run_until_signalled``).
"""

from __future__ import annotations

import contextlib
import enum
import gc
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

__all__ = ["GC_THAW_INTERVAL_S", "FreezePolicy", "GcAction", "gc_freezer"]

log = logging.getLogger(__name__)

# Why an hour: the walk of everything that follows a thaw took 0.33-0.53 s on each node of an
# idle 3-node cluster with 10,000 partitions (2 cores), longer than the shortest Raft election
# timeout (0.35 s); with a thaw every 10 minutes the controller moved at the first one (which
# coincided with a pysyncobj log compaction, itself a 0.4-0.5 s stall at that size). Garbage
# cycles among long-lived objects (partitions of deleted topics, closed connections) wait at
# most about two hours to be reclaimed.
GC_THAW_INTERVAL_S: Final = 3600.0
OLDEST_GENERATION: Final = 2


class GcAction(enum.Enum):
    FREEZE = "freeze"  # move the survivors to the permanent generation
    THAW = "thaw"  # put the permanent generation back, so the next full collection walks it


class FreezePolicy:
    """What to do at the end of each full collection."""

    def __init__(self, thaw_interval_s: float, now: float) -> None:
        assert thaw_interval_s > 0
        self.thaw_interval_s = thaw_interval_s
        self._walked_all_at = now  # nothing is frozen before the first full collection
        self._thawed = False
        self.freezes = 0
        self.thaws = 0

    def full_collection_done(self, now: float) -> GcAction:
        if self._thawed:  # this collection walked everything: start a new interval
            self._thawed = False
            self._walked_all_at = now
        elif now - self._walked_all_at >= self.thaw_interval_s:
            self._thawed = True
            self.thaws += 1
            return GcAction.THAW
        self.freezes += 1
        return GcAction.FREEZE


@contextlib.contextmanager
def gc_freezer(thaw_interval_s: float = GC_THAW_INTERVAL_S,
               clock: Callable[[], float] = time.monotonic) -> Iterator[FreezePolicy]:
    """Freeze the survivors of every full collection while the block runs (see the module
    docstring); on exit, stop and put every frozen object back under the collector."""
    policy = FreezePolicy(thaw_interval_s, clock())

    def on_collection(phase: str, info: dict[str, Any]) -> None:
        # Runs in whichever thread allocated when the collection triggered, after the
        # collection ended: the generation lists are consistent, and freeze/unfreeze only
        # splice them.
        if phase != "stop" or info["generation"] != OLDEST_GENERATION:
            return
        if policy.full_collection_done(clock()) is GcAction.THAW:
            gc.unfreeze()
            log.debug("gc: the next full collection walks every object (thaw %d)",
                      policy.thaws)
        else:
            gc.freeze()

    gc.callbacks.append(on_collection)
    try:
        yield policy
    finally:
        gc.callbacks.remove(on_collection)
        gc.unfreeze()
