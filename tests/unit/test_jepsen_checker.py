"""Tests for the port of Jepsen's Kafka checker (jepsen/checker.py).

Hand-written histories (many translated from Jepsen's
``jepsen/test/jepsen/tests/kafka_test.clj``) exhibit each anomaly next to a
clean history of the same shape; Hypothesis then runs a simulated correct log
(several processes; sends, polls and transactions; aborts and crashes) whose
histories must be valid, and injects single faults that must be caught.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jepsen.checker import (
    CheckerOptions,
    allowed_anomaly_types,
    analyze,
    check,
    check_file,
    main,
)
from jepsen.graph import PROCESS, WR, WW, DiGraph, find_cycle, strongly_connected_components
from jepsen.history import History, HistoryBuilder, Op, Value, write_jsonl

#: A history under construction and the operations a test looks at.
Built2 = tuple[HistoryBuilder, Op, Op]
Built3 = tuple[HistoryBuilder, Op, Op, Op]

# -- helpers ------------------------------------------------------------------------

POLL: list[Any] = ["poll"]


def snd(k: str, v: Value) -> list[Any]:
    return ["send", k, v]


def sent(k: str, o: int | None, v: Value) -> list[Any]:
    return ["send", k, [o, v]]


def polled(**reads: Sequence[tuple[int | None, Value]]) -> list[Any]:
    return ["poll", {k: [list(p) for p in pairs] for k, pairs in reads.items()}]


def errors(b: HistoryBuilder, name: str, **kw: Any) -> list[dict[str, Any]]:
    return analyze(b.history(), **kw).errors.get(name, [])


def project(examples: list[dict[str, Any]], *fields: str) -> list[dict[str, Any]]:
    return [{f: e[f] for f in fields} for e in examples]


def final_poll(b: HistoryBuilder, process: int, **reads: Sequence[tuple[int | None, Value]]) -> Op:
    """A final poller: a fresh process assigns keys from the beginning and polls."""
    b.call(process, "assign", sorted(reads), seek_to_beginning=True)
    return b.call(process, "poll", [POLL], [polled(**reads)])


# -- version orders and inconsistent offsets -------------------------------------------


def test_version_orders() -> None:
    # kafka_test.clj version-orders-test: an info txn whose send of b was read
    # must have committed, so its offsets count.
    b = HistoryBuilder()
    b.call(0, "txn", [POLL], [polled(x=[(0, "a"), (1, "b")])])
    w = b.call(
        1,
        "txn",
        [snd("x", "c"), snd("x", "b"), snd("x", "d")],
        [sent("x", 1, "c"), sent("x", 3, "b"), sent("x", 4, "d")],
        type="info",
    )
    a = analyze(b.history())
    vo = a.version_orders["x"]
    assert vo.log == {0: {"a"}, 1: {"b", "c"}, 3: {"b"}, 4: {"d"}}
    assert vo.offsets == [0, 1, 3, 4]
    assert vo.by_index == ["a", "b", "b", "d"]
    assert vo.by_value == {"a": 0, "b": 2, "d": 3}
    assert vo.value_first_index() == {"a": 0, "b": 1, "c": 1, "d": 3}
    assert vo.last_index_values() == [["a"], ["c"], ["b"], ["d"]]
    [err] = a.errors["inconsistent-offsets"]
    assert project([err], "key", "offset", "index", "values") == [
        {"key": "x", "offset": 1, "index": 1, "values": ["b", "c"]}
    ]
    assert err["ops"][1] is w


def test_inconsistent_offsets_info_conflict() -> None:
    # kafka_test.clj inconsistent-offsets-test
    b = HistoryBuilder()
    s1 = b.call(0, "send", [snd("x", 1), snd("y", 1)], [sent("x", 0, 1), snd("y", 1)], type="info")
    s2 = b.call(1, "send", [snd("x", 2)], [sent("x", 0, 2)])
    # An info send that nobody read may not have committed: no conflict.
    assert errors(b, "inconsistent-offsets") == []
    # Once a poll reads its y, it must have committed, and x@0 holds 1 and 2.
    b.call(2, "poll", [POLL], [polled(y=[(5, 1)])])
    errs = errors(b, "inconsistent-offsets")
    assert project(errs, "key", "offset", "index", "values") == [
        {"key": "x", "offset": 0, "index": 0, "values": [1, 2]}
    ]
    assert errs[0]["ops"] == [s1, s2]
    res = check(b.history())
    assert res["valid"] is False
    assert "inconsistent-offsets" in res["bad_anomaly_types"]
    assert res["anomalies"]["inconsistent-offsets"][0]["ops"] == [s1.to_dict(), s2.to_dict()]


def test_consistent_offsets_clean() -> None:
    b = HistoryBuilder()
    b.call(0, "send", [snd("x", 1), snd("y", 1)], [sent("x", 0, 1), sent("y", 5, 1)])
    b.call(1, "send", [snd("x", 2)], [sent("x", 1, 2)])
    final_poll(b, 2, x=[(0, 1), (1, 2)], y=[(5, 1)])
    res = check(b.history())
    assert res["anomalies"] == {}
    assert res["valid"] is True


# -- duplicate --------------------------------------------------------------------------


def test_duplicate() -> None:
    # kafka_test.clj duplicate-test "basic": a sent at 1, polled at 3.
    b = HistoryBuilder()
    s = b.call(0, "send", [snd("x", "a")], [sent("x", 1, "a")])
    b.call(1, "send", [snd("x", "b")], type="info")
    p = b.call(2, "poll", [POLL], [polled(x=[(2, "b"), (3, "a")])])
    errs = errors(b, "duplicate")
    assert project(errs, "key", "value", "count", "offsets", "ops") == [
        {"key": "x", "value": "a", "count": 2, "offsets": [1, 3], "ops": [s, p]}
    ]
    res = check(b.history())
    assert res["valid"] is False and "duplicate" in res["bad_anomaly_types"]


def test_duplicate_clean() -> None:
    b = HistoryBuilder()
    b.call(0, "send", [snd("x", "a")], [sent("x", 1, "a")])
    b.call(1, "send", [snd("x", "b")], type="info")
    b.call(2, "poll", [POLL], [polled(x=[(1, "a"), (2, "b")])])
    res = check(b.history())
    assert res["anomalies"] == {} and res["valid"] is True


def test_duplicate_in_aborted_poll() -> None:
    # kafka_test.clj "aborted txns": a failed poll's reads still count, but a
    # failed send's offset does not.
    b = HistoryBuilder()
    b.call(0, "send", [snd("x", 0)], [sent("x", 1, 0)])
    b.call(0, "send", [snd("x", 1)], [sent("x", 2, 1)], type="fail")
    b.call(1, "poll", [POLL], [polled(x=[(11, 0), (12, 1)])], type="fail")
    assert project(errors(b, "duplicate"), "key", "value", "count", "offsets") == [
        {"key": "x", "value": 0, "count": 2, "offsets": [1, 11]}
    ]


def test_duplicates_and_conflicts_are_hash_insensitive() -> None:
    # kafka_test.clj "hash-insensitive": every value sent at 0 and polled at 1.
    b = HistoryBuilder()
    for v in range(10):
        b.call(0, "send", [snd("x", v)], [sent("x", 0, v)])
        b.call(1, "poll", [POLL], [polled(x=[(1, v)])])
    a = analyze(b.history())
    assert sorted(e["value"] for e in a.errors["duplicate"]) == list(range(10))
    assert project(a.errors["inconsistent-offsets"], "offset", "index", "values") == [
        {"offset": 0, "index": 0, "values": list(range(10))},
        {"offset": 1, "index": 1, "values": list(range(10))},
    ]


# -- G1a --------------------------------------------------------------------------------


def test_g1a() -> None:
    # kafka_test.clj g1a-test
    b = HistoryBuilder()
    w = b.call(0, "send", [snd("x", 2), snd("y", 3)], type="fail")
    r = b.call(1, "poll", [POLL], [polled(x=[(0, 2)])])
    assert errors(b, "G1a") == [{"key": "x", "value": 2, "writer": w, "reader": r}]
    res = check(b.history())
    assert res["valid"] is False
    assert res["anomalies"]["G1a"] == [
        {"key": "x", "value": 2, "writer": w.to_dict(), "reader": r.to_dict()}
    ]


def test_g1a_clean() -> None:
    b = HistoryBuilder()
    b.call(0, "send", [snd("x", 2), snd("y", 3)], type="fail")
    b.call(0, "send", [snd("x", 4)], [sent("x", 0, 4)])
    b.call(1, "poll", [POLL], [polled(x=[(0, 4)])])
    res = check(b.history())
    assert res["anomalies"] == {} and res["valid"] is True


# -- lost-write ---------------------------------------------------------------------------


def test_lost_write_consistent() -> None:
    # kafka_test.clj lost-write-test "consistent": c read at offset 2 means a
    # (0) and b (1) should have been read too.
    b = HistoryBuilder()
    sa = b.call(0, "send", [snd("x", "a")], [sent("x", 0, "a")])
    sbd = b.call(0, "send", [snd("x", "b"), snd("x", "d")], [sent("x", 1, "b"), sent("x", 3, "d")])
    b.call(1, "send", [snd("x", "c")], type="info")
    p = b.call(0, "poll", [POLL], [polled(x=[(2, "c")])])
    errs = errors(b, "lost-write")
    assert project(errs, "key", "value", "index", "max_read_index", "writer", "max_read") == [
        {"key": "x", "value": "a", "index": 0, "max_read_index": 2, "writer": sa, "max_read": p},
        {"key": "x", "value": "b", "index": 1, "max_read_index": 2, "writer": sbd, "max_read": p},
    ]
    res = check(b.history())
    assert res["valid"] is False and "lost-write" in res["bad_anomaly_types"]


def test_lost_write_inconsistent() -> None:
    # kafka_test.clj "inconsistent": b overwrote a at offset 0.
    b = HistoryBuilder()
    sa = b.call(0, "send", [snd("x", "a")], [sent("x", 0, "a")])
    b.call(0, "send", [snd("x", "b"), snd("x", "c")], [sent("x", 0, "b"), sent("x", 2, "c")])
    r = b.call(0, "poll", [POLL], [polled(x=[(0, "b"), (2, "c")])])
    assert project(errors(b, "lost-write"), "value", "index", "max_read_index", "writer") == [
        {"value": "a", "index": 0, "max_read_index": 1, "writer": sa}
    ]
    assert errors(b, "lost-write")[0]["max_read"] is r


def test_lost_write_atomic() -> None:
    # kafka_test.clj "atomic": a crashed send counts once one of its writes is read.
    def hist(with_poll_a: bool) -> HistoryBuilder:
        b = HistoryBuilder()
        b.call(
            0,
            "send",
            [snd("x", "a"), snd("y", "b")],
            [snd("x", "a"), sent("y", 0, "b")],
            type="info",
        )
        b.call(1, "send", [snd("y", "c")], type="info")
        if with_poll_a:
            b.call(2, "poll", [POLL], [polled(x=[(0, "a")])])
        b.call(3, "poll", [POLL], [polled(y=[(1, "c")])])
        return b

    assert errors(hist(False), "lost-write") == []
    b = hist(True)
    [err] = errors(b, "lost-write")
    assert project([err], "key", "value", "index", "max_read_index") == [
        {"key": "y", "value": "b", "index": 0, "max_read_index": 1}
    ]
    assert err["writer"] is b.ops[1] and err["max_read"] is b.ops[-1]


def test_lost_write_clean() -> None:
    b = HistoryBuilder()
    b.call(0, "send", [snd("x", "a")], [sent("x", 0, "a")])
    b.call(0, "send", [snd("x", "b"), snd("x", "d")], [sent("x", 1, "b"), sent("x", 2, "d")])
    b.call(1, "send", [snd("x", "c")], type="info")
    b.call(0, "poll", [POLL], [polled(x=[(0, "a"), (1, "b"), (2, "d"), (4, "c")])])
    res = check(b.history())
    assert res["anomalies"] == {} and res["valid"] is True


# -- unseen -------------------------------------------------------------------------------


def unseen_history(last_poll: list[tuple[int | None, Value]] | None) -> HistoryBuilder:
    # kafka_test.clj unseen-test, with a variable last poll.
    b = HistoryBuilder()
    b.call(0, "poll", [POLL], [polled()])
    b.call(0, "send", [snd("x", "a"), snd("x", "b")], [sent("x", 0, "a"), sent("x", 1, "b")])
    b.call(0, "poll", [POLL], [polled(x=[(0, "a")])])
    if last_poll is not None:
        b.call(0, "poll", [POLL], [polled(x=last_poll)])
    return b


def test_unseen_clean() -> None:
    res = check(unseen_history([(1, "b")]).history())
    assert res["anomalies"] == {} and res["unseen"] is None and res["valid"] is True


def test_unseen_uncovered_is_unknown() -> None:
    b = unseen_history(None)
    [e] = errors(b, "unseen")
    assert project([e], "key", "value", "offset", "max_polled_offset", "covered") == [
        {"key": "x", "value": "b", "offset": 1, "max_polled_offset": 0, "covered": False}
    ]
    assert e["writer"] is b.ops[3]
    res = check(b.history())
    assert res["valid"] == "unknown"
    assert res["unseen"] == {
        "time": b.ops[-1].time,
        "unseen": {"x": 1},
        "covered": 0,
        "uncovered": 1,
    }
    assert res["unknown_reasons"] == [{"type": "unseen-uncovered", "count": 1}]
    # kafka.clj's rule: any unseen message is an error.
    assert check(b.history(), strict_unseen=True)["valid"] is False
    # Jepsen's --ignore-queue-errors unseen
    assert check(b.history(), allowed=frozenset({"unseen"}))["valid"] is True


def test_unseen_covered_is_invalid() -> None:
    b = unseen_history(None)
    b.call(1, "send", [snd("x", "c")], [sent("x", 2, "c")])
    b.call(0, "poll", [POLL], [polled(x=[(2, "c")])])
    [e] = errors(b, "unseen")
    assert e["value"] == "b" and e["covered"] is True and e["max_polled_offset"] == 2
    res = check(b.history())
    assert res["valid"] is False
    assert "unseen" in res["bad_anomaly_types"] and "lost-write" in res["bad_anomaly_types"]


# -- poll-skip and nonmonotonic-poll ---------------------------------------------------------


def poll_skip_history(between: list[tuple[str, list[str]]] | None = None) -> Built3:
    # kafka_test.clj poll-skip-test: process 0 polls offsets 1 2, then 4, then 7,
    # but 3 and 6 exist. `between` inserts assign/subscribe ops of process 0
    # after its first and second polls.
    b = HistoryBuilder()
    p12 = b.call(0, "poll", [POLL], [polled(x=[(1, "a"), (2, "b")])])
    if between:
        b.call(0, between[0][0], between[0][1])
    b.call(1, "poll", [POLL], [polled(x=[(3, "c")])])
    p4 = b.call(0, "poll", [POLL], [polled(x=[(4, "d")])])
    if between:
        b.call(0, between[1][0], between[1][1])
    b.call(2, "send", [snd("x", "f")], [sent("x", 6, "f")])
    p7 = b.call(0, "poll", [POLL], [polled(x=[(7, "g")])])
    b.call(3, "send", [snd("x", v) for v in "abcdg"], type="info")
    return b, p12, p4, p7


def test_poll_skip() -> None:
    b, p12, p4, p7 = poll_skip_history()
    errs = errors(b, "poll-skip")
    assert project(errs, "key", "ops", "delta", "skipped", "values") == [
        {"key": "x", "ops": [p12, p4], "delta": 2, "skipped": ["c"], "values": ["b", "d"]},
        {"key": "x", "ops": [p4, p7], "delta": 2, "skipped": ["f"], "values": ["d", "g"]},
    ]
    res = check(b.history())
    assert res["valid"] is False and "poll-skip" in res["bad_anomaly_types"]
    assert res["anomalies"]["poll-skip"][0]["ops"] == [p12.to_dict(), p4.to_dict()]


@pytest.mark.parametrize(
    "between",
    [[("subscribe", ["y"]), ("assign", ["y"])], [("assign", ["y"]), ("subscribe", ["y"])]],
)
def test_poll_skip_reset_by_reassignment(between: list[tuple[str, list[str]]]) -> None:
    b, *_ = poll_skip_history(between)
    assert errors(b, "poll-skip") == []


def test_poll_skip_kept_across_assignment_of_same_key() -> None:
    b, p12, p4, p7 = poll_skip_history([("subscribe", ["x", "y"]), ("assign", ["x", "y"])])
    assert [e["ops"] for e in errors(b, "poll-skip")] == [[p12, p4], [p4, p7]]


def test_poll_skip_reset_by_seek_to_beginning() -> None:
    b = HistoryBuilder()
    b.call(0, "send", [snd("x", v) for v in "abc"], [sent("x", i, v) for i, v in enumerate("abc")])
    b.call(1, "assign", ["x"])
    b.call(1, "poll", [POLL], [polled(x=[(0, "a"), (1, "b")])])
    b.call(1, "assign", ["x"], seek_to_beginning=True)
    b.call(1, "poll", [POLL], [polled(x=[(0, "a"), (1, "b"), (2, "c")])])
    res = check(b.history())
    assert res["anomalies"] == {} and res["valid"] is True
    # Without the seek, starting over is a nonmonotonic poll.
    b.ops[6].extra.clear()
    b.ops[7].extra.clear()
    assert len(errors(b, "nonmonotonic-poll")) == 1


def test_poll_skip_allowed_under_subscribe() -> None:
    b, *_ = poll_skip_history()
    res = check(b.history(), sub_via=frozenset({"subscribe"}))
    assert "poll-skip" in res["allowed_anomaly_types"]
    assert "poll-skip" not in res["bad_anomaly_types"]
    # Inferred from the history when sub_via is not given.
    b.call(9, "subscribe", ["x"])
    assert "poll-skip" in check(b.history())["allowed_anomaly_types"]


def txn_abort_history(third: str, fourth: bool) -> HistoryBuilder:
    # kafka_test.clj poll-skip-test "txn abort"
    b = HistoryBuilder()
    b.call(0, "send", [snd("x", i) for i in range(6)], [sent("x", i, i) for i in range(6)])
    b.call(1, "txn", [POLL], [polled(x=[(0, 0)])])
    b.call(1, "txn", [POLL], [polled(x=[(1, 1), (2, 2)])], type="fail")
    b.call(1, "txn", [POLL], [polled(x=[(3, 3), (4, 4)])], type=third)  # type: ignore[arg-type]
    if fourth:
        b.call(1, "txn", [POLL], [polled(x=[(5, 5)])])
    return b


def test_txn_abort_rewinds_clean() -> None:
    b = HistoryBuilder()
    b.call(0, "send", [snd("x", i) for i in range(3)], [sent("x", i, i) for i in range(3)])
    b.call(1, "txn", [POLL], [polled(x=[(0, 0)])])
    b.call(1, "txn", [POLL], [polled(x=[(1, 1), (2, 2)])], type="fail")
    b.call(1, "txn", [POLL], [polled(x=[(1, 1), (2, 2)])], type="info")
    b.call(2, "txn", [POLL], [polled(x=[(0, 0), (1, 1), (2, 2)])])
    res = check(b.history())
    assert res["anomalies"] == {} and res["valid"] is True


def test_txn_abort_must_rewind() -> None:
    b = txn_abort_history("fail", True)
    errs = errors(b, "poll-skip")
    assert project(errs, "delta", "skipped", "ops") == [
        {"delta": 3, "skipped": [1, 2], "ops": [b.ops[3], b.ops[7]]},
        {"delta": 5, "skipped": [1, 2, 3, 4], "ops": [b.ops[3], b.ops[9]]},
    ]
    # An info poll can be a poll-skip too.
    b = txn_abort_history("info", False)
    assert project(errors(b, "poll-skip"), "delta", "ops") == [
        {"delta": 3, "ops": [b.ops[3], b.ops[7]]}
    ]


def nonmonotonic_poll_history(between: tuple[str, list[str]] | None) -> Built2:
    # kafka_test.clj nonmonotonic-poll-test: polls 1 2 3, then 2 3 4.
    b = HistoryBuilder()
    b.call(0, "send", [snd("x", v) for v in "abcd"])
    p1 = b.call(0, "poll", [POLL], [polled(x=[(1, "a"), (2, "b"), (3, "c")])])
    if between:
        b.call(0, *between)
    p2 = b.call(0, "poll", [POLL], [polled(x=[(2, "b"), (3, "c"), (4, "d")])])
    return b, p1, p2


def test_nonmonotonic_poll() -> None:
    b, p1, p2 = nonmonotonic_poll_history(None)
    assert errors(b, "nonmonotonic-poll") == [
        {"key": "x", "values": ["c", "b"], "delta": -1, "ops": [p1, p2]}
    ]
    res = check(b.history())
    assert res["valid"] is False and "nonmonotonic-poll" in res["bad_anomaly_types"]
    assert check(b.history(), sub_via=frozenset({"subscribe"}))["valid"] is True


@pytest.mark.parametrize(
    ("between", "expected"),
    [
        (("subscribe", ["y"]), 0),
        (("assign", ["y"]), 0),
        (("subscribe", ["x", "y"]), 1),
        (("assign", ["x", "y"]), 1),
    ],
)
def test_nonmonotonic_poll_reassignment(between: tuple[str, list[str]], expected: int) -> None:
    b, _, _ = nonmonotonic_poll_history(between)
    assert len(errors(b, "nonmonotonic-poll")) == expected


def test_monotonic_poll_clean() -> None:
    b = HistoryBuilder()
    b.call(0, "send", [snd("x", v) for v in "abcd"])
    b.call(0, "poll", [POLL], [polled(x=[(1, "a"), (2, "b")])])
    b.call(0, "poll", [POLL], [polled(x=[])])  # an empty result moves nothing
    b.call(0, "poll", [POLL], [polled(x=[(3, "c"), (4, "d")])])
    res = check(b.history())
    assert res["anomalies"] == {} and res["valid"] is True


# -- nonmonotonic-send ----------------------------------------------------------------------


def nonmonotonic_send_history(between: tuple[str, list[str]] | None) -> Built2:
    # kafka_test.clj nonmonotonic-send-test: sends land at 3 4, then 1 2.
    b = HistoryBuilder()
    s1 = b.call(0, "send", [snd("x", "c"), snd("x", "d")], [sent("x", 3, "c"), sent("x", 4, "d")])
    if between:
        b.call(0, *between)
    s2 = b.call(0, "send", [snd("x", "a"), snd("x", "b")], [sent("x", 1, "a"), sent("x", 2, "b")])
    return b, s1, s2


def test_nonmonotonic_send() -> None:
    b, s1, s2 = nonmonotonic_send_history(None)
    assert errors(b, "nonmonotonic-send") == [
        {"key": "x", "values": ["d", "a"], "delta": -3, "ops": [s1, s2]}
    ]
    res = check(b.history())
    assert res["valid"] is False and "nonmonotonic-send" in res["bad_anomaly_types"]
    assert res["anomalies"]["nonmonotonic-send"][0]["ops"] == [s1.to_dict(), s2.to_dict()]


@pytest.mark.parametrize(
    ("between", "expected"),
    [
        (("subscribe", ["y"]), 0),
        (("assign", ["y"]), 0),
        (("subscribe", ["x", "y"]), 1),
        (("assign", ["x", "y"]), 1),
    ],
)
def test_nonmonotonic_send_reassignment(between: tuple[str, list[str]], expected: int) -> None:
    b, _, _ = nonmonotonic_send_history(between)
    assert len(errors(b, "nonmonotonic-send")) == expected


def test_monotonic_send_clean() -> None:
    b = HistoryBuilder()
    b.call(0, "send", [snd("x", "a"), snd("x", "b")], [sent("x", 1, "a"), sent("x", 2, "b")])
    b.call(0, "send", [snd("x", "c"), snd("x", "d")], [sent("x", 3, "c"), sent("x", 4, "d")])
    final_poll(b, 1, x=[(1, "a"), (2, "b"), (3, "c"), (4, "d")])
    res = check(b.history())
    assert res["anomalies"] == {} and res["valid"] is True


# -- internal (single-operation) order ----------------------------------------------------------


def int_poll_history() -> tuple[HistoryBuilder, Op, Op]:
    # kafka_test.clj int-poll-skip-test: polls see 1 then 4; another sees 2.
    b = HistoryBuilder()
    b.call(1, "send", [snd("x", "a"), snd("x", "b"), snd("x", "d")], type="info")
    pa = b.call(0, "poll", [POLL], [polled(x=[(1, "a"), (4, "d")])])
    pb = b.call(0, "poll", [POLL, POLL], [polled(x=[(1, "a")]), polled(x=[(4, "d")])])
    b.call(0, "poll", [POLL], [polled(x=[(2, "b")])])
    return b, pa, pb


def test_int_poll_skip() -> None:
    b, pa, pb = int_poll_history()
    assert errors(b, "int-poll-skip") == [
        {"key": "x", "values": ["a", "d"], "skipped": ["b"], "delta": 2, "op": pa},
        {"key": "x", "values": ["a", "d"], "skipped": ["b"], "delta": 2, "op": pb},
    ]
    res = check(b.history())
    assert res["valid"] is False and "int-poll-skip" in res["bad_anomaly_types"]
    assert res["anomalies"]["int-poll-skip"][0]["op"] == pa.to_dict()


def test_int_poll_skip_exempt_when_rebalanced() -> None:
    b = HistoryBuilder()
    b.call(1, "send", [snd("x", "a"), snd("x", "b"), snd("x", "d")], type="info")
    b.call(0, "poll", [POLL], [polled(x=[(1, "a"), (4, "d")])], rebalance_log=[{"keys": ["x"]}])
    b.call(2, "poll", [POLL], [polled(x=[(2, "b")])])
    assert errors(b, "int-poll-skip") == []
    assert "int-poll-skip" not in check(b.history())["anomalies"]


def test_int_poll_clean() -> None:
    b = HistoryBuilder()
    b.call(1, "send", [snd("x", "a"), snd("x", "b"), snd("x", "d")], type="info")
    b.call(0, "poll", [POLL], [polled(x=[(1, "a"), (2, "b"), (4, "d")])])
    b.call(2, "poll", [POLL, POLL], [polled(x=[(1, "a")]), polled(x=[(2, "b"), (4, "d")])])
    res = check(b.history())
    assert res["anomalies"] == {} and res["valid"] is True


def test_int_nonmonotonic_poll() -> None:
    # kafka_test.clj int-nonmonotonic-poll-test
    b = HistoryBuilder()
    b.call(0, "send", [snd("x", "a"), snd("x", "b"), snd("x", "c")], type="info")
    p1 = b.call(1, "poll", [POLL], [polled(x=[(3, "c"), (1, "a")])])
    p2 = b.call(1, "poll", [POLL, POLL], [polled(x=[(2, "b"), (3, "c")]), polled(x=[(3, "c")])])
    assert errors(b, "int-nonmonotonic-poll") == [
        {"key": "x", "values": ["c", "a"], "delta": -2, "op": p1},
        {"key": "x", "values": ["c", "c"], "delta": 0, "op": p2},
    ]
    res = check(b.history())
    assert res["valid"] is False and "int-nonmonotonic-poll" in res["bad_anomaly_types"]


def test_int_send_skip_is_reported_but_allowed() -> None:
    # kafka_test.clj int-send-skip-test: a's offset is known, c's comes from a
    # poll, and b sits between them.
    b = HistoryBuilder()
    s = b.call(0, "send", [snd("x", "a"), snd("x", "c")], [sent("x", 1, "a"), snd("x", "c")])
    b.call(1, "send", [snd("x", "b")], type="info")
    b.call(2, "poll", [POLL], [polled(x=[(1, "a"), (2, "b"), (3, "c")])])
    assert errors(b, "int-send-skip") == [
        {"key": "x", "values": ["a", "c"], "skipped": ["b"], "delta": 2, "op": s}
    ]
    res = check(b.history())
    # Interleaved transactional sends also form a write cycle: s <ww b <ww s.
    assert res["anomaly_types"] == ["int-send-skip", "G0"]
    assert res["allowed_anomaly_types"] == ["int-send-skip", "G0"]
    assert res["valid"] is True


def test_int_nonmonotonic_send() -> None:
    # kafka_test.clj int-nonmonotonic-send-test
    b = HistoryBuilder()
    s1 = b.call(0, "send", [snd("x", "c"), snd("x", "a")], [sent("x", 3, "c"), sent("x", 1, "a")])
    s2 = b.call(0, "send", [snd("y", "d"), snd("y", "b")], type="info")
    b.call(1, "send", [snd("y", "c")], type="info")
    b.call(2, "poll", [POLL], [polled(y=[(2, "b"), (3, "c"), (4, "d")])])
    assert errors(b, "int-nonmonotonic-send") == [
        {"key": "x", "values": ["c", "a"], "delta": -1, "op": s1},
        {"key": "y", "values": ["d", "b"], "delta": -2, "op": s2},
    ]
    res = check(b.history())
    assert res["valid"] is False and "int-nonmonotonic-send" in res["bad_anomaly_types"]


def test_int_send_clean() -> None:
    b = HistoryBuilder()
    b.call(0, "send", [snd("x", "a"), snd("x", "c")], [sent("x", 1, "a"), sent("x", 2, "c")])
    b.call(0, "send", [snd("y", "b"), snd("y", "d")], type="info")
    b.call(2, "poll", [POLL], [polled(x=[(1, "a"), (2, "c")], y=[(2, "b"), (3, "d")])])
    res = check(b.history())
    assert res["anomalies"] == {} and res["valid"] is True


# -- precommitted-read ----------------------------------------------------------------------


def test_precommitted_read() -> None:
    # kafka_test.clj precommitted-read-test
    b = HistoryBuilder()
    t = b.call(0, "txn", [snd("x", "a"), POLL], [sent("x", 0, "a"), polled(x=[(0, "a")])])
    assert errors(b, "precommitted-read") == [{"op": t, "key": "x", "value": "a"}]
    res = check(b.history())
    assert res["valid"] is False
    assert res["anomalies"]["precommitted-read"] == [{"op": t.to_dict(), "key": "x", "value": "a"}]


def test_precommitted_read_clean() -> None:
    b = HistoryBuilder()
    b.call(1, "send", [snd("x", "z")], [sent("x", 0, "z")])
    b.call(0, "txn", [snd("x", "a"), POLL], [sent("x", 1, "a"), polled(x=[(0, "z")])])
    b.call(1, "poll", [POLL], [polled(x=[(0, "z"), (1, "a")])])
    res = check(b.history())
    assert res["anomalies"] == {} and res["valid"] is True


# -- unexpected (values nobody sent) ----------------------------------------------------------


def test_unexpected() -> None:
    b = HistoryBuilder()
    b.call(0, "send", [snd("x", "a")], [sent("x", 0, "a")])
    r = b.call(1, "poll", [POLL], [polled(x=[(0, "a"), (1, "zz")])])
    assert errors(b, "unexpected") == [{"key": "x", "value": "zz", "reader": r, "readers": 1}]
    res = check(b.history())
    assert res["valid"] is False and res["bad_anomaly_types"] == ["unexpected"]


# -- cycles -------------------------------------------------------------------------------------


def cycle_ops(res_or_example: dict[str, Any]) -> list[int]:
    return [op["index"] if isinstance(op, dict) else op.index for op in res_or_example["cycle"]]


def rotate(example: dict[str, Any], first: Op) -> tuple[list[int], list[dict[str, Any]]]:
    """A cycle example's operation indices and steps, rotated to start at ``first``."""
    ops = cycle_ops(example)[:-1]
    i = ops.index(first.index)
    ops = ops[i:] + ops[:i]
    return [*ops, ops[0]], example["steps"][i:] + example["steps"][:i]


def test_g0() -> None:
    # kafka_test.clj g0-test: a before b on x, b before a on y.
    b = HistoryBuilder()
    b.invoke(0, "send", [snd("x", "a"), snd("y", "a")])
    b.invoke(1, "send", [snd("x", "b"), snd("y", "b")])
    wa = b.ok(0, "send", [sent("x", 0, "a"), sent("y", 1, "a")])
    wb = b.ok(1, "send", [sent("x", 1, "b"), sent("y", 0, "b")])
    final_poll(b, 2, x=[(0, "a"), (1, "b")], y=[(0, "b"), (1, "a")])
    [g0] = errors(b, "G0")
    assert g0["cycle"] == [wa, wb, wa]
    assert g0["steps"] == [
        {
            "from": wa.index,
            "to": wb.index,
            "type": "ww",
            "rels": ["ww"],
            "why": {"ww": {"key": "x", "value": "a", "value'": "b"}},
        },
        {
            "from": wb.index,
            "to": wa.index,
            "type": "ww",
            "rels": ["ww"],
            "why": {"ww": {"key": "y", "value": "b", "value'": "a"}},
        },
    ]
    res = check(b.history())
    assert res["anomaly_types"] == ["G0"]
    assert res["valid"] is True  # write cycles are normal in Kafka
    assert cycle_ops(res["anomalies"]["G0"][0]) == [wa.index, wb.index, wa.index]
    assert "G0" not in check(b.history(), ww_deps=False)["anomalies"]


def test_g0_clean() -> None:
    b = HistoryBuilder()
    b.invoke(0, "send", [snd("x", "a"), snd("y", "a")])
    b.invoke(1, "send", [snd("x", "b"), snd("y", "b")])
    b.ok(0, "send", [sent("x", 0, "a"), sent("y", 0, "a")])
    b.ok(1, "send", [sent("x", 1, "b"), sent("y", 1, "b")])
    final_poll(b, 2, x=[(0, "a"), (1, "b")], y=[(0, "a"), (1, "b")])
    res = check(b.history())
    assert res["anomalies"] == {} and res["valid"] is True


def g1c_wr_history(cyclic: bool) -> tuple[HistoryBuilder, Op, Op]:
    # kafka_test.clj g1c-pure-wr-test: t1 and t2 each see the other's write.
    b = HistoryBuilder()
    b.invoke(0, "txn", [snd("x", "a"), POLL])
    b.invoke(1, "txn", [snd("y", "b"), POLL])
    t1 = b.ok(0, "txn", [sent("x", 0, "a"), polled(y=[(0, "b")] if cyclic else [])])
    t2 = b.ok(1, "txn", [sent("y", 0, "b"), polled(x=[(0, "a")])])
    final_poll(b, 2, x=[(0, "a")], y=[(0, "b")])
    return b, t1, t2


def test_g1c_pure_wr() -> None:
    b, t1, t2 = g1c_wr_history(True)
    [g1c] = errors(b, "G1c", ww_deps=False)
    assert g1c["cycle"] == [t1, t2, t1]
    assert [(s["type"], s["why"]["wr"]) for s in g1c["steps"]] == [
        ("wr", {"key": "x", "value": "a"}),
        ("wr", {"key": "y", "value": "b"}),
    ]
    res = check(b.history(), ww_deps=False)
    assert res["valid"] is False and res["bad_anomaly_types"] == ["G1c"]
    # With ww dependencies Jepsen expects G1c (no write isolation) and allows it.
    res = check(b.history())
    assert res["anomaly_types"] == ["G1c"] and res["valid"] is True


def test_g1c_clean() -> None:
    b, _, _ = g1c_wr_history(False)
    res = check(b.history(), ww_deps=False)
    assert res["anomalies"] == {} and res["valid"] is True


def test_g1c_ww_wr() -> None:
    # kafka_test.clj g1c-ww-wr-test: t1's y write follows t2's, but t2 read t1's x.
    b = HistoryBuilder()
    b.invoke(0, "txn", [snd("x", "a"), snd("y", "c")])
    b.invoke(1, "txn", [POLL, snd("y", "b")])
    t1 = b.ok(0, "txn", [sent("x", 0, "a"), sent("y", 2, "c")])
    t2 = b.ok(1, "txn", [polled(x=[(0, "a")]), sent("y", 1, "b")])
    final_poll(b, 2, x=[(0, "a")], y=[(1, "b"), (2, "c")])
    [g1c] = errors(b, "G1c")
    assert g1c["cycle"] == [t1, t2, t1]
    assert [s["type"] for s in g1c["steps"]] == ["wr", "ww"]
    assert g1c["steps"][1]["why"]["ww"] == {"key": "y", "value": "b", "value'": "c"}


def process_cycle_history(same_process: bool, reads: bool, cyclic: bool = True) -> Built3:
    """T1 then T2 in real time (one process, or two); T3 concurrent with both.

    With ``reads=False``: T2 writes x before T3 and T3 writes y before T1 (ww).
    With ``reads=True``: T3 reads T2's x and T1 reads T3's y (wr).
    Either closes a cycle T1 -> T2 -> T3 -> T1 only through the order edge.
    ``cyclic=False`` flips the data dependencies so that no cycle exists.
    """
    b = HistoryBuilder()
    p2 = 0 if same_process else 2
    if reads:
        b.invoke(1, "txn", [POLL, snd("y", "d")])
        b.invoke(0, "txn", [POLL])
        t1 = b.ok(0, "txn", [polled(y=[(0, "d")] if cyclic else [])])
        b.invoke(p2, "send", [snd("x", "a")])
        t2 = b.ok(p2, "send", [sent("x", 0, "a")])
        t3 = b.ok(1, "txn", [polled(x=[(0, "a")]), sent("y", 0, "d")])
        final_poll(b, 3, x=[(0, "a")], y=[(0, "d")])
    else:
        b.invoke(1, "send", [snd("x", "b"), snd("y", "d")])
        b.invoke(0, "send", [snd("y", "c")])
        t1 = b.ok(0, "send", [sent("y", 1 if cyclic else 0, "c")])
        b.invoke(p2, "send", [snd("x", "a")])
        t2 = b.ok(p2, "send", [sent("x", 0, "a")])
        t3 = b.ok(1, "send", [sent("x", 1, "b"), sent("y", 0 if cyclic else 1, "d")])
        y = [(0, "d"), (1, "c")] if cyclic else [(0, "c"), (1, "d")]
        final_poll(b, 3, x=[(0, "a"), (1, "b")], y=y)
    return b, t1, t2, t3


@pytest.mark.parametrize(
    ("same_process", "reads", "name", "order"),
    [
        (True, False, "G0-process", "process"),
        (False, False, "G0-realtime", "realtime"),
        (True, True, "G1c-process", "process"),
        (False, True, "G1c-realtime", "realtime"),
    ],
)
def test_order_cycles(same_process: bool, reads: bool, name: str, order: str) -> None:
    b, t1, t2, t3 = process_cycle_history(same_process, reads)
    a = analyze(b.history(), ww_deps=not reads)
    cycles = {n: es for n, es in a.errors.items() if n.startswith("G")}
    assert list(cycles) == [name]
    [ex] = cycles[name]
    ops, steps = rotate(ex, t1)
    assert ops == [t1.index, t2.index, t3.index, t1.index]
    data = "wr" if reads else "ww"
    assert [s["type"] for s in steps] == [order, data, data]
    assert [s["rels"] for s in steps] == [[order], [data], [data]]
    assert [(s["from"], s["to"]) for s in steps] == list(itertools.pairwise(ops))
    res = check(b.history(), ww_deps=not reads)
    assert list(res["anomalies"]) == [name]
    assert rotate(res["anomalies"][name][0], t1)[0] == ops
    if reads:  # G1c-* are illegal without ww dependencies...
        assert res["valid"] is False and res["bad_anomaly_types"] == [name]
        # ... and expected (allowed) with them.
        assert check(b.history())["valid"] is True
    else:  # G0-* are always allowed
        assert res["valid"] is True


@pytest.mark.parametrize(
    ("same_process", "reads"), [(True, False), (False, False), (True, True), (False, True)]
)
def test_order_cycles_clean(same_process: bool, reads: bool) -> None:
    b, *_ = process_cycle_history(same_process, reads, cyclic=False)
    for ww_deps in (True, False):
        res = check(b.history(), ww_deps=ww_deps)
        assert res["anomalies"] == {} and res["valid"] is True


def test_cycle_search_timeout_is_unknown() -> None:
    b, *_ = g1c_wr_history(True)
    res = check(b.history(), ww_deps=False, cycle_search_budget=0)
    assert res["valid"] == "unknown"
    assert {r["type"] for r in res["unknown_reasons"]} == {"cycle-search-timeout"}


# -- validity, options and files ------------------------------------------------------------------


def test_empty_history_is_unknown() -> None:
    b = HistoryBuilder()
    b.call(0, "assign", ["x"])
    b.call("nemesis", "start-partition", "majority", type="info")
    res = check(b.history())
    assert res["valid"] == "unknown"
    assert res["unknown_reasons"] == [{"type": "empty-transaction-graph"}]
    assert res["stats"]["nemesis_ops"] == 2


def test_allowed_anomaly_types() -> None:
    # kafka.clj allowed-error-types
    assert allowed_anomaly_types(subscribe=False, ww_deps=False) == {
        "int-send-skip",
        "G0",
        "G0-process",
        "G0-realtime",
    }
    assert allowed_anomaly_types(subscribe=True, ww_deps=True) == {
        "int-send-skip",
        "G0",
        "G0-process",
        "G0-realtime",
        "poll-skip",
        "nonmonotonic-poll",
        "G1c",
        "G1c-process",
        "G1c-realtime",
    }


def test_examples_are_capped_and_counted() -> None:
    b = HistoryBuilder()
    for v in range(40):
        b.call(0, "send", [snd("x", v)], [sent("x", 0, v)])
        b.call(1, "poll", [POLL], [polled(x=[(1, v)])])
    res = check(b.history(), max_examples=5)
    assert res["anomaly_counts"]["duplicate"] == 40
    assert len(res["anomalies"]["duplicate"]) == 5


def test_nemesis_ops_are_ignored() -> None:
    b = HistoryBuilder()
    b.call("nemesis", "start-partition", {"n1": ["n2"]}, type="info")
    b.call(0, "send", [snd("x", "a")], [sent("x", 0, "a")])
    b.add("info", "nemesis", "kill", ["n1"])
    b.call(1, "poll", [POLL], [polled(x=[(0, "a")])])
    b.call(0, "crash", None, type="info")
    b.call(2, "debug-topic-partitions", ["x"], {"x": {"leader": 1}})
    res = check(b.history())
    assert res["anomalies"] == {} and res["valid"] is True
    assert res["stats"]["by_f"]["crash"]["info"] == 1
    assert res["stats"]["queue"]["acknowledged"] == 1


def test_result_is_json_and_stats(tmp_path: Path) -> None:
    b, *_ = poll_skip_history()
    path = tmp_path / "history.jsonl"
    write_jsonl(path, b.history())
    out = tmp_path / "results.json"
    res = check_file(path, out)
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    assert res == check(b.history())
    stats = res["stats"]
    assert stats["ops"] == len(b.ops) and stats["keys"] == 1
    assert stats["max_offsets"] == {"x": 7}
    assert stats["graph"]["edges"]["wr"] > 0
    assert stats["info_txn_causes"] == []
    assert set(res) == {
        "valid",
        "anomaly_types",
        "bad_anomaly_types",
        "allowed_anomaly_types",
        "unknown_reasons",
        "anomalies",
        "anomaly_counts",
        "unseen",
        "stats",
    }


def test_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad, *_ = poll_skip_history()
    path = tmp_path / "history.jsonl"
    write_jsonl(path, bad.history())
    assert main([str(path), str(tmp_path / "r.json")]) == 1
    assert json.loads((tmp_path / "r.json").read_text())["valid"] is False
    assert main([str(path), "--subscribe"]) == 1  # still a lost-write
    assert '"valid": false' in capsys.readouterr().out
    good = HistoryBuilder()
    good.call(0, "send", [snd("x", 1)], [sent("x", 0, 1)])
    good.call(1, "poll", [POLL], [polled(x=[(0, 1)])])
    write_jsonl(path, good.history())
    assert main([str(path), "--no-ww-deps", "--strict-unseen"]) == 0
    unknown = unseen_history(None)
    write_jsonl(path, unknown.history())
    assert main([str(path)]) == 2
    assert main([]) == 64
    assert main([str(path), "--bogus"]) == 64


def test_options_object() -> None:
    b, *_ = g1c_wr_history(True)
    opts = CheckerOptions(ww_deps=False)
    assert check(b.history(), opts)["valid"] is False
    assert check(b.history(), opts, ww_deps=True)["valid"] is True


# -- graph -----------------------------------------------------------------------------------------


def test_graph_scc_and_cycles() -> None:
    g = DiGraph()
    g.link(1, 2, WW)
    g.link(2, 3, WR)
    g.link(3, 1, PROCESS)
    g.link(3, 4, WW)
    g.link(4, 4, WW)  # self edges are ignored
    g.link(5, 6, WW)
    g.link(6, 5, WW)
    assert strongly_connected_components(g) == [[1, 2, 3], [5, 6]]
    assert strongly_connected_components(g, WW | WR) == [[5, 6]]
    assert find_cycle(g, [1, 2, 3], WW | WR | PROCESS) == [1, 2, 3, 1]
    assert find_cycle(g, [1, 2, 3], WW | WR) is None
    assert find_cycle(g, [1, 2, 3], WW | WR | PROCESS, (WR, PROCESS)) == [2, 3, 1, 2]
    assert find_cycle(g, [5, 6], WW, (WR,)) is None
    assert g.rels(4, 4) == 0 and len(g) == 6 and 4 in g
    assert g.edge_count() == 6


def test_graph_large_cycle_is_iterative() -> None:
    g = DiGraph()
    n = 5000
    for i in range(n):
        g.link(i, (i + 1) % n, WW)
    [comp] = strongly_connected_components(g)
    assert len(comp) == n
    cycle = find_cycle(g, comp, WW)
    assert cycle is not None and len(cycle) == n + 1


# -- simulated histories -------------------------------------------------------------------

KEYS = ("t-0", "t-1", "t-2")


@dataclass
class Worker:
    process: int
    assigned: set[str] = field(default_factory=set)
    positions: dict[str, int] = field(default_factory=dict)
    pending: tuple[str, list[Any], dict[str, Any]] | None = None


class Sim:
    """A correct in-memory log driven by random clients.

    Each key is a list of ``[value, visible]`` records; invisible records are
    transaction markers and aborted sends (they take up an offset). Operations
    take effect when they complete. Transactions commit atomically (their
    polls never see their own sends), aborts rewind the consumer, and a
    process that gets ``info`` is replaced by a fresh one.
    """

    def __init__(self, rng: random.Random, workers: int = 3) -> None:
        self.rng = rng
        self.b = HistoryBuilder()
        self.log: dict[str, list[tuple[int, bool]]] = {k: [] for k in KEYS}
        self.next_value = 0
        self.next_process = workers
        self.workers = [Worker(i) for i in range(workers)]

    def fresh(self) -> int:
        self.next_process += 1
        return self.next_process - 1

    def value(self) -> int:
        self.next_value += 1
        return self.next_value

    def append(self, k: str, v: int, visible: bool) -> int:
        self.log[k].append((v, visible))
        return len(self.log[k]) - 1

    def read(self, w: Worker, limit: int) -> list[Any]:
        out: dict[str, list[tuple[int, int]]] = {}
        for k in sorted(w.assigned):
            pos = w.positions[k]
            got: list[tuple[int, int]] = []
            while pos < len(self.log[k]) and len(got) < limit:
                v, visible = self.log[k][pos]
                if visible:
                    got.append((pos, v))
                pos += 1
            w.positions[k] = pos
            if got:
                out[k] = got
        return polled(**out)

    def invoke(self, w: Worker) -> None:
        r = self.rng
        value: list[Any]
        if not w.assigned:
            f, value = "assign", sorted(r.sample(KEYS, r.randint(1, len(KEYS))))
        else:
            f = r.choice(["send", "poll", "txn", "txn", "assign"])
            if f == "assign":
                value = sorted(r.sample(KEYS, r.randint(1, len(KEYS))))
            elif f == "send":
                value = [snd(r.choice(KEYS), self.value()) for _ in range(r.randint(1, 2))]
            elif f == "poll":
                value = [POLL]
            else:
                value = [
                    POLL if r.random() < 0.4 else snd(r.choice(KEYS), self.value())
                    for _ in range(r.randint(1, 4))
                ]
        seek = f == "assign" and r.random() < 0.2
        extra = {"seek_to_beginning": True} if seek else {}
        self.b.invoke(w.process, f, value, **extra)
        w.pending = (f, value, extra)

    def complete(self, w: Worker, final: bool = False) -> None:
        assert w.pending is not None
        f, value, extra = w.pending
        w.pending = None
        r = self.rng
        if f == "assign":
            keys = set(value)
            seek = bool(extra)
            w.positions = {k: 0 if seek else w.positions.get(k, 0) for k in keys}
            w.assigned = keys
            self.b.ok(w.process, f, value, **extra)
            return
        roll = 0.0 if final else r.random()
        if roll < 0.75:
            outcome = "ok"
        elif roll < 0.87:
            outcome = "fail"
        else:
            outcome = "info"
        if f == "poll" and outcome == "fail":
            outcome = "ok"
        if outcome == "info":
            # Indeterminate: may or may not take effect; the process crashes.
            if r.random() < 0.5:
                self.apply(w, f, value, commit=True)
            elif f == "txn":
                self.apply(w, f, value, commit=False)
            self.b.info(w.process, f, value, error="timeout")
            w.process, w.assigned, w.positions = self.fresh(), set(), {}
            return
        if f == "send" and outcome == "fail":
            self.b.fail(w.process, f, value, error="rejected")
            return
        result = self.apply(w, f, value, commit=outcome == "ok")
        self.b.add(outcome, w.process, f, result)  # type: ignore[arg-type]

    def apply(self, w: Worker, f: str, value: list[Any], commit: bool) -> list[Any]:
        start = dict(w.positions)
        result: list[Any] = []
        staged: list[tuple[int, str, int]] = []
        for i, m in enumerate(value):
            if m[0] == "poll":
                result.append(self.read(w, self.rng.randint(1, 3)))
            else:
                staged.append((i, m[1], m[2]))
                result.append(None)
        for i, k, v in staged:
            result[i] = sent(k, self.append(k, v, visible=commit), v)
        if f == "txn":
            for k in sorted({k for _, k, _ in staged}):
                self.append(k, 0, visible=False)  # commit/abort marker
            if not commit:
                w.positions = start  # an aborted transaction rewinds
        return result

    def run(self, steps: int) -> None:
        for _ in range(steps):
            w = self.rng.choice(self.workers)
            if w.pending is None:
                self.invoke(w)
            else:
                self.complete(w)
        for w in self.workers:
            if w.pending is not None:
                self.complete(w, final=True)
        # Final sends, so that every earlier write lies below a read offset...
        p = self.fresh()
        vals = {k: [self.value() for _ in range(4)] for k in KEYS}
        mops = [snd(k, v) for k in KEYS for v in vals[k]]
        self.b.invoke(p, "send", mops)
        self.b.ok(p, "send", [sent(k, self.append(k, v, True), v) for k in KEYS for v in vals[k]])
        # ... and final polls from the beginning, by a fresh consumer.
        final = Worker(self.fresh(), set(KEYS), dict.fromkeys(KEYS, 0))
        self.b.call(final.process, "assign", list(KEYS), seek_to_beginning=True)
        while any(final.positions[k] < len(self.log[k]) for k in KEYS):
            self.b.call(final.process, "poll", [POLL], [self.read(final, 4)])

    def history(self) -> History:
        return self.b.history()


def simulate(rng: random.Random, steps: int) -> Sim:
    sim = Sim(rng)
    sim.run(steps)
    return sim


SIM_SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@SIM_SETTINGS
@given(rng=st.randoms(use_true_random=False), steps=st.integers(0, 80))
def test_simulated_clean_histories_are_valid(rng: random.Random, steps: int) -> None:
    h = simulate(rng, steps).history()
    for ww_deps in (True, False):
        res = check(h, ww_deps=ww_deps, strict_unseen=True)
        assert res["anomalies"] == {}, res["anomalies"]
        assert res["valid"] is True


def edit_poll(op: Op, k: str, f: Any, only: int | None = None) -> Op:
    """A copy of a poll/txn completion with key ``k``'s pairs replaced by
    ``f(pairs)`` in every poll micro-op (or only in micro-op number ``only``)."""
    value = []
    for i, m in enumerate(op.value):
        if m[0] == "poll" and k in m[1] and only in (None, i):
            m = ["poll", {**m[1], k: f(list(m[1][k]))}]
        value.append(m)
    return op.replace(value=value)


def inject(sim: Sim, fault: str, data: st.DataObject) -> tuple[History, set[str]]:
    """Apply one fault to a simulated history; returns it and the anomalies that
    must be reported (at least one of them)."""
    ops = list(sim.b.ops)
    acked = {
        (k, v)
        for op in ops
        if op.is_ok and op.f in ("send", "txn")
        for k, pairs in op.write_pairs().items()
        for o, v in pairs
        if o is not None
    }
    polls = [
        (i, mi, k, len(pairs))
        for i, op in enumerate(ops)
        if op.is_ok and op.f in ("poll", "txn")
        for mi, m in enumerate(op.value)
        if m[0] == "poll"
        for k, pairs in m[1].items()
        if len(pairs) >= (3 if fault == "skip" else 2)
        and (fault != "skip" or any((k, v) in acked for _, v in pairs[1:-1]))
    ]
    if fault == "drop":
        # An acknowledged write that no poll ever returns (not the last of its
        # key: the final sends guarantee later reads).
        k, v = data.draw(
            st.sampled_from(sorted(kv for kv in acked if kv[1] != sim.log[kv[0]][-1][0]))
        )
        for i, op in enumerate(ops):
            if v in op.reads().get(k, ()):
                ops[i] = edit_poll(op, k, lambda ps: [p for p in ps if p[1] != v])
        return History(ops), {"lost-write"}
    i, mi, k, n = data.draw(st.sampled_from(polls))
    if fault == "duplicate":
        # The last poll of k returns an earlier value again, at a new offset.
        last = max(j for j, op in enumerate(ops) if op.is_ok and op.reads().get(k))
        v = data.draw(st.sampled_from(ops[last].reads()[k]))
        top = len(sim.log[k])
        ops[last] = edit_poll(ops[last], k, lambda ps: [*ps, [top, v]])
        return History(ops), {"duplicate"}
    if fault == "reorder":
        j = data.draw(st.integers(0, n - 2))
        ops[i] = edit_poll(ops[i], k, lambda ps: [*ps[:j], ps[j + 1], ps[j], *ps[j + 2 :]], mi)
        return History(ops), {"int-nonmonotonic-poll"}
    assert fault == "skip"
    # Skip a record whose offset is known from its (acknowledged) send; the
    # final sends (four per key) make sure some poll has one in the middle.
    pairs = ops[i].value[mi][1][k]
    j = data.draw(st.sampled_from([j for j in range(1, n - 1) if (k, pairs[j][1]) in acked]))
    ops[i] = edit_poll(ops[i], k, lambda ps: [*ps[:j], *ps[j + 1 :]], mi)
    return History(ops), {"int-poll-skip"}


@SIM_SETTINGS
@given(
    rng=st.randoms(use_true_random=False),
    steps=st.integers(0, 60),
    fault=st.sampled_from(["drop", "duplicate", "reorder", "skip"]),
    data=st.data(),
)
def test_simulated_faults_are_caught(
    rng: random.Random, steps: int, fault: str, data: st.DataObject
) -> None:
    h, expected = inject(simulate(rng, steps), fault, data)
    res = check(h)
    assert expected & set(res["anomaly_types"]), (fault, res["anomaly_types"])
    assert res["valid"] is False
