"""Cluster-health metrics of three real raftlog nodes (Raft quorum, controller, brokers) run
in this process, read from each node's ``Node.parts`` by ``ClusterCollector`` and parsed back
from the exposition format.

Goal: the controller gauges come from exactly one node (the ready controller), leader counts
over the nodes add up to the partitions, and a stopped broker shows up as a fenced broker,
leader elections on the controller and under-replicated partitions on the others, with no
partition left offline and no unclean election.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from raftlog.client.connection import KafkaConnection
from raftlog.config import ServerConfig
from raftlog.node import Node
from raftlog.observe.cluster import ClusterCollector
from raftlog.protocol.schemas import CREATE_TOPICS
from raftlog.tools.cluster import node_directory, prepare

DEADLINE_S = 60.0
TOPIC = "observed"
PARTITIONS = 6


def scrape(node: Node) -> dict[str, float]:
    """Unlabelled samples of ``node``'s cluster collector, by name."""
    assert node.parts is not None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector(node.parts))
    return {sample.name: sample.value
            for family in text_string_to_metric_families(generate_latest(registry).decode())
            for sample in family.samples if not sample.labels}


def total(nodes: dict[int, Node], name: str) -> float:
    return sum(scrape(node)[name] for node in nodes.values())


async def eventually(predicate: Callable[[], bool]) -> None:
    """Polls a condition that spans several nodes (no single event covers it)."""
    with trio.fail_after(DEADLINE_S):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.05)


def controller_of(nodes: dict[int, Node]) -> Node | None:
    ready = [n for n in nodes.values() if n.quorum is not None and n.quorum.controller_ready]
    return ready[0] if len(ready) == 1 else None


async def _run(node: Node, scope: trio.CancelScope) -> None:
    with scope:
        await node.run()


async def test_controller_and_broker_gauges_of_a_real_cluster(tmp_path: Path) -> None:
    layout = prepare(tmp_path, 3, 0)
    nodes = {node_id: Node(ServerConfig.load(
        node_directory(tmp_path, node_id) / "server.properties")) for node_id in layout.node_ids}
    scopes = {node_id: trio.CancelScope() for node_id in nodes}
    async with trio.open_nursery() as nursery:
        for node_id, node in nodes.items():
            nursery.start_soon(_run, node, scopes[node_id])
        def started() -> bool:
            controller = controller_of(nodes)
            return controller is not None and all(
                n.parts is not None and n.parts.ready() for n in nodes.values()) and scrape(
                controller)["kafka_controller_kafkacontroller_activebrokercount"] == 3

        await eventually(started)
        first = controller_of(nodes)
        assert first is not None and first.kafka_port is not None
        client = await KafkaConnection.connect("127.0.0.1", first.kafka_port)
        with trio.fail_after(DEADLINE_S):
            response = await client.request(CREATE_TOPICS, {
                "topics": [{"name": TOPIC, "num_partitions": PARTITIONS,
                            "replication_factor": 3, "assignments": [], "configs": []}],
                "timeout_ms": 10_000})
        assert response.topics[0].error_code == 0, response
        await client.aclose()

        def settled() -> bool:
            controller = controller_of(nodes)
            return controller is not None and scrape(controller)[
                "kafka_controller_kafkacontroller_globalpartitioncount"] >= PARTITIONS \
                and total(nodes, "kafka_server_replicamanager_leadercount") >= PARTITIONS \
                and total(nodes, "kafka_server_replicamanager_underreplicatedpartitions") == 0

        await eventually(settled)
        controller = controller_of(nodes)
        assert controller is not None and controller.quorum is not None
        image = controller.quorum.image
        partitions = sum(len(t.partitions) for t in image.topics.values())
        assert total(nodes, "kafka_controller_kafkacontroller_activecontrollercount") == 1
        samples = scrape(controller)
        assert samples["kafka_controller_kafkacontroller_globaltopiccount"] == len(image.topics)
        assert samples["kafka_controller_kafkacontroller_globalpartitioncount"] == partitions
        assert samples["kafka_controller_kafkacontroller_activebrokercount"] == 3
        assert samples["kafka_controller_kafkacontroller_fencedbrokercount"] == 0
        assert samples["kafka_controller_kafkacontroller_offlinepartitionscount"] == 0
        for node in nodes.values():
            if node is not controller:
                assert scrape(node)["kafka_controller_kafkacontroller_globaltopiccount"] == 0
        assert total(nodes, "kafka_server_replicamanager_leadercount") == partitions
        assert total(nodes, "kafka_server_replicamanager_partitioncount") == 3 * partitions
        elections_before = samples["kafka_controller_controllerstats_leaderelections_total"]

        # A broker that leads some partitions stops: the controller fences it and elects
        # new leaders from the ISR; the survivors lead everything, under-replicated.
        victim_id = next(node_id for node_id, node in nodes.items() if node is not controller
                         and scrape(node)["kafka_server_replicamanager_leadercount"] > 0)
        victim = nodes.pop(victim_id)
        led = scrape(victim)["kafka_server_replicamanager_leadercount"]
        scopes[victim_id].cancel()

        def failed_over() -> bool:
            current = controller_of(nodes)
            if current is None:
                return False
            samples = scrape(current)
            return samples["kafka_controller_kafkacontroller_fencedbrokercount"] == 1 \
                and samples["kafka_controller_kafkacontroller_offlinepartitionscount"] == 0 \
                and total(nodes, "kafka_server_replicamanager_leadercount") == partitions \
                and total(nodes, "kafka_server_replicamanager_underreplicatedpartitions") \
                == partitions

        await eventually(failed_over)
        assert controller_of(nodes) is controller, "the controller did not stop"
        samples = scrape(controller)
        assert samples["kafka_controller_kafkacontroller_activebrokercount"] == 2
        assert samples["kafka_controller_controllerstats_leaderelections_total"] \
            >= elections_before + led
        assert samples["kafka_controller_controllerstats_uncleanleaderelections_total"] == 0
        assert total(nodes, "kafka_controller_kafkacontroller_activecontrollercount") == 1
        nursery.cancel_scope.cancel()
