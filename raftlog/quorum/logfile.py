"""The on-disk metadata log and its checkpoints (blocking file I/O; call from a worker thread).

Layout, under ``<metadata.log.dir>/__cluster_metadata-0/``:

* ``00000000000000000000.log``: frames ``[u32 length][u32 crc32c][payload]`` (big-endian), each
  payload a CBOR map ``{"offset": int, "command": bytes}`` where ``command`` is an encoded
  :class:`~raftlog.metadata.records.Command`. Offsets are consecutive. After a checkpoint the file
  is truncated, so its first frame may start at any offset above the checkpoint's.
* ``<20-digit offset>.checkpoint``: one frame whose payload is a state-machine snapshot taken
  after applying that offset.

Failure policy. A frame that is short or fails its CRC is a torn write: recovery truncates the log
there and logs a WARNING, never raises. A frame that passes its CRC but does not decode, offsets
that skip, or a log that starts after the checkpoint ends are not torn writes but lost or foreign
data: recovery raises :class:`MetadataLogCorruptError` rather than start with a silent hole.
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import crc32c

from raftlog.metadata import _codec
from raftlog.metadata._codec import CodecError

logger = logging.getLogger(__name__)

PARTITION_DIR_NAME: Final = "__cluster_metadata-0"
LOG_FILE_NAME: Final = f"{0:020d}.log"
CHECKPOINT_SUFFIX: Final = ".checkpoint"
TMP_SUFFIX: Final = ".tmp"
FRAME_HEADER: Final = struct.Struct(">II")
# Why 8 MiB: a CreateTopic with 10,000 partitions at replication factor 3 is ~200 KiB; anything
# near this bound is a corrupt length field, not a record.
FRAME_PAYLOAD_BYTES_MAX: Final = 8 * 1024 * 1024
# Checkpoints hold the whole image; allow more than a single log record.
CHECKPOINT_PAYLOAD_BYTES_MAX: Final = 512 * 1024 * 1024


class MetadataLogCorruptError(Exception):
    """The metadata log or checkpoint is damaged beyond a torn tail; refusing to start."""


def encode_frame(payload: bytes) -> bytes:
    """Frame ``payload`` as ``[u32 length][u32 crc32c][payload]``."""
    assert 0 < len(payload) <= CHECKPOINT_PAYLOAD_BYTES_MAX
    return FRAME_HEADER.pack(len(payload), crc32c.crc32c(payload)) + payload


@dataclass(slots=True)
class FrameScan:
    """Result of :func:`scan_frames`: the good prefix and why scanning stopped early."""

    payloads: list[bytes] = field(default_factory=list)
    valid_bytes: int = 0
    problem: str | None = None


def scan_frames(data: bytes, payload_bytes_max: int = FRAME_PAYLOAD_BYTES_MAX) -> FrameScan:
    """Split ``data`` into frame payloads, stopping at the first short or corrupt frame."""
    scan = FrameScan()
    position = 0
    while position < len(data):
        if len(data) - position < FRAME_HEADER.size:
            scan.problem = "short frame header"
            break
        length, crc = FRAME_HEADER.unpack_from(data, position)
        if not 0 < length <= payload_bytes_max:
            scan.problem = f"invalid frame length {length}"
            break
        payload = data[position + FRAME_HEADER.size : position + FRAME_HEADER.size + length]
        if len(payload) < length:
            scan.problem = f"short frame payload ({len(payload)} of {length} bytes)"
            break
        if crc32c.crc32c(payload) != crc:
            scan.problem = "frame CRC mismatch"
            break
        scan.payloads.append(payload)
        position += FRAME_HEADER.size + length
    scan.valid_bytes = position
    return scan


def encode_entry(offset: int, command: bytes) -> bytes:
    """The payload of one log frame."""
    assert offset >= 0
    return _codec.dumps({"offset": offset, "command": command})


def decode_entry(payload: bytes) -> tuple[int, bytes]:
    """Inverse of :func:`encode_entry`.

    Raises:
        CodecError: the payload is not a log entry.
    """
    plain = _codec.loads(payload)
    if not isinstance(plain, dict) or set(plain) != {"offset", "command"}:
        raise CodecError("log entry must be a map with offset and command")
    offset = _codec.from_plain(int, plain["offset"], "entry.offset")
    command = _codec.from_plain(bytes, plain["command"], "entry.command")
    return offset, command


@dataclass(slots=True)
class RecoveredLog:
    """What is on disk: the newest good checkpoint and the log entries after it."""

    snapshot: bytes | None
    snapshot_version: int
    entries: list[tuple[int, bytes]]
    log_bytes: int


def recover(partition_dir: Path) -> RecoveredLog:
    """Read the checkpoint and log, truncating a torn log tail.

    Raises:
        MetadataLogCorruptError: see the module docstring.
    """
    partition_dir.mkdir(parents=True, exist_ok=True)
    _remove_tmp_files(partition_dir)
    snapshot_version, snapshot = _load_newest_checkpoint(partition_dir)
    log_path = partition_dir / LOG_FILE_NAME
    data = log_path.read_bytes() if log_path.exists() else b""
    scan = scan_frames(data)
    if scan.problem is not None:
        logger.warning(
            "metadata log %s: %s at byte %d; truncating %d torn bytes",
            log_path, scan.problem, scan.valid_bytes, len(data) - scan.valid_bytes,
        )  # fmt: skip
        _truncate(log_path, scan.valid_bytes)
    entries = _entries_after(scan.payloads, snapshot_version, log_path)
    return RecoveredLog(snapshot, snapshot_version, entries, scan.valid_bytes)


def _entries_after(
    payloads: list[bytes], snapshot_version: int, log_path: Path
) -> list[tuple[int, bytes]]:
    entries: list[tuple[int, bytes]] = []
    previous: int | None = None
    for index, payload in enumerate(payloads):
        try:
            offset, command = decode_entry(payload)
        except CodecError as exc:
            raise MetadataLogCorruptError(f"{log_path}: frame {index}: {exc}") from exc
        if previous is not None and offset != previous + 1:
            raise MetadataLogCorruptError(f"{log_path}: offset {offset} follows {previous}")
        previous = offset
        if offset > snapshot_version:
            entries.append((offset, command))
    if entries and entries[0][0] != snapshot_version + 1:
        raise MetadataLogCorruptError(
            f"{log_path}: log starts at offset {entries[0][0]} but the checkpoint ends at "
            f"{snapshot_version}; records in between are lost"
        )
    return entries


def _load_newest_checkpoint(partition_dir: Path) -> tuple[int, bytes | None]:
    for version, path in sorted(_checkpoints(partition_dir), reverse=True):
        data = path.read_bytes()
        scan = scan_frames(data, CHECKPOINT_PAYLOAD_BYTES_MAX)
        if scan.problem is None and len(scan.payloads) == 1:
            return version, scan.payloads[0]
        # Kafka does the same with a corrupt snapshot: drop it and try the previous one.
        logger.warning("checkpoint %s is corrupt (%s); ignoring it", path, scan.problem)
    return -1, None


def _checkpoints(partition_dir: Path) -> list[tuple[int, Path]]:
    found = []
    for path in partition_dir.glob("*" + CHECKPOINT_SUFFIX):
        stem = path.name.removesuffix(CHECKPOINT_SUFFIX)
        if len(stem) == 20 and stem.isdigit():
            found.append((int(stem), path))
    return found


def checkpoint_path(partition_dir: Path, version: int) -> Path:
    """File name of the checkpoint taken after applying offset ``version``."""
    assert version >= 0
    return partition_dir / f"{version:020d}{CHECKPOINT_SUFFIX}"


def write_checkpoint(partition_dir: Path, version: int, snapshot: bytes) -> Path:
    """Durably write a checkpoint: tmp file, fsync, rename, fsync the directory."""
    final_path = checkpoint_path(partition_dir, version)
    tmp_path = final_path.with_name(final_path.name + TMP_SUFFIX)
    with open(tmp_path, "wb") as tmp:
        tmp.write(encode_frame(snapshot))
        tmp.flush()
        os.fsync(tmp.fileno())
    os.replace(tmp_path, final_path)
    fsync_dir(partition_dir)
    return final_path


def remove_checkpoints_before(partition_dir: Path, version: int) -> None:
    """Delete checkpoints older than ``version`` (after the log no longer needs them)."""
    removed = False
    for old_version, path in _checkpoints(partition_dir):
        if old_version < version:
            path.unlink()
            removed = True
    if removed:
        fsync_dir(partition_dir)


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _truncate(path: Path, size_bytes: int) -> None:
    with open(path, "r+b") as file:
        file.truncate(size_bytes)
        file.flush()
        os.fsync(file.fileno())


def _remove_tmp_files(partition_dir: Path) -> None:
    for path in partition_dir.glob("*" + TMP_SUFFIX):
        logger.info("removing leftover %s from an interrupted checkpoint", path)
        path.unlink()


class LogWriter:
    """Appends frames to the log file and makes them durable. Not thread-safe."""

    def __init__(self, partition_dir: Path) -> None:
        path = partition_dir / LOG_FILE_NAME
        created = not path.exists()
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        if created:
            fsync_dir(partition_dir)
        self.path = path

    def append(self, data: bytes) -> None:
        """Write ``data`` at the end of the log and fsync it."""
        fd = self._require_fd()
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)

    def truncate_all(self) -> None:
        """Empty the log (everything in it is covered by a durable checkpoint)."""
        fd = self._require_fd()
        os.ftruncate(fd, 0)
        os.fsync(fd)

    def size_bytes(self) -> int:
        """Current length of the log file."""
        return os.fstat(self._require_fd()).st_size

    def close(self) -> None:
        """Close the file; safe to call twice."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _require_fd(self) -> int:
        assert self._fd is not None, "log writer is closed"
        return self._fd
