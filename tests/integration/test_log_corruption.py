"""Bytes flipped at rest in a sealed segment, in a real 3-node cluster (RF 3): no consumer ever
receives the damaged record, and the replicas converge to the good copy.

(a) the partition leader is stopped, 8 bytes of a record's value in one of its sealed segments
are flipped, and it is restarted (it leads again once back in the ISR: preferred leader);
(b) the same on a follower, which then leads (the leader is stopped).

In both cases a default confluent-kafka consumer (check.crcs=false) reads every record with its
right value, and the replicas' logs end up byte-identical with every batch's CRC valid.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlog.partition.batch import check_batch
from tests.integration.cluster_harness import Cluster, running_cluster, wait_for, wait_until
from tests.integration.helpers import unique_topic
from tests.segment_bytes import stored_bytes

RECORDS = 1500
SEGMENT_BYTES = 16 * 1024
FLIPPED = 8
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("corruption") / "cluster") as cluster:
        yield cluster


def _value(index: int) -> bytes:
    return b"value-%06d-" % index + b"x" * 80


def _create_and_fill(cluster: Cluster, topic: str) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 2})
    admin.create_topics([NewTopic(topic, 1, 3, config={"segment.bytes": str(SEGMENT_BYTES)})],
                        request_timeout=15)[topic].result(timeout=30)
    wait_until(lambda: (p := cluster.partition(topic)).leader_id >= 0 and len(p.isr_nodes) == 3,
               TIMEOUT_S, f"{topic} to have a leader and a full ISR")
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "log_level": 2,
                         "linger.ms": 5, "batch.num.messages": 20})
    failures: list[object] = []
    for index in range(RECORDS):
        producer.produce(topic, value=_value(index),
                         on_delivery=lambda error, _msg: error and failures.append(error))
        producer.poll(0)
    assert producer.flush(60) == 0
    assert not failures, failures[:3]


def _partition_dir(cluster: Cluster, node_id: int, topic: str) -> Path:
    return cluster.nodes[node_id].directory / "data" / f"{topic}-0"


def _segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def _flip_value_bytes(directory: Path) -> int:
    """Flip 8 bytes inside a record's value near the start of the second sealed segment (the
    part a sealed segment's tail check on open does not read); returns the record index."""
    sealed = _segments(directory)[:-1]
    assert len(sealed) >= 3, f"want sealed segments, have {len(sealed)}"
    path = sealed[1]
    data = bytearray(path.read_bytes())
    position = data.index(b"value-", 200)
    index = int(data[position + 6:position + 12])
    for at in range(position + 13, position + 13 + FLIPPED):
        data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    return index


def _consume_all(cluster: Cluster, topic: str) -> list[bytes]:
    """Every record from offset 0 with a default consumer (check.crcs=false)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": cluster.live_bootstrap(),
                         "group.id": "corruption-check", "enable.auto.commit": False,
                         "log_level": 2, "topic.metadata.refresh.interval.ms": 1000})
    values: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + TIMEOUT_S
        while len(values) < RECORDS:
            assert time.monotonic() < deadline, f"consumed {len(values)} of {RECORDS}"
            for message in consumer.consume(num_messages=500, timeout=0.5):
                if message.error() is None:
                    values.append(message.value())
    finally:
        consumer.close()
    return values


def _log_bytes(cluster: Cluster, node_id: int, topic: str) -> bytes:
    return b"".join(stored_bytes(path.read_bytes())
                    for path in _segments(_partition_dir(cluster, node_id, topic)))


def _all_crcs_valid(data: bytes) -> bool:
    position = 0
    try:
        while position < len(data):
            position += check_batch(data, position).size_bytes
    except Exception:
        return False
    return True


def _replicas_converged(cluster: Cluster, topic: str) -> bool:
    logs = {node_id: _log_bytes(cluster, node_id, topic) for node_id in cluster.nodes}
    first = next(iter(logs.values()))
    return all(data == first for data in logs.values()) and _all_crcs_valid(first)


def _restart(cluster: Cluster, node_id: int) -> None:
    cluster.nodes[node_id].start()
    cluster.nodes[node_id].wait_listening()


def _check(cluster: Cluster, topic: str) -> None:
    values = _consume_all(cluster, topic)
    damaged = [v for v in values if v not in _expected(topic)]
    assert not damaged, f"a consumer received damaged records: {damaged[:2]}"
    assert values == [_value(i) for i in range(RECORDS)]
    wait_until(lambda: _replicas_converged(cluster, topic), TIMEOUT_S,
               "every replica's log to be identical to the good copy")


_EXPECTED: set[bytes] = set()


def _expected(_topic: str) -> set[bytes]:
    if not _EXPECTED:
        _EXPECTED.update(_value(i) for i in range(RECORDS))
    return _EXPECTED


def test_damaged_sealed_segment_on_the_leader_is_never_served(cluster: Cluster) -> None:
    topic = unique_topic("rot-leader")
    _create_and_fill(cluster, topic)
    before = cluster.partition(topic)
    leader = before.leader_id
    assert leader == before.replica_nodes[0], "the first replica leads a new partition"
    cluster.nodes[leader].stop()
    wait_until(lambda: cluster.partition(topic).leader_id not in (-1, leader), TIMEOUT_S,
               "another leader")
    _flip_value_bytes(_partition_dir(cluster, leader, topic))
    _restart(cluster, leader)
    # Back in the ISR, the preferred replica leads again (leader.imbalance.check: 5 s).
    wait_for(lambda: ((p := cluster.partition(topic)).leader_id == leader
                      and len(p.isr_nodes) == 3) or None, TIMEOUT_S,
             "the restarted node to lead again with a full ISR", interval_s=0.2)
    _check(cluster, topic)


def test_damaged_sealed_segment_on_a_follower_is_repaired_before_it_leads(
        cluster: Cluster) -> None:
    topic = unique_topic("rot-follower")
    _create_and_fill(cluster, topic)
    before = cluster.partition(topic)
    leader, follower = before.replica_nodes[0], before.replica_nodes[1]
    assert before.leader_id == leader
    cluster.nodes[follower].stop()
    wait_until(lambda: follower not in cluster.partition(topic).isr_nodes, TIMEOUT_S,
               "the stopped follower to leave the ISR")
    _flip_value_bytes(_partition_dir(cluster, follower, topic))
    _restart(cluster, follower)
    wait_until(lambda: len(cluster.partition(topic).isr_nodes) == 3, TIMEOUT_S,
               "the restarted follower to rejoin the ISR", interval_s=0.2)
    # The leader goes: the follower is next in preference order. Old code: it leads and
    # serves the damaged record. Now: it leads only once repaired, or resigns to the third
    # replica when elected while still holding the bad batch.
    cluster.nodes[leader].stop()
    wait_until(lambda: cluster.partition(topic).leader_id not in (-1, leader), TIMEOUT_S,
               "a new leader")
    values = _consume_all(cluster, topic)
    assert values == [_value(i) for i in range(RECORDS)], \
        [v for v in values if v not in _expected(topic)][:2]
    _restart(cluster, leader)
    wait_until(lambda: len(cluster.partition(topic).isr_nodes) == 3, TIMEOUT_S,
               "the stopped leader to rejoin the ISR", interval_s=0.2)
    _check(cluster, topic)
