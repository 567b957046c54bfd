"""DeleteRecords storage and replication rules: ``PartitionLog.advance_log_start_offset``
(in a segment, across segments, restart, never backwards, crash between checkpoint and
segment deletion) and the leader's low watermark (``LeaderState.low_watermark``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from raftlog.partition.batch import build_batch, decode_records
from raftlog.partition.errors import OffsetOutOfRangeError
from raftlog.partition.log import LogConfig, PartitionLog
from raftlog.partition.manager import PartitionManager
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
        assert partition.advance_log_start_offset(10)
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
