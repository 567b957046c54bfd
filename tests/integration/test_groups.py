"""Consumer groups against a real broker process with the three PyPI clients.

Rebalances (3 consumers → 2 partitions each; a fourth joins, one leaves → one owner per
partition), two groups each reading everything, committed offsets across a restart, and
Kafka's error codes for bad commits (nothing written).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import trio

from raftlog.fetch.client import KafkaConnection
from raftlog.fetch.errors import ErrorCode
from raftlog.fetch.schemas import FIND_COORDINATOR
from raftlog.fetch.schemas_group import OFFSET_COMMIT, OFFSET_FETCH
from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import create_topic, unique_topic

PARTITIONS = 6
RECORDS = 600
TIMEOUT_S = 40.0


def _produce(bootstrap: str, topic: str, count: int = RECORDS) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(count):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i)
    assert producer.flush(15) == 0


def _confluent(bootstrap: str, group: str, **extra: Any) -> Any:
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                     "session.timeout.ms": 6000, "heartbeat.interval.ms": 300,
                     "auto.offset.reset": "earliest", **extra})


def _poll_until(consumers: list[Any], done: Any, what: str) -> dict[int, list[Any]]:
    """Polls every consumer round-robin until ``done(assignments, records)``."""
    records: dict[int, list[Any]] = {i: [] for i in range(len(consumers))}
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        for i, consumer in enumerate(consumers):
            message = consumer.poll(0.05)
            if message is not None and message.error() is None:
                records[i].append(message)
        assignments = [sorted(tp.partition for tp in c.assignment()) for c in consumers]
        if done(assignments, records):
            return records
    raise AssertionError(f"timed out waiting for {what}: "
                         f"{[sorted(tp.partition for tp in c.assignment()) for c in consumers]}")


def _exactly_one_owner(assignments: list[list[int]]) -> bool:
    owned = sorted(p for a in assignments for p in a)
    return owned == list(range(PARTITIONS))


def test_confluent_group_rebalances(broker: BrokerProcess) -> None:
    topic = unique_topic("groups")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    _produce(broker.bootstrap, topic)
    consumers = [_confluent(broker.bootstrap, "g-rebalance") for _ in range(3)]
    try:
        for c in consumers:
            c.subscribe([topic])
        records = _poll_until(
            consumers,
            lambda a, r: all(len(x) == 2 for x in a) and _exactly_one_owner(a)
            and sum(map(len, r.values())) >= RECORDS,
            "three consumers with two partitions each")
        seen = {(m.partition(), m.offset()) for ms in records.values() for m in ms}
        assert len(seen) == RECORDS
        # A fourth member joins, then the first leaves: every partition keeps one owner.
        fourth = _confluent(broker.bootstrap, "g-rebalance")
        fourth.subscribe([topic])
        consumers.append(fourth)
        _poll_until(consumers, lambda a, r: all(a) and _exactly_one_owner(a),
                    "four consumers sharing six partitions")
        consumers.pop(0).close()
        _poll_until(consumers, lambda a, r: all(a) and _exactly_one_owner(a),
                    "three consumers after one left")
    finally:
        for c in consumers:
            c.close()


def test_two_groups_each_get_every_record(broker: BrokerProcess) -> None:
    topic = unique_topic("two-groups")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    _produce(broker.bootstrap, topic)
    a = [_confluent(broker.bootstrap, "g-a") for _ in range(2)]
    b = [_confluent(broker.bootstrap, "g-b")]
    try:
        for c in a + b:
            c.subscribe([topic])
        records = _poll_until(
            a + b, lambda _, r: len(r[0]) + len(r[1]) >= RECORDS and len(r[2]) >= RECORDS,
            "both groups to read everything")
        group_a = {(m.partition(), m.offset()) for m in records[0] + records[1]}
        group_b = {(m.partition(), m.offset()) for m in records[2]}
        assert len(group_a) == len(group_b) == RECORDS
    finally:
        for c in a + b:
            c.close()


def test_committed_offsets_survive_restart(broker: BrokerProcess) -> None:
    from confluent_kafka import TopicPartition

    topic = unique_topic("commit")
    create_topic(broker.bootstrap, topic, partitions=2)
    consumer = _confluent(broker.bootstrap, "g-commit", **{"enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        consumer.commit(offsets=[TopicPartition(topic, 0, 42), TopicPartition(topic, 1, 7)],
                        asynchronous=False)
    finally:
        consumer.close()
    broker.restart()
    consumer = _confluent(broker.bootstrap, "g-commit")
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                committed = consumer.committed(
                    [TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=5)
                break
            except Exception:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert [tp.offset for tp in committed] == [42, 7]
    finally:
        consumer.close()


def test_kafka_python_group(broker: BrokerProcess) -> None:
    from kafka import KafkaConsumer

    topic = unique_topic("kp-group")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    consumers = [KafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id="g-kp",
                               auto_offset_reset="earliest", session_timeout_ms=6000,
                               heartbeat_interval_ms=300) for _ in range(3)]
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            for c in consumers:
                c.poll(timeout_ms=50)
            assignments = [sorted(tp.partition for tp in c.assignment()) for c in consumers]
            if all(len(a) == 2 for a in assignments) and _exactly_one_owner(assignments):
                break
            assert time.monotonic() < deadline, assignments
    finally:
        for c in consumers:
            c.close()


def test_aiokafka_group(broker: BrokerProcess) -> None:
    from aiokafka import AIOKafkaConsumer

    topic = unique_topic("aio-group")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)

    async def run() -> list[list[int]]:
        consumers = [AIOKafkaConsumer(topic, bootstrap_servers=broker.bootstrap,
                                      group_id="g-aio", auto_offset_reset="earliest",
                                      session_timeout_ms=6000, heartbeat_interval_ms=300)
                     for _ in range(3)]
        for c in consumers:
            await c.start()
        try:
            deadline = time.monotonic() + TIMEOUT_S
            while True:
                await asyncio.gather(*(c.getmany(timeout_ms=50) for c in consumers))
                assignments = [sorted(tp.partition for tp in c.assignment()) for c in consumers]
                if all(len(a) == 2 for a in assignments) and _exactly_one_owner(assignments):
                    return assignments
                assert time.monotonic() < deadline, assignments
        finally:
            for c in consumers:
                await c.stop()

    asyncio.run(run())


def test_bad_commits_get_kafka_errors_and_change_nothing(broker: BrokerProcess) -> None:
    topic = unique_topic("bad-commit")
    create_topic(broker.bootstrap, topic, partitions=1)

    async def run() -> None:
        async with await KafkaConnection.connect("127.0.0.1", broker.port) as conn:
            with trio.fail_after(20):
                while True:
                    found = await conn.request(FIND_COORDINATOR, {"key": "g-bad", "key_type": 0})
                    if found.error_code == 0:
                        break
                    await trio.sleep(0.1)

            async def commit(generation: int, member: str, offset: int,
                             metadata: str = "") -> int:
                body = {"group_id": "g-bad", "generation_id_or_member_epoch": generation,
                        "member_id": member, "group_instance_id": None,
                        "topics": [{"name": topic, "partitions": [
                            {"partition_index": 0, "committed_offset": offset,
                             "committed_leader_epoch": -1, "committed_metadata": metadata}]}]}
                response = await conn.request(OFFSET_COMMIT, body, version=7)
                return int(response.topics[0].partitions[0].error_code)

            async def fetched() -> int:
                response = await conn.request(OFFSET_FETCH, {
                    "group_id": "g-bad", "topics": [{"name": topic, "partition_indexes": [0]}],
                    "require_stable": False}, version=7)
                return int(response.topics[0].partitions[0].committed_offset)

            # Unknown group with a generation: a commit from a generation that is gone.
            assert await commit(3, "ghost", 5) == ErrorCode.ILLEGAL_GENERATION
            assert await fetched() == -1
            # A simple (generation -1) commit creates the group...
            assert await commit(-1, "", 10) == ErrorCode.NONE
            assert await fetched() == 10
            # ...which is empty: a member id and generation are unknown there.
            assert await commit(1, "ghost", 11) == ErrorCode.UNKNOWN_MEMBER_ID
            assert await commit(-1, "", 12, "x" * 5000) == ErrorCode.OFFSET_METADATA_TOO_LARGE
            assert await fetched() == 10

    trio.run(run)


def test_compacted_topic_refuses_records_without_key(broker: BrokerProcess) -> None:
    import pytest

    from raftlog.fetch.client import KafkaClientError
    from raftlog.partition.batch import build_batch
    from tests.integration.helpers import produce_raw

    topic = unique_topic("compacted")
    create_topic(broker.bootstrap, topic, configs={"cleanup.policy": "compact"})
    assert produce_raw(broker.bootstrap, topic, 0, build_batch([(b"k", b"v", ())])) == 0
    with pytest.raises(KafkaClientError, match="INVALID_RECORD"):
        produce_raw(broker.bootstrap, topic, 0, build_batch([(b"k", b"v", ()), (None, b"x", ())]))
    assert produce_raw(broker.bootstrap, topic, 0, build_batch([(b"k", None, ())])) == 1
