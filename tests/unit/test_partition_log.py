"""PartitionLog: append, read, roll, retention, timestamps, flush tickets, truncation."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from raftlog.partition.batch import build_batch, decode_records, parse_header, validate_batches
from raftlog.partition.errors import (
    CorruptRecordError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from raftlog.partition.log import LOG_APPEND_TIME, AppendInfo, LogConfig, PartitionLog

DAY_MS = 24 * 60 * 60 * 1000
T0 = 1_700_000_000_000


def batch(count: int = 1, *, timestamp_ms: int = T0, value_bytes: int = 10) -> bytes:
    return build_batch(
        [(b"k%d" % i, b"v" * value_bytes, []) for i in range(count)], timestamp_ms=timestamp_ms
    )


def open_log(directory: Path, now_ms: int = T0, **settings: int | str | None) -> PartitionLog:
    return PartitionLog.open(directory / "topic-0", LogConfig(**settings), now_ms)  # type: ignore[arg-type]


def read_all(log: PartitionLog, offset: int, max_bytes: int = 1 << 30) -> bytes:
    with log.read(offset, max_bytes) as result:
        return result.read_bytes()


def flush(log: PartitionLog) -> None:
    ticket = log.begin_flush()
    if ticket is not None:
        ticket.run()
        log.complete_flush(ticket)


# --- append and read ---------------------------------------------------------------------------


def test_append_read_round_trip(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    assert (log.log_start_offset, log.log_end_offset, log.flushed_offset) == (0, 0, 0)
    sent = batch(3, timestamp_ms=T0 + 5)
    info = log.append(sent, leader_epoch=4, now_ms=T0 + 9)
    assert info == AppendInfo(0, 2, T0 + 5, -1, 3, len(sent))
    second = log.append(batch(2), leader_epoch=4, now_ms=T0 + 9)
    assert (second.base_offset, second.last_offset) == (3, 4)
    assert log.log_end_offset == 5
    stored = read_all(log, 0)
    first, after = validate_batches(stored)  # CRCs still valid
    assert (first.base_offset, after.base_offset) == (0, 3)
    assert first.partition_leader_epoch == after.partition_leader_epoch == 4
    assert stored[8:12] == sent[8:12] and stored[16 : len(sent)] == sent[16:]
    assert [r.offset for r in decode_records(stored)] == [0, 1, 2, 3, 4]
    log.close()


def test_log_append_time(tmp_path: Path) -> None:
    log = open_log(tmp_path, message_timestamp_type=LOG_APPEND_TIME)
    info = log.append(batch(2, timestamp_ms=5), leader_epoch=0, now_ms=T0)
    assert info.log_append_time_ms == info.max_timestamp == T0
    (header,) = validate_batches(read_all(log, 0))
    assert header.timestamp_type == 1 and header.max_timestamp == T0
    log.close()


def test_rejected_append_writes_nothing(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_message_bytes=200)
    log.append(batch(1), leader_epoch=0, now_ms=T0)
    corrupt = bytearray(batch(1))
    corrupt[-1] ^= 0xFF
    control = build_batch([(b"", b"", [])], attributes=0x30)
    for records, error in [
        (batch(1) + bytes(corrupt), CorruptRecordError),
        (control, InvalidRecordError),
        (b"", InvalidRecordError),
        (batch(1, value_bytes=300), RecordTooLargeError),
    ]:
        with pytest.raises(error) as info:
            log.append(records, leader_epoch=0, now_ms=T0)
        assert info.value.error_code in (2, 87, 10)
        assert (log.log_end_offset, log.size_bytes) == (1, len(batch(1)))
    assert log.append(control, leader_epoch=0, now_ms=T0, allow_control=True).base_offset == 1
    log.close()


def test_read_from_inside_a_batch_returns_the_whole_batch(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(batch(5), leader_epoch=0, now_ms=T0)
    log.append(batch(5), leader_epoch=0, now_ms=T0)
    headers = validate_batches(read_all(log, 3))
    assert [h.base_offset for h in headers] == [0, 5]
    assert [h.base_offset for h in validate_batches(read_all(log, 7))] == [5]
    log.close()


def test_read_limits(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for _ in range(4):
        log.append(batch(2, value_bytes=100), leader_epoch=0, now_ms=T0)
    size = len(batch(2, value_bytes=100))

    def offsets(offset: int, max_bytes: int, **kwargs: int | bool | None) -> list[int]:
        with log.read(offset, max_bytes, **kwargs) as result:  # type: ignore[arg-type]
            data = result.read_bytes()
        return [h.base_offset for h in validate_batches(data)] if data else []

    assert offsets(0, 2 * size) == [0, 2]
    assert offsets(0, 2 * size - 1) == [0]
    assert offsets(0, 1) == [0], "KIP-74: the first batch is returned whole"
    assert offsets(0, 1, min_one_batch=False) == []
    assert offsets(2, 10 * size, max_offset=6) == [2, 4]
    assert offsets(2, 10 * size, max_offset=5) == [2, 4], "a batch starting below max_offset"
    assert offsets(2, 10 * size, max_offset=4) == [2]
    assert offsets(2, 10 * size, max_offset=2) == []
    assert offsets(8, 100) == [], "log_end_offset reads are empty"
    for bad in (-1, 9):
        with pytest.raises(OffsetOutOfRangeError) as info:
            log.read(bad, 100)
        assert info.value.error_code == 1
    log.close()


def test_file_slice_survives_segment_deletion(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=200, retention_bytes=0)
    for _ in range(4):
        log.append(batch(1, value_bytes=80), leader_epoch=0, now_ms=T0)
    result = log.read(0, 1000)
    expected = result.read_bytes()
    assert log.enforce_retention(T0) == 3
    assert not (tmp_path / "topic-0" / f"{0:020d}.log").exists()
    assert result.read_bytes() == expected, "the dup'd fd keeps the deleted file readable"
    result.close()
    log.close()


# --- segments ------------------------------------------------------------------------------------


def test_roll_by_bytes(tmp_path: Path) -> None:
    size = len(batch(1, value_bytes=50))
    log = open_log(tmp_path, segment_bytes=3 * size)
    for _ in range(10):
        log.append(batch(1, value_bytes=50), leader_epoch=0, now_ms=T0)
    assert log.segment_base_offsets == [0, 3, 6, 9]
    names = sorted(os.listdir(tmp_path / "topic-0"))
    assert f"{3:020d}.log" in names and f"{3:020d}.index" in names
    assert f"{3:020d}.timeindex" in names
    assert len(read_all(log, 0)) == 3 * size, "a read stays within one segment"
    assert len(read_all(log, 4)) == 2 * size
    assert len(read_all(log, 9)) == size
    log.close()


def open_fds_under(directory: Path) -> int:
    """This process's open fds on files in ``directory``."""
    fd_dir = Path("/proc/self/fd")
    targets = []
    for name in os.listdir(fd_dir):
        try:
            targets.append(os.readlink(fd_dir / name))
        except FileNotFoundError:
            continue  # the fd listdir itself used
    return sum(1 for target in targets if target.startswith(str(directory)))


def test_each_segment_holds_one_file_descriptor(tmp_path: Path) -> None:
    # 10,000 partitions on a node with a 20,000 open-file limit: two fds per segment (one
    # to read, one to append) ran out while the last topics were created.
    size = len(batch(1, value_bytes=50))
    log = open_log(tmp_path, segment_bytes=3 * size)
    for _ in range(7):
        log.append(batch(1, value_bytes=50), leader_epoch=0, now_ms=T0)
    assert log.segment_count == 3
    assert open_fds_under(tmp_path) == 3
    log.close()
    reopened = open_log(tmp_path, segment_bytes=3 * size)
    reopened.append(batch(1, value_bytes=50), leader_epoch=0, now_ms=T0)  # appends reuse it
    reopened.truncate_to(5)  # drops segment 6, cuts segment 3 (ftruncate on the same fd)
    assert reopened.segment_count == 2
    assert open_fds_under(tmp_path) == 2
    reopened.append(batch(1, value_bytes=50), leader_epoch=0, now_ms=T0)
    assert parse_header(read_all(reopened, 5)).base_offset == 5
    reopened.close()
    assert open_fds_under(tmp_path) == 0


def test_oversized_append_goes_to_an_empty_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=100)
    log.append(batch(1, value_bytes=500), leader_epoch=0, now_ms=T0)
    log.append(batch(1, value_bytes=500), leader_epoch=0, now_ms=T0)
    assert log.segment_base_offsets == [0, 1]
    log.close()


def test_roll_by_time(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_ms=1_000)
    log.append(batch(), leader_epoch=0, now_ms=T0)
    log.append(batch(), leader_epoch=0, now_ms=T0 + 1_000)
    assert log.segment_base_offsets == [0]
    log.append(batch(), leader_epoch=0, now_ms=T0 + 1_001)
    assert log.segment_base_offsets == [0, 2]
    log.append(batch(), leader_epoch=0, now_ms=T0 + 1_500)
    assert log.segment_base_offsets == [0, 2], "the new segment's clock starts at its first batch"
    log.close()


def test_sparse_offset_index(tmp_path: Path) -> None:
    size = len(batch(1, value_bytes=40))
    log = open_log(tmp_path, index_interval_bytes=2 * size, segment_bytes=9 * size)
    for _ in range(10):
        log.append(batch(1, value_bytes=40), leader_epoch=0, now_ms=T0)
    log.close()
    data = (tmp_path / "topic-0" / f"{0:020d}.index").read_bytes()
    assert data == b"".join(
        (2 * i).to_bytes(4, "big") + (2 * i * size).to_bytes(4, "big") for i in (1, 2, 3, 4)
    )


# --- retention -----------------------------------------------------------------------------------


def _three_segment_log(tmp_path: Path, **settings: int) -> PartitionLog:
    size = len(batch(1))
    log = open_log(tmp_path, segment_bytes=2 * size, **settings)
    for i in range(6):  # segments [0, 1], [2, 3], [4, 5]; batch i has timestamp T0 + i
        log.append(batch(1, timestamp_ms=T0 + i), leader_epoch=0, now_ms=T0 + i)
    assert log.segment_base_offsets == [0, 2, 4]
    return log


def test_retention_by_time(tmp_path: Path) -> None:
    log = _three_segment_log(tmp_path, retention_ms=DAY_MS)
    assert log.enforce_retention(T0 + DAY_MS + 1) == 0, "segment 0's largest timestamp is T0+1"
    assert log.enforce_retention(T0 + DAY_MS + 2) == 1
    assert (log.log_start_offset, log.segment_base_offsets) == (2, [2, 4])
    assert log.enforce_retention(T0 + 100 * DAY_MS) == 1, "never the active segment"
    assert log.log_start_offset == 4
    with pytest.raises(OffsetOutOfRangeError):
        log.read(3, 100)
    log.close()
    reopened = open_log(tmp_path)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (4, 6)
    reopened.close()


def test_unlimited_retention(tmp_path: Path) -> None:
    log = _three_segment_log(tmp_path, retention_ms=-1)
    assert log.enforce_retention(T0 + 1000 * DAY_MS) == 0
    log.close()


def test_retention_by_bytes_keeps_at_least_the_limit(tmp_path: Path) -> None:
    size = len(batch(1))
    log = _three_segment_log(tmp_path, retention_bytes=3 * size)
    assert log.enforce_retention(T0) == 1, "6 batches: dropping 2 leaves 4 >= 3"
    assert log.size_bytes == 4 * size and log.log_start_offset == 2
    assert log.enforce_retention(T0) == 0, "dropping 2 more would leave 2 < 3"
    log.close()


def test_checkpoint_survives_a_corrupt_file(tmp_path: Path) -> None:
    log = _three_segment_log(tmp_path, retention_bytes=0)
    log.enforce_retention(T0)
    log.close()
    (tmp_path / "topic-0" / "log-start-offset").write_text("garbage")
    reopened = open_log(tmp_path)
    assert reopened.log_start_offset == 4, "falls back to the first segment's base offset"
    reopened.close()


def test_checkpoint_is_restored_for_an_empty_directory(tmp_path: Path) -> None:
    directory = tmp_path / "topic-0"
    directory.mkdir()
    (directory / "log-start-offset").write_text("0\n42\n")
    log = open_log(tmp_path)
    assert (log.log_start_offset, log.log_end_offset) == (42, 42)
    assert log.append(batch(), leader_epoch=0, now_ms=T0).base_offset == 42
    log.close()


# --- timestamps ----------------------------------------------------------------------------------


def test_offset_for_timestamp_matches_scan(tmp_path: Path) -> None:
    timestamps = [5, 3, 9, 9, 12, 4, 30, 31, 31, 50, 2, 60]
    log = open_log(tmp_path, segment_bytes=4 * len(batch(2)), index_interval_bytes=1)
    for ts in timestamps:
        log.append(batch(2, timestamp_ms=ts), leader_epoch=0, now_ms=T0)
    assert len(log.segment_base_offsets) == 3
    for target in range(-1, 65):
        matches = [(2 * i, ts) for i, ts in enumerate(timestamps) if ts >= target]
        assert log.offset_for_timestamp(target) == (matches[0] if matches else None), target
    log.close()
    reopened = open_log(tmp_path)  # the same answers from loaded time indexes
    assert reopened.offset_for_timestamp(10) == (8, 12)
    assert reopened.offset_for_timestamp(61) is None
    reopened.close()


# --- flush ---------------------------------------------------------------------------------------


def test_flush_ticket_lifecycle(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=2 * len(batch()))
    assert log.begin_flush() is None and not log.needs_flush(T0)
    for _ in range(3):
        log.append(batch(), leader_epoch=0, now_ms=T0)
    assert (log.flushed_offset, log.unflushed_messages) == (0, 3)
    assert log.needs_flush(T0)
    ticket = log.begin_flush()
    assert ticket is not None and ticket.target_offset == 3
    assert set(ticket.segment_sizes) == {0, 2}, "the rolled segment is synced too"
    assert not log.needs_flush(T0), "everything is in a ticket"
    log.append(batch(), leader_epoch=0, now_ms=T0)
    worker = threading.Thread(target=ticket.run)
    worker.start()
    log.append(batch(), leader_epoch=0, now_ms=T0)  # appends continue during the fsync
    worker.join()
    log.complete_flush(ticket)
    assert (log.flushed_offset, log.unflushed_messages) == (3, 2)
    flush(log)
    assert (log.flushed_offset, log.unflushed_messages) == (5, 0)
    assert log.begin_flush() is None
    log.close()


def test_flush_policy_by_messages_and_time(tmp_path: Path) -> None:
    log = open_log(tmp_path, flush_messages=5, flush_ms=1_000)
    log.append(batch(3), leader_epoch=0, now_ms=T0)
    assert not log.needs_flush(T0 + 999)
    assert log.needs_flush(T0 + 1_000), "the oldest unflushed message waited flush_ms"
    log.append(batch(2), leader_epoch=0, now_ms=T0 + 10)
    assert log.needs_flush(T0 + 10), "flush_messages reached"
    flush(log)
    assert not log.needs_flush(T0 + 10_000)


def test_truncation_voids_in_flight_ticket(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for _ in range(4):
        log.append(batch(), leader_epoch=0, now_ms=T0)
    ticket = log.begin_flush()
    assert ticket is not None
    assert log.truncate_to(2) == 2
    for _ in range(3):
        log.append(batch(), leader_epoch=0, now_ms=T0)
    ticket.run()
    log.complete_flush(ticket)
    assert log.flushed_offset == 0, "offsets 2..3 now hold different, unsynced data"
    log.close()


# --- truncation ----------------------------------------------------------------------------------


def test_truncate_to(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=2 * len(batch(2)))
    for i in range(5):  # batches of 2: segments [0..3], [4..7], [8..9]
        log.append(batch(2, timestamp_ms=T0 + i), leader_epoch=0, now_ms=T0)
    assert log.segment_base_offsets == [0, 4, 8]
    assert log.truncate_to(10) == 10, "at or past the end: nothing to do"
    assert log.truncate_to(7) == 6, "the batch holding offset 7 goes entirely"
    assert log.segment_base_offsets == [0, 4]
    assert log.offset_for_timestamp(T0 + 3) is None
    assert log.append(batch(1), leader_epoch=1, now_ms=T0).base_offset == 6
    assert log.truncate_to(4) == 4
    assert log.segment_base_offsets == [0]
    assert [h.base_offset for h in validate_batches(read_all(log, 0))] == [0, 2]
    log.close()
    reopened = open_log(tmp_path)
    assert (reopened.segment_base_offsets, reopened.log_end_offset) == ([0], 4)
    assert reopened.append(batch(1), leader_epoch=2, now_ms=T0).base_offset == 4
    reopened.close()


def test_truncate_below_log_start_is_refused(tmp_path: Path) -> None:
    log = _three_segment_log(tmp_path, retention_bytes=0)
    log.enforce_retention(T0)
    with pytest.raises(OffsetOutOfRangeError):
        log.truncate_to(1)
    log.close()


def test_appended_header_matches_info(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    info = log.append(batch(4) + batch(2), leader_epoch=9, now_ms=T0)
    assert (info.base_offset, info.last_offset, info.record_count) == (0, 5, 6)
    assert parse_header(read_all(log, 4)).base_offset == 4
    log.close()


def test_no_fd_leaks(tmp_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    log = open_log(tmp_path, segment_bytes=2 * len(batch()), retention_bytes=0)
    for _ in range(7):
        log.append(batch(), leader_epoch=0, now_ms=T0)
    flush(log)
    read_all(log, 3)
    log.truncate_to(5)
    log.enforce_retention(T0)
    log.close()
    log = open_log(tmp_path)
    log.close()
    assert len(os.listdir("/proc/self/fd")) == before
