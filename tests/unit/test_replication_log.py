"""PartitionLog's follower side: append_replicated keeps the leader's bytes, checks them, and
reset_to starts a log over; plus the trio-side follower HW and leader HW rules."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import trio

from raftlog.partition.batch import build_batch, validate_batches
from raftlog.partition.errors import CorruptRecordError, UnexpectedOffsetError
from raftlog.partition.log import LOG_APPEND_TIME, LogConfig, PartitionLog
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import now_ms
from raftlog.partition.replica_state import LeaderState

T0 = 1_700_000_000_000
CONTROL = 0x20


def batch(count: int = 2, attributes: int = 0) -> bytes:
    return build_batch([(b"k", b"v%d" % i, ()) for i in range(count)], timestamp_ms=T0,
                       attributes=attributes)


def open_log(root: Path, name: str, **settings: int | str) -> PartitionLog:
    return PartitionLog.open(root / name, LogConfig(**settings), T0)  # type: ignore[arg-type]


def everything(log: PartitionLog) -> bytes:
    out = bytearray()
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        with log.read(offset, 1 << 20) as result:
            chunk = result.read_bytes()
        out += chunk
        offset = validate_batches(chunk, allow_control=True)[-1].next_offset
    return bytes(out)


def test_replicated_batches_are_stored_byte_for_byte(tmp_path: Path) -> None:
    leader = open_log(tmp_path, "leader", message_timestamp_type=LOG_APPEND_TIME,
                      segment_bytes=300)
    follower = open_log(tmp_path, "follower", segment_bytes=300)
    for epoch in (0, 0, 3, 3, 3):
        leader.append(batch(3), leader_epoch=epoch, now_ms=T0 + epoch)
    leader.append(batch(1, attributes=CONTROL), leader_epoch=4, now_ms=T0,
                  allow_control=True)
    data = everything(leader)
    # Replicate in two fetches, as a follower would.
    headers = validate_batches(data, allow_control=True)
    split = sum(h.size_bytes for h in headers[:2])
    first = follower.append_replicated(data[:split], now_ms=T0)
    assert (first.base_offset, first.last_offset, first.record_count) == (0, 5, 6)
    follower.append_replicated(memoryview(data)[split:], now_ms=T0)
    assert follower.log_end_offset == leader.log_end_offset == 16
    assert everything(follower) == data, "offsets, leader epochs, timestamps all kept"
    assert follower.epoch_cache.entries == leader.epoch_cache.entries
    assert [(e.epoch, e.start_offset) for e in follower.epoch_cache.entries] == [
        (0, 0), (3, 6), (4, 15)]
    assert len(follower.segment_base_offsets) > 1, "followers roll segments too"
    leader.close()
    follower.close()


def test_replicated_batches_must_continue_the_log(tmp_path: Path) -> None:
    leader = open_log(tmp_path, "leader")
    for _ in range(3):
        leader.append(batch(2), leader_epoch=1, now_ms=T0)
    data = everything(leader)
    size = len(batch(2))
    follower = open_log(tmp_path, "follower")
    follower.append_replicated(data[:size], now_ms=T0)
    with pytest.raises(UnexpectedOffsetError):
        follower.append_replicated(data[:size], now_ms=T0)  # starts at 0, log ends at 2
    backwards = data[2 * size:] + data[size:2 * size]
    follower.truncate_to(0)
    with pytest.raises(UnexpectedOffsetError):
        follower.append_replicated(data[:size] + backwards, now_ms=T0)
    corrupt = bytearray(data)
    corrupt[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        follower.append_replicated(bytes(corrupt), now_ms=T0)
    assert follower.log_end_offset == 0 and follower.epoch_cache.entries == ()
    follower.append_replicated(data, now_ms=T0)
    assert everything(follower) == data
    leader.close()
    follower.close()


def test_reset_to_starts_the_log_over(tmp_path: Path) -> None:
    log = open_log(tmp_path, "t-0", segment_bytes=200)
    for _ in range(6):
        log.append(batch(2), leader_epoch=2, now_ms=T0)
    assert len(log.segment_base_offsets) > 1
    log.reset_to(100)
    assert (log.log_start_offset, log.log_end_offset, log.flushed_offset) == (100, 100, 100)
    assert log.segment_base_offsets == [100] and log.epoch_cache.entries == ()
    leader = open_log(tmp_path, "leader")
    leader.reset_to(100)
    leader.append(batch(2), leader_epoch=5, now_ms=T0)
    log.append_replicated(everything(leader), now_ms=T0)
    log.close()
    reopened = open_log(tmp_path, "t-0")
    assert (reopened.log_start_offset, reopened.log_end_offset) == (100, 102)
    assert [(e.epoch, e.start_offset) for e in reopened.epoch_cache.entries] == [(5, 100)]
    # Resetting to the first segment's own base offset empties that segment in place.
    reopened.reset_to(100)
    assert (reopened.log_end_offset, reopened.segment_base_offsets) == (100, [100])
    reopened.close()
    leader.close()


def test_stamped_epoch_is_the_header_field(tmp_path: Path) -> None:
    log = open_log(tmp_path, "t-0")
    log.append(batch(1), leader_epoch=9, now_ms=T0)
    stored = everything(log)
    assert struct.unpack_from(">i", stored, 12)[0] == 9


# --- the trio side: HW rules ---------------------------------------------------------------------


async def test_leader_hw_is_the_minimum_over_the_isr(tmp_path: Path) -> None:
    manager = PartitionManager(tmp_path, node_id=1)
    partition = manager.ensure_partition("t", 0, {}, leader_epoch=0)
    partition.leader_state = LeaderState(node_id=1, replicas=(1, 2, 3), isr=(1, 2, 3),
                                         leader_epoch=0, partition_epoch=0,
                                         epoch_start_offset=0, now_ms=now_ms())
    partition.isr = (1, 2, 3)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(manager.run_flusher)
        for _ in range(3):
            partition.log.append(batch(2), leader_epoch=0, now_ms=now_ms())
            manager.note_append(partition)
        assert await partition.wait_flushed(6, trio.current_time() + 5)
        assert partition.high_watermark == 0, "no follower has fetched yet"
        state = partition.leader_state
        state.record_fetch(2, 6, 6, now_ms())
        state.record_fetch(3, 4, 6, now_ms())
        manager.update_high_watermark(partition)
        assert partition.high_watermark == 4
        state.record_fetch(3, 6, 6, now_ms())
        manager.update_high_watermark(partition)
        assert partition.high_watermark == 6
        nursery.cancel_scope.cancel()
    manager.close()


async def test_follower_hw_is_capped_by_its_own_end(tmp_path: Path) -> None:
    manager = PartitionManager(tmp_path, node_id=2)
    partition = manager.ensure_partition("t", 0, {}, leader_epoch=0)
    partition.is_leader = False
    partition.log.append(batch(2), leader_epoch=0, now_ms=now_ms())
    manager.set_follower_high_watermark(partition, 10)
    assert partition.high_watermark == 2
    manager.update_high_watermark(partition)  # a follower's HW only comes from its leader
    assert partition.high_watermark == 2
    partition.log.append(batch(2), leader_epoch=0, now_ms=now_ms())
    partition.truncate_to(1)
    assert partition.high_watermark == 0, "truncation takes the HW down with the log"
    manager.close()
