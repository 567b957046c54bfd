"""SegmentList: the shape of a partition's log in memory, its segments and its start offset.

Every part of ``PartitionLog`` that changes which segments make up the log (a roll, a
compaction swap, retention, truncation, a reset) does so through the few mutations here,
and checks the invariants after: segments sorted by base offset and contiguous, only the
last (active) one unsealed, ``log_start_offset`` inside the log. Memory only, except
``remove_stray_namesake``, which clears the way for a new segment file.
"""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections.abc import Sequence
from pathlib import Path

from raftlog.partition.errors import OffsetOutOfRangeError
from raftlog.partition.segment import Segment
from raftlog.partition.segment_files import LOG_SUFFIX, segment_file_name

__all__ = ["SegmentList"]

logger = logging.getLogger(__name__)


class SegmentList:
    """The segments of the log in ``directory``, oldest first (the last one is active), and
    ``log_start_offset``, which may lie inside the first segment (DeleteRecords)."""

    def __init__(self, directory: Path, segments: list[Segment], log_start_offset: int
                 ) -> None:
        assert segments, "a log always has an active segment"
        self._directory = directory
        self._segments = segments
        self._log_start_offset = log_start_offset

    # --- reading ---------------------------------------------------------------------------

    @property
    def view(self) -> Sequence[Segment]:
        """The segments themselves, not a copy: read them, do not keep the sequence."""
        return self._segments

    @property
    def active(self) -> Segment:
        return self._segments[-1]

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    def slot(self, offset: int) -> int:
        """Index of the segment whose range holds ``offset`` (at or above the first base)."""
        slot = bisect_right(self._segments, offset, key=lambda segment: segment.base_offset) - 1
        assert slot >= 0, f"offset {offset} precedes the first segment"
        return slot

    def check_offset_in_range(self, offset: int) -> None:
        """Raise OffsetOutOfRangeError outside [log_start_offset, log_end_offset]."""
        if not self._log_start_offset <= offset <= self.log_end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} outside [{self._log_start_offset}, {self.log_end_offset}]"
            )

    # --- changing the log ------------------------------------------------------------------

    def roll(self, new_segment: Segment) -> None:
        """``new_segment`` becomes the active segment (the previous one was sealed)."""
        self._segments.append(new_segment)

    def splice(self, first: int, count: int, replacement: Segment) -> None:
        """Replace ``count`` segments from slot ``first`` with one (a compaction swap)."""
        self._segments[first:first + count] = [replacement]

    def drop_leading(self, count: int) -> list[Segment]:
        """Take the first ``count`` segments out of the log; returns them."""
        dropped = self._segments[:count]
        del self._segments[:count]
        return dropped

    def drop_active(self) -> Segment:
        """Take the active segment out; the one before it becomes active (truncation)."""
        assert len(self._segments) > 1, "a log always has an active segment"
        return self._segments.pop()

    def restart(self, segment: Segment, log_start_offset: int) -> list[Segment]:
        """The log becomes ``segment`` alone, starting at ``log_start_offset``; returns the
        segments it replaced (``segment`` itself excluded)."""
        old = [s for s in self._segments if s is not segment]
        self._segments = [segment]
        self._log_start_offset = log_start_offset
        return old

    def set_log_start_offset(self, offset: int) -> None:
        self._log_start_offset = offset

    def remove_stray_namesake(self, base_offset: int) -> None:
        """Unlink a segment file named for ``base_offset`` that the log does not hold: the
        leftover of an unlink that failed in ``reset_to`` (logged there, not fatal). Left in
        place it would make ``Segment.create`` fail (O_EXCL) at every roll to this offset."""
        assert all(segment.base_offset != base_offset for segment in self._segments)
        stray = self._directory / segment_file_name(base_offset, LOG_SUFFIX)
        if stray.exists():
            logger.warning("%s: removing %s, a segment the log no longer holds, before "
                           "rolling to offset %d", self._directory, stray.name, base_offset)
            stray.unlink()

    def check_invariants(self, flushed_offset: int) -> None:
        """Cheap O(1) checks after every mutation (TigerBeetle-style)."""
        active = self.active
        assert not active.sealed, "the last segment must be the active one"
        assert self._log_start_offset <= self.log_end_offset
        assert flushed_offset <= self.log_end_offset
        assert self._segments[0].base_offset <= self._log_start_offset
        if len(self._segments) > 1:
            previous = self._segments[-2]
            assert previous.sealed and previous.next_offset == active.base_offset
