"""Producer-state snapshot files and recovery (blocking file I/O: call from a worker thread or
at open time, as ``PartitionLog.open`` is).

A snapshot ``<20-digit offset>.snapshot`` lives in the partition directory next to the
segments and holds the state of every batch below ``offset`` (Kafka's ``ProducerStateManager``
writes the same names). It is written atomically: temp file, fsync, rename, directory fsync;
a leftover ``*.tmp`` is removed here and by ``PartitionLog.open``.

Recovery (Kafka's ``truncateAndReload``): only snapshots inside
``[log_start_offset, log_end_offset]`` are usable; newer ones describe data the log no longer
has (a crash lost the unflushed tail, or the log was truncated) and older ones would skip
batches that retention deleted. The newest usable snapshot that passes its CRC is loaded and
the log is replayed from its offset; a corrupt one is deleted and the next older one tried;
with none, the state is rebuilt from ``log_start_offset``.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

from raftlog.partition.batch import BatchHeader
from raftlog.partition.files import TMP_SUFFIX, fsync_directory, write_atomically, write_synced
from raftlog.partition.producer_state import CorruptSnapshotError, ProducerStateManager, headers_in

if TYPE_CHECKING:
    from raftlog.partition.log import PartitionLog

__all__ = [
    "SNAPSHOT_SUFFIX",
    "ReadHeaders",
    "SnapshotFence",
    "delete_snapshots",
    "list_snapshots",
    "load_latest_snapshot",
    "load_producer_state",
    "log_headers",
    "prune_snapshots",
    "reset_producer_state",
    "snapshot_path",
    "truncate_producer_state",
    "write_snapshot",
    "write_snapshot_bytes",
]

log = logging.getLogger(__name__)

SNAPSHOT_SUFFIX: Final = ".snapshot"
_NAME = re.compile(r"(\d{20})\.snapshot")

# Yields the stored headers (real base offsets) of every batch at or after the given offset,
# in log order. The caller builds it on the partition log (a header-only scan).
ReadHeaders = Callable[[int], Iterable[BatchHeader]]


def log_headers(
    log: PartitionLog, start_offset: int, chunk_bytes: int = 1 << 20
) -> Iterator[BatchHeader]:
    """A ``ReadHeaders`` over a ``PartitionLog``: the stored header of every batch from the one
    containing ``start_offset`` to the log end, reading ``chunk_bytes`` at a time (header
    parsing only: the log checked CRCs when it recovered). Blocking."""
    offset = start_offset
    while offset < log.log_end_offset:
        with log.read(offset, chunk_bytes) as piece:
            data = piece.read_bytes()
        if not data:
            raise ValueError(f"empty read at offset {offset} below the log end")
        for header in headers_in(data):
            yield header
            offset = header.next_offset


def snapshot_path(directory: Path, offset: int) -> Path:
    return directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def list_snapshots(directory: Path) -> list[int]:
    """Offsets of the snapshot files in ``directory``, ascending."""
    offsets = []
    for path in directory.iterdir():
        match = _NAME.fullmatch(path.name)
        if match is not None:
            offsets.append(int(match.group(1)))
    return sorted(offsets)


class SnapshotFence:
    """Orders snapshot writes in worker threads against truncations on the owner task.

    A snapshot is encoded on the owner task at offset O and written by a worker thread. If
    the log is truncated below O meanwhile, that file describes batches the log no longer
    holds, and once the log grows past O again a restart (or a later truncation's reload)
    would trust it: a retry answered as a duplicate of a batch that is not in the log (an
    acknowledged write lost), a new batch refused as out of sequence. So a truncation bumps
    ``generation`` and deletes the snapshots above its offset under the lock, and a write
    renames its file into place under the same lock only if the generation it was encoded
    in is still current. One per partition replica."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.generation = 0

    def truncated(self, directory: Path, offset: int) -> list[int]:
        """The log now ends at ``offset``: fence off snapshots encoded before, delete those
        above it (durably). Owner task; blocks only while a write renames its file."""
        with self._lock:
            self.generation += 1
            return delete_snapshots(directory, above=offset)

    def publish(self, tmp_path: Path, path: Path, generation: int) -> bool:
        """Rename a written and fsynced ``tmp_path`` to ``path`` unless a truncation came
        after ``generation`` (then the temp file is removed); True if published."""
        with self._lock:
            if generation != self.generation:
                tmp_path.unlink(missing_ok=True)
                return False
            os.replace(tmp_path, path)
        fsync_directory(path.parent)
        return True


def write_snapshot_bytes(directory: Path, offset: int, data: bytes, fence: SnapshotFence,
                         generation: int) -> Path | None:
    """Atomically write ``data`` (``ProducerStateManager.to_bytes()`` of a state whose
    ``end_offset`` is ``offset``) as the snapshot at ``offset``. Thread-safe: touches only
    its own files, so encode on the owner task and write in ``trio.to_thread.run_sync``,
    passing the partition's ``fence`` and its ``generation`` read when encoding; None if a
    truncation since then made the snapshot stale (nothing is left on disk)."""
    path = snapshot_path(directory, offset)
    tmp_path = path.with_name(path.name + TMP_SUFFIX)
    write_synced(tmp_path, data)
    return path if fence.publish(tmp_path, path, generation) else None


def write_snapshot(
    directory: Path, manager: ProducerStateManager, offset: int | None = None
) -> Path:
    """Snapshot ``manager`` at ``offset`` (default: its ``end_offset``). An ``offset`` above
    ``end_offset`` declares the batches in between free of producer ids and advances the
    manager to it."""
    if offset is not None:
        manager.advance_end_offset(offset)
    path = snapshot_path(directory, manager.end_offset)
    write_atomically(path, manager.to_bytes())
    return path


def delete_snapshots(
    directory: Path, *, above: int | None = None, below: int | None = None
) -> list[int]:
    """Delete snapshots at offsets ``> above`` or ``< below``, durably (directory fsync);
    returns their offsets. Call with ``above=offset`` after truncating the log to ``offset``
    (a snapshot above a truncation point must never come back once the log grows past it
    again) and with ``below=log_start_offset`` after retention (``deleteSnapshotsBefore``)."""
    deleted = [
        offset
        for offset in list_snapshots(directory)
        if (above is not None and offset > above) or (below is not None and offset < below)
    ]
    _unlink(directory, deleted)
    return deleted


def _unlink(directory: Path, offsets: list[int]) -> None:
    for offset in offsets:
        snapshot_path(directory, offset).unlink(missing_ok=True)
    if offsets:
        fsync_directory(directory)


def prune_snapshots(directory: Path, keep: int = 2) -> list[int]:
    """Keep only the newest ``keep`` snapshots (the older one is the fallback if the newest is
    corrupt); returns the offsets deleted."""
    assert keep >= 1
    deleted = list_snapshots(directory)[:-keep]
    _unlink(directory, deleted)
    return deleted


def load_latest_snapshot(
    directory: Path, *, max_offset: int, min_offset: int = 0
) -> tuple[int, ProducerStateManager] | None:
    """The newest valid snapshot in ``[min_offset, max_offset]`` as ``(offset, manager)``.

    Deletes leftover temp files, every snapshot outside the window, and each corrupt one met
    on the way (logged). None if no usable snapshot remains."""
    for path in directory.glob("*" + SNAPSHOT_SUFFIX + TMP_SUFFIX):
        path.unlink(missing_ok=True)
    for offset in delete_snapshots(directory, above=max_offset, below=min_offset):
        log.info("%s: deleted producer snapshot %d outside [%d, %d]", directory, offset,
                 min_offset, max_offset)
    for offset in reversed(list_snapshots(directory)):
        path = snapshot_path(directory, offset)
        try:
            manager = ProducerStateManager.from_bytes(path.read_bytes())
            if manager.end_offset != offset:
                raise CorruptSnapshotError(f"holds end offset {manager.end_offset}")
        except (CorruptSnapshotError, OSError) as exc:
            log.warning("%s: deleting corrupt producer snapshot: %s", path, exc)
            _unlink(directory, [offset])
            continue
        return offset, manager
    return None


def load_producer_state(
    directory: Path,
    *,
    log_start_offset: int,
    log_end_offset: int,
    read_headers: ReadHeaders,
    now_ms: int,
) -> ProducerStateManager:
    """The partition's producer state on open: the newest usable snapshot, then the log from
    its offset (or from ``log_start_offset``) to the end. Also use it after a truncation that
    ``ProducerStateManager.truncate_to`` could not absorb (see ``truncate_producer_state``)."""
    loaded = load_latest_snapshot(directory, max_offset=log_end_offset,
                                  min_offset=log_start_offset)
    manager = ProducerStateManager(log_start_offset) if loaded is None else loaded[1]
    if manager.end_offset < log_end_offset:
        manager.rebuild(read_headers(manager.end_offset), now_ms)
    if manager.end_offset > log_end_offset:  # a torn read_headers would be a caller bug
        raise ValueError(f"replay ended at {manager.end_offset}, log ends at {log_end_offset}")
    manager.advance_end_offset(log_end_offset)
    return manager


def truncate_producer_state(
    manager: ProducerStateManager,
    directory: Path,
    offset: int,
    *,
    log_start_offset: int,
    read_headers: ReadHeaders,
    now_ms: int,
    fence: SnapshotFence,
) -> ProducerStateManager:
    """After ``PartitionLog.truncate_to`` returned ``offset`` (the new log end): delete the
    snapshots above it (through ``fence``, which also voids snapshots being written) and
    return the exact state, ``manager`` itself when truncation did not touch any producer,
    else a state reloaded from snapshot + log."""
    fence.truncated(directory, offset)
    if manager.truncate_to(offset):
        return manager
    return load_producer_state(directory, log_start_offset=log_start_offset,
                               log_end_offset=offset, read_headers=read_headers, now_ms=now_ms)


def reset_producer_state(directory: Path, offset: int, fence: SnapshotFence
                         ) -> ProducerStateManager:
    """After ``PartitionLog.reset_to(offset)`` (Kafka's ``truncateFullyAndStartAt``): every
    snapshot is deleted (and any being written voided, through ``fence``) and the state
    starts empty at ``offset``."""
    fence.truncated(directory, -1)
    return ProducerStateManager(end_offset=offset)
