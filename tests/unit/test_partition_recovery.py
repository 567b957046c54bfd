"""Crash recovery: torn or corrupt tails are cut exactly; bad index files are rebuilt."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from raftlog.partition.batch import build_batch, validate_batches
from raftlog.partition.log import LogConfig, PartitionLog

T0 = 1_700_000_000_000
INDEX_INTERVAL_BYTES = 300


def batch(count: int, timestamp_ms: int) -> bytes:
    return build_batch(
        [(b"key", b"x" * (37 * count), [("h", b"1")]) for _ in range(count)],
        timestamp_ms=timestamp_ms,
    )


class Fixture:
    """A log with batches of varied sizes, and the bytes each batch was stored as."""

    def __init__(self, root: Path, batch_count: int = 12, segment_bytes: int = 1 << 20) -> None:
        self.directory = root / "topic-0"
        self.config = LogConfig(
            segment_bytes=segment_bytes, index_interval_bytes=INDEX_INTERVAL_BYTES
        )
        log = self.open()
        self.stored: list[tuple[int, bytes]] = []  # (base offset, stored batch bytes)
        for i in range(batch_count):
            info = log.append(batch(1 + i % 4, T0 + i), leader_epoch=1, now_ms=T0)
            with log.read(info.base_offset, 0) as result:
                self.stored.append((info.base_offset, result.read_bytes()))
        self.segments = log.segment_base_offsets
        log.close()

    def open(self) -> PartitionLog:
        return PartitionLog.open(self.directory, self.config, T0)

    def path(self, base_offset: int, suffix: str = ".log") -> Path:
        return self.directory / f"{base_offset:020d}{suffix}"

    def expect_prefix(self, log: PartitionLog, kept_batches: int) -> None:
        """The log holds exactly the first ``kept_batches`` batches, byte for byte."""
        kept = self.stored[:kept_batches]
        assert log.log_end_offset == kept[-1][0] + _count(kept[-1][1])
        for base_offset, data in kept:
            with log.read(base_offset, 0) as result:
                assert result.read_bytes() == data, f"batch at {base_offset}"


def _count(data: bytes) -> int:
    (header,) = validate_batches(data)
    return header.records_count


def _active_file_offset_of(fixture: Fixture, batch_number: int) -> int:
    """Byte position of a batch inside the (single) segment file."""
    return sum(len(data) for _, data in fixture.stored[:batch_number])


@pytest.mark.parametrize("cut_bytes", [1, 30, 61, 62])
def test_torn_last_batch_is_cut(
    tmp_path: Path, cut_bytes: int, caplog: pytest.LogCaptureFixture
) -> None:
    fixture = Fixture(tmp_path)
    path = fixture.path(0)
    size = path.stat().st_size
    last = len(fixture.stored[-1][1])
    os.truncate(path, size - last + cut_bytes)
    torn = path.read_bytes()[size - last:]
    with caplog.at_level(logging.WARNING):
        log = fixture.open()
    if torn.strip(b"\0"):
        assert f"dropping {cut_bytes} bytes" in caplog.text
    else:  # indistinguishable from a preallocated tail: cut off quietly
        assert "dropping" not in caplog.text
    assert path.stat().st_size == size - last
    fixture.expect_prefix(log, len(fixture.stored) - 1)
    assert log.append(batch(1, T0), leader_epoch=2, now_ms=T0).base_offset == (
        fixture.stored[-1][0]
    ), "the lost offsets are assigned again"
    log.close()


@pytest.mark.parametrize("byte_in_batch", [21, 40, 70, -1])
def test_flipped_byte_in_last_batch_is_cut(tmp_path: Path, byte_in_batch: int) -> None:
    fixture = Fixture(tmp_path)
    path = fixture.path(0)
    last_start = _active_file_offset_of(fixture, len(fixture.stored) - 1)
    data = bytearray(path.read_bytes())
    position = last_start + byte_in_batch if byte_in_batch >= 0 else len(data) - 1
    data[position] ^= 0x40
    path.write_bytes(bytes(data))
    log = fixture.open()
    assert path.stat().st_size == last_start
    fixture.expect_prefix(log, len(fixture.stored) - 1)
    log.close()


def test_corruption_in_the_middle_cuts_from_there(tmp_path: Path) -> None:
    fixture = Fixture(tmp_path)
    path = fixture.path(0)
    start = _active_file_offset_of(fixture, 5)
    data = bytearray(path.read_bytes())
    data[start + 16] = 1  # magic
    path.write_bytes(bytes(data))
    log = fixture.open()
    fixture.expect_prefix(log, 5)
    log.close()


def test_uncovered_base_offset_is_checked_by_contiguity(tmp_path: Path) -> None:
    fixture = Fixture(tmp_path)
    path = fixture.path(0)
    start = _active_file_offset_of(fixture, len(fixture.stored) - 1)
    data = bytearray(path.read_bytes())
    data[start] ^= 0x01  # baseOffset is not CRC-covered
    path.write_bytes(bytes(data))
    log = fixture.open()
    fixture.expect_prefix(log, len(fixture.stored) - 1)
    log.close()


@pytest.mark.parametrize("tail", [b"\x00" * 4096, b"\x00" * 10, b"\xff" * 100])
def test_garbage_tail_is_dropped(tmp_path: Path, tail: bytes) -> None:
    fixture = Fixture(tmp_path)
    with fixture.path(0).open("ab") as file:
        file.write(tail)
    log = fixture.open()
    fixture.expect_prefix(log, len(fixture.stored))
    log.close()


def test_empty_log_file(tmp_path: Path) -> None:
    fixture = Fixture(tmp_path)
    os.truncate(fixture.path(0), 0)
    log = fixture.open()
    assert (log.log_start_offset, log.log_end_offset, log.size_bytes) == (0, 0, 0)
    log.close()


# --- rolled segments ----------------------------------------------------------------------------


def _rolled_fixture(tmp_path: Path) -> Fixture:
    fixture = Fixture(tmp_path, batch_count=30, segment_bytes=2_000)
    assert len(fixture.segments) >= 4
    return fixture


def _read_everything_and_close(log: PartitionLog) -> bytes:
    data = _read_everything(log)
    log.close()
    return data


def _read_everything(log: PartitionLog) -> bytes:
    chunks = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        with log.read(offset, 1 << 20) as result:
            data = result.read_bytes()
        chunks.append(data)
        offset = validate_batches(data)[-1].next_offset
    return b"".join(chunks)


@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
@pytest.mark.parametrize("damage", ["delete", "odd_size", "unsorted", "past_end", "zeros"])
def test_bad_index_files_are_rebuilt(tmp_path: Path, suffix: str, damage: str) -> None:
    fixture = _rolled_fixture(tmp_path)
    everything = _read_everything_and_close(fixture.open())
    target = fixture.segments[1]
    path = fixture.path(target, suffix)
    original = path.read_bytes()
    assert len(original) >= 24, "the fixture should give the segment several index entries"
    damaged = {
        "delete": None,
        "odd_size": original + b"\x01",
        "unsorted": original[len(original) // 2 :] + original[: len(original) // 2],
        "past_end": original + (2**30).to_bytes(4, "big") * (3 if suffix == ".timeindex" else 2),
        "zeros": bytes(len(original)),
    }[damage]
    if damaged is None:
        path.unlink()
    else:
        path.write_bytes(damaged)
    log = fixture.open()
    assert path.read_bytes() == original, "rebuilt from the log, identical to the original"
    assert log.segment_base_offsets == fixture.segments, "an intact log loses nothing"
    assert _read_everything(log) == everything
    assert log.offset_for_timestamp(T0 + 20) == (fixture.stored[20][0], T0 + 20)
    log.close()


def test_torn_rolled_segment_drops_everything_after_it(tmp_path: Path) -> None:
    """A crash can lose un-fsynced bytes of a rolled segment; nothing after them was
    acknowledged as flushed, so the log is cut back to a clean prefix."""
    fixture = _rolled_fixture(tmp_path)
    target = fixture.segments[1]
    path = fixture.path(target)
    os.truncate(path, path.stat().st_size - 5)
    log = fixture.open()
    assert log.segment_base_offsets == fixture.segments[:2]
    assert not fixture.path(fixture.segments[2]).exists()
    kept = [i for i, (offset, _) in enumerate(fixture.stored) if offset < fixture.segments[2]]
    fixture.expect_prefix(log, len(kept) - 1)
    assert log.append(batch(1, T0), leader_epoch=2, now_ms=T0).base_offset == log.log_end_offset - 1
    log.close()


def test_leftover_files_are_removed(tmp_path: Path) -> None:
    fixture = Fixture(tmp_path)
    (fixture.directory / "00000000000000000000.index.tmp").write_bytes(b"junk")
    orphan = fixture.path(999, ".timeindex")
    orphan.write_bytes(b"")
    fixture.path(999, ".txnindex").write_bytes(b"")
    (fixture.directory / "00000000000000000000.log.cleaned").write_bytes(b"junk")
    (fixture.directory / "00000000000000000000.index.swap").write_bytes(b"junk")
    log = fixture.open()
    names = sorted(p.name for p in fixture.directory.iterdir())
    assert names == [f"{0:020d}.log", f"{0:020d}.txnindex", "leader-epoch-checkpoint"]
    log.close()


def test_stale_time_index_is_detected_by_the_tail_check(tmp_path: Path) -> None:
    """A time index missing its last entries would understate the segment's largest
    timestamp (early time retention, missed ListOffsets hits): the tail scan catches it."""
    fixture = _rolled_fixture(tmp_path)
    path = fixture.path(fixture.segments[1], ".timeindex")
    original = path.read_bytes()
    path.write_bytes(original[:-12])
    log = fixture.open()
    assert path.read_bytes() == original
    log.close()


def test_shorter_offset_index_is_still_usable(tmp_path: Path) -> None:
    fixture = _rolled_fixture(tmp_path)
    everything = _read_everything_and_close(fixture.open())
    path = fixture.path(fixture.segments[1], ".index")
    path.write_bytes(path.read_bytes()[:-8])
    log = fixture.open()
    assert _read_everything(log) == everything, "a sparser index only means longer scans"
    log.close()


def test_active_segment_index_files_are_not_kept(tmp_path: Path) -> None:
    fixture = _rolled_fixture(tmp_path)
    active = fixture.segments[-1]
    fixture.path(active, ".index").write_bytes(b"\x00" * 8)
    log = fixture.open()
    assert not fixture.path(active, ".index").exists(), "rebuilt in memory, never trusted"
    log.close()
