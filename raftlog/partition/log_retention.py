"""Moving a partition's log start up: time and size retention, and DeleteRecords.

Both take the same crash-safe path: the new start is checkpointed (``log_start_checkpoint``)
before memory moves, then the sealed segments wholly below it are unlinked, oldest first,
and one directory fsync makes the unlinks durable. A crash (or a failed unlink) at any
point leaves at most a contiguous prefix of segments below the checkpointed start, which
the next open deletes (``log_recovery``). ``LogTruncation`` uses ``write_checkpoint`` too,
when cutting the tail lowers the start.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path

from raftlog.metrics.recorders import Counter
from raftlog.partition.epoch_cache import LeaderEpochCache
from raftlog.partition.errors import OffsetOutOfRangeError
from raftlog.partition.files import fsync_directory
from raftlog.partition.log_config import LogConfig
from raftlog.partition.log_flush import FlushState
from raftlog.partition.log_health import StorageHealth, describe_os_error
from raftlog.partition.log_segments import SegmentList
from raftlog.partition.log_start_checkpoint import replace_log_start_checkpoint
from raftlog.partition.segment import Segment

__all__ = ["LogRetention", "deletable_segment_count"]

logger = logging.getLogger(__name__)


class LogRetention:
    """Moves the start of the log in ``directory`` and deletes what falls below it. Shares
    the log's segment list, epoch cache, flush state and health with ``PartitionLog``;
    ``deleted_segments`` counts the segments it takes out of the log (retention, DeleteRecords,
    a follower adopting the leader's log start)."""

    def __init__(self, directory: Path, segments: SegmentList, epoch_cache: LeaderEpochCache,
                 flush: FlushState, health: StorageHealth,
                 deleted_segments: Counter | None = None) -> None:
        self.deleted_segments = Counter() if deleted_segments is None else deleted_segments
        self._directory = directory
        self._segments = segments
        self._epoch_cache = epoch_cache
        self._flush = flush
        self._health = health

    def enforce(self, config: LogConfig, now_ms: int, high_watermark: int | None) -> int:
        """Delete the oldest sealed segments that are past ``retention_ms`` (by their largest
        timestamp), beyond ``retention_bytes``, or below log_start_offset; never the active
        one, and never one holding an offset at or above ``high_watermark`` (Kafka's
        deletableSegments: ``upperBoundOffset = min(activeSegment.baseOffset, highWatermark)``),
        so the log start never passes the HW: data no other replica may have yet stays.
        ``None`` means no bound (a standalone log in tests). Advances and checkpoints
        log_start_offset. Returns the segments deleted (0 while the log is offline).

        As in Kafka, size retention deletes a segment only if the log stays at least
        ``retention_bytes`` big without it.

        Crash-safe in the same order as ``advance_start``: the new start is
        checkpointed before memory moves and before any segment is unlinked.
        """
        if self._health.offline_reason is not None:
            return 0
        segments = self._segments.view
        count = deletable_segment_count(segments, config, self._segments.log_start_offset,
                                        now_ms, high_watermark)
        if count == 0:
            return 0
        new_start = max(self._segments.log_start_offset, segments[count].base_offset)
        if new_start > self._segments.log_start_offset:
            # raises having changed nothing
            self.write_checkpoint(new_start, memory_may_follow=True)
            self.set_start(new_start)
        self._delete_leading_segments(count, "by retention")
        self._segments.check_invariants(self._flush.flushed_offset)
        return count

    def advance_start(self, offset: int) -> bool:
        """Move log_start_offset up to ``offset`` (DeleteRecords on the leader, the leader's
        log start on a follower: Kafka's maybeIncrementLogStartOffset). Never moves it back;
        False when ``offset`` is not above it. Raises OffsetOutOfRangeError past the log end
        (the caller bounds it by the high watermark), KafkaStorageError while the log is
        offline (or once a failed directory fsync took it offline), OSError when the
        checkpoint cannot be written (then nothing changed, in memory or on disk, so a
        retry writes it again).

        Blocking, on the caller's thread, in one call (so nothing can change the log or the
        caller's role in between): the ``log-start-offset`` checkpoint is written first
        (temp file, fsync, rename, directory fsync), then memory moves, then the sealed
        segments wholly below ``offset`` are unlinked, oldest first, stopping at the first
        failure, and one directory fsync makes the unlinks durable. A crash (or a failed
        unlink) at any point leaves at most a contiguous prefix of segments below the
        checkpointed start, which the next open deletes. The segment that contains
        ``offset`` stays; reads below ``offset`` raise OffsetOutOfRangeError."""
        self._health.check_writable()
        if offset <= self._segments.log_start_offset:
            return False
        end_offset = self._segments.log_end_offset
        if offset > end_offset:
            raise OffsetOutOfRangeError(
                f"log start offset {offset} is past the log end offset {end_offset}")
        self.write_checkpoint(offset, memory_may_follow=True)  # raises having changed nothing
        self.set_start(offset)
        count = 0
        for segment in self._segments.view[:-1]:
            if segment.next_offset > offset:
                break
            count += 1
        self._delete_leading_segments(count, f"below the log start offset {offset}")
        self._segments.check_invariants(self._flush.flushed_offset)
        return True

    def set_start(self, offset: int) -> None:
        """Move the start in memory and trim the epoch cache. A failed write of the trimmed
        ``leader-epoch-checkpoint`` is logged, not raised: the start is already durable, and
        a stale epoch file is harmless (``log_recovery`` trims it to the start)."""
        self._segments.set_log_start_offset(offset)
        try:
            self._epoch_cache.truncate_from_start(offset)
        except OSError as error:
            logger.warning("%s: cannot rewrite the leader-epoch checkpoint for the log start "
                           "offset %d (%s); the next open trims it", self._directory, offset,
                           describe_os_error(error))

    def write_checkpoint(self, log_start_offset: int, *, memory_may_follow: bool = False
                         ) -> None:
        """Durably record ``log_start_offset`` (fsynced temp file, rename, directory fsync).
        Callers write first and move the start after, so a failure before the rename
        leaves memory and disk agreeing on the old value (OSError). A failed directory
        fsync after the rename leaves the disk saying the new value, durably or not: the
        log goes offline (a failed fsync is not retried; a restart reads whichever value
        survived) and KafkaStorageError is raised; with ``memory_may_follow`` (a start
        moving up within the log) memory adopts the new value first, so nothing below it is
        served while the disk already says it is gone."""
        replace_log_start_checkpoint(self._directory, log_start_offset)
        try:
            fsync_directory(self._directory)
        except OSError as error:
            # Offline first: nothing after this may fsync the broken directory again (the
            # epoch-cache rewrite below would, and its failure must not skip this).
            self._health.mark_offline(
                f"directory fsync after writing log start {log_start_offset}", error)
            if memory_may_follow:
                self.set_start(log_start_offset)  # tolerates an epoch-file error
            raise self._health.offline_error() from error

    def _delete_leading_segments(self, count: int, why: str) -> None:
        """Take the first ``count`` segments (all below the checkpointed log start) out of
        the log and unlink them, oldest first, then fsync the directory once so the unlinks
        are durable even if no flush follows (an idle partition). Stops at the first failed
        delete, closing the rest: what stays on disk is then a contiguous prefix below the
        checkpointed start, which the next open deletes. A gap (an old segment left, a later
        one gone) would look like a torn log there. A failure is logged, not raised: the
        start has moved either way."""
        doomed = self._segments.drop_leading(count)
        if not doomed:
            return
        self.deleted_segments.inc(len(doomed))
        self._flush.note_directory_change()
        failed: OSError | None = None
        for segment in doomed:
            if failed is not None:
                with contextlib.suppress(OSError):
                    segment.close()
                continue
            logger.info("%s: deleting segment %d %s", self._directory, segment.base_offset,
                        why)
            try:
                segment.delete()
            except OSError as error:
                failed = error
                with contextlib.suppress(OSError):
                    segment.close()
                logger.warning("%s: cannot delete segment %d (%s); it and the %d after it stay"
                               " on disk below the log start until the next open deletes them",
                               self._directory, segment.base_offset, describe_os_error(error),
                               len(doomed) - doomed.index(segment) - 1)
        try:
            fsync_directory(self._directory)
        except OSError as error:  # a failed fsync is not retried (see mark_offline)
            self._health.mark_offline("directory fsync after deleting segments", error)
        else:  # the next flush need not fsync the directory again
            self._flush.note_directory_synced()


def deletable_segment_count(segments: Sequence[Segment], config: LogConfig,
                            log_start_offset: int, now_ms: int,
                            high_watermark: int | None) -> int:
    """How many of the oldest sealed segments retention deletes: those past
    ``retention_ms`` (by their largest timestamp), beyond ``retention_bytes`` (only if the
    log stays at least that big without them, as in Kafka) or below ``log_start_offset``;
    a prefix only, never the active segment, never one holding an offset at or above
    ``high_watermark``."""
    # cleanup.policy=compact alone keeps every segment (the cleaner shrinks them instead).
    retention_ms = config.retention_ms if config.deletes else -1
    retention_bytes = config.retention_bytes if config.deletes else -1
    excess_bytes = sum(segment.size_bytes for segment in segments) - retention_bytes
    count = 0
    for segment in segments[:-1]:
        if high_watermark is not None and segment.next_offset > high_watermark:
            break  # holds offsets the HW has not passed: followers may still need them
        below_start = segment.next_offset <= log_start_offset
        expired = retention_ms >= 0 and now_ms - segment.largest_timestamp_ms() > retention_ms
        oversize = retention_bytes >= 0 and excess_bytes - segment.size_bytes >= 0
        if not (below_start or expired or oversize):
            break  # Kafka deletes only a prefix of the log
        excess_bytes -= segment.size_bytes
        count += 1
    return count
