"""DeleteRecords storage and replication rules: ``PartitionLog.advance_log_start_offset``
(in a segment, across segments, restart, never backwards, crash between checkpoint and
segment deletion), the leader's low watermark (``LeaderState.low_watermark``), and the
checkpoint-before-memory order of every writer of the log start (DeleteRecords, retention,
reset, truncation): a failed checkpoint write changes nothing, so a retry writes it and a
restart never brings deleted records back. The move is one synchronous call (checkpoint,
memory, unlinks stopping at the first failure, one directory fsync), so DeleteRecords checks
leadership and moves the start with no await in between."""

from __future__ import annotations

import errno
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio

import raftlog.partition.log_retention as log_retention
import raftlog.partition.log_start_checkpoint as log_start_checkpoint
from raftlog.broker.apis import KafkaApis
from raftlog.config import ServerConfig
from raftlog.metadata.image import MetadataImage
from raftlog.partition.batch import build_batch, decode_records
from raftlog.partition.errors import OffsetOutOfRangeError
from raftlog.partition.log import KafkaStorageError, LogConfig, PartitionLog
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import Partition
from raftlog.partition.replica_state import LeaderState
from raftlog.partition.segment import Segment
from raftlog.protocol import codec
from raftlog.protocol.codec import RequestHeader
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import DELETE_RECORDS
from raftlog.quorum.interface import Quorum
from raftlog.server.listener import RequestContext

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
    segments below the checkpointed start, which the next open deletes."""
    log = three_segment_log(tmp_path)
    log.close()
    (tmp_path / "topic-0" / "log-start-offset").write_text("0\n9\n")
    reopened = open_log(tmp_path, 2 * len(batch(2)))
    assert reopened.log_start_offset == 9
    with pytest.raises(OffsetOutOfRangeError):
        reopened.read(8, 1000)
    assert (reopened.log_start_offset, reopened.segment_base_offsets) == (9, [8])
    assert not (tmp_path / "topic-0" / "00000000000000000004.log").exists()
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
        assert partition.move_log_start_offset(10)
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
    monkeypatch.setattr(log_retention, "replace_log_start_checkpoint", _full_disk)
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
    monkeypatch.setattr(log_retention, "replace_log_start_checkpoint", _full_disk)
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
    """A follower's reset (its end below the leader's start) writes the new start first; a
    failure there is a KafkaStorageError (the follower backs off and retries)."""
    log = three_segment_log(tmp_path)
    monkeypatch.setattr(log_retention, "replace_log_start_checkpoint", _full_disk)
    with pytest.raises(KafkaStorageError):
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
            partition.move_log_start_offset(5)
        assert partition.log.log_start_offset == 0
        assert partition.move_log_start_offset(4)
        manager.close()

    trio.run(main)


def _leader(manager: PartitionManager, configs: dict[str, str] | None = None) -> Partition:
    partition = manager.ensure_partition(
        "t", 0, {"segment.bytes": str(2 * len(batch(2))), **(configs or {})}, leader_epoch=0)
    for _ in range(6):
        partition.log.append(batch(2), leader_epoch=0, now_ms=T0)
    partition.high_watermark = partition.log.log_end_offset
    return partition


def _checkpoint(partition: Partition) -> str:
    return (partition.log.directory / "log-start-offset").read_text()




def fail_delete_of(base_offset: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Segment ``base_offset`` cannot be unlinked (EIO); the others can."""
    real_delete = Segment.delete

    def flaky_delete(self: Segment) -> None:
        if self.base_offset == base_offset:
            raise OSError(errno.EIO, "Input/output error")
        real_delete(self)

    monkeypatch.setattr(Segment, "delete", flaky_delete)


def test_a_failed_unlink_stops_the_deletion_and_the_next_open_keeps_the_data(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 2: a failed unlink of segment 0 followed by a successful unlink of segment 4
    left files 0 and 8; the next open took the gap for a torn tail and deleted segment 8,
    flushed and acknowledged. Now the deletion stops at the first failure (what stays is a
    contiguous prefix below the start) and the open deletes it."""
    log = three_segment_log(tmp_path)
    ticket = log.begin_flush()
    assert ticket is not None
    ticket.run()
    log.complete_flush(ticket)
    fail_delete_of(0, monkeypatch)
    assert log.advance_log_start_offset(9), "the start moved; the unlink failure is logged"
    monkeypatch.undo()
    assert (log.log_start_offset, log.segment_base_offsets) == (9, [8])
    names = sorted(p.name for p in (tmp_path / "topic-0").glob("*.log"))
    assert "00000000000000000004.log" in names, "no unlink after a failed one"
    log.close()
    reopened = open_log(tmp_path, 2 * len(batch(2)))
    assert (reopened.log_start_offset, reopened.log_end_offset) == (9, 12)
    assert reopened.segment_base_offsets == [8]
    assert sorted(p.name for p in (tmp_path / "topic-0").glob("*.log")) == \
        ["00000000000000000008.log"], "the prefix below the start is deleted on open"
    reopened.close()


def test_open_deletes_segments_below_the_checkpoint_before_checking_continuity(
        tmp_path: Path) -> None:
    """A directory left with a gap below the checkpointed start (segments 0 and 8, start 9:
    what the old code left after a failed unlink) opens with segment 8 intact."""
    log = three_segment_log(tmp_path)
    assert log.advance_log_start_offset(6)
    log.close()
    directory = tmp_path / "topic-0"
    for path in directory.glob("00000000000000000004.*"):
        path.unlink()
    (directory / "log-start-offset").write_text("0\n9\n")
    (directory / "00000000000000000000.log").write_bytes(batch(2) + batch(2))
    reopened = open_log(tmp_path, 2 * len(batch(2)))
    assert (reopened.log_start_offset, reopened.log_end_offset) == (9, 12)
    assert reopened.segment_base_offsets == [8]
    reopened.close()


def test_a_failed_checkpoint_write_leaves_no_temp_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 2: every failed write (ENOSPC in write_all or fsync) left a new uniquely named
    temp file; a follower retrying every backoff filled the directory."""
    log = three_segment_log(tmp_path)
    monkeypatch.setattr(log_start_checkpoint, "write_all", _full_disk)
    for _ in range(20):
        with pytest.raises(OSError):
            log.advance_log_start_offset(4)
    monkeypatch.undo()
    assert list((tmp_path / "topic-0").glob("*.tmp")) == []
    assert log.log_start_offset == 0
    log.close()


def test_the_unlinks_are_made_durable_by_a_directory_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 2: the unlinks waited for the next flush's directory fsync, which an idle
    partition never runs. One directory fsync now follows them."""
    log = three_segment_log(tmp_path)
    directory = tmp_path / "topic-0"
    real_fsync_directory = log_retention.fsync_directory
    after_unlink: list[bool] = []

    def recording(path: Path) -> None:
        after_unlink.append(not (directory / "00000000000000000000.log").exists())
        real_fsync_directory(path)

    monkeypatch.setattr(log_retention, "fsync_directory", recording)
    assert log.advance_log_start_offset(9)
    assert after_unlink == [False, True], "checkpoint fsync, then one after the unlinks"
    log.close()


def test_a_failed_directory_fsync_after_the_rename_takes_the_log_offline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 2: a failure after the rename left the disk saying 9 while memory kept 0 and
    a retry fsynced again. Now memory follows the disk and the log goes offline (a failed
    fsync is never retried); the restart reads whatever survived."""
    log = three_segment_log(tmp_path)

    def failing(path: Path) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(log_retention, "fsync_directory", failing)
    with pytest.raises(KafkaStorageError):
        log.advance_log_start_offset(9)
    monkeypatch.undo()
    assert log.offline_reason is not None
    assert log.log_start_offset == 9, "nothing below the start the disk already says"
    with pytest.raises(OffsetOutOfRangeError):
        log.read(8, 1000)
    with pytest.raises(KafkaStorageError):
        log.advance_log_start_offset(10)
    log.close()


def _delete_records_ctx(body: dict[str, Any]) -> RequestContext:
    raw = codec.encode_bytes(DELETE_RECORDS, 2, body, is_request=True)
    decoded = codec.decode(DELETE_RECORDS, 2, raw, is_request=True)
    return RequestContext(DELETE_RECORDS, RequestHeader(DELETE_RECORDS.key, 2, 1, "t"),
                          decoded, "peer")


def test_delete_records_moves_the_start_in_the_handler_with_its_checks(
        tmp_path: Path) -> None:
    """Review 2: DeleteRecords checked leadership in the handler and moved the start later,
    after awaits, so a partition that had become a follower meanwhile still lost records.
    Now the check and the move are one synchronous step: once the handler has returned, a
    role change cannot make it move anything."""
    async def main() -> None:
        config = ServerConfig.from_properties({"node.id": "1", "log.dirs": str(tmp_path)})
        manager = PartitionManager(tmp_path, node_id=1)
        p0 = _leader(manager)
        p1 = manager.ensure_partition("t", 1, {"segment.bytes": str(2 * len(batch(2)))},
                                      leader_epoch=0)
        for _ in range(6):
            p1.log.append(batch(2), leader_epoch=0, now_ms=T0)
        p1.high_watermark = p1.log.log_end_offset
        p2 = manager.ensure_partition("t", 2, {}, leader_epoch=0)
        p2.log.append(batch(2), leader_epoch=0, now_ms=T0)
        p2.high_watermark = 2
        p2.is_leader = False  # lost leadership before the handler ran
        apis = KafkaApis(config, cast(Quorum, SimpleNamespace(image=MetadataImage())),
                         manager)
        answer = apis.delete_records_apis.delete_records(_delete_records_ctx({"topics": [
            {"name": "t", "partitions": [
                {"partition_index": 0, "offset": 6}, {"partition_index": 1, "offset": 6},
                {"partition_index": 2, "offset": 1}]}], "timeout_ms": 1000}))
        starts = [p.log.log_start_offset for p in (p0, p1, p2)]
        p1.is_leader = False  # a role change once the handler has returned
        p1.leadership_generation += 1
        if callable(answer):
            answer = await answer()
        assert isinstance(answer, dict)
        assert starts == [6, 6, 0], "moved in the handler, with its checks"
        assert [p.log.log_start_offset for p in (p0, p1, p2)] == starts
        assert _checkpoint(p1) == "0\n6\n", "checkpointed before the handler returned"
        errors = [r["error_code"] for r in answer["topics"][0]["partitions"]]
        assert errors[2] == ErrorCode.NOT_LEADER_OR_FOLLOWER
        manager.close()

    trio.run(main)
