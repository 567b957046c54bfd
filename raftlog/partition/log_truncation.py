"""Cutting a partition's log at the end: a follower's truncation and its full reset.

A follower whose log diverged from its leader's truncates it (``truncate_to``, Kafka's
truncateTo); one whose log ends below the leader's start restarts it empty there
(``reset_to``, Kafka's truncateFullyAndStartAt). Both are blocking and fsync what they
change, so a crash cannot resurrect removed (possibly divergent) batches; both leave
in-flight flush tickets and cleaner passes stale (a new generation); an I/O error in the
middle takes the log offline.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from raftlog.partition.epoch_cache import LeaderEpochCache
from raftlog.partition.files import fsync_directory
from raftlog.partition.log_flush import FlushState
from raftlog.partition.log_health import KafkaStorageError, StorageHealth, describe_os_error
from raftlog.partition.log_retention import LogRetention
from raftlog.partition.log_segments import SegmentList
from raftlog.partition.segment import Segment

__all__ = ["LogTruncation"]

logger = logging.getLogger(__name__)


class LogTruncation:
    """Removes the tail (or all) of the log in ``directory``. Shares the log's segment list,
    epoch cache, flush state and health with ``PartitionLog``, and checkpoints a lowered or
    new start through ``retention``."""

    def __init__(self, directory: Path, segments: SegmentList, epoch_cache: LeaderEpochCache,
                 flush: FlushState, health: StorageHealth, retention: LogRetention) -> None:
        self._directory = directory
        self._segments = segments
        self._epoch_cache = epoch_cache
        self._flush = flush
        self._health = health
        self._retention = retention

    def truncate_to(self, offset: int) -> int:
        """``PartitionLog.truncate_to``: remove every offset >= ``offset`` (whole batches);
        returns the new log end offset."""
        self._health.check_writable()  # an offline log is neither modified nor fsynced again
        if offset >= self._segments.log_end_offset:
            return self._segments.log_end_offset
        self._segments.check_offset_in_range(offset)
        lowered_start = self._start_after_truncation(offset)
        if lowered_start < self._segments.log_start_offset:
            # The batch holding the start goes: checkpoint the lower start first, so the disk
            # never claims a start above what the log holds and memory never runs ahead.
            try:
                self._retention.write_checkpoint(lowered_start)
            except OSError as error:  # before the rename: the log is as it was, retry later
                raise KafkaStorageError(f"partition {self._directory.name}: cannot write log "
                                        f"start {lowered_start}: {describe_os_error(error)}"
                                        ) from error
        try:
            self._truncate_segments(offset)
        except OSError as error:
            # Memory may now hold fewer segments than the disk, or an untruncated tail: no
            # more writes or fsyncs until a restart recovers the directory (as Kafka takes a
            # log directory offline on any I/O error). Flush tickets and cleaner passes
            # begun before this see a new generation and drop their results.
            self._flush.drop_tail(self._segments.log_end_offset)
            self._flush.note_directory_change()
            self._health.mark_offline(f"truncation to offset {offset}", error)
            raise self._health.offline_error() from error
        end_offset = self._segments.log_end_offset
        self._flush.drop_tail(end_offset)
        self._segments.set_log_start_offset(min(self._segments.log_start_offset, end_offset))
        self._epoch_cache.truncate_from_end(end_offset)
        self._segments.check_invariants(self._flush.flushed_offset)
        return end_offset

    def _truncate_segments(self, offset: int) -> None:
        deleted = False
        while len(self._segments.view) > 1 and self._segments.active.base_offset >= offset:
            self._segments.drop_active().delete()
            deleted = True
        self._segments.active.truncate_to(offset)
        if deleted:
            fsync_directory(self._directory)

    def _start_after_truncation(self, offset: int) -> int:
        """The log start once ``truncate_to(offset)`` removed the batch holding ``offset``:
        that batch's base offset when it also holds the current start (a start inside a
        batch, set by DeleteRecords), else the current start."""
        log_start_offset = self._segments.log_start_offset
        found = self._segments.view[self._segments.slot(offset)].find_batch(offset)
        if found is None:
            return log_start_offset
        return min(log_start_offset, found[1].base_offset)

    def reset_to(self, offset: int, index_interval_bytes: int) -> None:
        """``PartitionLog.reset_to``: delete every batch and restart the log empty at
        ``offset``. The log-start checkpoint is written first (a failure leaves the log as
        it was), then memory switches to the new segment, then the old segments are
        unlinked (a failure is logged: the next open deletes what is left) and the
        directory fsynced (a failure takes the log offline)."""
        self._health.check_writable()  # an offline log is neither modified nor fsynced again
        namesake = next((s for s in self._segments.view if s.base_offset == offset), None)
        created = None
        try:
            if namesake is None:  # create first, so a failure leaves the log as it was
                self._segments.remove_stray_namesake(offset)
                created = Segment.create(self._directory, offset, index_interval_bytes)
            self._retention.write_checkpoint(offset)
        except BaseException as error:
            if created is not None:
                with contextlib.suppress(OSError):
                    created.delete()
            if isinstance(error, OSError):  # the log is as it was: the caller may retry
                raise KafkaStorageError(f"partition {self._directory.name}: cannot restart "
                                        f"the log at {offset}: {describe_os_error(error)}"
                                        ) from error
            raise
        if namesake is None:
            assert created is not None
            new_segment = created
        else:
            namesake.truncate_to(offset)  # empties it (fsynced) and reopens it for appends
            new_segment = namesake
        # Memory first: whatever fails below, the log is the new empty segment at ``offset``.
        old_segments = self._segments.restart(new_segment, offset)
        self._flush.restart_at(offset)
        self._unlink_replaced(old_segments, offset)
        try:
            fsync_directory(self._directory)
        except OSError as error:  # not raised: memory is consistent, the caller follows it
            self._health.mark_offline(f"directory fsync after restarting the log at {offset}",
                                      error)
        else:
            self._flush.note_directory_synced()
        try:
            self._epoch_cache.clear()
        except OSError as error:  # stale entries are trimmed to the log on the next open
            logger.warning("%s: cannot rewrite the leader-epoch checkpoint after restarting "
                           "the log at %d (%s)", self._directory, offset,
                           describe_os_error(error))
        self._segments.check_invariants(self._flush.flushed_offset)

    def _unlink_replaced(self, old_segments: list[Segment], offset: int) -> None:
        """Unlink the segments ``reset_to`` replaced, oldest first; stop at the first
        failure and close the rest. The next open deletes what stays: segments below the
        checkpointed start ``offset`` and any after the new empty segment (the gap check
        in ``log_recovery``). Logged, not raised: memory already holds only the new
        segment."""
        for slot, segment in enumerate(old_segments):
            try:
                segment.delete()
            except OSError as error:
                logger.warning("%s: cannot delete segment %d after restarting the log at %d"
                               " (%s); it and the %d after it stay on disk until the next "
                               "open deletes them", self._directory, segment.base_offset,
                               offset, describe_os_error(error), len(old_segments) - slot - 1)
                for rest in old_segments[slot:]:
                    with contextlib.suppress(OSError):
                        rest.close()
                return
