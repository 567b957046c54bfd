"""The ``log-start-offset`` checkpoint: the durable record of where a partition's log starts.

DeleteRecords and retention move the start up, and a follower's reset moves it anywhere; the
checkpoint is written (and fsynced) before memory moves, so a restart never serves records
below a start that was acknowledged. Format: a version line ``0`` and the offset.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from raftlog.partition.files import TMP_SUFFIX, write_all

__all__ = [
    "LOG_START_OFFSET_CHECKPOINT",
    "read_log_start_checkpoint",
    "replace_log_start_checkpoint",
]

logger = logging.getLogger(__name__)

LOG_START_OFFSET_CHECKPOINT = "log-start-offset"
_CHECKPOINT_VERSION = "0"


def read_log_start_checkpoint(directory: Path) -> int | None:
    """The checkpointed log start offset, or None when there is none (or it is unreadable)."""
    path = directory / LOG_START_OFFSET_CHECKPOINT
    try:
        lines = path.read_text().split()
    except FileNotFoundError:
        return None
    if len(lines) == 2 and lines[0] == _CHECKPOINT_VERSION and lines[1].isdigit():
        return int(lines[1])
    logger.warning("%s: unreadable checkpoint %r; ignoring it", path, lines)
    return None


def replace_log_start_checkpoint(directory: Path, log_start_offset: int) -> None:
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
