"""Tests for the Jepsen history model (jepsen/history.py)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jepsen.history import (
    History,
    HistoryBuilder,
    HistoryError,
    HistoryWriter,
    Op,
    Poll,
    Send,
    dumps_op,
    loads_op,
    normalize_key,
    read_jsonl,
    write_jsonl,
)

EXAMPLE_LINES = [
    '{"index": 0, "time": 100, "type": "invoke", "process": 0, "f": "assign", '
    '"value": ["t-0", "t-1"], "seek_to_beginning": true}',
    '{"index": 1, "time": 200, "type": "ok", "process": 0, "f": "assign", '
    '"value": ["t-0", "t-1"], "seek_to_beginning": true}',
    '{"index": 2, "time": 300, "type": "invoke", "process": 0, "f": "send", '
    '"value": [["send", "t-0", 17]]}',
    '{"index": 3, "time": 400, "type": "ok", "process": 0, "f": "send", '
    '"value": [["send", "t-0", [42, 17]]]}',
    '{"index": 4, "time": 500, "type": "invoke", "process": 1, "f": "poll", '
    '"value": [["poll"]], "poll_ms": 100}',
    '{"index": 5, "time": 600, "type": "info", "process": "nemesis", '
    '"f": "start-partition", "value": {"n1": ["n2"]}}',
    '{"index": 6, "time": 700, "type": "ok", "process": 1, "f": "poll", '
    '"value": [["poll", {"t-0": [[41, 16], [42, 17]]}]], '
    '"rebalance_log": [{"keys": ["t-1"]}]}',
    '{"index": 7, "time": 800, "type": "invoke", "process": 2, "f": "txn", '
    '"value": [["poll"], ["send", "t-1", 18]]}',
    '{"index": 8, "time": 900, "type": "info", "process": 2, "f": "txn", '
    '"value": [["poll"], ["send", "t-1", 18]], "error": "timeout"}',
    '{"index": 9, "time": 1000, "type": "invoke", "process": 3, "f": "crash", "value": null}',
    '{"index": 10, "time": 1100, "type": "info", "process": 3, "f": "crash", "value": null}',
    '{"index": 11, "time": 1200, "type": "invoke", "process": 4, '
    '"f": "debug-topic-partitions", "value": ["t-0"]}',
    '{"index": 12, "time": 1300, "type": "ok", "process": 4, '
    '"f": "debug-topic-partitions", "value": {"t-0": {"leader": 1}}}',
]


def example_history() -> History:
    return read_jsonl(io.StringIO("\n".join(EXAMPLE_LINES) + "\n"))


def test_parse_example_lines() -> None:
    h = example_history()
    assert len(h) == len(EXAMPLE_LINES)
    send_ok = h[3]
    assert send_ok.mops == (Send("t-0", 17, 42),)
    assert send_ok.writes() == {"t-0": [17]}
    assert send_ok.write_pairs() == {"t-0": [(42, 17)]}
    assert send_ok.reads() == {}
    poll_ok = h[6]
    assert poll_ok.reads() == {"t-0": [16, 17]}
    assert poll_ok.read_pairs() == {"t-0": [(41, 16), (42, 17)]}
    assert poll_ok.rebalance_keys() == frozenset({"t-1"})
    assert h[4].mops == (Poll(None),)
    assert h[4].extra == {"poll_ms": 100}
    assert h[1].subscription_keys() == frozenset({"t-0", "t-1"})
    assert h[1].seek_to_beginning
    assert not h[3].seek_to_beginning
    assert h[8].error == "timeout"
    assert h[8].writes() == {"t-1": [18]}
    assert h[8].write_pairs() == {"t-1": [(None, 18)]}
    assert h[12].mops == ()


def test_round_trip_lines_exactly() -> None:
    h = example_history()
    for line, op in zip(EXAMPLE_LINES, h, strict=True):
        assert json.loads(dumps_op(op)) == json.loads(line)
        again = loads_op(dumps_op(op))
        assert again.to_dict() == op.to_dict()


def test_pairing_and_classification() -> None:
    h = example_history()
    assert h.completion(h[0]) is h[1]
    assert h.invocation(h[1]) is h[0]
    assert h.completion(h[4]) is h[6]
    assert h.invocation(h[6]) is h[4]
    assert h.invocation(h[5]) is None  # nemesis info without invoke: tolerated
    assert h.completion(h[3]) is h[3]
    assert [(i.index, c.index if c else None) for i, c in h.pairs()] == [
        (0, 1),
        (2, 3),
        (4, 6),
        (7, 8),
        (9, 10),
        (11, 12),
    ]
    assert [op.index for op in h.nemesis_ops()] == [5]
    assert len(h.client_ops()) == len(h) - 1
    assert h.by_index(6) is h[6]
    assert [op.index for op in h.by_process()[1]] == [4, 6]
    assert all(not op.is_invoke for op in h.completions())
    assert h[8].is_info and h[3].is_ok and h[0].is_invoke and not h[0].is_fail


def test_open_invocation_is_unpaired() -> None:
    b = HistoryBuilder()
    inv = b.invoke(0, "send", [["send", "x", 1]])
    h = b.history()
    assert h.completion(inv) is None
    assert h.pairs() == [(inv, None)]


def test_integer_keys_are_normalised() -> None:
    op = Op("ok", "txn", 0, [["send", 3, [0, "a"]], ["poll", {"3": [[0, "a"]], 4: []}]])
    assert op.writes() == {"3": ["a"]}
    assert op.reads() == {"3": ["a"], "4": []}
    assert normalize_key(7) == "7"
    with pytest.raises(HistoryError):
        normalize_key(True)
    with pytest.raises(HistoryError):
        normalize_key(1.5)


def test_list_values_become_hashable() -> None:
    op = Op("ok", "poll", 0, [["poll", {"x": [[0, [1, 2]]]}]])
    assert op.reads() == {"x": [(1, 2)]}
    assert op.to_dict()["value"] == [["poll", {"x": [[0, [1, 2]]]}]]


def test_reads_and_writes_follow_f() -> None:
    # Jepsen's op-writes covers send/txn, op-reads poll/txn.
    send = Op("ok", "send", 0, [["send", "x", [0, 1]]])
    poll = Op("ok", "poll", 0, [["poll", {"x": [[0, 1]]}]])
    txn = Op("ok", "txn", 0, [["poll", {"x": [[0, 1]]}], ["send", "x", [1, 2]]])
    assert send.writes() and not send.reads()
    assert poll.reads() and not poll.writes()
    assert txn.reads() == {"x": [1]} and txn.writes() == {"x": [2]}
    assert Op("ok", "assign", 0, ["x"]).mops == ()


@pytest.mark.parametrize(
    "value",
    [
        "nope",
        [[]],
        [["frob", "x"]],
        [["send", "x"]],
        [["send", "x", [1.5, 2]]],
        [["poll", ["x"]]],
        [["poll", {"x": [[1, 2, 3]]}]],
        [["poll", {"x": 5}]],
        [["send", "x", {"a": 1}]],
    ],
)
def test_malformed_micro_ops(value: Any) -> None:
    with pytest.raises(HistoryError):
        Op("ok", "txn", 0, value)


@pytest.mark.parametrize(
    "fields",
    [
        {"type": "done", "f": "send", "process": 0},
        {"type": "ok", "f": "", "process": 0},
        {"type": "ok", "f": "send", "process": 1.5},
        {"type": "ok", "f": "send", "process": True},
        {"type": "ok", "f": "send", "process": 0, "time": 1.5},
        {"type": "ok", "f": "send", "process": 0, "index": "1"},
    ],
)
def test_malformed_ops(fields: dict[str, Any]) -> None:
    with pytest.raises(HistoryError):
        Op.from_dict(fields)


def test_from_dict_requires_core_fields() -> None:
    with pytest.raises(HistoryError, match="lacks 'f'"):
        Op.from_dict({"type": "ok", "process": 0})
    with pytest.raises(HistoryError):
        Op.from_dict([1, 2])  # type: ignore[arg-type]


def test_strict_pairing_errors() -> None:
    b = HistoryBuilder()
    b.invoke(0, "send", [["send", "x", 1]])
    b.invoke(0, "send", [["send", "x", 2]])
    with pytest.raises(HistoryError, match="still open"):
        b.history()
    b.history(strict=False)

    b = HistoryBuilder()
    b.ok(0, "send", [["send", "x", [0, 1]]])
    with pytest.raises(HistoryError, match="no invocation"):
        b.history()
    assert b.history(strict=False).invocation(b.ops[0]) is None

    b = HistoryBuilder()
    b.invoke(0, "send", [["send", "x", 1]])
    b.ok(0, "poll", [["poll", {}]])
    with pytest.raises(HistoryError, match="completes f="):
        b.history()

    b = HistoryBuilder()
    b.call(0, "crash", None, type="info")
    b.invoke(0, "poll", [["poll"]])
    with pytest.raises(HistoryError, match="fresh process id"):
        b.history()
    # The nemesis may go on after info completions.
    b = HistoryBuilder()
    b.call("nemesis", "start-partition", "majority", type="info")
    b.call("nemesis", "stop-partition", None, type="info")
    assert len(b.history()) == 4


def test_indices() -> None:
    ops = [Op("invoke", "poll", 0, [["poll"]]), Op("ok", "poll", 0, [["poll", {}]])]
    h = History(ops)
    assert [op.index for op in h] == [0, 1]
    with pytest.raises(HistoryError, match="strictly increasing"):
        History([ops[0].replace(index=3), ops[1].replace(index=2)])
    with pytest.raises(HistoryError, match="strictly increasing"):
        History([ops[0].replace(index=1), ops[1]])  # mixed given/missing
    assert History([]).ops == []


def test_sequence_protocol() -> None:
    h = example_history()
    assert h[1:3] == [h[1], h[2]]
    assert list(iter(h)) == h.ops
    assert h[-1].index == 12


def test_jepsen_spellings() -> None:
    op = Op.from_dict(
        {
            "type": "ok",
            "f": "poll",
            "process": 0,
            "value": [["poll", {"x": []}]],
            "rebalance-log": [{"keys": ["x", 2]}, {"other": 1}, "junk"],
        }
    )
    assert op.rebalance_keys() == frozenset({"x", "2"})
    assign = Op.from_dict(
        {"type": "ok", "f": "assign", "process": 0, "value": ["x"], "seek-to-beginning?": True}
    )
    assert assign.seek_to_beginning
    assert Op("ok", "poll", 0, None, extra={"rebalance_log": "bad"}).rebalance_keys() == set()


def test_jsonl_files(tmp_path: Path) -> None:
    h = example_history()
    path = tmp_path / "history.jsonl"
    write_jsonl(path, h)
    text = path.read_text()
    assert text.count("\n") == len(h)
    again = read_jsonl(path)
    assert [op.to_dict() for op in again] == [op.to_dict() for op in h]
    path.write_text(text + "\n\n")
    assert len(read_jsonl(path)) == len(h)
    path.write_text(text + "{not json\n")
    with pytest.raises(HistoryError, match=f"line {len(h) + 1}"):
        read_jsonl(path)


def test_history_writer(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as w:
        a = w.append("invoke", 0, "send", [["send", "x", 1]])
        b = w.append("ok", 0, "send", [["send", "x", [0, 1]]], time=10**9)
        w.append("info", "nemesis", "kill", ["n1"], error="boom", extra_field=3)
    assert (a.index, b.index, b.time) == (0, 1, 10**9)
    h = read_jsonl(path)
    assert len(h) == 3
    assert h[2].error == "boom" and h[2].extra == {"extra_field": 3}
    assert h.completion(h[0]) is h[1]
    assert h[0].time >= 0


def test_builder_call() -> None:
    b = HistoryBuilder()
    done = b.call(0, "send", [["send", "x", 1]], [["send", "x", [0, 1]]], error=None)
    assert done.is_ok and done.index == 1 and done.time == 1_000_000
    echoed = b.call(1, "assign", ["x"])
    assert echoed.value == ["x"]
    assert b.history().invocation(echoed) is b.ops[2]


values = st.one_of(st.integers(-(10**6), 10**6), st.text(max_size=5))
keys = st.one_of(st.sampled_from(["t-0", "t-1"]), st.integers(0, 3))
send_mop = st.tuples(keys, values, st.one_of(st.none(), st.integers(0, 100))).map(
    lambda t: ["send", t[0], [t[2], t[1]]]
)
poll_mop = st.dictionaries(
    keys.map(str),
    st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 100)), values).map(list), max_size=3),
    max_size=2,
).map(lambda d: ["poll", d])


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["ok", "fail", "info"]),
            st.lists(st.one_of(send_mop, poll_mop), max_size=4),
            st.integers(0, 10**12),
        ),
        max_size=8,
    )
)
def test_jsonl_round_trip_property(ops: list[tuple[str, list[Any], int]]) -> None:
    b = HistoryBuilder()
    for i, (typ, mops, t) in enumerate(ops):
        b.invoke(i, "txn", [["poll"]], time=t)
        b.add(typ, i, "txn", mops, time=t + 1)  # type: ignore[arg-type]
    h = b.history()
    buf = io.StringIO()
    write_jsonl(buf, h)
    again = read_jsonl(io.StringIO(buf.getvalue()))
    assert [op.to_dict() for op in again] == [op.to_dict() for op in h]
    for x, y in zip(h, again, strict=True):
        assert x.mops == y.mops
        assert x.reads() == y.reads() and x.writes() == y.writes()
