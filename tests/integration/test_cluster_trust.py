"""A stranger on the network cannot act as a broker (issue: "A client on the network cannot
break the cluster").

Each test is an attack that worked before inter-broker trust existed, run as a plain TCP
client with the project's codec against a real 3-node cluster (no credentials unless the test
says so): forged broker RPCs to the controller, a Fetch impersonating a follower, an
out-of-band transaction marker, AddPartitionsToTxn as a broker, and SASL with the wrong
secret. Every one must be refused with Kafka's error and change nothing.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import trio

from raftlog.client.connection import ClusterLogin, KafkaClientError, KafkaConnection
from raftlog.protocol import codec
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import (
    ALLOCATE_PRODUCER_IDS,
    ALTER_PARTITION,
    BROKER_HEARTBEAT,
    BROKER_REGISTRATION,
    CREATE_TOPICS,
    ENVELOPE,
    FETCH,
    LIST_OFFSETS,
    METADATA,
    OFFSET_FOR_LEADER_EPOCH,
)
from raftlog.protocol.schemas_txn import ADD_PARTITIONS_TO_TXN, WRITE_TXN_MARKERS
from raftlog.security.session import ADMIN_USER, ClusterCredentials, broker_user
from raftlog.tools.cluster import SECRET_FILE
from tests.integration.cluster_harness import Cluster, cluster3, run, wait_until
from tests.integration.helpers import unique_topic
from tests.integration.test_cluster_failover import create_topic

__all__ = ["cluster3"]

confluent_kafka = pytest.importorskip("confluent_kafka")
DENIED = ErrorCode.CLUSTER_AUTHORIZATION_FAILED


async def _anonymous(address: tuple[str, int]) -> KafkaConnection:
    return await KafkaConnection.connect(*address, client_id="stranger")


def _secret(cluster: Cluster) -> str:
    return (cluster.directory / SECRET_FILE).read_text().strip()


def _brokers(cluster: Cluster) -> dict[int, Any]:
    return {b.node_id: b for b in cluster.metadata().brokers}


def _controller(cluster: Cluster) -> int:
    leader = cluster.quorum_leader()
    assert leader is not None
    return leader


def test_forged_controller_rpcs_are_refused_and_change_nothing(cluster3: Cluster) -> None:
    controller = cluster3.nodes[_controller(cluster3)]
    victim = next(n for n in cluster3.nodes if n != controller.node_id)
    topic = unique_topic("forged")
    before = _brokers(cluster3)

    async def attack() -> list[tuple[str, int]]:
        codes: list[tuple[str, int]] = []
        async with await _anonymous(controller.address) as conn:
            for epoch in range(0, 40):  # the attacker guessed the epoch by trying them all
                for fence, shut in ((True, False), (False, True)):
                    beat = await conn.request(BROKER_HEARTBEAT, {
                        "broker_id": victim, "broker_epoch": epoch,
                        "current_metadata_offset": 1 << 40, "want_fence": fence,
                        "want_shut_down": shut}, version=0)
                    codes.append(("BrokerHeartbeat", beat.error_code))
            for broker_id in (99, victim):
                registration = await conn.request(BROKER_REGISTRATION, {
                    "broker_id": broker_id, "cluster_id": "whatever",
                    "incarnation_id": uuid.uuid4(), "listeners": [{
                        "name": "PLAINTEXT", "host": "127.0.0.1", "port": 1,
                        "security_protocol": 0}],
                    "features": [], "rack": None}, version=0)
                codes.append(("BrokerRegistration", registration.error_code))
            for _ in range(5):
                block = await conn.request(ALLOCATE_PRODUCER_IDS, {
                    "broker_id": victim, "broker_epoch": 0}, version=0)
                codes.append(("AllocateProducerIds", block.error_code))
            alter = await conn.request(ALTER_PARTITION, {
                "broker_id": victim, "broker_epoch": 0, "topics": []}, version=1)
            codes.append(("AlterPartition", alter.error_code))
            envelope = await conn.request(ENVELOPE, {
                "request_data": _create_topics_frame(topic), "request_principal": None,
                "client_host_address": bytes([10, 0, 0, 1])}, version=0)
            codes.append(("Envelope", envelope.error_code))
        return codes

    codes = run(attack(), timeout_s=60)
    assert all(code == DENIED for _, code in codes), codes
    after = _brokers(cluster3)
    assert set(after) == set(before), "a rogue broker registered"
    assert topic not in {t.name for t in cluster3.metadata(topic).topics if t.error_code == 0}
    # The victim still leads: produce to a new RF-3 topic on every partition works.
    create_topic(cluster3, topic + "-check", 3)
    _produce_acks_all(cluster3.bootstrap, topic + "-check", 30)
    assert "refused BrokerHeartbeat from 127.0.0.1:" in controller.log_path.read_text()


def _create_topics_frame(topic: str) -> bytes:
    header = codec.RequestHeader(CREATE_TOPICS.key, 4, 7, "spoofed")
    body = {"topics": [{"name": topic, "num_partitions": 1, "replication_factor": 1,
                        "assignments": [], "configs": []}],
            "timeout_ms": 5000, "validate_only": False}
    return bytes(codec.encode_request_header(header, True)) + codec.encode_bytes(
        CREATE_TOPICS, 4, body, is_request=True)


def _produce_acks_all(bootstrap: str, topic: str, count: int) -> list[Any]:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                         "enable.idempotence": True})
    acked: list[Any] = []

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        acked.append((message.partition(), message.offset(), message.value()))

    for i in range(count):
        producer.produce(topic, value=f"v{i}".encode(), partition=i % 3 if count > 3 else 0,
                         on_delivery=delivered)
    assert producer.flush(60) == 0
    return acked


def test_fetch_as_a_follower_is_refused_and_never_moves_the_high_watermark(
        cluster3: Cluster) -> None:
    topic = unique_topic("impersonate")
    create_topic(cluster3, topic, 1)
    partition = cluster3.partition(topic)
    leader = cluster3.nodes[partition.leader_id]
    follower = next(r for r in partition.replica_nodes if r != partition.leader_id)
    cluster3.nodes[follower].pause()  # the follower the attacker impersonates
    try:
        producer = confluent_kafka.Producer({"bootstrap.servers": cluster3.live_bootstrap(),
                                             "acks": "all", "message.timeout.ms": 120000})
        for i in range(100):
            producer.produce(topic, value=f"r{i}".encode(), partition=0)
        producer.poll(0)

        async def impersonate() -> list[int]:
            codes = []
            async with await _anonymous(leader.address) as conn:
                for _ in range(20):
                    ends = await conn.request(LIST_OFFSETS, {
                        "replica_id": -2, "isolation_level": 0, "topics": [{
                            "name": topic, "partitions": [{
                                "partition_index": 0, "current_leader_epoch": -1,
                                "timestamp": -1}]}]}, version=4)
                    end = ends.topics[0].partitions[0].offset
                    fetched = await conn.request(FETCH, _replica_fetch(topic, follower, end),
                                                 version=11)
                    codes.append(fetched.responses[0].partitions[0].error_code)
                    epochs = await conn.request(OFFSET_FOR_LEADER_EPOCH, {
                        "replica_id": follower, "topics": [{"topic": topic, "partitions": [{
                            "partition": 0, "current_leader_epoch": -1,
                            "leader_epoch": 0}]}]}, version=3)
                    codes.append(epochs.topics[0].partitions[0].error_code)
                    await trio.sleep(0.05)
            return codes

        codes = run(impersonate(), timeout_s=60)
        assert set(codes) <= {ErrorCode.TOPIC_AUTHORIZATION_FAILED, DENIED}, codes
        assert producer.flush(120) == 0  # acknowledged only once the ISR really has them
    finally:
        cluster3.nodes[follower].resume()
    # The acknowledged records survive the loss of the leader.
    leader.kill()
    wait_until(lambda: _leader_of(cluster3, topic) not in (None, leader.node_id), 30,
               "a new leader")
    values = _read_all(cluster3.live_bootstrap(), topic, 100)
    assert values == [f"r{i}".encode() for i in range(100)]


def _replica_fetch(topic: str, replica_id: int, offset: int) -> dict[str, Any]:
    return {"replica_id": replica_id, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [{
                "partition": 0, "current_leader_epoch": -1, "fetch_offset": offset,
                "log_start_offset": 0, "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": [], "rack_id": ""}


def _leader_of(cluster: Cluster, topic: str) -> int | None:
    try:
        leader = int(cluster.partition(topic).leader_id)
    except AssertionError:
        return None
    return None if leader < 0 else leader


def _read_all(bootstrap: str, topic: str, count: int) -> list[bytes]:
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": unique_topic("trust-read"),
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "isolation.level": "read_committed"})
    values: list[bytes] = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        for _ in range(600):  # up to ~60 s while the new leader settles
            message = consumer.poll(0.1)
            if message is not None and not message.error():
                values.append(message.value())
            if len(values) >= count:
                break
    finally:
        consumer.close()
    return values


def test_out_of_band_marker_and_broker_only_txn_calls_are_refused(cluster3: Cluster) -> None:
    topic = unique_topic("marker")
    create_topic(cluster3, topic, 1)
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster3.bootstrap,
                                         "transactional.id": unique_topic("victim")})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, value=f"c{i}".encode(), partition=0)
    producer.flush(30)
    leader = cluster3.nodes[cluster3.partition(topic).leader_id]

    async def attack() -> tuple[int, int, int]:
        async with await _anonymous(leader.address) as conn:
            markers = await conn.request(WRITE_TXN_MARKERS, {"markers": [{
                "producer_id": 0, "producer_epoch": 0, "transaction_result": False,
                "coordinator_epoch": 2**31 - 1,
                "topics": [{"name": topic, "partition_indexes": [0]}]}]}, version=1)
            verify = await conn.request(ADD_PARTITIONS_TO_TXN, {"transactions": [{
                "transactional_id": "x", "producer_id": 0, "producer_epoch": 0,
                "verify_only": True, "topics": [{"name": topic, "partitions": [0]}]}]},
                version=4)
            described = await conn.request(METADATA, {"topics": [],
                                                      "allow_auto_topic_creation": False})
            return (markers.markers[0].topics[0].partitions[0].error_code, verify.error_code,
                    len(described.brokers))

    marker_code, verify_code, brokers = run(attack())
    assert (marker_code, verify_code, brokers) == (DENIED, DENIED, 3)
    producer.commit_transaction(30)
    assert _read_all(cluster3.bootstrap, topic, 10) == [f"c{i}".encode() for i in range(10)]


def test_wrong_secret_is_refused_and_the_right_one_is_a_broker(cluster3: Cluster) -> None:
    node = cluster3.nodes[1]

    async def attempt(secret: str, user: str) -> None:
        login = ClusterLogin(ClusterCredentials(secret), user)
        async with await KafkaConnection.connect(*node.address, login=login) as conn:
            response = await conn.request(ALLOCATE_PRODUCER_IDS, {
                "broker_id": 1, "broker_epoch": -1}, version=0)
            assert response.error_code != DENIED, "an authenticated member is not refused"

    for user in (ADMIN_USER, broker_user(2), "someone"):
        with pytest.raises(KafkaClientError, match="SASL_AUTHENTICATION_FAILED"):
            run(attempt("not-the-secret", user))
    run(attempt(_secret(cluster3), ADMIN_USER))
    log_text = node.log_path.read_text()
    assert "authentication failed from 127.0.0.1:" in log_text


def test_every_node_reports_the_same_cluster_id(cluster3: Cluster) -> None:
    ids = {node_id: cluster3.metadata(node=node).cluster_id
           for node_id, node in cluster3.nodes.items()}
    assert len(set(ids.values())) == 1 and None not in ids.values(), ids


def test_a_broker_fetches_only_as_itself_at_its_registered_epoch(cluster3: Cluster) -> None:
    """KIP-903: an authenticated broker that claims another replica id, or a broker epoch its
    registration does not have, is refused; its real fetcher keeps replicating."""
    topic = unique_topic("epoch")
    create_topic(cluster3, topic, 1)
    partition = cluster3.partition(topic)
    leader = cluster3.nodes[partition.leader_id]
    follower, other = (r for r in partition.replica_nodes if r != partition.leader_id)
    credentials = ClusterCredentials(_secret(cluster3))

    async def fetch_as(user_id: int, epoch: int, replica_id: int) -> int:
        login = ClusterLogin(credentials, broker_user(user_id),
                             extensions=lambda: {"brokerepoch": str(epoch)})
        async with await KafkaConnection.connect(*leader.address, login=login) as conn:
            response = await conn.request(FETCH, _replica_fetch(topic, replica_id, 0),
                                          version=11)
            return int(response.responses[0].partitions[0].error_code)

    assert run(fetch_as(follower, 10**9, follower)) == ErrorCode.STALE_BROKER_EPOCH
    assert run(fetch_as(follower, -1, follower)) == ErrorCode.STALE_BROKER_EPOCH
    assert run(fetch_as(other, 10**9, follower)) == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    # The real followers were never disturbed: acks=all still completes.
    _produce_acks_all(cluster3.bootstrap, topic, 3)
    assert len(cluster3.partition(topic).isr_nodes) == 3
