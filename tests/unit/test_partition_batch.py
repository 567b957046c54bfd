"""Record batch v2 header validation, rewrite, and the test/tooling encoder and decoder.

Reference: kafka-compatibility.md §3 (DefaultRecordBatch, LogValidator).
"""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlog.partition.batch import (
    RECORD_BATCH_OVERHEAD,
    Record,
    assign_offsets,
    build_batch,
    decode_records,
    parse_header,
    validate_batches,
)
from raftlog.partition.errors import (
    CorruptRecordError,
    InvalidRecordError,
    UnsupportedCompressionError,
)


def _batch(count: int = 3, timestamp_ms: int = 1_000, **kwargs: int) -> bytes:
    records = [(b"key%d" % i, b"value%d" % i, [("h", b"v")]) for i in range(count)]
    return build_batch(records, timestamp_ms=timestamp_ms, **kwargs)


def _recrc(buf: bytearray, position: int = 0) -> None:
    """Fix the CRC after a deliberate edit of CRC-covered bytes."""
    end = position + parse_header(buf, position).size_bytes
    struct.pack_into(">I", buf, position + 17, crc32c.crc32c(bytes(buf[position + 21 : end])))


def test_header_fields_and_properties() -> None:
    header = parse_header(_batch(3, producer_id=7, producer_epoch=2, base_sequence=5))
    assert header.magic == 2
    assert header.records_count == 3 and header.last_offset_delta == 2
    assert header.size_bytes == len(_batch(3)) == header.batch_length + 12
    assert header.last_offset == 2 and header.next_offset == 3
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, 5)
    assert header.base_timestamp == header.max_timestamp == 1_000
    assert header.compression_codec == 0 and header.timestamp_type == 0
    assert not header.is_transactional and not header.is_control


def test_attribute_bits() -> None:
    header = parse_header(_batch(1, attributes=0x10 | 0x20 | 0x08))
    assert header.is_transactional and header.is_control and header.timestamp_type == 1


def test_build_and_decode_round_trip() -> None:
    data = build_batch(
        [(None, b"v0", []), (b"k1", None, [("a", b"1"), ("b", None)]), (b"", b"", [])],
        base_offset=40,
        timestamp_ms=123,
    )
    assert decode_records(data) == [
        Record(40, 123, None, b"v0", ()),
        Record(41, 123, b"k1", None, (("a", b"1"), ("b", None))),
        Record(42, 123, b"", b"", ()),
    ]


def test_validate_accepts_several_batches() -> None:
    data = _batch(2) + _batch(5) + _batch(1)
    headers = validate_batches(data)
    assert [h.records_count for h in headers] == [2, 5, 1]
    assert validate_batches(memoryview(data)) == headers


def test_empty_input_is_invalid() -> None:
    with pytest.raises(InvalidRecordError) as info:
        validate_batches(b"")
    assert info.value.error_code == 87


def test_corrupt_crc() -> None:
    buf = bytearray(_batch())
    buf[-1] ^= 0x01
    with pytest.raises(CorruptRecordError, match="CRC") as info:
        validate_batches(buf)
    assert info.value.error_code == 2


def test_bad_magic_is_checked_before_anything_else() -> None:
    buf = bytearray(_batch())
    buf[16] = 1
    struct.pack_into(">i", buf, 8, 5)  # a bad length too: magic must win
    with pytest.raises(CorruptRecordError, match="magic"):
        validate_batches(buf)


@pytest.mark.parametrize("keep_bytes", [1, 60, 61, 80])
def test_truncated_batch(keep_bytes: int) -> None:
    with pytest.raises(CorruptRecordError):
        validate_batches(_batch()[:keep_bytes])


def test_trailing_garbage_is_corrupt() -> None:
    with pytest.raises(CorruptRecordError):
        validate_batches(_batch() + b"\x00" * 10)


@pytest.mark.parametrize("batch_length", [0, 48, 10_000])
def test_length_mismatch(batch_length: int) -> None:
    buf = bytearray(_batch())
    struct.pack_into(">i", buf, 8, batch_length)
    with pytest.raises(CorruptRecordError, match=r"batchLength|needs"):
        validate_batches(buf)


def test_length_shorter_than_records_breaks_the_next_batch() -> None:
    buf = bytearray(_batch())
    struct.pack_into(">i", buf, 8, parse_header(buf).batch_length - 3)
    with pytest.raises(CorruptRecordError):
        validate_batches(buf)


@pytest.mark.parametrize(("last_offset_delta", "records_count"), [(1, 3), (2, 2), (-1, 0)])
def test_count_mismatch(last_offset_delta: int, records_count: int) -> None:
    buf = bytearray(_batch(3))
    struct.pack_into(">i", buf, 23, last_offset_delta)
    struct.pack_into(">i", buf, 57, records_count)
    _recrc(buf)
    with pytest.raises(InvalidRecordError, match="recordsCount") as info:
        validate_batches(buf)
    assert info.value.error_code == 87


def test_control_batch_needs_allow_control() -> None:
    data = _batch(1, attributes=0x30)
    with pytest.raises(InvalidRecordError, match="control"):
        validate_batches(data)
    assert validate_batches(data, allow_control=True)[0].is_control


def test_assign_offsets_rewrites_uncovered_fields_only() -> None:
    original = _batch(2) + _batch(3)
    buf = bytearray(original)
    headers = validate_batches(buf)
    assert assign_offsets(buf, headers, 100, 7, None) == 105
    rewritten = validate_batches(buf)  # CRCs still valid
    assert [h.base_offset for h in rewritten] == [100, 102]
    assert {h.partition_leader_epoch for h in rewritten} == {7}
    assert [h.crc for h in rewritten] == [h.crc for h in headers]
    start = 0
    for header in headers:  # only bytes 0..8 and 12..16 of each batch changed
        end = start + header.size_bytes
        assert buf[start + 8 : start + 12] == original[start + 8 : start + 12]
        assert buf[start + 16 : end] == original[start + 16 : end]
        start = end
    assert [r.offset for r in decode_records(buf)] == [100, 101, 102, 103, 104]


def test_assign_offsets_log_append_time_recomputes_crc() -> None:
    buf = bytearray(_batch(2, timestamp_ms=5) + _batch(1, timestamp_ms=6))
    headers = validate_batches(buf)
    assign_offsets(buf, headers, 0, 1, 99_000)
    rewritten = validate_batches(buf)
    assert all(h.timestamp_type == 1 and h.max_timestamp == 99_000 for h in rewritten)
    assert [h.base_timestamp for h in rewritten] == [5, 6]
    assert [r.timestamp_ms for r in decode_records(buf)] == [99_000] * 3


def test_decode_skips_control_batches_unless_asked() -> None:
    data = _batch(2) + _batch(1, attributes=0x30, base_offset=2)
    assert len(decode_records(data)) == 2
    assert len(decode_records(data, include_control=True)) == 3


def test_decode_refuses_compressed_batches() -> None:
    buf = bytearray(_batch(1))
    struct.pack_into(">h", buf, 21, 1)  # gzip
    _recrc(buf)
    with pytest.raises(UnsupportedCompressionError):
        decode_records(buf)


def test_decode_rejects_record_overrun() -> None:
    buf = bytearray(_batch(1))
    buf[RECORD_BATCH_OVERHEAD] = 0x7E  # record length varint: 63, far past the batch end
    _recrc(buf)
    with pytest.raises(CorruptRecordError):
        decode_records(buf)


_header_items = st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5))
_records = st.lists(
    st.tuples(
        st.none() | st.binary(max_size=20),
        st.none() | st.binary(max_size=300),
        st.lists(_header_items, max_size=3),
    ),
    min_size=1,
    max_size=20,
)


@given(
    records=_records,
    base_offset=st.integers(0, 2**62),
    timestamp_ms=st.integers(-1, 2**50),
)
def test_round_trip_property(
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
    base_offset: int,
    timestamp_ms: int,
) -> None:
    data = build_batch(records, base_offset=base_offset, timestamp_ms=timestamp_ms)
    (header,) = validate_batches(data)
    assert header.records_count == len(records)
    decoded = decode_records(data)
    assert [(r.key, r.value, list(r.headers)) for r in decoded] == [
        (k, v, list(h)) for k, v, h in records
    ]
    assert [r.offset for r in decoded] == list(range(base_offset, base_offset + len(records)))
    assert {r.timestamp_ms for r in decoded} == {timestamp_ms}
