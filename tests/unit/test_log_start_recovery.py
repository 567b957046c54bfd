"""The log start offset across crashes and I/O errors (review 3): a checkpoint above the
recovered end restarts the log empty at the checkpoint; a failed directory fsync takes the
log offline; an offline log is neither truncated nor reset; reset_to keeps memory consistent
when an unlink fails; retention wakes waiters; a directory fsync done by a deletion is
recorded."""
from __future__ import annotations

import errno
import os
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
import trio
import trio.testing

import raftlog.partition.epoch_cache as epoch_cache_module
import raftlog.partition.files as files
import raftlog.partition.log_retention as log_retention
import raftlog.partition.log_truncation as log_truncation
from raftlog.broker.apis import KafkaApis
from raftlog.config import ServerConfig
from raftlog.metadata.image import MetadataImage
from raftlog.partition.batch import build_batch, decode_records
from raftlog.partition.errors import OffsetOutOfRangeError
from raftlog.partition.log import KafkaStorageError, LogConfig, PartitionLog
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import now_ms
from raftlog.partition.producer_snapshot import log_headers
from raftlog.partition.segment import Segment
from raftlog.protocol import codec
from raftlog.protocol.codec import RequestHeader
from raftlog.protocol.schemas import LIST_OFFSETS
from raftlog.quorum.interface import Quorum
from raftlog.replication.fetcher import FollowerAssignment, LeaderFetcher
from raftlog.replication.manager import ReplicaManager
from raftlog.server.listener import RequestContext
from tests.unit.test_delete_records import fail_delete_of

T0 = 1_700_000_000_000
DAY_MS = 24 * 3600 * 1000


def one(value: bytes = b"v" * 10) -> bytes:
    return build_batch([(b"k", value, [])], timestamp_ms=T0)


def flush(log: PartitionLog) -> None:
    ticket = log.begin_flush()
    if ticket is not None:
        ticket.run()
        log.complete_flush(ticket)


def eio(*_: object) -> None:
    raise OSError(errno.EIO, "Input/output error")


def crash_below_checkpoint(directory: Path) -> None:
    """Offsets 0..4 fsynced, 5..9 appended (relaxed flushing), DeleteRecords(8), then a
    power loss drops 5..9: the checkpoint (8) is above the recovered end (5)."""
    log = PartitionLog.open(directory, LogConfig(flush_messages=1_000_000), T0)
    log.assign_leader_epoch(0)
    for _ in range(5):
        log.append(one(), leader_epoch=0, now_ms=T0)
    flush(log)
    durable_size = log.segments[-1].size_bytes  # the file runs on: preallocated
    durable = {s.log_path for s in log.segments}
    for _ in range(5):
        log.append(one(), leader_epoch=0, now_ms=T0)
    assert log.advance_log_start_offset(8)
    log.close()
    for path in directory.glob("*.log"):
        if path not in durable:
            path.unlink()
    os.truncate(sorted(durable)[-1], durable_size)


@pytest.mark.parametrize("segment_bytes", [1 << 30, 3 * len(one())], ids=["one", "rolled"])
def test_checkpoint_above_the_recovered_end_restarts_the_log_there(
        tmp_path: Path, segment_bytes: int) -> None:
    directory = tmp_path / "t-0"
    crash_below_checkpoint(directory)
    config = LogConfig(flush_messages=1_000_000, segment_bytes=segment_bytes)
    log = PartitionLog.open(directory, config, T0)
    assert (log.log_start_offset, log.log_end_offset) == (8, 8), "the start never moves back"
    assert log.segment_base_offsets == [8]
    assert [p.name for p in directory.glob("*.log")] == [f"{8:020d}.log"]
    assert log.epoch_cache.entries == (), "no batch is left for any epoch to describe"
    for _ in range(5):  # offsets 8..12, fsynced: acknowledged
        log.append(one(b"new"), leader_epoch=1, now_ms=T0)
    flush(log)
    assert log.log_end_offset == 13
    log.close()

    log = PartitionLog.open(directory, config, T0)  # a clean restart keeps them all
    assert (log.log_start_offset, log.log_end_offset) == (8, 13)
    assert [h.base_offset for h in log_headers(log, 8)] == [8, 9, 10, 11, 12]
    log.close()


def test_failed_directory_fsync_after_the_checkpoint_takes_the_log_offline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), T0)
    log.assign_leader_epoch(3)
    for _ in range(10):
        log.append(one(), leader_epoch=3, now_ms=T0)
    monkeypatch.setattr(log_retention, "fsync_directory", eio)
    monkeypatch.setattr(files, "fsync_directory", eio)  # the epoch file's rewrite fails too
    with pytest.raises(KafkaStorageError):
        log.advance_log_start_offset(5)
    assert log.offline_reason is not None
    assert log.log_start_offset == 5, "the disk may already say 5: serve nothing below it"
    assert log.epoch_cache.entries[0].start_offset == 5
    with pytest.raises(KafkaStorageError):
        log.append(one(), leader_epoch=3, now_ms=T0)
    log.close()


def test_epoch_file_failure_after_a_durable_checkpoint_still_deletes_segments(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "t-0"
    log = PartitionLog.open(directory, LogConfig(segment_bytes=3 * len(one())), T0)
    log.assign_leader_epoch(0)
    for _ in range(10):
        log.append(one(), leader_epoch=0, now_ms=T0)
    assert log.segment_base_offsets == [0, 3, 6, 9]
    monkeypatch.setattr(epoch_cache_module, "write_atomically", eio)
    assert log.advance_log_start_offset(7)
    assert log.offline_reason is None
    assert log.segment_base_offsets == [6, 9]
    assert sorted(p.name for p in directory.glob("*.log")) == [f"{6:020d}.log", f"{9:020d}.log"]
    monkeypatch.undo()
    log.close()
    log = PartitionLog.open(directory, LogConfig(segment_bytes=3 * len(one())), T0)
    assert log.log_start_offset == 7
    assert log.epoch_cache.entries[0].start_offset == 7, "the stale epoch file is trimmed"
    log.close()


def test_an_offline_log_is_neither_truncated_nor_reset(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=200), T0)
    for _ in range(10):
        log.append(one(), leader_epoch=0, now_ms=T0)
    log.mark_offline("fsync", OSError(errno.EIO, "Input/output error"))
    calls: list[Path] = []
    monkeypatch.setattr(log_retention, "fsync_directory", calls.append)
    monkeypatch.setattr(log_truncation, "fsync_directory", calls.append)
    bases = log.segment_base_offsets
    with pytest.raises(KafkaStorageError):
        log.truncate_to(4)
    with pytest.raises(KafkaStorageError):
        log.reset_to(100)
    assert not calls
    assert (log.log_start_offset, log.log_end_offset, log.segment_base_offsets) == (0, 10, bases)
    log.close()


def test_reset_to_keeps_memory_consistent_when_an_unlink_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "t-0"
    config = LogConfig(segment_bytes=3 * len(one()))
    log = PartitionLog.open(directory, config, T0)
    for _ in range(10):
        log.append(one(), leader_epoch=0, now_ms=T0)
    assert log.segment_base_offsets == [0, 3, 6, 9]
    fail_delete_of(3, monkeypatch)
    log.reset_to(20)  # a follower below the leader's log start: no exception
    monkeypatch.undo()
    assert (log.log_start_offset, log.log_end_offset, log.segment_base_offsets) == (20, 20, [20])
    assert sorted(p.name for p in directory.glob("*.log")) == [
        f"{b:020d}.log" for b in (3, 6, 9, 20)], "oldest first, stopping at the failure"
    with pytest.raises(OffsetOutOfRangeError):
        log.read(5, 1 << 20)
    log.append(one(), leader_epoch=0, now_ms=T0)
    log.close()
    log = PartitionLog.open(directory, config, T0)  # the next open deletes the leftovers
    assert (log.log_start_offset, log.log_end_offset, log.segment_base_offsets) == (20, 21, [20])
    log.close()


def test_a_failed_unlink_in_truncate_to_takes_the_log_offline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An I/O error half-way through a truncation leaves memory and disk apart: the log goes
    offline (KafkaStorageError, which the follower backs off on) instead of raising a bare
    OSError and carrying on; a restart recovers it."""
    directory = tmp_path / "t-0"
    config = LogConfig(segment_bytes=3 * len(one()))
    log = PartitionLog.open(directory, config, T0)
    for _ in range(10):
        log.append(one(), leader_epoch=0, now_ms=T0)
    flush(log)
    log.append(one(), leader_epoch=0, now_ms=T0)
    ticket = log.begin_flush()  # a flush in flight across the failed truncation
    assert ticket is not None
    fail_delete_of(6, monkeypatch)
    with pytest.raises(KafkaStorageError):
        log.truncate_to(4)
    monkeypatch.undo()
    ticket.run()
    log.complete_flush(ticket)  # dropped: the log changed and is offline (no assertion)
    assert log.flushed_offset <= log.log_end_offset
    with pytest.raises(KafkaStorageError):
        log.append(one(), leader_epoch=0, now_ms=T0)
    log.close()
    log = PartitionLog.open(directory, config, T0)
    assert log.log_end_offset >= 4, "nothing below the truncation point is lost"
    assert log.truncate_to(4) == 4
    log.append(one(), leader_epoch=1, now_ms=T0)  # rolls cleanly past the old bases
    log.append(one(), leader_epoch=1, now_ms=T0)
    log.append(one(), leader_epoch=1, now_ms=T0)
    assert log.log_end_offset == 7
    log.close()


def test_reset_to_that_cannot_create_its_segment_leaves_the_log_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk error before anything changed is a KafkaStorageError (the follower backs off
    and retries), not a bare OSError, and the log stays writable."""
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=3 * len(one())), T0)
    for _ in range(5):
        log.append(one(), leader_epoch=0, now_ms=T0)
    monkeypatch.setattr(Segment, "create", eio)
    with pytest.raises(KafkaStorageError):
        log.reset_to(20)
    monkeypatch.undo()
    assert (log.log_start_offset, log.log_end_offset) == (0, 5)
    log.append(one(), leader_epoch=0, now_ms=T0)
    log.reset_to(20)
    assert (log.log_start_offset, log.log_end_offset) == (20, 20)
    log.close()


def test_a_roll_removes_a_stray_segment_of_a_failed_reset_unlink(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """reset_to below the log start (the leader's log starts lower) cannot unlink segment 6:
    the file stays, above the new start (logged, not fatal). The roll to offset 6 removes it
    instead of failing on O_EXCL at every roll there, and its old records are never served."""
    directory = tmp_path / "t-0"
    config = LogConfig(segment_bytes=3 * len(one()))
    log = PartitionLog.open(directory, config, T0)
    for _ in range(10):
        log.append(one(b"o" * 10), leader_epoch=0, now_ms=T0)
    assert log.advance_log_start_offset(5)
    assert log.segment_base_offsets == [3, 6, 9]
    fail_delete_of(6, monkeypatch)
    log.reset_to(0)
    monkeypatch.undo()
    assert (directory / f"{6:020d}.log").exists()
    for _ in range(9):
        log.append(one(), leader_epoch=1, now_ms=T0)
    assert log.segment_base_offsets == [0, 3, 6]
    values = []
    for base in (0, 3, 6):  # a read stays within one segment
        with log.read(base, 1 << 20) as read:
            values += [r.value for r in decode_records(read.read_bytes())]
    assert values == [b"v" * 10] * 9
    log.close()


def test_a_deletion_records_its_directory_fsync(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=3 * len(one())), T0)
    for _ in range(10):
        log.append(one(), leader_epoch=0, now_ms=T0)
    flush(log)
    assert log.begin_flush() is None
    assert log.advance_log_start_offset(7)  # unlinks two segments and fsyncs the directory
    assert log.begin_flush() is None, "the directory was fsynced already"
    log.close()


def test_retention_wakes_waiters(tmp_path: Path) -> None:
    async def main() -> None:
        manager = PartitionManager(tmp_path, node_id=1)
        configs = {"segment.bytes": str(3 * len(one())), "retention.ms": str(DAY_MS)}
        partition = manager.ensure_partition("t", 0, configs, leader_epoch=0)
        old = now_ms() - 10 * DAY_MS
        for _ in range(10):
            partition.log.append(build_batch([(b"k", b"v", [])], timestamp_ms=old),
                                 leader_epoch=0, now_ms=now_ms())
        partition.high_watermark = 10
        woken = trio.Event()

        async def waiter() -> None:
            await partition.wait_until(lambda: partition.log.log_start_offset > 0,
                                       trio.current_time() + 3600)
            woken.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            assert manager.enforce_retention() > 0
            with trio.fail_after(30):  # without a wake-up the waiter sleeps for an hour
                await woken.wait()
        assert partition.log.log_start_offset > 0
        manager.close()

    trio.run(main)


def test_follower_truncation_of_an_offline_log_backs_off(tmp_path: Path) -> None:
    """The fetcher's truncation meets KafkaStorageError: the partition backs off, still
    needing truncation, and the fetcher round does not fail (no reconnect, no traceback)."""
    async def main() -> None:
        manager = PartitionManager(tmp_path, node_id=2)
        partition = manager.ensure_partition("t", 0, {}, leader_epoch=0)
        for _ in range(10):
            partition.log.append(one(), leader_epoch=0, now_ms=T0)
        partition.is_leader = False
        partition.high_watermark = 4
        partition.log.mark_offline("fsync", OSError(errno.EIO, "Input/output error"))
        replicas = ReplicaManager(manager)
        fetcher = LeaderFetcher(replicas, leader_id=1)
        assignment = FollowerAssignment(partition, leader_id=1, leader_epoch=1)
        fetcher.add(assignment)
        # The leader's OffsetForLeaderEpoch answer: epoch 0 ended at 4 there.
        answer = SimpleNamespace(error_code=0, leader_epoch=0, end_offset=4)
        assert not fetcher._apply_epoch_end(assignment, answer)
        assert partition.log.log_end_offset == 10, "an offline log is not truncated"
        assert assignment.needs_truncation
        assert assignment.delayed_until > trio.current_time()
        manager.close()

    trio.run(main)


def test_list_offsets_earliest_answers_the_epoch_of_the_log_start(tmp_path: Path) -> None:
    """As Kafka: ListOffsets EARLIEST answers the earliest epoch-cache entry's epoch when it
    starts at or below the log start, else -1 (not the current leader epoch)."""
    config = ServerConfig.from_properties({"node.id": "1", "log.dirs": str(tmp_path)})
    manager = PartitionManager(tmp_path, node_id=1)
    partition = manager.ensure_partition("t", 0, {}, leader_epoch=7)
    partition.log.assign_leader_epoch(2)
    for _ in range(3):
        partition.log.append(one(), leader_epoch=2, now_ms=T0)
    partition.log.assign_leader_epoch(7)
    partition.log.append(one(), leader_epoch=7, now_ms=T0)
    partition.high_watermark = 4
    apis = KafkaApis(config, cast(Quorum, SimpleNamespace(image=MetadataImage())), manager)

    def earliest() -> tuple[int, int, int]:
        raw = codec.encode_bytes(LIST_OFFSETS, 7, {"replica_id": -1, "topics": [
            {"name": "t", "partitions": [{"partition_index": 0, "timestamp": -2,
                                          "current_leader_epoch": 7}]}]}, is_request=True)
        body = codec.decode(LIST_OFFSETS, 7, raw, is_request=True)
        answer = apis.offset_apis.list_offsets(RequestContext(
            LIST_OFFSETS, RequestHeader(LIST_OFFSETS.key, 7, 1, "c"), body, "peer"))
        assert isinstance(answer, dict)
        result = answer["topics"][0]["partitions"][0]
        return result["error_code"], result["offset"], result["leader_epoch"]

    assert earliest() == (0, 0, 2)
    assert partition.move_log_start_offset(3)
    assert earliest() == (0, 3, 7)
    partition.log.epoch_cache.clear()  # no entry covers the start (a log without epochs)
    assert earliest() == (0, 3, -1)
    manager.close()
