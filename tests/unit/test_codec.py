"""Round-trip and edge-case tests for the sans-I/O codec."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.protocol import codec
from raftlog.protocol.codec import Api, DecodeError, Field, Struct
from raftlog.protocol.schemas import ALL_APIS, API_VERSIONS, FETCH, METADATA, PRODUCE

_INT_BOUNDS = {
    "int8": 7,
    "int16": 15,
    "int32": 31,
    "int64": 63,
}


def _value_strategy(f: Field, version: int) -> st.SearchStrategy[Any]:
    nullable = f.is_nullable(version)
    base: st.SearchStrategy[Any]
    if isinstance(f.type, list):
        base = st.lists(_struct_strategy(f.type, version), max_size=3).map(tuple)
    elif isinstance(f.type, tuple):
        base = _struct_strategy(f.type, version)
    elif f.type.startswith("[]"):
        item = Field("item", f.type[2:])
        base = st.lists(_value_strategy(item, version), max_size=3).map(tuple)
    else:
        base = _primitive_strategy(f.type)
    return st.one_of(st.none(), base) if nullable else base


def _primitive_strategy(type_name: str) -> st.SearchStrategy[Any]:
    if type_name in _INT_BOUNDS:
        bits = _INT_BOUNDS[type_name]
        return st.integers(-(2**bits), 2**bits - 1)
    if type_name == "uint16":
        return st.integers(0, 2**16 - 1)
    if type_name == "bool":
        return st.booleans()
    if type_name == "string":
        return st.text(max_size=20)
    if type_name in ("bytes", "records"):
        return st.binary(max_size=40)
    if type_name == "uuid":
        return st.uuids()
    raise AssertionError(type_name)


def _struct_strategy(
    fields: list[Field] | tuple[Field, ...], version: int
) -> st.SearchStrategy[Any]:
    present = [f for f in fields if version in f.version_range]
    return st.fixed_dictionaries({f.name: _value_strategy(f, version) for f in present})


def _normalise(value: Any) -> Any:
    """Decoded bytes come back as memoryviews and structs as Struct; compare as plain data."""
    if isinstance(value, Struct):
        return {k: _normalise(v) for k, v in value.to_dict().items()}
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normalise(v) for v in value]
    if isinstance(value, memoryview):
        return bytes(value)
    return value


@st.composite
def _api_message(draw: st.DrawFn) -> tuple[Api, int, bool, dict[str, Any]]:
    api = draw(st.sampled_from(ALL_APIS))
    version = draw(st.integers(api.min_version, api.max_version))
    is_request = draw(st.booleans())
    fields = api.request if is_request else api.response
    value = draw(_struct_strategy(fields, version))
    return api, version, is_request, value


@settings(max_examples=400, deadline=None)
@given(_api_message())
def test_every_api_round_trips(message: tuple[Api, int, bool, dict[str, Any]]) -> None:
    api, version, is_request, value = message
    raw = codec.encode_bytes(api, version, value, is_request=is_request)
    decoded = codec.decode(api, version, raw, is_request=is_request)
    assert _project(_normalise(decoded), value) == _normalise(value)


def _project(decoded: Any, value: Any) -> Any:
    """Keeps only what the input had: decoding adds other versions' fields at defaults."""
    if isinstance(value, dict):
        return {k: _project(decoded[k], v) for k, v in value.items()}
    if isinstance(value, list | tuple) and isinstance(decoded, list):
        return [_project(d, v) for d, v in zip(decoded, value, strict=True)]
    return decoded


def test_decoded_structs_carry_fields_of_other_versions_at_defaults() -> None:
    raw = codec.encode_bytes(
        FETCH,
        4,
        {
            "replica_id": -1,
            "max_wait_ms": 1,
            "min_bytes": 1,
            "topics": [
                {
                    "topic": "t",
                    "partitions": [{"partition": 0, "fetch_offset": 5, "partition_max_bytes": 10}],
                }
            ],
        },
        is_request=True,
    )
    decoded = codec.decode(FETCH, 4, raw, is_request=True)
    assert decoded.session_epoch == -1
    assert decoded.rack_id == ""
    assert decoded.topics[0].partitions[0].current_leader_epoch == -1


def test_missing_fields_take_defaults() -> None:
    raw = codec.encode_bytes(METADATA, 8, {"brokers": [], "topics": []})
    decoded = codec.decode(METADATA, 8, raw, is_request=False)
    assert decoded.controller_id == -1
    assert decoded.cluster_id is None
    assert decoded.cluster_authorized_operations == -(2**31)


def test_flexible_compact_encoding_and_tagged_fields() -> None:
    body = {
        "error_code": 0,
        "api_keys": [{"api_key": 18, "min_version": 0, "max_version": 3}],
        "throttle_time_ms": 0,
        "finalized_features_epoch": 7,
    }
    raw = codec.encode_bytes(API_VERSIONS, 3, body)
    # int16 error, compact array of 1 (uvarint 2), 3 x int16, int32 throttle, tag buffer.
    assert raw[:3] == b"\x00\x00\x02"
    decoded = codec.decode(API_VERSIONS, 3, raw, is_request=False)
    assert decoded.finalized_features_epoch == 7
    assert decoded.zk_migration_ready is False


def test_unknown_tagged_fields_are_skipped() -> None:
    raw = codec.encode_bytes(
        API_VERSIONS,
        3,
        {"client_software_name": "x", "client_software_version": "1"},
        is_request=True,
    )
    # Replace the empty tag buffer with one unknown tag (tag 9, 2 bytes).
    assert raw.endswith(b"\x00")
    patched = raw[:-1] + b"\x01\x09\x02ab"
    decoded = codec.decode(API_VERSIONS, 3, patched, is_request=True)
    assert decoded.client_software_name == "x"


@pytest.mark.parametrize("garbage", [b"", b"\x00", b"\xff" * 3, b"\x00\x00\x00\x05ab"])
def test_truncated_or_garbage_input_raises_decode_error(garbage: bytes) -> None:
    with pytest.raises(DecodeError):
        codec.decode(PRODUCE, 3, garbage, is_request=True)


def test_huge_array_count_is_rejected_before_allocating() -> None:
    raw = b"\xff\xff" + b"\x00\x01" + b"\x00\x00\x00\x00" + b"\x7f\xff\xff\xff"
    with pytest.raises(DecodeError):
        codec.decode(PRODUCE, 3, raw, is_request=True)


def test_trailing_bytes_are_an_error() -> None:
    raw = codec.encode_bytes(METADATA, 1, {"topics": None}, is_request=True) + b"\x00"
    with pytest.raises(DecodeError):
        codec.decode(METADATA, 1, raw, is_request=True)


class _FakeRegion:
    size_bytes = 5


def test_records_regions_are_separate_chunks() -> None:
    body = {
        "throttle_time_ms": 0,
        "error_code": 0,
        "session_id": 0,
        "responses": [
            {
                "topic": "t",
                "partitions": [
                    {
                        "partition_index": 0,
                        "error_code": 0,
                        "high_watermark": 5,
                        "last_stable_offset": 5,
                        "log_start_offset": 0,
                        "aborted_transactions": None,
                        "preferred_read_replica": -1,
                        "records": [_FakeRegion()],
                    }
                ],
            }
        ],
    }
    chunks = codec.encode(FETCH, 11, body)
    assert len(chunks) == 2
    assert isinstance(chunks[1], _FakeRegion)
    assert bytes(chunks[0])[-4:] == b"\x00\x00\x00\x05"  # the records length prefix


def test_request_header_round_trip() -> None:
    header = codec.RequestHeader(3, 8, 42, "client-1")
    for flexible in (False, True):
        raw = codec.encode_request_header(header, flexible)
        decoded, pos = codec.decode_request_header(memoryview(raw), flexible)
        assert decoded == header
        assert pos == len(raw)


def test_uuid_fields() -> None:
    value = uuid.uuid4()
    api = Api(99, "X", 0, 0, "none", [Field("id", "uuid")], [])
    raw = codec.encode_bytes(api, 0, {"id": value}, is_request=True)
    assert codec.decode(api, 0, raw).id == value


def test_decoded_struct_fields_are_plain_attributes_and_immutable() -> None:
    # The values are the instance dict: field access is ordinary attribute lookup, with no
    # __getattr__ fallback (0.76 us an access on the hot path, against 0.03 us).
    assert "__getattr__" not in vars(Struct)
    values = {"acks": -1, "topic_data": ()}
    body = Struct(values)
    assert body.acks == -1 and body["acks"] == -1 and body.get("missing", 7) == 7
    assert vars(body) is values
    with pytest.raises(AttributeError):
        _ = body.missing
    with pytest.raises(AttributeError, match="immutable"):
        body.acks = 1  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        del body.acks
    assert body == Struct({"acks": -1, "topic_data": ()}) and body.to_dict()["acks"] == -1


@pytest.mark.parametrize("name", ["get", "replace", "to_dict", "_values"])
def test_a_field_may_not_shadow_a_struct_method(name: str) -> None:
    with pytest.raises(ValueError, match="shadow"):
        Field(name, "int32")
