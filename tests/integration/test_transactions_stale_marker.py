"""A late COMMIT marker from a replaced transaction coordinator must not end the producer's
next transaction.

Found by the Jepsen campaign (``txn`` under ``all`` faults, seed 1085, 2026-11-21): a
``precommitted-read``, a read_committed consumer saw a record of a transaction that had not
committed yet. The coordinator node had been SIGSTOPped while it was completing an older
transaction of the producer. When it woke up it still believed it owned
``__transaction_state`` and sent that transaction's COMMIT marker again. The partition leader
appended it after the first record of the producer's *next* transaction, which ended that
transaction in the partition and moved the last stable offset past its record.

Kafka refuses such a marker (``ProducerStateManager.checkCoordinatorEpoch``): each producer
entry keeps the coordinator epoch of its last marker, and a marker from a lower epoch gets
TRANSACTION_COORDINATOR_FENCED. The test plays the woken-up coordinator with a raw
WriteTxnMarkers request one coordinator epoch behind the real one. Without the check the
marker is accepted and the open transaction's record becomes visible to read_committed.
"""

from __future__ import annotations

import pytest
import trio

from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas_txn import DESCRIBE_PRODUCERS, WRITE_TXN_MARKERS
from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import (
    _connect,
    connect_admin,
    create_topic,
    unique_topic,
    wait_until,
)
from tests.integration.test_transactions import _list_latest

confluent_kafka = pytest.importorskip("confluent_kafka")


def _producer_entry(bootstrap: str, topic: str) -> tuple[int, int, int, int]:
    """(producer id, epoch, coordinator epoch, current txn start offset) of the one producer
    of partition 0, from DescribeProducers."""

    async def run() -> tuple[int, int, int, int]:
        connection = await _connect(bootstrap)
        try:
            response = await connection.request(DESCRIBE_PRODUCERS, {"topics": [
                {"name": topic, "partition_indexes": [0]}]})
        finally:
            await connection.aclose()
        (entry,) = response.topics[0].partitions[0].active_producers
        return (entry.producer_id, entry.producer_epoch, entry.coordinator_epoch,
                entry.current_txn_start_offset)

    return trio.run(run)


def _write_commit_marker(bootstrap: str, topic: str, producer_id: int, epoch: int,
                         coordinator_epoch: int) -> int:
    async def run() -> int:
        connection = await connect_admin(bootstrap)  # markers are a cluster action
        try:
            response = await connection.request(WRITE_TXN_MARKERS, {"markers": [{
                "producer_id": producer_id, "producer_epoch": epoch,
                "transaction_result": True, "coordinator_epoch": coordinator_epoch,
                "topics": [{"name": topic, "partition_indexes": [0]}]}]}, version=1)
        finally:
            await connection.aclose()
        return int(response.markers[0].topics[0].partitions[0].error_code)

    return trio.run(run)


def _read_committed_values(bootstrap: str, topic: str, end_offset: int) -> list[bytes]:
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": unique_topic("stale-marker"),
        "isolation.level": "read_committed", "enable.auto.commit": False,
        "enable.partition.eof": True})
    values: list[bytes] = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        for _ in range(100):
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error():
                if message.error().code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    break
                raise AssertionError(message.error())
            values.append(message.value())
            if message.offset() + 1 >= end_offset:
                break
    finally:
        consumer.close()
    return values


def test_a_stale_coordinators_marker_cannot_commit_the_next_transaction(
        broker: BrokerProcess) -> None:
    topic = unique_topic("txn-stale-marker")
    create_topic(broker.bootstrap, topic)
    producer = confluent_kafka.Producer({
        "bootstrap.servers": broker.bootstrap, "transactional.id": unique_topic("stale"),
        "linger.ms": 0})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"first", partition=0)
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"second", partition=0)
    producer.flush(30)

    producer_id, epoch, coordinator_epoch, txn_start = _producer_entry(broker.bootstrap, topic)
    assert txn_start == 2  # first, its COMMIT marker, then second: still open
    stable, end = _list_latest(broker.bootstrap, topic)
    assert (stable, end) == (2, 3)

    # The woken-up old coordinator's COMMIT for the first transaction, one epoch behind.
    code = _write_commit_marker(broker.bootstrap, topic, producer_id, epoch,
                                max(coordinator_epoch, 0) - 1)
    assert _list_latest(broker.bootstrap, topic) == (2, 3), "the open transaction was ended"
    assert _read_committed_values(broker.bootstrap, topic, 2) == [b"first"]
    assert code == ErrorCode.TRANSACTION_COORDINATOR_FENCED, ErrorCode(code).name

    # The real coordinator still commits it, and its marker is accepted.
    producer.commit_transaction(30)
    # EndTxn answers once PrepareCommit is durable; the markers follow (as in Kafka).
    wait_until(lambda: _list_latest(broker.bootstrap, topic) == (4, 4), 30,
               "the COMMIT marker to move the last stable offset")
    assert _read_committed_values(broker.bootstrap, topic, 4) == [b"first", b"second"]
    assert coordinator_epoch >= 0, "the first COMMIT marker recorded its coordinator epoch"
    assert _producer_entry(broker.bootstrap, topic)[2] == coordinator_epoch
