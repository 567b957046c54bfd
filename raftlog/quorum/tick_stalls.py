"""Watch the Raft tick thread for stalls (pysyncobj sends heartbeats only from it).

A gap between two ticks longer than ``threshold_s`` means no heartbeat (as leader) and no
vote answer (as follower) went out for that long; close to the election timeout, followers
start an election. The warning says how long the gap was and how long the journal fsync at
the start of the previous tick took, so an operator can tell a slow disk from a starved
process. Pure but for the clock values passed in.
"""

from __future__ import annotations

import logging

from raftlog.log_budget import LogBudget

__all__ = ["TickStalls"]

log = logging.getLogger(__name__)


class TickStalls:
    """Counts and logs gaps between tick starts longer than ``threshold_s``."""

    def __init__(self, threshold_s: float) -> None:
        self.threshold_s = threshold_s
        self.count = 0
        self.longest_s = 0.0
        self._previous_start: float | None = None
        self._last_tick = (0.0, 0.0, 0.0)  # journal fsync, pysyncobj's tick, raftlog's after
        # A starved node stalls on most ticks: a few lines per period, then a count.
        self._budget = LogBudget(log, "raft tick stalls", burst=5)

    def note_start(self, now: float) -> float | None:
        """A tick starts at ``now``; returns the gap if it was a stall."""
        previous, self._previous_start = self._previous_start, now
        if previous is None:
            return None
        gap = now - previous
        if gap <= self.threshold_s:
            return None
        self.count += 1
        self.longest_s = max(self.longest_s, gap)
        flush_s, tick_s, after_s = self._last_tick
        self._budget.log(logging.WARNING, "raft tick thread stalled %.0f ms between ticks (the "
                         "tick before: journal fsync %.0f ms, pysyncobj %.0f ms, views %.0f "
                         "ms): no heartbeats went out meanwhile", gap * 1000, flush_s * 1000,
                         tick_s * 1000, after_s * 1000)
        return gap

    def note_tick(self, flush_s: float, tick_s: float, after_s: float) -> None:
        """How long the parts of the tick that just ended took."""
        self._last_tick = (flush_s, tick_s, after_s)
