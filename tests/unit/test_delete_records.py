"""DeleteRecords storage and replication rules: ``PartitionLog.advance_log_start_offset``
(in a segment, across segments, restart, never backwards, crash between checkpoint and
segment deletion), the leader's low watermark (``LeaderState.low_watermark``), and the
checkpoint-before-memory order of every writer of the log start (DeleteRecords, retention,
reset, truncation): a failed checkpoint write changes nothing, so a retry writes it and a
restart never brings deleted records back."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pytest
import trio

import raftlog.partition.log as log_module
from raftlog.partition.batch import build_batch, decode_records
from raftlog.partition.errors import OffsetOutOfRangeError
from raftlog.partition.log import KafkaStorageError, LogConfig, PartitionLog
from raftlog.partition.manager import Partition, PartitionManager
from raftlog.partition.replica_state import LeaderState

T0 = 1_700_000_000_000
TRANSACTIONAL_FLAG = 0x10


def batch(count: int = 1) -> bytes:
    return build_batch([(b"k%d" % i, b"v" * 10, []) for i in range(count)], timestamp_ms=T0)


def open_log(tmp_path: Path, segment_bytes: int) -> PartitionLog:
    return PartitionLog.open(tmp_path / "topic-0", LogConfig(segment_bytes=segment_bytes), T0)


def three_segment_log(tmp_path: Path) -> PartitionLog:
    """Segments [0..3], [4..7], [8..11] (batches of 2 records, 2 batches a segment)."""
    log = open_log(tmp_path, 2 * len(batch(2)))
    for _ in range(6):
        log.append(batch(2), leader_epoch=0, now_ms=T0)
    assert log.segment_base_offsets == [0, 4, 8]
    return log


def offsets_from(log: PartitionLog, offset: int) -> list[int]:
    with log.read(offset, 1 << 20) as result:
        return [record.offset for record in decode_records(result.read_bytes())]


def test_start_inside_a_segment_keeps_the_segment(tmp_path: Path) -> None:
    log = three_segment_log(tmp_path)
    assert log.advance_log_start_offset(3)
    assert log.log_start_offset == 3 and log.segment_base_offsets == [0, 4, 8]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(2, 1000)
    # Reads at the start return the whole batch containing it (offsets 2 and 3), as in
    # Kafka; consumers skip records below the offset they asked for.
    assert offsets_from(log, 3)[:2] == [2, 3]
    log.close()


def test_start_across_segments_deletes_the_ones_below(tmp_path: Path) -> None:
    log = three_segment_log(tmp_path)
    assert log.advance_log_start_offset(9)
    assert log.log_start_offset == 9 and log.segment_base_offsets == [8]
    assert not (tmp_path / "topic-0" / "00000000000000000000.log").exists()
    assert not (tmp_path / "topic-0" / "00000000000000000004.log").exists()
    log.close()


def test_start_at_the_log_end_keeps_the_active_segment(tmp_path: Path) -> None:
    log = three_segment_log(tmp_path)
    assert log.advance_log_start_offset(12)
    assert (log.log_start_offset, log.log_end_offset) == (12, 12)
    assert log.segment_base_offsets == [8], "the active segment is never deleted"
    assert log.append(batch(1), leader_epoch=0, now_ms=T0).base_offset == 12
    with pytest.raises(OffsetOutOfRangeError):
        log.advance_log_start_offset(14)
    log.close()


def test_start_survives_a_restart(tmp_path: Path) -> None:
    log = three_segment_log(tmp_path)
    log.advance_log_start_offset(6)
    log.close()
    assert (tmp_path / "topic-0" / "log-start-offset").read_text() == "0\n6\n"
    reopened = open_log(tmp_path, 2 * len(batch(2)))
    assert (reopened.log_start_offset, reopened.segment_base_offsets) == (6, [4, 8])
    with pytest.raises(OffsetOutOfRangeError):
        reopened.read(5, 1000)
    reopened.close()


def test_never_moves_back(tmp_path: Path) -> None:
    log = three_segment_log(tmp_path)
    assert log.advance_log_start_offset(5)
    assert not log.advance_log_start_offset(5)
    assert not log.advance_log_start_offset(1)
    assert log.log_start_offset == 5
    log.close()


def test_crash_between_checkpoint_and_deletion(tmp_path: Path) -> None:
    """The checkpoint is written before segments are deleted: a crash in between leaves old
    segments, which the next open hides below the checkpointed start and retention drops."""
    log = three_segment_log(tmp_path)
    log.close()
    (tmp_path / "topic-0" / "log-start-offset").write_text("0\n9\n")
    reopened = open_log(tmp_path, 2 * len(batch(2)))
    assert reopened.log_start_offset == 9
    with pytest.raises(OffsetOutOfRangeError):
        reopened.read(8, 1000)
    assert reopened.enforce_retention(T0) == 2
    assert (reopened.log_start_offset, reopened.segment_base_offsets) == (9, [8])
    reopened.close()


def test_open_transaction_below_the_start_does_not_hold_the_lso(tmp_path: Path) -> None:
    """Kafka's maybeIncrementFirstUnstableOffset: the LSO is never below the log start, so
    read_committed consumers are not stalled by a transaction begun below it."""
    async def main() -> None:
        manager = PartitionManager(tmp_path, node_id=1)
        partition = manager.ensure_partition("t", 0, {"segment.bytes": str(2 * len(batch(2)))},
                                             leader_epoch=0)
        transactional = build_batch([(b"k", b"v" * 10, []), (b"k", b"v" * 10, [])],
                                    timestamp_ms=T0, producer_id=7, producer_epoch=0,
                                    base_sequence=0, attributes=TRANSACTIONAL_FLAG)
        partition.log.append(transactional, leader_epoch=0, now_ms=T0)
        for _ in range(5):
            partition.log.append(batch(2), leader_epoch=0, now_ms=T0)
        partition.high_watermark = partition.log.log_end_offset
        assert partition.last_stable_offset == 0, "transaction of producer 7 is open"
        assert await partition.move_log_start_offset(10)
        assert partition.log.segment_base_offsets == [8]
        assert partition.last_stable_offset == 10
        manager.close()

    trio.run(main)


def test_low_watermark_is_the_minimum_over_live_replicas() -> None:
    state = LeaderState(node_id=1, replicas=(1, 2, 3), isr=(1, 2), leader_epoch=0,
                        partition_epoch=0, epoch_start_offset=0, now_ms=0)

    def alive(node_id: int) -> bool:
        return True

    assert state.low_watermark(10, alive) == -1, "followers that have not fetched: unknown"
    state.record_fetch(2, 12, 12, 1, log_start_offset=10)
    state.record_fetch(3, 12, 12, 1, log_start_offset=4)
    assert state.low_watermark(10, alive) == 4, "replica 3 is out of the ISR but alive"
    assert state.low_watermark(10, lambda node_id: node_id != 3) == 10, "a dead broker"
    state.record_fetch(3, 12, 12, 2, log_start_offset=10)
    assert state.low_watermark(10, alive) == 10
    state.record_fetch(3, 12, 12, 3)  # a fetch without log_start_offset (v<5) keeps it
    assert state.followers[3].log_start_offset == 10


def _full_disk(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_failed_checkpoint_changes_nothing_and_a_retry_writes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoint is written before memory moves: a DeleteRecords (or a follower's
    follow) that hit ENOSPC leaves the start where it was, so the retry is not a no-op and
    the start survives a restart (the review's finding: memory moved, disk did not, the
    retry answered NONE without writing, and records 0-5 came back after a restart)."""
    log = three_segment_log(tmp_path)
    monkeypatch.setattr(log_module, "_store_checkpoint", _full_disk)
    with pytest.raises(OSError):
        log.advance_log_start_offset(6)
    assert (log.log_start_offset, log.segment_base_offsets) == (0, [0, 4, 8])
    assert offsets_from(log, 0)[0] == 0, "nothing deleted"
    monkeypatch.undo()  # the disk has room again
    assert log.advance_log_start_offset(6), "the retry moves the start"
    log.close()
    reopened = open_log(tmp_path, 2 * len(batch(2)))
    assert reopened.log_start_offset == 6, "deleted records came back after a restart"
    reopened.close()


def test_offline_log_refuses_to_move_the_start(tmp_path: Path) -> None:
    """An offline log (failed fsync) answers KAFKA_STORAGE_ERROR, as appends do."""
    log = three_segment_log(tmp_path)
    log.mark_offline("fsync", OSError(errno.EIO, "Input/output error"))
    with pytest.raises(KafkaStorageError):
        log.advance_log_start_offset(6)
    assert log.log_start_offset == 0
    log.close()


def test_failed_retention_checkpoint_deletes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retention checkpoints the new start before it unlinks a segment: a failure leaves
    every segment and the start as they were (it used to unlink first)."""
    log = three_segment_log(tmp_path)
    monkeypatch.setattr(log_module, "_store_checkpoint", _full_disk)
    with pytest.raises(OSError):
        log.enforce_retention(T0 + 100 * 24 * 3600 * 1000)  # both sealed segments expired
    assert (log.log_start_offset, log.segment_base_offsets) == (0, [0, 4, 8])
    assert (tmp_path / "topic-0" / "00000000000000000000.log").exists()
    monkeypatch.undo()
    assert log.enforce_retention(T0 + 100 * 24 * 3600 * 1000) == 2
    log.close()
    reopened = open_log(tmp_path, 2 * len(batch(2)))
    assert (reopened.log_start_offset, reopened.segment_base_offsets) == (8, [8])
    reopened.close()


def test_failed_reset_checkpoint_leaves_the_log_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower's reset (its end below the leader's start) writes the new start first."""
    log = three_segment_log(tmp_path)
    monkeypatch.setattr(log_module, "_store_checkpoint", _full_disk)
    with pytest.raises(OSError):
        log.reset_to(20)
    assert not (tmp_path / "topic-0" / "00000000000000000020.log").exists(), "no stray segment"
    assert (log.log_start_offset, log.log_end_offset) == (0, 12)
    assert log.segment_base_offsets == [0, 4, 8]
    assert offsets_from(log, 0)[0] == 0
    monkeypatch.undo()
    log.reset_to(20)
    log.close()
    reopened = open_log(tmp_path, 2 * len(batch(2)))
    assert (reopened.log_start_offset, reopened.log_end_offset) == (20, 20)
    reopened.close()


def test_truncation_below_the_start_checkpoints_the_lower_start(tmp_path: Path) -> None:
    """A start inside a batch (DeleteRecords to 3 in batch [2, 3]); a follower truncating to
    3 removes that whole batch, so the start drops to 2. The checkpoint must say 2 too:
    otherwise, once the batch is fetched again, a restart hides offset 2."""
    log = three_segment_log(tmp_path)
    assert log.advance_log_start_offset(3)
    assert log.truncate_to(3) == 2
    assert log.log_start_offset == 2
    log.append(batch(2), leader_epoch=0, now_ms=T0)  # offsets 2 and 3 again
    log.close()
    reopened = open_log(tmp_path, 2 * len(batch(2)))
    assert reopened.log_start_offset == 2
    reopened.close()


def test_partition_refuses_a_start_past_its_high_watermark(tmp_path: Path) -> None:
    """Kafka's UnifiedLog refuses a log start past the HW: the data above it may be on no
    other replica yet."""
    async def main() -> None:
        manager = PartitionManager(tmp_path, node_id=1)
        partition = manager.ensure_partition("t", 0, {}, leader_epoch=0)
        for _ in range(3):
            partition.log.append(batch(2), leader_epoch=0, now_ms=T0)
        partition.high_watermark = 4
        with pytest.raises(OffsetOutOfRangeError):
            await partition.move_log_start_offset(5)
        assert partition.log.log_start_offset == 0
        assert await partition.move_log_start_offset(4)
        manager.close()

    trio.run(main)


class GatedCheckpoint:
    """Replaces ``_store_checkpoint``: a call from a worker thread waits until ``release``
    (at most 10 s), so a test can act while a log-start move is in flight; calls from the
    event loop's thread pass straight through."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real = log_module._store_checkpoint
        self.entered = threading.Event()
        self.release = threading.Event()
        self.released_in_time: list[bool] = []
        self.inflight = 0
        self.max_inflight = 0
        self._lock = threading.Lock()
        monkeypatch.setattr(log_module, "_store_checkpoint", self)

    def __call__(self, directory: Path, log_start_offset: int) -> None:
        if threading.current_thread() is threading.main_thread():
            self.real(directory, log_start_offset)
            return
        with self._lock:
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            self.entered.set()
            self.released_in_time.append(self.release.wait(10))
            self.real(directory, log_start_offset)
        finally:
            with self._lock:
                self.inflight -= 1

    async def wait_entered(self) -> None:
        assert await trio.to_thread.run_sync(self.entered.wait, 10), "no move reached its write"


def _leader(manager: PartitionManager, configs: dict[str, str] | None = None) -> Partition:
    partition = manager.ensure_partition(
        "t", 0, {"segment.bytes": str(2 * len(batch(2))), **(configs or {})}, leader_epoch=0)
    for _ in range(6):
        partition.log.append(batch(2), leader_epoch=0, now_ms=T0)
    partition.high_watermark = partition.log.log_end_offset
    return partition


def _checkpoint(partition: Partition) -> str:
    return (partition.log.directory / "log-start-offset").read_text()


def test_a_move_does_not_block_the_event_loop(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """DeleteRecords and a follower's follow write the checkpoint (fsync, rename, directory
    fsync) and unlink segments in a worker thread: other tasks run meanwhile."""
    gate = GatedCheckpoint(monkeypatch)

    async def main() -> None:
        manager = PartitionManager(tmp_path, node_id=1)
        partition = _leader(manager)
        moved: list[bool] = []
        async with trio.open_nursery() as nursery:
            async def move() -> None:
                moved.append(await partition.move_log_start_offset(9))
            nursery.start_soon(move)
            await gate.wait_entered()  # this task runs while the checkpoint is being written
            assert partition.log.log_start_offset == 0, "memory moves only after the write"
            gate.release.set()
        assert moved == [True] and gate.released_in_time == [True]
        assert (partition.log.log_start_offset, partition.log.segment_base_offsets) == (9, [8])
        assert _checkpoint(partition) == "0\n9\n"
        manager.close()

    trio.run(main)


def test_moves_of_one_partition_are_serialized(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    gate = GatedCheckpoint(monkeypatch)

    async def main() -> None:
        manager = PartitionManager(tmp_path, node_id=1)
        partition = _leader(manager)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partition.move_log_start_offset, 9)
            nursery.start_soon(partition.move_log_start_offset, 6)
            await gate.wait_entered()
            await trio.sleep(0.05)  # the second would be in its thread by now if unguarded
            gate.release.set()
        assert gate.max_inflight == 1
        assert partition.log.log_start_offset == 9 and _checkpoint(partition) == "0\n9\n"
        manager.close()

    trio.run(main)


def test_retention_keeps_off_a_partition_while_a_move_is_in_flight(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = GatedCheckpoint(monkeypatch)

    async def main() -> None:
        manager = PartitionManager(tmp_path, node_id=1)
        partition = _leader(manager, {"retention.ms": "1000"})  # T0 is long past
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partition.move_log_start_offset, 6)
            await gate.wait_entered()
            assert manager.enforce_retention() == 0, "its checkpoint write would race ours"
            gate.release.set()
        assert partition.log.log_start_offset == 6 and _checkpoint(partition) == "0\n6\n"
        assert manager.enforce_retention() == 1
        assert partition.log.log_start_offset == 8 and _checkpoint(partition) == "0\n8\n"
        manager.close()

    trio.run(main)


def test_a_reset_during_a_move_wins_on_disk_too(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower's reset writes the checkpoint on the event loop while a move's thread is
    writing its own; whichever rename lands last, the move then sees the other writer and
    writes the current start again, so disk and memory agree (20, not 6)."""
    gate = GatedCheckpoint(monkeypatch)

    async def main() -> None:
        manager = PartitionManager(tmp_path, node_id=1)
        partition = _leader(manager)
        moved: list[bool] = []
        async with trio.open_nursery() as nursery:
            async def move() -> None:
                moved.append(await partition.move_log_start_offset(6))
            nursery.start_soon(move)
            await gate.wait_entered()
            partition.reset_to(20)
            assert _checkpoint(partition) == "0\n20\n"
            gate.release.set()  # the move's "6" lands after the reset's "20"
        assert moved == [False]
        assert partition.log.log_start_offset == 20 and _checkpoint(partition) == "0\n20\n"
        manager.close()

    trio.run(main)


def test_a_truncation_below_a_move_in_flight_undoes_it_on_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A truncation that does not touch the start writes no checkpoint; the move must still
    notice the log now ends below its offset and write the current start back."""
    gate = GatedCheckpoint(monkeypatch)

    async def main() -> None:
        manager = PartitionManager(tmp_path, node_id=1)
        partition = _leader(manager)
        moved: list[bool] = []
        async with trio.open_nursery() as nursery:
            async def move() -> None:
                moved.append(await partition.move_log_start_offset(9))
            nursery.start_soon(move)
            await gate.wait_entered()
            assert partition.truncate_to(7) == 6  # e.g. it became a follower of a new leader
            gate.release.set()
        assert moved == [False]
        assert partition.log.log_start_offset == 0 and _checkpoint(partition) == "0\n0\n"
        assert partition.log.segment_base_offsets == [0, 4]
        manager.close()

    trio.run(main)
