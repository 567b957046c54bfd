"""Admin and console tools over the project's own client (the `raftlog topics|produce|consume`
commands). Requests go to each partition's leader, found through Metadata."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from raftlog.client.connection import (
    PLAINTEXT,
    KafkaClientError,
    KafkaConnection,
    Security,
    connect_any,
)
from raftlog.controller.core import CONFIG_OP_DELETE, CONFIG_OP_SET, CONFIG_RESOURCE_TOPIC
from raftlog.partition.batch import (
    RECORD_BATCH_OVERHEAD,
    Record,
    build_batch,
    decode_records,
    parse_header,
)
from raftlog.partition.compression import decompress_batches
from raftlog.protocol.codec import Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import (
    CREATE_TOPICS,
    DELETE_TOPICS,
    DESCRIBE_CONFIGS,
    FETCH,
    INCREMENTAL_ALTER_CONFIGS,
    LIST_OFFSETS,
    METADATA,
    PRODUCE,
)

PRODUCE_BATCH_RECORDS_MAX = 500
FETCH_MAX_WAIT_MS = 500
FETCH_PARTITION_BYTES_MAX = 1 << 20
EARLIEST = -2
LATEST = -1


def murmur2(data: bytes) -> int:
    """Kafka's default partitioner hash (Utils.murmur2), so keys land where Java puts them."""
    seed, m, r = 0x9747B28C, 0x5BD1E995, 24
    length = len(data)
    h = (seed ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = length % 4
    base = length - tail
    if tail == 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def partition_for_key(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@dataclass
class Cluster:
    """Connections to the brokers of one cluster, by node id, plus the bootstrap one."""

    bootstrap: KafkaConnection
    brokers: dict[int, tuple[str, int]]
    connections: dict[int, KafkaConnection]

    # How every connection is made (``--command-config``): TLS, a user's SASL login, or the
    # cluster admin's (which proves the secret).
    security: Security = PLAINTEXT

    @classmethod
    async def connect(cls, bootstrap: str, security: Security = PLAINTEXT) -> Cluster:
        connection = await connect_any(bootstrap, security=security)
        return cls(connection, {}, {}, security)

    async def metadata(self, topics: Sequence[str] | None) -> Struct:
        body = {"topics": None if topics is None else [{"name": t} for t in topics],
                "allow_auto_topic_creation": False}
        response = await self.bootstrap.request(METADATA, body)
        self.brokers = {b.node_id: (b.host, b.port) for b in response.brokers}
        return response

    async def leader_connection(self, node_id: int) -> KafkaConnection:
        if node_id not in self.connections:
            if node_id not in self.brokers:
                raise KafkaClientError(f"leader {node_id} is not in the metadata")
            host, port = self.brokers[node_id]
            self.connections[node_id] = await KafkaConnection.connect(
                host, port, security=self.security)
        return self.connections[node_id]

    async def partition_leaders(self, topic: str) -> dict[int, int]:
        response = await self.metadata([topic])
        described = response.topics[0]
        if described.error_code:
            raise KafkaClientError(f"topic {topic!r}: {ErrorCode(described.error_code).name}")
        return {p.partition_index: p.leader_id for p in described.partitions}

    async def aclose(self) -> None:
        for connection in self.connections.values():
            await connection.aclose()
        await self.bootstrap.aclose()


# -- topics ----------------------------------------------------------------------------------


async def topics_command(
    bootstrap: str, action: str, topic: str | None, partitions: int, replication_factor: int,
    configs: Mapping[str, str], security: Security = PLAINTEXT,
) -> int:
    cluster = await Cluster.connect(bootstrap, security)
    try:
        if action == "list":
            response = await cluster.metadata(None)
            for described in sorted(response.topics, key=lambda t: t.name):
                print(described.name)
            return 0
        if topic is None:
            raise KafkaClientError(f"topics {action} needs --topic")
        if action == "create":
            return await _create_topic(cluster, topic, partitions, replication_factor, configs)
        if action == "delete":
            return await _delete_topic(cluster, topic)
        return await _describe_topic(cluster, topic)
    finally:
        await cluster.aclose()


async def _create_topic(cluster: Cluster, topic: str, partitions: int, replication_factor: int,
                        configs: Mapping[str, str]) -> int:
    body = {"topics": [{"name": topic, "num_partitions": partitions,
                        "replication_factor": replication_factor, "assignments": [],
                        "configs": [{"name": k, "value": v} for k, v in configs.items()]}],
            "timeout_ms": 30_000}
    response = await cluster.bootstrap.request(CREATE_TOPICS, body)
    result = response.topics[0]
    if result.error_code:
        print(f"Error creating topic {topic}: {ErrorCode(result.error_code).name}"
              f" {result.get('error_message') or ''}".rstrip(), file=sys.stderr)
        return 1
    print(f"Created topic {topic}.")
    return 0


async def _delete_topic(cluster: Cluster, topic: str) -> int:
    response = await cluster.bootstrap.request(DELETE_TOPICS, {"topic_names": [topic],
                                                               "timeout_ms": 30_000})
    code = response.responses[0].error_code
    if code:
        print(f"Error deleting topic {topic}: {ErrorCode(code).name}", file=sys.stderr)
        return 1
    print(f"Deleted topic {topic}.")
    return 0


async def _describe_topic(cluster: Cluster, topic: str) -> int:
    response = await cluster.metadata([topic])
    described = response.topics[0]
    if described.error_code:
        print(f"Error: topic {topic}: {ErrorCode(described.error_code).name}", file=sys.stderr)
        return 1
    configs = await cluster.bootstrap.request(DESCRIBE_CONFIGS, {"resources": [
        {"resource_type": CONFIG_RESOURCE_TOPIC, "resource_name": topic,
         "configuration_keys": None}]})
    overrides = [f"{c.name}={c.value}" for c in configs.results[0].configs
                 if c.config_source == 1]
    print(f"Topic: {topic}\tPartitionCount: {len(described.partitions)}\t"
          f"ReplicationFactor: {len(described.partitions[0].replica_nodes)}\t"
          f"Configs: {','.join(overrides)}")
    for p in sorted(described.partitions, key=lambda p: p.partition_index):
        print(f"\tTopic: {topic}\tPartition: {p.partition_index}\tLeader: {p.leader_id}\t"
              f"LeaderEpoch: {p.leader_epoch}\tReplicas: {','.join(map(str, p.replica_nodes))}"
              f"\tIsr: {','.join(map(str, p.isr_nodes))}")
    return 0


def parse_add_config(texts: Sequence[str]) -> dict[str, str]:
    """kafka-configs.sh's ``--add-config k1=v1,k2=[a,b]``: pairs split on commas outside
    square brackets, which hold list values (the brackets are dropped).

    Raises:
        KafkaClientError: an item is not KEY=VALUE.
    """
    out: dict[str, str] = {}
    for text in texts:
        items, depth, current = [], 0, ""
        for char in text:
            depth += {"[": 1, "]": -1}.get(char, 0)
            if char == "," and depth == 0:
                items.append(current)
                current = ""
            else:
                current += char
        items.append(current)
        for item in filter(str.strip, items):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise KafkaClientError(f"--add-config: {item!r} is not KEY=VALUE")
            value = value.strip()
            if value.startswith("[") and value.endswith("]"):
                value = value[1:-1]
            out[key.strip()] = value
    return out


async def alter_topic_configs(bootstrap: str, topic: str, add: Mapping[str, str],
                              delete: Sequence[str], security: Security = PLAINTEXT) -> int:
    """IncrementalAlterConfigs on one topic: SET each of ``add``, DELETE each of ``delete``
    (any broker takes it; a node that is not the controller forwards it)."""
    if not add and not delete:
        raise KafkaClientError("topics alter needs --add-config and/or --delete-config")
    configs = [{"name": k, "config_operation": CONFIG_OP_SET, "value": v}
               for k, v in add.items()]
    configs += [{"name": k, "config_operation": CONFIG_OP_DELETE, "value": None}
                for k in delete]
    connection = await connect_any(bootstrap, security=security)
    try:
        response = await connection.request(INCREMENTAL_ALTER_CONFIGS, {
            "resources": [{"resource_type": CONFIG_RESOURCE_TOPIC, "resource_name": topic,
                           "configs": configs}],
            "validate_only": False})
    finally:
        await connection.aclose()
    result = response.responses[0]
    if result.error_code:
        print(f"Error altering configs of topic {topic}: {ErrorCode(result.error_code).name}"
              f" {result.get('error_message') or ''}".rstrip(), file=sys.stderr)
        return 1
    print(f"Completed updating config for topic {topic}.")
    return 0


# -- console producer --------------------------------------------------------------------------


async def console_produce(bootstrap: str, topic: str, key_separator: str | None,
                          acks: int, security: Security = PLAINTEXT) -> int:
    cluster = await Cluster.connect(bootstrap, security)
    try:
        leaders = await cluster.partition_leaders(topic)
        producer = _Producer(cluster, topic, leaders, acks)
        stdin = trio.wrap_file(sys.stdin.buffer)
        async for line in stdin:
            producer.add(_split_line(line.rstrip(b"\r\n"), key_separator))
            if producer.pending >= PRODUCE_BATCH_RECORDS_MAX:
                await producer.flush()
        await producer.flush()
        print(f"produced {producer.sent} records to {topic}", file=sys.stderr)
        return 0
    finally:
        await cluster.aclose()


def _split_line(line: bytes, separator: str | None) -> tuple[bytes | None, bytes]:
    if separator is None:
        return None, line
    key, sep, value = line.partition(separator.encode())
    return (key, value) if sep else (None, line)


class _Producer:
    """Buffers records per partition and sends one batch per partition per request."""

    def __init__(self, cluster: Cluster, topic: str, leaders: dict[int, int], acks: int) -> None:
        self.cluster = cluster
        self.topic = topic
        self.leaders = leaders
        self.acks = acks
        self.buffers: dict[int, list[tuple[bytes | None, bytes | None, Sequence[Any]]]] = {}
        self.next_partition = 0
        self.pending = 0
        self.sent = 0

    def add(self, record: tuple[bytes | None, bytes]) -> None:
        key, value = record
        if key is not None:
            partition = partition_for_key(key, len(self.leaders))
        else:
            partition = self.next_partition
            self.next_partition = (self.next_partition + 1) % len(self.leaders)
        self.buffers.setdefault(partition, []).append((key, value, ()))
        self.pending += 1

    async def flush(self) -> None:
        by_leader: dict[int, list[dict[str, Any]]] = {}
        now = int(time.time() * 1000)
        for partition, records in self.buffers.items():
            batch = build_batch(records, timestamp_ms=now)
            by_leader.setdefault(self.leaders[partition], []).append(
                {"index": partition, "records": batch})
        for leader, partitions in by_leader.items():
            await self._send(leader, partitions)
        self.sent += self.pending
        self.buffers.clear()
        self.pending = 0

    async def _send(self, leader: int, partitions: list[dict[str, Any]]) -> None:
        connection = await self.cluster.leader_connection(leader)
        body = {"transactional_id": None, "acks": self.acks, "timeout_ms": 30_000,
                "topic_data": [{"name": self.topic, "partition_data": partitions}]}
        if self.acks == 0:
            raise KafkaClientError("acks=0 is not supported by the console producer")
        response = await connection.request(PRODUCE, body)
        for result in response.responses[0].partition_responses:
            if result.error_code:
                raise KafkaClientError(f"produce to {self.topic}-{result.index} failed: "
                                       f"{ErrorCode(result.error_code).name}")


# -- console consumer --------------------------------------------------------------------------


async def console_consume(bootstrap: str, topic: str, from_beginning: bool,
                          max_messages: int | None, timeout_ms: int | None, print_key: bool,
                          print_offset: bool, security: Security = PLAINTEXT) -> int:
    cluster = await Cluster.connect(bootstrap, security)
    try:
        leaders = await cluster.partition_leaders(topic)
        positions = await _start_positions(cluster, topic, leaders, from_beginning)
        printed = 0
        last_record = time.monotonic()
        while max_messages is None or printed < max_messages:
            records = await _fetch_once(cluster, topic, leaders, positions)
            for partition, record in records:
                _print_record(partition, record, print_key, print_offset)
                printed += 1
                if max_messages is not None and printed >= max_messages:
                    break
            if records:
                last_record = time.monotonic()
            elif timeout_ms is not None and (time.monotonic() - last_record) * 1000 > timeout_ms:
                break
        print(f"Processed a total of {printed} messages", file=sys.stderr)
        return 0
    finally:
        await cluster.aclose()


def _print_record(partition: int, record: Record, print_key: bool, print_offset: bool) -> None:
    parts = []
    if print_offset:
        parts.append(f"{partition}:{record.offset}")
    if print_key:
        parts.append((record.key or b"null").decode(errors="replace"))
    parts.append((record.value or b"null").decode(errors="replace"))
    sys.stdout.write("\t".join(parts) + "\n")
    sys.stdout.flush()


async def _start_positions(cluster: Cluster, topic: str, leaders: dict[int, int],
                           from_beginning: bool) -> dict[int, int]:
    positions = {}
    for partition, leader in leaders.items():
        connection = await cluster.leader_connection(leader)
        body = {"replica_id": -1, "isolation_level": 1, "topics": [{"name": topic, "partitions": [
            {"partition_index": partition, "timestamp": EARLIEST if from_beginning else LATEST}
        ]}]}
        response = await connection.request(LIST_OFFSETS, body)
        result = response.topics[0].partitions[0]
        if result.error_code:
            raise KafkaClientError(f"ListOffsets {topic}-{partition}: "
                                   f"{ErrorCode(result.error_code).name}")
        positions[partition] = result.offset
    return positions


async def _fetch_once(cluster: Cluster, topic: str, leaders: dict[int, int],
                      positions: dict[int, int]) -> list[tuple[int, Record]]:
    out: list[tuple[int, Record]] = []
    for leader in sorted(set(leaders.values())):
        mine = [p for p, node in leaders.items() if node == leader]
        connection = await cluster.leader_connection(leader)
        body = {"replica_id": -1, "max_wait_ms": FETCH_MAX_WAIT_MS, "min_bytes": 1,
                "max_bytes": 8 * FETCH_PARTITION_BYTES_MAX, "isolation_level": 1,
                "topics": [{"topic": topic, "partitions": [
                    {"partition": p, "fetch_offset": positions[p],
                     "partition_max_bytes": FETCH_PARTITION_BYTES_MAX} for p in mine]}]}
        response = await connection.request(FETCH, body)
        for result in response.responses[0].partitions:
            out.extend(_records_from(result, positions, topic))
    return out


def _records_from(result: Struct, positions: dict[int, int],
                  topic: str) -> list[tuple[int, Record]]:
    partition = result.partition_index
    if result.error_code:
        raise KafkaClientError(f"fetch {topic}-{partition}: {ErrorCode(result.error_code).name}")
    if not result.records:
        return []
    raw = decompress_batches(result.records)
    records = decode_records(raw)
    fresh = [(partition, r) for r in records if r.offset >= positions[partition]]
    # Advance past whole batches, control batches (transaction markers) included.
    positions[partition] = max(positions[partition], _next_offset(raw))
    return fresh


def _next_offset(raw: bytes) -> int:
    pos = 0
    next_offset = -1
    while pos + RECORD_BATCH_OVERHEAD <= len(raw):
        header = parse_header(raw, pos)
        next_offset = header.last_offset + 1
        pos += header.size_bytes
    return next_offset
