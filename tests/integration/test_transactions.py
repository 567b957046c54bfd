"""Transactions end to end on one node with confluent-kafka (librdkafka): a transactional
producer's commits are visible to read_committed consumers and its aborts are not, a new
incarnation fences the old one, the coordinator aborts timed-out transactions, and bad input
gets Kafka's error codes."""

from __future__ import annotations

import time
from typing import Any

import pytest
import trio

from raftlog.partition.batch import build_batch
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import FIND_COORDINATOR, INIT_PRODUCER_ID, LIST_OFFSETS
from raftlog.protocol.schemas_txn import END_TXN
from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import _connect, create_topic, produce_raw, unique_topic

confluent_kafka = pytest.importorskip("confluent_kafka")


def _producer(bootstrap: str, txn_id: str, **extra: Any) -> Any:
    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "transactional.id": txn_id,
        "transaction.timeout.ms": 60000, "linger.ms": 5, **extra})
    producer.init_transactions(30)
    return producer


def _consume(bootstrap: str, topic: str, partitions: int, isolation: str, expect: int,
             idle_s: float = 3.0, timeout_s: float = 30.0) -> list[tuple[int, int, bytes]]:
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": "txn-test-assign-only",
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "isolation.level": isolation})
    out: list[tuple[int, int, bytes]] = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + timeout_s
        last = time.monotonic()
        while time.monotonic() < deadline:
            messages = consumer.consume(num_messages=1000, timeout=0.3)
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                        continue
                    raise AssertionError(f"consumer error: {error}")
                out.append((message.partition(), message.offset(), message.value()))
            if messages:
                last = time.monotonic()
            if len(out) >= expect and time.monotonic() - last > idle_s:
                break
    finally:
        consumer.close()
    return out


def test_commit_and_abort_with_read_committed(broker: BrokerProcess) -> None:
    topic = unique_topic("txn")
    create_topic(broker.bootstrap, topic, partitions=2)
    producer = _producer(broker.bootstrap, "txn-basic")
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, value=b"c1-%d" % i, partition=i % 2)
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(6):
        producer.produce(topic, value=b"a1-%d" % i, partition=i % 2)
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    for i in range(4):
        producer.produce(topic, value=b"c2-%d" % i, partition=i % 2)
    producer.commit_transaction(30)

    committed = _consume(broker.bootstrap, topic, 2, "read_committed", expect=14)
    values = sorted(v for _, _, v in committed)
    assert values == sorted([b"c1-%d" % i for i in range(10)] + [b"c2-%d" % i for i in range(4)])
    everything = _consume(broker.bootstrap, topic, 2, "read_uncommitted", expect=20)
    assert len(everything) == 20  # aborted data is in the log, markers are skipped
    assert {v for _, _, v in everything} >= {b"a1-%d" % i for i in range(6)}


def test_open_transaction_holds_the_lso(broker: BrokerProcess) -> None:
    topic = unique_topic("txn-lso")
    create_topic(broker.bootstrap, topic)
    producer = _producer(broker.bootstrap, "txn-lso")
    producer.begin_transaction()
    producer.produce(topic, value=b"pending", partition=0)
    producer.flush(30)
    latest = _list_latest(broker.bootstrap, topic)
    assert latest[0] == 0 and latest[1] == 1  # read_committed LSO 0, HW 1
    assert _consume(broker.bootstrap, topic, 1, "read_committed", expect=0, idle_s=1.0) == []
    producer.commit_transaction(30)
    # EndTxn answers once PrepareCommit is persisted; the marker follows asynchronously.
    deadline = time.monotonic() + 10
    while (latest := _list_latest(broker.bootstrap, topic)) != (2, 2):  # data + COMMIT marker
        assert time.monotonic() < deadline, latest
        time.sleep(0.05)
    assert [v for _, _, v in _consume(broker.bootstrap, topic, 1, "read_committed", 1)] \
        == [b"pending"]


def test_new_incarnation_fences_and_aborts_the_old(broker: BrokerProcess) -> None:
    topic = unique_topic("txn-fence")
    create_topic(broker.bootstrap, topic)
    old = _producer(broker.bootstrap, "txn-zombie")
    old.begin_transaction()
    old.produce(topic, value=b"zombie", partition=0)
    old.flush(30)
    new = _producer(broker.bootstrap, "txn-zombie")  # bumps the epoch, aborts the open txn
    new.begin_transaction()
    new.produce(topic, value=b"fresh", partition=0)
    new.commit_transaction(30)
    with pytest.raises(confluent_kafka.KafkaException) as info:
        old.produce(topic, value=b"zombie-2", partition=0)
        old.commit_transaction(10)
    assert info.value.args[0].fatal() or info.value.args[0].code() in (
        confluent_kafka.KafkaError._FENCED, confluent_kafka.KafkaError.INVALID_PRODUCER_EPOCH,
        confluent_kafka.KafkaError.PRODUCER_FENCED)
    values = [v for _, _, v in _consume(broker.bootstrap, topic, 1, "read_committed", 1)]
    assert values == [b"fresh"]


def test_timed_out_transaction_is_aborted(broker: BrokerProcess) -> None:
    topic = unique_topic("txn-timeout")
    create_topic(broker.bootstrap, topic)
    producer = _producer(broker.bootstrap, "txn-timeout", **{"transaction.timeout.ms": 2000})
    producer.begin_transaction()
    producer.produce(topic, value=b"late", partition=0)
    producer.flush(30)
    deadline = time.monotonic() + 20
    while _list_latest(broker.bootstrap, topic)[0] != 2:  # ABORT marker written, LSO moved
        assert time.monotonic() < deadline, "the coordinator did not abort the transaction"
        time.sleep(0.2)
    assert _consume(broker.bootstrap, topic, 1, "read_committed", expect=0, idle_s=1.0) == []


def test_bad_input_gets_kafka_error_codes(broker: BrokerProcess) -> None:
    topic = unique_topic("txn-bad")
    create_topic(broker.bootstrap, topic)
    # A transactional batch from a producer with no transaction.
    batch = build_batch([(b"k", b"v", ())], producer_id=4242, producer_epoch=0,
                        base_sequence=0, attributes=0x10)
    with pytest.raises(Exception, match=r"INVALID_TXN_STATE|48"):
        produce_raw(broker.bootstrap, topic, 0, batch)
    # A control batch from a client.
    control = build_batch([(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00", ())],
                          producer_id=4242, producer_epoch=0, attributes=0x30)
    with pytest.raises(Exception, match=r"INVALID_RECORD|87"):
        produce_raw(broker.bootstrap, topic, 0, control)

    async def raw() -> tuple[int, int, int]:
        connection = await _connect(broker.bootstrap)
        try:
            # EndTxn for an unknown transactional id (after the coordinator exists).
            for _ in range(100):
                found = await connection.request(FIND_COORDINATOR, {
                    "key": "txn-bad-known", "key_type": 1})
                if found.error_code == 0:
                    break
                await trio.sleep(0.1)
            for _ in range(100):
                init = await connection.request(INIT_PRODUCER_ID, {
                    "transactional_id": "txn-bad-known", "transaction_timeout_ms": 10000,
                    "producer_id": -1, "producer_epoch": -1})
                if init.error_code == 0:
                    break
                await trio.sleep(0.1)
            assert init.error_code == 0, init
            unknown = await connection.request(END_TXN, {
                "transactional_id": "txn-bad-unknown", "producer_id": 1, "producer_epoch": 0,
                "committed": True}, version=1)
            # EndTxn on an Empty transaction; then an EndTxn with a past epoch.
            empty = await connection.request(END_TXN, {
                "transactional_id": "txn-bad-known", "producer_id": init.producer_id,
                "producer_epoch": init.producer_epoch, "committed": True}, version=1)
            await connection.request(INIT_PRODUCER_ID, {
                "transactional_id": "txn-bad-known", "transaction_timeout_ms": 10000,
                "producer_id": -1, "producer_epoch": -1})
            past = await connection.request(END_TXN, {
                "transactional_id": "txn-bad-known", "producer_id": init.producer_id,
                "producer_epoch": init.producer_epoch, "committed": False}, version=1)
            return unknown.error_code, empty.error_code, past.error_code
        finally:
            await connection.aclose()

    unknown, empty, past = trio.run(raw)
    assert unknown in (ErrorCode.INVALID_PRODUCER_ID_MAPPING, ErrorCode.NOT_COORDINATOR)
    assert empty == ErrorCode.INVALID_TXN_STATE
    assert past == ErrorCode.INVALID_PRODUCER_EPOCH  # v1 predates PRODUCER_FENCED


def _list_latest(bootstrap: str, topic: str) -> tuple[int, int]:
    """(read_committed latest, read_uncommitted latest) of partition 0."""

    async def run() -> tuple[int, int]:
        connection = await _connect(bootstrap)
        try:
            out = []
            for isolation in (1, 0):
                response = await connection.request(LIST_OFFSETS, {
                    "replica_id": -1, "isolation_level": isolation, "topics": [{
                        "name": topic, "partitions": [{"partition_index": 0,
                                                       "timestamp": -1}]}]})
                out.append(response.topics[0].partitions[0].offset)
            return out[0], out[1]
        finally:
            await connection.aclose()

    return trio.run(run)
