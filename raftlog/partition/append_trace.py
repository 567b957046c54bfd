"""Per-stage timing of the replication path (``trace.produce.enable=true``), for finding what
sets the produce latency floor.

On a leader, one client append at a time per partition is traced from the moment it is in the
log (``appended``) through the stages an acks=all produce waits for:

* ``leader_flushed``: the group commit fsynced it here;
* ``sent_first`` / ``sent_last``: the first / last follower's Fetch answer that carried it;
* ``fetched_first`` / ``fetched_last``: the first / last follower's next Fetch from past it
  (the follower has appended and fsynced it: that is how a leader learns a follower's end);
* ``high_watermark``: the high watermark passed it;
* ``answered``: the produce's wait ended (its response is sent next).

On a follower, each Fetch round that brought records: ``fetch_wait`` (request sent to answer
received: the leader's long poll and both network hops), then from the answer:
``follower_appended``, ``follower_flushed`` and ``next_fetch_sent``.

Every stage is a duration in ms from its start instant (``appended`` on a leader, the answer
on a follower). ``TraceStats`` keeps the last ``SAMPLES_MAX`` of each and ``summary`` gives
percentiles; the node logs one summary line per interval. Plain synchronous code; the clock
is injectable. Off (the default), the hooks cost one attribute test per append and fetch.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Final

__all__ = ["FOLLOWER_STAGES", "LEADER_STAGES", "AppendTrace", "FollowerRound", "TraceStats"]

LEADER_STAGES: Final = ("leader_flushed", "sent_first", "sent_last", "fetched_first",
                        "fetched_last", "high_watermark", "answered")
FOLLOWER_STAGES: Final = ("fetch_wait", "follower_appended", "follower_flushed",
                          "next_fetch_sent")
SAMPLES_MAX: Final = 4096
# A traced append never answered (acks=0, or its producer gone) stops blocking the next one.
STALE_S: Final = 30.0
PERCENTILES: Final = (50, 99)

Clock = Callable[[], float]


class TraceStats:
    """Durations per stage since the last ``take_summary``; bounded (``SAMPLES_MAX`` each)."""

    def __init__(self, clock: Clock = time.perf_counter) -> None:
        self.clock = clock
        self._samples: dict[str, deque[float]] = {
            stage: deque(maxlen=SAMPLES_MAX) for stage in LEADER_STAGES + FOLLOWER_STAGES}
        self.traced = 0  # leader appends whose trace ended since the last summary
        self.rounds = 0  # follower rounds since the last summary

    def record(self, stage: str, duration_ms: float) -> None:
        self._samples[stage].append(duration_ms)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per stage with samples: count and p50/p99 in ms (nearest rank)."""
        out: dict[str, dict[str, float]] = {}
        for stage, samples in self._samples.items():
            if samples:
                ordered = sorted(samples)
                row = {"n": float(len(ordered))}
                for pct in PERCENTILES:
                    rank = min(len(ordered) - 1, max(0, -(-pct * len(ordered) // 100) - 1))
                    row[f"p{pct}"] = ordered[rank]
                out[stage] = row
        return out

    def take_summary(self) -> str | None:
        """One log line of every stage's percentiles, then start over; None if nothing ran."""
        rows = self.summary()
        if not rows:
            return None
        parts = [f"{stage} p50 {row['p50']:.2f} p99 {row['p99']:.2f}"
                 for stage, row in rows.items()]
        line = (f"{self.traced} appends, {self.rounds} follower rounds; ms from append "
                f"(leader) or from the fetch answer (follower): " + ", ".join(parts))
        for samples in self._samples.values():
            samples.clear()
        self.traced = self.rounds = 0
        return line


class AppendTrace:
    """A leader partition's traced append: at most one at a time (the next append is traced
    once this one is answered or dropped), so the cost is a few comparisons per event."""

    __slots__ = (
        "_end_offset",
        "_fetched",
        "_followers",
        "_marks",
        "_sent",
        "_start",
        "_stats",
    )

    def __init__(self, stats: TraceStats) -> None:
        self._stats = stats
        self._end_offset = -1  # -1: nothing traced now
        self._start = 0.0
        self._followers = 0
        self._marks: dict[str, float] = {}
        self._sent: set[int] = set()
        self._fetched: set[int] = set()

    @property
    def active(self) -> bool:
        return self._end_offset >= 0

    def appended(self, end_offset: int, followers: int) -> None:
        """A client append ending at ``end_offset`` (exclusive) is in the log; ``followers``:
        how many ISR members besides the leader must fetch it."""
        now = self._stats.clock()
        if self.active and now - self._start < STALE_S:
            return
        self._end_offset, self._followers = end_offset, followers
        self._start = now
        self._marks = {}
        self._sent, self._fetched = set(), set()

    def _mark(self, stage: str) -> None:
        if stage not in self._marks:
            self._marks[stage] = (self._stats.clock() - self._start) * 1000

    def flushed(self, flushed_offset: int) -> None:
        if self.active and flushed_offset >= self._end_offset:
            self._mark("leader_flushed")

    def sent(self, replica_id: int, sent_end_offset: int) -> None:
        """A follower's Fetch answer carried records up to ``sent_end_offset``."""
        if not self.active or sent_end_offset < self._end_offset or replica_id in self._sent:
            return
        self._sent.add(replica_id)
        self._mark("sent_first")
        if len(self._sent) >= self._followers:
            self._mark("sent_last")

    def fetched(self, replica_id: int, fetch_offset: int) -> None:
        """A follower fetched from ``fetch_offset``: it has everything below."""
        if (not self.active or fetch_offset < self._end_offset
                or replica_id in self._fetched):
            return
        self._fetched.add(replica_id)
        self._mark("fetched_first")
        if len(self._fetched) >= self._followers:
            self._mark("fetched_last")

    def high_watermark(self, offset: int) -> None:
        if self.active and offset >= self._end_offset:
            self._mark("high_watermark")

    def answered(self, end_offset: int) -> None:
        """The produce whose append ended at ``end_offset`` is answered: record every stage
        reached and end the trace."""
        if not self.active or end_offset != self._end_offset:
            return
        self._mark("answered")
        for stage, duration_ms in self._marks.items():
            self._stats.record(stage, duration_ms)
        self._stats.traced += 1
        self.drop()

    def drop(self) -> None:
        """Leadership moved or the log was truncated: forget the append in flight."""
        self._end_offset = -1


class FollowerRound:
    """A follower fetcher's rounds: the fetch sent, its answer, the append and the fsync, and
    the next fetch. Only rounds that brought records are recorded."""

    __slots__ = ("_answered", "_brought", "_marks", "_sent", "_stats")

    def __init__(self, stats: TraceStats) -> None:
        self._stats = stats
        self._sent = 0.0
        self._answered = 0.0
        self._brought = False
        self._marks: dict[str, float] = {}

    def fetch_sent(self) -> None:
        now = self._stats.clock()
        if self._brought:
            self._marks["next_fetch_sent"] = (now - self._answered) * 1000
            for stage, duration_ms in self._marks.items():
                self._stats.record(stage, duration_ms)
            self._stats.rounds += 1
        self._sent, self._brought, self._marks = now, False, {}

    def answered(self) -> None:
        self._answered = self._stats.clock()

    def appended(self) -> None:
        """Records of this round's answer are appended (the last partition's counts)."""
        if not self._brought:
            self._brought = True
            self._marks["fetch_wait"] = (self._answered - self._sent) * 1000
        self._since_answer("follower_appended")

    def flushed(self) -> None:
        if self._brought:
            self._since_answer("follower_flushed")

    def _since_answer(self, stage: str) -> None:
        self._marks[stage] = (self._stats.clock() - self._answered) * 1000
