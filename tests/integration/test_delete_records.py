"""DeleteRecords (21) with real clients: confluent-kafka ``AdminClient.delete_records`` and
kafka-python ``KafkaAdminClient.delete_records``.

One node: the low watermark answered, ListOffsets earliest, a Fetch below the new start
(OFFSET_OUT_OF_RANGE, and a consumer's auto.offset.reset), segments below it deleted, the start
kept across a restart. Three nodes, RF 3: the answer comes only once every live replica's log
start offset reached the offset (each node's ``log-start-offset`` checkpoint already says so
when the answer arrives); a paused, not yet fenced follower makes it REQUEST_TIMED_OUT (Kafka
waits for every *live* replica, in the ISR or not: ``Partition.lowWatermarkIfLeader``), a
fenced one no longer counts; a new leader serves the new earliest offset.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from raftlog.protocol.errors import ErrorCode
from tests.integration.cluster_harness import Cluster, cluster3, wait_until
from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import (
    broker_log_problems,
    create_topic,
    fetch_error,
    list_offsets,
    start_broker,
    unique_topic,
)

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

from confluent_kafka.admin import AdminClient  # noqa: E402

__all__ = ["cluster3"]  # the fixture, imported for pytest

TIMEOUT_S = 30.0
EARLIEST = -2
# Small segments, so the records below a DeleteRecords offset span several of them.
SEGMENT_BYTES = "300"
RECORDS = 20
# Below the 1.25 s a paused node needs at least to be fenced, far above a live round.
SHORT_TIMEOUT_S = 0.6


def _produce(bootstrap: str, topic: str, count: int) -> None:
    """``count`` records, one batch each (a flush after every one)."""
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                         "linger.ms": 0, "log_level": 2})
    for i in range(count):
        producer.produce(topic, value=b"v%d" % i, partition=0)
        assert producer.flush(TIMEOUT_S) == 0


def _confluent_delete(admin: Any, topic: str, offset: int, operation_timeout_s: float
                      ) -> int:
    """confluent-kafka delete_records; returns the low watermark (raises KafkaException)."""
    partition = confluent_kafka.TopicPartition(topic, 0, offset)
    futures = admin.delete_records([partition], request_timeout=TIMEOUT_S,
                                   operation_timeout=operation_timeout_s)
    (future,) = futures.values()
    low_watermark: int = future.result(timeout=TIMEOUT_S).low_watermark
    return low_watermark


def _first_consumed_offset(bootstrap: str, topic: str, start_offset: int) -> int:
    """The offset of the first record a consumer assigned at ``start_offset`` gets, with
    auto.offset.reset=earliest."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": unique_topic("dr"), "log_level": 2,
        "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, start_offset)])
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                offset: int = message.offset()
                return offset
        raise AssertionError("no record consumed")
    finally:
        consumer.close()


def _segment_bases(partition_dir: Path) -> list[int]:
    return sorted(int(path.name.split(".")[0]) for path in partition_dir.glob("*.log"))


def _checkpointed_start(partition_dir: Path) -> int:
    return int((partition_dir / "log-start-offset").read_text().split()[1])


def test_delete_records_on_one_node(broker: BrokerProcess) -> None:
    topic = unique_topic("delete-records")
    create_topic(broker.bootstrap, topic, 1, {"segment.bytes": SEGMENT_BYTES})
    _produce(broker.bootstrap, topic, RECORDS)
    partition_dir = broker.data_dir / f"{topic}-0"
    assert len(_segment_bases(partition_dir)) > 3

    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 2})
    assert _confluent_delete(admin, topic, 7, 10.0) == 7
    assert list_offsets(broker.bootstrap, topic, [0], EARLIEST) == {0: 7}
    assert fetch_error(broker.bootstrap, topic, 0, 6) == ErrorCode.OFFSET_OUT_OF_RANGE
    assert fetch_error(broker.bootstrap, topic, 0, 7) == ErrorCode.NONE
    bases = _segment_bases(partition_dir)
    assert bases[0] <= 7 < bases[1], f"only segments wholly below 7 go: {bases}"
    assert _first_consumed_offset(broker.bootstrap, topic, 0) == 7, "auto.offset.reset"
    assert _confluent_delete(admin, topic, 3, 10.0) == 7, "never moves back"

    client = kafka.KafkaAdminClient(bootstrap_servers=broker.bootstrap,
                                    request_timeout_ms=int(TIMEOUT_S * 1000))
    try:
        tp = kafka.TopicPartition(topic, 0)
        answer = client.delete_records({tp: 13}, timeout_ms=10_000)
        assert answer[tp]["low_watermark"] == 13 and answer[tp]["error_code"] == 0
        with pytest.raises(kafka.errors.OffsetOutOfRangeError):
            client.delete_records({tp: RECORDS + 5}, timeout_ms=10_000)
        with pytest.raises(kafka.errors.UnknownTopicOrPartitionError):
            client.delete_records({kafka.TopicPartition("no-such-topic", 0): 1},
                                  timeout_ms=5_000)
        compacted = unique_topic("delete-records-compact")
        create_topic(broker.bootstrap, compacted, 1, {"cleanup.policy": "compact"})
        with pytest.raises(kafka.errors.PolicyViolationError):  # as Kafka: "delete" only
            client.delete_records({kafka.TopicPartition(compacted, 0): 0}, timeout_ms=5_000)
    finally:
        client.close()
    assert _first_consumed_offset(broker.bootstrap, topic, 13) == 13

    broker.stop()
    start_broker(broker)
    assert _checkpointed_start(partition_dir) == 13
    assert list_offsets(broker.bootstrap, topic, [0], EARLIEST) == {0: 13}
    assert fetch_error(broker.bootstrap, topic, 0, 12) == ErrorCode.OFFSET_OUT_OF_RANGE
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 2})
    assert _confluent_delete(admin, topic, -1, 10.0) == RECORDS, "-1: the high watermark"
    assert broker_log_problems(broker.log_path.read_text(errors="replace")) == []


def _create_rf3_topic(cluster: Cluster, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.live_bootstrap(), "log_level": 2})
    new_topic = confluent_kafka.admin.NewTopic(topic, 1, 3,
                                               config={"segment.bytes": SEGMENT_BYTES})
    admin.create_topics([new_topic], request_timeout=15)[topic].result(timeout=TIMEOUT_S)
    wait_until(lambda: all(p.leader_id >= 0 and len(p.isr_nodes) == 3
                           for p in cluster.metadata(topic).topics[0].partitions),
               TIMEOUT_S, f"{topic} to have a leader and a full ISR")


def test_delete_records_waits_for_every_live_replica(cluster3: Cluster) -> None:
    topic = unique_topic("delete-records-rf3")
    _create_rf3_topic(cluster3, topic)
    _produce(cluster3.live_bootstrap(), topic, RECORDS)
    leader_id = cluster3.partition(topic).leader_id
    dirs = {node_id: node.directory / "data" / f"{topic}-0"
            for node_id, node in cluster3.nodes.items()}

    admin = AdminClient({"bootstrap.servers": cluster3.live_bootstrap(), "log_level": 2})
    assert _confluent_delete(admin, topic, 8, 15.0) == 8
    # The answer came after every replica reported a log start >= 8, which each one
    # checkpoints before its next Fetch reports it: no waiting here.
    assert {n: _checkpointed_start(d) for n, d in dirs.items()} == {1: 8, 2: 8, 3: 8}
    for node_id, directory in dirs.items():
        assert _segment_bases(directory)[0] > 0, f"node {node_id} kept its first segment"

    # With every follower running, a short operation timeout is plenty (the leader ends the
    # followers' long polls when its log start moves)...
    assert _confluent_delete(admin, topic, 10, SHORT_TIMEOUT_S) == 10
    # ... but a paused follower is still a live broker until its session expires (1.5 s,
    # heartbeats every 0.25 s): the leader waits for it and answers REQUEST_TIMED_OUT.
    follower = cluster3.nodes[next(n for n in dirs if n != leader_id)]
    follower.pause()
    with pytest.raises(confluent_kafka.KafkaException) as timed_out:
        _confluent_delete(admin, topic, 12, SHORT_TIMEOUT_S)
    assert timed_out.value.args[0].code() == confluent_kafka.KafkaError.REQUEST_TIMED_OUT
    assert _checkpointed_start(dirs[leader_id]) == 12, "the leader moved at once"
    # Once fenced it no longer counts (Kafka's hasAliveBroker).
    wait_until(lambda: follower.node_id not in cluster3.partition(topic).isr_nodes,
               TIMEOUT_S, "the paused follower to leave the ISR")
    assert _confluent_delete(admin, topic, 14, 15.0) == 14
    follower.resume()
    wait_until(lambda: _checkpointed_start(dirs[follower.node_id]) == 14, TIMEOUT_S,
               "the resumed follower to adopt the leader's log start")

    # A new leader serves the new earliest offset.
    cluster3.nodes[leader_id].stop()
    wait_until(lambda: cluster3.partition(topic).leader_id not in (-1, leader_id),
               TIMEOUT_S, "a new leader")
    wait_until(lambda: _earliest_or_none(cluster3, topic) == 14, TIMEOUT_S,
               "ListOffsets earliest from the new leader")


def _earliest_or_none(cluster: Cluster, topic: str) -> int | None:
    """ListOffsets earliest from the partition's leader (the helper asks one node only)."""
    try:
        leader = cluster.nodes[cluster.partition(topic).leader_id]
        return list_offsets(leader.bootstrap, topic, [0], EARLIEST)[0]
    except Exception:  # no leader yet, or it does not know it leads yet
        return None
