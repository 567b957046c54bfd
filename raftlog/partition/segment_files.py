"""The files of a log segment: their names, and the byte ranges readers take away.

Files are named by the segment's base offset, zero-padded to 20 digits so ``ls`` sorts them
numerically (Kafka's ``LogFileUtils``): ``<base>.log``, ``<base>.index``, ``<base>.timeindex``
and ``<base>.txnindex``. Recovery, compaction swaps and retention find segments on disk by
these names without opening them, so the naming lives apart from ``Segment``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "INDEX_SUFFIX",
    "LOG_SUFFIX",
    "SEGMENT_SUFFIXES",
    "TIME_INDEX_SUFFIX",
    "TXN_INDEX_SUFFIX",
    "FileSlice",
    "parse_base_offset",
    "segment_file_name",
]

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)
_BASE_OFFSET_DIGITS = 20


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:0{_BASE_OFFSET_DIGITS}d}{suffix}"


def parse_base_offset(path: Path, suffix: str) -> int | None:
    """The base offset encoded in a segment file name, or None for any other file."""
    stem = path.name.removesuffix(suffix)
    if path.name == stem or len(stem) != _BASE_OFFSET_DIGITS or not stem.isdigit():
        return None
    return int(stem)


@dataclass(slots=True)
class FileSlice:
    """A byte range of a segment file with its own dup'd fd, owned by the caller.

    Because the fd is private, retention deleting or closing the segment while the slice is
    being sent (e.g. with os.sendfile) is harmless. Close it exactly when done.
    """

    fd: int
    position: int
    size_bytes: int

    def read_bytes(self) -> bytes:
        """pread the whole range (shorter only if the file was truncated meanwhile)."""
        assert self.fd >= 0, "slice already closed"
        chunks: list[bytes] = []
        done = 0
        while done < self.size_bytes:
            chunk = os.pread(self.fd, self.size_bytes - done, self.position + done)
            if not chunk:
                break
            chunks.append(chunk)
            done += len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
