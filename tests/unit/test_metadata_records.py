"""Metadata records and commands: CBOR round trips and strict decoding.

Goal: every record type survives encode/decode unchanged for arbitrary field values, and bytes
that do not match a record's schema are rejected with RecordFormatError, never half-decoded.
Method: Hypothesis strategies derived from each dataclass's own annotations, plus hand-built
malformed maps.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.metadata import _codec
from raftlog.metadata.records import (
    RECORD_TYPE_BY_TAG,
    RECORD_TYPES,
    AlterConfigs,
    Command,
    CreateTopic,
    FenceBroker,
    Record,
    RecordFormatError,
    RegisterBroker,
    decode_command,
    decode_record,
    encode_command,
    encode_record,
)


def strategy_for(hint: Any) -> st.SearchStrategy[Any]:
    """A strategy for values of ``hint`` (the annotation kinds records use)."""
    if hint is int:
        return st.integers(min_value=-(2**63), max_value=2**63 - 1)
    if hint is str:
        return st.text(max_size=20)
    if hint is float:  # finite: NaN never equals itself, so it cannot round-trip by value
        return st.floats(allow_nan=False)
    if hint is bytes:
        return st.binary(max_size=20)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is types.UnionType:
        return st.one_of([st.none() if a is type(None) else strategy_for(a) for a in args])
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return st.lists(strategy_for(args[0]), max_size=4).map(tuple)
    if origin is tuple:
        return st.tuples(*(strategy_for(a) for a in args))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):  # a nested frozen dataclass
        fields = _codec.field_hints(hint)
        return st.builds(hint, **{name: strategy_for(h) for name, h in fields.items()})
    raise AssertionError(f"no strategy for {hint!r}")


def record_strategy(cls: type[Record]) -> st.SearchStrategy[Record]:
    hints = _codec.field_hints(cls)
    return st.builds(cls, **{name: strategy_for(hint) for name, hint in hints.items()})


RECORDS = st.one_of([record_strategy(cls) for cls in RECORD_TYPES])


@settings(max_examples=300)
@given(RECORDS)
def test_record_round_trip(record: Record) -> None:
    data = encode_record(record)
    assert decode_record(data) == record
    # Canonical encoding: the same record always gives the same bytes.
    assert encode_record(decode_record(data)) == data


@settings(max_examples=200)
@given(
    RECORDS,
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.text(max_size=32),
    st.none() | st.integers(min_value=-1, max_value=2**40),
)
def test_command_round_trip(
    record: Record, term: int, request_id: str, expected: int | None
) -> None:
    command = Command(record, term, request_id, expected)
    assert decode_command(encode_command(command)) == command


def test_wire_map_carries_tag_version_and_named_fields() -> None:
    plain = cbor2.loads(encode_record(FenceBroker(7)))
    assert plain == {"t": FenceBroker.TAG, "v": 0, "node_id": 7}


def test_tags_are_stable() -> None:
    # Tags are on disk forever: this table may only grow.
    assert {tag: cls.__name__ for tag, cls in RECORD_TYPE_BY_TAG.items()} == {
        1: "RegisterBroker",
        2: "FenceBroker",
        3: "UnfenceBroker",
        4: "CreateTopic",
        5: "DeleteTopic",
        6: "CreatePartitions",
        7: "AlterConfigs",
        8: "PartitionChange",
        9: "ProducerIdBlock",
        10: "BecomeController",
        11: "AlterUserScram",
        12: "BootstrapScramUsers",
        13: "CreateAcls",
        14: "DeleteAcls",
        15: "AlterClientQuota",
        16: "PartitionChanges",
    }


@pytest.mark.parametrize(
    ("plain", "message"),
    [
        ({"t": 99, "v": 0}, "unknown metadata record tag 99"),
        ({"v": 0, "node_id": 1}, "unknown metadata record tag None"),
        ({"t": True, "v": 0, "node_id": 1}, "unknown metadata record tag True"),
        ({"t": 2, "v": 1, "node_id": 1}, "version 1 not supported"),
        ({"t": 2, "v": 0}, "missing ['node_id']"),
        ({"t": 2, "v": 0, "node_id": 1, "x": 2}, "unexpected ['x']"),
        ({"t": 2, "v": 0, "node_id": "1"}, "expected int, got str"),
        ({"t": 2, "v": 0, "node_id": True}, "expected int, got bool"),
        (
            {
                "t": 4,
                "v": 0,
                "name": "a",
                "topic_id": b"x",
                "partitions": [[1, "2"]],
                "configs": [],
            },
            "partitions[0][1]: expected int",
        ),
        ([1, 2], "expected a map"),
    ],
)
def test_decode_rejects_malformed_records(plain: object, message: str) -> None:
    with pytest.raises(RecordFormatError, match=message.replace("[", r"\[").replace("]", r"\]")):
        decode_record(cbor2.dumps(plain))


def test_decode_rejects_bad_cbor_and_trailing_bytes() -> None:
    with pytest.raises(RecordFormatError, match="invalid CBOR"):
        decode_record(b"\xff\xff")
    with pytest.raises(RecordFormatError, match="trailing bytes"):
        decode_record(encode_record(FenceBroker(1)) + b"\x00")
    with pytest.raises(RecordFormatError, match="invalid CBOR"):
        decode_record(b"")


def test_decode_command_rejects_bad_envelope() -> None:
    good = cbor2.loads(encode_command(Command(FenceBroker(1), 3, "r")))
    for key, value in [("controller_term", "3"), ("request_id", 5), ("v", 9)]:
        with pytest.raises(RecordFormatError):
            decode_command(cbor2.dumps({**good, key: value}))
    with pytest.raises(RecordFormatError, match="envelope fields"):
        decode_command(cbor2.dumps({**good, "extra": 1}))
    with pytest.raises(RecordFormatError, match="unknown metadata record tag"):
        decode_command(cbor2.dumps({**good, "record": {"t": 77, "v": 0}}))


def test_encode_rejects_values_of_the_wrong_type() -> None:
    with pytest.raises(RecordFormatError, match="wrong type"):
        encode_record(CreateTopic("t", b"\x01" * 16, [[1]], ()))  # type: ignore[arg-type]
    with pytest.raises(RecordFormatError, match="expected int, got bool"):
        encode_record(FenceBroker(True))
    with pytest.raises(RecordFormatError, match="expected"):
        encode_command(Command(FenceBroker(1), 1, "r", expected_version=False))
    with pytest.raises(RecordFormatError, match="not a metadata record"):
        encode_record(Command(FenceBroker(1), 1, "r"))  # type: ignore[arg-type]


def test_records_are_frozen_and_hashable() -> None:
    record = AlterConfigs(2, "t", (("retention.ms", "1"),), ("segment.ms",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.resource_name = "u"  # type: ignore[misc]
    assert hash(record) == hash(decode_record(encode_record(record)))
    assert RegisterBroker(1, "h", 1, None, "i") == RegisterBroker(1, "h", 1, None, "i")
