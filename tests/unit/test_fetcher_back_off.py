"""A follower's back-off lines are budgeted: a restart makes every partition of a leader back
off at once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

from raftlog.partition.manager import PartitionManager
from raftlog.protocol.errors import ErrorCode
from raftlog.replication.fetcher import FollowerAssignment, LeaderFetcher
from raftlog.replication.manager import ReplicaManager


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
