"""This node's snapshots of the metadata state machine, as pysyncobj's tick thread handles them.

:class:`SnapshotKeeper` is the part of :class:`~raftlog.quorum.raft_syncobj.RaftSyncObj` that
knows snapshot files and the state machine but none of pysyncobj's internals: it serializes and
restores the machine (pysyncobj's ``serializer`` / ``deserializer`` callbacks), collects a snapshot
a leader sends in chunks, and finds where the journal continues after the snapshot at start-up.
Everything here runs on the tick thread.

Durability: own snapshots are fsynced by :func:`~raftlog.quorum.raft_storage.write_snapshot_file`
before they replace the previous one; a received one is assembled here and only written (durably)
once ``RaftSyncObj`` decided to install it, never renamed over this node's own snapshot unread as
pysyncobj did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raftlog.metadata.state import MetadataStateMachine
from raftlog.quorum.raft_events import RaftListener
from raftlog.quorum.raft_storage import (
    DurableJournal,
    RaftSnapshot,
    read_snapshot_file,
    write_snapshot_file,
)


class SnapshotKeeper:
    """Writes, reads and receives snapshots of ``machine`` (tick thread only).

    Args:
        machine: The node's state machine (serialized into, and restored from, snapshots).
        listener: Told about the image a restored snapshot produced.
        path: The snapshot file (pysyncobj's ``fullDumpFile``).

    Attributes:
        loaded: Whether the latest :meth:`deserialize` restored the machine (pysyncobj logs a
            failed load and carries on; the caller resets this before loading to find out).
        written, installed: Snapshots written by this node, and received ones installed.
    """

    def __init__(self, machine: MetadataStateMachine, listener: RaftListener, path: Path) -> None:
        self.machine = machine
        self.listener = listener
        self.path = path
        self.loaded = False
        self.written = 0
        self.installed = 0
        self._incoming: bytearray | None = None

    def serialize(self, file_name: str, data: tuple[Any, Any, Any]) -> None:
        """pysyncobj's ``serializer``: write the machine with the log position it covers."""
        last, prev, cluster = data
        assert self.machine.image.version <= last[1]
        snapshot = RaftSnapshot(
            last=(bytes(last[0]), last[1], last[2]),
            prev=(bytes(prev[0]), prev[1], prev[2]),
            cluster=tuple(sorted(str(node.id) for node in cluster if node is not None)),
            state=self.machine.snapshot(),
        )
        write_snapshot_file(Path(file_name), snapshot)
        self.written += 1

    def deserialize(self, file_name: str) -> tuple[Any, Any, list[str]]:
        """pysyncobj's ``deserializer``: restore the machine; the log position it covers."""
        snapshot = read_snapshot_file(Path(file_name))
        self.machine.restore(snapshot.state)
        self.loaded = True
        self.listener.on_applied(self.machine.image)
        return snapshot.last, snapshot.prev, list(snapshot.cluster)

    def receive_chunk(self, chunk: tuple[Any, ...]) -> bytes | None:
        """Collect a snapshot sent in chunks; the whole snapshot once the last one arrived.

        Replaces pysyncobj's receiving side, which renames the received file over this node's
        own snapshot before anyone looked at it (and without fsync).
        """
        data, is_first, is_last = chunk
        if is_first:
            self._incoming = bytearray()
        if self._incoming is None:
            return None  # a chunk from the middle of a transmission we did not see start
        self._incoming += data
        if not is_last:
            return None
        complete = bytes(self._incoming)
        self._incoming = None
        return complete

    def on_disk(self) -> RaftSnapshot | None:
        """The snapshot file's contents, or None when there is none yet.

        Raises:
            RaftStorageError, OSError: the snapshot is unusable.
        """
        if not self.path.exists():
            return None
        return read_snapshot_file(self.path)


def trim_journal(journal: DurableJournal, snapshot: RaftSnapshot) -> None:
    """Drop the journal entries ``snapshot`` covers, keeping the ones after it.

    pysyncobj clears the whole journal unless its first two entries are the snapshot's last two;
    after a crash between writing a snapshot and compacting the journal they are not, and the
    entries after the snapshot (acknowledged ones) would be dropped.
    """
    for position in range(1, len(journal)):
        if journal[position] == snapshot.last and journal[position - 1] == snapshot.prev:
            if position > 1:
                journal.deleteEntriesTo(position - 1)
            return
