"""Zombie fencing exactly as issue 4 states it, with confluent-kafka and with kafka-python:
producer A (transactional.id T) begins a transaction and sends to 3 partitions; producer B
initialises with the same T; A's next send or commit fails as fenced; a read_committed consumer
sees none of A's open records and all of B's committed ones (A's records are in the log: a
read_uncommitted consumer sees them). Also aiokafka's transactional producer (v0 APIs): a
committed transaction is visible to read_committed and an aborted one is not."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import create_topic, read_values_to_end, unique_topic

confluent_kafka = pytest.importorskip("confluent_kafka")

PARTITIONS = 3


def _wait_visible(bootstrap: str, topic: str, expected: set[bytes]) -> list[bytes]:
    """read_committed until ``expected`` is visible (the markers follow EndTxn)."""
    deadline = time.monotonic() + 30
    while True:
        values = read_values_to_end(bootstrap, topic, PARTITIONS, "read_committed")
        if expected <= set(values) or time.monotonic() > deadline:
            return values
        time.sleep(0.2)


def _check_views(bootstrap: str, topic: str, zombie: set[bytes], fresh: set[bytes]) -> None:
    committed = _wait_visible(bootstrap, topic, fresh)
    assert sorted(committed) == sorted(fresh), committed  # none of A's, all of B's, once
    everything = set(read_values_to_end(bootstrap, topic, PARTITIONS, "read_uncommitted"))
    assert zombie <= everything  # A's records were written: it is the marker that hides them


def test_confluent_zombie_is_fenced_across_three_partitions(broker: BrokerProcess) -> None:
    topic = unique_topic("fence-ck")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    config = {"bootstrap.servers": broker.bootstrap, "transactional.id": "fence-confluent",
              "transaction.timeout.ms": 60_000, "linger.ms": 5}
    a: Any = confluent_kafka.Producer(config)
    a.init_transactions(30)
    a.begin_transaction()
    zombie = {b"a-%d" % p for p in range(PARTITIONS)}
    for p in range(PARTITIONS):
        a.produce(topic, value=b"a-%d" % p, partition=p)
    assert a.flush(30) == 0  # A's records are in the log, its transaction open

    b: Any = confluent_kafka.Producer(config)
    b.init_transactions(30)  # fences A and aborts its transaction
    b.begin_transaction()
    fresh = {b"b-%d" % p for p in range(PARTITIONS)}
    for p in range(PARTITIONS):
        b.produce(topic, value=b"b-%d" % p, partition=p)
    b.commit_transaction(30)

    with pytest.raises(confluent_kafka.KafkaException) as info:
        a.produce(topic, value=b"a-late", partition=0)
        a.commit_transaction(10)
    error = info.value.args[0]
    assert error.fatal() and error.code() in (
        confluent_kafka.KafkaError._FENCED, confluent_kafka.KafkaError.PRODUCER_FENCED,
        confluent_kafka.KafkaError.INVALID_PRODUCER_EPOCH), error
    _check_views(broker.bootstrap, topic, zombie, fresh)


def test_kafka_python_zombie_is_fenced_across_three_partitions(broker: BrokerProcess) -> None:
    kafka = pytest.importorskip("kafka")
    from kafka.errors import KafkaError

    topic = unique_topic("fence-kp")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    a = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="fence-kp")
    b = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="fence-kp")
    try:
        a.init_transactions()
        a.begin_transaction()
        zombie = {b"a-%d" % p for p in range(PARTITIONS)}
        for p in range(PARTITIONS):
            a.send(topic, b"a-%d" % p, partition=p)
        a.flush(30)

        b.init_transactions()
        b.begin_transaction()
        fresh = {b"b-%d" % p for p in range(PARTITIONS)}
        for p in range(PARTITIONS):
            b.send(topic, b"b-%d" % p, partition=p)
        b.commit_transaction()

        with pytest.raises(KafkaError) as info:
            a.send(topic, b"a-late", partition=0).get(10)
            a.commit_transaction()
        name = type(info.value).__name__
        assert name in ("ProducerFencedError", "InvalidProducerEpochError"), repr(info.value)
    finally:
        a.close(5)
        b.close(5)
    _check_views(broker.bootstrap, topic, zombie, fresh)


def test_aiokafka_commits_and_aborts(broker: BrokerProcess) -> None:
    aiokafka = pytest.importorskip("aiokafka")
    topic = unique_topic("txn-aiokafka")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)

    async def run() -> None:
        producer = aiokafka.AIOKafkaProducer(bootstrap_servers=broker.bootstrap,
                                             transactional_id="txn-aiokafka-visibility")
        await producer.start()
        try:
            async with producer.transaction():
                for p in range(PARTITIONS):
                    await producer.send_and_wait(topic, b"kept-%d" % p, partition=p)
            await producer.begin_transaction()
            for p in range(PARTITIONS):
                await producer.send_and_wait(topic, b"dropped-%d" % p, partition=p)
            await producer.abort_transaction()
        finally:
            await producer.stop()

    asyncio.run(run())
    _check_views(broker.bootstrap, topic, {b"dropped-%d" % p for p in range(PARTITIONS)},
                 {b"kept-%d" % p for p in range(PARTITIONS)})
