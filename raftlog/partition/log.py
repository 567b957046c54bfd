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
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from raftlog.partition.batch import (
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    assign_offsets,
    parse_header,
    validate_batches,
)
from raftlog.partition.epoch_cache import (
    LEADER_EPOCH_CHECKPOINT,
    LeaderEpochCache,
    entries_from_batches,
)
from raftlog.partition.errors import (
    OffsetOutOfRangeError,
    PartitionLogError,
    RecordTooLargeError,
    UnexpectedOffsetError,
)
from raftlog.partition.files import (
    TMP_SUFFIX,
    fsync_directory,
    open_directory,
    write_all,
)
from raftlog.partition.index import INT32_MAX
from raftlog.partition.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SEGMENT_SUFFIXES,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    FileSlice,
    Segment,
    TimestampAndOffset,
    parse_base_offset,
    segment_file_name,
)

__all__ = [
    "CREATE_TIME",
    "LOG_APPEND_TIME",
    "AppendInfo",
    "FileSlice",
    "FlushTicket",
    "KafkaStorageError",
    "LogConfig",
    "LogRead",
    "PartitionLog",
    "describe_os_error",
]

logger = logging.getLogger(__name__)

CREATE_TIME = "CreateTime"
LOG_APPEND_TIME = "LogAppendTime"
_DAY_MS = 24 * 60 * 60 * 1000
LOG_START_OFFSET_CHECKPOINT = "log-start-offset"
_CHECKPOINT_VERSION = "0"
# Log compaction builds a replacement segment as ``<files>.cleaned``, renames it to ``.swap``
# (the commit point: a ``.log.swap`` means "this replaces the segments it covers"), then
# over the old files. See ``PartitionLog.replace_segments`` and ``_finish_swaps``.
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
# Tests set this to raise at a named step of the swap, to simulate a crash there.
swap_crash_hook: Callable[[str], None] | None = None


def _swap_step(name: str) -> None:
    if swap_crash_hook is not None:
        swap_crash_hook(name)


# --- configuration ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Per-topic log settings: Kafka's names in snake_case, units last.

    ``flush_messages=None`` means fsync before every acknowledgement (raftlog's default, and
    stricter than Kafka's, which leaves flushing to the OS).
    """

    segment_bytes: int = 1 << 30  # segment.bytes / log.segment.bytes
    segment_ms: int = 7 * _DAY_MS  # segment.ms / log.roll.ms
    retention_ms: int = 7 * _DAY_MS  # retention.ms; -1 = unlimited
    retention_bytes: int = -1  # retention.bytes; -1 = unlimited
    index_interval_bytes: int = 4096  # index.interval.bytes
    flush_messages: int | None = None  # flush.messages
    flush_ms: int | None = None  # flush.ms
    # message.timestamp.type; a plain str because topic configs arrive as strings.
    message_timestamp_type: str = CREATE_TIME
    max_message_bytes: int = 1048588  # max.message.bytes: the largest batch accepted
    # cleanup.policy: "delete", "compact" or "compact,delete". Time and size retention apply
    # only with "delete" (Kafka), compaction only with "compact" (``cleaner_service``).
    cleanup_policy: str = "delete"
    delete_retention_ms: int = _DAY_MS  # delete.retention.ms: how long tombstones stay
    min_cleanable_dirty_ratio: float = 0.5  # min.cleanable.dirty.ratio
    min_compaction_lag_ms: int = 0  # min.compaction.lag.ms

    @property
    def deletes(self) -> bool:
        """Whether time/size retention deletes segments (``delete`` in cleanup.policy)."""
        return "delete" in {p.strip() for p in self.cleanup_policy.split(",")}

    @property
    def compacts(self) -> bool:
        """Whether the cleaner compacts this log (``compact`` in cleanup.policy)."""
        return "compact" in {p.strip() for p in self.cleanup_policy.split(",")}

    def __post_init__(self) -> None:
        # Positions in the offset index are int32, so a segment must fit in one.
        _require(RECORD_BATCH_OVERHEAD <= self.segment_bytes <= INT32_MAX, "segment_bytes")
        _require(self.segment_ms > 0, "segment_ms")
        _require(self.retention_ms >= -1, "retention_ms")
        _require(self.retention_bytes >= -1, "retention_bytes")
        _require(self.index_interval_bytes >= 0, "index_interval_bytes")
        _require(self.flush_messages is None or self.flush_messages >= 1, "flush_messages")
        _require(self.flush_ms is None or self.flush_ms >= 0, "flush_ms")
        timestamp_types = (CREATE_TIME, LOG_APPEND_TIME)
        _require(self.message_timestamp_type in timestamp_types, "message_timestamp_type")
        _require(self.max_message_bytes >= RECORD_BATCH_OVERHEAD, "max_message_bytes")
        _require(self.delete_retention_ms >= 0, "delete_retention_ms")
        _require(0.0 <= self.min_cleanable_dirty_ratio <= 1.0, "min_cleanable_dirty_ratio")
        _require(self.min_compaction_lag_ms >= 0, "min_compaction_lag_ms")


def _require(condition: bool, name: str) -> None:
    if not condition:
        raise ValueError(f"invalid LogConfig.{name}")


class KafkaStorageError(PartitionLogError):
    """The disk refused a write (ENOSPC, EDQUOT, EFBIG, EIO...) or the log is offline after
    an earlier failure. Nothing of the refused append is in the log."""

    error_code = 56  # KAFKA_STORAGE_ERROR


def describe_os_error(error: OSError) -> str:
    """``[Errno 28] No space left on device (ENOSPC)``: the message and the errno's name."""
    name = errno.errorcode.get(error.errno, "?") if error.errno is not None else "?"
    return f"{error} ({name})"


# --- results -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """What an append did, for the Produce response and the HW/flush bookkeeping."""

    base_offset: int
    last_offset: int
    max_timestamp: int
    log_append_time_ms: int  # -1 unless the topic uses LogAppendTime
    record_count: int
    size_bytes: int


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


class FlushTicket:
    """fsync work captured by ``PartitionLog.begin_flush``.

    ``run`` does the blocking fsyncs on dup'd fds and closes them; it is safe in a worker
    thread while the owner keeps appending, rolling or deleting segments. If it raises, the
    data may be lost (the kernel may have dropped the dirty pages): treat it as fatal, do not
    retry, and do not call ``complete_flush``.
    """

    def __init__(
        self,
        *,
        target_offset: int,
        fds: list[int],
        segment_sizes: dict[int, int],
        generation: int,
        directory_version: int | None,
        txn_index_sizes: dict[int, int] | None = None,
    ) -> None:
        self.target_offset = target_offset
        self.segment_sizes = segment_sizes  # base offset -> bytes this ticket makes durable
        # base offset -> .txnindex bytes this ticket makes durable
        self.txn_index_sizes = {} if txn_index_sizes is None else txn_index_sizes
        self.generation = generation
        self.directory_version = directory_version
        self.synced = False
        self._fds = fds
        self._ran = False

    def run(self) -> None:
        assert not self._ran, "a ticket runs once"
        self._ran = True
        try:
            for fd in self._fds:
                os.fsync(fd)
            self.synced = True
        finally:
            self.close()

    def close(self) -> None:
        """Release the fds without syncing (for a ticket that will never run)."""
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)


# --- the log -----------------------------------------------------------------------------------


class PartitionLog:
    """An append-only log of record batches, split into segments; the last one is active.

    Not thread-safe (see the module docstring). Invariants: segments are sorted by base
    offset and contiguous; only the active segment is unsealed;
    ``log_start_offset <= log_end_offset`` and ``flushed_offset <= log_end_offset``.
    """

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        segments: list[Segment],
        log_start_offset: int,
        epoch_cache: LeaderEpochCache | None = None,
    ) -> None:
        assert segments, "a log always has an active segment"
        self.directory = directory
        self.config = config
        self._segments = segments
        self._log_start_offset = log_start_offset
        self.epoch_cache = LeaderEpochCache(None) if epoch_cache is None else epoch_cache
        self._flushed_offset = log_start_offset
        self._flush_target_offset = log_start_offset  # end offset of the latest ticket
        self._first_unflushed_ms: int | None = None  # append time of the oldest unticketed data
        self._generation = 0  # bumped by truncation: older flush tickets no longer apply
        self._directory_version = 1  # bumped when files are created, renamed or deleted
        self._directory_synced_version = 0
        self._closed = False
        # Why the log is offline (no appends, no fsyncs until a restart recovers it), or None.
        self._offline_reason: str | None = None
        # The error of the append that failed last, while appends keep failing (a full disk).
        self._write_failure: str | None = None
        # Transactions: called with (bytes, stored headers, segment base offset) after every
        # successful write, leader or follower (``Partition`` feeds its ``TxnIndex``).
        self.append_listener: Callable[[bytes | bytearray, Sequence[BatchHeader], int],
                                       None] | None = None

    # --- open ------------------------------------------------------------------------------

    @classmethod
    def open(cls, directory: Path, config: LogConfig, now_ms: int) -> PartitionLog:
        """Open (or create) the log in ``directory`` and recover it after a crash.

        Blocking: scans and CRC-checks the active segment, truncates a torn tail, then fsyncs
        every segment and the directory so that ``flushed_offset == log_end_offset``.
        """
        if not directory.is_dir():
            directory.mkdir(parents=True)
            fsync_directory(directory.parent)  # the new directory's name must survive a crash
        _finish_swaps(directory, config.index_interval_bytes)
        _remove_leftovers(directory)
        checkpoint = _read_checkpoint(directory)
        segments = _load_segments(directory, config, now_ms, checkpoint)
        restarted = bool(segments) and checkpoint is not None \
            and checkpoint > segments[-1].next_offset
        if restarted:
            assert checkpoint is not None
            segments = _restart_at_checkpoint(directory, segments, checkpoint, config)
        if not segments:
            first_offset = 0 if checkpoint is None else checkpoint
            segments = [Segment.create(directory, first_offset, config.index_interval_bytes)]
        log = cls(directory, config, segments, _start_offset(checkpoint, segments))
        log.epoch_cache = log._load_epoch_cache()
        if restarted:  # no batch is left: no epoch describes any offset (Kafka clears it)
            log.epoch_cache.clear()
        ticket = log.begin_flush()
        assert ticket is not None, "a freshly opened log has never been synced"
        ticket.run()
        log.complete_flush(ticket)
        log._check_invariants()
        return log

    def _load_epoch_cache(self) -> LeaderEpochCache:
        """The leader-epoch checkpoint, trimmed to the recovered log; rebuilt from the batch
        headers when it is missing or unreadable (e.g. a log written before epochs were
        cached). A crash can leave the checkpoint ahead of the log (it is written before the
        append it describes), never behind."""
        path = self.directory / LEADER_EPOCH_CHECKPOINT
        cache = LeaderEpochCache.load(path)
        if cache is None:
            cache = LeaderEpochCache(path)
            entries = entries_from_batches(self._batch_epochs())
            if entries:  # no file means no entries: a new log writes it on its first epoch
                cache.replace(entries)
                logger.info("%s: leader-epoch cache rebuilt from the log: %s",
                            self.directory, entries)
        cache.truncate_from_end(self.log_end_offset)
        cache.truncate_from_start(self._log_start_offset)
        return cache

    def _batch_epochs(self) -> list[tuple[int, int]]:
        """(partitionLeaderEpoch, base offset) of every batch, reading headers only."""
        return [
            (header.partition_leader_epoch, header.base_offset)
            for segment in self._segments
            for _, header in segment.iter_headers(0)
            if header.next_offset > self._log_start_offset
        ]

    # --- offsets and sizes -----------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._active.next_offset

    @property
    def flushed_offset(self) -> int:
        return self._flushed_offset

    @property
    def unflushed_messages(self) -> int:
        """Offsets appended but not yet covered by a completed flush."""
        return self.log_end_offset - self._flushed_offset

    @property
    def size_bytes(self) -> int:
        return sum(segment.size_bytes for segment in self._segments)

    @property
    def segment_base_offsets(self) -> list[int]:
        """Visible for testing."""
        return [segment.base_offset for segment in self._segments]

    @property
    def _active(self) -> Segment:
        return self._segments[-1]

    @property
    def segments(self) -> list[Segment]:
        """The segments, oldest first (a copy; the last one is active). For the cleaner and
        the transaction index, which only read them."""
        return list(self._segments)

    @property
    def generation(self) -> int:
        """Moves whenever a truncation or reset replaces the log's tail."""
        return self._generation

    # --- aborted-transaction index files ---------------------------------------------------

    def append_txn_index(self, segment_base: int, data: bytes) -> None:
        """Append ``.txnindex`` entries to the segment starting at ``segment_base`` (fsynced
        by the next flush ticket, before the segment's log data). A failed write removes the
        file, so the next open rebuilds it from the log; it is logged, not raised: the ABORT
        marker is in the log and the in-memory index has the entry."""
        for segment in self._segments:
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
        base offset as ``old[0]``, ending where ``old[-1]`` ends). Blocking and crash-safe:

        1. rename ``cleaned``'s index files to ``.swap``, fsync the directory; rename its
           ``.log`` to ``.log.swap``, fsync the directory: from here recovery completes the
           swap (``_finish_swaps``), before it the ``.cleaned``/``.swap`` files are discarded;
        2. unlink the files of ``old[1:]``;
        3. rename the ``.swap`` index files, then the ``.log.swap``, over ``old[0]``'s files;
           fsync the directory.

        False (nothing changed, ``cleaned`` deleted) when ``old`` is no longer part of the
        log as it was (retention, truncation or another swap got there first). Readers
        holding FileSlices keep reading the old files through their own fds.
        """
        assert not self._closed and old and cleaned.sealed
        if self._offline_reason is not None:  # no renames or fsyncs in a broken directory
            cleaned.delete()
            return False
        first = next((i for i, s in enumerate(self._segments) if s is old[0]), None)
        if first is None or self._segments[first:first + len(old)] != list(old) or \
                first + len(old) >= len(self._segments) or \
                not all(segment.sealed for segment in old) or \
                cleaned.base_offset != old[0].base_offset or \
                cleaned.next_offset != old[-1].next_offset:
            cleaned.delete()
            return False
        directory = self.directory
        try:
            _swap_step("rename-indexes-to-swap")
            for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
                path = cleaned.path_for(suffix)
                os.replace(path, path.with_name(path.name.removesuffix(CLEANED_SUFFIX)
                                                + SWAP_SUFFIX))
            fsync_directory(directory)
            _swap_step("rename-log-to-swap")
            os.replace(cleaned.log_path, directory / (
                segment_file_name(cleaned.base_offset, LOG_SUFFIX) + SWAP_SUFFIX))
            fsync_directory(directory)
        except OSError:  # not committed: the old segments stand; drop the new files
            cleaned.close()
            for suffix in SEGMENT_SUFFIXES:
                for extra in (CLEANED_SUFFIX, SWAP_SUFFIX):
                    with contextlib.suppress(OSError):
                        (directory / (segment_file_name(cleaned.base_offset, suffix)
                                      + extra)).unlink()
            raise
        cleaned.file_suffix = SWAP_SUFFIX
        # Committed: the log is now ``cleaned`` in place of ``old``, whatever happens next.
        self._segments[first:first + len(old)] = [cleaned]
        try:
            _swap_step("delete-old-segments")
            for segment in old[1:]:
                segment.delete()
            for segment in old[:1]:
                segment.close()
            _swap_step("rename-swap-over-old")
            _install_swap(directory, cleaned.base_offset)
            cleaned.file_suffix = ""
            _swap_step("fsync-directory")
            fsync_directory(directory)
        except OSError as error:  # the next open completes the swap (_finish_swaps)
            self.mark_offline(f"compaction swap at offset {cleaned.base_offset}", error)
            raise
        self._directory_version += 1
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
        self._check_writable()
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
        self._check_writable()
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
            self.mark_offline(f"append at offset {self.log_end_offset}", error, detail=torn)
        if self._offline_reason is not None:
            return KafkaStorageError(f"partition {self.name} is offline: {self._offline_reason}")
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
        if self._first_unflushed_ms is None:
            self._first_unflushed_ms = now_ms
        if self.append_listener is not None:
            self.append_listener(buf, headers, self._active.base_offset)
        self._check_invariants()

    # --- storage failures ------------------------------------------------------------------

    @property
    def name(self) -> str:
        """``<topic>-<partition>``: the directory name."""
        return self.directory.name

    @property
    def offline_reason(self) -> str | None:
        """Why the log takes no more appends or fsyncs until a restart, or None."""
        return self._offline_reason

    def mark_offline(self, operation: str, error: OSError, *, detail: str | None = None
                     ) -> None:
        """Take the log offline after a failure that may have left the disk differing from
        what the log knows (a failed fsync may have dropped dirty pages; a partial append
        could not be cut off). Appends raise KafkaStorageError and no fsync is attempted
        again (a retried fsync can succeed without the lost data); what is below the
        flushed offset stays readable. Opening the log again (a restart) runs recovery, which
        CRC-checks the tail and truncates anything torn. Logs one ERROR line."""
        if self._offline_reason is not None:
            return
        reason = f"{operation} failed: {describe_os_error(error)}"
        if detail:
            reason += f"; {detail}"
        self._offline_reason = reason
        logger.error(
            "partition %s: %s; the log is offline: appends are refused with "
            "KAFKA_STORAGE_ERROR until a restart recovers it; offsets below %d stay readable",
            self.name, reason, self._flushed_offset,
        )

    def _check_writable(self) -> None:
        if self._offline_reason is not None:
            raise KafkaStorageError(
                f"partition {self.name} is offline after an I/O error ({self._offline_reason});"
                " restart the node to recover it")

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
        self._remove_stray_namesake(self.log_end_offset)
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
                    self.mark_offline(f"roll at offset {self.log_end_offset}", error,
                                      detail=f"removing the new segment failed too: "
                                             f"{undo_error}")
            raise
        self._segments.append(new_segment)
        self._directory_version += 1

    def _remove_stray_namesake(self, base_offset: int) -> None:
        """Unlink a segment file named for ``base_offset`` that the log does not hold: the
        leftover of an unlink that failed in ``reset_to`` (logged there, not fatal). Left in
        place it would make ``Segment.create`` fail (O_EXCL) at every roll to this offset."""
        assert all(segment.base_offset != base_offset for segment in self._segments)
        stray = self.directory / segment_file_name(base_offset, LOG_SUFFIX)
        if stray.exists():
            logger.warning("%s: removing %s, a segment the log no longer holds, before "
                           "rolling to offset %d", self.directory, stray.name, base_offset)
            stray.unlink()

    # --- flush (group commit) --------------------------------------------------------------

    def needs_flush(self, now_ms: int) -> bool:
        """Whether the flush policy wants a flush of data not yet in any ticket:
        always when ``flush_messages`` is None, else once that many messages are waiting
        or the oldest has waited ``flush_ms``."""
        waiting_messages = self.log_end_offset - self._flush_target_offset
        if waiting_messages <= 0:
            return False
        if self.config.flush_messages is None:
            return True
        if waiting_messages >= self.config.flush_messages:
            return True
        first_ms = self._first_unflushed_ms
        flush_ms = self.config.flush_ms
        return flush_ms is not None and first_ms is not None and now_ms - first_ms >= flush_ms

    def begin_flush(self) -> FlushTicket | None:
        """Capture the fsync work for everything written so far; None if there is none (or
        the log is offline). Raises OSError (e.g. EMFILE) having captured nothing."""
        if self._offline_reason is not None:
            return None  # never fsync again after a failure: see mark_offline
        dirty = [s for s in self._segments if s.size_bytes > s.flushed_size_bytes]
        txn_dirty = [s for s in self._segments
                     if s.txn_index_written_bytes > s.txn_index_synced_bytes]
        directory_dirty = self._directory_version != self._directory_synced_version
        if not dirty and not directory_dirty and not txn_dirty and \
                self._flushed_offset == self.log_end_offset:
            return None
        fds: list[int] = []
        txn_index_sizes: dict[int, int] = {}
        try:
            for segment in txn_dirty:  # before the log: an ABORT marker never outlives its entry
                fd = segment.txn_index_sync_fd()
                if fd is not None:
                    fds.append(fd)
                txn_index_sizes[segment.base_offset] = segment.txn_index_written_bytes
            for segment in dirty:
                fds.append(segment.dup_fd())
            if directory_dirty:  # last: new files' data is synced before their names are
                fds.append(open_directory(self.directory))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        self._flush_target_offset = self.log_end_offset
        self._first_unflushed_ms = None
        return FlushTicket(
            target_offset=self.log_end_offset,
            fds=fds,
            segment_sizes={segment.base_offset: segment.size_bytes for segment in dirty},
            generation=self._generation,
            directory_version=self._directory_version if directory_dirty else None,
            txn_index_sizes=txn_index_sizes,
        )

    def complete_flush(self, ticket: FlushTicket) -> None:
        """Record a ticket's successful ``run``: advance ``flushed_offset`` to its target."""
        assert ticket.synced, "complete_flush needs a ticket whose run() succeeded"
        if ticket.generation != self._generation or self._offline_reason is not None:
            # A truncation since begin_flush (the ticket's target may not exist), or the log
            # went offline: nothing more counts as flushed until a restart recovers it.
            return
        assert ticket.target_offset <= self.log_end_offset
        self._flushed_offset = max(self._flushed_offset, ticket.target_offset)
        for segment in self._segments:
            synced_bytes = ticket.segment_sizes.get(segment.base_offset, 0)
            segment.flushed_size_bytes = max(segment.flushed_size_bytes, synced_bytes)
            txn_synced = ticket.txn_index_sizes.get(segment.base_offset, 0)
            segment.txn_index_synced_bytes = max(segment.txn_index_synced_bytes,
                                                 min(txn_synced, segment.txn_index_written_bytes))
        if ticket.directory_version is not None:
            self._directory_synced_version = max(
                self._directory_synced_version, ticket.directory_version
            )

    # --- reads -----------------------------------------------------------------------------

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        min_one_batch: bool = True,
    ) -> LogRead:
        """Whole batches starting with the one that contains ``offset`` (so the first base
        offset may be lower, as in Kafka), from a single segment, within ``max_bytes`` unless
        the first batch alone is larger and ``min_one_batch`` (KIP-74), stopping before any
        batch whose base offset is >= ``max_offset`` (high watermark / LSO).

        Raises OffsetOutOfRangeError outside [log_start_offset, log_end_offset].
        """
        self._check_offset_in_range(offset)
        if offset == self.log_end_offset:
            return LogRead([])
        slot = self._segment_slot(offset)
        # Compaction leaves gaps: an offset that was cleaned away reads from the next batch,
        # in a later segment if this one has nothing at or after it.
        for segment in self._segments[slot:]:
            if max_offset is not None and segment.base_offset >= max_offset:
                break
            start = max(offset, segment.base_offset)
            piece = segment.read(
                start, max_bytes, max_offset=max_offset, min_one_batch=min_one_batch
            )
            if piece is not None:
                return LogRead([piece])
            if segment.find_batch(start) is not None:
                break  # a batch is there but does not fit (max_bytes, max_offset)
        return LogRead([])

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of :meth:`find_offset_by_timestamp`'s answer, or None."""
        found = self.find_offset_by_timestamp(timestamp_ms)
        return None if found is None else (found.offset, found.timestamp_ms)

    def find_offset_by_timestamp(self, timestamp_ms: int) -> TimestampAndOffset | None:
        """ListOffsets by timestamp (KIP-79): the first record, at or after log_start_offset,
        whose timestamp is >= ``timestamp_ms``, with that record's own offset and timestamp
        (not its batch's). None when no record is that recent.

        Kafka searches only the first segment whose largest timestamp reaches the target;
        should every such record there lie below log_start_offset (DeleteRecords), this
        goes on to the next segment rather than answer nothing.
        """
        for segment in self._segments:
            if segment.max_timestamp_ms < timestamp_ms:
                continue
            found = segment.find_timestamp(timestamp_ms, self._log_start_offset)
            if found is not None:
                return found
        return None

    def find_max_timestamp(self) -> TimestampAndOffset | None:
        """ListOffsets MAX_TIMESTAMP (-3, KIP-734): the earliest record carrying the largest
        timestamp in the log, or None for an empty log. As in Kafka, the segment is the first
        one holding that timestamp and log_start_offset does not bound the answer.

        Kafka's UnifiedLog (MAX_TIMESTAMP branch) takes the segment with the largest
        maxTimestampSoFar and that segment's offsetOfMaxTimestamp without consulting
        logStartOffset; so after DeleteRecords moved the start into that segment, the answer
        may be an offset below log_start_offset, which a Fetch then refuses with
        OFFSET_OUT_OF_RANGE. Kept for compatibility (test_list_offsets_timestamp.py,
        test_max_timestamp_is_not_bounded_by_the_log_start)."""
        segment = max(self._segments, key=lambda candidate: candidate.max_timestamp_ms)
        return segment.find_max_timestamp()

    def _check_offset_in_range(self, offset: int) -> None:
        if not self._log_start_offset <= offset <= self.log_end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} outside [{self._log_start_offset}, {self.log_end_offset}]"
            )

    def _segment_slot(self, offset: int) -> int:
        slot = bisect_right(self._segments, offset, key=lambda segment: segment.base_offset) - 1
        assert slot >= 0, f"offset {offset} precedes the first segment"
        return slot

    # --- retention and truncation ----------------------------------------------------------

    def enforce_retention(self, now_ms: int, high_watermark: int | None = None) -> int:
        """Delete the oldest sealed segments that are past ``retention_ms`` (by their largest
        timestamp), beyond ``retention_bytes``, or below log_start_offset; never the active
        one, and never one holding an offset at or above ``high_watermark`` (Kafka's
        deletableSegments: ``upperBoundOffset = min(activeSegment.baseOffset, highWatermark)``),
        so the log start never passes the HW: data no other replica may have yet stays.
        ``None`` means no bound (a standalone log in tests). Advances and checkpoints
        log_start_offset. Returns the segments deleted (0 while the log is offline).

        As in Kafka, size retention deletes a segment only if the log stays at least
        ``retention_bytes`` big without it.

        Crash-safe in the same order as ``advance_log_start_offset``: the new start is
        checkpointed before memory moves and before any segment is unlinked.
        """
        assert not self._closed
        if self._offline_reason is not None:
            return 0
        count = self._deletable_segment_count(now_ms, high_watermark)
        if count == 0:
            return 0
        new_start = max(self._log_start_offset, self._segments[count].base_offset)
        if new_start > self._log_start_offset:
            # raises having changed nothing
            self._write_checkpoint(new_start, memory_may_follow=True)
            self._set_log_start_offset(new_start)
        self._delete_leading_segments(count, "by retention")
        self._check_invariants()
        return count

    def _deletable_segment_count(self, now_ms: int, high_watermark: int | None) -> int:
        # cleanup.policy=compact alone keeps every segment (the cleaner shrinks them instead).
        retention_ms = self.config.retention_ms if self.config.deletes else -1
        retention_bytes = self.config.retention_bytes if self.config.deletes else -1
        excess_bytes = self.size_bytes - retention_bytes
        count = 0
        for segment in self._segments[:-1]:
            if high_watermark is not None and segment.next_offset > high_watermark:
                break  # holds offsets the HW has not passed: followers may still need them
            below_start = segment.next_offset <= self._log_start_offset
            expired = retention_ms >= 0 and now_ms - segment.largest_timestamp_ms() > retention_ms
            oversize = retention_bytes >= 0 and excess_bytes - segment.size_bytes >= 0
            if not (below_start or expired or oversize):
                break  # Kafka deletes only a prefix of the log
            excess_bytes -= segment.size_bytes
            count += 1
        return count

    def advance_log_start_offset(self, offset: int) -> bool:
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
        assert not self._closed
        self._check_writable()
        if offset <= self._log_start_offset:
            return False
        if offset > self.log_end_offset:
            raise OffsetOutOfRangeError(
                f"log start offset {offset} is past the log end offset {self.log_end_offset}")
        self._write_checkpoint(offset, memory_may_follow=True)  # raises having changed nothing
        self._set_log_start_offset(offset)
        count = 0
        for segment in self._segments[:-1]:
            if segment.next_offset > offset:
                break
            count += 1
        self._delete_leading_segments(count, f"below the log start offset {offset}")
        self._check_invariants()
        return True

    def _set_log_start_offset(self, offset: int) -> None:
        """Move the start in memory and trim the epoch cache. A failed write of the trimmed
        ``leader-epoch-checkpoint`` is logged, not raised: the start is already durable, and
        a stale epoch file is harmless (``_load_epoch_cache`` trims it to the start)."""
        self._log_start_offset = offset
        try:
            self.epoch_cache.truncate_from_start(offset)
        except OSError as error:
            logger.warning("%s: cannot rewrite the leader-epoch checkpoint for the log start "
                           "offset %d (%s); the next open trims it", self.directory, offset,
                           describe_os_error(error))

    def _delete_leading_segments(self, count: int, why: str) -> None:
        """Take the first ``count`` segments (all below the checkpointed log start) out of
        the log and unlink them, oldest first, then fsync the directory once so the unlinks
        are durable even if no flush follows (an idle partition). Stops at the first failed
        delete, closing the rest: what stays on disk is then a contiguous prefix below the
        checkpointed start, which the next open deletes (``_load_segments``). A gap (an old
        segment left, a later one gone) would look like a torn log there. A failure is
        logged, not raised: the start has moved either way."""
        doomed = self._segments[:count]
        if not doomed:
            return
        del self._segments[:count]
        self._directory_version += 1
        failed: OSError | None = None
        for segment in doomed:
            if failed is not None:
                with contextlib.suppress(OSError):
                    segment.close()
                continue
            logger.info("%s: deleting segment %d %s", self.directory, segment.base_offset, why)
            try:
                segment.delete()
            except OSError as error:
                failed = error
                with contextlib.suppress(OSError):
                    segment.close()
                logger.warning("%s: cannot delete segment %d (%s); it and the %d after it stay"
                               " on disk below the log start until the next open deletes them",
                               self.directory, segment.base_offset, describe_os_error(error),
                               len(doomed) - doomed.index(segment) - 1)
        try:
            fsync_directory(self.directory)
        except OSError as error:  # a failed fsync is not retried (see mark_offline)
            self.mark_offline("directory fsync after deleting segments", error)
        else:  # the next flush need not fsync the directory again
            self._directory_synced_version = self._directory_version

    def _write_checkpoint(self, log_start_offset: int, *, memory_may_follow: bool = False
                          ) -> None:
        """Durably record ``log_start_offset`` (fsynced temp file, rename, directory fsync).
        Callers write first and move ``_log_start_offset`` after, so a failure before the
        rename leaves memory and disk agreeing on the old value (OSError). A failed
        directory fsync after the rename leaves the disk saying the new value, durably or
        not: the log goes offline (a failed fsync is not retried; a restart reads whichever
        value survived) and KafkaStorageError is raised; with ``memory_may_follow`` (a
        start moving up within the log) memory adopts the new value first, so nothing below
        it is served while the disk already says it is gone."""
        _replace_checkpoint(self.directory, log_start_offset)
        try:
            fsync_directory(self.directory)
        except OSError as error:
            # Offline first: nothing after this may fsync the broken directory again (the
            # epoch-cache rewrite below would, and its failure must not skip this).
            self.mark_offline(f"directory fsync after writing log start {log_start_offset}",
                              error)
            if memory_may_follow:
                self._set_log_start_offset(log_start_offset)  # tolerates an epoch-file error
            raise KafkaStorageError(f"partition {self.name} is offline after an I/O error "
                                    f"({self._offline_reason})") from error

    def truncate_to(self, offset: int) -> int:
        """Remove every offset >= ``offset`` (for replication); returns the new log end offset.

        Whole batches go: if ``offset`` is inside a batch, that batch is removed too, so the
        new end may be lower than ``offset`` (as in Kafka). Blocking: fsyncs the truncated
        file and the directory. In-flight flush tickets no longer advance flushed_offset.
        An I/O error takes the log offline (KafkaStorageError).
        """
        assert not self._closed
        self._check_writable()  # an offline log is neither modified nor fsynced again
        if offset >= self.log_end_offset:
            return self.log_end_offset
        self._check_offset_in_range(offset)
        lowered_start = self._start_after_truncation(offset)
        if lowered_start < self._log_start_offset:
            # The batch holding the start goes: checkpoint the lower start first, so the disk
            # never claims a start above what the log holds and memory never runs ahead.
            try:
                self._write_checkpoint(lowered_start)
            except OSError as error:  # before the rename: the log is as it was, retry later
                raise KafkaStorageError(f"partition {self.name}: cannot write log start "
                                        f"{lowered_start}: {describe_os_error(error)}"
                                        ) from error
        try:
            self._truncate_segments(offset)
        except OSError as error:
            # Memory may now hold fewer segments than the disk, or an untruncated tail: no
            # more writes or fsyncs until a restart recovers the directory (as Kafka takes a
            # log directory offline on any I/O error). Flush tickets and cleaner passes
            # begun before this see a new generation and drop their results.
            self._generation += 1
            self._directory_version += 1
            end_offset = self.log_end_offset
            self._flushed_offset = min(self._flushed_offset, end_offset)
            self._flush_target_offset = min(self._flush_target_offset, end_offset)
            self.mark_offline(f"truncation to offset {offset}", error)
            raise KafkaStorageError(f"partition {self.name} is offline after an I/O error "
                                    f"({self._offline_reason})") from error
        self._generation += 1
        end_offset = self.log_end_offset
        self._flushed_offset = min(self._flushed_offset, end_offset)
        self._flush_target_offset = min(self._flush_target_offset, end_offset)
        self._log_start_offset = min(self._log_start_offset, end_offset)
        self.epoch_cache.truncate_from_end(end_offset)
        self._check_invariants()
        return end_offset

    def _truncate_segments(self, offset: int) -> None:
        deleted = False
        while len(self._segments) > 1 and self._active.base_offset >= offset:
            self._segments.pop().delete()
            deleted = True
        self._active.truncate_to(offset)
        if deleted:
            fsync_directory(self.directory)

    def _start_after_truncation(self, offset: int) -> int:
        """The log start once ``truncate_to(offset)`` removed the batch holding ``offset``:
        that batch's base offset when it also holds the current start (a start inside a
        batch, set by DeleteRecords), else the current start."""
        found = self._segments[self._segment_slot(offset)].find_batch(offset)
        if found is None:
            return self._log_start_offset
        return min(self._log_start_offset, found[1].base_offset)

    def reset_to(self, offset: int) -> None:
        """Delete every batch and restart the log empty at ``offset`` (Kafka's
        truncateFullyAndStartAt: a follower whose log ends below the leader's log start).
        Blocking: the log-start checkpoint is written first (a failure leaves the log as it
        was), then memory switches to the new segment, then the old segments are unlinked
        (a failure is logged: the next open deletes what is left) and the directory fsynced
        (a failure takes the log offline). KafkaStorageError while the log is offline."""
        assert not self._closed and offset >= 0
        self._check_writable()  # an offline log is neither modified nor fsynced again
        namesake = next((s for s in self._segments if s.base_offset == offset), None)
        created = None
        try:
            if namesake is None:  # create first, so a failure leaves the log as it was
                self._remove_stray_namesake(offset)
                created = Segment.create(self.directory, offset,
                                         self.config.index_interval_bytes)
            self._write_checkpoint(offset)
        except BaseException as error:
            if created is not None:
                with contextlib.suppress(OSError):
                    created.delete()
            if isinstance(error, OSError):  # the log is as it was: the caller may retry
                raise KafkaStorageError(f"partition {self.name}: cannot restart the log at "
                                        f"{offset}: {describe_os_error(error)}") from error
            raise
        if namesake is None:
            assert created is not None
            new_segment = created
        else:
            namesake.truncate_to(offset)  # empties it (fsynced) and reopens it for appends
            new_segment = namesake
        # Memory first: whatever fails below, the log is the new empty segment at ``offset``.
        old_segments = [s for s in self._segments if s is not new_segment]
        self._segments = [new_segment]
        self._log_start_offset = offset
        self._generation += 1
        self._flushed_offset = offset
        self._flush_target_offset = offset
        self._first_unflushed_ms = None
        self._directory_version += 1
        self._unlink_replaced(old_segments, offset)
        try:
            fsync_directory(self.directory)
        except OSError as error:  # not raised: memory is consistent, the caller follows it
            self.mark_offline(f"directory fsync after restarting the log at {offset}", error)
        else:
            self._directory_synced_version = self._directory_version
        try:
            self.epoch_cache.clear()
        except OSError as error:  # stale entries are trimmed to the log on the next open
            logger.warning("%s: cannot rewrite the leader-epoch checkpoint after restarting "
                           "the log at %d (%s)", self.directory, offset,
                           describe_os_error(error))
        self._check_invariants()

    def _unlink_replaced(self, old_segments: list[Segment], offset: int) -> None:
        """Unlink the segments ``reset_to`` replaced, oldest first; stop at the first
        failure and close the rest. The next open deletes what stays: segments below the
        checkpointed start ``offset`` (``_delete_below_start``) and any after the new empty
        segment (the gap check in ``_load_segments``). Logged, not raised: memory already
        holds only the new segment."""
        for slot, segment in enumerate(old_segments):
            try:
                segment.delete()
            except OSError as error:
                logger.warning("%s: cannot delete segment %d after restarting the log at %d"
                               " (%s); it and the %d after it stay on disk until the next "
                               "open deletes them", self.directory, segment.base_offset,
                               offset, describe_os_error(error), len(old_segments) - slot - 1)
                for rest in old_segments[slot:]:
                    with contextlib.suppress(OSError):
                        rest.close()
                return

    def close(self) -> None:
        """Close every fd. Does not fsync: flush first if the data must be durable."""
        for segment in self._segments:
            segment.close()
        self._closed = True

    def _check_invariants(self) -> None:
        """Cheap O(1) checks after every mutation (TigerBeetle-style)."""
        active = self._active
        assert not active.sealed, "the last segment must be the active one"
        assert self._log_start_offset <= self.log_end_offset
        assert self._flushed_offset <= self.log_end_offset
        assert self._segments[0].base_offset <= self._log_start_offset
        if len(self._segments) > 1:
            previous = self._segments[-2]
            assert previous.sealed and previous.next_offset == active.base_offset


# --- helpers ---------------------------------------------------------------------------------


def _replace_checkpoint(directory: Path, log_start_offset: int) -> None:
    """Write the ``log-start-offset`` checkpoint to its temp file (one fixed name: every
    write runs on the log's owner thread), fsync it and rename it over the checkpoint; the
    caller fsyncs the directory. Raises OSError having changed nothing: the temp file is
    removed on any failure, so retries on a full disk leave nothing behind."""
    path = directory / LOG_START_OFFSET_CHECKPOINT
    tmp_path = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        try:
            write_all(fd, f"{_CHECKPOINT_VERSION}\n{log_start_offset}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        raise


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


def _install_swap(directory: Path, base_offset: int) -> None:
    """Rename the ``.swap`` files of the segment at ``base_offset`` over its final names:
    index files first, the ``.log`` last (an index ``.swap`` missing while the ``.log.swap``
    is there was already renamed: step 1 of ``replace_segments`` made them all)."""
    for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, LOG_SUFFIX):
        final = directory / segment_file_name(base_offset, suffix)
        swap = final.with_name(final.name + SWAP_SUFFIX)
        if swap.exists():
            os.replace(swap, final)


def _swap_end_offset(path: Path, base_offset: int, index_interval_bytes: int) -> int | None:
    """The offset after the last batch of a ``.log.swap`` file, or None if unreadable."""
    segment = Segment.open_existing(path.parent, base_offset, index_interval_bytes,
                                    file_suffix=SWAP_SUFFIX)
    try:
        end: int | None = base_offset
        for _, header in segment.iter_headers(0):
            end = header.next_offset
        return end
    except PartitionLogError:
        return None
    finally:
        segment.close()


def _finish_swaps(directory: Path, index_interval_bytes: int) -> None:
    """Crash recovery of compaction swaps (``PartitionLog.replace_segments``): a
    ``<base>.log.swap`` is a complete, fsynced replacement of every segment whose base offset
    lies in ``[base, its end)``; delete those and rename the swap into place. Without a
    ``.log.swap`` the swap never committed: its ``.cleaned`` and index ``.swap`` files are
    deleted by ``_remove_leftovers`` and the old segments stay."""
    swaps = sorted(
        offset for path in directory.glob("*" + LOG_SUFFIX + SWAP_SUFFIX)
        if (offset := parse_base_offset(path, LOG_SUFFIX + SWAP_SUFFIX)) is not None
    )
    for base in swaps:
        swap_path = directory / (segment_file_name(base, LOG_SUFFIX) + SWAP_SUFFIX)
        end = _swap_end_offset(swap_path, base, index_interval_bytes)
        if end is None:  # fsynced before the commit rename, so this is not a crash's doing
            logger.error("%s: unreadable compaction swap file; keeping the old segments",
                         swap_path)
            swap_path.unlink()
            continue
        for path in directory.glob("*" + LOG_SUFFIX):
            covered = parse_base_offset(path, LOG_SUFFIX)
            if covered is not None and base < covered < end:
                for suffix in SEGMENT_SUFFIXES:
                    (directory / segment_file_name(covered, suffix)).unlink(missing_ok=True)
        _install_swap(directory, base)
        logger.info("%s: completed an interrupted compaction swap of [%d, %d)", directory,
                    base, end)
    if swaps:
        fsync_directory(directory)


def _remove_leftovers(directory: Path) -> None:
    """Delete temp files of interrupted writes, uncommitted compaction files and index files
    whose .log is gone."""
    for path in directory.iterdir():
        if path.name.endswith((TMP_SUFFIX, CLEANED_SUFFIX, SWAP_SUFFIX)):
            path.unlink()
            continue
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
            base_offset = parse_base_offset(path, suffix)
            if base_offset is not None and not path.with_suffix(LOG_SUFFIX).exists():
                path.unlink()


def _load_segments(directory: Path, config: LogConfig, now_ms: int,
                   checkpoint: int | None) -> list[Segment]:
    """Open every segment; sealed ones are tail-checked, the last one is recovered.

    First, segments wholly below the checkpointed log start (``checkpoint``: the next
    segment's base offset is at or below it) are deleted: a crash or a failed unlink while
    the start moved left them, and they need not be contiguous with what follows (a
    DeleteRecords that deleted a later one but not an older one, before this was fixed).
    A sealed segment that fails its checks is then recovered by scanning. If that drops
    bytes or leaves a gap, everything after it is deleted: later data was never
    acknowledged as flushed (a flush syncs every earlier segment too), and the log must
    stay a prefix.
    """
    base_offsets = sorted(
        offset
        for path in directory.glob("*" + LOG_SUFFIX)
        if (offset := parse_base_offset(path, LOG_SUFFIX)) is not None
    )
    base_offsets = _delete_below_start(directory, base_offsets, checkpoint)
    interval = config.index_interval_bytes
    segments = [Segment.open_existing(directory, base, interval) for base in base_offsets]
    for slot, segment in enumerate(segments[:-1]):
        next_base_offset = segments[slot + 1].base_offset
        if segment.load_sealed(next_base_offset):
            continue
        logger.warning("%s: index or tail check failed; recovering", segment.log_path)
        dropped_bytes = segment.recover(now_ms)
        if dropped_bytes == 0 and segment.next_offset == next_base_offset:
            segment.seal()  # rewrite the index files that failed the checks
            continue
        for later in segments[slot + 1 :]:
            logger.warning("%s: deleting segment after a recovered tail", later.log_path)
            later.delete()
        return segments[: slot + 1]
    if segments:
        segments[-1].recover(now_ms)
    return segments


def _delete_below_start(directory: Path, base_offsets: list[int], checkpoint: int | None
                        ) -> list[int]:
    """Unlink the segments (all their files) whose successor starts at or below the
    checkpointed log start; returns the base offsets that remain."""
    if checkpoint is None:
        return base_offsets
    keep_from = 0
    while keep_from + 1 < len(base_offsets) and base_offsets[keep_from + 1] <= checkpoint:
        keep_from += 1
    for base in base_offsets[:keep_from]:
        logger.info("%s: deleting segment %d below the log start offset %d", directory, base,
                    checkpoint)
        for suffix in SEGMENT_SUFFIXES:
            (directory / segment_file_name(base, suffix)).unlink(missing_ok=True)
    if keep_from:
        fsync_directory(directory)
    return base_offsets[keep_from:]


def _read_checkpoint(directory: Path) -> int | None:
    path = directory / LOG_START_OFFSET_CHECKPOINT
    try:
        lines = path.read_text().split()
    except FileNotFoundError:
        return None
    if len(lines) == 2 and lines[0] == _CHECKPOINT_VERSION and lines[1].isdigit():
        return int(lines[1])
    logger.warning("%s: unreadable checkpoint %r; ignoring it", path, lines)
    return None


def _restart_at_checkpoint(directory: Path, segments: list[Segment], checkpoint: int,
                           config: LogConfig) -> list[Segment]:
    """The checkpointed log start is above the recovered log end (relaxed flushing lost an
    acknowledged-but-unflushed tail that DeleteRecords had already moved the start into, or
    recovery cut a sealed segment): delete every segment and start the log empty at the
    checkpoint (Kafka's LogLoader does the same). Lowering the start instead would hand out
    offsets below the checkpoint again, which the next open would hide or delete, and the
    start must never move back. A crash in between leaves fewer segments and the same
    checkpoint, so the next open does this again."""
    logger.warning("%s: deleting all segments because the log end offset %d is below the "
                   "checkpointed log start offset %d; the log restarts empty there",
                   directory, segments[-1].next_offset, checkpoint)
    for segment in segments:
        segment.delete()
    fresh = Segment.create(directory, checkpoint, config.index_interval_bytes)
    fsync_directory(directory)
    return [fresh]


def _start_offset(checkpoint: int | None, segments: list[Segment]) -> int:
    first_offset = segments[0].base_offset
    start_offset = first_offset if checkpoint is None else max(checkpoint, first_offset)
    # _restart_at_checkpoint: a checkpoint above the recovered end is never lowered.
    assert start_offset <= segments[-1].next_offset, (start_offset, segments[-1].next_offset)
    return start_offset
