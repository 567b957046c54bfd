"""Acceptance: compressed batches are stored and served exactly as the producer built them.

For gzip, snappy, lz4 and zstd: produce with a real client using the codec, consume the
values back with a client, and fetch the raw batches with the project's client to check the
stored batch still carries the producer's codec (attributes bits 0-2) and a valid CRC-32C,
i.e. the broker neither decompressed nor recompressed it.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from raftlog.partition.batch import check_batch
from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import (
    CODECS,
    ConsumedRecord,
    StoredBatch,
    confluent_consume,
    create_topic,
    decode_batches,
    fetch_raw,
    kafka_python_consume,
    produce_raw,
    unique_topic,
)

ALL_CODECS = ["gzip", "snappy", "lz4", "zstd"]
RECORDS = 2_000
TIMEOUT_S = 30.0


def compressible_values(codec: str) -> list[bytes]:
    return [(b"%s payload %d; " % (codec.encode(), i % 13)) * 10 + b"#%05d" % i
            for i in range(RECORDS)]


def check_stored(batches: list[StoredBatch], codec: str, values: list[bytes]) -> None:
    """Every stored batch: CRC-32C valid, the producer's codec; and it decodes to values."""
    assert batches, "nothing stored"
    for batch in batches:
        header = check_batch(batch.raw)
        assert header.compression_codec == CODECS[codec], (
            f"batch at offset {header.base_offset} stored with codec "
            f"{header.compression_codec}, produced with {codec} ({CODECS[codec]})")
    assert max(b.header.records_count for b in batches) > 1, "no batching: weak test"
    records = decode_batches(batches)
    assert [r.offset for r in records] == list(range(len(values)))
    assert [r.value for r in records] == values


def check_consumed(consumed: list[ConsumedRecord], values: list[bytes]) -> None:
    assert [r.offset for r in consumed] == list(range(len(values)))
    assert [r.value for r in consumed] == values


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_confluent_kafka_compressed(broker: BrokerProcess, codec: str) -> None:
    from confluent_kafka import Producer

    topic = unique_topic(f"confluent-{codec}")
    create_topic(broker.bootstrap, topic, 1)
    values = compressible_values(codec)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all",
                         "enable.idempotence": False, "linger.ms": 20,
                         "compression.type": codec})
    failures: list[str] = []
    for value in values:
        producer.produce(topic, value=value, partition=0,
                         on_delivery=lambda e, _m: failures.append(str(e)) if e else None)
        producer.poll(0)
    assert producer.flush(TIMEOUT_S) == 0
    assert not failures, failures[:3]

    # librdkafka silently sends uncompressed batches for a codec it thinks the broker lacks
    # (lz4: unless FindCoordinator is advertised), so only the raw check tells whether the
    # codec was really exercised.
    check_stored(fetch_raw(broker.bootstrap, topic, 0), codec, values)
    check_consumed(confluent_consume(broker.bootstrap, topic, [0], TIMEOUT_S), values)


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_kafka_python_compressed(broker: BrokerProcess, codec: str) -> None:
    from kafka import KafkaProducer

    topic = unique_topic(f"kafka-python-{codec}")
    create_topic(broker.bootstrap, topic, 1)
    values = compressible_values(codec)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all",
                             enable_idempotence=False, linger_ms=20, compression_type=codec)
    try:
        futures = [producer.send(topic, value=value, partition=0) for value in values]
        producer.flush(timeout=TIMEOUT_S)
        offsets = [f.get(timeout=TIMEOUT_S).offset for f in futures]
    finally:
        producer.close(timeout=10)
    assert offsets == list(range(RECORDS))

    check_stored(fetch_raw(broker.bootstrap, topic, 0), codec, values)
    check_consumed(kafka_python_consume(broker.bootstrap, topic, [0], TIMEOUT_S), values)


async def _aiokafka_produce_consume(bootstrap: str, topic: str, codec: str,
                                    values: list[bytes]) -> list[ConsumedRecord]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20,
                                compression_type=codec)
    await producer.start()
    try:
        futures = [await producer.send(topic, value=value, partition=0) for value in values]
        async with asyncio.timeout(TIMEOUT_S):
            await asyncio.gather(*futures)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    out: list[ConsumedRecord] = []
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        async with asyncio.timeout(TIMEOUT_S):
            while len(out) < len(values):
                for messages in (await consumer.getmany(timeout_ms=500)).values():
                    out.extend(ConsumedRecord(m.partition, m.offset, m.key, m.value)
                               for m in messages)
    finally:
        await consumer.stop()
    return out


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd"])
def test_aiokafka_compressed(broker: BrokerProcess, codec: str) -> None:
    topic = unique_topic(f"aiokafka-{codec}")
    create_topic(broker.bootstrap, topic, 1)
    values = compressible_values(codec)
    consumed = asyncio.run(_aiokafka_produce_consume(broker.bootstrap, topic, codec, values))
    check_stored(fetch_raw(broker.bootstrap, topic, 0), codec, values)
    check_consumed(consumed, values)


@pytest.mark.parametrize("codec", ["none", *ALL_CODECS])
def test_stored_batch_is_byte_identical_to_produced(broker: BrokerProcess, codec: str) -> None:
    """Batches built by kafka-python's record builder, sent through the project's client: the
    stored copy differs from the sent one only in baseOffset and partitionLeaderEpoch (the
    two header fields outside the CRC that the broker must assign)."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    topic = unique_topic(f"bytes-{codec}")
    create_topic(broker.bootstrap, topic, 1)
    now = int(time.time() * 1000)
    sent: list[bytes] = []
    for batch_index in range(3):
        builder = DefaultRecordBatchBuilder(
            magic=2, compression_type=CODECS[codec], is_transactional=False, producer_id=-1,
            producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
        for i in range(100):
            builder.append(i, now + i, b"k%d" % i,
                           b"batch %d record %d " % (batch_index, i) * 5, [("h", b"v")])
        sent.append(bytes(builder.build()))
    base_offsets = [produce_raw(broker.bootstrap, topic, 0, batch) for batch in sent]
    assert base_offsets == [0, 100, 200]

    stored = fetch_raw(broker.bootstrap, topic, 0)
    assert len(stored) == len(sent)
    for batch, original, base_offset in zip(stored, sent, base_offsets, strict=True):
        header = check_batch(batch.raw)
        assert header.base_offset == base_offset
        assert header.compression_codec == CODECS[codec]
        assert len(batch.raw) == len(original)
        assert batch.raw[8:12] == original[8:12], "batchLength changed"
        assert batch.raw[16:] == original[16:], "bytes under the CRC changed"
