"""Reads of a partition's log: Fetch (whole batches as file slices) and ListOffsets by time.

Plain functions over the log's segments (oldest first): they only read, so the log's owner
calls them with its current segment list and bounds. ``PartitionLog`` checks the offset
against the log's range first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType

from raftlog.partition.segment import Segment
from raftlog.partition.segment_files import FileSlice
from raftlog.partition.segment_timestamps import TimestampAndOffset

__all__ = ["LogRead", "find_max_timestamp", "find_offset_by_timestamp", "read_batches"]


@dataclass(slots=True)
class LogRead:
    """Whole batches for a Fetch, as file slices the caller owns and must close."""

    slices: list[FileSlice]

    @property
    def size_bytes(self) -> int:
        return sum(piece.size_bytes for piece in self.slices)

    def read_bytes(self) -> bytes:
        return b"".join(piece.read_bytes() for piece in self.slices)

    def close(self) -> None:
        for piece in self.slices:
            piece.close()

    def __enter__(self) -> LogRead:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def read_batches(segments: Sequence[Segment], offset: int, max_bytes: int, *,
                 max_offset: int | None, min_one_batch: bool,
                 check: Callable[[Segment, FileSlice], FileSlice] | None = None) -> LogRead:
    """Whole batches starting with the one that contains ``offset`` (so the first base
    offset may be lower, as in Kafka), from a single segment, within ``max_bytes`` unless
    the first batch alone is larger and ``min_one_batch`` (KIP-74), stopping before any
    batch whose base offset is >= ``max_offset`` (high watermark / LSO). ``segments``
    starts with the one holding ``offset``. ``check`` vets the slice before it is returned
    (``LogVerifier.check_slice``: CRCs not yet verified)."""
    # Compaction leaves gaps: an offset that was cleaned away reads from the next batch,
    # in a later segment if this one has nothing at or after it.
    for segment in segments:
        if max_offset is not None and segment.base_offset >= max_offset:
            break
        start = max(offset, segment.base_offset)
        piece = segment.read(
            start, max_bytes, max_offset=max_offset, min_one_batch=min_one_batch
        )
        if piece is not None:
            return LogRead([piece if check is None else check(segment, piece)])
        if segment.find_batch(start) is not None:
            break  # a batch is there but does not fit (max_bytes, max_offset)
    return LogRead([])


def find_offset_by_timestamp(segments: Sequence[Segment], timestamp_ms: int,
                             log_start_offset: int) -> TimestampAndOffset | None:
    """ListOffsets by timestamp (KIP-79): the first record, at or after
    ``log_start_offset``, whose timestamp is >= ``timestamp_ms``, with that record's own
    offset and timestamp (not its batch's). None when no record is that recent.

    Kafka searches only the first segment whose largest timestamp reaches the target;
    should every such record there lie below log_start_offset (DeleteRecords), this
    goes on to the next segment rather than answer nothing.
    """
    for segment in segments:
        if segment.max_timestamp_ms < timestamp_ms:
            continue
        found = segment.find_timestamp(timestamp_ms, log_start_offset)
        if found is not None:
            return found
    return None


def find_max_timestamp(segments: Sequence[Segment]) -> TimestampAndOffset | None:
    """ListOffsets MAX_TIMESTAMP (-3, KIP-734): the earliest record carrying the largest
    timestamp in the log, or None for an empty log. As in Kafka, the segment is the first
    one holding that timestamp and log_start_offset does not bound the answer.

    Kafka's UnifiedLog (MAX_TIMESTAMP branch) takes the segment with the largest
    maxTimestampSoFar and that segment's offsetOfMaxTimestamp without consulting
    logStartOffset; so after DeleteRecords moved the start into that segment, the answer
    may be an offset below log_start_offset, which a Fetch then refuses with
    OFFSET_OUT_OF_RANGE. Kept for compatibility (test_list_offsets_timestamp.py,
    test_max_timestamp_is_not_bounded_by_the_log_start)."""
    segment = max(segments, key=lambda candidate: candidate.max_timestamp_ms)
    return segment.find_max_timestamp()
