"""The cluster-health and replication collectors over real replicating parts.

Three in-process brokers from ``test_replication_cluster`` (real PartitionManagers,
ReplicaManagers, fetchers and Kafka listeners; metadata images from the metadata state
machine): each node's parts are handed to ``ClusterCollector`` / ``ReplicationCollector``,
rendered by ``prometheus_client`` and parsed back, as Prometheus would read them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from raftlog.controller.service import ControllerStats
from raftlog.metadata.image import MetadataImage
from raftlog.metadata.records import (
    AlterConfigs,
    BecomeController,
    CreateTopic,
    DeleteTopic,
    FenceBroker,
    PartitionChange,
    RegisterBroker,
    UnfenceBroker,
)
from raftlog.metadata.testing import MachineDriver, make_topic_id
from raftlog.observe.cluster import ClusterCollector
from raftlog.observe.parts import MetricsSettings, NodeParts
from raftlog.observe.replication import ReplicationCollector, follower_lag_seconds
from raftlog.partition.cleaner_service import CleanerSettings, LogCleaner
from raftlog.partition.replica_state import FollowerState
from raftlog.protocol.schemas import FETCH
from tests.unit.test_replication_cluster import (
    FAST,
    TOPIC,
    TestNode,
    caught_up,
    connect,
    eventually,
    produce,
    record_batch,
    running_cluster,
)

DEADLINE_S = 60.0
TOPIC_RESOURCE = 2  # Kafka's ConfigResource type of a topic
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class _QuorumView:
    """What the collectors read from a quorum, over the harness's image holder (these
    brokers run no controller)."""

    def __init__(self, node: TestNode, controller_ready: bool) -> None:
        self._node = node
        self.controller_ready = controller_ready

    @property
    def image(self) -> MetadataImage:
        return self._node.quorum.image


def parts_of(node: TestNode, controller_ready: bool = False) -> NodeParts:
    """The node's current parts (a restart builds new ones)."""
    return NodeParts(
        config=node.config, quorum=_QuorumView(node, controller_ready),  # type: ignore[arg-type]
        manager=node.manager, cleaner=LogCleaner(node.manager, CleanerSettings()),
        replicas=node.replicas, apis=node.apis, controller=None, groups=None, txn=None,
        ready=lambda: True)


def scrape(node: TestNode, settings: MetricsSettings | None = None, *,
           controller_ready: bool = False) -> Samples:
    registry = CollectorRegistry(auto_describe=False)
    parts = parts_of(node, controller_ready)
    registry.register(ClusterCollector(parts))
    registry.register(ReplicationCollector(parts, settings or MetricsSettings()))
    samples: Samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def metric(node: TestNode, name: str, **labels: str) -> float:
    return value(scrape(node), name, **labels)


async def test_isr_health_follows_a_follower_that_stops_and_rejoins(tmp_path: Path) -> None:
    settings = dataclasses.replace(FAST, replica_lag_time_max_ms=400)
    async with running_cluster(tmp_path, settings=settings) as (cluster, nursery):
        nodes = cluster.nodes
        cluster.create_topic((1, 2, 3), partitions=3)
        leader = nodes[1]
        client = await connect(leader)
        assert (await produce(client, record_batch(0))).error_code == 0
        await eventually(lambda: all(caught_up(nodes.values(), i) for i in range(3)),
                         DEADLINE_S)
        for node in nodes.values():
            samples = scrape(node)
            assert value(samples, "kafka_server_replicamanager_partitioncount") == 3
            assert value(samples, "kafka_server_replicamanager_underreplicatedpartitions") == 0
            assert value(samples, "kafka_server_replicamanager_underminisrpartitioncount") == 0
            # Not the controller (these brokers run none): controller gauges are 0 here.
            assert value(samples, "kafka_controller_kafkacontroller_activecontrollercount") == 0
            assert value(samples, "kafka_controller_kafkacontroller_globalpartitioncount") == 0
        assert sum(metric(n, "kafka_server_replicamanager_leadercount")
                   for n in nodes.values()) == 3
        assert metric(leader, "kafka_server_replicamanager_isrshrinks_total") == 0

        # Node 3 stops: node 1 shrinks it out of partition 0's ISR once it has lagged for
        # replica.lag.time.max.ms; the acks=all produce meanwhile waits in the purgatory.
        await nodes[3].stop()
        done = trio.Event()

        async def produce_while_waiting() -> None:
            assert (await produce(client, record_batch(1), timeout_ms=20_000)).error_code == 0
            done.set()

        nursery.start_soon(produce_while_waiting)
        await eventually(lambda: done.is_set() or metric(
            leader, "kafka_server_delayedoperationpurgatory_purgatorysize",
            delayedOperation="Produce") == 1, DEADLINE_S)
        with trio.fail_after(DEADLINE_S):
            await done.wait()
        assert cluster.state(0).isr == (1, 2)
        samples = scrape(leader, MetricsSettings(partition_detail=True))
        assert value(samples, "kafka_server_delayedoperationpurgatory_purgatorysize",
                     delayedOperation="Produce") == 0
        assert value(samples, "kafka_server_replicamanager_underreplicatedpartitions") == 1
        assert value(samples, "kafka_server_replicamanager_isrshrinks_total") == 1
        assert value(samples, "kafka_server_replicamanager_isrexpands_total") == 0
        assert value(samples, "raftlog_replica_lag_seconds_max") >= 0.4
        assert value(samples, "raftlog_replica_lag_messages", topic=TOPIC, partition="0",
                     replica="3") == 3
        assert value(samples, "raftlog_replica_lag_messages", topic=TOPIC, partition="0",
                     replica="2") == 0
        assert value(samples, "raftlog_replica_lag_seconds", topic=TOPIC, partition="0",
                     replica="3") >= 0.4
        # With min.insync.replicas=3, the shrunk partition is under its minimum ISR.
        assert cluster.driver.apply(AlterConfigs(
            TOPIC_RESOURCE, TOPIC, (("min.insync.replicas", "3"),), ())).ok
        cluster.publish()
        assert metric(leader, "kafka_server_replicamanager_underminisrpartitioncount") == 1

        # Node 3 comes back, catches up and is added back: every count is healthy again.
        await nodes[3].restart(nursery)
        await eventually(lambda: all(set(cluster.state(i).isr) == {1, 2, 3}
                                     for i in range(3)), DEADLINE_S)
        await eventually(lambda: metric(
            leader, "kafka_server_replicamanager_underreplicatedpartitions") == 0, DEADLINE_S)
        samples = scrape(leader)
        assert value(samples, "kafka_server_replicamanager_underminisrpartitioncount") == 0
        assert value(samples, "kafka_server_replicamanager_isrexpands_total") == 1
        assert value(samples, "kafka_server_replicamanager_isrshrinks_total") == 1
        await eventually(lambda: metric(leader, "raftlog_replica_lag_seconds_max") == 0,
                         DEADLINE_S)
        await client.aclose()


async def test_traffic_counters_and_follower_lag(tmp_path: Path) -> None:
    async with running_cluster(tmp_path) as (cluster, _):
        nodes = cluster.nodes
        cluster.create_topic((1, 2, 3))
        leader, follower = nodes[1], nodes[2]
        before = scrape(leader)
        assert ("kafka_server_brokertopicmetrics_bytesin_total", (("topic", TOPIC),)) \
            not in before, "no series before the first produce"
        client = await connect(leader)
        batches = [record_batch(i, count=i + 1) for i in range(4)]
        for batch in batches:
            assert (await produce(client, batch)).error_code == 0
        samples = scrape(leader)
        assert value(samples, "kafka_server_brokertopicmetrics_messagesin_total",
                     topic=TOPIC) == 1 + 2 + 3 + 4
        assert value(samples, "kafka_server_brokertopicmetrics_bytesin_total",
                     topic=TOPIC) == sum(len(b) for b in batches)
        # acks=1 appends count too; a produce the follower refuses counts nowhere.
        assert (await produce(client, record_batch(9, count=2), acks=1)).error_code == 0
        assert metric(leader, "kafka_server_brokertopicmetrics_messagesin_total",
                      topic=TOPIC) == 12
        to_follower = await connect(follower)
        assert (await produce(to_follower, record_batch(10))).error_code != 0
        await to_follower.aclose()
        assert ("kafka_server_brokertopicmetrics_messagesin_total", (("topic", TOPIC),)) \
            not in scrape(follower)

        # Followers appended exactly what the leader served them.
        await eventually(lambda: caught_up(nodes.values()), DEADLINE_S)
        leader_samples = scrape(leader)
        out = value(leader_samples, "kafka_server_brokertopicmetrics_replicationbytesout_total")
        ins = [metric(n, "kafka_server_brokertopicmetrics_replicationbytesin_total")
               for n in (nodes[2], nodes[3])]
        stored = sum(len(b) for b in batches) + len(record_batch(9, count=2))
        assert ins == [stored, stored]
        assert out == 2 * stored
        assert value(leader_samples, "kafka_server_brokertopicmetrics_replicationbytesin_total"
                     ) == 0
        for node in (nodes[2], nodes[3]):
            samples = scrape(node)
            assert value(samples, "kafka_server_fetcherstats_requests_total") > 0
            assert value(samples, "kafka_server_fetcherstats_bytes_total") == stored
            assert value(samples, "kafka_server_replicafetchermanager_maxlag") == 0
        assert value(leader_samples, "kafka_server_fetcherstats_requests_total") == 0
        # Followers idle in long polls on the leader: the Fetch purgatory holds them.
        await eventually(lambda: metric(
            leader, "kafka_server_delayedoperationpurgatory_purgatorysize",
            delayedOperation="Fetch") >= 1, DEADLINE_S)

        # A consumer's fetch counts as bytes out for the topic, not as replication.
        fetched = await client.request(FETCH, {
            "max_wait_ms": 0, "min_bytes": 0, "topics": [{"topic": TOPIC, "partitions": [{
                "partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
                "partition_max_bytes": 1 << 20}]}]}, version=11)
        served = len(fetched.responses[0].partitions[0].records)
        assert served == stored
        samples = scrape(leader)
        assert value(samples, "kafka_server_brokertopicmetrics_bytesout_total",
                     topic=TOPIC) == served
        assert value(samples, "kafka_server_brokertopicmetrics_replicationbytesout_total") \
            == 2 * stored

        # A follower's lag: the leader's HW in its last answer minus its own log end.
        assignment = follower.replicas.fetchers[1].assignments[(TOPIC, 0)]
        assignment.leader_high_watermark = follower.partition().log.log_end_offset + 5
        assert metric(follower, "kafka_server_replicafetchermanager_maxlag") == 5

        # A deleted topic's series go away with it.
        assert cluster.driver.apply(DeleteTopic(TOPIC, make_topic_id(7))).ok
        cluster.publish()
        samples = scrape(leader)
        assert not [key for key in samples if ("topic", TOPIC) in key[1]]
        await client.aclose()


async def test_controller_gauges_count_offline_partitions_and_brokers(tmp_path: Path) -> None:
    async with running_cluster(tmp_path, node_ids=(1, 2)) as (cluster, _):
        cluster.create_topic((1, 2), partitions=2)  # partition 0 led by 1, partition 1 by 2
        node = cluster.nodes[1]

        def gauges() -> dict[str, float]:
            samples = scrape(node, controller_ready=True)
            prefix = "kafka_controller_kafkacontroller_"
            return {name[len(prefix):]: v for (name, _), v in samples.items()
                    if name.startswith(prefix)}

        assert gauges() == {"activecontrollercount": 1, "offlinepartitionscount": 0,
                            "globalpartitioncount": 2, "globaltopiccount": 1,
                            "activebrokercount": 2, "fencedbrokercount": 0}
        cluster.change(leader=-1, isr=(1, 2), index=0)  # no leader
        assert gauges()["offlinepartitionscount"] == 1
        assert cluster.driver.apply(FenceBroker(2)).ok  # partition 1's leader is fenced
        cluster.publish()
        assert gauges() == {"activecontrollercount": 1, "offlinepartitionscount": 2,
                            "globalpartitioncount": 2, "globaltopiccount": 1,
                            "activebrokercount": 1, "fencedbrokercount": 1}


def test_elections_counted_from_the_state_they_changed() -> None:
    driver = MachineDriver()
    driver.apply(BecomeController(1, 1))
    for node_id in (1, 2, 3):
        driver.apply(RegisterBroker(node_id, "127.0.0.1", 9000 + node_id, None, f"i{node_id}"))
        driver.apply(UnfenceBroker(node_id))
    assert driver.apply(CreateTopic("e", make_topic_id(1), ((1, 2, 3),), ())).ok
    before = driver.machine.image
    stats = ControllerStats()
    stats.count_election(before, PartitionChange("e", 0, 1, (1, 2), 0, 1))  # a shrink
    assert (stats.leader_elections.value, stats.unclean_leader_elections.value) == (0, 0)
    stats.count_election(before, PartitionChange("e", 0, -1, (1, 2, 3), 1, 1))  # offline
    assert (stats.leader_elections.value, stats.unclean_leader_elections.value) == (0, 0)
    stats.count_election(before, PartitionChange("e", 0, 2, (2, 3), 1, 1))  # from the ISR
    assert (stats.leader_elections.value, stats.unclean_leader_elections.value) == (1, 0)
    assert driver.apply(PartitionChange("e", 0, 1, (1,), 0, 1)).ok
    shrunk = driver.machine.image
    stats.count_election(shrunk, PartitionChange("e", 0, 3, (3,), 1, 2))  # outside the ISR
    assert (stats.leader_elections.value, stats.unclean_leader_elections.value) == (2, 1)


def test_lag_seconds_of_one_follower() -> None:
    caught_up_follower = FollowerState(log_end_offset=10, last_caught_up_ms=1_000)
    assert follower_lag_seconds(caught_up_follower, 10, 0, 9_000) == 0
    behind = FollowerState(log_end_offset=7, last_caught_up_ms=4_000)
    assert follower_lag_seconds(behind, 10, 0, 9_000) == 5.0
    never = FollowerState()  # not caught up since this leadership began at 6 s
    assert follower_lag_seconds(never, 10, 6_000, 9_000) == 3.0
