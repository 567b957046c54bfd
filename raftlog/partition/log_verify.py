"""Never serve a batch whose CRC fails: checking segment bytes before they are read, and what a
log does about a bad batch.

Every segment keeps ``verified`` (``VerifiedRanges``): the byte ranges whose batches had their
CRC-32C checked in this process. Appends check every batch before writing, and recovery scans
the active segment, so those bytes are verified as they arrive; segments loaded from disk start
unverified (bits rot at rest, whatever the shutdown). ``PartitionLog.read`` passes each file
region through ``LogVerifier.check_slice`` before anyone sends it (consumers, followers, the
coordinators' loads): the unverified part is read and CRC-checked once, then served with
``sendfile`` as before. The scrubber (``scrubber``) checks the rest in the background with
``check_region`` on a dup'd fd in a worker thread.

A bad batch is never served: the region is cut before it (the good bytes are served), or, when
it is the first batch, the read raises ``CorruptLogError`` (KAFKA_STORAGE_ERROR). The log
remembers the lowest bad offset (``corrupt_offset``), logs one ERROR per bad batch naming the
partition, file, offset and position, counts it, and tells its listener (the replica manager:
a leader hands leadership to a good ISR member, a follower truncates and fetches it again).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from raftlog.metrics.recorders import Counter
from raftlog.partition.batch import RECORD_BATCH_OVERHEAD, check_batch, parse_header
from raftlog.partition.errors import PartitionLogError
from raftlog.partition.log_health import KafkaStorageError
from raftlog.partition.segment import Segment
from raftlog.partition.segment_files import FileSlice

__all__ = ["BadBatch", "CorruptLogError", "LogVerifier", "check_region"]

logger = logging.getLogger(__name__)

# The scrubber and reads check at most this much per pread (a batch larger than this is read
# whole).
CHECK_CHUNK_BYTES = 1 << 20


class CorruptLogError(KafkaStorageError):
    """The batch a read starts with failed its CRC (or its header is damaged): nothing is
    served. KAFKA_STORAGE_ERROR, which clients retry after refreshing metadata."""


@dataclass(frozen=True, slots=True)
class BadBatch:
    """A batch that failed its check: where it starts and the offset it claims (the offset
    after the previous good batch when its own base offset is implausible)."""

    position: int
    offset: int
    reason: str


def check_region(fd: int, start: int, end: int, first_offset: int,
                 max_bytes: int | None = None) -> tuple[int, BadBatch | None]:
    """Check the batches in [start, end) of the file behind ``fd`` (``start`` and ``end`` are
    batch boundaries; ``first_offset`` the lowest offset the first batch may have), stopping
    after the batch that reaches ``max_bytes`` past ``start``. Returns the end of the checked
    good bytes and the first bad batch, or None. Blocking (preads); touches nothing but
    ``fd``, so it may run in a worker thread."""
    position = start
    expected_offset = first_offset
    data, data_start = b"", start
    limit = end if max_bytes is None else min(end, start + max_bytes)
    while position < limit:
        in_data = position - data_start
        if len(data) - in_data < RECORD_BATCH_OVERHEAD:  # read on: the next chunk
            data = _pread(fd, min(end - position, CHECK_CHUNK_BYTES), position)
            data_start, in_data = position, 0
        if len(data) - in_data >= RECORD_BATCH_OVERHEAD:
            size = parse_header(data, in_data).size_bytes
            if len(data) - in_data < size <= end - position:  # the whole batch, from here
                data = _pread(fd, min(end - position, max(size, CHECK_CHUNK_BYTES)), position)
                data_start, in_data = position, 0
        try:
            header = check_batch(data, in_data)
        except PartitionLogError as error:
            return position, _bad_batch(data, in_data, position, expected_offset, str(error))
        if header.base_offset < expected_offset:
            return position, BadBatch(position, expected_offset,
                                      f"base offset {header.base_offset} is below "
                                      f"{expected_offset}")
        expected_offset = header.next_offset
        position += header.size_bytes
    return position, None


def _pread(fd: int, size: int, position: int) -> bytes:
    chunks: list[bytes] = []
    done = 0
    while done < size:
        chunk = os.pread(fd, size - done, position + done)
        if not chunk:
            break
        chunks.append(chunk)
        done += len(chunk)
    return b"".join(chunks)


def _bad_batch(data: bytes, in_data: int, position: int, expected_offset: int, reason: str
               ) -> BadBatch:
    offset = expected_offset
    if len(data) - in_data >= RECORD_BATCH_OVERHEAD:
        claimed = parse_header(data, in_data).base_offset
        # baseOffset is not CRC-covered; trust it only if it continues the segment.
        if expected_offset <= claimed < expected_offset + (1 << 31):
            offset = claimed
    return BadBatch(position, offset, reason)


class LogVerifier:
    """One log's CRC checks before reads and the record of its bad batches."""

    def __init__(self, name: str, corrupt_batches: Counter | None = None) -> None:
        self._name = name
        self._counter = corrupt_batches
        self._reported: set[tuple[Path, int]] = set()
        self.corrupt_offset: int | None = None
        # Called (on the owner's thread) when a new bad batch is found.
        self.listener: Callable[[], None] | None = None

    def check_slice(self, segment: Segment, piece: FileSlice) -> FileSlice:
        """``piece`` (whole batches of ``segment``) once every batch in it is known good:
        unverified parts are checked now. Cut before the first bad batch; CorruptLogError
        (and ``piece`` closed) when that is its first batch."""
        start, end = piece.position, piece.position + piece.size_bytes
        for gap_start, gap_end in segment.verified.missing(start, end):
            first_offset = segment.offset_at_or_before(gap_start)
            good_end, bad = check_region(piece.fd, gap_start, gap_end, first_offset)
            segment.verified.add(gap_start, good_end)
            if bad is None:
                continue
            self.found(segment, bad)
            if bad.position <= start:
                piece.close()
                raise CorruptLogError(
                    f"partition {self._name}: the batch at offset {bad.offset} in "
                    f"{segment.log_path} (position {bad.position}) is corrupt: {bad.reason}")
            piece.size_bytes = bad.position - start
            break
        return piece

    def found(self, segment: Segment, bad: BadBatch) -> None:
        """Record a bad batch: ERROR once per batch, counted, the listener told."""
        segment.verified.mark_bad(bad.position)
        if self.corrupt_offset is None or bad.offset < self.corrupt_offset:
            self.corrupt_offset = bad.offset
        key = (segment.log_path, bad.position)
        if key in self._reported:
            return
        self._reported.add(key)
        if self._counter is not None:
            self._counter.inc()
        logger.error(
            "partition %s: corrupt batch at offset %d in %s (position %d): %s; it is never "
            "served (KAFKA_STORAGE_ERROR); this replica gets the good copy from another "
            "replica", self._name, bad.offset, segment.log_path, bad.position, bad.reason)
        if self.listener is not None:
            self.listener()

    def forget_from(self, log_end_offset: int) -> None:
        """The log was cut at ``log_end_offset`` (truncation, reset): bad batches at or past it
        are gone."""
        if self.corrupt_offset is not None and self.corrupt_offset >= log_end_offset:
            self.corrupt_offset = None
            self._reported.clear()
