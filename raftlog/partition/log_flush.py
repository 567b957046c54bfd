"""Group commit: which bytes of a log are known to be on disk, and the fsyncs that extend it.

``FlushState`` is the durability bookkeeping a ``PartitionLog`` owns: the flushed offset, the
end offset of the latest ticket, the generation that truncations bump (so an older ticket no
longer counts) and the directory version that file creations, renames and unlinks bump (so
the next ticket fsyncs the directory too). ``begin`` captures the fsync work as a
``FlushTicket`` on the owner thread; ``FlushTicket.run`` does the blocking fsyncs elsewhere;
``complete`` records them. Whether the log is offline is the caller's check: a failed fsync
is never retried (see ``StorageHealth.mark_offline``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from raftlog.partition.files import open_directory
from raftlog.partition.segment import Segment

__all__ = ["FlushPlacement", "FlushState", "FlushTicket"]


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
        directory_fd: int | None = None,
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
        self._directory_fd = directory_fd
        self._ran = False

    def run(self) -> None:
        """fdatasync the files (their data and size, which is what reading them back needs;
        not their mtime: measured 10% quicker than fsync with three brokers syncing at once),
        then fsync the directory (last: new files' data before their names)."""
        assert not self._ran, "a ticket runs once"
        self._ran = True
        try:
            for fd in self._fds:
                os.fdatasync(fd)
            if self._directory_fd is not None:
                os.fsync(self._directory_fd)
            self.synced = True
        finally:
            self.close()

    def close(self) -> None:
        """Release the fds without syncing (for a ticket that will never run)."""
        fds, self._fds = self._fds, []
        if self._directory_fd is not None:
            fds.append(self._directory_fd)
            self._directory_fd = None
        for fd in fds:
            os.close(fd)


class FlushPlacement:
    """Where the next group-commit round runs its fsyncs: on the event loop while recent
    rounds were quick, in a worker thread otherwise.

    Why: at light load the hand-off to a worker thread and back (two thread wake-ups, the
    GIL changing hands, a wake-up of the loop through its socketpair) cost about 12% of each
    broker's CPU (3.35 ms of CPU per replicated produce for the three brokers with the
    thread, 2.82 ms on the loop), more than the 0.15 ms fsync it carried. A slow round
    (much dirty data, a busy disk) blocks the loop for no longer than that one round: its
    duration decays by half a round, so the rounds after it go to the thread until they are
    quick again. Pure bookkeeping; the caller times the rounds.
    """

    def __init__(self, inline_s_max: float = 0.001, tickets_max: int = 4) -> None:
        assert inline_s_max > 0 and tickets_max > 0
        self.inline_s_max = inline_s_max
        self.tickets_max = tickets_max
        self._recent_s = inline_s_max  # the first round of a node goes to a worker thread

    def inline(self, tickets: int) -> bool:
        """Whether a round of ``tickets`` fsync tickets should run on the loop."""
        return tickets <= self.tickets_max and self._recent_s < self.inline_s_max

    def observe(self, seconds: float) -> None:
        """A round took ``seconds`` (wherever it ran)."""
        self._recent_s = max(seconds, self._recent_s / 2)


class FlushState:
    """What is durable of one log, and what the next flush must sync. Memory only: the
    owner passes the segments and the log end offset it has at each call."""

    def __init__(self, flushed_offset: int) -> None:
        self._flushed_offset = flushed_offset
        self._flush_target_offset = flushed_offset  # end offset of the latest ticket
        self._first_unflushed_ms: int | None = None  # append time of the oldest unticketed data
        self._generation = 0  # bumped by truncation: older flush tickets no longer apply
        self._directory_version = 1  # bumped when files are created, renamed or deleted
        self._directory_synced_version = 0

    @property
    def flushed_offset(self) -> int:
        """Every offset below it is on disk."""
        return self._flushed_offset

    @property
    def generation(self) -> int:
        """Moves whenever a truncation or reset replaces the log's tail."""
        return self._generation

    def note_append(self, now_ms: int) -> None:
        """Data was appended at ``now_ms``: the ``flush_ms`` clock starts if it was idle."""
        if self._first_unflushed_ms is None:
            self._first_unflushed_ms = now_ms

    def note_directory_change(self) -> None:
        """A file was created, renamed or unlinked: the next ticket fsyncs the directory."""
        self._directory_version += 1

    def note_directory_synced(self) -> None:
        """The caller fsynced the directory itself: the next flush need not do it again."""
        self._directory_synced_version = self._directory_version

    def needs_flush(self, log_end_offset: int, now_ms: int, flush_messages: int | None,
                    flush_ms: int | None) -> bool:
        """Whether the flush policy wants a flush of data not yet in any ticket:
        always when ``flush_messages`` is None, else once that many messages are waiting
        or the oldest has waited ``flush_ms``."""
        waiting_messages = log_end_offset - self._flush_target_offset
        if waiting_messages <= 0:
            return False
        if flush_messages is None:
            return True
        if waiting_messages >= flush_messages:
            return True
        first_ms = self._first_unflushed_ms
        return flush_ms is not None and first_ms is not None and now_ms - first_ms >= flush_ms

    def begin(self, directory: Path, segments: Sequence[Segment], log_end_offset: int
              ) -> FlushTicket | None:
        """Capture the fsync work for everything written so far; None if there is none.
        Raises OSError (e.g. EMFILE) having captured nothing."""
        dirty = [s for s in segments if s.size_bytes > s.flushed_size_bytes]
        txn_dirty = [s for s in segments
                     if s.txn_index_written_bytes > s.txn_index_synced_bytes]
        directory_dirty = self._directory_version != self._directory_synced_version
        if not dirty and not directory_dirty and not txn_dirty and \
                self._flushed_offset == log_end_offset:
            return None
        fds: list[int] = []
        directory_fd: int | None = None
        txn_index_sizes: dict[int, int] = {}
        try:
            for segment in txn_dirty:  # before the log: an ABORT marker never outlives its entry
                fd = segment.txn_index_sync_fd()
                if fd is not None:
                    fds.append(fd)
                txn_index_sizes[segment.base_offset] = segment.txn_index_written_bytes
            for segment in dirty:
                fds.append(segment.dup_fd())
            if directory_dirty:  # synced last: new files' data before their names
                directory_fd = open_directory(directory)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        self._flush_target_offset = log_end_offset
        self._first_unflushed_ms = None
        return FlushTicket(
            target_offset=log_end_offset,
            fds=fds,
            directory_fd=directory_fd,
            segment_sizes={segment.base_offset: segment.size_bytes for segment in dirty},
            generation=self._generation,
            directory_version=self._directory_version if directory_dirty else None,
            txn_index_sizes=txn_index_sizes,
        )

    def complete(self, ticket: FlushTicket, segments: Sequence[Segment], log_end_offset: int
                 ) -> None:
        """Record a ticket's successful ``run``: advance ``flushed_offset`` to its target,
        unless a truncation since ``begin`` made the ticket stale (its target may not
        exist)."""
        if ticket.generation != self._generation:
            return
        assert ticket.target_offset <= log_end_offset
        self._flushed_offset = max(self._flushed_offset, ticket.target_offset)
        for segment in segments:
            synced_bytes = ticket.segment_sizes.get(segment.base_offset, 0)
            segment.flushed_size_bytes = max(segment.flushed_size_bytes, synced_bytes)
            txn_synced = ticket.txn_index_sizes.get(segment.base_offset, 0)
            segment.txn_index_synced_bytes = max(segment.txn_index_synced_bytes,
                                                 min(txn_synced, segment.txn_index_written_bytes))
        if ticket.directory_version is not None:
            self._directory_synced_version = max(
                self._directory_synced_version, ticket.directory_version
            )

    def drop_tail(self, log_end_offset: int) -> None:
        """The log was truncated to ``log_end_offset``: tickets begun before no longer
        count, and nothing past the new end is flushed or ticketed."""
        self._generation += 1
        self._flushed_offset = min(self._flushed_offset, log_end_offset)
        self._flush_target_offset = min(self._flush_target_offset, log_end_offset)

    def restart_at(self, offset: int) -> None:
        """The log restarted empty at ``offset`` (a new segment file, old ones unlinked)."""
        self._generation += 1
        self._flushed_offset = offset
        self._flush_target_offset = offset
        self._first_unflushed_ms = None
        self._directory_version += 1
