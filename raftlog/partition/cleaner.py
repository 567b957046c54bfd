"""Log compaction (``cleanup.policy=compact`` / ``compact,delete``) as pure functions over
record-batch bytes.

:func:`compact` takes the bytes of the batches to clean (whole batches, in offset order) and
returns the cleaned bytes:

* the latest record per key survives (``offset_map``: key → last offset, built over the
  cleanable range *and* anything newer, see :func:`build_offset_map`); a reader can therefore
  never see a key's older value after its newer one, because older values are only removed;
* tombstones (null value) are removed once their batch is older than ``delete.retention.ms``;
* records without a key are kept (a compacted topic refuses them at produce time);
* offsets never change: a rewritten batch keeps its base offset, ``lastOffsetDelta``, leader
  epoch, timestamps, producer id, epoch and base sequence, and every record keeps its offset
  and timestamp delta; records are written uncompressed;
* a batch left with no records disappears, except the last batch of each producer id, which
  stays as an empty batch so the producer's state (epoch, last sequence) survives, as Kafka
  does; control batches (transaction markers) are kept as they are.

Not done yet: wiring into the segment files (swapping cleaned segments in and letting
recovery accept offset gaps) and the retention loop.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import crc32c

from raftlog.compression import decompress_batches
from raftlog.partition.batch import (
    _HEADER,
    BATCH_LENGTH_MIN,
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    Record,
    _header_fields,
    _sized_bytes,
    _zigzag_varint,
    check_batch,
    decode_records,
)

_UINT32 = struct.Struct(">I")
_CRC_OFFSET = 17
_ATTRIBUTES_OFFSET = 21
_CODEC_MASK = 0x07


def iter_batches(data: bytes) -> Iterable[tuple[BatchHeader, bytes]]:
    position = 0
    while position < len(data):
        header = check_batch(data, position)
        yield header, data[position:position + header.size_bytes]
        position += header.size_bytes


def _records(header: BatchHeader, batch: bytes) -> list[Record]:
    if header.compression_codec:
        batch = decompress_batches(batch)
    return decode_records(batch)


def build_offset_map(data: bytes, offset_map: dict[bytes, int] | None = None
                     ) -> dict[bytes, int]:
    """key → offset of its latest record, over the (non-control) batches in ``data``."""
    out = {} if offset_map is None else offset_map
    for header, batch in iter_batches(data):
        if header.is_control:
            continue
        for record in _records(header, batch):
            if record.key is not None:
                out[record.key] = max(record.offset, out.get(record.key, -1))
    return out


def compact(data: bytes, offset_map: dict[bytes, int], *, now_ms: int,
            delete_retention_ms: int) -> bytes:
    """The cleaned bytes of ``data`` (see the module docstring)."""
    batches = list(iter_batches(data))
    last_of_producer: dict[int, int] = {}
    for i, (header, _) in enumerate(batches):
        if header.producer_id >= 0:
            last_of_producer[header.producer_id] = i
    out = bytearray()
    for i, (header, batch) in enumerate(batches):
        if header.is_control:
            out += batch
            continue
        records = _records(header, batch)
        kept = [r for r in records if _survives(r, header, offset_map, now_ms,
                                                delete_retention_ms)]
        if len(kept) == len(records) and not header.compression_codec:
            out += batch
        elif kept or last_of_producer.get(header.producer_id) == i:
            out += rebuild_batch(header, kept)
    return bytes(out)


def _survives(record: Record, header: BatchHeader, offset_map: dict[bytes, int], now_ms: int,
              delete_retention_ms: int) -> bool:
    if record.key is None:
        return True
    if offset_map.get(record.key, -1) > record.offset:
        return False  # a newer value of this key exists
    if record.value is None:  # the latest record is a tombstone
        return header.max_timestamp + delete_retention_ms > now_ms
    return True


def rebuild_batch(header: BatchHeader, records: list[Record]) -> bytes:
    """A batch with ``header``'s identity (offsets, epoch, producer, timestamps) holding
    ``records`` uncompressed."""
    payload = bytearray()
    for record in records:
        body = bytearray(b"\x00")
        timestamp_delta = 0 if header.timestamp_type else record.timestamp_ms - \
            header.base_timestamp
        body += _zigzag_varint(timestamp_delta)
        body += _zigzag_varint(record.offset - header.base_offset)
        body += _sized_bytes(record.key)
        body += _sized_bytes(record.value)
        body += _zigzag_varint(len(record.headers))
        for key, value in record.headers:
            body += _sized_bytes(key.encode())
            body += _sized_bytes(value)
        payload += _zigzag_varint(len(body)) + body
    fields = list(_header_fields(header))
    fields[1] = BATCH_LENGTH_MIN + len(payload)  # batchLength
    fields[4] = 0  # crc, below
    fields[5] = header.attributes & ~_CODEC_MASK
    fields[12] = len(records)  # recordsCount; lastOffsetDelta (fields[6]) is kept
    buf = bytearray(_HEADER.pack(*fields) + payload)
    assert len(buf) >= RECORD_BATCH_OVERHEAD
    _UINT32.pack_into(buf, _CRC_OFFSET, crc32c.crc32c(bytes(buf[_ATTRIBUTES_OFFSET:])))
    return bytes(buf)


def is_compacted(cleanup_policy: str) -> bool:
    """Whether a ``cleanup.policy`` value ("delete", "compact", "compact,delete") compacts."""
    return "compact" in {p.strip() for p in cleanup_policy.split(",")}


def has_record_without_key(records: bytes | memoryview) -> bool:
    """Whether any record in these (validated) batches has a null key; compressed batches are
    decompressed (the caller only asks for compacted topics)."""
    data = bytes(records)
    for header, batch in iter_batches(data):
        if header.is_control:
            continue
        if any(r.key is None for r in _records(header, batch)):
            return True
    return False
