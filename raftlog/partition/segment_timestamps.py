"""ListOffsets by timestamp inside one segment: the record-level search over batch headers.

``Segment`` narrows the search with its time and offset indexes and hands this module the
batches from there on; only the one batch whose maxTimestamp reaches the target has its
records decoded (decompressed if need be). Kept apart from the segment's file I/O because it
is the one place that decodes records on the event loop, with its own bounds: the
decompression cap and the memory of batches that could not be read.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from raftlog.partition.batch import RECORD_BATCH_OVERHEAD, BatchHeader, record_timestamps
from raftlog.partition.compression import DecompressedSizeError, decompress_records

__all__ = [
    "DECOMPRESSED_RECORDS_BYTES_MAX",
    "TimestampAndOffset",
    "TimestampSearch",
]

logger = logging.getLogger(__name__)

# ListOffsets by timestamp decompresses one batch on the event loop; a producer's batch may
# be a compression bomb (its CRC only proves it arrived as sent: 1 MiB of gzip'd zeros is
# ~1 GiB). A legitimate batch is at most max.message.bytes compressed (default ~1 MiB)
# and was closed by its producer near batch.size (Java: 16 KiB estimated compressed;
# librdkafka: 1 MB uncompressed), so its records decompress to a few MiB at most; 64 MiB
# leaves room for a raised max.message.bytes and highly compressible data while bounding
# what one lookup can allocate. Past it, the answer is at batch granularity.
DECOMPRESSED_RECORDS_BYTES_MAX = 64 * 1024 * 1024
# Batches whose records could not be read are remembered, per segment, so a ListOffsets
# that lands on one again answers at batch granularity at once instead of decompressing it
# again (up to the cap: ~200 ms on the event loop for a bomb) and warns once. Bounded: past
# this many in one segment, the oldest is forgotten (and decoded again if asked for).
_UNREADABLE_BATCHES_MAX = 1024

# (position, header) of consecutive batches of a segment, as ``Segment.iter_headers`` yields.
Batches = Iterable[tuple[int, BatchHeader]]


@dataclass(frozen=True, slots=True)
class TimestampAndOffset:
    """A ListOffsets answer: one record's timestamp and offset, and the partitionLeaderEpoch
    of its batch (-1 when the batch has none), as Kafka's ``FileRecords.TimestampAndOffset``."""

    timestamp_ms: int
    offset: int
    leader_epoch: int


class TimestampSearch:
    """The record-level half of a segment's timestamp lookups. One per segment: it remembers
    which of that segment's batches could not be read. ``fd`` is the segment's read fd and
    ``log_path`` its file (for warnings), passed per call because both change over the
    segment's life (close, a compaction swap renaming the file)."""

    def __init__(self) -> None:
        # (position, crc, decompression cap) of batches whose records could not be read,
        # oldest first (a dict as an ordered set): not decoded again, warned about once.
        self._unreadable: dict[tuple[int, int, int], None] = {}

    def find_timestamp(self, batches: Batches, fd: int, log_path: Path, timestamp_ms: int,
                       start_offset: int) -> TimestampAndOffset | None:
        """The first record in ``batches`` at or after ``start_offset`` whose timestamp is
        >= ``timestamp_ms``, or None. Control batches are searched like any other, as Kafka
        does. A batch whose records cannot be read answers at batch granularity: its
        maxTimestamp at its first offset not below ``start_offset``."""
        for batch_position, header in batches:
            if header.max_timestamp < timestamp_ms or header.last_offset < start_offset:
                continue
            records = self._record_timestamps(fd, log_path, batch_position, header)
            if records is None:
                return TimestampAndOffset(header.max_timestamp,
                                          max(header.base_offset, start_offset),
                                          _batch_epoch(header))
            for offset, record_timestamp_ms in records:
                if record_timestamp_ms >= timestamp_ms and offset >= start_offset:
                    return TimestampAndOffset(record_timestamp_ms, offset,
                                              _batch_epoch(header))
        return None

    def find_max_timestamp(self, batches: Batches, fd: int, log_path: Path,
                           max_timestamp_ms: int) -> TimestampAndOffset | None:
        """The earliest record of the first batch in ``batches`` whose maxTimestamp is
        ``max_timestamp_ms`` (Kafka's ``RecordBatch.offsetOfMaxTimestamp``), or None. A
        batch whose records cannot be read answers its base offset."""
        for batch_position, header in batches:
            if header.max_timestamp != max_timestamp_ms:
                continue
            records = self._record_timestamps(fd, log_path, batch_position, header)
            if records is None:
                return TimestampAndOffset(header.max_timestamp, header.base_offset,
                                          _batch_epoch(header))
            for offset, record_timestamp_ms in records:
                if record_timestamp_ms == header.max_timestamp:
                    return TimestampAndOffset(header.max_timestamp, offset,
                                              _batch_epoch(header))
            return None  # Kafka too stops at the first batch with that maxTimestamp
        return None

    def _record_timestamps(self, fd: int, log_path: Path, position: int, header: BatchHeader
                           ) -> list[tuple[int, int]] | None:
        """(offset, timestamp_ms) of each record of the batch at ``position``, or None when
        the records are unreadable: a codec library missing, records that decompress past
        DECOMPRESSED_RECORDS_BYTES_MAX, or bytes a producer encoded wrongly (the CRC only
        proves they arrived as sent; offset deltas outside the batch included). The caller
        then answers at batch granularity. An unreadable batch is remembered (keyed by its
        position, CRC and the cap), so the next lookup answers without decoding it again."""
        if (position, header.crc, DECOMPRESSED_RECORDS_BYTES_MAX) in self._unreadable:
            return None
        records: memoryview | bytes | bytearray = \
            memoryview(os.pread(fd, header.size_bytes, position))[RECORD_BATCH_OVERHEAD:]
        try:
            if header.compression_codec:
                records = decompress_records(header.compression_codec, records,
                                             max_bytes=DECOMPRESSED_RECORDS_BYTES_MAX)
            return record_timestamps(header, records)
        except DecompressedSizeError as error:
            self._warn_unreadable(log_path, position, header, str(error))
        except Exception as error:  # codec libraries raise their own types; never crash
            self._warn_unreadable(log_path, position, header,
                                  f"{type(error).__name__}: {error}")
        return None

    def _warn_unreadable(self, log_path: Path, position: int, header: BatchHeader,
                         reason: str) -> None:
        """Remember the batch as unreadable and warn (once: it is not decoded again)."""
        if len(self._unreadable) >= _UNREADABLE_BATCHES_MAX:
            del self._unreadable[next(iter(self._unreadable))]
        self._unreadable[(position, header.crc, DECOMPRESSED_RECORDS_BYTES_MAX)] = None
        logger.warning("%s: cannot read the records of the batch at offset %d (%s); answering "
                       "ListOffsets at batch granularity", log_path, header.base_offset,
                       reason)


def _batch_epoch(header: BatchHeader) -> int:
    # Kafka answers a batch's partitionLeaderEpoch only when it is set (>= 0).
    return header.partition_leader_epoch if header.partition_leader_epoch >= 0 else -1
