"""The pure parts of the harness: fault schedules, grudges, run statistics."""

from __future__ import annotations

import random

import pytest

from jepsen.history import HistoryBuilder
from jepsen.nemesis import bridge_grudge, complete_grudge, grudge, parse_kinds, plan
from jepsen.plots import fault_intervals, run_stats
from jepsen.workloads.queue import QueueWorkload
from jepsen.workloads.txn import TxnWorkload


def test_parse_kinds() -> None:
    assert parse_kinds("none", True) == ()
    assert parse_kinds("all", True) == ("kill", "pause", "partition", "clock")
    assert parse_kinds("all", False) == ("kill", "pause", "clock")
    assert parse_kinds("kill,partition", True) == ("kill", "partition")
    with pytest.raises(ValueError, match="unknown nemesis"):
        parse_kinds("kill,meteor", True)


def test_plan_is_seeded_and_alternates_within_the_time_limit() -> None:
    a = plan(("kill", "partition"), random.Random(5), 30.0, 4.0)
    b = plan(("kill", "partition"), random.Random(5), 30.0, 4.0)
    assert a == b and len(a) >= 4
    assert [s.action for s in a] == ["start", "stop"] * (len(a) // 2)
    times = [s.at_s for s in a]
    assert times == sorted(times) and times[0] > 0 and times[-1] <= 30.0
    for start, stop in zip(a[::2], a[1::2], strict=True):
        assert start.faults == stop.faults
    assert plan((), random.Random(5), 30.0, 4.0) == []
    together = plan(("kill", "pause", "clock"), random.Random(1), 60.0, 3.0, together_max=2)
    assert any(len(s.faults) == 2 for s in together)


def test_grudges() -> None:
    g = complete_grudge([[1, 2], [3, 4, 5]])
    assert g[1] == {3, 4, 5} and g[4] == {1, 2}
    b = bridge_grudge([1, 2, 3, 4, 5])
    assert b[3] == frozenset() and b[1] == {4, 5} and b[5] == {1, 2}
    iso = grudge("quorum-leader", [1, 2, 3], random.Random(0), leader=2)
    assert iso[2] == {1, 3} and iso[1] == {2}
    halves = grudge("halves", [1, 2, 3, 4, 5], random.Random(0), leader=None)
    sizes = sorted(len(d) for d in halves.values())
    assert sizes == [2, 2, 2, 3, 3]


def test_workload_generators_are_pure() -> None:
    def values() -> object:
        n = iter(range(1, 1000))
        return lambda: next(n)

    for w in (QueueWorkload(), TxnWorkload()):
        ops1 = [w.next_op(random.Random(9), values()) for _ in range(3)]
        ops2 = [w.next_op(random.Random(9), values()) for _ in range(3)]
        assert ops1 == ops2
    f, value = TxnWorkload().next_op(random.Random(2), values())  # type: ignore[arg-type]
    assert f == "txn" and all(m[0] in ("send", "poll") for m in value)


def test_fault_intervals_and_stats() -> None:
    b = HistoryBuilder()
    b.add("invoke", "nemesis", "start-kill", {"kind": "kill"}, time=1_000_000_000)
    b.add("info", "nemesis", "start-kill", {"kind": "kill"}, time=1_100_000_000)
    b.add("invoke", 0, "send", [["send", "k", 1]], time=1_200_000_000)
    b.add("ok", 0, "send", [["send", "k", [0, 1]]], time=1_300_000_000)
    b.add("invoke", "nemesis", "start-partition", {}, time=2_000_000_000)
    b.add("info", "nemesis", "start-partition", {}, time=2_000_000_000)
    b.add("invoke", "nemesis", "stop-kill", {}, time=3_000_000_000)
    b.add("info", "nemesis", "stop-kill", {}, time=3_000_000_000)
    b.add("info", "nemesis", "heal", None, time=4_000_000_000)
    h = b.history()
    assert fault_intervals(h) == [("kill", 1.1, 3.0), ("partition", 2.0, 4.0)]
    stats = run_stats(h)
    assert stats["latency_ms"]["send"]["p50"] == 100.0
    assert stats["completed"] == 1
