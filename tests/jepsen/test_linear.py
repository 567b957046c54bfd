"""The linearizability checker and the metadata workload's check, on hand-made histories."""

from __future__ import annotations

import math
import random

from jepsen.history import HistoryBuilder
from jepsen.linear import Call, check_linearizable, topic_model
from jepsen.workloads.metadata import check_metadata

INF = math.inf


def calls(*specs: tuple[float, float, str, int, object]) -> list[Call]:
    return [Call(i, s, e, f, a, r) for i, (s, e, f, a, r) in enumerate(specs)]


def test_sequential_history_is_linearizable() -> None:
    h = calls((0, 1, "create", 1, "ok"), (2, 3, "add-partitions", 3, "ok"),
              (4, 5, "add-partitions", 2, "invalid"), (6, 7, "delete", 0, "ok"),
              (8, 9, "delete", 0, "unknown"), (10, 11, "create", 2, "ok"))
    verdict = check_linearizable(h, topic_model, None)
    assert verdict.valid is True
    assert list(verdict.linearization) == [0, 1, 2, 3, 4, 5]


def test_two_successful_creates_without_a_delete_are_not_linearizable() -> None:
    h = calls((0, 1, "create", 1, "ok"), (2, 3, "create", 1, "ok"))
    verdict = check_linearizable(h, topic_model, None)
    assert verdict.valid is False
    assert verdict.stuck == (1,)


def test_concurrent_creates_one_wins() -> None:
    ok = calls((0, 5, "create", 1, "exists"), (1, 4, "create", 2, "ok"))
    assert check_linearizable(ok, topic_model, None).valid is True
    both = calls((0, 5, "create", 1, "ok"), (1, 4, "create", 2, "ok"))
    assert check_linearizable(both, topic_model, None).valid is False


def test_realtime_order_is_respected() -> None:
    # The delete completed before the create began: it cannot have seen the topic.
    h = calls((0, 1, "delete", 0, "ok"), (2, 3, "create", 1, "ok"))
    assert check_linearizable(h, topic_model, None).valid is False
    # Overlapping, the create may go first.
    h = calls((0, 3, "delete", 0, "ok"), (1, 2, "create", 1, "ok"))
    assert check_linearizable(h, topic_model, None).valid is True


def test_indeterminate_calls_may_or_may_not_take_effect() -> None:
    took_effect = calls((0, INF, "create", 1, None), (5, 6, "delete", 0, "ok"))
    assert check_linearizable(took_effect, topic_model, None).valid is True
    did_not = calls((0, INF, "create", 1, None), (5, 6, "delete", 0, "unknown"))
    assert check_linearizable(did_not, topic_model, None).valid is True
    # ...but not before they were invoked.
    early = calls((0, 1, "delete", 0, "ok"), (2, INF, "create", 1, None))
    assert check_linearizable(early, topic_model, None).valid is False


def test_partition_counts_only_grow() -> None:
    h = calls((0, 1, "create", 1, "ok"), (2, 3, "add-partitions", 3, "ok"),
              (4, 5, "add-partitions", 2, "ok"))
    assert check_linearizable(h, topic_model, None).valid is False


def test_budget_exhaustion_is_unknown() -> None:
    # Not linearizable (two creates, nothing can delete), but proving it means trying every
    # subset and order of the indeterminate partition changes.
    rng = random.Random(3)
    h = [Call(i, 0, INF, "add-partitions", rng.randint(2, 9), None) for i in range(14)]
    h += [Call(99, 0, 1, "create", 1, "ok"), Call(100, 0, 1, "create", 1, "ok")]
    assert check_linearizable(h, topic_model, None, budget=50).valid is None
    assert check_linearizable(h[10:], topic_model, None).valid is False


def test_check_metadata_reports_examples() -> None:
    b = HistoryBuilder()
    b.call(0, "create", ["t", 1], ["t", 1, "ok"])
    b.call(1, "create", ["u", 1], ["u", 1, "ok"])
    b.call(0, "create", ["t", 2], ["t", 2, "ok"])  # t already existed
    b.add("invoke", 2, "delete", ["u", 0])
    b.add("fail", 2, "delete", ["u", 0], error="NOT_CONTROLLER")
    b.add("info", "nemesis", "start-kill", {"nodes": [1]})
    res = check_metadata(b.history())
    assert res["valid"] is False
    [example] = res["anomalies"]["nonlinearizable"]
    assert example["key"] == "t"
    assert example["cannot_place"][0]["value"] == ["t", 2]
    assert res["stats"]["operations"] == {"ok": 3, "fail": 1, "info": 0, "open": 0}


def test_check_metadata_valid_and_empty() -> None:
    b = HistoryBuilder()
    b.call(0, "create", ["t", 1], ["t", 1, "ok"])
    b.add("invoke", 1, "delete", ["t", 0])
    b.add("info", 1, "delete", ["t", 0], error="timed out")
    b.call(2, "create", ["t", 1], ["t", 1, "exists"])
    assert check_metadata(b.history())["valid"] is True
    assert check_metadata(HistoryBuilder().history())["valid"] == "unknown"
