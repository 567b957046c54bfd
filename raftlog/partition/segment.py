"""One log segment: a ``.log`` file of v2 record batches plus its sparse indexes.

Its files (named by ``segment_files``) are ``<base>.log``, ``<base>.index``,
``<base>.timeindex`` and ``<base>.txnindex`` (aborted transactions whose ABORT marker is in
this segment, see ``txn_index_file``; created empty with the segment, appended to, fsynced
with the segment). Timestamp lookups narrow the search here with the indexes and decode
records in ``segment_timestamps``.

Offsets in a segment strictly increase but may have gaps: log compaction removes records and
whole batches (``cleaner``), and a follower copies the leader's compacted batches as they are.
A rewritten segment always keeps its last batch (empty if need be), so a sealed segment still
ends exactly where the next one begins.

The active (last) segment's indexes live only in memory and are rebuilt from the log on
open; a sealed (rolled) segment's indexes are written and fsynced when it is sealed and are
loaded, sanity-checked and tail-checked on open. Not thread-safe: the owning PartitionLog
serialises access. Only dup'd fds (FileSlice, flush tickets) leave this class.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Final

from raftlog.partition.batch import (
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    check_batch,
    check_header,
    check_stored_record_count,
    parse_header,
)
from raftlog.partition.errors import CorruptRecordError, PartitionLogError
from raftlog.partition.files import (
    append_to,
    preallocate,
    pwrite_all,
    read_optional,
    write_atomically,
    zeros_between,
)
from raftlog.partition.index import INT32_MAX, OffsetIndex, TimeIndex
from raftlog.partition.segment_files import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    FileSlice,
    segment_file_name,
)
from raftlog.partition.segment_timestamps import TimestampAndOffset, TimestampSearch
from raftlog.partition.txn_index_file import entries_below
from raftlog.partition.verified_ranges import VerifiedRanges

__all__ = ["Segment"]

logger = logging.getLogger(__name__)

# Header scans pread this much at a time: one syscall then covers every header of a run of
# small batches, and costs the same as a 61-byte read for large ones.
_SCAN_WINDOW_BYTES = 4096

# The newest batches a segment remembers (position, header): followers and consumers that keep
# up read where the last append ended, found without preads (~20 us per follower fetch).
RECENT_BATCHES_MAX: Final = 8

# Appends are pwrites at ``size_bytes`` (the file may run on past it: ``files.preallocate``);
# reads are preads; read-write for ftruncate and fallocate.
_LOG_FILE_FLAGS: Final = os.O_RDWR | os.O_CLOEXEC


class Segment:
    """A ``.log`` file of batches starting at ``base_offset``, with sparse indexes.

    Invariants: batches are back to back from position 0 to ``size_bytes``; their offsets
    strictly increase (gaps allowed, see the module docstring) from at least ``base_offset``
    to ``next_offset - 1``; index entries point at batch starts. ``file_suffix`` (e.g.
    ``.cleaned``) is appended to every file name: the cleaner builds segments under it.
    """

    def __init__(
        self, directory: Path, base_offset: int, index_interval_bytes: int, fd: int,
        file_suffix: str = "",
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.file_suffix = file_suffix
        # .txnindex bytes appended so far and how many of them are known to be fsynced.
        self.txn_index_written_bytes = 0
        self.txn_index_synced_bytes = 0
        self.index_interval_bytes = index_interval_bytes
        self.index = OffsetIndex(base_offset)
        self.time_index = TimeIndex(base_offset)
        self.size_bytes = 0
        # The file's length: ``size_bytes`` plus the preallocated (zero) tail.
        self.allocated_bytes = 0
        self.flushed_size_bytes = 0  # bytes known to be fsynced
        # Byte ranges whose batches' CRCs were checked in this process (``log_verify``).
        self.verified = VerifiedRanges()
        self.next_offset = base_offset
        self.max_timestamp_ms = -1  # Kafka's NO_TIMESTAMP until a batch carries one
        self.rolling_base_ms: int | None = None  # when the first batch arrived
        self.sealed = False
        # A failed append whose bytes could not be cut off again: the file holds bytes past
        # ``size_bytes``, so no append may follow until recovery truncates them (on open).
        # Holds why the cut-off failed.
        self.torn: str | None = None
        # One fd per segment, for reads (pread, sendfile through dups) and appends alike: a
        # node with 10,000 partitions must fit a 20,000 open-file limit with room for
        # connections (two fds each, as before, did not).
        self._fd = fd
        self._offset_of_max_timestamp = base_offset
        self._bytes_since_index_entry = 0
        self._timestamps = TimestampSearch()  # ListOffsets by timestamp, record-level
        # The newest batches, back to back and ending at ``size_bytes`` (see
        # RECENT_BATCHES_MAX); only ``_track_batch`` adds and ``_reset_indexes`` clears.
        self._recent: deque[tuple[int, BatchHeader]] = deque(maxlen=RECENT_BATCHES_MAX)

    # --- lifecycle -------------------------------------------------------------------------

    @classmethod
    def create(
        cls, directory: Path, base_offset: int, index_interval_bytes: int, file_suffix: str = ""
    ) -> Segment:
        """Create an empty segment (and its empty ``.txnindex``). The caller must fsync the
        directory before relying on it."""
        log_path = directory / (segment_file_name(base_offset, LOG_SUFFIX) + file_suffix)
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):  # leftovers of a deleted namesake
            (directory / (segment_file_name(base_offset, suffix) + file_suffix)).unlink(
                missing_ok=True)
        fd = os.open(log_path, _LOG_FILE_FLAGS | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            txn_path = directory / (segment_file_name(base_offset, TXN_INDEX_SUFFIX)
                                    + file_suffix)
            os.close(os.open(txn_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                             0o644))
        except BaseException:
            # Out of fds: leave nothing behind, or the next roll fails on O_EXCL forever.
            os.close(fd)
            with contextlib.suppress(OSError):
                log_path.unlink()
            raise
        return cls(directory, base_offset, index_interval_bytes, fd, file_suffix)

    @classmethod
    def open_existing(
        cls, directory: Path, base_offset: int, index_interval_bytes: int, file_suffix: str = ""
    ) -> Segment:
        """Open a segment file; the caller must then call ``load_sealed`` or ``recover``."""
        log_path = directory / (segment_file_name(base_offset, LOG_SUFFIX) + file_suffix)
        segment = cls(directory, base_offset, index_interval_bytes,
                      os.open(log_path, _LOG_FILE_FLAGS), file_suffix)
        segment.size_bytes = segment.allocated_bytes = os.fstat(segment._fd).st_size
        return segment

    def path_for(self, suffix: str) -> Path:
        """This segment's file with ``suffix`` (plus ``file_suffix``)."""
        return self.directory / (segment_file_name(self.base_offset, suffix) + self.file_suffix)

    @property
    def log_path(self) -> Path:
        return self.path_for(LOG_SUFFIX)

    @property
    def index_path(self) -> Path:
        return self.path_for(INDEX_SUFFIX)

    @property
    def time_index_path(self) -> Path:
        return self.path_for(TIME_INDEX_SUFFIX)

    @property
    def txn_index_path(self) -> Path:
        return self.path_for(TXN_INDEX_SUFFIX)

    # --- the aborted-transaction index file (format: txn_index_file) ------------------------

    def append_txn_index(self, data: bytes) -> None:
        """Append entries to ``.txnindex`` (not fsynced: flush tickets and ``seal`` do it).
        On an OSError the file is removed, so the next open rebuilds it from the log, and
        the error is re-raised."""
        try:
            append_to(self.txn_index_path, data)
        except OSError:
            with contextlib.suppress(OSError):
                self.txn_index_path.unlink()
            raise
        self.txn_index_written_bytes += len(data)

    def read_txn_index(self) -> bytes | None:
        """The ``.txnindex`` bytes, or None when the file is missing."""
        return read_optional(self.txn_index_path)

    def write_txn_index(self, data: bytes) -> None:
        """Replace ``.txnindex`` atomically (fsynced, like the other index files)."""
        write_atomically(self.txn_index_path, data, sync_directory=False)
        self.txn_index_written_bytes = self.txn_index_synced_bytes = len(data)

    def txn_index_sync_fd(self) -> int | None:
        """A fd to fsync ``.txnindex`` with, when it has unsynced appends (else None)."""
        if self.txn_index_written_bytes <= self.txn_index_synced_bytes:
            return None
        try:
            return _open_read(self.txn_index_path)
        except FileNotFoundError:
            return None  # removed after a failed append: the next open rebuilds it

    def fsync(self) -> None:
        """fsync the log file (blocking)."""
        os.fsync(self._fd)

    def seal(self) -> None:
        """Stop appending: record the final max timestamp, write + fsync both index files
        (and the ``.txnindex`` if it has unsynced appends)."""
        txn_fd = self.txn_index_sync_fd()
        if txn_fd is not None:
            try:
                os.fsync(txn_fd)
            finally:
                os.close(txn_fd)
            self.txn_index_synced_bytes = self.txn_index_written_bytes
        self._cut_preallocated_tail()  # the next flush makes the length durable
        if self.max_timestamp_ms > self.time_index.last_timestamp:
            self.time_index.append(self.max_timestamp_ms, self._offset_of_max_timestamp)
        assert self.time_index.last_timestamp == self.max_timestamp_ms
        self.index.write(self.index_path)
        self.time_index.write(self.time_index_path)
        self.sealed = True
        self._recent.clear()  # readers of sealed segments are rare; keep memory per active one

    def close(self) -> None:
        """Close the file, cutting off its preallocated tail first (best effort: recovery
        drops a zero tail after a crash anyway)."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                self._cut_preallocated_tail()
            self._close_fd()

    def _close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _cut_preallocated_tail(self) -> None:
        if self.allocated_bytes > self.size_bytes and self.torn is None:
            os.ftruncate(self._fd, self.size_bytes)
            self.allocated_bytes = self.size_bytes

    def delete(self) -> None:
        """Close and unlink all files; dup'd fds held by readers stay valid."""
        self._close_fd()
        self.log_path.unlink(missing_ok=True)
        self._remove_index_files()
        self.txn_index_path.unlink(missing_ok=True)

    def _remove_index_files(self) -> None:
        self.index_path.unlink(missing_ok=True)
        self.time_index_path.unlink(missing_ok=True)

    def dup_fd(self) -> int:
        """A private fd for fsync in a worker thread (fsync works on read-only fds on Linux)."""
        return os.dup(self._fd)

    def largest_timestamp_ms(self) -> int:
        """For time retention: the max batch timestamp, else the file mtime (as Kafka does)."""
        if self.max_timestamp_ms >= 0:
            return self.max_timestamp_ms
        return os.fstat(self._fd).st_mtime_ns // 1_000_000


    # --- append ----------------------------------------------------------------------------

    def should_roll(
        self,
        *,
        incoming_bytes: int,
        last_offset: int,
        now_ms: int,
        segment_bytes: int,
        segment_ms: int,
    ) -> bool:
        """Kafka's shouldRoll: full by size, too old, or relative offsets would overflow."""
        if self.size_bytes == 0:
            return False  # an empty segment takes any append, even an oversized one
        too_old = self.rolling_base_ms is not None and now_ms - self.rolling_base_ms > segment_ms
        return (
            self.size_bytes + incoming_bytes > segment_bytes
            or too_old
            or last_offset - self.base_offset > INT32_MAX
        )

    def append(self, buf: bytes | bytearray, headers: Sequence[BatchHeader], now_ms: int) -> None:
        """Write already-rewritten batches at the end of the file and index them.

        On an OSError (ENOSPC, EDQUOT, EFBIG, EIO...) the bytes written so far are cut off
        again, so the file still ends with the last whole batch, and the error is re-raised.
        If even that fails, ``torn`` says why and the segment takes no more appends.
        """
        assert not self.sealed, "sealed segments are read-only"
        assert self.torn is None, "a torn segment takes no appends until recovery"
        assert headers and headers[0].base_offset >= self.next_offset, "offsets must increase"
        start = self.size_bytes
        fd = self._fd
        end = start + len(buf)
        if end > self.allocated_bytes:  # once per chunk, not a call per append
            self.allocated_bytes = preallocate(fd, start, self.allocated_bytes, end)
        try:
            pwrite_all(fd, buf, start)
        except OSError as error:
            # Keep the file equal to what we index: a partly written batch left in the file
            # could be taken for a whole one after a crash.
            try:
                os.ftruncate(fd, start)
                self.allocated_bytes = start
            except OSError as undo_error:
                self.torn = f"cutting off the failed append at position {start} failed too: " \
                    f"{undo_error}"
            raise error
        if self.rolling_base_ms is None:
            self.rolling_base_ms = now_ms
        # Every writer checked these batches' CRCs (validate_batches; the cleaner checks what
        # it copies and computes the CRC of what it rewrites).
        self.verified.add(start, start + len(buf))
        position = start
        for header in headers:
            self._track_batch(header, position)
            position += header.size_bytes
        assert position == start + len(buf), "headers must describe the written bytes"

    def _track_batch(self, header: BatchHeader, position: int) -> None:
        """Account one batch that starts at ``position``: indexes, offsets, size."""
        assert header.base_offset >= self.next_offset, "offsets must increase"
        assert position == self.size_bytes, "batches must be back to back"
        if self._bytes_since_index_entry >= self.index_interval_bytes:
            self.index.append(header.base_offset, position)
            if self.max_timestamp_ms > self.time_index.last_timestamp:
                self.time_index.append(self.max_timestamp_ms, self._offset_of_max_timestamp)
            self._bytes_since_index_entry = 0
        if header.max_timestamp > self.max_timestamp_ms:
            self.max_timestamp_ms = header.max_timestamp
            self._offset_of_max_timestamp = header.base_offset
        self._bytes_since_index_entry += header.size_bytes
        self.next_offset = header.next_offset
        self.size_bytes = position + header.size_bytes
        self._recent.append((position, header))

    # --- open / recovery -------------------------------------------------------------------

    def load_sealed(self, next_base_offset: int) -> bool:
        """Adopt the index files of a rolled segment. False when a file is missing or fails a
        sanity check, or when the log tail after the last index entry is torn or does not end
        at ``next_base_offset``; the caller then recovers the segment by scanning."""
        index_data = read_optional(self.index_path)
        time_data = read_optional(self.time_index_path)
        if index_data is None or time_data is None:
            return False
        limit = next_base_offset
        index = OffsetIndex.from_bytes(
            self.base_offset, index_data, log_size_bytes=self.size_bytes, offset_limit=limit
        )
        time_index = TimeIndex.from_bytes(self.base_offset, time_data, offset_limit=limit)
        if index is None or time_index is None:
            return False
        self.index, self.time_index = index, time_index
        if self._tail_next_offset() != next_base_offset:
            return False
        self.next_offset = next_base_offset
        self.max_timestamp_ms = time_index.last_timestamp
        self._offset_of_max_timestamp = time_index.last_offset
        self.sealed = True
        return True

    def _tail_next_offset(self) -> int | None:
        """Check (header + CRC + timestamp) the batches after the last index entry; the offset
        after the last one, or None if any is bad or the file does not end on a batch
        boundary."""
        expected_offset, position = self.index.lookup(self.base_offset + INT32_MAX)
        while position < self.size_bytes:
            try:
                header = self._read_checked_batch(position, expected_offset, verify_crc=True)
            except PartitionLogError:
                return None
            if header.max_timestamp > self.time_index.last_timestamp:
                return None  # the time index must end with the segment's largest timestamp
            position += header.size_bytes
            expected_offset = header.next_offset
        return expected_offset

    def recover(self, now_ms: int) -> int:
        """Rebuild the indexes by scanning every batch (header + CRC) and truncate the file at
        the first torn, corrupt or out-of-sequence batch. Returns the bytes dropped.

        The index files are deleted: only ``seal`` writes them, always for the whole segment,
        so a later crash can never leave a stale pair that passes the sanity checks.
        """
        self._remove_index_files()
        dropped_bytes = self._rebuild(verify_crc=True)
        if self.size_bytes > 0:
            first = self._read_checked_batch(0, self.base_offset, verify_crc=False)
            # The append time of the first batch is not stored; its timestamp is the best
            # stand-in (Kafka does the same), capped so a future timestamp cannot delay rolls.
            timestamp_ms = first.max_timestamp
            self.rolling_base_ms = min(timestamp_ms, now_ms) if timestamp_ms >= 0 else now_ms
        return dropped_bytes

    def _rebuild(self, *, verify_crc: bool) -> int:
        file_size = self.size_bytes
        self._reset_indexes()
        reason = ""
        while self.size_bytes < file_size:
            try:
                header = self._read_checked_batch(
                    self.size_bytes, self.next_offset, verify_crc=verify_crc, end=file_size
                )
            except PartitionLogError as error:
                reason = str(error)
                break
            self._track_batch(header, self.size_bytes)
        if verify_crc:
            self.verified.clear()
            self.verified.add(0, self.size_bytes)
        else:
            self.verified.truncate(self.size_bytes)
        dropped_bytes = file_size - self.size_bytes
        if not dropped_bytes:
            return 0
        if zeros_between(self._fd, self.size_bytes, file_size):
            # The preallocated tail of a segment that was not closed (``files.preallocate``):
            # no batch was ever there.
            logger.debug("%s: cutting off %d preallocated bytes after position %d",
                         self.log_path, dropped_bytes, self.size_bytes)
            self._truncate_file(self.size_bytes)
            return 0
        logger.warning(
            "%s: dropping %d bytes after position %d: %s",
            self.log_path, dropped_bytes, self.size_bytes, reason,
        )
        self._truncate_file(self.size_bytes)
        return dropped_bytes

    def _reset_indexes(self) -> None:
        self.index = OffsetIndex(self.base_offset)
        self.time_index = TimeIndex(self.base_offset)
        self.size_bytes = 0
        self.next_offset = self.base_offset
        self.max_timestamp_ms = -1
        self._offset_of_max_timestamp = self.base_offset
        self._bytes_since_index_entry = 0
        self._recent.clear()
        self.sealed = False

    def _read_checked_batch(
        self, position: int, expected_offset: int, *, verify_crc: bool, end: int | None = None
    ) -> BatchHeader:
        """Read and check the batch at ``position``: header, CRC if asked, record count, and
        that its base offset continues the segment. Raises a PartitionLogError subclass."""
        available_bytes = (self.size_bytes if end is None else end) - position
        data = os.pread(self._fd, RECORD_BATCH_OVERHEAD, position)
        if len(data) < RECORD_BATCH_OVERHEAD or available_bytes < RECORD_BATCH_OVERHEAD:
            raise CorruptRecordError(f"incomplete batch header at position {position}")
        header = parse_header(data)
        check_header(header, available_bytes, position)
        if verify_crc:
            check_batch(os.pread(self._fd, header.size_bytes, position))
        check_stored_record_count(header)
        if header.base_offset < expected_offset or \
                header.last_offset - self.base_offset > INT32_MAX:
            # Not CRC-covered, so increasing offsets are the only check on baseOffset (gaps
            # are legal: compaction).
            raise CorruptRecordError(
                f"batch at position {position} has base offset {header.base_offset}, "
                f"expected at least {expected_offset}"
            )
        return header

    def _truncate_file(self, size_bytes: int) -> None:
        self.verified.truncate(size_bytes)
        os.ftruncate(self._fd, size_bytes)
        self.allocated_bytes = size_bytes
        self.flushed_size_bytes = min(self.flushed_size_bytes, size_bytes)

    # --- truncation --------------------------------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Remove every batch whose last offset is >= ``offset`` (a batch containing
        ``offset`` goes entirely, as in Kafka), fsync, and reopen the segment for appends.

        Blocking: the fsync makes the truncation durable, so a crash cannot resurrect the
        removed (possibly divergent) batches.
        """
        found = self.find_batch(offset)
        position = self.size_bytes if found is None else found[0]
        rolling_base_ms = self.rolling_base_ms
        self._truncate_file(position)
        os.fsync(self._fd)
        self.torn = None  # whatever a failed append left behind is cut off too
        self.size_bytes = position
        self._rebuild(verify_crc=False)
        self.rolling_base_ms = rolling_base_ms if self.size_bytes else None
        self._remove_index_files()  # stale once appends resume; seal rewrites them
        txn_data = self.read_txn_index()
        if txn_data is not None:  # drop the entries of removed ABORT markers
            kept = entries_below(txn_data, self.next_offset)
            if kept != txn_data:
                self.write_txn_index(kept)

    # --- reads -------------------------------------------------------------------------------

    def offset_at_or_before(self, position: int) -> int:
        """A lower bound for the base offset of the batch starting at ``position``."""
        return self.index.offset_before_position(position)

    def iter_headers(self, position: int) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of each batch from ``position`` (a batch start) to the end."""
        end = self.size_bytes
        window = b""
        window_start = position
        while end - position >= RECORD_BATCH_OVERHEAD:
            in_window = position - window_start
            if in_window + RECORD_BATCH_OVERHEAD > len(window):
                window = os.pread(self._fd, min(_SCAN_WINDOW_BYTES, end - position), position)
                window_start, in_window = position, 0
                if len(window) < RECORD_BATCH_OVERHEAD:
                    raise CorruptRecordError(f"{self.log_path} shrank under position {end}")
            header = parse_header(window, in_window)
            # Guards the loop: a zero or garbage length would never advance or overrun.
            check_header(header, end - position, position)
            yield position, header
            position += header.size_bytes

    def find_batch(self, offset: int) -> tuple[int, BatchHeader] | None:
        """Position and header of the batch containing ``offset``; None past the end."""
        return next(iter(self._batches_from(offset)), None)

    def _batches_from(self, offset: int) -> Iterable[tuple[int, BatchHeader]]:
        """(position, header) of the batch containing ``offset`` (or the first after it:
        compaction leaves gaps) and of every later one, from memory when the remembered
        newest batches reach back to ``offset``, else from the file."""
        recent = self._recent
        if recent and recent[0][1].base_offset <= offset:
            # Every earlier batch ends below recent[0]'s base offset, so below ``offset``.
            for slot, (_, header) in enumerate(recent):
                if header.last_offset >= offset:
                    return itertools.islice(recent, slot, None)
            return ()
        _, position = self.index.lookup(offset)
        return itertools.dropwhile(lambda batch: batch[1].last_offset < offset,
                                   self.iter_headers(position))

    def read(
        self, offset: int, max_bytes: int, *, max_offset: int | None, min_one_batch: bool
    ) -> FileSlice | None:
        """Whole batches from the one containing ``offset``: at most ``max_bytes`` (except a
        first batch when ``min_one_batch``, KIP-74), none with base offset >= ``max_offset``."""
        start = end = -1
        for position, header in self._batches_from(offset):
            if start < 0:
                start = end = position
            if max_offset is not None and header.base_offset >= max_offset:
                break
            batch_end = position + header.size_bytes
            if batch_end - start > max_bytes and not (min_one_batch and position == start):
                break
            end = batch_end
        if end == start:
            return None
        return FileSlice(os.dup(self._fd), start, end - start)

    def find_timestamp(self, timestamp_ms: int, start_offset: int) -> TimestampAndOffset | None:
        """The first record at or after ``start_offset`` whose timestamp is >=
        ``timestamp_ms``, or None (Kafka's ``LogSegment.findOffsetByTimestamp``).

        The time index and batch headers find the first batch whose maxTimestamp reaches
        the target; only that batch's records are decoded (``segment_timestamps``).
        """
        # Batches before this offset all have smaller timestamps (see TimeIndex).
        first_offset = max(self.time_index.offset_before(timestamp_ms), start_offset)
        _, position = self.index.lookup(first_offset)
        return self._timestamps.find_timestamp(self.iter_headers(position), self._fd,
                                               self.log_path, timestamp_ms, start_offset)

    def find_max_timestamp(self) -> TimestampAndOffset | None:
        """The earliest record carrying this segment's largest timestamp, or None when the
        segment is empty (KIP-734; Kafka's MAX_TIMESTAMP lookup with
        ``RecordBatch.offsetOfMaxTimestamp``). The timestamp is the batch's maxTimestamp;
        a batch whose records cannot be read answers its base offset. Not bounded by the
        log start offset (see PartitionLog.find_max_timestamp)."""
        _, position = self.index.lookup(self._offset_of_max_timestamp)
        return self._timestamps.find_max_timestamp(self.iter_headers(position), self._fd,
                                                   self.log_path, self.max_timestamp_ms)


def _open_read(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
