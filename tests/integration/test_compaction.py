"""Log compaction acceptance (issue 5): a real broker process, confluent-kafka clients.

1,000,000 updates over 1,000 keys on a ``cleanup.policy=compact`` topic with small segments
shrink to about 1,000 records once the cleaner ran; every key still reads its latest value
at the offset it was written at (confluent-kafka, kafka-python and aiokafka all read the
compacted log, gaps and empty batches included); tombstones go after
``delete.retention.ms``; a restart keeps all of it. And a follower that was down while its
leader compacted catches up from the compacted log.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlog.partition.batch import decode_records
from raftlog.partition.cleaner import iter_batches
from tests.integration.cluster_harness import Cluster
from tests.integration.cluster_harness import wait_until as cluster_wait_until
from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import (
    broker_log_problems,
    confluent_consume,
    create_topic,
    decode_batches,
    fetch_raw,
    start_broker,
    unique_topic,
    wait_until,
)

UPDATES = 1_000_000
KEYS = 1_000
DELETED_KEYS = 10  # key-0000 .. key-0009 get a tombstone at the end
SEGMENT_MS = 3_000
DELETE_RETENTION_MS = 3_000


@pytest.fixture
def compacting_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path, extra_properties={"log.cleaner.backoff.ms": "1000"})
    start_broker(process)
    try:
        yield process
    finally:
        process.stop()


def _key(i: int) -> bytes:
    return b"key-%04d" % (i % KEYS)


def _produce(bootstrap: str, topic: str, items: Iterator[tuple[bytes, bytes | None]],
             latest: dict[bytes, tuple[int, bytes | None]]) -> None:
    """Produce with large batches; ``latest`` gets key -> (offset, value) of the newest
    acknowledged write."""
    from confluent_kafka import KafkaError, Message, Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50,
                         "batch.size": 1_000_000, "batch.num.messages": 100_000,
                         "queue.buffering.max.messages": 2_000_000,
                         "queue.buffering.max.kbytes": 1_048_576, "acks": "all",
                         "enable.idempotence": True})
    failures: list[str] = []

    def delivered(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            failures.append(str(error))
            return
        key, offset = message.key(), message.offset()
        assert key is not None and offset is not None
        previous = latest.get(key)
        if previous is None or previous[0] < offset:
            latest[key] = (offset, message.value())

    for key, value in items:
        while True:
            try:
                producer.produce(topic, value=value, key=key, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(120) == 0, "undelivered records"
    assert not failures, failures[:5]


def _stored(bootstrap: str, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for r in decode_batches(fetch_raw(bootstrap, topic, 0))]


def _check_latest(records: list[tuple[int, bytes | None, bytes | None]],
                  latest: dict[bytes, tuple[int, bytes | None]]) -> None:
    """Each surviving key appears once below the roll record, at its original offset and
    with its latest value; deleted keys are gone."""
    seen: dict[bytes, tuple[int, bytes | None]] = {}
    for offset, key, value in records:
        assert key is not None
        assert key not in seen, f"{key!r} twice: {seen[key]} and {(offset, value)}"
        seen[key] = (offset, value)
    expected = {k: v for k, v in latest.items() if v[1] is not None}
    assert seen == expected


def test_a_million_updates_compact_to_the_latest_value_per_key(
        compacting_broker: BrokerProcess) -> None:
    bootstrap = compacting_broker.bootstrap
    topic = unique_topic("compacted")
    create_topic(bootstrap, topic, configs={
        "cleanup.policy": "compact", "segment.bytes": str(256 * 1024),
        # Ratio 0: the sealed segment holding only the tombstones is ~0.3% of the log, below
        # any useful ratio, and it must still be cleaned for the check below.
        "segment.ms": str(SEGMENT_MS), "min.cleanable.dirty.ratio": "0",
        "delete.retention.ms": str(DELETE_RETENTION_MS)})
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    started = time.monotonic()
    _produce(bootstrap, topic, ((_key(i), b"value-%d" % i) for i in range(UPDATES)), latest)
    produced_s = time.monotonic() - started
    _produce(bootstrap, topic, ((_key(i), None) for i in range(DELETED_KEYS)), latest)
    # Let the tombstones pass delete.retention.ms and the active segment pass segment.ms,
    # then one more record rolls it: everything but that record becomes cleanable.
    time.sleep(max(SEGMENT_MS, DELETE_RETENTION_MS) / 1000 + 0.5)
    _produce(bootstrap, topic, iter([(b"roll", b"x")]), latest)
    end_offset = latest[b"roll"][0] + 1
    assert end_offset == UPDATES + DELETED_KEYS + 1  # nothing was lost or renumbered

    def cleaned() -> bool:
        return len(_stored(bootstrap, topic)) <= KEYS - DELETED_KEYS + 1

    wait_until(cleaned, 90, "the cleaner to compact the topic", interval_s=1.0)
    cleaned_s = time.monotonic() - started
    records = _stored(bootstrap, topic)
    assert len(records) == KEYS - DELETED_KEYS + 1
    _check_latest(records, latest)
    # What a real client reads: the same records, at the same offsets, in offset order.
    consumed = confluent_consume(bootstrap, topic, [0])
    assert [(r.offset, r.key, r.value) for r in consumed] == records
    assert _kafka_python_read(bootstrap, topic, end_offset) == records
    assert asyncio.run(_aiokafka_read(bootstrap, topic, end_offset)) == records
    print(f"\nproduced {UPDATES} updates in {produced_s:.1f} s; compacted to "
          f"{len(records)} records {cleaned_s:.1f} s after the start")
    # A restart keeps everything: cleaned segments are ordinary segments.
    compacting_broker.restart()
    wait_until(lambda: _fetchable(bootstrap, topic), 30, "the topic after the restart")
    assert _stored(bootstrap, topic) == records
    assert not broker_log_problems(compacting_broker.log_path.read_text())


def _kafka_python_read(bootstrap: str, topic: str, end_offset: int
                       ) -> list[tuple[int, bytes | None, bytes | None]]:
    """kafka-python from the beginning until the record before ``end_offset`` (counting
    records cannot work on a compacted topic: offsets have gaps)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                             enable_auto_commit=False, auto_offset_reset="earliest")
    out: list[tuple[int, bytes | None, bytes | None]] = []
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        deadline = time.monotonic() + 30
        while not out or out[-1][0] < end_offset - 1:
            assert time.monotonic() < deadline, f"read up to {out[-1:]} of {end_offset}"
            for batch in consumer.poll(timeout_ms=500, max_records=5_000).values():
                out.extend((m.offset, m.key, m.value) for m in batch)
    finally:
        consumer.close(autocommit=False)
    return out


async def _aiokafka_read(bootstrap: str, topic: str, end_offset: int
                         ) -> list[tuple[int, bytes | None, bytes | None]]:
    """aiokafka from the beginning until the record before ``end_offset``."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    out: list[tuple[int, bytes | None, bytes | None]] = []
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        deadline = time.monotonic() + 30
        while not out or out[-1][0] < end_offset - 1:
            assert time.monotonic() < deadline, f"read up to {out[-1:]} of {end_offset}"
            for messages in (await consumer.getmany(timeout_ms=500)).values():
                out.extend((m.offset, m.key, m.value) for m in messages)
    finally:
        await consumer.stop()
    return out


def _fetchable(bootstrap: str, topic: str) -> bool:
    try:
        return bool(_stored(bootstrap, topic))
    except Exception:
        return False


def _latest(records: list[tuple[int, bytes | None, bytes | None]]
            ) -> dict[bytes | None, tuple[int, bytes | None]]:
    return {key: (offset, value) for offset, key, value in records}


def _local_records(partition_dir: Path) -> tuple[int, list[tuple[int, bytes | None,
                                                             bytes | None]]]:
    """(log end offset, records) of a stopped node's partition directory."""
    from raftlog.partition.log import LogConfig, PartitionLog

    log = PartitionLog.open(partition_dir, LogConfig(), int(time.time() * 1000))
    try:
        out: list[tuple[int, bytes | None, bytes | None]] = []
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            with log.read(offset, 1 << 24) as piece:
                data = piece.read_bytes()
            assert data
            for header, batch in iter_batches(data):
                out.extend((r.offset, r.key, r.value) for r in decode_records(batch)
                           if r.offset >= offset)
                offset = header.next_offset
        return log.log_end_offset, out
    finally:
        log.close()


def test_a_follower_catches_up_from_a_compacted_leader(tmp_path: Path) -> None:
    """The follower is down while the leader compacts; it then copies batches with offset
    gaps (and emptied batches), and ends up with the leader's latest value of every key."""
    from confluent_kafka.admin import AdminClient, NewTopic

    cluster = Cluster.create(tmp_path / "cluster",
                             extra_properties={"log.cleaner.backoff.ms": "500"})
    try:
        cluster.start_all()
        cluster.wait_ready()
        topic = unique_topic("compacted-rf3")
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 2})
        admin.create_topics([NewTopic(topic, 1, 3, config={
            "cleanup.policy": "compact", "segment.bytes": str(64 * 1024),
            "segment.ms": str(SEGMENT_MS), "min.cleanable.dirty.ratio": "0.01"})],
            request_timeout=15)[topic].result(timeout=30)
        cluster_wait_until(lambda: len(cluster.partition(topic).isr_nodes) == 3, 30,
                           "a full ISR")
        leader_id = cluster.partition(topic).leader_id
        follower_id = next(n for n in cluster.nodes if n != leader_id)
        follower = cluster.nodes[follower_id]
        follower.stop()
        # While it is down it must not run its own cleaner later: what it holds is a copy.
        with (follower.directory / "server.properties").open("a") as out:
            out.write("log.cleaner.enable=false\n")
        latest: dict[bytes, tuple[int, bytes | None]] = {}
        live = cluster.live_bootstrap()
        _produce(live, topic, ((b"k-%03d" % (i % 100), b"v-%d" % i) for i in range(50_000)),
                 latest)
        time.sleep(SEGMENT_MS / 1000 + 0.5)
        _produce(live, topic, iter([(b"roll", b"x")]), latest)
        leader = cluster.nodes[leader_id]
        wait_until(lambda: len(_stored(leader.bootstrap, topic)) <= 101, 60,
                   "the leader to compact")
        follower.start()
        follower.wait_listening()
        cluster_wait_until(lambda: len(cluster.partition(topic).isr_nodes) == 3, 60,
                           "the follower back in the ISR")
        expected = _stored(leader.bootstrap, topic)
        cluster.stop_all()
        end, copied = _local_records(follower.directory / "data" / f"{topic}-0")
        assert end == 50_001  # the log end offset is the leader's: no offset lost or added
        assert len(copied) < 50_000 / 10  # it copied the compacted log, gaps and all
        assert _latest(copied) == _latest(expected)
        assert {k: v for k, v in _latest(copied).items() if k is not None} == \
            {k: v for k, v in latest.items()}
        cluster.check_logs()
    finally:
        cluster.stop_all()
        cluster.kill_all()
