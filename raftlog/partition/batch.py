"""Record batch v2 (magic 2) header handling.

The broker validates and rewrites batch *headers* only; it never decodes the records on the
append or read path. ``build_batch`` and ``decode_records`` exist for tests and tooling
(console consumer) and handle uncompressed batches only. ``record_timestamps`` serves
ListOffsets by timestamp, which reads the record timestamps of one batch per lookup.

Layout (all big-endian), from Kafka's ``DefaultRecordBatch``::

    0 baseOffset int64 | 8 batchLength int32 | 12 partitionLeaderEpoch int32 | 16 magic int8
    17 crc uint32 | 21 attributes int16 | 23 lastOffsetDelta int32 | 27 baseTimestamp int64
    35 maxTimestamp int64 | 43 producerId int64 | 51 producerEpoch int16
    53 baseSequence int32 | 57 recordsCount int32 | 61 records...

The CRC-32C covers bytes [21, end of batch), so baseOffset and partitionLeaderEpoch can be
rewritten without recomputing it.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import crc32c

from raftlog.partition.errors import (
    CorruptRecordError,
    InvalidRecordError,
    UnsupportedCompressionError,
)

__all__ = [
    "ATTRIBUTES_OFFSET",
    "BATCH_LENGTH_MIN",
    "BATCH_LENGTH_OFFSET",
    "CONTROL_BIT",
    "LOG_OVERHEAD",
    "RECORD_BATCH_OVERHEAD",
    "TRANSACTIONAL_BIT",
    "BatchHeader",
    "Record",
    "RecordHeader",
    "assign_offsets",
    "build_batch",
    "check_batch",
    "check_record_count",
    "check_stored_record_count",
    "decode_records",
    "parse_header",
    "record_timestamps",
    "validate_batches",
]

_HEADER = struct.Struct(">qiibIhiqqqhii")
RECORD_BATCH_OVERHEAD = 61
# baseOffset + batchLength: the bytes not counted by batchLength.
LOG_OVERHEAD = 12
# A batch with zero records still has every header field after batchLength.
BATCH_LENGTH_MIN = RECORD_BATCH_OVERHEAD - LOG_OVERHEAD
assert _HEADER.size == RECORD_BATCH_OVERHEAD

MAGIC_V2 = 2
# Byte offsets of header fields that are read or patched in place (see the layout above).
BATCH_LENGTH_OFFSET = 8
_PARTITION_LEADER_EPOCH_OFFSET = 12
_MAGIC_OFFSET = 16
_CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21  # first byte covered by the CRC
_MAX_TIMESTAMP_OFFSET = 35

_COMPRESSION_CODEC_MASK = 0x07
_TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20

_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT16 = struct.Struct(">h")

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The 61-byte header of one v2 record batch, as stored (after any broker rewrite)."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size_bytes(self) -> int:
        """Bytes the whole batch occupies in the log."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression_codec(self) -> int:
        """0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd."""
        return self.attributes & _COMPRESSION_CODEC_MASK

    @property
    def timestamp_type(self) -> int:
        """0 = CreateTime, 1 = LogAppendTime."""
        return 1 if self.attributes & _TIMESTAMP_TYPE_BIT else 0

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)


def parse_header(buf: Buffer, position: int = 0) -> BatchHeader:
    """Unpack the header at ``position``; the caller guarantees 61 bytes are there."""
    assert len(buf) - position >= RECORD_BATCH_OVERHEAD
    return BatchHeader(*_HEADER.unpack_from(buf, position))


def check_header(header: BatchHeader, available_bytes: int, position: int = 0) -> None:
    """Structural checks that need only the header; ``available_bytes`` counts from the batch
    start. Raises CorruptRecordError."""
    # Magic first: for other magics the bytes after offset 16 mean something else.
    if header.magic != MAGIC_V2:
        raise CorruptRecordError(f"batch at byte {position}: magic {header.magic}, expected 2")
    if header.batch_length < BATCH_LENGTH_MIN:
        raise CorruptRecordError(
            f"batch at byte {position}: batchLength {header.batch_length} < {BATCH_LENGTH_MIN}"
        )
    if header.size_bytes > available_bytes:
        raise CorruptRecordError(
            f"batch at byte {position}: needs {header.size_bytes} bytes, "
            f"only {available_bytes} present"
        )


def check_batch(buf: Buffer, position: int = 0) -> BatchHeader:
    """Check the batch starting at ``position`` (header fields + CRC) and return its header.

    Raises CorruptRecordError for truncation, bad length, bad magic or a CRC mismatch.
    """
    available_bytes = len(buf) - position
    if available_bytes < RECORD_BATCH_OVERHEAD:
        raise CorruptRecordError(
            f"batch at byte {position}: {available_bytes} bytes, "
            f"header needs {RECORD_BATCH_OVERHEAD}"
        )
    if buf[position + _MAGIC_OFFSET] != MAGIC_V2:
        raise CorruptRecordError(
            f"batch at byte {position}: magic {buf[position + _MAGIC_OFFSET]}, expected 2"
        )
    header = parse_header(buf, position)
    check_header(header, available_bytes, position)
    end = position + header.size_bytes
    with memoryview(buf) as view:
        crc = crc32c.crc32c(view[position + ATTRIBUTES_OFFSET : end])
    if crc != header.crc:
        raise CorruptRecordError(
            f"batch at byte {position}: CRC-32C {crc:#010x} != stored {header.crc:#010x}"
        )
    return header


def check_record_count(header: BatchHeader, *, allow_control: bool) -> None:
    """The checks Kafka's LogValidator applies to client batches. Raises InvalidRecordError."""
    if header.records_count <= 0 or header.last_offset_delta + 1 != header.records_count:
        raise InvalidRecordError(
            f"batch at offset {header.base_offset}: recordsCount {header.records_count}, "
            f"lastOffsetDelta {header.last_offset_delta}"
        )
    if header.is_control and not allow_control:
        raise InvalidRecordError("clients may not produce control batches")


def check_stored_record_count(header: BatchHeader) -> None:
    """The looser check for batches already in a log (a follower's copy, recovery): log
    compaction keeps a batch's ``lastOffsetDelta`` but may remove any of its records, down
    to none (an empty batch kept for its producer state or to mark the segment's end), so
    ``0 <= recordsCount <= lastOffsetDelta + 1``. Raises InvalidRecordError."""
    if header.last_offset_delta < 0 or not 0 <= header.records_count <= \
            header.last_offset_delta + 1:
        raise InvalidRecordError(
            f"batch at offset {header.base_offset}: recordsCount {header.records_count}, "
            f"lastOffsetDelta {header.last_offset_delta}"
        )


def validate_batches(
    records: Buffer, *, allow_control: bool = False, stored: bool = False
) -> list[BatchHeader]:
    """Validate a buffer of v2 batches that must exactly cover it; return their headers.
    ``stored``: the batches come from another replica's log, so compacted batches (fewer
    records than their offset span) are accepted (``check_stored_record_count``)."""
    if len(records) == 0:
        raise InvalidRecordError("no record batches")
    headers: list[BatchHeader] = []
    position = 0
    while position < len(records):
        header = check_batch(records, position)
        if stored:
            check_stored_record_count(header)
        else:
            check_record_count(header, allow_control=allow_control)
        headers.append(header)
        position += header.size_bytes
    assert position == len(records)
    return headers


def assign_offsets(
    buf: bytearray,
    headers: Sequence[BatchHeader],
    base_offset: int,
    leader_epoch: int,
    log_append_time_ms: int | None,
) -> int:
    """Rewrite baseOffset and partitionLeaderEpoch of every batch in place; return the next
    offset. With ``log_append_time_ms`` (LogAppendTime topics) also set the timestamp-type
    attribute and maxTimestamp, which are CRC-covered, so the CRC is recomputed."""
    assert base_offset >= 0
    position = 0
    next_offset = base_offset
    for header in headers:
        _INT64.pack_into(buf, position, next_offset)
        _INT32.pack_into(buf, position + _PARTITION_LEADER_EPOCH_OFFSET, leader_epoch)
        if log_append_time_ms is not None:
            _set_log_append_time(buf, position, header, log_append_time_ms)
        next_offset += header.last_offset_delta + 1
        position += header.size_bytes
    assert position == len(buf), "headers must describe the whole buffer"
    return next_offset


def _set_log_append_time(
    buf: bytearray, position: int, header: BatchHeader, log_append_time_ms: int
) -> None:
    _INT16.pack_into(buf, position + ATTRIBUTES_OFFSET, header.attributes | _TIMESTAMP_TYPE_BIT)
    _INT64.pack_into(buf, position + _MAX_TIMESTAMP_OFFSET, log_append_time_ms)
    with memoryview(buf) as view:
        crc = crc32c.crc32c(view[position + ATTRIBUTES_OFFSET : position + header.size_bytes])
    _UINT32.pack_into(buf, position + _CRC_OFFSET, crc)


# --- Records: only for tests and tooling (uncompressed batches only) -----------------------

RecordHeader = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded record with its absolute offset and timestamp."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[RecordHeader, ...] = ()


def _zigzag_varint(value: int) -> bytes:
    """Kafka varint/varlong: zig-zag then base-128, least significant group first."""
    assert -(1 << 63) <= value < (1 << 63)
    encoded = (value << 1) ^ (value >> 63)
    out = bytearray()
    while encoded >= 0x80:
        out.append((encoded & 0x7F) | 0x80)
        encoded >>= 7
    out.append(encoded)
    return bytes(out)


def _sized_bytes(data: bytes | None) -> bytes:
    if data is None:
        return _zigzag_varint(-1)
    return _zigzag_varint(len(data)) + data


def _encode_record(
    offset_delta: int, key: bytes | None, value: bytes | None, headers: Sequence[RecordHeader]
) -> bytes:
    body = bytearray(b"\x00")  # record attributes: unused
    body += _zigzag_varint(0)  # timestampDelta: every record carries the batch timestamp
    body += _zigzag_varint(offset_delta)
    body += _sized_bytes(key)
    body += _sized_bytes(value)
    body += _zigzag_varint(len(headers))
    for header_key, header_value in headers:
        body += _sized_bytes(header_key.encode())
        body += _sized_bytes(header_value)
    return _zigzag_varint(len(body)) + bytes(body)


def build_batch(
    records: Sequence[tuple[bytes | None, bytes | None, Sequence[RecordHeader]]],
    base_offset: int = 0,
    timestamp_ms: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
) -> bytes:
    """Build a valid uncompressed v2 batch (as a producer would send it, epoch -1)."""
    assert attributes & _COMPRESSION_CODEC_MASK == 0, "build_batch writes uncompressed records"
    payload = b"".join(
        _encode_record(delta, key, value, headers)
        for delta, (key, value, headers) in enumerate(records)
    )
    header = BatchHeader(
        base_offset=base_offset,
        batch_length=BATCH_LENGTH_MIN + len(payload),
        partition_leader_epoch=-1,
        magic=MAGIC_V2,
        crc=0,
        attributes=attributes,
        last_offset_delta=len(records) - 1,
        base_timestamp=timestamp_ms,
        max_timestamp=timestamp_ms,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        records_count=len(records),
    )
    buf = bytearray(_HEADER.pack(*_header_fields(header)) + payload)
    with memoryview(buf) as view:
        crc = crc32c.crc32c(view[ATTRIBUTES_OFFSET:])
    _UINT32.pack_into(buf, _CRC_OFFSET, crc)
    return bytes(buf)


def _header_fields(header: BatchHeader) -> tuple[int, ...]:
    return (
        header.base_offset,
        header.batch_length,
        header.partition_leader_epoch,
        header.magic,
        header.crc,
        header.attributes,
        header.last_offset_delta,
        header.base_timestamp,
        header.max_timestamp,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        header.records_count,
    )


class _Reader:
    """Bounds-checked cursor over one batch's record bytes."""

    def __init__(self, data: Buffer) -> None:
        self.data = data
        self.position = 0

    def varint(self) -> int:
        encoded = 0
        for shift in range(0, 70, 7):
            if self.position >= len(self.data):
                raise CorruptRecordError("record truncated inside a varint")
            byte = self.data[self.position]
            self.position += 1
            encoded |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (encoded >> 1) ^ -(encoded & 1)
        raise CorruptRecordError("varint longer than 10 bytes")

    def take(self, size: int) -> bytes:
        if size < 0 or self.position + size > len(self.data):
            raise CorruptRecordError(f"record field of {size} bytes overruns the batch")
        chunk = bytes(self.data[self.position : self.position + size])
        self.position += size
        return chunk

    def sized_bytes(self) -> bytes | None:
        size = self.varint()
        return None if size == -1 else self.take(size)


def _decode_record(reader: _Reader, header: BatchHeader) -> Record:
    length = reader.varint()
    end = reader.position + length
    reader.take(1)  # record attributes: unused
    timestamp_delta = reader.varint()
    offset_delta = reader.varint()
    key = reader.sized_bytes()
    value = reader.sized_bytes()
    record_headers: list[RecordHeader] = []
    for _ in range(reader.varint()):
        header_key = reader.sized_bytes()
        if header_key is None:
            raise CorruptRecordError("record header with a null key")
        record_headers.append((header_key.decode(), reader.sized_bytes()))
    if reader.position != end:
        raise CorruptRecordError(f"record length {length} does not match its fields")
    # LogAppendTime: every record's timestamp is the batch's maxTimestamp (broker-set).
    if header.timestamp_type:
        timestamp_ms = header.max_timestamp
    else:
        timestamp_ms = header.base_timestamp + timestamp_delta
    return Record(
        header.base_offset + offset_delta, timestamp_ms, key, value, tuple(record_headers)
    )


def _decode_batch(buf: Buffer, position: int, header: BatchHeader) -> list[Record]:
    if header.compression_codec != 0:
        raise UnsupportedCompressionError(
            f"batch at offset {header.base_offset} uses codec {header.compression_codec}"
        )
    reader = _Reader(bytes(buf[position + RECORD_BATCH_OVERHEAD : position + header.size_bytes]))
    records = [_decode_record(reader, header) for _ in range(header.records_count)]
    if reader.position != len(reader.data):
        raise CorruptRecordError("bytes left over after the last record")
    return records


def record_timestamps(header: BatchHeader, records: Buffer) -> list[tuple[int, int]]:
    """(offset, timestamp_ms) of each record of one batch, for ListOffsets by timestamp.

    ``records`` is the batch's records section, already decompressed. Only the length,
    timestampDelta and offsetDelta of each record are read; keys, values and headers are
    skipped. A record's timestamp is firstTimestamp + timestampDelta, except in a
    LogAppendTime batch, where every record carries the batch's maxTimestamp (the time the
    broker appended it; the deltas still hold what the producer sent).

    Produce never decodes records (the hot path stays header-only), so the offsetDeltas are
    what the producer sent: they are checked here, against the header, so that no answer
    lies outside the batch. Raises CorruptRecordError when the records do not fill the
    section exactly, number other than the header's recordsCount, or have offsetDeltas
    that do not strictly increase within [0, lastOffsetDelta].
    """
    if not 0 <= header.records_count <= header.last_offset_delta + 1:
        raise CorruptRecordError(f"recordsCount {header.records_count} does not fit "
                                 f"lastOffsetDelta {header.last_offset_delta}")
    reader = _Reader(records)
    out: list[tuple[int, int]] = []
    previous_delta = -1
    for _ in range(header.records_count):
        length = reader.varint()
        end = reader.position + length
        if length < 1 or end > len(reader.data):
            raise CorruptRecordError(f"record length {length} overruns the batch")
        reader.position += 1  # record attributes: unused
        timestamp_delta = reader.varint()
        offset_delta = reader.varint()
        if reader.position > end:
            raise CorruptRecordError(f"record length {length} does not match its fields")
        if not previous_delta < offset_delta <= header.last_offset_delta:
            raise CorruptRecordError(
                f"record offsetDelta {offset_delta} after {previous_delta}: outside "
                f"(previous, lastOffsetDelta {header.last_offset_delta}]")
        previous_delta = offset_delta
        reader.position = end
        timestamp_ms = header.max_timestamp if header.timestamp_type \
            else header.base_timestamp + timestamp_delta
        out.append((header.base_offset + offset_delta, timestamp_ms))
    if reader.position != len(reader.data):
        raise CorruptRecordError("bytes left over after the last record")
    return out


def decode_records(batch_bytes: Buffer, *, include_control: bool = False) -> list[Record]:
    """Decode every record of the (uncompressed) batches in ``batch_bytes``.

    Control batches (transaction markers) are skipped unless ``include_control``, as Kafka
    consumers do.
    """
    records: list[Record] = []
    position = 0
    while position < len(batch_bytes):
        header = check_batch(batch_bytes, position)
        if include_control or not header.is_control:
            records.extend(_decode_batch(batch_bytes, position, header))
        position += header.size_bytes
    return records
