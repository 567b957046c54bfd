"""Bad input at the network edge of a real broker process.

Every case talks to one ``raftlog server`` process over raw sockets (or the project's client
where a well-formed request is needed). After *each* test an autouse fixture checks that the
process is alive, answers ApiVersions and Metadata, accepts and serves a produce/fetch round
trip, and still returns every record acknowledged so far (the ``_ACKED`` ledger), at the offset
it was acknowledged at. One broker serves the whole module, so the bad inputs also pile up on
it, as they would in production.

The broker runs with a small ``socket.request.max.bytes`` and ``connections.max.idle.ms`` so
the size-limit and idle cases are quick; the log lines the broker writes when it drops a
connection are matched by the client's own address (``127.0.0.1:<local port>``).
"""

from __future__ import annotations

import os
import random
import re
import struct
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import crc32c
import pytest
import trio

from raftlog.client.connection import KafkaConnection
from raftlog.partition.batch import build_batch, decode_records
from raftlog.protocol import codec
from raftlog.protocol.api_table import EVERY_API
from raftlog.protocol.codec import Api, Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import (
    API_VERSIONS,
    CREATE_PARTITIONS,
    CREATE_TOPICS,
    DELETE_TOPICS,
    FETCH,
    LIST_OFFSETS,
    METADATA,
    PRODUCE,
)
from tests.integration.conftest import BrokerProcess

REQUEST_BYTES_MAX = 64 * 1024  # socket.request.max.bytes
IDLE_MS = 1500  # connections.max.idle.ms
TOPIC = "edge"  # two partitions; the health check produces to partition 0
QUIET_PARTITION = 1  # only the tests that say so write here
SMALL_TOPIC = "small"  # max.message.bytes=1024
SMALL_MAX_MESSAGE_BYTES = 1024
REPO_ROOT = Path(__file__).resolve().parents[2]
RESPONSE_TIMEOUT_S = 5.0

_SIZE = struct.Struct(">i")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")

# (topic, partition, offset, value) of every record the broker acknowledged during the module.
_ACKED: list[tuple[str, int, int, bytes]] = []


# ---------------------------------------------------------------------------------------------
# The broker and the after-each-test health check


@pytest.fixture(scope="module")
def edge_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    _ACKED.clear()
    with pytest.MonkeyPatch.context() as patch:
        # The broker subprocess imports raftlog from the checkout, installed or not.
        patch.setenv("PYTHONPATH", os.pathsep.join(
            p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p))
        process = BrokerProcess(
            tmp_path_factory.mktemp("edge"),
            extra_properties={
                "socket.request.max.bytes": str(REQUEST_BYTES_MAX),
                "connections.max.idle.ms": str(IDLE_MS),
                "auto.create.topics.enable": "false",
            },
        )
        process.start()
    try:
        trio.run(_create_fixture_topics, process)
        yield process
    finally:
        process.stop()
        if os.environ.get("RAFTLOG_SHOW_BROKER_LOG"):
            print(process.log_path.read_text())


async def _create_fixture_topics(broker: BrokerProcess) -> None:
    async with await KafkaConnection.connect("127.0.0.1", broker.port) as client:
        response = await client.request(CREATE_TOPICS, {
            "topics": [
                {"name": TOPIC, "num_partitions": 2, "replication_factor": 1},
                {"name": SMALL_TOPIC, "num_partitions": 1, "replication_factor": 1,
                 "configs": [{"name": "max.message.bytes",
                              "value": str(SMALL_MAX_MESSAGE_BYTES)}]},
            ],
            "timeout_ms": 10_000,
        })
        assert [t.error_code for t in response.topics] == [0, 0], response


@pytest.fixture(autouse=True)
async def broker_survives(edge_broker: BrokerProcess) -> AsyncIterator[BrokerProcess]:
    """Yields the broker; afterwards checks it survived whatever the test sent."""
    yield edge_broker
    await assert_healthy(edge_broker)


async def assert_healthy(broker: BrokerProcess) -> None:
    assert broker.alive(), broker.log_path.read_text()[-4000:]
    with trio.fail_after(10):
        async with await KafkaConnection.connect("127.0.0.1", broker.port,
                                                 client_id="health") as client:
            assert client.versions[PRODUCE.key][1] >= 3  # ApiVersions answered
            metadata = await client.request(METADATA, {"topics": [{"name": TOPIC}]})
            assert metadata.brokers and metadata.brokers[0].port == broker.port
            assert metadata.topics[0].error_code == 0
            assert len(metadata.topics[0].partitions) == 2
            value = f"health-{len(_ACKED)}-{time.monotonic_ns()}".encode()
            offset = await produce_one(client, TOPIC, 0, value)
            _ACKED.append((TOPIC, 0, offset, value))
            for (topic, partition), expected in _acked_by_partition().items():
                stored = {r.offset: r.value for r in await fetch_all(client, topic, partition)}
                for record_offset, record_value in expected.items():
                    assert stored.get(record_offset) == record_value, (
                        f"acknowledged record {topic}-{partition}@{record_offset} lost")
    assert "after an internal error" not in broker.log_path.read_text(), (
        "a request reached a handler bug:\n" + broker.log_path.read_text()[-4000:])


def _acked_by_partition() -> dict[tuple[str, int], dict[int, bytes]]:
    out: dict[tuple[str, int], dict[int, bytes]] = {}
    for topic, partition, offset, value in _ACKED:
        out.setdefault((topic, partition), {})[offset] = value
    return out


# ---------------------------------------------------------------------------------------------
# Request building and well-formed client calls


def request_frame(
    api: Api, version: int, body: Mapping[str, Any], correlation_id: int,
    client_id: str | None = "bad-input",
) -> bytes:
    header = codec.RequestHeader(api.key, version, correlation_id, client_id)
    payload = codec.encode_request_header(header, api.is_flexible(version)) + codec.encode_bytes(
        api, version, body, is_request=True)
    return _SIZE.pack(len(payload)) + payload


def produce_request(
    topic: str, partition: int, records: bytes | None, *, acks: int = -1,
    timeout_ms: int = 10_000,
) -> dict[str, Any]:
    return {
        "transactional_id": None, "acks": acks, "timeout_ms": timeout_ms,
        "topic_data": [{"name": topic,
                        "partition_data": [{"index": partition, "records": records}]}],
    }


def fetch_request(
    topic: str, partition: int, offset: int, *, current_leader_epoch: int = -1,
    max_wait_ms: int = 0, min_bytes: int = 0,
) -> dict[str, Any]:
    return {
        "replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": min_bytes,
        "max_bytes": 50 * 1024 * 1024, "isolation_level": 0,
        "topics": [{"topic": topic, "partitions": [{
            "partition": partition, "current_leader_epoch": current_leader_epoch,
            "fetch_offset": offset, "log_start_offset": -1,
            "partition_max_bytes": 10 * 1024 * 1024}]}],
    }


def list_offsets_request(topic: str, partition: int, timestamp: int = -1) -> dict[str, Any]:
    return {"replica_id": -1, "isolation_level": 0, "topics": [{"name": topic, "partitions": [
        {"partition_index": partition, "current_leader_epoch": -1, "timestamp": timestamp}]}]}


def batch(*values: bytes, attributes: int = 0) -> bytes:
    return build_batch([(None, v, ()) for v in values], timestamp_ms=int(time.time() * 1000),
                       attributes=attributes)


async def produce_one(client: KafkaConnection, topic: str, partition: int, value: bytes) -> int:
    response = await client.request(PRODUCE, produce_request(topic, partition, batch(value)))
    result = response.responses[0].partition_responses[0]
    assert result.error_code == 0, result
    offset: int = result.base_offset
    return offset


async def fetch_all(client: KafkaConnection, topic: str, partition: int) -> list[Any]:
    response = await client.request(FETCH, fetch_request(topic, partition, 0))
    result = response.responses[0].partitions[0]
    assert result.error_code == 0, result
    return decode_records(bytes(result.records or b""))


async def latest_offset(client: KafkaConnection, topic: str, partition: int) -> int:
    response = await client.request(LIST_OFFSETS, list_offsets_request(topic, partition))
    result = response.topics[0].partitions[0]
    assert result.error_code == 0, result
    offset: int = result.offset
    return offset


@asynccontextmanager
async def client_for(broker: BrokerProcess) -> AsyncIterator[KafkaConnection]:
    async with await KafkaConnection.connect("127.0.0.1", broker.port,
                                             client_id="bad-input") as client:
        yield client


# ---------------------------------------------------------------------------------------------
# Raw connections


class RawConnection:
    """A TCP connection that sends exactly the bytes it is given."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        host, port = stream.socket.getsockname()[:2]
        self.peer = f"{host}:{port}"  # how the broker names us in its log
        self._buffer = bytearray()

    @classmethod
    async def open(cls, broker: BrokerProcess) -> RawConnection:
        return cls(await trio.open_tcp_stream("127.0.0.1", broker.port))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def request(
        self, api: Api, version: int, body: Mapping[str, Any], correlation_id: int
    ) -> Struct:
        await self.send(request_frame(api, version, body, correlation_id))
        return await self.response(api, version, correlation_id)

    async def response(self, api: Api, version: int, correlation_id: int) -> Struct:
        frame = await self.read_frame()
        assert frame is not None, f"connection closed instead of answering {api.name}"
        return decode_response(frame, api, version, correlation_id)

    async def read_frame(self, timeout_s: float = RESPONSE_TIMEOUT_S) -> bytes | None:
        """The next response frame, or None if the broker closed the connection."""
        with trio.fail_after(timeout_s):
            prefix = await self._read_exactly(4)
            if prefix is None:
                return None
            (size,) = _SIZE.unpack(prefix)
            assert 4 <= size <= 64 * 1024 * 1024, size
            frame = await self._read_exactly(size)
            assert frame is not None, "broker closed the connection mid-response"
            return frame

    async def _read_exactly(self, size: int) -> bytes | None:
        while len(self._buffer) < size:
            try:
                chunk = await self.stream.receive_some(65536)
            except trio.BrokenResourceError:  # reset by the broker: closed as well
                chunk = b""
            if not chunk:
                if self._buffer:
                    raise AssertionError(f"EOF after {len(self._buffer)} of {size} bytes")
                return None
            self._buffer += chunk
        out = bytes(self._buffer[:size])
        del self._buffer[:size]
        return out

    async def expect_closed(self, timeout_s: float = RESPONSE_TIMEOUT_S) -> None:
        frame = await self.read_frame(timeout_s)
        assert frame is None, f"expected the broker to close, got a {len(frame)}-byte frame"

    async def send_eof(self) -> None:
        """Half-closes (no more requests); fine if the broker already hung up."""
        with suppress(trio.BrokenResourceError):
            await self.stream.send_eof()

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def __aenter__(self) -> RawConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def decode_response(frame: bytes, api: Api, version: int, correlation_id: int) -> Struct:
    view = memoryview(frame)
    flexible_header = api.is_flexible(version) and api is not API_VERSIONS
    received, pos = codec.decode_response_header(view, flexible_header)
    assert received == correlation_id, f"correlation id {received}, expected {correlation_id}"
    return codec.decode(api, version, view[pos:], is_request=False)


async def wait_for_log(broker: BrokerProcess, peer: str, pattern: str) -> str:
    """The broker log line about ``peer`` matching ``pattern`` (a regex), within 3 s."""
    regex = re.compile(pattern)
    deadline = trio.current_time() + 3
    while True:
        lines = [line for line in broker.log_path.read_text().splitlines() if peer in line]
        for line in lines:
            if regex.search(line):
                return line
        if trio.current_time() > deadline:
            raise AssertionError(f"no log line for {peer} matching {pattern!r}; got {lines}")
        await trio.sleep(0.02)


async def expect_dropped(broker: BrokerProcess, raw: RawConnection, pattern: str) -> str:
    await raw.expect_closed()
    return await wait_for_log(broker, raw.peer, r"closing connection from .*" + pattern)


# ---------------------------------------------------------------------------------------------
# Framing: garbage, sizes, truncation, silence


async def test_http_request_is_refused_by_its_size_prefix(broker_survives: BrokerProcess) -> None:
    # "GET " read as a big-endian int32 is 1195725856 bytes: far over the limit.
    async with await RawConnection.open(broker_survives) as raw:
        await raw.send(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        await expect_dropped(broker_survives, raw, r"frame of 1195725856 bytes outside \[8, ")


@pytest.mark.parametrize("seed", range(5))
async def test_random_garbage_closes_the_connection(
    broker_survives: BrokerProcess, seed: int
) -> None:
    rng = random.Random(seed)
    async with await RawConnection.open(broker_survives) as raw:
        await raw.send(rng.randbytes(rng.randrange(4, 512)))
        await raw.send_eof()  # a short garbage frame must not wait for more bytes
        # Whatever the garbage said (a wild size, an unknown key, a frame cut short by the
        # EOF), the broker closes and says why.
        await expect_dropped(broker_survives, raw, ".+")


async def test_size_prefix_followed_by_garbage(broker_survives: BrokerProcess) -> None:
    rng = random.Random(7)
    # An unknown API key in the garbage.
    async with await RawConnection.open(broker_survives) as raw:
        garbage = struct.pack(">hhi", 12345, 0, 1) + rng.randbytes(92)
        await raw.send(_SIZE.pack(len(garbage)) + garbage)
        await expect_dropped(broker_survives, raw, "unknown API key 12345")
    await assert_healthy(broker_survives)
    # A real API and version, then garbage where the body should be.
    async with await RawConnection.open(broker_survives) as raw:
        garbage = struct.pack(">hhih", PRODUCE.key, 8, 2, 3) + b"bad" + rng.randbytes(200)
        await raw.send(_SIZE.pack(len(garbage)) + garbage)
        await expect_dropped(broker_survives, raw, "malformed Produce v8 request")


async def test_frame_over_request_max_bytes_is_refused_unread(
    broker_survives: BrokerProcess,
) -> None:
    broker = broker_survives
    async with await RawConnection.open(broker) as raw:
        # Only the size prefix is sent: the broker must decide from it alone, at once.
        started = trio.current_time()
        await raw.send(_SIZE.pack(REQUEST_BYTES_MAX + 1))
        await expect_dropped(broker, raw, rf"frame of {REQUEST_BYTES_MAX + 1} bytes outside "
                                          rf"\[8, {REQUEST_BYTES_MAX}\] \(socket.request.max")
        assert trio.current_time() - started < IDLE_MS / 1000 / 2
    await assert_healthy(broker)
    # A 1 GiB announcement must not make the broker allocate 1 GiB first.
    peak_before = _vm_peak_kib(broker)
    async with await RawConnection.open(broker) as raw:
        await raw.send(_SIZE.pack(1 << 30) + b"\x00" * 1000)
        await expect_dropped(broker, raw, rf"frame of {1 << 30} bytes outside")
    if peak_before is not None:
        peak_after = _vm_peak_kib(broker)
        assert peak_after is not None
        assert peak_after - peak_before < 256 * 1024, "the broker reserved the oversized frame"


def _vm_peak_kib(broker: BrokerProcess) -> int | None:
    assert broker.process is not None
    try:
        status = Path(f"/proc/{broker.process.pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmPeak:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) if match else None


async def test_frame_of_exactly_request_max_bytes_is_served(
    broker_survives: BrokerProcess,
) -> None:
    overhead = len(request_frame(PRODUCE, 8, produce_request(TOPIC, 0, batch(b"")), 1)) - 4
    value = b"x" * (REQUEST_BYTES_MAX - overhead)
    for _ in range(8):  # the record's varint length prefix grows with the value
        frame = request_frame(PRODUCE, 8, produce_request(TOPIC, 0, batch(value)), 1)
        excess = len(frame) - 4 - REQUEST_BYTES_MAX
        if excess == 0:
            break
        value = value[:len(value) - excess]
    assert len(frame) - 4 == REQUEST_BYTES_MAX
    async with await RawConnection.open(broker_survives) as raw:
        await raw.send(frame)
        response = await raw.response(PRODUCE, 8, 1)
    result = response.responses[0].partition_responses[0]
    assert result.error_code == 0, result
    _ACKED.append((TOPIC, 0, result.base_offset, value))


@pytest.mark.parametrize("size", [-1, -(2**31), 0, 1, 4, 7])
async def test_negative_or_tiny_size_prefix(broker_survives: BrokerProcess, size: int) -> None:
    async with await RawConnection.open(broker_survives) as raw:
        await raw.send(_SIZE.pack(size) + b"\x00" * 8)
        await expect_dropped(broker_survives, raw, rf"frame of {size} bytes outside \[8, ")


async def test_truncated_request_body(broker_survives: BrokerProcess) -> None:
    broker = broker_survives
    full = request_frame(PRODUCE, 8, produce_request(TOPIC, QUIET_PARTITION,
                                                     batch(b"cut short")), 5)[4:]
    async with client_for(broker) as client:
        before = await latest_offset(client, TOPIC, QUIET_PARTITION)
        # A complete frame whose body stops half way through the Produce request.
        for cut in (len(full) // 2, 11, len(full) - 1):
            async with await RawConnection.open(broker) as raw:
                await raw.send(_SIZE.pack(cut) + full[:cut])
                await expect_dropped(broker, raw, "malformed Produce v8 request")
            await assert_healthy(broker)
        # A size prefix promising the whole request, then the client gives up half way.
        async with await RawConnection.open(broker) as raw:
            await raw.send(_SIZE.pack(len(full)) + full[: len(full) // 2])
            await raw.send_eof()
            await expect_dropped(broker, raw, "peer closed the connection mid-frame")
        assert await latest_offset(client, TOPIC, QUIET_PARTITION) == before


async def test_silent_half_frame_does_not_block_others(broker_survives: BrokerProcess) -> None:
    broker = broker_survives
    async with await RawConnection.open(broker) as stalled, \
            await RawConnection.open(broker) as silent:
        started = trio.current_time()
        await stalled.send(_SIZE.pack(100) + b"\x00\x12\x00\x00")
        # While both sit there, other clients are served normally.
        for _ in range(3):
            await assert_healthy(broker)
        assert trio.current_time() - started < IDLE_MS / 1000, "health checks were too slow"
        await stalled.expect_closed(timeout_s=IDLE_MS / 1000 + 3)
        await silent.expect_closed(timeout_s=IDLE_MS / 1000 + 3)
        assert trio.current_time() - started >= IDLE_MS / 1000 * 0.9
    await wait_for_log(broker, stalled.peer, r"closing connection from .*only part of a "
                                             r"100-byte request arrived within 1.5 s")
    await wait_for_log(broker, silent.peer, r"closing connection from .*idle for 1.5 s "
                                            r"\(connections.max.idle.ms\)")


# ---------------------------------------------------------------------------------------------
# API keys and versions


@pytest.mark.parametrize("key", [-1, 57, 9999, 32767])
async def test_unknown_api_key(broker_survives: BrokerProcess, key: int) -> None:
    async with await RawConnection.open(broker_survives) as raw:
        payload = struct.pack(">hhih", key, 0, 42, -1)
        await raw.send(_SIZE.pack(len(payload)) + payload)
        await expect_dropped(broker_survives, raw, rf"unknown API key {key} \(v0, correlation 42")


@pytest.mark.parametrize(("api", "version"), [
    (FETCH, 3), (FETCH, 12), (METADATA, 13), (PRODUCE, 9), (LIST_OFFSETS, 0),
    (CREATE_TOPICS, 5), (METADATA, -1),
])
async def test_unsupported_version_of_known_api(
    broker_survives: BrokerProcess, api: Api, version: int
) -> None:
    async with await RawConnection.open(broker_survives) as raw:
        payload = struct.pack(">hhih", api.key, version, 9, -1) + b"\x00" * 16
        await raw.send(_SIZE.pack(len(payload)) + payload)
        await expect_dropped(broker_survives, raw, f"unsupported {api.name} version {version}")


@pytest.mark.parametrize("version", [4, 99, -1])
async def test_api_versions_too_new_gets_v0_error_and_stays_open(
    broker_survives: BrokerProcess, version: int
) -> None:
    async with await RawConnection.open(broker_survives) as raw:
        # KIP-511: the broker must not parse the body of a version it does not know.
        payload = struct.pack(">hhih", API_VERSIONS.key, version, 77, 4) + b"test" + b"\xff" * 9
        await raw.send(_SIZE.pack(len(payload)) + payload)
        answer = await raw.response(API_VERSIONS, 0, 77)
        assert answer.error_code == ErrorCode.UNSUPPORTED_VERSION
        ranges = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
        assert ranges[API_VERSIONS.key] == (0, 3)
        assert ranges[PRODUCE.key] == (0, 8)
        # Every client-facing API this broker serves, and none of the internal
        # broker-to-controller ones.
        assert set(ranges) <= {api.key for api in EVERY_API if not api.internal}
        assert {0, 1, 2, 3, 10, 18, 19, 20, 32, 37} <= set(ranges)
        # SASL (SaslHandshake v0-1: librdkafka needs v0 in the range) and the SCRAM admin APIs.
        assert ranges[17] == (0, 1) and ranges[36] == (0, 2)
        assert ranges[50] == ranges[51] == (0, 0)
        assert ranges[48] == ranges[49] == (0, 1)  # the client quota APIs
        # The client retries within the advertised range on the same connection.
        for retry, correlation_id in ((0, 78), (3, 79)):
            body = {"client_software_name": "bad-input", "client_software_version": "1"}
            retried = await raw.request(API_VERSIONS, retry, body, correlation_id)
            assert retried.error_code == 0
            assert {k.api_key for k in retried.api_keys} == set(ranges)


async def test_produce_v0_to_v2_is_unsupported_per_partition(
    broker_survives: BrokerProcess,
) -> None:
    broker = broker_survives
    async with client_for(broker) as client:
        before = await latest_offset(client, TOPIC, 0)
        async with await RawConnection.open(broker) as raw:
            for version in (0, 1, 2):
                body = {"acks": -1, "timeout_ms": 5000, "topic_data": [{
                    "name": TOPIC, "partition_data": [
                        {"index": 0, "records": batch(b"old")},
                        {"index": 1, "records": batch(b"old")}]}]}
                response = await raw.request(PRODUCE, version, body, 100 + version)
                codes = [p.error_code for p in response.responses[0].partition_responses]
                assert codes == [ErrorCode.UNSUPPORTED_VERSION] * 2, (version, response)
        assert await latest_offset(client, TOPIC, 0) == before


async def test_produce_v2_with_acks_0_does_not_desynchronise(
    broker_survives: BrokerProcess,
) -> None:
    """An acks=0 producer reads no Produce response; an answer would shift every later one."""
    async with await RawConnection.open(broker_survives) as raw:
        body = {"acks": 0, "timeout_ms": 5000, "topic_data": [
            {"name": TOPIC, "partition_data": [{"index": 0, "records": batch(b"old")}]}]}
        await raw.send(request_frame(PRODUCE, 2, body, 1)
                       + request_frame(API_VERSIONS, 0, {}, 2))
        # Not a Produce response nobody reads: the broker disconnects, which is how Kafka
        # reports a failed acks=0 produce.
        await expect_dropped(broker_survives, raw, "Produce v2 with acks=0 is not supported")


# ---------------------------------------------------------------------------------------------
# Produce validation: nothing is appended on any error


def _recrc(buf: bytearray) -> bytes:
    _UINT32.pack_into(buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf)


def _patched(offset: int, fmt: str, value: int, *, recrc: bool) -> Callable[[bytes], bytes]:
    def corrupt(good: bytes) -> bytes:
        buf = bytearray(good)
        struct.pack_into(fmt, buf, offset, value)
        return _recrc(buf) if recrc else bytes(buf)

    return corrupt


def _flip_payload_byte(good: bytes) -> bytes:
    buf = bytearray(good)
    buf[-3] ^= 0x40
    return bytes(buf)


def _legacy_v1_message(good: bytes) -> bytes:
    """A magic 1 message (pre-0.11 format) whose timestamp has bit 0x10 at batch byte 22."""
    del good
    value = b"legacy message with a long enough value to exceed 61 bytes"
    body = struct.pack(">bbqi", 1, 0, 0x0000_0190_1234_5678, -1)
    body += struct.pack(">i", len(value)) + value
    message = struct.pack(">I", zlib.crc32(body)) + body
    return struct.pack(">qi", 0, len(message)) + message


_GOOD = batch(b"first", b"second", b"third")
_CORRUPTIONS: dict[str, tuple[Callable[[bytes], bytes], ErrorCode]] = {
    "bad crc (payload flipped)": (_flip_payload_byte, ErrorCode.CORRUPT_MESSAGE),
    "bad crc (crc field)": (_patched(17, ">I", 0xDEADBEEF, recrc=False),
                            ErrorCode.CORRUPT_MESSAGE),
    "batchLength past the buffer": (_patched(8, ">i", len(_GOOD), recrc=False),
                                    ErrorCode.CORRUPT_MESSAGE),
    "batchLength shorter than the header": (_patched(8, ">i", 20, recrc=False),
                                            ErrorCode.CORRUPT_MESSAGE),
    "batchLength negative": (_patched(8, ">i", -1, recrc=False), ErrorCode.CORRUPT_MESSAGE),
    "batch cut short": (lambda good: good[:-4], ErrorCode.CORRUPT_MESSAGE),
    "shorter than a batch header": (lambda good: good[:30], ErrorCode.CORRUPT_MESSAGE),
    "trailing bytes after a batch": (lambda good: good + b"\x00" * 5,
                                     ErrorCode.CORRUPT_MESSAGE),
    "good batch then a corrupt one": (lambda good: good + _flip_payload_byte(good),
                                      ErrorCode.CORRUPT_MESSAGE),
    "magic 1 in a v2 layout": (_patched(16, ">b", 1, recrc=False), ErrorCode.CORRUPT_MESSAGE),
    "magic 0": (_patched(16, ">b", 0, recrc=False), ErrorCode.CORRUPT_MESSAGE),
    "magic 3": (_patched(16, ">b", 3, recrc=False), ErrorCode.CORRUPT_MESSAGE),
    "legacy magic 1 message": (_legacy_v1_message, ErrorCode.CORRUPT_MESSAGE),
    "recordsCount > lastOffsetDelta + 1": (_patched(57, ">i", 4, recrc=True),
                                           ErrorCode.INVALID_RECORD),
    "lastOffsetDelta too small": (_patched(23, ">i", 0, recrc=True), ErrorCode.INVALID_RECORD),
    "recordsCount 0": (lambda good: _patched(57, ">i", 0, recrc=True)(
        _patched(23, ">i", -1, recrc=True)(good)), ErrorCode.INVALID_RECORD),
    "control batch from a client": (lambda good: batch(b"marker", attributes=0x20),
                                    ErrorCode.INVALID_RECORD),
    "empty record set": (lambda good: b"", ErrorCode.INVALID_RECORD),
    "transactional batch outside a transaction": (
        lambda good: build_batch([(None, b"t", ())], producer_id=7, producer_epoch=0,
                                 base_sequence=0, attributes=0x10),
        ErrorCode.INVALID_TXN_STATE),
}


async def test_the_good_batch_is_accepted(broker_survives: BrokerProcess) -> None:
    """The control case for the corruptions below: the unmodified batch is valid."""
    async with client_for(broker_survives) as client:
        response = await client.request(PRODUCE, produce_request(TOPIC, 0, _GOOD))
        result = response.responses[0].partition_responses[0]
        assert result.error_code == 0
        for delta, value in enumerate((b"first", b"second", b"third")):
            _ACKED.append((TOPIC, 0, result.base_offset + delta, value))


@pytest.mark.parametrize("case", sorted(_CORRUPTIONS))
async def test_bad_batch_is_rejected_and_not_appended(
    broker_survives: BrokerProcess, case: str
) -> None:
    corrupt, expected = _CORRUPTIONS[case]
    async with client_for(broker_survives) as client:
        before = await latest_offset(client, TOPIC, 0)
        response = await client.request(PRODUCE, produce_request(TOPIC, 0, corrupt(_GOOD)))
        result = response.responses[0].partition_responses[0]
        assert result.error_code == expected, result
        assert result.base_offset == -1
        assert result.error_message, "v8 responses say what was wrong"
        assert await latest_offset(client, TOPIC, 0) == before


async def test_null_records_are_rejected(broker_survives: BrokerProcess) -> None:
    async with client_for(broker_survives) as client:
        before = await latest_offset(client, TOPIC, 0)
        response = await client.request(PRODUCE, produce_request(TOPIC, 0, None))
        assert response.responses[0].partition_responses[0].error_code == (
            ErrorCode.INVALID_RECORD)
        assert await latest_offset(client, TOPIC, 0) == before


async def test_batch_over_max_message_bytes(broker_survives: BrokerProcess) -> None:
    async with client_for(broker_survives) as client:
        before = await latest_offset(client, SMALL_TOPIC, 0)
        big = batch(b"y" * (2 * SMALL_MAX_MESSAGE_BYTES))
        response = await client.request(PRODUCE, produce_request(SMALL_TOPIC, 0, big))
        result = response.responses[0].partition_responses[0]
        assert result.error_code == ErrorCode.MESSAGE_TOO_LARGE, result
        assert await latest_offset(client, SMALL_TOPIC, 0) == before
        # Just under the limit is fine.
        fits = batch(b"y" * (SMALL_MAX_MESSAGE_BYTES - 100))
        assert len(fits) <= SMALL_MAX_MESSAGE_BYTES
        response = await client.request(PRODUCE, produce_request(SMALL_TOPIC, 0, fits))
        result = response.responses[0].partition_responses[0]
        assert result.error_code == 0, result
        _ACKED.append((SMALL_TOPIC, 0, result.base_offset, b"y" * (SMALL_MAX_MESSAGE_BYTES - 100)))


@pytest.mark.parametrize("acks", [5, 2, -2, 32767])
async def test_invalid_acks(broker_survives: BrokerProcess, acks: int) -> None:
    async with client_for(broker_survives) as client:
        before = await latest_offset(client, TOPIC, 0)
        response = await client.request(
            PRODUCE, produce_request(TOPIC, 0, batch(b"bad acks"), acks=acks))
        result = response.responses[0].partition_responses[0]
        assert result.error_code == ErrorCode.INVALID_REQUIRED_ACKS
        assert await latest_offset(client, TOPIC, 0) == before


@pytest.mark.parametrize(("topic", "partition"), [
    ("no-such-topic", 0), (TOPIC, 2), (TOPIC, -1), (TOPIC, 2**31 - 1),
])
async def test_produce_to_missing_partition(
    broker_survives: BrokerProcess, topic: str, partition: int
) -> None:
    async with client_for(broker_survives) as client:
        response = await client.request(
            PRODUCE, produce_request(topic, partition, batch(b"nowhere")))
        result = response.responses[0].partition_responses[0]
        assert result.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        metadata = await client.request(METADATA, {"topics": [{"name": "no-such-topic"}]})
        assert metadata.topics[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


# ---------------------------------------------------------------------------------------------
# Fetch


@pytest.mark.parametrize(("topic", "partition"), [("no-such-topic", 0), (TOPIC, 2), (TOPIC, -1)])
async def test_fetch_missing_partition(
    broker_survives: BrokerProcess, topic: str, partition: int
) -> None:
    async with client_for(broker_survives) as client:
        response = await client.request(FETCH, fetch_request(topic, partition, 0))
        result = response.responses[0].partitions[0]
        assert result.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert result.records == b""  # empty as in Kafka: librdkafka cannot parse a null one
        listed = await client.request(LIST_OFFSETS, list_offsets_request(topic, partition))
        assert listed.topics[0].partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_fetch_offset_out_of_range(broker_survives: BrokerProcess) -> None:
    async with client_for(broker_survives) as client:
        await produce_one_acked(client, TOPIC, 0, b"range")
        end = await latest_offset(client, TOPIC, 0)
        # At the log end: fine, and empty.
        response = await client.request(FETCH, fetch_request(TOPIC, 0, end))
        assert response.responses[0].partitions[0].error_code == 0
        # Past the log end and below the log start (0 here: retention never ran).
        for offset in (end + 1, end + 1000, 2**63 - 1, -1, -(2**63)):
            response = await client.request(FETCH, fetch_request(TOPIC, 0, offset))
            result = response.responses[0].partitions[0]
            assert result.error_code == ErrorCode.OFFSET_OUT_OF_RANGE, (offset, result)
            assert result.high_watermark == end
            assert result.log_start_offset == 0


async def test_fetch_with_wrong_leader_epoch(broker_survives: BrokerProcess) -> None:
    async with client_for(broker_survives) as client:
        metadata = await client.request(METADATA, {"topics": [{"name": TOPIC}]})
        epoch = metadata.topics[0].partitions[0].leader_epoch
        assert epoch >= 0
        for version in (9, 11):
            response = await client.request(
                FETCH, fetch_request(TOPIC, 0, 0, current_leader_epoch=epoch), version=version)
            assert response.responses[0].partitions[0].error_code == 0
            response = await client.request(
                FETCH, fetch_request(TOPIC, 0, 0, current_leader_epoch=epoch + 1),
                version=version)
            assert response.responses[0].partitions[0].error_code == (
                ErrorCode.UNKNOWN_LEADER_EPOCH)
            # A single-node cluster never moves leadership, so the epoch is 0 and no older
            # epoch exists here; FENCED_LEADER_EPOCH is checked in tests/unit/test_server.py.
            if epoch > 0:
                response = await client.request(
                    FETCH, fetch_request(TOPIC, 0, 0, current_leader_epoch=epoch - 1),
                    version=version)
                assert response.responses[0].partitions[0].error_code == (
                    ErrorCode.FENCED_LEADER_EPOCH)
        # Before v9 the field does not exist: the epoch is not checked.
        response = await client.request(
            FETCH, fetch_request(TOPIC, 0, 0, current_leader_epoch=epoch + 1), version=8)
        assert response.responses[0].partitions[0].error_code == 0


async def produce_one_acked(
    client: KafkaConnection, topic: str, partition: int, value: bytes
) -> int:
    offset = await produce_one(client, topic, partition, value)
    _ACKED.append((topic, partition, offset, value))
    return offset


# ---------------------------------------------------------------------------------------------
# Pipelining and acks=0


async def test_pipelined_requests_answered_in_order(broker_survives: BrokerProcess) -> None:
    broker = broker_survives
    async with client_for(broker) as client:
        quiet_end = await latest_offset(client, TOPIC, QUIET_PARTITION)
    plan: list[tuple[Api, int, dict[str, Any]]] = [
        # A long poll on a partition nobody writes to: answered only after max_wait_ms.
        (FETCH, 11, fetch_request(TOPIC, QUIET_PARTITION, quiet_end, max_wait_ms=500,
                                  min_bytes=1)),
        (API_VERSIONS, 3, {"client_software_name": "p", "client_software_version": "1"}),
    ]
    values = [f"pipelined-{i}".encode() for i in range(6)]
    for i in range(18):
        match i % 6:
            case 0:
                plan.append((METADATA, 8, {"topics": [{"name": TOPIC}]}))
            case 1:
                plan.append((PRODUCE, 8, produce_request(TOPIC, 0, batch(values[i // 3]))))
            case 2:
                plan.append((LIST_OFFSETS, 5, list_offsets_request(TOPIC, 0)))
            case 3:
                plan.append((PRODUCE, 8, produce_request(TOPIC, 0, batch(values[i // 3]),
                                                        acks=1)))
            case 4:
                plan.append((FETCH, 4, fetch_request(TOPIC, 0, 0)))
            case _:
                plan.append((API_VERSIONS, 0, {}))
    assert len(plan) == 20
    async with await RawConnection.open(broker) as raw:
        started = trio.current_time()
        await raw.send(b"".join(request_frame(api, version, body, 1000 + i)
                                for i, (api, version, body) in enumerate(plan)))
        answers = []
        for i, (api, version, _) in enumerate(plan):
            answers.append(await raw.response(api, version, 1000 + i))
            if i == 0:
                # Nothing, not even the instant ApiVersions, overtook the long poll.
                assert trio.current_time() - started >= 0.45
    long_poll = answers[0].responses[0].partitions[0]
    assert long_poll.error_code == 0 and not long_poll.records
    assert answers[1].error_code == 0
    offsets = []
    for (api, _, body), answer in zip(plan, answers, strict=True):
        if api is PRODUCE:
            result = answer.responses[0].partition_responses[0]
            assert result.error_code == 0
            offsets.append(result.base_offset)
            value = bytes(body["topic_data"][0]["partition_data"][0]["records"])
            _ACKED.append((TOPIC, 0, result.base_offset,
                           decode_records(value)[0].value or b""))
    # The produces appended in the order they were sent.
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)


async def test_acks_0_produce_gets_no_response(broker_survives: BrokerProcess) -> None:
    broker = broker_survives
    async with client_for(broker) as client:
        before = await latest_offset(client, TOPIC, 0)
        async with await RawConnection.open(broker) as raw:
            frames = [request_frame(PRODUCE, 8, produce_request(TOPIC, 0, batch(b"fire"),
                                                                acks=0), 1),
                      request_frame(API_VERSIONS, 0, {}, 2),
                      request_frame(PRODUCE, 8, produce_request(TOPIC, 0, batch(b"forget"),
                                                                acks=0), 3),
                      request_frame(PRODUCE, 8, produce_request(TOPIC, 0, batch(b"forget"),
                                                                acks=0), 4),
                      request_frame(METADATA, 8, {"topics": [{"name": TOPIC}]}, 5)]
            await raw.send(b"".join(frames))
            await raw.response(API_VERSIONS, 0, 2)
            await raw.response(METADATA, 8, 5)
            await raw.send(request_frame(API_VERSIONS, 3, {}, 6))
            await raw.response(API_VERSIONS, 3, 6)
        for _ in range(250):  # acks=0 is not acknowledged, but it is appended
            if await latest_offset(client, TOPIC, 0) == before + 3:
                break
            await trio.sleep(0.02)
        assert await latest_offset(client, TOPIC, 0) == before + 3


async def test_acks_0_produce_error_closes_the_connection(
    broker_survives: BrokerProcess,
) -> None:
    """Kafka's way to tell an acks=0 producer that something went wrong: disconnect."""
    broker = broker_survives
    async with client_for(broker) as client:
        before = await latest_offset(client, TOPIC, 0)
        async with await RawConnection.open(broker) as raw:
            await raw.send(
                request_frame(API_VERSIONS, 0, {}, 1)
                + request_frame(PRODUCE, 8, produce_request(
                    TOPIC, 0, _flip_payload_byte(_GOOD), acks=0), 2)
                + request_frame(API_VERSIONS, 0, {}, 3))
            await raw.response(API_VERSIONS, 0, 1)  # answered before the failing request
            await expect_dropped(broker, raw, "acks=0")
        assert await latest_offset(client, TOPIC, 0) == before


async def test_responses_before_a_protocol_error_are_still_sent(
    broker_survives: BrokerProcess,
) -> None:
    """A bad frame after good ones must not swallow the answers to the good ones.

    Otherwise a producer that pipelined an acks=-1 produce never learns it was appended, and
    retries it (a duplicate).
    """
    broker = broker_survives
    async with await RawConnection.open(broker) as raw:
        await raw.send(
            request_frame(PRODUCE, 8, produce_request(TOPIC, 0, batch(b"before error")), 1)
            + request_frame(FETCH, 11, fetch_request(TOPIC, QUIET_PARTITION, 0,
                                                     max_wait_ms=200, min_bytes=10**6), 2)
            + _SIZE.pack(10) + struct.pack(">hhih", 4242, 0, 3, -1))
        produced = await raw.response(PRODUCE, 8, 1)
        result = produced.responses[0].partition_responses[0]
        assert result.error_code == 0
        _ACKED.append((TOPIC, 0, result.base_offset, b"before error"))
        await raw.response(FETCH, 11, 2)
        await expect_dropped(broker, raw, "unknown API key 4242")


# ---------------------------------------------------------------------------------------------
# Admin requests


async def test_create_topics_errors(broker_survives: BrokerProcess) -> None:
    def topic(name: str, partitions: int = 1, replication: int = 1,
              configs: dict[str, str] | None = None) -> dict[str, Any]:
        return {"name": name, "num_partitions": partitions, "replication_factor": replication,
                "configs": [{"name": k, "value": v} for k, v in (configs or {}).items()]}

    cases = [
        (topic("bad name!"), ErrorCode.INVALID_TOPIC_EXCEPTION),
        (topic(""), ErrorCode.INVALID_TOPIC_EXCEPTION),
        (topic("."), ErrorCode.INVALID_TOPIC_EXCEPTION),
        (topic(".."), ErrorCode.INVALID_TOPIC_EXCEPTION),
        (topic("x" * 250), ErrorCode.INVALID_TOPIC_EXCEPTION),
        (topic("ünicode"), ErrorCode.INVALID_TOPIC_EXCEPTION),
        (topic(TOPIC), ErrorCode.TOPIC_ALREADY_EXISTS),
        (topic("zero-partitions", partitions=0), ErrorCode.INVALID_PARTITIONS),
        (topic("negative-partitions", partitions=-5), ErrorCode.INVALID_PARTITIONS),
        (topic("rf-three", replication=3), ErrorCode.INVALID_REPLICATION_FACTOR),
        (topic("rf-zero", replication=0), ErrorCode.INVALID_REPLICATION_FACTOR),
        (topic("unknown-config", configs={"no.such.config": "1"}), ErrorCode.INVALID_CONFIG),
    ]
    async with client_for(broker_survives) as client:
        response = await client.request(CREATE_TOPICS, {
            "topics": [t for t, _ in cases], "timeout_ms": 10_000})
        got = {t.name: t.error_code for t in response.topics}
        assert got == {t["name"]: int(code) for t, code in cases}
        assert all(t.error_message for t in response.topics)
        metadata = await client.request(METADATA, {"topics": None})
        names = {t.name for t in metadata.topics}
        assert names & {t["name"] for t, _ in cases} == {TOPIC}


async def test_create_with_too_many_partitions(broker_survives: BrokerProcess) -> None:
    """One request must not be able to freeze or exhaust the node (Kafka caps it at 10,000)."""
    async with client_for(broker_survives) as client:
        for topics in (
            [{"name": "huge", "num_partitions": 2**31 - 1, "replication_factor": 1}],
            [{"name": "big-a", "num_partitions": 6000, "replication_factor": 1},
             {"name": "big-b", "num_partitions": 6000, "replication_factor": 1}],
        ):
            response = await client.request(CREATE_TOPICS, {
                "topics": topics, "timeout_ms": 10_000, "validate_only": False})
            assert [t.error_code for t in response.topics] == (
                [ErrorCode.POLICY_VIOLATION] * len(topics)), response
        response = await client.request(CREATE_PARTITIONS, {
            "topics": [{"name": SMALL_TOPIC, "count": 2**31 - 1, "assignments": None}],
            "timeout_ms": 10_000, "validate_only": False})
        assert response.results[0].error_code == ErrorCode.POLICY_VIOLATION, response
        metadata = await client.request(METADATA, {"topics": None})
        assert not {t.name for t in metadata.topics} & {"huge", "big-a", "big-b"}
        small = [t for t in metadata.topics if t.name == SMALL_TOPIC]
        assert len(small[0].partitions) == 1


async def test_delete_unknown_topic(broker_survives: BrokerProcess) -> None:
    async with client_for(broker_survives) as client:
        response = await client.request(DELETE_TOPICS, {
            "topic_names": ["no-such-topic", ""], "timeout_ms": 5000})
        assert [r.error_code for r in response.responses] == [
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION] * 2


# ---------------------------------------------------------------------------------------------
# Fuzzed bodies of real requests


async def test_fuzzed_request_bodies_never_break_the_broker(
    broker_survives: BrokerProcess,
) -> None:
    """Real (key, version) headers with random or mutated bodies: answer or close, never die."""
    broker = broker_survives
    rng = random.Random(2024)
    templates: list[tuple[Api, int, bytes]] = [
        (PRODUCE, 8, request_frame(PRODUCE, 8, produce_request(TOPIC, 0, _GOOD), 0)[4:]),
        (FETCH, 11, request_frame(FETCH, 11, fetch_request(TOPIC, 0, 0), 0)[4:]),
        (LIST_OFFSETS, 5, request_frame(LIST_OFFSETS, 5, list_offsets_request(TOPIC, 0), 0)[4:]),
        (METADATA, 8, request_frame(METADATA, 8, {"topics": [{"name": TOPIC}]}, 0)[4:]),
        (API_VERSIONS, 3, request_frame(API_VERSIONS, 3, {}, 0)[4:]),
    ]
    answered: list[bool] = []
    async with trio.open_nursery() as nursery:
        limiter = trio.CapacityLimiter(16)
        for i in range(150):
            api, version, template = templates[i % len(templates)]
            payload = bytearray(template)
            header_end = 10 + len(b"bad-input") + (1 if api.is_flexible(version) else 0)
            if i % 3 == 0:  # random body
                payload[header_end:] = rng.randbytes(rng.randrange(0, 200))
            else:  # a few bytes of the real body overwritten
                for _ in range(rng.randrange(1, 4)):
                    if len(payload) > header_end:
                        payload[rng.randrange(header_end, len(payload))] = rng.randrange(256)
            nursery.start_soon(_send_fuzzed, broker, bytes(payload), limiter, answered)
    # Both outcomes were exercised: handlers saw odd but decodable requests, the codec
    # refused the rest.
    assert 10 <= sum(answered) <= len(answered) - 10, sum(answered)


async def _send_fuzzed(
    broker: BrokerProcess, payload: bytes, limiter: trio.CapacityLimiter,
    answered: list[bool],
) -> None:
    async with limiter, await RawConnection.open(broker) as raw:
        await raw.send(_SIZE.pack(len(payload)) + payload)
        await raw.send_eof()
        frame = await raw.read_frame(timeout_s=15)
        if frame is not None:
            (correlation_id,) = _INT32.unpack_from(frame, 0)
            assert correlation_id == _INT32.unpack_from(payload, 4)[0]
        answered.append(frame is not None)
