"""Durable storage under pysyncobj: the Raft journal, its term/vote metadata, snapshots and
``meta.properties`` (blocking file I/O; the journal is used from the Raft tick thread).

Why our own journal: pysyncobj 0.3.17's ``FileJournal`` never fsyncs (an mmap that is flushed only
on shutdown), has no checksums, and rewrites itself in place on compaction, so a crash in the
middle of a compaction loses acknowledged entries (findings §6). :class:`DurableJournal` keeps
pysyncobj's ``Journal`` interface but:

* appends CRC-framed entries and fsyncs them in :meth:`DurableJournal.flush`, which the Raft layer
  calls before a follower acknowledges and before the leader counts its own entries;
* truncates a torn tail on open (never acknowledged, because acknowledging needs the fsync);
* drops entries (compaction, snapshot install) only after the snapshot that covers them is
  durable, and rewrites the remaining tail into a new file that is fsynced and renamed;
* stores currentTerm/votedFor synchronously through tmp file + fsync + rename + directory fsync.

Layout in ``<metadata.log.dir>/__cluster_metadata-0/``: ``raft.journal`` (header + frames
``[u32 length][u32 crc32c][u64 index][u64 term][command]``), ``raft.journal.meta`` (JSON),
``raft.snapshot`` (one frame holding a :class:`RaftSnapshot`), ``meta.properties``.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, overload

from raftlog.metadata import _codec
from raftlog.metadata._codec import CodecError
from raftlog.quorum import logfile

logger = logging.getLogger(__name__)

JOURNAL_FILE_NAME: Final = "raft.journal"
SNAPSHOT_FILE_NAME: Final = "raft.snapshot"
META_PROPERTIES_FILE_NAME: Final = "meta.properties"
# Present from the start that created the directory until the voter may vote (raft_rejoin).
REJOIN_MARKER_FILE_NAME: Final = "raft.rejoin"
JOURNAL_MAGIC: Final = b"RAFTLOGJ"
JOURNAL_FORMAT_VERSION: Final = 1
_JOURNAL_HEADER: Final = struct.Struct(">8sI")
_ENTRY_HEADER: Final = struct.Struct(">QQ")
_SNAPSHOT_KIND: Final = "raftlog.raft.snapshot"
_SNAPSHOT_FORMAT_VERSION: Final = 1
META_PROPERTIES_VERSION: Final = 1

# One journal entry as pysyncobj sees it: (command bytes, log index, term).
Entry = tuple[bytes, int, int]


class RaftStorageError(Exception):
    """The Raft journal, its metadata or a snapshot is damaged beyond a torn tail."""


class MetaPropertiesError(Exception):
    """``meta.properties`` belongs to another cluster or node, or cannot be read."""


def fsync_file(path: Path) -> None:
    """fsync an existing file by name."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: tmp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(path.name + logfile.TMP_SUFFIX)
    with open(tmp, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)
    logfile.fsync_dir(path.parent)


class DurableJournal:
    """pysyncobj's ``Journal`` interface over a CRC-framed, fsynced file. See the module docstring.

    Not thread-safe: only the Raft tick thread (or, before it starts, the constructor's thread)
    uses it.

    Attributes:
        fsync_count: Journal fsyncs so far (entries made durable in batches).
        meta_fsync_count: Durable metadata writes so far (term/vote, commit index).
    """

    def __init__(self, path: Path, snapshot_path: Path) -> None:
        self._path = path
        self._snapshot_path = snapshot_path
        self._meta_path = path.with_name(path.name + ".meta")
        self._entries: list[Entry] = []
        self._ends: list[int] = []
        self._size = _JOURNAL_HEADER.size
        self._dirty = False
        self._fd: int | None = None
        self.fsync_count = 0
        self.meta_fsync_count = 0
        self._meta = self._load_meta()
        self._meta_saved = True
        self._open()

    # --- Entries ----------------------------------------------------------------------------

    def add(self, command: bytes, idx: int, term: int) -> None:
        """Append an entry (durable only after the next :meth:`flush`)."""
        assert not self._entries or idx == self._entries[-1][1] + 1, (idx, self._entries[-1])
        command = bytes(command)
        frame = logfile.encode_frame(_ENTRY_HEADER.pack(idx, term) + command)
        self._pwrite_all(frame, self._size)
        self._size += len(frame)
        self._entries.append((command, idx, term))
        self._ends.append(self._size)
        self._dirty = True

    def flush(self) -> None:
        """Make every appended entry and truncation durable (no-op when nothing changed)."""
        if not self._dirty:
            return
        os.fsync(self._require_fd())
        self.fsync_count += 1
        self._dirty = False

    @property
    def dirty(self) -> bool:
        """Whether entries were appended or truncated since the last :meth:`flush`."""
        return self._dirty

    def clear(self) -> None:
        """Drop every entry (pysyncobj does this when installing a snapshot)."""
        self._make_snapshot_durable()
        self._rewrite([])

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        """Drop entries at list positions ``>= entryFrom`` (a conflicting tail)."""
        if entryFrom >= len(self._entries):
            return
        assert entryFrom >= 0
        new_size = self._ends[entryFrom - 1] if entryFrom > 0 else _JOURNAL_HEADER.size
        os.ftruncate(self._require_fd(), new_size)
        del self._entries[entryFrom:]
        del self._ends[entryFrom:]
        self._size = new_size
        self._dirty = True

    def deleteEntriesTo(self, entryTo: int) -> None:
        """Drop entries at list positions ``< entryTo`` (compaction after a snapshot)."""
        if entryTo <= 0:
            return
        # The snapshot covering these entries must be durable before they are forgotten.
        self._make_snapshot_durable()
        self._rewrite(self._entries[entryTo:])

    @overload
    def __getitem__(self, item: int) -> Entry: ...

    @overload
    def __getitem__(self, item: slice) -> list[Entry]: ...

    def __getitem__(self, item: int | slice) -> Entry | list[Entry]:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def _destroy(self) -> None:
        if self._fd is None:
            return
        self.flush()
        if not self._meta_saved:
            self._store_meta()
        os.close(self._fd)
        self._fd = None

    # --- Term, vote and commit index --------------------------------------------------------

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        """Remember the commit index; it is stored once a second (it is only a hint)."""
        if self._meta.get("raftCommitIndex") != raftCommitIndex:
            self._meta["raftCommitIndex"] = raftCommitIndex
            self._meta_saved = False

    def getRaftCommitIndex(self) -> int:
        value = self._meta.get("raftCommitIndex", 1)
        assert isinstance(value, int)
        return value

    def setCurrentTerm(self, term: int, votedForNodeId: str | None) -> None:
        """Durably store term and vote before pysyncobj sends anything that reflects them."""
        self._meta["currentTerm"] = term
        self._meta["votedForNodeId"] = votedForNodeId
        self._store_meta()

    def getCurrentTerm(self) -> int:
        value = self._meta.get("currentTerm", 0)
        assert isinstance(value, int)
        return value

    def getVotedForNodeId(self) -> str | None:
        value = self._meta.get("votedForNodeId")
        assert value is None or isinstance(value, str)
        return value

    def onOneSecondTimer(self) -> None:
        if not self._meta_saved:
            self._store_meta()

    # --- Internals ----------------------------------------------------------------------------

    def _open(self) -> None:
        if not self._path.exists():
            write_durably(self._path, _JOURNAL_HEADER.pack(JOURNAL_MAGIC, JOURNAL_FORMAT_VERSION))
        data = self._path.read_bytes()
        if len(data) < _JOURNAL_HEADER.size:
            raise RaftStorageError(f"{self._path}: shorter than its header")
        magic, version = _JOURNAL_HEADER.unpack_from(data)
        if magic != JOURNAL_MAGIC or version != JOURNAL_FORMAT_VERSION:
            raise RaftStorageError(f"{self._path}: not a raftlog journal (format {version})")
        scan = logfile.scan_frames(data[_JOURNAL_HEADER.size :])
        position = _JOURNAL_HEADER.size
        for payload in scan.payloads:
            if len(payload) < _ENTRY_HEADER.size:
                raise RaftStorageError(f"{self._path}: entry frame shorter than its header")
            idx, term = _ENTRY_HEADER.unpack_from(payload)
            if self._entries and idx != self._entries[-1][1] + 1:
                raise RaftStorageError(f"{self._path}: entry {idx} follows {self._entries[-1][1]}")
            position += logfile.FRAME_HEADER.size + len(payload)
            self._entries.append((payload[_ENTRY_HEADER.size :], idx, term))
            self._ends.append(position)
        self._size = position
        self._fd = os.open(self._path, os.O_RDWR)
        if scan.problem is not None:
            # Never acknowledged: acknowledging an entry needs the fsync that completes it.
            logger.warning(
                "raft journal %s: %s after %d entries; truncating %d torn bytes",
                self._path, scan.problem, len(self._entries), len(data) - position,
            )  # fmt: skip
            os.ftruncate(self._fd, position)
            os.fsync(self._fd)

    def _rewrite(self, entries: list[Entry]) -> None:
        tmp = self._path.with_name(self._path.name + logfile.TMP_SUFFIX)
        chunks = [_JOURNAL_HEADER.pack(JOURNAL_MAGIC, JOURNAL_FORMAT_VERSION)]
        ends = []
        position = _JOURNAL_HEADER.size
        for command, idx, term in entries:
            frame = logfile.encode_frame(_ENTRY_HEADER.pack(idx, term) + command)
            chunks.append(frame)
            position += len(frame)
            ends.append(position)
        with open(tmp, "wb") as file:
            file.write(b"".join(chunks))
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, self._path)
        logfile.fsync_dir(self._path.parent)
        self.fsync_count += 1
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self._path, os.O_RDWR)
        self._entries = list(entries)
        self._ends = ends
        self._size = position
        self._dirty = False

    def _make_snapshot_durable(self) -> None:
        # pysyncobj renames the snapshot into place without fsync (its own or a received one).
        if self._snapshot_path.exists():
            fsync_file(self._snapshot_path)
        logfile.fsync_dir(self._snapshot_path.parent)

    def _pwrite_all(self, data: bytes, offset: int) -> None:
        fd = self._require_fd()
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, offset)
            view = view[written:]
            offset += written

    def _load_meta(self) -> dict[str, object]:
        try:
            text = self._meta_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        try:
            meta = json.loads(text)
        except ValueError as exc:
            # Forgetting a vote could let this node vote twice in one term: refuse to start.
            raise RaftStorageError(f"{self._meta_path}: unreadable term/vote metadata") from exc
        if not isinstance(meta, dict):
            raise RaftStorageError(f"{self._meta_path}: expected a JSON object")
        return meta

    def _store_meta(self) -> None:
        write_durably(self._meta_path, json.dumps(self._meta, sort_keys=True).encode())
        self.meta_fsync_count += 1
        self._meta_saved = True

    def _require_fd(self) -> int:
        assert self._fd is not None, "journal is closed"
        return self._fd


# --- Snapshots -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RaftSnapshot:
    """What ``raft.snapshot`` holds: the state machine plus pysyncobj's bookkeeping.

    Attributes:
        last: The last log entry the snapshot covers (its index is pysyncobj's lastApplied).
        prev: The entry before it (pysyncobj keeps both in the journal after loading).
        cluster: Node addresses (only used with dynamic membership, which raftlog does not use).
        state: ``MetadataStateMachine.snapshot()`` bytes (image + request-id window).
    """

    last: tuple[bytes, int, int]
    prev: tuple[bytes, int, int]
    cluster: tuple[str, ...]
    state: bytes


def encode_snapshot(snapshot: RaftSnapshot) -> bytes:
    """One CRC frame holding the snapshot (canonical CBOR)."""
    plain = {"kind": _SNAPSHOT_KIND, "format": _SNAPSHOT_FORMAT_VERSION}
    payload = _codec.dumps({**plain, "snapshot": _codec.to_plain(snapshot)})
    return logfile.encode_frame(payload)


def decode_snapshot(data: bytes) -> RaftSnapshot:
    """Inverse of :func:`encode_snapshot`.

    Raises:
        RaftStorageError: torn, corrupt or foreign data.
    """
    scan = logfile.scan_frames(data, logfile.CHECKPOINT_PAYLOAD_BYTES_MAX)
    if scan.problem is not None or len(scan.payloads) != 1:
        raise RaftStorageError(f"raft snapshot is damaged: {scan.problem or 'extra frames'}")
    try:
        plain = _codec.loads(scan.payloads[0])
        if not isinstance(plain, dict):
            raise CodecError("expected a map")
        header = (plain.get("kind"), plain.get("format"))
        if header != (_SNAPSHOT_KIND, _SNAPSHOT_FORMAT_VERSION):
            raise CodecError(f"not a raft snapshot of a supported format: {header}")
        snapshot: RaftSnapshot = _codec.from_plain(RaftSnapshot, plain["snapshot"], "snapshot")
    except (CodecError, KeyError) as exc:
        raise RaftStorageError(f"raft snapshot does not decode: {exc}") from exc
    return snapshot


def write_snapshot_file(path: Path, snapshot: RaftSnapshot) -> None:
    """Write and fsync ``path`` (pysyncobj renames it into place; the journal fsyncs the rename
    before it drops the entries the snapshot covers)."""
    with open(path, "wb") as file:
        file.write(encode_snapshot(snapshot))
        file.flush()
        os.fsync(file.fileno())


def read_snapshot_file(path: Path) -> RaftSnapshot:
    """Read and check a snapshot file.

    Raises:
        RaftStorageError: the file is damaged.
        OSError: it cannot be read.
    """
    return decode_snapshot(path.read_bytes())


# --- meta.properties -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MetaProperties:
    """Who this data directory belongs to (Kafka's ``meta.properties``)."""

    cluster_id: str
    node_id: int


def check_meta_properties(
    directory: Path, cluster_id: str | None, node_id: int, new_cluster_id: Callable[[], str]
) -> MetaProperties:
    """Read ``meta.properties`` (writing it durably on first start) and check it matches.

    Args:
        cluster_id: The configured cluster id, or None to accept the stored one.
        new_cluster_id: Makes a cluster id when none is configured or stored.

    Raises:
        MetaPropertiesError: the directory belongs to another cluster or node.
    """
    path = directory / META_PROPERTIES_FILE_NAME
    if not path.exists():
        # A new directory: a voter may have lost its disk, so it does not vote before the
        # rejoin guard clears this (written first: a crash in between writes it again).
        write_durably(directory / REJOIN_MARKER_FILE_NAME, b"new Raft directory\n")
        stored = MetaProperties(cluster_id or new_cluster_id(), node_id)
        text = (
            "# raftlog metadata quorum: written on first start, never changed\n"
            f"version={META_PROPERTIES_VERSION}\n"
            f"cluster.id={stored.cluster_id}\n"
            f"node.id={stored.node_id}\n"
        )
        write_durably(path, text.encode())
        return stored
    stored = _read_meta_properties(path)
    if cluster_id is not None and stored.cluster_id != cluster_id:
        raise MetaPropertiesError(
            f"{path} belongs to cluster {stored.cluster_id!r}, but cluster.id is {cluster_id!r}; "
            "refusing to start (use the right data directory or an empty one)"
        )
    if stored.node_id != node_id:
        raise MetaPropertiesError(
            f"{path} belongs to node.id {stored.node_id}, but this node is {node_id}; "
            "refusing to start (use the right data directory or an empty one)"
        )
    return stored


def prepare_data_dir(directory: Path, cluster_id: str | None, node_id: int) -> str:
    """Create the Raft quorum's data directory if needed and check that it is this node's.

    Args:
        cluster_id: The configured cluster id, or None to accept the stored one (or make one
            on first start).

    Returns:
        The cluster id from ``meta.properties``.

    Raises:
        MetaPropertiesError: the directory belongs to another cluster or node, or holds a
            single-voter (``LocalQuorum``) metadata log, which a Raft quorum cannot adopt.
    """
    directory.mkdir(parents=True, exist_ok=True)
    local_log = directory / logfile.LOG_FILE_NAME
    has_local = (local_log.exists() and local_log.stat().st_size > 0) or any(
        directory.glob("*" + logfile.CHECKPOINT_SUFFIX)
    )
    if has_local:
        raise MetaPropertiesError(
            f"{directory} holds a single-voter (LocalQuorum) metadata log; a Raft "
            "quorum cannot adopt it: start from an empty metadata.log.dir"
        )
    return check_meta_properties(directory, cluster_id, node_id, _new_cluster_id).cluster_id


def rejoin_pending(directory: Path) -> bool:
    """Whether this Raft directory was created by a start whose rejoin guard never finished."""
    return (directory / REJOIN_MARKER_FILE_NAME).exists()


def clear_rejoin(directory: Path) -> None:
    """The rejoin guard finished: this voter may vote from now on, across restarts too."""
    (directory / REJOIN_MARKER_FILE_NAME).unlink(missing_ok=True)
    logfile.fsync_dir(directory)


def _new_cluster_id() -> str:
    # Kafka's format: a random UUID in URL-safe base64 without padding (22 characters).
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def _read_meta_properties(path: Path) -> MetaProperties:
    values: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MetaPropertiesError(f"cannot read {path}: {exc}") from exc
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    try:
        version = int(values["version"])
        cluster_id = values["cluster.id"]
        node_id = int(values["node.id"])
    except (KeyError, ValueError) as exc:
        raise MetaPropertiesError(f"{path} is incomplete or malformed: {exc!r}") from exc
    if version != META_PROPERTIES_VERSION or not cluster_id:
        raise MetaPropertiesError(f"{path}: unsupported version {version} or empty cluster.id")
    return MetaProperties(cluster_id, node_id)
