"""Retention never moves a log start past the high watermark (Kafka's
``UnifiedLog.deletableSegments``: ``upperBoundOffset = min(activeSegment.baseOffset,
highWatermark)``, a segment goes only if the next one starts at or below it). Without the
bound a leader whose followers lag deletes data no other replica has: followers reset past
it and the HW then covers offsets no replica holds. Also the follower Fetch shortcut that
rests on that invariant (``follower_can_advance_start``)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import trio

import raftlog.partition.log_retention as log_retention
from raftlog.broker.fetch import follower_can_advance_start
from raftlog.partition.batch import build_batch
from raftlog.partition.log import LogConfig, PartitionLog
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import Partition, now_ms

DAY_MS = 24 * 3600 * 1000
T0 = 1_700_000_000_000


def batch(timestamp_ms: int) -> bytes:
    """Two records: with SEGMENT_BYTES, two batches (four offsets) per segment."""
    return build_batch([(b"k", b"v" * 10, []), (b"k", b"v" * 10, [])], timestamp_ms=timestamp_ms)


SEGMENT_BYTES = 2 * len(batch(T0))


def fill(log: PartitionLog, timestamp_ms: int, batches: int = 6) -> None:
    """Segments [0..3], [4..7], [8..11] (the last one active)."""
    for _ in range(batches):
        log.append(batch(timestamp_ms), leader_epoch=0, now_ms=timestamp_ms)
    assert log.segment_base_offsets == [0, 4, 8]


def test_time_retention_stops_at_the_high_watermark(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=SEGMENT_BYTES), T0)
    fill(log, T0)
    later = T0 + 100 * DAY_MS  # every segment expired
    assert log.enforce_retention(later, high_watermark=3) == 0, "segment 0 ends at 4 > HW"
    assert log.enforce_retention(later, high_watermark=7) == 1
    assert (log.log_start_offset, log.segment_base_offsets) == (4, [4, 8])
    assert log.enforce_retention(later, high_watermark=12) == 1, "never the active segment"
    assert log.log_start_offset == 8
    log.close()


def test_size_retention_stops_at_the_high_watermark(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=SEGMENT_BYTES, retention_bytes=SEGMENT_BYTES)
    log = PartitionLog.open(tmp_path / "t-0", config, T0)
    fill(log, T0)
    assert log.enforce_retention(T0, high_watermark=4) == 1, "only segment 0 is below the HW"
    assert log.log_start_offset == 4 <= 4
    log.close()


def _partition(manager: PartitionManager, timestamp_ms: int) -> Partition:
    configs = {"segment.bytes": str(SEGMENT_BYTES), "retention.ms": str(DAY_MS)}
    partition = manager.ensure_partition("t", 0, configs, leader_epoch=0)
    fill(partition.log, timestamp_ms)
    return partition


def test_leader_with_a_lagging_follower_keeps_what_the_hw_has_not_passed(
        tmp_path: Path) -> None:
    """Records with an old CreateTime arrive while the follower lags (the HW stays at 0):
    the retention check must not delete them, whatever retention.ms says."""
    async def main() -> None:
        manager = PartitionManager(tmp_path, node_id=1)
        partition = _partition(manager, now_ms() - 10 * DAY_MS)  # already past retention.ms
        assert partition.high_watermark == 0
        assert manager.enforce_retention() == 0
        assert partition.log.segment_base_offsets == [0, 4, 8]
        assert partition.log.log_start_offset == 0
        partition.high_watermark = 5  # the follower caught up to 5: segment 0 may go
        assert manager.enforce_retention() == 1
        assert partition.log.log_start_offset == 4 <= partition.high_watermark
        manager.close()

    trio.run(main)


def test_follower_retention_is_bounded_by_its_own_high_watermark(tmp_path: Path) -> None:
    async def main() -> None:
        manager = PartitionManager(tmp_path, node_id=2)
        partition = _partition(manager, now_ms() - 10 * DAY_MS)
        partition.is_leader = False
        partition.high_watermark = 6  # what the leader told it, capped at its end
        assert manager.enforce_retention() == 1, "segment [4..7] holds offsets >= its HW"
        assert partition.log.log_start_offset == 4
        assert partition.last_stable_offset == 6
        manager.close()

    trio.run(main)


def test_follower_fetch_shortcut_only_when_the_follower_can_move() -> None:
    """The leader answers a follower's Fetch at once when the follower would move its log
    start on the answer: it adopts min(leader start, its HW = min(leader HW, its end))."""
    assert follower_can_advance_start(reported_start=0, fetch_offset=12, leader_start=8,
                                      leader_high_watermark=12)
    assert not follower_can_advance_start(reported_start=8, fetch_offset=12, leader_start=8,
                                          leader_high_watermark=12), "already there"
    # A leader start above its HW (what unbounded retention allowed): the follower can only
    # reach the HW, so once there it must long-poll rather than be answered again and again.
    assert not follower_can_advance_start(reported_start=6, fetch_offset=12, leader_start=8,
                                          leader_high_watermark=6)
    assert not follower_can_advance_start(reported_start=-1, fetch_offset=12, leader_start=8,
                                          leader_high_watermark=12), "Fetch < v5"


def test_a_failed_directory_fsync_in_retention_takes_the_log_offline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 2 (finding 8): a failure after the checkpoint's rename left the disk saying the
    new start while memory kept the old one (and the next check fsynced again). Now the log
    goes offline with memory following the disk, and the retention check carries on."""
    async def main() -> None:
        manager = PartitionManager(tmp_path, node_id=1)
        partition = _partition(manager, now_ms() - 10 * DAY_MS)
        partition.high_watermark = 12

        def failing(path: Path) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(log_retention, "fsync_directory", failing)
        assert manager.enforce_retention() == 0, "a warning, not an exception"
        monkeypatch.undo()
        assert partition.log.offline_reason is not None
        assert partition.log.log_start_offset == 8, "memory follows the renamed checkpoint"
        assert manager.enforce_retention() == 0, "an offline log is left alone"
        manager.close()

    trio.run(main)
