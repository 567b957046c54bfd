"""Offsets in transactions on one node: AddOffsetsToTxn + TxnOffsetCommit with confluent-kafka,
kafka-python and aiokafka (v0 APIs); staged offsets are invisible to OffsetFetch and answered
UNSTABLE_OFFSET_COMMIT with require_stable until the COMMIT marker, dropped on ABORT, and
rebuilt from the offsets log after a restart."""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio

from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas_group import OFFSET_FETCH
from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import _connect, create_topic, unique_topic

confluent_kafka = pytest.importorskip("confluent_kafka")


def _producer(bootstrap: str, txn_id: str, **extra: Any) -> Any:
    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "transactional.id": txn_id,
        "transaction.timeout.ms": 60000, "linger.ms": 5, **extra})
    producer.init_transactions(30)
    return producer


def _offset_fetch(bootstrap: str, group: str, topic: str, partitions: int, version: int,
                  require_stable: bool) -> dict[int, tuple[int, int]]:
    """partition → (committed offset, error code), waiting out the coordinator's startup."""

    async def run() -> dict[int, tuple[int, int]]:
        connection = await _connect(bootstrap)
        try:
            for _ in range(150):
                response = await connection.request(OFFSET_FETCH, {
                    "group_id": group,
                    "topics": [{"name": topic, "partition_indexes": list(range(partitions))}],
                    "require_stable": require_stable}, version=version)
                if response.error_code not in (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                               ErrorCode.NOT_COORDINATOR,
                                               ErrorCode.COORDINATOR_NOT_AVAILABLE):
                    break
                await trio.sleep(0.1)
            assert response.error_code == 0, response
            return {p.partition_index: (p.committed_offset, p.error_code)
                    for t in response.topics for p in t.partitions}
        finally:
            await connection.aclose()

    return trio.run(run)


def _ensure_group_coordinator(bootstrap: str, group: str) -> None:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        consumer.committed([confluent_kafka.TopicPartition("__none__", 0)], timeout=30)
    except confluent_kafka.KafkaException:
        pass
    finally:
        consumer.close()


def _group_metadata(bootstrap: str, group: str) -> Any:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return consumer.consumer_group_metadata()
    finally:
        consumer.close()


def _eventually_stable(
    bootstrap: str, group: str, topic: str, partitions: int = 2
) -> dict[int, tuple[int, int]]:
    deadline = time.monotonic() + 15
    while True:
        offsets = _offset_fetch(bootstrap, group, topic, partitions, 7, True)
        unstable = any(code == ErrorCode.UNSTABLE_OFFSET_COMMIT for _, code in offsets.values())
        if not unstable or time.monotonic() > deadline:
            return offsets
        time.sleep(0.05)


def test_confluent_offsets_commit_abort_and_require_stable(broker: BrokerProcess) -> None:
    topic = unique_topic("txo-in")
    out = unique_topic("txo-out")
    create_topic(broker.bootstrap, topic, partitions=2)
    create_topic(broker.bootstrap, out)
    group = unique_topic("txo-group")
    _ensure_group_coordinator(broker.bootstrap, group)
    producer = _producer(broker.bootstrap, "txo-confluent")
    metadata = _group_metadata(broker.bootstrap, group)
    tp = confluent_kafka.TopicPartition

    producer.begin_transaction()
    producer.produce(out, value=b"x", partition=0)
    producer.send_offsets_to_transaction([tp(topic, 0, 7), tp(topic, 1, 3)], metadata, 30)
    # Staged, not committed: invisible, and UNSTABLE_OFFSET_COMMIT with require_stable.
    assert _offset_fetch(broker.bootstrap, group, topic, 2, 6, False) == \
        {0: (-1, 0), 1: (-1, 0)}
    assert _offset_fetch(broker.bootstrap, group, topic, 2, 7, True) == {
        0: (-1, ErrorCode.UNSTABLE_OFFSET_COMMIT), 1: (-1, ErrorCode.UNSTABLE_OFFSET_COMMIT)}
    producer.commit_transaction(30)
    # EndTxn answers once PrepareCommit is durable; the markers follow, and until they land
    # require_stable answers UNSTABLE_OFFSET_COMMIT (clients retry), so poll.
    assert _eventually_stable(broker.bootstrap, group, topic) == {0: (7, 0), 1: (3, 0)}

    producer.begin_transaction()
    producer.produce(out, value=b"y", partition=0)
    producer.send_offsets_to_transaction([tp(topic, 0, 100)], metadata, 30)
    producer.abort_transaction(30)
    assert _eventually_stable(broker.bootstrap, group, topic) == {0: (7, 0), 1: (3, 0)}

    # An open transaction's offsets survive a restart as pending, and its commit lands.
    producer.begin_transaction()
    producer.produce(out, value=b"z", partition=0)
    producer.send_offsets_to_transaction([tp(topic, 1, 9)], metadata, 30)
    producer.commit_transaction(30)
    producer.flush(10)
    broker.restart()
    assert _eventually_stable(broker.bootstrap, group, topic) == {0: (7, 0), 1: (9, 0)}


def test_kafka_python_send_offsets_commit_and_abort(broker: BrokerProcess) -> None:
    kafka = pytest.importorskip("kafka")
    from kafka.structs import OffsetAndMetadata, TopicPartition

    topic = unique_topic("txo-kp-in")
    out = unique_topic("txo-kp-out")
    create_topic(broker.bootstrap, topic)
    create_topic(broker.bootstrap, out)
    group = unique_topic("txo-kp-group")
    _ensure_group_coordinator(broker.bootstrap, group)
    producer = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap,
                                   transactional_id="txo-kafka-python")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(out, b"kp-1", partition=0)
        producer.send_offsets_to_transaction(
            {TopicPartition(topic, 0): OffsetAndMetadata(11, "", -1)}, group)
        producer.commit_transaction()
        assert _eventually_stable(broker.bootstrap, group, topic, 1) == {0: (11, 0)}
        producer.begin_transaction()
        producer.send(out, b"kp-2", partition=0)
        producer.send_offsets_to_transaction(
            {TopicPartition(topic, 0): OffsetAndMetadata(99, "", -1)}, group)
        producer.abort_transaction()
        assert _eventually_stable(broker.bootstrap, group, topic, 1) == {0: (11, 0)}
    finally:
        producer.close(5)


def test_aiokafka_send_offsets_commit_and_abort(broker: BrokerProcess) -> None:
    aiokafka = pytest.importorskip("aiokafka")
    import asyncio

    from aiokafka.structs import TopicPartition

    topic = unique_topic("txo-aio-in")
    out = unique_topic("txo-aio-out")
    create_topic(broker.bootstrap, topic)
    create_topic(broker.bootstrap, out)
    group = unique_topic("txo-aio-group")
    _ensure_group_coordinator(broker.bootstrap, group)

    async def run() -> None:
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=broker.bootstrap,
                                             transactional_id="txo-aiokafka")
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send_and_wait(out, b"aio-1", partition=0)
                await producer.send_offsets_to_transaction({TopicPartition(topic, 0): 21},
                                                           group)
            await producer.begin_transaction()
            await producer.send_and_wait(out, b"aio-2", partition=0)
            await producer.send_offsets_to_transaction({TopicPartition(topic, 0): 77}, group)
            await producer.abort_transaction()
        finally:
            await producer.stop()

    asyncio.run(run())
    deadline = time.monotonic() + 10
    while _offset_fetch(broker.bootstrap, group, topic, 1, 7, True) != {0: (21, 0)}:
        assert time.monotonic() < deadline, _offset_fetch(broker.bootstrap, group, topic, 1, 7,
                                                          True)
        time.sleep(0.2)
