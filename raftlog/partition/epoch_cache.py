"""The leader-epoch cache of one partition: which leader epoch wrote which offsets.

Kafka's ``LeaderEpochFileCache``: a list of (epoch, start offset) entries, both strictly
increasing, where an entry says "epoch E started writing at offset S". A new leader appends
(its epoch, its log end offset); every appended batch (leader or follower side) appends
(its partitionLeaderEpoch, its base offset) when that epoch is new. Followers ask the leader
``end_offset_for(their latest epoch)`` (OffsetForLeaderEpoch) and truncate to the answer, which
is what makes divergent tails after a leader change disappear (KIP-101, KIP-279).

Persisted in ``leader-epoch-checkpoint`` in Kafka's text format (version ``0``, the entry
count, then one ``epoch start_offset`` line per entry), replaced atomically and fsynced on
every change. Changes are rare (a new leader epoch, a truncation, retention), never per append.

Plain synchronous code, not thread-safe: the owning ``PartitionLog`` serialises access.
"""

from __future__ import annotations

import logging
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from raftlog.partition.files import write_atomically

__all__ = [
    "LEADER_EPOCH_CHECKPOINT",
    "UNDEFINED_EPOCH",
    "UNDEFINED_EPOCH_OFFSET",
    "EpochEntry",
    "LeaderEpochCache",
]

logger = logging.getLogger(__name__)

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1  # Kafka's RecordBatch.NO_PARTITION_LEADER_EPOCH
UNDEFINED_EPOCH_OFFSET = -1
_CHECKPOINT_VERSION = 0


@dataclass(frozen=True, slots=True)
class EpochEntry:
    """Leader ``epoch`` wrote its first offset at ``start_offset``."""

    epoch: int
    start_offset: int


class LeaderEpochCache:
    """Sorted (epoch, start offset) entries with Kafka's semantics; see the module docstring.

    Invariant: epochs and start offsets are both strictly increasing along ``entries``.
    ``path=None`` keeps the cache in memory only (tests, tools).
    """

    def __init__(self, path: Path | None, entries: Iterable[EpochEntry] = ()) -> None:
        self.path = path
        self._entries: list[EpochEntry] = list(entries)
        self._check_invariants()

    # --- persistence -----------------------------------------------------------------------

    @classmethod
    def load(cls, path: Path) -> LeaderEpochCache | None:
        """The cache stored at ``path``; None when the file is missing or unreadable (the
        caller then rebuilds it from the batch headers)."""
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        entries = _parse_checkpoint(text)
        if entries is None:
            logger.warning("%s: unreadable leader-epoch checkpoint; rebuilding it", path)
            return None
        return cls(path, entries)

    def _write(self) -> None:
        if self.path is None:
            return
        lines = [str(_CHECKPOINT_VERSION), str(len(self._entries))]
        lines += [f"{entry.epoch} {entry.start_offset}" for entry in self._entries]
        write_atomically(self.path, ("\n".join(lines) + "\n").encode())

    def replace(self, entries: Iterable[EpochEntry]) -> None:
        """Replace every entry (a rebuild from the log) and persist once."""
        self._entries = list(entries)
        self._check_invariants()
        self._write()

    # --- queries ---------------------------------------------------------------------------

    @property
    def entries(self) -> tuple[EpochEntry, ...]:
        return tuple(self._entries)

    @property
    def latest_epoch(self) -> int:
        """The newest epoch, or UNDEFINED_EPOCH (-1) when empty."""
        return self._entries[-1].epoch if self._entries else UNDEFINED_EPOCH

    @property
    def earliest_entry(self) -> EpochEntry | None:
        return self._entries[0] if self._entries else None

    def start_offset_of(self, epoch: int) -> int | None:
        """The start offset of ``epoch`` if it has an entry."""
        slot = bisect_left(self._entries, epoch, key=_epoch_of)
        if slot < len(self._entries) and self._entries[slot].epoch == epoch:
            return self._entries[slot].start_offset
        return None

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's ``endOffsetFor``: (the largest epoch <= ``requested_epoch``, the offset
        where the epoch after it starts); the latest epoch ends at ``log_end_offset``.

        * UNDEFINED_EPOCH requested, or an epoch newer than the latest → (-1, -1);
        * the latest epoch → (latest, ``log_end_offset``);
        * older than every entry → (``requested_epoch``, the first entry's start offset):
          that data is gone (retention), and the follower must start at what remains.
        """
        if requested_epoch == UNDEFINED_EPOCH or not self._entries:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if requested_epoch == self.latest_epoch:
            return requested_epoch, log_end_offset
        higher = bisect_right(self._entries, requested_epoch, key=_epoch_of)
        if higher == len(self._entries):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if higher == 0:
            return requested_epoch, self._entries[0].start_offset
        return self._entries[higher - 1].epoch, self._entries[higher].start_offset

    # --- updates ---------------------------------------------------------------------------

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; True if the cache changed.

        A no-op for the latest epoch at the same or a later offset (the per-append common
        case: O(1), no I/O). Epochs only increase along the cache: an entry that the new one
        contradicts (an epoch >= ``epoch``, or a start offset >= ``start_offset``) is removed
        first, as Kafka does; that only happens after a bug or a lost checkpoint, so it is
        logged.
        """
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"invalid leader epoch entry ({epoch}, {start_offset})")
        if self._entries:
            latest = self._entries[-1]
            if latest.epoch == epoch and latest.start_offset <= start_offset:
                return False
        kept = len(self._entries)
        while kept and (
            self._entries[kept - 1].epoch >= epoch
            or self._entries[kept - 1].start_offset >= start_offset
        ):
            kept -= 1
        removed = self._entries[kept:]
        # Replacing one entry at the same offset is normal: an epoch that wrote nothing.
        if len(removed) > 1 or (removed and removed[0].start_offset != start_offset):
            logger.warning(
                "%s: assigning (%d, %d) removes non-monotonic entries %s",
                self.path, epoch, start_offset, removed,
            )
        del self._entries[kept:]
        self._entries.append(EpochEntry(epoch, start_offset))
        self._check_invariants()
        self._write()
        return True

    def truncate_from_end(self, end_offset: int) -> bool:
        """Drop entries starting at or after ``end_offset`` (the log was truncated there)."""
        kept = bisect_left(self._entries, end_offset, key=_start_of)
        if kept == len(self._entries):
            return False
        del self._entries[kept:]
        self._write()
        return True

    def truncate_from_start(self, start_offset: int) -> bool:
        """Forget offsets below ``start_offset`` (retention): entries starting at or before it
        go, and the last of them is kept, moved up to ``start_offset``."""
        removed = bisect_right(self._entries, start_offset, key=_start_of)
        if removed == 0:
            return False
        last = self._entries[removed - 1]
        if removed == 1 and last.start_offset == start_offset:
            return False
        self._entries[:removed] = [EpochEntry(last.epoch, start_offset)]
        self._check_invariants()
        self._write()
        return True

    def clear(self) -> None:
        if self._entries:
            self._entries.clear()
            self._write()

    def _check_invariants(self) -> None:
        for before, after in pairwise(self._entries):
            assert before.epoch < after.epoch, self._entries
            assert before.start_offset < after.start_offset, self._entries
        assert all(e.epoch >= 0 and e.start_offset >= 0 for e in self._entries[:1])


def entries_from_batches(batches: Iterable[tuple[int, int]]) -> list[EpochEntry]:
    """The cache entries implied by (partitionLeaderEpoch, base offset) of consecutive
    batches, applying ``assign``'s rules (batches without an epoch are skipped)."""
    cache = LeaderEpochCache(None)
    for epoch, base_offset in batches:
        if epoch >= 0:
            cache.assign(epoch, base_offset)
    return list(cache.entries)


def _epoch_of(entry: EpochEntry) -> int:
    return entry.epoch


def _start_of(entry: EpochEntry) -> int:
    return entry.start_offset


def _parse_checkpoint(text: str) -> list[EpochEntry] | None:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) < 2 or lines[0] != str(_CHECKPOINT_VERSION) or not lines[1].isdigit():
        return None
    count = int(lines[1])
    if len(lines) != 2 + count:
        return None
    entries: list[EpochEntry] = []
    for line in lines[2:]:
        fields = line.split(" ")
        if len(fields) != 2 or not all(field.isdigit() for field in fields):
            return None
        entries.append(EpochEntry(int(fields[0]), int(fields[1])))
    for before, after in pairwise(entries):
        if before.epoch >= after.epoch or before.start_offset >= after.start_offset:
            return None
    return entries
