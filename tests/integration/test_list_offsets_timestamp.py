"""ListOffsets by timestamp with real clients: the answer is the exact record (KIP-79), not
the base offset of its batch, and read_committed answers stay below the LSO.

Records with distinct timestamps are produced in one batch (a long linger.ms, then flush),
which the test checks by fetching the raw batches back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import (
    create_topic,
    fetch_raw,
    list_offsets,
    unique_topic,
    wait_until,
)

confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")

TIMEOUT_S = 30.0
MAX_TIMESTAMP = -3  # KIP-734; sent here through the project's own client
# Offsets 0..4; out of order on purpose (a producer may set any timestamps).
DELTAS_MS = [10, 20, 20, 30, 25]
# target delta -> (offset, record timestamp delta) Kafka answers; None: no such record.
EXPECTED: dict[int, tuple[int, int] | None] = {
    0: (0, 10), 10: (0, 10), 15: (1, 20), 21: (3, 30), 25: (3, 30), 30: (3, 30), 31: None,
}


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(Path(tmp_path_factory.mktemp("list-offsets-ts")))
    process.start()
    try:
        yield process
    finally:
        process.stop()


def _produce_one_batch(bootstrap: str, topic: str, base_ms: int, compression: str) -> bool:
    """Produces DELTAS_MS's records; True when they landed in one batch (a long linger and a
    connected producer make that the rule, but a loaded box can still split them)."""
    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2000,
        "compression.type": compression})
    producer.list_topics(topic, timeout=TIMEOUT_S)  # connected, leader known: no early sends
    for i, delta in enumerate(DELTAS_MS):
        producer.produce(topic, value=b"v%d" % i, partition=0, timestamp=base_ms + delta)
    assert producer.flush(TIMEOUT_S) == 0
    batches = fetch_raw(bootstrap, topic, 0)
    if [(b.header.base_offset, b.header.records_count) for b in batches] != \
            [(0, len(DELTAS_MS))]:
        return False
    assert batches[0].header.max_timestamp == base_ms + max(DELTAS_MS)
    return True


def _topic_with_one_batch(bootstrap: str, compression: str, base_ms: int) -> str:
    """A fresh topic holding DELTAS_MS's records in one batch (the test means little
    otherwise); up to 3 attempts, each on a new topic."""
    for _ in range(3):
        topic = unique_topic(f"ts-{compression}")
        create_topic(bootstrap, topic, 1)
        if _produce_one_batch(bootstrap, topic, base_ms, compression):
            return topic
    raise AssertionError("the producer never put the records in one batch")


def _confluent_offsets_for_time(bootstrap: str, topic: str, timestamp_ms: int,
                                isolation: str = "read_uncommitted") -> int:
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": "list-offsets-ts",
        "enable.auto.commit": False, "isolation.level": isolation})
    try:
        (found,) = consumer.offsets_for_times(
            [confluent_kafka.TopicPartition(topic, 0, timestamp_ms)], timeout=TIMEOUT_S)
        assert found.error is None, found.error
        offset: int = found.offset
        return offset
    finally:
        consumer.close()


def _kafka_python_offsets_for_times(bootstrap: str, topic: str,
                                    targets_ms: list[int]) -> list[tuple[int, int] | None]:
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                   enable_auto_commit=False, request_timeout_ms=30_000)
    try:
        partition = kafka.TopicPartition(topic, 0)
        out: list[tuple[int, int] | None] = []
        for target_ms in targets_ms:
            found: Any = consumer.offsets_for_times({partition: target_ms})[partition]
            out.append(None if found is None else (found.offset, found.timestamp))
        return out
    finally:
        consumer.close()


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_clients_get_the_exact_record(shared_broker: BrokerProcess, compression: str) -> None:
    bootstrap = shared_broker.bootstrap
    base_ms = int(time.time() * 1000) - 60_000
    topic = _topic_with_one_batch(bootstrap, compression, base_ms)

    for target, expected in EXPECTED.items():
        # librdkafka answers -1 (OFFSET_END) when no record is that recent.
        expected_offset = -1 if expected is None else expected[0]
        assert _confluent_offsets_for_time(bootstrap, topic, base_ms + target) == \
            expected_offset, f"confluent-kafka, target +{target} ms"
    targets = list(EXPECTED)
    answers = _kafka_python_offsets_for_times(bootstrap, topic, [base_ms + t for t in targets])
    expected_answers = [None if e is None else (e[0], base_ms + e[1]) for e in EXPECTED.values()]
    assert answers == expected_answers, "kafka-python: offsets and record timestamps"
    # The record with the largest timestamp (+30 ms), not its batch's base offset: through the
    # project's client, and through librdkafka's admin API (it needs ListOffsets v7).
    assert list_offsets(bootstrap, topic, [0], MAX_TIMESTAMP) == {0: 3}
    assert _confluent_max_timestamp(bootstrap, topic) == (3, base_ms + max(DELTAS_MS))


def _confluent_max_timestamp(bootstrap: str, topic: str) -> tuple[int, int]:
    from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    partition = confluent_kafka.TopicPartition(topic, 0)
    futures = admin.list_offsets({partition: OffsetSpec.max_timestamp()},
                                 request_timeout=TIMEOUT_S)
    info = futures[partition].result(timeout=TIMEOUT_S)
    return int(info.offset), int(info.timestamp)


def test_read_committed_answers_stay_below_the_lso(shared_broker: BrokerProcess) -> None:
    bootstrap = shared_broker.bootstrap
    topic = unique_topic("ts-txn")
    create_topic(bootstrap, topic, 1)
    base_ms = int(time.time() * 1000) - 60_000
    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "transactional.id": unique_topic("ts-txn-id"),
        "transaction.timeout.ms": 60_000, "linger.ms": 5})
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(topic, value=b"open", partition=0, timestamp=base_ms)
    assert producer.flush(TIMEOUT_S) == 0
    # The open transaction's record is below the high watermark but above the LSO.
    wait_until(lambda: _confluent_offsets_for_time(bootstrap, topic, base_ms) == 0, TIMEOUT_S,
               "read_uncommitted to see the open transaction's record", interval_s=0.2)
    assert _confluent_offsets_for_time(bootstrap, topic, base_ms, "read_committed") == -1, \
        "read_committed must not be told an offset at or past the LSO"
    producer.commit_transaction(TIMEOUT_S)
    wait_until(lambda: _confluent_offsets_for_time(bootstrap, topic, base_ms,
                                                   "read_committed") == 0,
               TIMEOUT_S, "read_committed to see the committed record", interval_s=0.2)
