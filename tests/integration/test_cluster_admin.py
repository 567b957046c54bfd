"""Admin routing in a 3-node cluster: NOT_CONTROLLER from the other nodes, the CLI finding the
controller, auto-creation forwarded to the controller, ``quorum status``, a paused controller,
and a broker-only node (a non-voting observer) joining the cluster."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from raftlog.client.connection import KafkaConnection
from raftlog.protocol.schemas import CREATE_TOPICS, METADATA
from tests.integration.cluster_harness import (
    Cluster,
    ClusterNode,
    cluster3,
    node_directory,
    run,
    wait_for,
    wait_until,
)
from tests.integration.helpers import unique_topic

__all__ = ["cluster3"]

NOT_CONTROLLER = 41


def raftlog_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raftlog", *args], capture_output=True,
                          text=True, timeout=60)


async def _create_topic(address: tuple[str, int], topic: str) -> Any:
    async with await KafkaConnection.connect(*address) as conn:
        body = {"topics": [{"name": topic, "num_partitions": 1, "replication_factor": 3,
                            "assignments": [], "configs": []}], "timeout_ms": 10_000}
        return await conn.request(CREATE_TOPICS, body)


async def _auto_create(address: tuple[str, int], topic: str) -> Any:
    async with await KafkaConnection.connect(*address) as conn:
        body = {"topics": [{"name": topic}], "allow_auto_topic_creation": True}
        return await conn.request(METADATA, body, version=8)


def test_admin_requests_are_answered_by_the_controller_only(cluster3: Cluster) -> None:
    controller = wait_for(cluster3.quorum_leader, 10, "a ready controller")
    other = next(n for n in cluster3.nodes.values() if n.node_id != controller)
    assert cluster3.metadata(node=other).controller_id == controller
    topic = unique_topic("routed")
    response = run(_create_topic(other.address, topic))
    assert response.topics[0].error_code == NOT_CONTROLLER
    assert topic not in {t.name for t in cluster3.metadata().topics}

    # The CLI resolves the controller through Metadata, whichever node it was given.
    result = raftlog_cli("topics", "create", "--topic", topic, "--partitions", "2",
                         "--replication-factor", "3", "--bootstrap-server", other.bootstrap)
    assert result.returncode == 0, result.stderr
    described = raftlog_cli("topics", "describe", "--topic", topic,
                            "--bootstrap-server", other.bootstrap)
    assert described.returncode == 0, described.stderr
    assert "ReplicationFactor: 3" in described.stdout

    status = raftlog_cli("quorum", "status", "--bootstrap-server", other.bootstrap)
    assert status.returncode == 0, status.stderr
    assert f"LeaderId:         {controller}" in status.stdout
    assert "CurrentVoters:    [1,2,3]" in status.stdout


def test_auto_creation_on_another_node_is_forwarded_to_the_controller(
    cluster3: Cluster,
) -> None:
    controller = wait_for(cluster3.quorum_leader, 10, "a ready controller")
    other = next(n for n in cluster3.nodes.values() if n.node_id != controller)
    topic = unique_topic("auto")
    response = run(_auto_create(other.address, topic))
    described = response.topics[0]
    assert described.error_code == 0, described
    assert len(described.partitions[0].replica_nodes) == 3  # default.replication.factor


def test_paused_controller_is_replaced_and_steps_down_after_sigcont(cluster3: Cluster) -> None:
    topic = unique_topic("paused-controller")
    result = raftlog_cli("topics", "create", "--topic", topic, "--partitions", "3",
                         "--replication-factor", "3", "--bootstrap-server", cluster3.bootstrap)
    assert result.returncode == 0, result.stderr
    old = wait_for(cluster3.quorum_leader, 10, "a ready controller")
    cluster3.nodes[old].pause()
    paused_at = time.monotonic()
    new = wait_for(lambda: ((n := cluster3.quorum_leader(timeout_s=1.0)) not in (None, old)
                   and n) or None, 10, "a new controller")
    took_s = time.monotonic() - paused_at
    wait_until(lambda: all(old not in p.isr_nodes and p.leader_id not in (-1, old)
                           for p in cluster3.metadata(topic).topics[0].partitions),
               10, "the paused controller's broker to be fenced")
    cluster3.nodes[old].resume()
    # Exactly one controller afterwards, and the old one's broker rejoins every ISR.
    wait_until(lambda: all(old in p.isr_nodes
                           for p in cluster3.metadata(topic).topics[0].partitions),
               30, "the resumed node to rejoin every ISR")
    leaders = set()
    for node in cluster3.nodes.values():
        status = raftlog_cli("quorum", "status", "--bootstrap-server", node.bootstrap)
        line = next(x for x in status.stdout.splitlines() if x.startswith("LeaderId:"))
        leaders.add(line.split()[-1])
    assert len(leaders) == 1, leaders
    print(f"new controller {new} {took_s:.2f} s after SIGSTOP of {old}")


def test_broker_only_node_joins_as_an_observer(cluster3: Cluster) -> None:
    layout = cluster3.layout
    observer_dir = node_directory(cluster3.directory, 4)
    observer_dir.mkdir()
    port = ClusterNode.free_port()
    first = (cluster3.directory / "node-1" / "server.properties").read_text()
    secret_file = next(line.split("=", 1)[1] for line in first.splitlines()
                       if line.startswith("raft.secret.file="))
    properties = {
        "node.id": "4",
        "process.roles": "broker",
        "listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.quorum.voters": layout.voters,
        "controller.listener.names": "CONTROLLER",
        "log.dirs": str(observer_dir / "data"),
        "cluster.id": layout.cluster_id,
        "raft.secret.file": secret_file,
        "broker.session.timeout.ms": "1500",
        "broker.heartbeat.interval.ms": "250",
    }
    (observer_dir / "server.properties").write_text(
        "".join(f"{k}={v}\n" for k, v in properties.items()))
    node = ClusterNode(4, observer_dir, port, 0)
    cluster3.nodes[4] = node
    node.start()
    node.wait_listening()
    wait_until(lambda: 4 in {b.node_id for b in cluster3.metadata(node=node).brokers}, 20,
               "the broker-only node to register")
    topic = unique_topic("observer")
    result = raftlog_cli("topics", "create", "--topic", topic, "--partitions", "4",
                         "--replication-factor", "4", "--bootstrap-server", node.bootstrap)
    assert result.returncode == 0, result.stderr
    wait_until(lambda: all(4 in p.isr_nodes
                           for p in cluster3.metadata(topic).topics[0].partitions),
               20, "the observer to be in every ISR")
