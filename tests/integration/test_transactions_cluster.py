"""Transactions on a real 3-node cluster: the coordinator's state survives a SIGKILL of the
node leading the transactional id's ``__transaction_state`` partition (the new leader rebuilds
it from the replicated log), and markers reach partition leaders on other nodes through
WriteTxnMarkers."""

from __future__ import annotations

import time
from typing import Any

import pytest

from raftlog.protocol.internal_topics import coordinator_partition
from raftlog.txn.coordinator_service import TXN_TOPIC, TxnSettings
from tests.integration.cluster_harness import Cluster, cluster3, wait_for, wait_until
from tests.integration.helpers import unique_topic
from tests.integration.test_cluster_failover import create_topic

__all__ = ["cluster3"]

confluent_kafka = pytest.importorskip("confluent_kafka")


def _consume(bootstrap: str, topic: str, partitions: int, expect: int,
             timeout_s: float = 40.0) -> list[bytes]:
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": "txn-cluster-assign-only",
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "isolation.level": "read_committed"})
    out: list[bytes] = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + timeout_s
        idle_since = time.monotonic()
        while time.monotonic() < deadline:
            messages = consumer.consume(num_messages=1000, timeout=0.3)
            for message in messages:
                if message.error() is None:
                    out.append(message.value())
            if messages:
                idle_since = time.monotonic()
            if len(out) >= expect and time.monotonic() - idle_since > 3:
                break
    finally:
        consumer.close()
    return out


def test_coordinator_failover_keeps_the_transaction(cluster3: Cluster) -> None:
    topic = unique_topic("txn-failover")
    create_topic(cluster3, topic, 3)
    txn_id = "txn-failover-id"
    producer: Any = confluent_kafka.Producer({
        "bootstrap.servers": cluster3.bootstrap, "transactional.id": txn_id,
        "transaction.timeout.ms": 60000, "log_level": 2})
    producer.init_transactions(60)
    producer.begin_transaction()
    for i in range(30):
        producer.produce(topic, value=b"one-%d" % i, partition=i % 3)
    producer.commit_transaction(60)

    index = coordinator_partition(txn_id, TxnSettings().num_partitions)
    wait_until(lambda: len(cluster3.partition(TXN_TOPIC, index).isr_nodes) == 3, 30,
               "the coordinator partition's full ISR")
    coordinator = cluster3.partition(TXN_TOPIC, index).leader_id
    producer.begin_transaction()
    for i in range(30):
        producer.produce(topic, value=b"two-%d" % i, partition=i % 3)
    producer.flush(30)
    cluster3.nodes[coordinator].kill()
    wait_for(lambda: cluster3.partition(TXN_TOPIC, index).leader_id
             not in (-1, coordinator) or None, 20, "a new transaction coordinator")
    producer.commit_transaction(60)

    producer.begin_transaction()
    for i in range(30):
        producer.produce(topic, value=b"three-%d" % i, partition=i % 3)
    producer.abort_transaction(60)

    values = _consume(cluster3.live_bootstrap(), topic, 3, 60)
    assert sorted(values) == sorted([b"one-%d" % i for i in range(30)]
                                    + [b"two-%d" % i for i in range(30)])
