"""The active segment's file is allocated ahead of its appends (``files.preallocate``): the
data reads back the same, sealing and closing cut the zero tail off, recovery after a crash
drops a zero tail quietly and never mistakes it for damage, and a disk without room for the
chunk still takes the append."""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path

import pytest

from raftlog.partition import files
from raftlog.partition.batch import build_batch
from raftlog.partition.files import PREALLOCATE_BYTES_MIN
from raftlog.partition.log import LogConfig, PartitionLog
from tests.unit.test_partition_log import flush, read_all

T0 = 1_700_000_000_000


def batch(value: bytes = b"v" * 100) -> bytes:
    return build_batch([(b"k", value, [])], timestamp_ms=T0)


def open_log(directory: Path, **settings: int) -> PartitionLog:
    return PartitionLog.open(directory, LogConfig(**settings), T0)  # type: ignore[arg-type]


def stored(log: PartitionLog) -> bytes:
    return read_all(log, log.log_start_offset)


def test_the_file_runs_ahead_of_the_data_until_closed(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    for _ in range(5):
        log.append(batch(), leader_epoch=0, now_ms=T0)
    data = stored(log)
    [path] = (tmp_path / "t-0").glob("*.log")
    assert path.stat().st_size > PREALLOCATE_BYTES_MIN > len(data)
    assert path.read_bytes()[:len(data)] == data
    log.close()
    assert path.read_bytes() == data, "closing cuts the zero tail off"


def test_a_crash_leaves_a_zero_tail_that_recovery_drops_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = open_log(tmp_path / "t-0")
    for _ in range(5):
        log.append(batch(), leader_epoch=0, now_ms=T0)
    flush(log)
    data = stored(log)
    shutil.copytree(tmp_path / "t-0", tmp_path / "crashed")  # the files as a crash leaves them
    log.close()
    [path] = (tmp_path / "crashed").glob("*.log")
    assert path.stat().st_size > len(data)
    with caplog.at_level(logging.WARNING):
        recovered = open_log(tmp_path / "crashed")
    assert "dropping" not in caplog.text and "recovering" not in caplog.text
    assert recovered.log_end_offset == 5 and stored(recovered) == data
    assert path.stat().st_size == len(data)
    assert recovered.append(batch(), leader_epoch=0, now_ms=T0).base_offset == 5
    recovered.close()


def test_a_sealed_segment_with_a_zero_tail_keeps_every_later_segment(tmp_path: Path) -> None:
    """A crash after a roll cut the tail off but before a flush made the shorter length
    durable: the sealed segment fails its tail check and is scanned. Its zero tail is no damage,
    so the segments after it (which recovery deletes after a damaged one) all stay."""
    directory = tmp_path / "t-0"
    log = open_log(directory, segment_bytes=3 * len(batch()))
    for _ in range(10):
        log.append(batch(), leader_epoch=0, now_ms=T0)
    flush(log)
    data = stored(log)
    segments = log.segment_base_offsets
    assert len(segments) > 2
    log.close()
    sealed = sorted(directory.glob("*.log"))[0]
    with sealed.open("ab") as file:
        file.write(bytes(PREALLOCATE_BYTES_MIN))
    reopened = open_log(directory, segment_bytes=3 * len(batch()))
    assert reopened.segment_base_offsets == segments
    assert reopened.log_end_offset == 10 and stored(reopened) == data
    reopened.close()
    assert sealed.stat().st_size < PREALLOCATE_BYTES_MIN


def test_a_cleaned_segment_is_cut_before_it_is_synced(tmp_path: Path) -> None:
    """Sealing cuts the tail: a sealed segment's file ends with its last batch."""
    log = open_log(tmp_path / "t-0", segment_bytes=3 * len(batch()))
    for _ in range(7):
        log.append(batch(), leader_epoch=0, now_ms=T0)
    sealed = sorted((tmp_path / "t-0").glob("*.log"))[:-1]
    assert sealed
    for path in sealed:
        assert path.stat().st_size <= 3 * len(batch())
        assert path.read_bytes()[-1:] != b"" and path.stat().st_size % len(batch()) == 0
    log.close()


def test_no_room_for_the_chunk_still_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_room(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "posix_fallocate", no_room)
    log = open_log(tmp_path / "t-0")
    for _ in range(3):
        log.append(batch(), leader_epoch=0, now_ms=T0)
    [path] = (tmp_path / "t-0").glob("*.log")
    assert path.stat().st_size == 3 * len(batch()), "the writes extended the file themselves"
    assert stored(log) == path.read_bytes()
    log.close()
