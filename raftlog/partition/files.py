"""Small blocking file helpers shared by segments, indexes and checkpoints."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_directory", "open_directory", "write_all", "write_atomically"]

TMP_SUFFIX = ".tmp"


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """os.write until every byte is written (a regular-file write may be short, e.g. ENOSPC
    after a partial write)."""
    with memoryview(data) as view:
        written = 0
        while written < len(view):
            count = os.write(fd, view[written:])
            assert count > 0
            written += count


def open_directory(directory: Path) -> int:
    return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def fsync_directory(directory: Path) -> None:
    """Make creations, renames and unlinks in ``directory`` durable."""
    fd = open_directory(directory)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, data: bytes) -> None:
    """Create or replace ``path`` with ``data`` and fsync it (not its directory)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes, *, sync_directory: bool = True) -> None:
    """Replace ``path`` with ``data`` so a crash leaves either the old or the new contents:
    write a temp file, fsync it, rename over ``path``, then fsync the directory."""
    tmp_path = path.with_name(path.name + TMP_SUFFIX)
    write_synced(tmp_path, data)
    os.replace(tmp_path, path)
    if sync_directory:
        fsync_directory(path.parent)
