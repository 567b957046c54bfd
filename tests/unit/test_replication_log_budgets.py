"""Per-partition lines a restart repeats for thousands of partitions are budgeted: a follower's
back-offs, a leader's unanswered AlterPartition requests."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
import trio

from raftlog.broker.alter_partition_sender import AlterPartitionUnansweredError
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import Partition
from raftlog.partition.replica_state import LeaderState, PendingIsr
from raftlog.protocol.errors import ErrorCode
from raftlog.replication.fetcher import FollowerAssignment, LeaderFetcher
from raftlog.replication.leader import IsrManager
from raftlog.replication.manager import ReplicaManager
from raftlog.replication.settings import ReplicationSettings


def test_a_thousand_partitions_backing_off_log_a_few_lines_and_a_count(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        manager = PartitionManager(tmp_path, node_id=2)
        fetcher = LeaderFetcher(ReplicaManager(manager), leader_id=1)
        assignments = []
        for index in range(1000):
            partition = manager.ensure_partition("t", index, {}, leader_epoch=0)
            partition.is_leader = False
            assignments.append(FollowerAssignment(partition, leader_id=1, leader_epoch=1))
        with caplog.at_level(logging.INFO, logger="raftlog.replication.fetcher"):
            for assignment in assignments:
                fetcher._back_off(assignment, ErrorCode.UNKNOWN_LEADER_EPOCH,
                                  "OffsetForLeaderEpoch")
        lines = [r for r in caplog.records if "backing off" in r.getMessage()]
        assert 1 <= len(lines) <= 20, f"{len(lines)} lines for 1,000 partitions"
        assert all(a.delayed_until > trio.current_time() for a in assignments), \
            "every partition still backs off"
        manager.close()

    trio.run(main)


def test_unanswered_alter_partition_requests_log_a_few_lines_and_a_count(
        caplog: pytest.LogCaptureFixture) -> None:
    # A 10,000-partition restart logged 61,000 "AlterPartition failed" warnings.
    async def unanswered(*_: object) -> tuple[int, None]:
        raise AlterPartitionUnansweredError("AlterPartition: node 2: ")

    failed: list[object] = []
    state = SimpleNamespace(leader_epoch=1, change_failed=lambda pending, *_, **__: failed.append(
        pending))
    isr = IsrManager(cast(PartitionManager, SimpleNamespace()), 1, ReplicationSettings(),
                     unanswered, lambda _: True)

    async def main() -> None:
        for index in range(1000):
            pending = SimpleNamespace(proposed=(1, 2), partition_epoch=3)
            await isr._send_alter_isr(cast(Partition, SimpleNamespace(topic="t", index=index)),
                                      cast(LeaderState, state), cast(PendingIsr, pending))

    with caplog.at_level(logging.INFO, logger="raftlog.replication.leader"):
        trio.run(main)
    lines = [r for r in caplog.records if "AlterPartition failed" in r.getMessage()]
    assert 1 <= len(lines) <= 20, f"{len(lines)} lines for 1,000 partitions"
    assert len(failed) == 1000, "every change is still marked failed (outcome unknown)"
