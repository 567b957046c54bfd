"""Acceptance: the three Python Kafka clients from PyPI against a real broker process.

Each test creates a 3-partition topic with the client's own admin API, produces 10,000 keyed
records with acks=all (idempotence off: the broker has no InitProducerId), consumes them back
with ``assign`` (no consumer groups yet) and checks exactly-once delivery, per-partition
produce order, offsets 0..n-1 and key -> partition placement.
"""

from __future__ import annotations

import asyncio
import time

from raftlog.tools.console import partition_for_key
from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import (
    ConsumedRecord,
    assert_exactly_once_in_order,
    assert_key_partition_consistent,
    confluent_consume,
    create_topic,
    end_offsets,
    fetch_records,
    unique_topic,
)

RECORDS = 10_000
PARTITIONS = 3
DISTINCT_KEYS = 257
TIMEOUT_S = 30.0


def keyed_records() -> list[tuple[bytes, bytes]]:
    """(key, value) pairs: keys repeat (so placement consistency is tested), values unique."""
    return [(b"key-%d" % (i % DISTINCT_KEYS), b"value-%06d" % i) for i in range(RECORDS)]


def check_placement_is_kafka_default(produced: list[tuple[int, bytes, bytes]]) -> None:
    """Kafka's default partitioner: murmur2(key) mod partitions."""
    wrong = [(key, partition) for partition, key, _ in produced
             if partition != partition_for_key(key, PARTITIONS)]
    assert not wrong, f"{len(wrong)} records off their murmur2 partition, e.g. {wrong[:3]}"


def check_ends(broker: BrokerProcess, topic: str, produced: list[tuple[int, bytes, bytes]]) -> None:
    counts = {p: sum(1 for q, _, _ in produced if q == p) for p in range(PARTITIONS)}
    assert end_offsets(broker.bootstrap, topic, range(PARTITIONS)) == counts


# -- confluent-kafka -----------------------------------------------------------------------------


def test_confluent_kafka_admin_produce_consume(broker: BrokerProcess) -> None:
    from confluent_kafka import KafkaError, Message, Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    topic = unique_topic("confluent")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.create_topics([NewTopic(topic, PARTITIONS, 1)], request_timeout=10)
    futures[topic].result(timeout=TIMEOUT_S)
    metadata = admin.list_topics(topic, timeout=10)
    assert sorted(metadata.topics[topic].partitions) == list(range(PARTITIONS))

    # murmur2_random is librdkafka's name for Kafka's default (Java) partitioner.
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all",
                         "enable.idempotence": False, "linger.ms": 5,
                         "partitioner": "murmur2_random"})
    acknowledged: dict[bytes, tuple[int, int]] = {}
    errors: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            errors.append(error)
            return
        value, partition, offset = message.value(), message.partition(), message.offset()
        assert value is not None and partition is not None and offset is not None
        acknowledged[value] = (partition, offset)

    records = keyed_records()
    deadline = time.monotonic() + TIMEOUT_S
    for key, value in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
                break
            except BufferError:
                assert time.monotonic() < deadline, "producer queue stayed full"
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(TIMEOUT_S) == 0, "records still in flight after flush"
    assert not errors, f"{len(errors)} delivery errors, first: {errors[0]}"
    assert len(acknowledged) == RECORDS

    produced = [(acknowledged[value][0], key, value) for key, value in records]
    assert_key_partition_consistent(produced)
    check_placement_is_kafka_default(produced)
    check_ends(broker, topic, produced)
    consumed = confluent_consume(broker.bootstrap, topic, range(PARTITIONS), TIMEOUT_S)
    assert_exactly_once_in_order(produced, consumed, acknowledged)


def test_confluent_kafka_default_partitioner_is_consistent(broker: BrokerProcess) -> None:
    """librdkafka's own default (consistent_random, CRC32): keys must still stick."""
    from confluent_kafka import KafkaError, Message, Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    topic = unique_topic("confluent-crc")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(timeout=TIMEOUT_S)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all",
                         "enable.idempotence": False, "linger.ms": 5})
    placed: dict[bytes, int] = {}
    failures: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        value, partition = message.value(), message.partition()
        if error is not None or value is None or partition is None:
            failures.append(error or KafkaError(KafkaError.UNKNOWN))
        else:
            placed[value] = partition

    records = keyed_records()[:2_000]
    for key, value in records:
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
    assert producer.flush(TIMEOUT_S) == 0
    assert not failures, failures[:3]
    produced = [(placed[value], key, value) for key, value in records]
    assert_key_partition_consistent(produced)
    consumed = confluent_consume(broker.bootstrap, topic, range(PARTITIONS), TIMEOUT_S)
    assert_exactly_once_in_order(produced, consumed)


# -- kafka-python ------------------------------------------------------------------------------


def test_kafka_python_admin_produce_consume(broker: BrokerProcess) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic

    topic = unique_topic("kafka-python")
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10_000)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])
        described = admin.describe_topics([topic])
        assert len(described[0]["partitions"]) == PARTITIONS
    finally:
        admin.close()

    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all",
                             enable_idempotence=False, linger_ms=5)
    records = keyed_records()
    try:
        futures = [(key, value, producer.send(topic, key=key, value=value))
                   for key, value in records]
        producer.flush(timeout=TIMEOUT_S)
        acknowledged: dict[bytes, tuple[int, int]] = {}
        for _key, value, future in futures:
            metadata = future.get(timeout=TIMEOUT_S)
            acknowledged[value] = (metadata.partition, metadata.offset)
    finally:
        producer.close(timeout=10)

    produced = [(acknowledged[value][0], key, value) for key, value in records]
    assert_key_partition_consistent(produced)
    check_placement_is_kafka_default(produced)
    check_ends(broker, topic, produced)

    ends = end_offsets(broker.bootstrap, topic, range(PARTITIONS))
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None,
                             enable_auto_commit=False, auto_offset_reset="earliest")
    consumed: list[ConsumedRecord] = []
    try:
        assignment = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(assignment)
        consumer.seek_to_beginning(*assignment)
        deadline = time.monotonic() + TIMEOUT_S
        while len(consumed) < sum(ends.values()):
            assert time.monotonic() < deadline, f"consumed {len(consumed)} of {ends}"
            for batch in consumer.poll(timeout_ms=500, max_records=5_000).values():
                consumed.extend(ConsumedRecord(m.partition, m.offset, m.key, m.value)
                                for m in batch)
        # Nothing beyond the end offsets turns up.
        assert not consumer.poll(timeout_ms=300)
    finally:
        consumer.close(autocommit=False)
    assert_exactly_once_in_order(produced, consumed, acknowledged)


# -- aiokafka ----------------------------------------------------------------------------------


async def _aiokafka_round_trip(bootstrap: str, topic: str,
                               records: list[tuple[bytes, bytes]],
                               ) -> tuple[dict[bytes, tuple[int, int]], list[ConsumedRecord]]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS,
                                            replication_factor=1)])
    finally:
        await admin.close()

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=False, linger_ms=5)
    await producer.start()
    acknowledged: dict[bytes, tuple[int, int]] = {}
    try:
        futures = [(value, await producer.send(topic, key=key, value=value))
                   for key, value in records]
        async with asyncio.timeout(TIMEOUT_S):
            for value, future in futures:
                metadata = await future
                acknowledged[value] = (metadata.partition, metadata.offset)
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    consumed: list[ConsumedRecord] = []
    try:
        assignment = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(assignment)
        await consumer.seek_to_beginning(*assignment)
        ends = await consumer.end_offsets(assignment)
        async with asyncio.timeout(TIMEOUT_S):
            while len(consumed) < sum(ends.values()):
                batches = await consumer.getmany(timeout_ms=500, max_records=5_000)
                for messages in batches.values():
                    consumed.extend(ConsumedRecord(m.partition, m.offset, m.key, m.value)
                                    for m in messages)
        assert not await consumer.getmany(timeout_ms=300)
    finally:
        await consumer.stop()
    return acknowledged, consumed


def test_aiokafka_admin_produce_consume(broker: BrokerProcess) -> None:
    topic = unique_topic("aiokafka")
    records = keyed_records()
    acknowledged, consumed = asyncio.run(_aiokafka_round_trip(broker.bootstrap, topic, records))
    assert len(acknowledged) == RECORDS
    produced = [(acknowledged[value][0], key, value) for key, value in records]
    assert_key_partition_consistent(produced)
    check_placement_is_kafka_default(produced)
    check_ends(broker, topic, produced)
    assert_exactly_once_in_order(produced, consumed, acknowledged)


# -- cross-client ------------------------------------------------------------------------------


def test_records_readable_across_clients(broker: BrokerProcess) -> None:
    """What kafka-python writes, confluent-kafka and the project's own client read alike."""
    from kafka import KafkaProducer

    topic = unique_topic("cross")
    create_topic(broker.bootstrap, topic, partitions=1)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all",
                             enable_idempotence=False, linger_ms=5)
    values = [b"cross-%04d" % i for i in range(500)]
    try:
        for value in values:
            producer.send(topic, value=value, partition=0,
                          headers=[("h", b"x"), ("empty", b"")])
        producer.flush(timeout=TIMEOUT_S)
    finally:
        producer.close(timeout=10)
    consumed = confluent_consume(broker.bootstrap, topic, [0], TIMEOUT_S)
    assert [r.value for r in consumed] == values
    raw = fetch_records(broker.bootstrap, topic, 0)
    assert [r.value for r in raw] == values
    assert [r.offset for r in raw] == list(range(len(values)))
    assert all(r.headers == (("h", b"x"), ("empty", b"")) for r in raw)
