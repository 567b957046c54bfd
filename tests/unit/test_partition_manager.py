"""Group commit and high-watermark rules of the trio-side partition manager."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from raftlog.partition import manager as manager_module
from raftlog.partition.batch import build_batch
from raftlog.partition.log import FlushTicket
from raftlog.partition.log_flush import FlushPlacement
from raftlog.partition.manager import PartitionManager, log_config_for
from raftlog.partition.partition import now_ms

DEFAULTS = {"flush.messages": str(2**63 - 1), "flush.ms": str(2**63 - 1)}


def _batch(value: bytes) -> bytes:
    return build_batch([(None, value, ())], timestamp_ms=now_ms())


async def test_group_commit_acknowledges_only_fsynced_data(tmp_path: Path) -> None:
    manager = PartitionManager(tmp_path, node_id=1)
    partition = manager.ensure_partition("t", 0, DEFAULTS, leader_epoch=0)
    assert partition.durable_acks
    appends = 200
    acked: list[int] = []

    async def produce(i: int) -> None:
        info = partition.log.append(_batch(b"v%d" % i), leader_epoch=0, now_ms=now_ms())
        manager.note_append(partition)
        # Not visible before the fsync that covers it.
        assert partition.high_watermark <= info.last_offset
        assert await partition.wait_high_watermark(info.last_offset + 1, trio.current_time() + 10)
        assert partition.log.flushed_offset > info.last_offset
        acked.append(info.last_offset)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(manager.run_flusher)
        async with trio.open_nursery() as producers:
            for i in range(appends):
                producers.start_soon(produce, i)
        nursery.cancel_scope.cancel()
    assert sorted(acked) == list(range(appends))
    # One fsync round covers many appends.
    assert 1 <= manager.flush_rounds < appends / 4
    manager.close()


async def test_relaxed_flush_exposes_at_once(tmp_path: Path) -> None:
    manager = PartitionManager(tmp_path, node_id=1)
    configs = {"flush.messages": "1000", "flush.ms": str(2**63 - 1)}
    partition = manager.ensure_partition("t", 0, configs, leader_epoch=0)
    assert not partition.durable_acks
    info = partition.log.append(_batch(b"x"), leader_epoch=0, now_ms=now_ms())
    manager.note_append(partition)
    assert partition.high_watermark == info.last_offset + 1
    manager.close()


def test_topic_configs_map_to_log_config() -> None:
    config = log_config_for({"segment.bytes": "4096", "retention.ms": "-1",
                             "message.timestamp.type": "LogAppendTime", **DEFAULTS})
    assert config.segment_bytes == 4096
    assert config.retention_ms == -1
    assert config.flush_messages is None
    assert config.message_timestamp_type == "LogAppendTime"


async def test_deleted_partition_releases_waiters(tmp_path: Path) -> None:
    manager = PartitionManager(tmp_path, node_id=1)
    partition = manager.ensure_partition("t", 0, DEFAULTS, leader_epoch=0)
    partition.log.append(_batch(b"x"), leader_epoch=0, now_ms=now_ms())
    result: list[bool] = []

    async def waiter() -> None:
        result.append(await partition.wait_high_watermark(1, trio.current_time() + 10))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.sleep(0.01)
        manager.remove_partition("t", 0)
    assert result == [False]
    assert not (tmp_path / "t-0").exists()


def test_close_snapshots_every_partition_that_moved_even_when_one_write_fails(
        tmp_path: Path) -> None:
    from raftlog.partition.producer_snapshot import list_snapshots

    manager = PartitionManager(tmp_path, node_id=1)
    for index in range(40):
        partition = manager.ensure_partition("t", index, {}, leader_epoch=0)
        if index != 39:  # partition 39 has no data: nothing to snapshot
            partition.log.append(_batch(b"v"), leader_epoch=0, now_ms=now_ms())
    directories = {index: manager.partitions[("t", index)].log.directory for index in range(40)}
    # Partition 7's snapshot cannot be written (its temp file's name is a directory).
    offset = manager.partitions[("t", 7)].log.log_end_offset
    (directories[7] / f"{offset:020d}.snapshot.tmp").mkdir()
    manager.close()
    assert not manager.partitions
    for index, directory in directories.items():
        expected = [] if index in (7, 39) else [1]
        assert list_snapshots(directory) == expected, index


def test_timed_flushes_follow_a_topic_switching_to_relaxed_flushing_and_back(
        tmp_path: Path) -> None:
    # The timed-flush check looks only at relaxed partitions (it went through all 10,000 on
    # every flusher wake-up): one whose topic turns flush.ms on must be found, one turned
    # back to the default must not.
    manager = PartitionManager(tmp_path, node_id=1)
    kept = manager.ensure_partition("kept", 0, DEFAULTS, leader_epoch=0)
    moving = manager.ensure_partition("moving", 0, DEFAULTS, leader_epoch=0)
    for partition in (kept, moving):
        partition.log.append(_batch(b"x"), leader_epoch=0, now_ms=now_ms() - 60_000)
    manager._collect_timed_flushes()
    assert not manager._dirty
    manager.update_configs("moving", {**DEFAULTS, "flush.ms": "1"})
    assert [p.topic for p in manager.partitions_of("moving")] == ["moving"]
    manager._collect_timed_flushes()
    assert manager._dirty == {moving}
    manager._dirty.clear()
    manager.update_configs("moving", DEFAULTS)
    manager._collect_timed_flushes()
    assert not manager._dirty
    manager.remove_partition("moving", 0)
    assert manager.partitions_of("moving") == []
    manager.close()


def test_flush_placement_runs_quick_rounds_on_the_loop_and_slow_ones_in_a_thread() -> None:
    placement = FlushPlacement(inline_s_max=0.001, tickets_max=4)
    assert not placement.inline(1)  # nothing measured yet: a worker thread
    placement.observe(0.0002)
    assert placement.inline(1) and placement.inline(4)
    assert not placement.inline(5)  # many logs to sync: a thread, whatever the last took
    placement.observe(0.008)  # one slow round: the next ones go to a thread...
    assert not placement.inline(1)
    for _ in range(3):
        placement.observe(0.0002)
        assert not placement.inline(1)  # 8, 4, 2 ms: still decaying
    placement.observe(0.0002)
    assert placement.inline(1)  # ...until the slow one has decayed below the bound


async def test_quick_fsync_rounds_run_on_the_event_loop(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The hand-off to a worker thread and back cost more CPU than the fsync it carried:
    quick rounds stay on the loop's thread; a slow round sends the next ones to a worker."""
    loop_thread = threading.get_ident()
    ran_on: list[bool] = []  # per round: on the loop's thread?
    slow = {"s": 0.0}

    def recording(tickets: list[FlushTicket]) -> tuple[list[OSError | None], float]:
        ran_on.append(threading.get_ident() == loop_thread)
        failures, fsync_s = real_run_tickets(tickets)
        time.sleep(slow["s"])
        return failures, fsync_s + slow["s"]

    real_run_tickets = manager_module._run_tickets
    monkeypatch.setattr(manager_module, "_run_tickets", recording)
    manager = PartitionManager(tmp_path, node_id=1)
    # A bound far above an fsync's time on a busy machine (~0.15 ms quiet here), so that only
    # the slow round below counts as slow.
    manager.flush_placement = FlushPlacement(inline_s_max=0.015)
    partition = manager.ensure_partition("t", 0, DEFAULTS, leader_epoch=0)

    async def one_append() -> None:
        info = partition.log.append(_batch(b"v"), leader_epoch=0, now_ms=now_ms())
        manager.note_append(partition)
        assert await partition.wait_high_watermark(info.last_offset + 1, trio.current_time() + 10)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(manager.run_flusher)
        for _ in range(3):
            await one_append()
        slow["s"] = 0.05
        await one_append()  # on the loop (the rounds before were quick), but slow
        slow["s"] = 0.0
        await one_append()
        nursery.cancel_scope.cancel()
    manager.close()
    assert ran_on == [False, True, True, True, False]


async def test_a_round_with_nothing_to_sync_skips_the_worker_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition marked dirty whose data was synced meanwhile yields no ticket: the round
    used to hand an empty list to a worker thread and back."""
    handed: list[int] = []

    def recording(tickets: list[FlushTicket]) -> tuple[list[OSError | None], float]:
        handed.append(len(tickets))
        return real_run_tickets(tickets)

    real_run_tickets = manager_module._run_tickets
    monkeypatch.setattr(manager_module, "_run_tickets", recording)
    manager = PartitionManager(tmp_path, node_id=1)
    partition = manager.ensure_partition("t", 0, DEFAULTS, leader_epoch=0)
    partition.log.append(_batch(b"v"), leader_epoch=0, now_ms=now_ms())
    ticket = partition.log.begin_flush()
    assert ticket is not None
    ticket.run()
    partition.log.complete_flush(ticket)
    manager.note_append(partition)  # dirty, with nothing left to sync
    assert not manager.flush_placement.inline(1)  # a new node's first round: a thread
    async with trio.open_nursery() as nursery:
        nursery.start_soon(manager.run_flusher)
        with trio.fail_after(10):
            while manager.flush_rounds == 0:  # noqa: ASYNC110
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    manager.close()
    assert handed == []


def test_flush_inline_syncs_now_when_quick_and_leaves_slow_rounds_to_the_flusher(
        tmp_path: Path) -> None:
    """A follower calls it right after appending a fetch answer: no flusher task runs here."""
    manager = PartitionManager(tmp_path, node_id=1)
    partition = manager.ensure_partition("t", 0, DEFAULTS, leader_epoch=0)
    manager.flush_placement.observe(0.0001)  # fsyncs have been quick
    info = partition.log.append(_batch(b"v"), leader_epoch=0, now_ms=now_ms())
    manager.note_append(partition)
    assert partition.log.flushed_offset <= info.last_offset
    assert manager.flush_inline()
    assert partition.log.flushed_offset == info.last_offset + 1
    assert partition.high_watermark == info.last_offset + 1  # durable: now visible
    manager.flush_placement.observe(0.5)  # a slow round: the next ones go to the thread
    info = partition.log.append(_batch(b"w"), leader_epoch=0, now_ms=now_ms())
    manager.note_append(partition)
    assert not manager.flush_inline()
    assert partition.log.flushed_offset <= info.last_offset  # still the flusher's to do
    manager.close()


async def test_a_high_watermark_wakes_consumer_long_polls_but_not_follower_ones(
        tmp_path: Path) -> None:
    """A follower's Fetch completes on appended bytes only (min_bytes 1): waking it for a HW
    cost each follower a read for nothing on every replicated produce."""
    manager = PartitionManager(tmp_path, node_id=1)
    partition = manager.ensure_partition("t", 0, DEFAULTS, leader_epoch=0)
    manager.flush_placement.observe(0.0001)
    partition.log.append(_batch(b"v"), leader_epoch=0, now_ms=now_ms())
    manager.note_append(partition)  # the append itself wakes both kinds
    woken: dict[str, bool] = {}

    async def wait(kind: str, deadline: float) -> None:
        if kind == "follower":
            await manager.wait_for_append(deadline)
        else:
            await manager.wait_for_data(deadline)
        woken[kind] = trio.current_time() < deadline

    deadline = trio.current_time() + 1.0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, "follower", deadline)
        nursery.start_soon(wait, "consumer", deadline)
        await trio.testing.wait_all_tasks_blocked()
        before = partition.high_watermark
        assert manager.flush_inline()  # fsynced: the HW moves
        assert partition.high_watermark > before
    assert woken == {"consumer": True, "follower": False}
    manager.close()
