"""The metadata quorum metrics (raftlog/observe/quorum.py) on real quorums.

Goal: on a Raft cluster exactly one node reports the leader state and every node names the
same leader and epoch, applied offsets catch up with the leader's high watermark, proposal
timeouts are counted, and a node cut off from its leader reports a growing leader-contact age
(and lost Raft links); a single-voter ``LocalQuorum`` is always its own leader. Method:
three raftlog ``Node``s (broker and controller, Raft over loopback) in this trio run, scraped
through ``node.parts`` with ``prometheus_client``; a ``LocalQuorum`` on tmp_path; bare
``RaftQuorum``s for a journal that fails its fsyncs (fault injection on one follower).
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from raftlog.config import ServerConfig
from raftlog.metadata.records import RegisterBroker
from raftlog.metadata.state import MetadataStateMachine
from raftlog.node import Node
from raftlog.observe.parts import MetricsSettings, NodeParts
from raftlog.observe.quorum import RAFT_STATES, QuorumCollector
from raftlog.observe.storage import StorageCollector
from raftlog.partition.cleaner_service import CleanerSettings, LogCleaner
from raftlog.partition.manager import PartitionManager
from raftlog.quorum.interface import QUORUM_ERROR_KINDS, ProposalTimeoutError
from raftlog.quorum.local import LocalNode, LocalQuorum
from raftlog.quorum.raft import RaftQuorum
from raftlog.quorum.raft_testing import open_quorums, wait_for_controller
from tests.unit.test_observe_storage import Samples, node_parts, scrape, value

WAIT_S = 60.0
SECRET = "observe-quorum-secret"
CONTACT = "raftlog_quorum_leader_last_contact_seconds"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def role(samples: Samples) -> str:
    [current] = [state for state in RAFT_STATES
                 if value(samples, "kafka_server_raft_metrics_current_state", state=state)]
    return current


def errors(samples: Samples, kind: str) -> float:
    return value(samples, "raftlog_quorum_errors_total", kind=kind)


async def wait_for(condition: Callable[[], bool], what: str) -> None:
    with trio.move_on_after(WAIT_S):
        while not condition():  # noqa: ASYNC110 (tick-thread state has no trio event)
            await trio.sleep(0.05)
        return
    raise AssertionError(f"not within {WAIT_S} s: {what}")


async def test_a_local_quorum_is_its_own_leader(tmp_path: Path) -> None:
    manager = PartitionManager(tmp_path / "data", node_id=7)
    async with LocalQuorum(tmp_path / "meta", MetadataStateMachine(),
                           node=LocalNode(7, "127.0.0.1", 9092)) as quorum:
        collector = QuorumCollector(node_parts(tmp_path, quorum, manager,
                                               LogCleaner(manager, CleanerSettings())))
        samples = scrape(collector)
        assert role(samples) == "leader"
        assert value(samples, "kafka_server_raft_metrics_current_leader") == 7
        version = quorum.image.version
        assert version >= 2  # BecomeController, RegisterBroker, UnfenceBroker
        for name in ("kafka_server_raft_metrics_high_watermark",
                     "kafka_server_raft_metrics_log_end_offset",
                     "kafka_server_broker_metadata_metrics_last_applied_record_offset",
                     "raftlog_metadata_version"):
            assert value(samples, name) == version, name
        assert value(samples, "kafka_server_raft_metrics_current_epoch") == 1
        assert value(samples, CONTACT) == 0
        assert {kind: errors(samples, kind) for kind in QUORUM_ERROR_KINDS} == dict.fromkeys(
            QUORUM_ERROR_KINDS, 0)
        # A zero timeout expires at the first checkpoint, before the commit: withdrawn.
        with pytest.raises(ProposalTimeoutError):
            await quorum.propose(RegisterBroker(8, "127.0.0.1", 9093, None, "inc-8"),
                                 timeout_s=0)
        assert errors(scrape(collector), "proposal_timeout") == 1
    manager.close()


class RunningNode:
    """One raftlog Node (broker and controller) in this trio run, stoppable."""

    def __init__(self, config: ServerConfig) -> None:
        self.node = Node(config)
        self.scope = trio.CancelScope()
        self.stopped = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        try:
            with self.scope:
                async with trio.open_nursery() as nursery:
                    await nursery.start(self.node.run)
                    task_status.started()
        finally:
            self.stopped.set()

    @property
    def parts(self) -> NodeParts:
        assert self.node.parts is not None
        return self.node.parts

    @property
    def raft(self) -> RaftQuorum:
        quorum = self.node.quorum
        assert isinstance(quorum, RaftQuorum)
        return quorum

    def scrape(self) -> Samples:
        return scrape(QuorumCollector(self.parts))

    async def stop(self) -> None:
        self.scope.cancel()
        await self.stopped.wait()


def cluster_configs(root: Path, count: int) -> list[ServerConfig]:
    kafka = [free_port() for _ in range(count)]
    raft = [free_port() for _ in range(count)]
    voters = ",".join(f"{i + 1}@127.0.0.1:{raft[i]}" for i in range(count))
    return [ServerConfig.from_properties({
        "node.id": str(i + 1),
        "process.roles": "broker,controller",
        "listeners": f"PLAINTEXT://127.0.0.1:{kafka[i]},CONTROLLER://127.0.0.1:{raft[i]}",
        "controller.quorum.voters": voters,
        "controller.listener.names": "CONTROLLER",
        "log.dirs": str(root / f"node-{i + 1}"),
        "raft.secret": SECRET,
        "cluster.id": "observe-quorum-cluster",
    }) for i in range(count)]


async def test_raft_nodes_agree_and_a_cut_off_node_sees_its_leader_contact_age(
    tmp_path: Path,
) -> None:
    nodes = [RunningNode(config) for config in cluster_configs(tmp_path, 3)]
    async with trio.open_nursery() as nursery:
        for node in nodes:
            await nursery.start(node.run)

        def one_leader_everyone_agrees() -> bool:
            views = [node.scrape() for node in nodes]
            roles = [role(v) for v in views]
            if sorted(roles) != ["follower", "follower", "leader"]:
                return False
            leader = nodes[roles.index("leader")].raft
            leaders = {value(v, "kafka_server_raft_metrics_current_leader") for v in views}
            epochs = {value(v, "kafka_server_raft_metrics_current_epoch") for v in views}
            return leaders == {leader.node_id} and len(epochs) == 1 and leader.controller_ready

        await wait_for(one_leader_everyone_agrees, "one leader that every node names")
        leader = next(n for n in nodes if role(n.scrape()) == "leader")
        followers = [n for n in nodes if n is not leader]
        samples = leader.scrape()
        assert value(samples, CONTACT) == 0
        assert value(samples, "kafka_server_raft_metrics_current_epoch") >= 1

        # A proposal that cannot finish in time (zero: the tick thread cannot answer before
        # the first checkpoint) is counted.
        with pytest.raises(ProposalTimeoutError):
            await leader.raft.propose(RegisterBroker(99, "127.0.0.1", 9099, None, "inc-99"),
                                      timeout_s=0)
        assert errors(leader.scrape(), "proposal_timeout") == 1
        assert errors(followers[0].scrape(), "proposal_timeout") == 0

        # Every node applies what the leader committed.
        committed = value(leader.scrape(), "kafka_server_raft_metrics_high_watermark")
        assert committed > 0

        def applied_everywhere() -> bool:
            for node in nodes:
                samples = node.scrape()
                applied = value(samples,
                                "kafka_server_broker_metadata_metrics_last_applied_record_offset")
                if applied < committed or value(
                        samples, "kafka_server_raft_metrics_log_end_offset") < applied:
                    return False
            return True

        await wait_for(applied_everywhere, f"every node applied index {committed}")
        # Heartbeats keep the followers' contact age small (the deadline is generous).
        await wait_for(lambda: all(value(f.scrape(), CONTACT) < 5 for f in followers),
                       "the followers hear their leader")
        # The storage collector reads the same parts (no partitions yet, internal topics aside).
        storage = scrape(StorageCollector(leader.parts, MetricsSettings()))
        assert value(storage, "raftlog_log_segments") >= 0

        # Cut the last node off: stop the leader and the other follower (no majority left).
        survivor = followers[0]
        for node in (leader, followers[1]):
            await node.stop()
        assert errors(survivor.scrape(), "storage") == 0

        def contact_age_grows() -> bool:
            samples = survivor.scrape()
            return value(samples, CONTACT) > 3 and errors(samples, "transport") > 0

        await wait_for(contact_age_grows, "the survivor's leader-contact age passes 3 s")
        first = value(survivor.scrape(), CONTACT)
        await wait_for(lambda: value(survivor.scrape(), CONTACT) > first,
                       "the age keeps growing")
        assert role(survivor.scrape()) in ("follower", "candidate")
        await survivor.stop()
        nursery.cancel_scope.cancel()


async def test_raft_journal_failures_count_as_storage_errors(tmp_path: Path) -> None:
    async with open_quorums(tmp_path, voters=3) as quorums:
        controller = await wait_for_controller(quorums, WAIT_S)
        follower = next(q for q in quorums if q is not controller)
        manager = PartitionManager(tmp_path / "data", node_id=follower.node_id)
        collector = QuorumCollector(node_parts(tmp_path, follower, manager,
                                               LogCleaner(manager, CleanerSettings())))
        assert errors(scrape(collector), "storage") == 0
        journal = follower.syncobj.journal
        healthy_flush = journal.flush

        def failing_flush() -> None:
            raise OSError(errno.EIO, os.strerror(errno.EIO))

        # Fault injection: the follower's journal refuses fsyncs for a while (every tick
        # fails; pysyncobj logs it and ticks again).
        journal.flush = failing_flush  # type: ignore[method-assign]
        try:
            await wait_for(lambda: errors(scrape(collector), "storage") >= 3,
                           "failed ticks are counted")
        finally:
            journal.flush = healthy_flush  # type: ignore[method-assign]
        result = await controller.propose(RegisterBroker(5, "127.0.0.1", 9005, None, "inc-5"))
        assert result.ok
        await follower.wait_for_version(controller.image.version, WAIT_S)
        assert errors(scrape(collector), "proposal_timeout") == 0
        manager.close()
