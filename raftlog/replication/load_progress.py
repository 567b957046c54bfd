"""A progress line while a node opens (and recovers) many partition logs.

Pure: the clock is passed in. ``ReplicaManager.apply_image_steps`` counts each log it opens;
when a sync has been opening logs for ``interval_s`` this says how far it got, and at the end
of a long sync how long it took, so an operator watching a restart with thousands of
partitions sees it move instead of a silent node.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

__all__ = ["LoadProgress"]

PROGRESS_INTERVAL_S = 5.0


class LoadProgress:
    """Counts the partition logs one metadata sync opens out of ``total()`` assigned here
    (counted only when a line is due: most syncs open nothing and must not pay a pass over
    every partition of the image)."""

    def __init__(self, total: Callable[[], int], clock: Callable[[], float],
                 interval_s: float = PROGRESS_INTERVAL_S) -> None:
        self._total = cache(total)
        self.opened = 0
        self._clock = clock
        self._interval_s = interval_s
        self._started = clock()
        self._last_line = self._started

    def note_opened(self) -> str | None:
        """One more log is open; a progress line when one is due."""
        self.opened += 1
        now = self._clock()
        if now - self._last_line < self._interval_s:
            return None
        self._last_line = now
        return (f"loading partition logs: {self.opened} opened of {self._total()} assigned "
                f"here, {now - self._started:.1f} s")

    def finished(self) -> str | None:
        """The closing line of a sync that printed progress (or took an interval)."""
        elapsed = self._clock() - self._started
        if self.opened == 0 or elapsed < self._interval_s:
            return None
        return f"loaded {self.opened} partition logs in {elapsed:.1f} s"
