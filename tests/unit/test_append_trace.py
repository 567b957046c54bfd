"""The replication path's stage timing (raftlog.partition.append_trace), on a fake clock."""

from __future__ import annotations

from raftlog.partition.append_trace import STALE_S, AppendTrace, FollowerRound, TraceStats


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance_ms(self, ms: float) -> None:
        self.now += ms / 1000


def test_a_leader_append_records_each_stage_once_from_the_append() -> None:
    clock = FakeClock()
    stats = TraceStats(clock)
    trace = AppendTrace(stats)
    trace.appended(end_offset=10, followers=2)
    clock.advance_ms(1)
    trace.flushed(9)  # not yet past the append
    trace.sent(2, 10)
    clock.advance_ms(1)
    trace.flushed(10)
    trace.sent(2, 12)  # the same follower again: not a new stage
    trace.sent(3, 10)
    clock.advance_ms(2)
    trace.fetched(2, 9)  # fetching from below the end: it does not have it yet
    trace.fetched(2, 10)
    clock.advance_ms(1)
    trace.fetched(3, 11)
    trace.high_watermark(10)
    trace.answered(10)
    summary = stats.summary()
    assert {stage: round(row["p50"], 6) for stage, row in summary.items()} == {
        "sent_first": 1.0, "leader_flushed": 2.0, "sent_last": 2.0, "fetched_first": 4.0,
        "fetched_last": 5.0, "high_watermark": 5.0, "answered": 5.0}
    assert stats.traced == 1 and not trace.active


def test_one_append_at_a_time_and_a_drop_or_a_stale_one_frees_the_trace() -> None:
    clock = FakeClock()
    stats = TraceStats(clock)
    trace = AppendTrace(stats)
    trace.appended(5, 1)
    trace.appended(7, 1)  # ignored: 5 is still in flight
    trace.answered(7)
    assert trace.active and stats.traced == 0
    trace.drop()  # leadership moved
    trace.answered(5)
    assert stats.traced == 0
    trace.appended(9, 1)
    clock.advance_ms(STALE_S * 1000 + 1)  # never answered (acks=0): replaced
    trace.appended(11, 1)
    trace.answered(11)
    assert stats.traced == 1 and stats.summary()["answered"]["p50"] == 0.0


def test_follower_rounds_count_only_when_records_came() -> None:
    clock = FakeClock()
    stats = TraceStats(clock)
    rounds = FollowerRound(stats)
    rounds.fetch_sent()
    clock.advance_ms(3)
    rounds.answered()  # an empty answer (long poll timed out)
    rounds.flushed()
    rounds.fetch_sent()
    assert stats.rounds == 0 and stats.summary() == {}
    clock.advance_ms(2)
    rounds.answered()
    clock.advance_ms(0.5)
    rounds.appended()
    clock.advance_ms(0.5)
    rounds.flushed()
    clock.advance_ms(0.25)
    rounds.fetch_sent()
    assert stats.rounds == 1
    assert {stage: round(row["p50"], 6) for stage, row in stats.summary().items()} == {
        "fetch_wait": 2.0, "follower_appended": 0.5, "follower_flushed": 1.0,
        "next_fetch_sent": 1.25}


def test_summary_percentiles_and_the_line_starts_over() -> None:
    stats = TraceStats(FakeClock())
    for ms in range(1, 101):
        stats.record("answered", float(ms))
    stats.traced = 100
    row = stats.summary()["answered"]
    assert (row["n"], row["p50"], row["p99"]) == (100, 50.0, 99.0)
    line = stats.take_summary()
    assert line is not None and "100 appends" in line and "answered p50 50.00 p99 99.00" in line
    assert stats.take_summary() is None and stats.traced == 0
