"""PartitionLog: the on-disk log of one partition, as a list of segments.

Plain synchronous code. The owner (the partition's trio task) calls every method from one
thread; the only thing that may run elsewhere is ``FlushTicket.run``, which touches nothing
but its own dup'd fds. This split is what lets fsync run in a worker thread while appends
continue (group commit)::

    ticket = log.begin_flush()                            # owner thread, cheap
    if ticket is not None:
        await trio.to_thread.run_sync(ticket.run)         # blocking fsyncs
        log.complete_flush(ticket)                        # owner thread: advance flushed_offset

Offsets, named as redpanda does so nobody has to guess:
``log_start_offset <= log_end_offset``; ``flushed_offset <= log_end_offset``: every offset
below ``flushed_offset`` is on disk; ``log_end_offset`` is the next offset to assign (Kafka's
LEO, redpanda's dirty offset + 1). The high watermark is the caller's business: pass it as
``max_offset`` to ``read``.

The log's duties live in modules beside this one, each a collaborator ``PartitionLog`` owns
or plain functions it calls: ``log_recovery`` (opening after a crash), ``log_segments``
(the segment list and start offset in memory), ``log_flush`` (group commit),
``log_health`` (storage failures, offline), ``log_read`` (Fetch, ListOffsets by time),
``log_retention`` (moving the start up: retention, DeleteRecords), ``log_truncation``
(cutting the end: a follower's truncation and reset), ``log_swap`` (compaction swaps),
``log_start_checkpoint`` (the durable start) and ``log_config`` (the topic settings). This
module keeps the append/roll core and the public API everyone else calls.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from raftlog.metrics.recorders import Counter
from raftlog.partition.batch import (
    BatchHeader,
    assign_offsets,
    parse_header,
    validate_batches,
)
from raftlog.partition.epoch_cache import LeaderEpochCache
from raftlog.partition.errors import RecordTooLargeError, UnexpectedOffsetError
from raftlog.partition.log_config import CREATE_TIME, LOG_APPEND_TIME, LogConfig
from raftlog.partition.log_flush import FlushState, FlushTicket
from raftlog.partition.log_health import KafkaStorageError, StorageHealth, describe_os_error
from raftlog.partition.log_read import (
    LogRead,
    find_max_timestamp,
    find_offset_by_timestamp,
    read_batches,
)
from raftlog.partition.log_recovery import recover_log
from raftlog.partition.log_retention import LogRetention
from raftlog.partition.log_segments import SegmentList
from raftlog.partition.log_swap import install_swap, stage_swap, swap_slot
from raftlog.partition.log_truncation import LogTruncation
from raftlog.partition.log_verify import LogVerifier
from raftlog.partition.segment import Segment
from raftlog.partition.segment_files import FileSlice
from raftlog.partition.segment_timestamps import TimestampAndOffset

__all__ = ["CREATE_TIME", "LOG_APPEND_TIME", "AppendInfo", "FileSlice", "FlushTicket",
           "KafkaStorageError", "LogConfig", "LogRead", "PartitionLog", "describe_os_error"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """What an append did, for the Produce response and the HW/flush bookkeeping."""

    base_offset: int
    last_offset: int
    max_timestamp: int
    log_append_time_ms: int  # -1 unless the topic uses LogAppendTime
    record_count: int
    size_bytes: int


class PartitionLog:
    """An append-only log of record batches, split into segments; the last one is active.

    Not thread-safe (see the module docstring). Invariants (``SegmentList``): segments are
    sorted by base offset and contiguous; only the active segment is unsealed;
    ``log_start_offset <= log_end_offset`` and ``flushed_offset <= log_end_offset``.
    """

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        segments: list[Segment],
        log_start_offset: int,
        epoch_cache: LeaderEpochCache | None = None,
        deleted_segments: Counter | None = None,
        corrupt_batches: Counter | None = None,
    ) -> None:
        self.directory = directory
        # CRC checks before reads, bad batches found (``log_verify``).
        self.verifier = LogVerifier(directory.name, corrupt_batches)
        self.config = config
        self._segments = SegmentList(directory, segments, log_start_offset)
        self._epoch_cache = LeaderEpochCache(None) if epoch_cache is None else epoch_cache
        self._flush = FlushState(log_start_offset)
        self._health = StorageHealth(directory.name, self._flush)
        self._retention = LogRetention(directory, self._segments, self._epoch_cache,
                                       self._flush, self._health, deleted_segments)
        self._truncation = LogTruncation(directory, self._segments, self._epoch_cache,
                                         self._flush, self._health, self._retention)
        self._closed = False
        # The error of the append that failed last, while appends keep failing (a full disk).
        self._write_failure: str | None = None
        # Transactions: called with (bytes, stored headers, segment base offset) after every
        # successful write, leader or follower (``Partition`` feeds its ``TxnIndex``).
        self.append_listener: Callable[[bytes | bytearray, Sequence[BatchHeader], int],
                                       None] | None = None

    @classmethod
    def open(cls, directory: Path, config: LogConfig, now_ms: int, *,
             deleted_segments: Counter | None = None,
             corrupt_batches: Counter | None = None) -> PartitionLog:
        """Open (or create) the log in ``directory`` and recover it after a crash
        (``log_recovery``). ``deleted_segments`` counts the segments retention and log-start
        moves delete, ``corrupt_batches`` the bad batches found (the owner's metrics).

        Blocking: scans and CRC-checks the active segment, truncates a torn tail, then fsyncs
        every segment and the directory so that ``flushed_offset == log_end_offset``.
        """
        recovered = recover_log(directory, config, now_ms)
        log = cls(directory, config, recovered.segments, recovered.log_start_offset,
                  recovered.epoch_cache, deleted_segments, corrupt_batches)
        ticket = log.begin_flush()
        assert ticket is not None, "a freshly opened log has never been synced"
        ticket.run()
        log.complete_flush(ticket)
        log._check_invariants()
        return log

    @property
    def epoch_cache(self) -> LeaderEpochCache:
        """The leader-epoch cache (shared with retention and truncation, which trim it)."""
        return self._epoch_cache

    # --- offsets and sizes -----------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._segments.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._segments.log_end_offset

    @property
    def flushed_offset(self) -> int:
        return self._flush.flushed_offset

    @property
    def unflushed_messages(self) -> int:
        """Offsets appended but not yet covered by a completed flush."""
        return self.log_end_offset - self._flush.flushed_offset

    @property
    def size_bytes(self) -> int:
        """Bytes of every segment's data (memory only: no stat)."""
        return sum(segment.size_bytes for segment in self._segments.view)

    @property
    def segment_count(self) -> int:
        return len(self._segments.view)

    @property
    def segment_base_offsets(self) -> list[int]:
        """Visible for testing."""
        return [segment.base_offset for segment in self._segments.view]

    @property
    def _active(self) -> Segment:
        return self._segments.active

    @property
    def segments(self) -> list[Segment]:
        """The segments, oldest first (a copy; the last one is active). For the cleaner and
        the transaction index, which only read them."""
        return list(self._segments.view)

    @property
    def generation(self) -> int:
        """Moves whenever a truncation or reset replaces the log's tail."""
        return self._flush.generation

    # --- aborted-transaction index files ---------------------------------------------------

    def append_txn_index(self, segment_base: int, data: bytes) -> None:
        """Append ``.txnindex`` entries to the segment starting at ``segment_base`` (fsynced
        by the next flush ticket, before the segment's log data). A failed write removes the
        file, so the next open rebuilds it from the log; it is logged, not raised: the ABORT
        marker is in the log and the in-memory index has the entry."""
        for segment in self._segments.view:
            if segment.base_offset == segment_base:
                try:
                    segment.append_txn_index(data)
                except OSError as error:
                    logger.warning("%s: cannot append to %s (%s); it is rebuilt on the next "
                                   "open", self.name, segment.txn_index_path,
                                   describe_os_error(error))
                return

    # --- compaction ------------------------------------------------------------------------

    def replace_segments(self, old: Sequence[Segment], cleaned: Segment) -> bool:
        """Swap the consecutive sealed segments ``old`` for ``cleaned``, their compacted copy
        (built by the cleaner with ``file_suffix=CLEANED_SUFFIX``, sealed and fsynced, same
        base offset as ``old[0]``, ending where ``old[-1]`` ends). Blocking and crash-safe
        (``log_swap``): ``stage_swap`` renames ``cleaned``'s files to ``.swap`` (the commit
        point), memory switches, ``install_swap`` unlinks ``old`` and renames the ``.swap``
        files into place; from the commit point on, recovery completes an interrupted swap.

        False (nothing changed, ``cleaned`` deleted) when ``old`` is no longer part of the
        log as it was (retention, truncation or another swap got there first). Readers
        holding FileSlices keep reading the old files through their own fds.
        """
        assert not self._closed and old and cleaned.sealed
        if self._health.offline_reason is not None:  # no renames or fsyncs in a broken dir
            cleaned.delete()
            return False
        first = swap_slot(self._segments.view, old, cleaned)
        if first is None:
            cleaned.delete()
            return False
        stage_swap(self.directory, cleaned)  # OSError: not committed, the old segments stand
        # Committed: the log is now ``cleaned`` in place of ``old``, whatever happens next.
        self._segments.splice(first, len(old), cleaned)
        try:
            install_swap(self.directory, old, cleaned)
        except OSError as error:  # the next open completes the swap (log_swap.finish_swaps)
            self._health.mark_offline(f"compaction swap at offset {cleaned.base_offset}", error)
            raise
        self._flush.note_directory_change()
        self._check_invariants()
        return True

    # --- append ----------------------------------------------------------------------------

    def append(
        self,
        records: bytes | bytearray | memoryview,
        *,
        leader_epoch: int,
        now_ms: int,
        allow_control: bool = False,
        validated: Sequence[BatchHeader] | None = None,
    ) -> AppendInfo:
        """Validate client batches, assign offsets and write them (not fsynced: see flush).

        ``validated``: the headers ``validate_batches`` already returned for this very buffer
        (the produce handler validates once to check producer state), so the CRCs are not
        computed twice.

        Raises CorruptRecordError, InvalidRecordError or RecordTooLargeError and then writes
        nothing; KafkaStorageError when the disk refuses the write (the log is left ending
        with its last whole batch, see ``_roll_and_write``) or the log is offline.
        """
        assert not self._closed
        headers = (list(validated) if validated is not None
                   else validate_batches(records, allow_control=allow_control))
        self._check_batch_sizes(headers)
        self._health.check_writable()
        buf = bytearray(records)
        base_offset = self.log_end_offset
        append_time_ms = now_ms if self.config.message_timestamp_type == LOG_APPEND_TIME else None
        next_offset = assign_offsets(buf, headers, base_offset, leader_epoch, append_time_ms)
        written = _reparse_headers(buf, headers, base_offset)
        self._roll_and_write(buf, written, next_offset - 1, now_ms)
        assert self.log_end_offset == next_offset, "every assigned offset must be in the log"
        return AppendInfo(
            base_offset=base_offset,
            last_offset=next_offset - 1,
            max_timestamp=max(header.max_timestamp for header in written),
            log_append_time_ms=-1 if append_time_ms is None else append_time_ms,
            record_count=next_offset - base_offset,
            size_bytes=len(buf),
        )

    def append_replicated(
        self, records: bytes | bytearray | memoryview, *, now_ms: int
    ) -> AppendInfo:
        """Append batches exactly as the leader wrote them (a follower's append): offsets,
        partitionLeaderEpoch and timestamps are kept, control batches are allowed.

        Checks every header and CRC, that the first batch starts at or after
        ``log_end_offset`` and that offsets increase (gaps are a compacted leader's).
        Raises CorruptRecordError, InvalidRecordError, UnexpectedOffsetError or
        KafkaStorageError and then writes nothing. Not fsynced: see flush.
        """
        assert not self._closed
        headers = validate_batches(records, allow_control=True, stored=True)
        self._health.check_writable()
        expected_offset = self.log_end_offset
        for header in headers:
            # A compacted leader's log has gaps (removed batches), so a batch may start past
            # the expected offset; never before it (that would overlap what is here).
            if header.base_offset < expected_offset:
                raise UnexpectedOffsetError(
                    f"replicated batch at offset {header.base_offset}, expected at least "
                    f"{expected_offset} (log end offset {self.log_end_offset})"
                )
            expected_offset = header.next_offset
        base_offset = self.log_end_offset
        self._roll_and_write(bytes(records), headers, expected_offset - 1, now_ms)
        assert self.log_end_offset == expected_offset
        return AppendInfo(
            base_offset=base_offset,
            last_offset=expected_offset - 1,
            max_timestamp=max(header.max_timestamp for header in headers),
            log_append_time_ms=-1,
            record_count=expected_offset - base_offset,
            size_bytes=len(records),
        )

    def _roll_and_write(
        self, buf: bytes | bytearray, headers: Sequence[BatchHeader], last_offset: int,
        now_ms: int,
    ) -> None:
        """Roll if needed, then write. An OSError from the disk (ENOSPC, EDQUOT, EFBIG, EIO)
        in the segment write, a roll's index writes or the epoch checkpoint leaves the log as
        it was and becomes a KafkaStorageError: logged once as an ERROR while writes keep
        failing. If the log could not be restored (a partial write that could not be cut
        off), it goes offline."""
        try:
            self._maybe_roll(len(buf), last_offset, now_ms)
            self._write_batches(buf, headers, now_ms)
        except OSError as error:
            raise self._append_failed(error, len(buf)) from error
        if self._write_failure is not None:
            logger.info("partition %s: appends succeed again (the last failure was: %s)",
                        self.name, self._write_failure)
            self._write_failure = None

    def _append_failed(self, error: OSError, size_bytes: int) -> KafkaStorageError:
        described = describe_os_error(error)
        torn = self._active.torn
        if torn is not None:
            self._health.mark_offline(f"append at offset {self.log_end_offset}", error,
                                      detail=torn)
        reason = self._health.offline_reason
        if reason is not None:
            return KafkaStorageError(f"partition {self.name} is offline: {reason}")
        if self._write_failure is None:
            logger.error(
                "partition %s: cannot append %d bytes at offset %d: %s; nothing of it is in "
                "the log, which still ends with its last whole batch; appends are refused "
                "with KAFKA_STORAGE_ERROR until the disk takes them again",
                self.name, size_bytes, self.log_end_offset, described,
            )
        else:
            logger.debug("partition %s: append failed again: %s", self.name, described)
        self._write_failure = described
        return KafkaStorageError(f"partition {self.name}: cannot write to disk: {described}")

    def _write_batches(
        self, buf: bytes | bytearray, headers: Sequence[BatchHeader], now_ms: int
    ) -> None:
        """Write batches whose headers are final at the log end. New leader epochs are
        recorded in the epoch cache first (Kafka's order), and undone if the write fails."""
        try:
            for header in headers:
                if header.partition_leader_epoch >= 0:
                    self.epoch_cache.assign(header.partition_leader_epoch, header.base_offset)
            self._active.append(buf, headers, now_ms)
        except BaseException:
            # In memory this cannot fail; if rewriting the checkpoint does, the file is at
            # worst ahead of the log, which opening the log trims.
            with contextlib.suppress(OSError):
                self.epoch_cache.truncate_from_end(self.log_end_offset)
            raise
        self._flush.note_append(now_ms)
        if self.append_listener is not None:
            self.append_listener(buf, headers, self._active.base_offset)
        self._check_invariants()

    # --- storage failures (``log_health``) ----------------------------------------------------

    @property
    def name(self) -> str:
        """``<topic>-<partition>``: the directory name."""
        return self.directory.name

    @property
    def offline_reason(self) -> str | None:
        """Why the log takes no more appends or fsyncs until a restart, or None."""
        return self._health.offline_reason

    def mark_offline(self, operation: str, error: OSError, *, detail: str | None = None
                     ) -> None:
        """Take the log offline after a failure that may have left the disk differing from
        what the log knows; see ``StorageHealth.mark_offline``."""
        self._health.mark_offline(operation, error, detail=detail)

    # --- leader epochs ---------------------------------------------------------------------

    @property
    def latest_epoch(self) -> int:
        """The newest leader epoch in the epoch cache, or -1."""
        return self.epoch_cache.latest_epoch

    def assign_leader_epoch(self, epoch: int) -> None:
        """A new leader's first act: its epoch starts at the current log end offset."""
        self.epoch_cache.assign(epoch, self.log_end_offset)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(epoch, end offset) for OffsetForLeaderEpoch; (-1, -1) when unknown."""
        return self.epoch_cache.end_offset_for(epoch, self.log_end_offset)

    def _check_batch_sizes(self, headers: Sequence[BatchHeader]) -> None:
        for header in headers:
            if header.size_bytes > self.config.max_message_bytes:
                raise RecordTooLargeError(
                    f"batch of {header.size_bytes} bytes exceeds max.message.bytes "
                    f"{self.config.max_message_bytes}"
                )

    def _maybe_roll(self, incoming_bytes: int, last_offset: int, now_ms: int) -> None:
        if self._active.should_roll(
            incoming_bytes=incoming_bytes,
            last_offset=last_offset,
            now_ms=now_ms,
            segment_bytes=self.config.segment_bytes,
            segment_ms=self.config.segment_ms,
        ):
            self._roll()

    def _roll(self) -> None:
        """Seal the active segment (blocking: fsyncs its index files) and start a new one.
        The new file is created first so that a failure leaves the log as it was."""
        self._segments.remove_stray_namesake(self.log_end_offset)
        new_segment = Segment.create(
            self.directory, self.log_end_offset, self.config.index_interval_bytes
        )
        try:
            self._active.seal()
        except BaseException as error:
            try:
                new_segment.delete()
            except OSError as undo_error:
                # A stray empty segment would make every later roll fail on O_EXCL.
                if isinstance(error, OSError):
                    self._health.mark_offline(
                        f"roll at offset {self.log_end_offset}", error,
                        detail=f"removing the new segment failed too: {undo_error}")
            raise
        self._segments.roll(new_segment)
        self._flush.note_directory_change()

    # --- flush (group commit, ``log_flush``) ------------------------------------------------

    def needs_flush(self, now_ms: int) -> bool:
        """Whether the flush policy wants a flush of data not yet in any ticket:
        always when ``flush_messages`` is None, else once that many messages are waiting
        or the oldest has waited ``flush_ms``."""
        return self._flush.needs_flush(self.log_end_offset, now_ms,
                                       self.config.flush_messages, self.config.flush_ms)

    def begin_flush(self) -> FlushTicket | None:
        """Capture the fsync work for everything written so far; None if there is none (or
        the log is offline). Raises OSError (e.g. EMFILE) having captured nothing."""
        if self._health.offline_reason is not None:
            return None  # never fsync again after a failure: see mark_offline
        return self._flush.begin(self.directory, self._segments.view, self.log_end_offset)

    def complete_flush(self, ticket: FlushTicket) -> None:
        """Record a ticket's successful ``run``: advance ``flushed_offset`` to its target."""
        assert ticket.synced, "complete_flush needs a ticket whose run() succeeded"
        if self._health.offline_reason is not None:
            # The log went offline: nothing more counts as flushed until a restart recovers
            # it. (A truncation since begin_flush makes the ticket stale too: FlushState.)
            return
        self._flush.complete(ticket, self._segments.view, self.log_end_offset)

    # --- reads (``log_read``) -----------------------------------------------------------------

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        min_one_batch: bool = True,
    ) -> LogRead:
        """Whole batches starting with the one that contains ``offset``, from a single
        segment, within ``max_bytes`` (KIP-74 aside), before ``max_offset`` (high watermark
        / LSO): see ``log_read.read_batches``. Never a batch whose CRC fails
        (``log_verify``: cut before it, or CorruptLogError when it comes first).

        Raises OffsetOutOfRangeError outside [log_start_offset, log_end_offset].
        """
        self._segments.check_offset_in_range(offset)
        if offset == self.log_end_offset:
            return LogRead([])
        slot = self._segments.slot(offset)
        return read_batches(self._segments.view[slot:], offset, max_bytes, max_offset=max_offset,
                            min_one_batch=min_one_batch, check=self.verifier.check_slice)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of :meth:`find_offset_by_timestamp`'s answer, or None."""
        found = self.find_offset_by_timestamp(timestamp_ms)
        return None if found is None else (found.offset, found.timestamp_ms)

    def find_offset_by_timestamp(self, timestamp_ms: int) -> TimestampAndOffset | None:
        """ListOffsets by timestamp (KIP-79): the first record, at or after log_start_offset,
        whose timestamp is >= ``timestamp_ms``, or None (``log_read``)."""
        return find_offset_by_timestamp(self._segments.view, timestamp_ms,
                                        self.log_start_offset)

    def find_max_timestamp(self) -> TimestampAndOffset | None:
        """ListOffsets MAX_TIMESTAMP (-3, KIP-734): the earliest record carrying the largest
        timestamp in the log, or None for an empty log; not bounded by log_start_offset, as
        in Kafka (``log_read.find_max_timestamp``)."""
        return find_max_timestamp(self._segments.view)

    # --- retention and truncation (``log_retention``, ``log_truncation``) ------------------

    def enforce_retention(self, now_ms: int, high_watermark: int | None = None) -> int:
        """Delete the oldest sealed segments that are past ``retention_ms``, beyond
        ``retention_bytes`` or below log_start_offset, never the active one nor one holding
        an offset at or above ``high_watermark`` (None: no bound, a standalone log in
        tests); advances and checkpoints log_start_offset first. Returns the segments
        deleted (0 while the log is offline). See ``LogRetention.enforce``."""
        assert not self._closed
        return self._retention.enforce(self.config, now_ms, high_watermark)

    def advance_log_start_offset(self, offset: int) -> bool:
        """Move log_start_offset up to ``offset`` (DeleteRecords on the leader, the leader's
        log start on a follower: Kafka's maybeIncrementLogStartOffset), checkpointing it
        first, and unlink the sealed segments wholly below it. Never moves it back: False
        when ``offset`` is not above it. Raises OffsetOutOfRangeError past the log end,
        KafkaStorageError while the log is offline, OSError when the checkpoint cannot be
        written (then nothing changed). See ``LogRetention.advance_start``."""
        assert not self._closed
        return self._retention.advance_start(offset)

    def truncate_to(self, offset: int) -> int:
        """Remove every offset >= ``offset`` (for replication); returns the new log end offset.

        Whole batches go: if ``offset`` is inside a batch, that batch is removed too, so the
        new end may be lower than ``offset`` (as in Kafka). Blocking: fsyncs the truncated
        file and the directory. In-flight flush tickets no longer advance flushed_offset.
        An I/O error takes the log offline (KafkaStorageError).
        """
        assert not self._closed
        try:
            return self._truncation.truncate_to(offset)
        finally:
            self.verifier.forget_from(self.log_end_offset)

    def reset_to(self, offset: int) -> None:
        """Delete every batch and restart the log empty at ``offset`` (Kafka's
        truncateFullyAndStartAt: a follower whose log ends below the leader's log start).
        Blocking: the log-start checkpoint is written first (a failure leaves the log as it
        was), then memory switches to the new segment, then the old segments are unlinked
        (a failure is logged: the next open deletes what is left) and the directory fsynced
        (a failure takes the log offline). KafkaStorageError while the log is offline."""
        assert not self._closed and offset >= 0
        self._truncation.reset_to(offset, self.config.index_interval_bytes)
        self.verifier.forget_from(0)  # every old batch is gone

    def close(self) -> None:
        """Close every fd. Does not fsync: flush first if the data must be durable."""
        for segment in self._segments.view:
            segment.close()
        self._closed = True

    def _check_invariants(self) -> None:
        self._segments.check_invariants(self._flush.flushed_offset)


def _reparse_headers(
    buf: bytearray, headers: Sequence[BatchHeader], base_offset: int
) -> list[BatchHeader]:
    """Headers as written (after assign_offsets), with pair assertions on the rewrite."""
    written: list[BatchHeader] = []
    position = 0
    expected_offset = base_offset
    for original in headers:
        header = parse_header(buf, position)
        assert header.base_offset == expected_offset and header.size_bytes == original.size_bytes
        written.append(header)
        position += header.size_bytes
        expected_offset = header.next_offset
    return written
