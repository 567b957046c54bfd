"""Shared helpers for the integration tests.

Raw protocol access goes through the project's own trio client (``KafkaConnection``), so a
test can look at the record batches exactly as the broker stores and serves them; the PyPI
clients are only used through small, time-bounded loops. Every loop here has a deadline.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import trio

from raftlog.client.connection import (
    ClusterLogin,
    KafkaClientError,
    KafkaConnection,
    parse_bootstrap,
)
from raftlog.partition.batch import (
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    Record,
    check_batch,
    decode_records,
    parse_header,
)
from raftlog.partition.compression import decompress_batches
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import CREATE_TOPICS, FETCH, LIST_OFFSETS, PRODUCE
from raftlog.security.session import ADMIN_USER, ClusterCredentials
from tests.integration.conftest import BROKER_SECRET, BrokerProcess

EARLIEST = -2
LATEST = -1
DEFAULT_TIMEOUT_S = 30.0
FETCH_PARTITION_BYTES = 1 << 20
CODECS: dict[str, int] = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


class ConsumedRecord(NamedTuple):
    """One record as a client consumed it."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True)
class StoredBatch:
    """One record batch exactly as a Fetch response carried it."""

    header: BatchHeader
    raw: bytes


def unique_topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def _connect(bootstrap: str) -> KafkaConnection:
    host, port = parse_bootstrap(bootstrap)[0]
    return await KafkaConnection.connect(host, port, client_id="raftlog-integration")


def admin_login(secret: str = BROKER_SECRET) -> ClusterLogin:
    """The cluster admin's login (operator tools): SCRAM keyed by ``raft.secret``."""
    return ClusterLogin(ClusterCredentials(secret), ADMIN_USER)


async def connect_admin(bootstrap: str, secret: str = BROKER_SECRET) -> KafkaConnection:
    host, port = parse_bootstrap(bootstrap)[0]
    return await KafkaConnection.connect(host, port, client_id="raftlog-integration",
                                         login=admin_login(secret))


# -- admin through the project's client ------------------------------------------------------


def create_topic(bootstrap: str, topic: str, partitions: int = 1,
                 configs: Mapping[str, str] | None = None) -> None:
    """CreateTopics through the project's client; raises on any error code."""

    async def run() -> None:
        connection = await _connect(bootstrap)
        try:
            body = {"topics": [{"name": topic, "num_partitions": partitions,
                                "replication_factor": 1, "assignments": [],
                                "configs": [{"name": k, "value": v}
                                            for k, v in (configs or {}).items()]}],
                    "timeout_ms": 10_000}
            response = await connection.request(CREATE_TOPICS, body)
            result = response.topics[0]
            if result.error_code:
                raise KafkaClientError(f"CreateTopics {topic}: "
                                       f"{ErrorCode(result.error_code).name} "
                                       f"{result.get('error_message')}")
        finally:
            await connection.aclose()

    trio.run(run)


def list_offsets(bootstrap: str, topic: str, partitions: Iterable[int],
                 timestamp: int) -> dict[int, int]:
    """ListOffsets (read-uncommitted) for ``timestamp`` (EARLIEST, LATEST or a time in ms)."""
    wanted = sorted(partitions)

    async def run() -> dict[int, int]:
        connection = await _connect(bootstrap)
        try:
            body = {"replica_id": -1, "isolation_level": 0, "topics": [{
                "name": topic,
                "partitions": [{"partition_index": p, "timestamp": timestamp} for p in wanted],
            }]}
            response = await connection.request(LIST_OFFSETS, body)
            out = {}
            for result in response.topics[0].partitions:
                if result.error_code:
                    raise KafkaClientError(f"ListOffsets {topic}-{result.partition_index}: "
                                           f"{ErrorCode(result.error_code).name}")
                out[result.partition_index] = result.offset
            return out
        finally:
            await connection.aclose()

    return trio.run(run)


def end_offsets(bootstrap: str, topic: str, partitions: Iterable[int]) -> dict[int, int]:
    return list_offsets(bootstrap, topic, partitions, LATEST)


def produce_raw(bootstrap: str, topic: str, partition: int, records: bytes,
                acks: int = -1) -> int:
    """Produce ``records`` (one or more v2 batches, as built by the caller) untouched through
    the project's client; returns the assigned base offset."""

    async def run() -> int:
        connection = await _connect(bootstrap)
        try:
            body = {"transactional_id": None, "acks": acks, "timeout_ms": 10_000,
                    "topic_data": [{"name": topic, "partition_data": [
                        {"index": partition, "records": records}]}]}
            response = await connection.request(PRODUCE, body)
            result = response.responses[0].partition_responses[0]
            if result.error_code:
                raise KafkaClientError(f"Produce {topic}-{partition}: "
                                       f"{ErrorCode(result.error_code).name}")
            base_offset: int = result.base_offset
            return base_offset
        finally:
            await connection.aclose()

    return trio.run(run)


# -- raw fetch ---------------------------------------------------------------------------------


def fetch_raw(bootstrap: str, topic: str, partition: int, start_offset: int = 0,
              timeout_s: float = DEFAULT_TIMEOUT_S) -> list[StoredBatch]:
    """Every complete batch from ``start_offset`` up to the high watermark, as served.

    Batches are parsed but not validated: callers run ``check_batch`` themselves so a CRC
    failure shows up as an assertion of the test that cares about it.
    """

    async def run() -> list[StoredBatch]:
        connection = await _connect(bootstrap)
        try:
            with trio.fail_after(timeout_s):
                return await _fetch_all(connection, topic, partition, start_offset)
        finally:
            await connection.aclose()

    return trio.run(run)


async def _fetch_all(connection: KafkaConnection, topic: str, partition: int,
                     start_offset: int) -> list[StoredBatch]:
    batches: list[StoredBatch] = []
    offset = start_offset
    while True:
        body = {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0,
                "max_bytes": 4 * FETCH_PARTITION_BYTES, "isolation_level": 0,
                "topics": [{"topic": topic, "partitions": [
                    {"partition": partition, "fetch_offset": offset,
                     "partition_max_bytes": FETCH_PARTITION_BYTES}]}]}
        response = await connection.request(FETCH, body)
        result = response.responses[0].partitions[0]
        if result.error_code:
            raise KafkaClientError(f"Fetch {topic}-{partition} at {offset}: "
                                   f"{ErrorCode(result.error_code).name}")
        if offset >= result.high_watermark:
            return batches
        records = bytes(result.records or b"")
        pos = 0
        progressed = False
        while pos + RECORD_BATCH_OVERHEAD <= len(records):
            header = parse_header(records, pos)
            end = pos + header.size_bytes
            if header.size_bytes <= 0 or end > len(records):
                break  # a partial trailing batch is allowed in a Fetch response
            if header.last_offset >= offset:
                batches.append(StoredBatch(header, records[pos:end]))
                offset = header.next_offset
                progressed = True
            pos = end
        if not progressed:
            raise AssertionError(f"Fetch {topic}-{partition} at {offset} (high watermark "
                                 f"{result.high_watermark}) returned no complete batch "
                                 f"({len(records)} bytes)")


def fetch_error(bootstrap: str, topic: str, partition: int, offset: int) -> ErrorCode:
    """The error code of a one-partition Fetch at ``offset`` (NONE when it succeeds)."""

    async def run() -> ErrorCode:
        connection = await _connect(bootstrap)
        try:
            body = {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 16,
                    "isolation_level": 0, "topics": [{"topic": topic, "partitions": [
                        {"partition": partition, "fetch_offset": offset,
                         "partition_max_bytes": 1 << 16}]}]}
            response = await connection.request(FETCH, body)
            return ErrorCode(response.responses[0].partitions[0].error_code)
        finally:
            await connection.aclose()

    return trio.run(run)


def check_batches(batches: Sequence[StoredBatch], start_offset: int = 0) -> None:
    """Every batch passes ``check_batch`` (structure + CRC-32C) and offsets are contiguous."""
    expected = start_offset
    for batch in batches:
        header = check_batch(batch.raw)
        assert header.base_offset == expected, (
            f"batch at {header.base_offset}, expected {expected}: gap or overlap")
        assert header.records_count == header.last_offset_delta + 1
        expected = header.next_offset


def decode_batches(batches: Sequence[StoredBatch]) -> list[Record]:
    """The records of ``batches``, compressed ones decompressed by the project's codec."""
    records: list[Record] = []
    for batch in batches:
        records.extend(decode_records(decompress_batches(batch.raw)))
    return records


def fetch_records(bootstrap: str, topic: str, partition: int) -> list[Record]:
    batches = fetch_raw(bootstrap, topic, partition)
    check_batches(batches)
    return decode_batches(batches)


# -- checks on consumed records ----------------------------------------------------------------


def by_partition(records: Iterable[ConsumedRecord]) -> dict[int, list[ConsumedRecord]]:
    out: dict[int, list[ConsumedRecord]] = defaultdict(list)
    for record in records:
        out[record.partition].append(record)
    return dict(out)


def assert_exactly_once_in_order(
    produced: Sequence[tuple[int, bytes, bytes]], consumed: Sequence[ConsumedRecord],
    acknowledged: Mapping[bytes, tuple[int, int]] | None = None,
) -> None:
    """``produced`` is (partition, key, value) in produce-call order, values unique.

    Checks: each value consumed exactly once, on the partition it was produced to, with its
    key; per partition, consumed order equals produce order and offsets are 0..n-1; with
    ``acknowledged`` (value -> (partition, offset) from the producer), the offsets match.
    """
    values = [value for _, _, value in produced]
    assert len(set(values)) == len(values), "test bug: produced values must be unique"
    consumed_values = [r.value for r in consumed]
    duplicates = len(consumed_values) - len(set(consumed_values))
    assert duplicates == 0, f"{duplicates} records consumed more than once"
    missing = set(values) - set(consumed_values)
    assert not missing, f"{len(missing)} records never consumed, e.g. {sorted(missing)[:3]}"
    unexpected = set(consumed_values) - set(values)
    assert not unexpected, f"{len(unexpected)} records consumed but never produced"

    expected_by_partition: dict[int, list[tuple[bytes, bytes]]] = defaultdict(list)
    for partition, key, value in produced:
        expected_by_partition[partition].append((key, value))
    got = by_partition(consumed)
    assert set(got) == set(expected_by_partition)
    for partition, expected in expected_by_partition.items():
        records = got[partition]
        assert [r.offset for r in records] == list(range(len(records))), (
            f"partition {partition}: offsets are not 0..{len(records) - 1}")
        assert [(r.key, r.value) for r in records] == expected, (
            f"partition {partition}: consumed order differs from produce order")
        if acknowledged is not None:
            for record in records:
                assert record.value is not None
                assert acknowledged[record.value] == (partition, record.offset)


def assert_key_partition_consistent(produced: Iterable[tuple[int, bytes, bytes]]) -> None:
    """The same key always landed on the same partition."""
    seen: dict[bytes, int] = {}
    for partition, key, _ in produced:
        assert seen.setdefault(key, partition) == partition, (
            f"key {key!r} on partitions {seen[key]} and {partition}")


def broker_log_problems(log_text: str) -> list[str]:
    """Lines of a broker log that report a crash or an error."""
    return [line for line in log_text.splitlines()
            if "Traceback" in line or " ERROR " in line or " CRITICAL " in line]


def start_broker(broker: BrokerProcess, attempts: int = 10) -> None:
    """``broker.start()``, retried while its fixed port is briefly held by someone else.

    The fixture restarts a broker on the port it had, and ``free_port`` draws that port from
    the ephemeral range: while the broker is down the kernel may hand the same number to an
    outgoing connection (any process's, or a client reconnecting to the broker, which then
    connects to itself). The broker fails to bind ("Address already in use") until that
    socket closes. Choosing ports outside the ephemeral range in conftest would remove this.
    """
    for attempt in range(attempts):
        try:
            broker.start()
            return
        except RuntimeError as exc:
            if "Address already in use" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(0.3)


# -- bounded waiting ---------------------------------------------------------------------------


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str,
               interval_s: float = 0.05) -> None:
    """Polls ``predicate()`` until it is true; fails the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


# -- confluent-kafka consumer --------------------------------------------------------------------


def confluent_consume(bootstrap: str, topic: str, partitions: Iterable[int],
                      timeout_s: float = DEFAULT_TIMEOUT_S,
                      extra_config: Mapping[str, Any] | None = None) -> list[ConsumedRecord]:
    """Assigns every partition from offset 0 and consumes up to the current end offsets.

    No consumer group is used (the broker has no group coordinator); confluent-kafka still
    requires a ``group.id``, which with ``assign`` and no commits is never contacted.
    """
    from confluent_kafka import Consumer, TopicPartition

    wanted = sorted(partitions)
    ends = end_offsets(bootstrap, topic, wanted)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "raftlog-assign-only",
                         "enable.auto.commit": False, "enable.auto.offset.store": False,
                         "auto.offset.reset": "error", **(extra_config or {})})
    out: list[ConsumedRecord] = []
    positions = dict.fromkeys(wanted, 0)
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in wanted])
        deadline = time.monotonic() + timeout_s
        while any(positions[p] < ends[p] for p in wanted):
            if time.monotonic() > deadline:
                raise AssertionError(f"consumed to {positions}, expected {ends}")
            for message in consumer.consume(num_messages=1000, timeout=0.5):
                error = message.error()
                if error is not None:
                    raise AssertionError(f"consumer error: {error}")
                partition = message.partition()
                offset = message.offset()
                assert partition is not None and offset is not None
                out.append(ConsumedRecord(partition, offset, message.key(), message.value()))
                positions[partition] = offset + 1
    finally:
        consumer.close()
    return out


# -- kafka-python consumer ---------------------------------------------------------------------


def kafka_python_consume(bootstrap: str, topic: str, partitions: Iterable[int],
                         timeout_s: float = DEFAULT_TIMEOUT_S) -> list[ConsumedRecord]:
    """kafka-python ``assign`` from the beginning (no group) up to the current end offsets."""
    from kafka import KafkaConsumer, TopicPartition

    wanted = sorted(partitions)
    total = sum(end_offsets(bootstrap, topic, wanted).values())
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                             enable_auto_commit=False, auto_offset_reset="earliest")
    out: list[ConsumedRecord] = []
    try:
        assignment = [TopicPartition(topic, p) for p in wanted]
        consumer.assign(assignment)
        consumer.seek_to_beginning(*assignment)
        deadline = time.monotonic() + timeout_s
        while len(out) < total:
            assert time.monotonic() < deadline, f"consumed {len(out)} of {total} records"
            for batch in consumer.poll(timeout_ms=500, max_records=5_000).values():
                out.extend(ConsumedRecord(m.partition, m.offset, m.key, m.value) for m in batch)
    finally:
        consumer.close(autocommit=False)
    return out


def read_values_to_end(bootstrap: str, topic: str, partitions: int, isolation: str,
                       *, timeout_s: float = 60) -> list[bytes]:
    """Every value of ``topic`` from offset 0 to each partition's end (the LSO for
    read_committed), read with confluent-kafka; fails if an end is not reached in time."""
    import confluent_kafka

    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": "raftlog-read-to-end",
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "isolation.level": isolation, "enable.partition.eof": True, "log_level": 2})
    out: list[bytes] = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0)
                         for p in range(partitions)])
        eof: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(eof) < partitions:
            assert time.monotonic() < deadline, f"{isolation}: only {eof} reached the end"
            for message in consumer.consume(num_messages=1000, timeout=0.5):
                error = message.error()
                if error is not None:
                    if error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                        eof.add(message.partition())
                        continue
                    raise AssertionError(f"consumer error: {error}")
                eof.discard(message.partition())
                out.append(message.value())
    finally:
        consumer.close()
    return out
