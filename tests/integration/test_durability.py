"""Acceptance: what a client wrote survives a clean restart and a SIGKILL, and segment rolls
are invisible to clients (offsets stay contiguous across segment files).

Retention through the protocol runs on a broker with ``log.retention.check.interval.ms=200``
(raftlog's default pass is every 30 s).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from raftlog.partition.batch import Record
from raftlog.protocol.errors import ErrorCode
from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import (
    EARLIEST,
    LATEST,
    StoredBatch,
    broker_log_problems,
    check_batches,
    confluent_consume,
    create_topic,
    decode_batches,
    fetch_error,
    fetch_raw,
    list_offsets,
    start_broker,
    unique_topic,
    wait_until,
)

PARTITIONS = 3
TIMEOUT_S = 30.0


def producer_config(broker: BrokerProcess, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": broker.bootstrap, "acks": "all", "enable.idempotence": False,
            "linger.ms": 5, "partitioner": "murmur2_random", **extra}


def produce_confluent(broker: BrokerProcess, topic: str,
                      records: list[tuple[bytes, bytes, int]],
                      **extra: Any) -> dict[bytes, tuple[int, int]]:
    """(key, value, timestamp_ms) records; returns value -> (partition, offset)."""
    from confluent_kafka import Producer

    producer = Producer(producer_config(broker, **extra))
    acknowledged: dict[bytes, tuple[int, int]] = {}
    failures: list[str] = []

    def on_delivery(error: Any, message: Any) -> None:
        if error is not None:
            failures.append(str(error))
        else:
            acknowledged[message.value()] = (message.partition(), message.offset())

    for key, value, timestamp_ms in records:
        producer.produce(topic, key=key, value=value, timestamp=timestamp_ms,
                         on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(TIMEOUT_S) == 0
    assert not failures, failures[:3]
    return acknowledged


def snapshot(broker: BrokerProcess, topic: str) -> dict[int, list[StoredBatch]]:
    return {p: fetch_raw(broker.bootstrap, topic, p) for p in range(PARTITIONS)}


def assert_clean_log(broker: BrokerProcess) -> None:
    problems = broker_log_problems(broker.log_path.read_text())
    assert not problems, "broker log reports errors:\n" + "\n".join(problems[:20])


# -- clean restart -----------------------------------------------------------------------------


def test_restart_preserves_offsets_values_and_list_offsets(broker: BrokerProcess) -> None:
    topic = unique_topic("restart")
    create_topic(broker.bootstrap, topic, PARTITIONS)
    base_ms = int(time.time() * 1000) - 60_000
    records = [(b"key-%d" % (i % 101), b"value-%05d" % i, base_ms + i) for i in range(3_000)]
    acknowledged = produce_confluent(broker, topic, records[:2_000])
    # A second producer with gzip so the log mixes compressed and plain batches.
    acknowledged |= produce_confluent(broker, topic, records[2_000:], **{
        "compression.type": "gzip"})

    earliest = list_offsets(broker.bootstrap, topic, range(PARTITIONS), EARLIEST)
    latest = list_offsets(broker.bootstrap, topic, range(PARTITIONS), LATEST)
    probe_ms = base_ms + 1_500
    by_time = list_offsets(broker.bootstrap, topic, range(PARTITIONS), probe_ms)
    before = snapshot(broker, topic)
    consumed_before = confluent_consume(broker.bootstrap, topic, range(PARTITIONS), TIMEOUT_S)
    assert earliest == dict.fromkeys(range(PARTITIONS), 0)
    assert sum(latest.values()) == len(records)
    assert len(consumed_before) == len(records)
    for record in consumed_before:
        assert record.value is not None
        assert acknowledged[record.value] == (record.partition, record.offset)

    for restart in range(2):
        broker.stop()
        start_broker(broker)
        assert list_offsets(broker.bootstrap, topic, range(PARTITIONS), EARLIEST) == earliest
        assert list_offsets(broker.bootstrap, topic, range(PARTITIONS), LATEST) == latest, (
            f"latest offsets changed by restart {restart + 1}")
        assert list_offsets(broker.bootstrap, topic, range(PARTITIONS), probe_ms) == by_time
        after = snapshot(broker, topic)
        for partition in range(PARTITIONS):
            check_batches(after[partition])
            assert [b.raw for b in after[partition]] == [b.raw for b in before[partition]], (
                f"partition {partition}: stored batches differ after restart {restart + 1}")
        consumed = confluent_consume(broker.bootstrap, topic, range(PARTITIONS), TIMEOUT_S)
        assert sorted(consumed) == sorted(consumed_before)

    # The time index answers like before, and (Kafka: exact record; raftlog: its batch).
    for partition, offset in by_time.items():
        decoded = decode_batches(before[partition])
        exact = next(r.offset for r in decoded if r.timestamp_ms >= probe_ms)
        batch_base = next(b.header.base_offset for b in before[partition]
                          if b.header.base_offset <= exact <= b.header.last_offset)
        assert offset in (exact, batch_base), (partition, offset, exact, batch_base)

    # Appends continue at the old end offsets.
    more = produce_confluent(broker, topic, [(b"key-0", b"after-restart", base_ms + 10_000)])
    partition, offset = more[b"after-restart"]
    assert offset == latest[partition]
    assert_clean_log(broker)


# -- SIGKILL -----------------------------------------------------------------------------------


@dataclass
class StreamingProducer:
    """A confluent-kafka producer streaming keyed records from a background thread; records
    every acknowledged (delivery report without error) record's partition and offset."""

    bootstrap: str
    topic: str
    acknowledged: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    produced: int = 0
    unflushed: int = -1
    flush_timeout_s: float = TIMEOUT_S
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="streaming-producer", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float, flush_timeout_s: float = TIMEOUT_S) -> None:
        assert self._thread is not None
        self.flush_timeout_s = flush_timeout_s
        self._stop.set()
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "producer thread did not finish"
        if self.error is not None:
            raise self.error

    def _on_delivery(self, error: Any, message: Any) -> None:
        if error is None:
            self.acknowledged[message.value()] = (message.partition(), message.offset())
        else:
            self.failed.append(str(error))

    def _run(self) -> None:
        from confluent_kafka import Producer

        try:
            producer = Producer({
                "bootstrap.servers": self.bootstrap, "acks": "all",
                "enable.idempotence": False, "linger.ms": 2, "message.timeout.ms": 20_000,
                "reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 200,
                "retry.backoff.ms": 50, "retry.backoff.max.ms": 200,
            })
            i = 0
            while not self._stop.is_set():
                value = b"stream-%08d" % i
                try:
                    producer.produce(self.topic, key=b"k%d" % (i % 37), value=value,
                                     on_delivery=self._on_delivery)
                except BufferError:
                    producer.poll(0.05)
                    continue
                i += 1
                self.produced = i
                producer.poll(0)
                if i % 20 == 0:
                    time.sleep(0.002)  # at most ~10,000 records/s: keeps the check quick
            self.unflushed = producer.flush(self.flush_timeout_s)
        except BaseException as exc:  # surfaced by stop()
            self.error = exc


def wait_for_more_acks(stream: StreamingProducer, count: int) -> None:
    target = len(stream.acknowledged) + count
    try:
        wait_until(lambda: len(stream.acknowledged) >= target, 20.0,
                   f"{target} acknowledged records")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: produced {stream.produced}, acknowledged "
                             f"{len(stream.acknowledged)}, failed {len(stream.failed)} "
                             f"{stream.failed[-3:]}") from None


@pytest.mark.parametrize("configs", [{}, {"segment.bytes": "65536"}],
                         ids=["default-segments", "small-segments"])
def test_sigkill_mid_stream_keeps_every_acknowledged_record(
        broker: BrokerProcess, configs: dict[str, str]) -> None:
    topic = unique_topic("sigkill")
    create_topic(broker.bootstrap, topic, PARTITIONS, configs)
    stream = StreamingProducer(broker.bootstrap, topic)
    stream.start()
    kills = 3
    try:
        for _ in range(kills):
            wait_for_more_acks(stream, 1_000)
            broker.kill()
            time.sleep(0.2)  # let the producer notice and queue retries
            start_broker(broker)
        wait_for_more_acks(stream, 1_000)
    except BaseException:
        stream.stop(10.0, flush_timeout_s=1.0)  # fail fast, the broker may be down
        raise
    stream.stop(TIMEOUT_S + 10)
    assert stream.unflushed == 0, f"{stream.unflushed} records never acknowledged nor failed"
    acknowledged = dict(stream.acknowledged)
    assert len(acknowledged) >= (kills + 1) * 1_000

    stored: dict[int, dict[int, Record]] = {}
    for partition in range(PARTITIONS):
        batches = fetch_raw(broker.bootstrap, topic, partition)
        check_batches(batches)  # every CRC valid, offsets contiguous from 0
        stored[partition] = {r.offset: r for r in decode_batches(batches)}
    lost = [(value, place) for value, place in acknowledged.items()
            if place[1] not in stored[place[0]] or stored[place[0]][place[1]].value != value]
    assert not lost, (f"{len(lost)} of {len(acknowledged)} acknowledged records are not at "
                      f"their acknowledged offset, e.g. {lost[:3]}")
    latest = list_offsets(broker.bootstrap, topic, range(PARTITIONS), LATEST)
    assert latest == {p: len(stored[p]) for p in range(PARTITIONS)}
    print(f"produced {stream.produced}, acknowledged {len(acknowledged)}, "
          f"failed {len(stream.failed)}, stored {sum(latest.values())}")
    assert_clean_log(broker)


# -- segments and retention --------------------------------------------------------------------


def produce_values(broker: BrokerProcess, topic: str, count: int) -> list[bytes]:
    from confluent_kafka import Producer

    # Small batches (~16 records), so that each segment holds several of them.
    producer = Producer(producer_config(broker, **{"batch.size": 2_000}))
    values = [b"segment-test-%06d-" % i + b"x" * 100 for i in range(count)]
    for value in values:
        producer.produce(topic, value=value, partition=0)
        producer.poll(0)
    assert producer.flush(TIMEOUT_S) == 0
    return values


def segment_files(broker: BrokerProcess, topic: str) -> list[str]:
    return sorted(p.name for p in (broker.data_dir / f"{topic}-0").glob("*.log"))


def assert_serves(broker: BrokerProcess, topic: str, values: list[bytes], start: int) -> None:
    batches = fetch_raw(broker.bootstrap, topic, 0, start)
    check_batches(batches, batches[0].header.base_offset if batches else start)
    records = [r for r in decode_batches(batches) if r.offset >= start]
    assert [r.offset for r in records] == list(range(start, len(values)))
    assert [r.value for r in records] == values[start:]


def test_segment_roll_is_invisible_to_clients(broker: BrokerProcess) -> None:
    topic = unique_topic("segments")
    create_topic(broker.bootstrap, topic, 1, {"segment.bytes": "16384"})
    values = produce_values(broker, topic, 3_000)
    segments = segment_files(broker, topic)
    assert len(segments) >= 10, f"expected many segments, found {segments}"

    for _ in range(2):  # before and after a restart (recovery of many segments)
        assert list_offsets(broker.bootstrap, topic, [0], EARLIEST) == {0: 0}
        assert list_offsets(broker.bootstrap, topic, [0], LATEST) == {0: len(values)}
        assert_serves(broker, topic, values, 0)
        for start in (1, 1_234, len(values) - 1):  # fetches starting inside segments
            assert_serves(broker, topic, values, start)
        consumed = confluent_consume(broker.bootstrap, topic, [0], TIMEOUT_S)
        assert [r.value for r in consumed] == values
        broker.stop()
        start_broker(broker)
    assert segment_files(broker, topic) == segments
    assert_clean_log(broker)


def test_retention_deletes_old_segments_through_protocol(
    fast_retention_broker: BrokerProcess,
) -> None:
    broker = fast_retention_broker
    topic = unique_topic("retention")
    # 5 s: long enough that no segment expires before the listing below, even on a loaded box
    # (the pass runs every 200 ms here).
    create_topic(broker.bootstrap, topic, 1, {"segment.bytes": "16384", "retention.ms": "5000"})
    values = produce_values(broker, topic, 2_000)
    segments = segment_files(broker, topic)
    assert len(segments) >= 5

    def start_offset() -> int:
        return list_offsets(broker.bootstrap, topic, [0], EARLIEST)[0]

    # Segments expire by their newest timestamp, so on a loaded box (producing took a while)
    # the later ones expire seconds after the first: wait for all of them, not the first.
    active_base = int(segments[-1].removesuffix(".log"))
    wait_until(lambda: start_offset() == active_base, 60,
               "the retention pass to delete every sealed segment", interval_s=0.5)
    log_start = start_offset()
    remaining = segment_files(broker, topic)
    # Every sealed segment expired; the active one stays, so the log start is its base.
    assert remaining == segments[-1:]
    assert log_start == int(remaining[0].removesuffix(".log"))
    assert list_offsets(broker.bootstrap, topic, [0], LATEST) == {0: len(values)}
    assert fetch_error(broker.bootstrap, topic, 0, 0) == ErrorCode.OFFSET_OUT_OF_RANGE
    assert_serves(broker, topic, values, log_start)
    broker.stop()
    start_broker(broker)
    assert start_offset() == log_start
    assert_serves(broker, topic, values, log_start)
    assert_clean_log(broker)
