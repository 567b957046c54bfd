"""Log compaction (``cleanup.policy=compact`` / ``compact,delete``), Kafka's log cleaner.

Plain blocking code: the pure decisions (which segments to clean, which records survive) and
the file work of one pass, run in a worker thread by ``cleaner_service``. The swap of a
cleaned segment into the log is ``PartitionLog.replace_segments``.

One pass over a partition, as in Kafka:

* The log is split at the *first dirty offset* (checkpointed in ``cleaner-offset-checkpoint``
  after each pass): below it the segments were cleaned before, above it they are dirty.
  Only whole sealed segments below the *first uncleanable offset* take part: min(active
  segment's base, last stable offset (itself <= the high watermark), the first segment
  younger than ``min.compaction.lag.ms``). Nothing uncommitted, undecided or unreplicated
  is ever cleaned. A pass runs when dirty bytes / cleanable bytes >=
  ``min.cleanable.dirty.ratio``.
* An offset map (key -> offset of its latest record) is built over the dirty segments, up to
  ``log.cleaner.dedupe.buffer.size`` (estimated bytes; at least one segment per pass, the
  rest waits for the next pass). Records of aborted transactions never enter it.
* Every cleanable segment up to the end of the map is rewritten, in groups of consecutive
  segments whose sizes add up to at most ``segment.bytes`` (small segments merge), as one
  new segment with the first one's base offset. A record survives unless the map holds a
  newer offset for its key, or it is a tombstone (null value) whose batch is older than
  ``delete.retention.ms``, or it belongs to an aborted transaction. Records without a key
  (a compacted topic refuses them at produce time) survive.

What a rewritten batch keeps: base offset, ``lastOffsetDelta``, leader epoch, base and max
timestamps, attributes, producer id, epoch and base sequence; surviving records are copied
byte for byte (their offset and timestamp deltas are relative to the unchanged header), so
offsets never change; a new CRC-32C is computed. A compressed batch is decompressed, and the
survivors are compressed again with the same codec (uncompressed if that codec's library is
missing). A batch left with no records is dropped, except (kept as an empty batch header,
as Kafka does) the last batch of each producer id in the new segment, so the producer's
epoch and last sequence survive a restart that rebuilds producer state, and the last batch
of the new segment, so every sealed segment still ends exactly where the next one begins.
Control batches (transaction markers) are kept as they are. Because only older values (and
expired tombstones, and aborted records) are removed, a reader never sees a key's older
value after its newer one.
"""

from __future__ import annotations

import gzip
import logging
import os
import struct
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import crc32c

from raftlog.partition.batch import (
    _HEADER,
    BATCH_LENGTH_MIN,
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    _header_fields,
    check_batch,
    parse_header,
)
from raftlog.partition.compression import (
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_SNAPPY,
    CODEC_ZSTD,
    DecompressedSizeError,
    decompress_records,
)
from raftlog.partition.errors import CorruptRecordError
from raftlog.partition.files import write_atomically
from raftlog.partition.index import INT32_MAX
from raftlog.partition.log_swap import CLEANED_SUFFIX
from raftlog.partition.segment import Segment
from raftlog.partition.segment_timestamps import DECOMPRESSED_RECORDS_BYTES_MAX

__all__ = [
    "CLEANER_CHECKPOINT",
    "AbortedRanges",
    "CleanSource",
    "PassPlan",
    "SegmentInfo",
    "build_offset_map",
    "build_segment_offset_map",
    "compact",
    "has_record_without_key",
    "is_compacted",
    "iter_batches",
    "last_batches_of_producers",
    "plan_pass",
    "read_cleaner_checkpoint",
    "rebuild_batch",
    "write_cleaned_segment",
    "write_cleaner_checkpoint",
]

logger = logging.getLogger(__name__)

CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
_CHECKPOINT_VERSION = "0"
_UINT32 = struct.Struct(">I")
_CRC_OFFSET = 17
_ATTRIBUTES_OFFSET = 21
_CODEC_MASK = 0x07
_READ_CHUNK_BYTES = 1 << 20
_WRITE_CHUNK_BYTES = 1 << 20
_HEADER_WINDOW_BYTES = 64 * 1024
# Estimated bytes an offset-map entry costs besides its key (dict slot, bytes and int objects).
MAP_ENTRY_OVERHEAD_BYTES = 100


# --- records: a fast scanner (offset delta, key, null value, raw byte range) ---------------

_Scanned = tuple[int, bytes | None, bool, int, int]  # offset delta, key, tombstone, start, end


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint at ``pos``: (value, next position)."""
    byte = buf[pos]
    if byte < 0x80:
        return (byte >> 1) ^ -(byte & 1), pos + 1
    encoded = byte & 0x7F
    shift = 7
    pos += 1
    while True:
        if shift > 63:
            raise CorruptRecordError("varint longer than 10 bytes")
        byte = buf[pos]
        pos += 1
        encoded |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (encoded >> 1) ^ -(encoded & 1), pos
        shift += 7


def _scan_records(payload: bytes, count: int) -> list[_Scanned]:
    """Each record's offset delta, key, whether its value is null, and its byte range in
    ``payload`` (an uncompressed records section). Raises CorruptRecordError."""
    out: list[_Scanned] = []
    pos = 0
    try:
        for _ in range(count):
            start = pos
            length, pos = _varint(payload, pos)
            end = pos + length
            _, pos = _varint(payload, pos + 1)  # skip attributes, timestampDelta
            delta, pos = _varint(payload, pos)
            key_length, pos = _varint(payload, pos)
            key = None
            if key_length >= 0:
                key = payload[pos:pos + key_length]
                pos += key_length
            value_length, pos = _varint(payload, pos)
            if end > len(payload) or pos + max(value_length, 0) > end:
                raise CorruptRecordError("record overruns its batch")
            out.append((delta, key, value_length < 0, start, end))
            pos = end
    except IndexError as exc:
        raise CorruptRecordError("record truncated") from exc
    if pos != len(payload):
        raise CorruptRecordError("bytes left over after the last record")
    return out


def _payload(header: BatchHeader, batch: bytes) -> bytes:
    """The batch's records section, decompressed. Bounded like ListOffsets' decoding, so a
    compression bomb costs at most DECOMPRESSED_RECORDS_BYTES_MAX (DecompressedSizeError):
    the produce-time key check refuses such a batch, the cleaner keeps it as it is."""
    body = batch[RECORD_BATCH_OVERHEAD:]
    if not header.compression_codec:
        return body
    return bytes(decompress_records(header.compression_codec, body,
                                    max_bytes=DECOMPRESSED_RECORDS_BYTES_MAX))


def _compress(codec: int, data: bytes) -> bytes | None:
    """``data`` compressed with ``codec`` as Kafka clients read it; None when the codec's
    library is missing (the caller writes the records uncompressed)."""
    if codec == CODEC_GZIP:
        return gzip.compress(data)
    try:
        import cramjam
    except ImportError:
        return None
    if codec == CODEC_LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec == CODEC_ZSTD:
        return bytes(cramjam.zstd.compress(data))
    if codec == CODEC_SNAPPY:  # xerial framing: what the Java client writes, all clients read
        out = bytearray(b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1))
        for start in range(0, len(data), 32 * 1024):
            block = bytes(cramjam.snappy.compress_raw(data[start:start + 32 * 1024]))
            out += struct.pack(">i", len(block)) + block
        return bytes(out)
    return None


def rebuild_batch(header: BatchHeader, raw_records: bytes, records_count: int) -> bytes:
    """A batch with ``header``'s identity (offsets, epoch, producer, timestamps, attributes)
    holding ``raw_records`` (whole encoded records of the original batch), compressed with
    the header's codec when possible; CRC-32C recomputed."""
    attributes = header.attributes
    payload = raw_records
    if header.compression_codec and raw_records:
        compressed = _compress(header.compression_codec, raw_records)
        if compressed is None:
            attributes &= ~_CODEC_MASK
        else:
            payload = compressed
    elif not raw_records:
        attributes &= ~_CODEC_MASK  # an empty batch carries nothing to compress
    fields = list(_header_fields(header))
    fields[1] = BATCH_LENGTH_MIN + len(payload)  # batchLength
    fields[4] = 0  # crc, below
    fields[5] = attributes
    fields[12] = records_count  # recordsCount; lastOffsetDelta (fields[6]) is kept
    buf = bytearray(_HEADER.pack(*fields) + payload)
    _UINT32.pack_into(buf, _CRC_OFFSET, crc32c.crc32c(bytes(buf[_ATTRIBUTES_OFFSET:])))
    return bytes(buf)


# --- aborted transactions ---------------------------------------------------------------------


class AbortedRanges:
    """Per producer id, the ``[first offset, marker offset]`` ranges of its aborted
    transactions: a transactional data batch inside one is an aborted record."""

    def __init__(self, ranges: Iterable[tuple[int, int, int]] = ()) -> None:
        by_producer: dict[int, list[tuple[int, int]]] = {}
        for producer_id, first, last in ranges:
            by_producer.setdefault(producer_id, []).append((first, last))
        self._firsts = {pid: [f for f, _ in sorted(r)] for pid, r in by_producer.items()}
        self._lasts = {pid: [last for _, last in sorted(r)] for pid, r in by_producer.items()}

    def contains(self, header: BatchHeader) -> bool:
        if not header.is_transactional or header.is_control or header.producer_id < 0:
            return False
        firsts = self._firsts.get(header.producer_id)
        if not firsts:
            return False
        slot = bisect_right(firsts, header.base_offset) - 1
        return slot >= 0 and header.base_offset <= self._lasts[header.producer_id][slot]


_NO_ABORTS = AbortedRanges()


# --- decisions ----------------------------------------------------------------------------------


def _survivors(header: BatchHeader, batch: bytes, offset_map: Mapping[bytes, int], *,
               now_ms: int, delete_retention_ms: int) -> tuple[list[_Scanned], int]:
    """The records of a data batch that survive, and how many it had."""
    scanned = _scan_records(_payload(header, batch), header.records_count)
    tombstones_expired = header.max_timestamp + delete_retention_ms <= now_ms
    kept = []
    for record in scanned:
        delta, key, tombstone, _, _ = record
        if key is not None:
            if offset_map.get(key, -1) > header.base_offset + delta:
                continue  # a newer value of this key exists
            if tombstone and tombstones_expired:
                continue
        kept.append(record)
    return kept, len(scanned)


def _clean_batch(header: BatchHeader, batch: bytes, offset_map: Mapping[bytes, int], *,
                 now_ms: int, delete_retention_ms: int, aborted: AbortedRanges,
                 keep_empty: bool) -> bytes | None:
    """The cleaned bytes of one batch, or None when it goes entirely."""
    if header.is_control:
        return batch
    if aborted.contains(header):
        kept: list[_Scanned] = []
        payload = b""
    else:
        try:
            payload = _payload(header, batch)
            kept, total = _survivors(header, batch, offset_map, now_ms=now_ms,
                                     delete_retention_ms=delete_retention_ms)
        except DecompressedSizeError:
            return batch  # too large to read safely: kept whole (nothing is lost)
        if len(kept) == total:
            return batch
    if not kept:
        return rebuild_batch(header, b"", 0) if keep_empty else None
    raw = b"".join(payload[start:end] for _, _, _, start, end in kept)
    return rebuild_batch(header, raw, len(kept))


def _last_batch_of_producers(headers: Iterable[BatchHeader]) -> set[int]:
    """Base offsets of the last data batch of each producer id."""
    last: dict[int, int] = {}
    for header in headers:
        if header.producer_id >= 0 and not header.is_control:
            last[header.producer_id] = header.base_offset
    return set(last.values())


# --- in-memory forms (tests, tooling, the produce-time key check) -------------------------------


def iter_batches(data: bytes) -> Iterator[tuple[BatchHeader, bytes]]:
    position = 0
    while position < len(data):
        header = check_batch(data, position)
        yield header, data[position:position + header.size_bytes]
        position += header.size_bytes


def _add_to_map(out: dict[bytes, int], header: BatchHeader, batch: bytes,
                aborted: AbortedRanges) -> None:
    if header.is_control or aborted.contains(header):
        return
    base = header.base_offset
    try:
        payload = _payload(header, batch)
    except DecompressedSizeError:
        return  # its keys do not shadow older values: less is compacted, nothing wrongly
    for delta, key, _, _, _ in _scan_records(payload, header.records_count):
        if key is not None:
            out[key] = base + delta  # offsets increase through the log: the last one wins


def build_offset_map(data: bytes, offset_map: dict[bytes, int] | None = None, *,
                     aborted: AbortedRanges = _NO_ABORTS) -> dict[bytes, int]:
    """key -> offset of its latest record, over the (non-control, non-aborted) batches."""
    out = {} if offset_map is None else offset_map
    for header, batch in iter_batches(data):
        _add_to_map(out, header, batch, aborted)
    return out


def compact(data: bytes, offset_map: Mapping[bytes, int], *, now_ms: int,
            delete_retention_ms: int, aborted: AbortedRanges = _NO_ABORTS,
            keep_last_batch: bool = False) -> bytes:
    """The cleaned bytes of the whole batches in ``data`` (see the module docstring)."""
    batches = list(iter_batches(data))
    producers_last = _last_batch_of_producers(header for header, _ in batches)
    out = bytearray()
    for slot, (header, batch) in enumerate(batches):
        keep_empty = header.base_offset in producers_last or \
            (keep_last_batch and slot == len(batches) - 1)
        cleaned = _clean_batch(header, batch, offset_map, now_ms=now_ms,
                               delete_retention_ms=delete_retention_ms, aborted=aborted,
                               keep_empty=keep_empty)
        if cleaned is not None:
            out += cleaned
    return bytes(out)


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
        scanned = _scan_records(_payload(header, batch), header.records_count)
        if any(key is None for _, key, _, _, _ in scanned):
            return True
    return False


# --- planning a pass ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    base_offset: int
    next_offset: int
    size_bytes: int
    largest_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class PassPlan:
    cleanable_count: int  # the first segments that take part
    first_dirty_slot: int  # index of the first dirty one among them
    dirty_ratio: float


def plan_pass(segments: Sequence[SegmentInfo], *, first_dirty_offset: int,
              uncleanable_offset: int, now_ms: int, min_cleanable_dirty_ratio: float,
              min_compaction_lag_ms: int) -> PassPlan | None:
    """Which segments one pass cleans (the last segment is the active one and never does),
    or None when there is nothing dirty enough."""
    cleanable = 0
    for info in segments[:-1]:
        if info.next_offset > uncleanable_offset:
            break
        if min_compaction_lag_ms > 0 and \
                info.largest_timestamp_ms > now_ms - min_compaction_lag_ms:
            break
        cleanable += 1
    first_dirty_slot = 0
    while first_dirty_slot < cleanable and \
            segments[first_dirty_slot].next_offset <= first_dirty_offset:
        first_dirty_slot += 1
    dirty_bytes = sum(info.size_bytes for info in segments[first_dirty_slot:cleanable])
    total_bytes = sum(info.size_bytes for info in segments[:cleanable])
    if first_dirty_slot == cleanable or total_bytes == 0:
        return None
    ratio = dirty_bytes / total_bytes
    if ratio < min_cleanable_dirty_ratio:
        return None
    return PassPlan(cleanable, first_dirty_slot, ratio)


# --- file work (worker thread) ----------------------------------------------------------------


@dataclass(slots=True)
class CleanSource:
    """A sealed segment taking part in a pass, read through a private fd."""

    segment: Segment
    fd: int
    size_bytes: int
    txn_index: bytes

    def batches(self) -> Iterator[tuple[BatchHeader, bytes]]:
        """Every batch, CRC-checked, reading ``_READ_CHUNK_BYTES`` at a time."""
        position = 0
        window = b""
        window_start = 0
        while position < self.size_bytes:
            offset_in = position - window_start
            if offset_in + RECORD_BATCH_OVERHEAD > len(window):
                window = os.pread(self.fd, _READ_CHUNK_BYTES, position)
                window_start, offset_in = position, 0
            header = parse_header(window, offset_in) \
                if len(window) - offset_in >= RECORD_BATCH_OVERHEAD else None
            if header is None:
                raise CorruptRecordError(f"{self.segment.log_path}: torn header at {position}")
            if offset_in + header.size_bytes > len(window):
                window = os.pread(self.fd, max(_READ_CHUNK_BYTES, header.size_bytes), position)
                window_start, offset_in = position, 0
            check_batch(window, offset_in)
            yield header, window[offset_in:offset_in + header.size_bytes]
            position += header.size_bytes

    def headers(self) -> Iterator[BatchHeader]:
        """Every batch header (no CRC check), reading ``_HEADER_WINDOW_BYTES`` at a time."""
        position = 0
        window = b""
        window_start = 0
        while position < self.size_bytes:
            offset_in = position - window_start
            if offset_in + RECORD_BATCH_OVERHEAD > len(window):
                window = os.pread(self.fd, _HEADER_WINDOW_BYTES, position)
                window_start, offset_in = position, 0
                if len(window) < RECORD_BATCH_OVERHEAD:
                    raise CorruptRecordError(f"{self.segment.log_path}: torn header at "
                                             f"{position}")
            header = parse_header(window, offset_in)
            if header.size_bytes < RECORD_BATCH_OVERHEAD:
                raise CorruptRecordError(f"{self.segment.log_path}: bad batch length at "
                                         f"{position}")
            yield header
            position += header.size_bytes

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def build_segment_offset_map(sources: Sequence[CleanSource], aborted: AbortedRanges,
                             capacity_bytes: int) -> tuple[dict[bytes, int], int]:
    """The offset map over the dirty ``sources`` in order, and how many of them it covers:
    it stops before a segment once the map's estimated size passes ``capacity_bytes``
    (always covering at least one)."""
    offset_map: dict[bytes, int] = {}
    used_bytes = 0
    covered = 0
    for source in sources:
        if covered and used_bytes > capacity_bytes:
            break
        before = len(offset_map)
        for header, batch in source.batches():
            _add_to_map(offset_map, header, batch, aborted)
        # Keys are small in compacted topics; estimate new entries at the average key size.
        added = len(offset_map) - before
        if added:
            sample = next(reversed(offset_map))
            used_bytes += added * (len(sample) + MAP_ENTRY_OVERHEAD_BYTES)
        covered += 1
    return offset_map, covered


def last_batches_of_producers(sources: Sequence[CleanSource]) -> set[int]:
    """Base offsets of each producer's last data batch in ``sources`` (a header scan through
    the sources' private fds: the segments' own fds may be closed meanwhile)."""
    return _last_batch_of_producers(header for source in sources for header in source.headers())


def write_cleaned_segment(directory: Path, sources: Sequence[CleanSource],
                          offset_map: Mapping[bytes, int], *, aborted: AbortedRanges,
                          producers_last: set[int], now_ms: int, delete_retention_ms: int,
                          segment_bytes: int, index_interval_bytes: int
                          ) -> tuple[int, Segment]:
    """Write the compacted copy of the first sources as one ``<base>.*.cleaned`` segment,
    sealed and fsynced (log, indexes, ``.txnindex`` = the sources' entries: markers are all
    kept), and return how many sources it replaces. Small segments merge: a source joins
    while the output so far plus its size (an upper bound of its output) fits
    ``segment_bytes`` and its offsets fit int32 relative offsets. Blocking; on error
    nothing is left behind."""
    base = sources[0].segment.base_offset
    cleaned = Segment.create(directory, base, index_interval_bytes, file_suffix=CLEANED_SUFFIX)
    try:
        used = 0
        held_back: bytes | None = None  # the empty last batch of the previous source
        while used < len(sources):
            source = sources[used]
            if used and (cleaned.size_bytes + source.size_bytes > segment_bytes or
                         source.segment.next_offset - base > INT32_MAX):
                break
            held_back = _clean_source(cleaned, source, offset_map, aborted=aborted,
                                      producers_last=producers_last, now_ms=now_ms,
                                      delete_retention_ms=delete_retention_ms)
            used += 1
        if held_back is not None:  # the segment must end where the last source ended
            cleaned.append(held_back, [parse_header(held_back)], now_ms)
        end = sources[used - 1].segment.next_offset
        if cleaned.next_offset != end:
            raise CorruptRecordError(f"cleaned segment {base} ends at {cleaned.next_offset}, "
                                     f"expected {end}")
        cleaned.seal()  # first: it cuts off the preallocated tail, which the fsync makes durable
        cleaned.fsync()
        cleaned.flushed_size_bytes = cleaned.size_bytes
        cleaned.write_txn_index(b"".join(source.txn_index for source in sources[:used]))
    except BaseException:
        cleaned.delete()
        raise
    return used, cleaned


def _clean_source(cleaned: Segment, source: CleanSource, offset_map: Mapping[bytes, int], *,
                  aborted: AbortedRanges, producers_last: set[int], now_ms: int,
                  delete_retention_ms: int) -> bytes | None:
    """Append the cleaned batches of one source; returns its last batch as an empty batch
    when that batch was dropped (the caller appends it if the segment ends here)."""
    end = source.segment.next_offset
    pending = bytearray()
    headers: list[BatchHeader] = []
    held_back: bytes | None = None
    for header, batch in source.batches():
        out = _clean_batch(header, batch, offset_map, now_ms=now_ms,
                           delete_retention_ms=delete_retention_ms, aborted=aborted,
                           keep_empty=header.base_offset in producers_last)
        if out is None:
            if header.next_offset == end:
                held_back = rebuild_batch(header, b"", 0)
            continue
        headers.append(parse_header(out))
        pending += out
        if len(pending) >= _WRITE_CHUNK_BYTES:
            cleaned.append(pending, headers, now_ms)
            pending, headers = bytearray(), []
    if headers:
        cleaned.append(pending, headers, now_ms)
    return held_back


# --- the first-dirty-offset checkpoint ----------------------------------------------------------


def read_cleaner_checkpoint(directory: Path) -> int:
    """The first dirty offset recorded by the last pass; 0 when there is none."""
    try:
        lines = (directory / CLEANER_CHECKPOINT).read_text().split()
    except FileNotFoundError:
        return 0
    if len(lines) == 2 and lines[0] == _CHECKPOINT_VERSION and lines[1].isdigit():
        return int(lines[1])
    logger.warning("%s: unreadable %s %r; cleaning from the start", directory,
                   CLEANER_CHECKPOINT, lines)
    return 0


def write_cleaner_checkpoint(directory: Path, first_dirty_offset: int) -> None:
    write_atomically(directory / CLEANER_CHECKPOINT,
                     f"{_CHECKPOINT_VERSION}\n{first_dirty_offset}\n".encode())
