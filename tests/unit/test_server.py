"""The Kafka listener in-process: framing, ordering, back-pressure and failure containment.

Each test serves its own handler table with ``serve_listener`` on a loopback port and talks to
it over a real TCP connection, so the code under test is exactly the broker's.
"""

from __future__ import annotations

import logging
import math
import os
import struct
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio
import trio.testing

from raftlog.broker.apis import KafkaApis
from raftlog.client.connection import KafkaConnection
from raftlog.config import ServerConfig
from raftlog.metadata.image import MetadataImage
from raftlog.partition.batch import build_batch
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import AppendOrigin, now_ms
from raftlog.partition.segment_files import FileSlice
from raftlog.protocol import codec
from raftlog.protocol.codec import Api, Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import API_VERSIONS, FETCH, LIST_OFFSETS, METADATA, PRODUCE
from raftlog.quorum.interface import Quorum
from raftlog.security.session import Session
from raftlog.server import response_send
from raftlog.server.listener import (
    INFLIGHT_REQUESTS_MAX,
    Body,
    ConnectionClosed,
    Handler,
    HandlerResult,
    ListenerLimits,
    RequestContext,
    _Frame,
    _FrameReader,
    api_versions_body,
    serve_connection,
    serve_listener,
)
from raftlog.server.request_memory import FRAME_BUFFER_BYTES, FrameLease, RequestMemory
from raftlog.server.response_send import COPIED_RESPONSE_BYTES, PlainSocket

_SIZE = struct.Struct(">i")
LIMITS = ListenerLimits(request_bytes_max=1 << 20, idle_ms_max=10_000)


# ---------------------------------------------------------------------------------------------
# Harness


@asynccontextmanager
async def serving(
    handlers: Mapping[int, Handler], limits: ListenerLimits = LIMITS
) -> AsyncIterator[int]:
    """Serves ``handlers`` on 127.0.0.1 for the duration of the block; yields the port."""
    async with trio.open_nursery() as nursery:
        port: int = await nursery.start(serve_listener, "127.0.0.1", 0, dict(handlers), limits)
        yield port
        nursery.cancel_scope.cancel()


def with_api_versions(handlers: dict[int, Handler]) -> dict[int, Handler]:
    def api_versions(request: RequestContext) -> HandlerResult:
        return api_versions_body(ErrorCode.NONE, table)

    table = {API_VERSIONS.key: api_versions, **handlers}
    return table


def frame(api: Api, version: int, body: Mapping[str, Any], correlation_id: int) -> bytes:
    header = codec.RequestHeader(api.key, version, correlation_id, "unit")
    payload = codec.encode_request_header(header, api.is_flexible(version)) + codec.encode_bytes(
        api, version, body, is_request=True)
    return _SIZE.pack(len(payload)) + payload


FETCH_BODY: dict[str, Any] = {"max_wait_ms": 0, "min_bytes": 0, "topics": []}


class Client:
    """Raw frames out, raw frames in."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._buffer = bytearray()

    @classmethod
    async def connect(cls, port: int) -> Client:
        return cls(await trio.open_tcp_stream("127.0.0.1", port))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def read_frame(self, timeout_s: float = 5.0) -> bytes | None:
        with trio.fail_after(timeout_s):
            prefix = await self._read_exactly(4)
            if prefix is None:
                return None
            body = await self._read_exactly(_SIZE.unpack(prefix)[0])
            assert body is not None
            return body

    async def response(self, api: Api, version: int, correlation_id: int) -> Struct:
        raw = await self.read_frame()
        assert raw is not None, "connection closed"
        view = memoryview(raw)
        received, pos = codec.decode_response_header(
            view, api.is_flexible(version) and api is not API_VERSIONS)
        assert received == correlation_id
        return codec.decode(api, version, view[pos:], is_request=False)

    async def _read_exactly(self, size: int) -> bytes | None:
        while len(self._buffer) < size:
            try:
                chunk = await self.stream.receive_some(65536)
            except trio.BrokenResourceError:
                chunk = b""
            if not chunk:
                assert not self._buffer, "EOF mid-frame"
                return None
            self._buffer += chunk
        out = bytes(self._buffer[:size])
        del self._buffer[:size]
        return out

    async def aclose(self) -> None:
        await self.stream.aclose()


# ---------------------------------------------------------------------------------------------
# Ordering


async def test_responses_keep_request_order_when_handlers_finish_out_of_order() -> None:
    count = 12

    def fetch(request: RequestContext) -> HandlerResult:
        correlation_id = request.header.correlation_id

        async def later() -> Body:
            await trio.sleep((count - correlation_id) * 0.01)  # the first finishes last
            return {"throttle_time_ms": 0, "error_code": 0, "session_id": correlation_id,
                    "responses": []}

        return later

    async with serving(with_api_versions({FETCH.key: fetch})) as port:
        client = await Client.connect(port)
        frames = []
        for i in range(count):
            api = FETCH if i % 2 == 0 else API_VERSIONS
            frames.append(frame(api, 11 if api is FETCH else 0, FETCH_BODY if api is FETCH
                                else {}, i))
        await client.send(b"".join(frames))
        for i in range(count):
            if i % 2 == 0:
                answer = await client.response(FETCH, 11, i)
                assert answer.session_id == i  # the body belongs to this request
            else:
                await client.response(API_VERSIONS, 0, i)
        await client.aclose()


async def test_handlers_run_in_arrival_order() -> None:
    seen: list[int] = []

    def produce(request: RequestContext) -> HandlerResult:
        seen.append(request.header.correlation_id)
        return None  # acks=0: no response

    async with serving(with_api_versions({PRODUCE.key: produce})) as port:
        client = await Client.connect(port)
        body = {"acks": 0, "timeout_ms": 0, "topic_data": []}
        await client.send(b"".join(frame(PRODUCE, 8, body, i) for i in range(50))
                          + frame(API_VERSIONS, 0, {}, 50))
        # No Produce response came first: the first frame is the ApiVersions answer.
        await client.response(API_VERSIONS, 0, 50)
        assert seen == list(range(50))
        await client.aclose()


async def test_back_pressure_bounds_requests_in_flight() -> None:
    release = trio.Event()
    queue_full = trio.Event()
    calls = 0

    def fetch(request: RequestContext) -> HandlerResult:
        nonlocal calls
        calls += 1
        if calls == INFLIGHT_REQUESTS_MAX:
            queue_full.set()
        correlation_id = request.header.correlation_id

        async def blocked() -> Body:
            await release.wait()
            return {"throttle_time_ms": 0, "error_code": 0, "session_id": correlation_id,
                    "responses": []}

        return blocked

    total = 3 * INFLIGHT_REQUESTS_MAX
    async with serving(with_api_versions({FETCH.key: fetch})) as port:
        client = await Client.connect(port)
        await client.send(b"".join(frame(FETCH, 11, FETCH_BODY, i) for i in range(total)))
        with trio.fail_after(60):  # a busy machine may take long to read the first 64
            await queue_full.wait()
        # Every task parked with no socket event for the cushion: the reader is waiting on the
        # full response queue, not still on its way through the bytes already sent.
        await trio.testing.wait_all_tasks_blocked(cushion=0.2)
        # The reader stopped taking requests once the response queue was full.
        assert calls <= INFLIGHT_REQUESTS_MAX + 2, calls
        release.set()
        for i in range(total):
            assert (await client.response(FETCH, 11, i)).session_id == i
        assert calls == total
        await client.aclose()


# ---------------------------------------------------------------------------------------------
# Protocol errors and failures


async def test_protocol_error_still_answers_earlier_requests(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def fetch(request: RequestContext) -> HandlerResult:
        async def slow() -> Body:
            await trio.sleep(0.1)
            return {"throttle_time_ms": 0, "error_code": 0, "session_id": 7, "responses": []}

        return slow

    async with serving(with_api_versions({FETCH.key: fetch})) as port:
        client = await Client.connect(port)
        bad = struct.pack(">hhih", 999, 0, 3, -1)
        await client.send(frame(FETCH, 11, FETCH_BODY, 1) + frame(API_VERSIONS, 0, {}, 2)
                          + _SIZE.pack(len(bad)) + bad + frame(API_VERSIONS, 0, {}, 4))
        assert (await client.response(FETCH, 11, 1)).session_id == 7
        await client.response(API_VERSIONS, 0, 2)
        assert await client.read_frame() is None  # closed; request 4 never read
        await client.aclose()
    assert "unknown API key 999 (v0, correlation 3)" in caplog.text


async def test_handler_bug_costs_one_connection_not_the_listener(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def metadata(request: RequestContext) -> HandlerResult:
        raise RuntimeError("handler bug")

    def fetch(request: RequestContext) -> HandlerResult:
        async def broken() -> Body:
            raise KeyError("deferred bug")

        return broken

    async with serving(with_api_versions({METADATA.key: metadata, FETCH.key: fetch})) as port:
        for payload in (frame(METADATA, 8, {"topics": None}, 1), frame(FETCH, 11, FETCH_BODY, 1)):
            bystander = await Client.connect(port)
            victim = await Client.connect(port)
            await victim.send(payload)
            assert await victim.read_frame() is None
            await bystander.send(frame(API_VERSIONS, 0, {}, 9))
            await bystander.response(API_VERSIONS, 0, 9)
            await victim.aclose()
            await bystander.aclose()
    assert "handler bug" in caplog.text and "deferred bug" in caplog.text
    assert "after an internal error" in caplog.text


async def test_handler_may_close_the_connection() -> None:
    """How a handler reports an error that has no response (a failed acks=0 produce)."""

    def produce(request: RequestContext) -> HandlerResult:
        raise ConnectionClosed("acks=0 produce failed")

    async with serving(with_api_versions({PRODUCE.key: produce})) as port:
        client = await Client.connect(port)
        body = {"acks": 0, "timeout_ms": 0, "topic_data": []}
        await client.send(frame(API_VERSIONS, 0, {}, 1) + frame(PRODUCE, 8, body, 2))
        await client.response(API_VERSIONS, 0, 1)
        assert await client.read_frame() is None
        await client.aclose()


@pytest.mark.parametrize("version", [4, 99, -1])
async def test_api_versions_newer_than_ours_gets_a_v0_error(version: int) -> None:
    async with serving(with_api_versions({})) as port:
        client = await Client.connect(port)
        header = struct.pack(">hhih", API_VERSIONS.key, version, 5, -1)
        await client.send(_SIZE.pack(len(header) + 3) + header + b"\x00\x01\x02")
        answer = await client.response(API_VERSIONS, 0, 5)
        assert answer.error_code == ErrorCode.UNSUPPORTED_VERSION
        assert [(k.api_key, k.max_version) for k in answer.api_keys] == [(18, 3)]
        await client.send(frame(API_VERSIONS, 3, {}, 6))  # and the connection is still good
        assert (await client.response(API_VERSIONS, 3, 6)).error_code == 0
        await client.aclose()


# ---------------------------------------------------------------------------------------------
# Framing and idleness


async def test_oversized_frame_is_refused_without_reading_it() -> None:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    server = await listener.accept()
    limits = ListenerLimits(request_bytes_max=100, idle_ms_max=1000)
    reader = _FrameReader(PlainSocket(server.socket), limits, Session("test"),
                          RequestMemory(1 << 20))
    await client.send_all(_SIZE.pack(101) + b"x" * 50)
    with pytest.raises(ConnectionClosed, match=r"frame of 101 bytes outside \[8, 100\]"):
        await reader.next_frame()
    # Only the 4-byte prefix was consumed: the body is still in the socket, never buffered.
    await trio.sleep(0.05)
    assert await server.receive_some(1000) == b"x" * 50
    for stream in (client, server):
        await stream.aclose()
    await listener.aclose()


async def test_negative_idle_ms_disables_the_idle_timeout() -> None:
    """connections.max.idle.ms=-1 (accepted by the config) means no idle timeout, as in Kafka."""
    limits = ListenerLimits(request_bytes_max=1 << 20, idle_ms_max=-1)
    async with serving(with_api_versions({}), limits) as port:
        client = await Client.connect(port)
        await trio.sleep(0.2)
        await client.send(frame(API_VERSIONS, 0, {}, 1))
        await client.response(API_VERSIONS, 0, 1)
        await client.aclose()


async def test_idle_and_stalled_connections_are_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limits = ListenerLimits(request_bytes_max=1 << 20, idle_ms_max=200)
    async with serving(with_api_versions({}), limits) as port:
        idle = await Client.connect(port)
        stalled = await Client.connect(port)
        await stalled.send(_SIZE.pack(50) + b"\x00\x12")
        busy = await Client.connect(port)
        started = trio.current_time()
        for i in range(5):  # a connection that keeps talking is not idle
            await trio.sleep(0.08)
            await busy.send(frame(API_VERSIONS, 0, {}, i))
            await busy.response(API_VERSIONS, 0, i)
        assert await idle.read_frame() is None
        assert await stalled.read_frame() is None
        assert trio.current_time() - started >= 0.15
        for client in (idle, stalled, busy):
            await client.aclose()
    with caplog.at_level(logging.WARNING):
        assert "idle for 0.2 s (connections.max.idle.ms)" in caplog.text
        assert "only part of a 50-byte request arrived within 0.2 s" in caplog.text


# ---------------------------------------------------------------------------------------------
# Request memory (queued.max.request.bytes)


class PeakMemory(RequestMemory):
    """The budget, remembering the most it ever granted (``used`` only rises at a grant)."""

    peak = 0

    async def acquire(self, lease: FrameLease, nbytes: int, deadline: float = math.inf
                      ) -> None:
        await super().acquire(lease, nbytes, deadline)
        self.peak = max(self.peak, self.used)


@asynccontextmanager
async def serving_with(
    memory: RequestMemory, handlers: Mapping[int, Handler], limits: ListenerLimits = LIMITS
) -> AsyncIterator[int]:
    """Like ``serving``, with the test's own request memory."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")

    async def handle(stream: trio.SocketStream) -> None:
        await serve_connection(stream, dict(handlers), limits, memory)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handle, listeners)
        yield listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()


async def _reader_pair(
    limits: ListenerLimits, memory: RequestMemory
) -> tuple[trio.SocketStream, trio.SocketStream, _FrameReader]:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    client = await trio.open_tcp_stream("127.0.0.1", listener.socket.getsockname()[1])
    server = await listener.accept()
    await listener.aclose()
    reader = _FrameReader(PlainSocket(server.socket), limits, Session("test"), memory)
    return client, server, reader


async def test_a_frame_buffer_grows_as_its_bytes_arrive() -> None:
    """The declared size is never allocated up front; chunks follow the bytes received."""
    size = 8 << 20
    memory = RequestMemory(1 << 30)
    limits = ListenerLimits(request_bytes_max=size, idle_ms_max=10_000)
    client, server, reader = await _reader_pair(limits, memory)
    payload = bytes(range(256)) * (size // 256)
    frames: list[_Frame | None] = []

    async def read() -> None:
        frames.append(await reader.next_frame())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await client.send_all(_SIZE.pack(size) + payload[:2])
        await trio.testing.wait_all_tasks_blocked()
        assert memory.used == FRAME_BUFFER_BYTES  # not 8 MiB
        sent = 3 << 20
        await client.send_all(payload[2:sent])
        await trio.testing.wait_all_tasks_blocked()
        assert sent < memory.used <= 2 * sent + FRAME_BUFFER_BYTES
        await client.send_all(payload[sent:])
    frame_read = frames[0]
    assert frame_read is not None and frame_read.view() == payload  # joined in order
    assert frame_read.lease.held == size == memory.used
    frame_read.lease.release()
    assert memory.used == 0
    for stream in (client, server):
        await stream.aclose()


async def test_a_frame_cut_short_gives_its_memory_back() -> None:
    memory = RequestMemory(1 << 30)
    limits = ListenerLimits(request_bytes_max=8 << 20, idle_ms_max=10_000)
    client, server, reader = await _reader_pair(limits, memory)

    async def send_part_and_close() -> None:
        await client.send_all(_SIZE.pack(4 << 20) + b"x" * (2 << 20))  # a second chunk
        await client.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_part_and_close)
        with pytest.raises(ConnectionClosed, match="mid-frame"):
            await reader.next_frame()
    assert memory.used == 0
    await server.aclose()


async def test_request_bytes_count_until_the_handler_is_done_with_them() -> None:
    """A deferred part that keeps a view of the request keeps it counted; one that does not
    (Produce waiting for acks after its append) gives the bytes back at once."""
    memory = RequestMemory(1 << 30)
    release = trio.Event()
    dispatched = [trio.Event(), trio.Event()]

    def produce(request: RequestContext) -> HandlerResult:
        records = request.body.topic_data[0].partition_data[0].records
        correlation_id = request.header.correlation_id
        keep = correlation_id == 1

        async def acknowledged() -> Body:
            await release.wait()
            if keep:
                assert bytes(records) == b"r" * 1000  # still reading the request
            return {"responses": [], "throttle_time_ms": 0}

        if not keep:
            del records
        # The listener looks at the frame right after this returns, before any other task
        # runs, so the test sees the outcome once it wakes up.
        dispatched[correlation_id].set()
        return acknowledged

    body = {"acks": -1, "timeout_ms": 1000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": b"r" * 1000}]}]}
    async with serving_with(memory, with_api_versions({PRODUCE.key: produce})) as port:
        client = await Client.connect(port)
        await client.send(frame(PRODUCE, 8, body, 0))
        await dispatched[0].wait()
        assert memory.used == 0  # Produce 0 waits, but holds no view of its request
        request = frame(PRODUCE, 8, body, 1)
        await client.send(request)
        await dispatched[1].wait()
        assert memory.used == len(request) - 4  # Produce 1 keeps its records in view
        release.set()
        for correlation_id in (0, 1):
            await client.response(PRODUCE, 8, correlation_id)
        assert memory.used == 0
        await client.aclose()


async def test_a_frame_buffer_still_viewed_is_never_reused() -> None:
    """Big frames start in recycled buffers; one whose records a deferred part still reads
    must keep its bytes while later frames arrive."""
    memory = RequestMemory(1 << 30)
    release = trio.Event()
    kept: list[memoryview] = []
    dispatched = trio.Event()

    def produce(request: RequestContext) -> HandlerResult:
        records = request.body.topic_data[0].partition_data[0].records
        if request.header.correlation_id == 0:
            kept.append(records)
        elif request.header.correlation_id == 3:
            dispatched.set()

        async def acknowledged() -> Body:
            await release.wait()
            return {"responses": [], "throttle_time_ms": 0}

        return acknowledged

    def body(fill: bytes) -> dict[str, Any]:
        return {"acks": -1, "timeout_ms": 1000, "topic_data": [
            {"name": "t", "partition_data": [{"index": 0, "records": fill * (200 << 10)}]}]}

    async with serving_with(memory, with_api_versions({PRODUCE.key: produce})) as port:
        client = await Client.connect(port)
        await client.send(frame(PRODUCE, 8, body(b"a"), 0))
        for correlation_id in range(1, 4):  # each may reuse a buffer, never the first one
            await client.send(frame(PRODUCE, 8, body(b"b"), correlation_id))
        await dispatched.wait()
        assert bytes(kept[0]) == b"a" * (200 << 10)
        kept.clear()
        release.set()
        for correlation_id in range(4):
            await client.response(PRODUCE, 8, correlation_id)
        assert memory.used == 0
        await client.aclose()


async def test_big_frames_from_many_connections_stay_within_the_budget() -> None:
    """Together they need four times the budget: all are answered (no reader waits for
    another for ever) and the node never holds more than the budget plus one frame (twice,
    while its chunks are joined)."""
    budget, size, connections = 4 << 20, 3 << 20, 6
    memory = PeakMemory(budget)
    limits = ListenerLimits(request_bytes_max=size, idle_ms_max=10_000)
    header = struct.pack(">hhih", API_VERSIONS.key, 0, 0, -1)  # ApiVersions v0, null client
    request = _SIZE.pack(size) + header + b"\0" * (size - len(header))  # trailing bytes

    async def one_client(port: int) -> None:
        client = await Client.connect(port)
        for piece in range(0, len(request), 256 << 10):
            await client.send(request[piece:piece + (256 << 10)])
        await client.response(API_VERSIONS, 0, 0)
        await client.aclose()

    async with serving_with(memory, with_api_versions({}), limits) as port:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for _ in range(connections):
                    nursery.start_soon(one_client, port)
    assert budget < memory.peak <= budget + 2 * size
    assert memory.used == 0


# ---------------------------------------------------------------------------------------------
# Leader epochs (KIP-320), which a single-node broker process never moves


async def test_fetch_and_list_offsets_check_the_leader_epoch(tmp_path: Path) -> None:
    config = ServerConfig.from_properties({"node.id": "1", "log.dirs": str(tmp_path)})
    manager = PartitionManager(tmp_path, node_id=1)
    manager.ensure_partition("t", 0, {}, leader_epoch=5)
    quorum = cast(Quorum, SimpleNamespace(image=MetadataImage()))
    apis = KafkaApis(config, quorum, manager)
    try:
        async with serving(apis.handlers()) as port:
            client = await KafkaConnection.connect("127.0.0.1", port)
            expectations = {-1: 0, 5: 0, 4: ErrorCode.FENCED_LEADER_EPOCH,
                            0: ErrorCode.FENCED_LEADER_EPOCH,
                            6: ErrorCode.UNKNOWN_LEADER_EPOCH}
            for epoch, expected in expectations.items():
                fetched = await client.request(FETCH, {
                    "max_wait_ms": 0, "min_bytes": 0, "topics": [{"topic": "t", "partitions": [{
                        "partition": 0, "current_leader_epoch": epoch, "fetch_offset": 0,
                        "partition_max_bytes": 1000}]}]}, version=11)
                assert fetched.responses[0].partitions[0].error_code == expected, epoch
                listed = await client.request(LIST_OFFSETS, {
                    "replica_id": -1, "isolation_level": 0, "topics": [{"name": "t",
                    "partitions": [{"partition_index": 0, "current_leader_epoch": epoch,
                                    "timestamp": -1}]}]}, version=5)
                assert listed.topics[0].partitions[0].error_code == expected, epoch
            # Before Fetch v9 there is no epoch in the request, so nothing to check.
            old = await client.request(FETCH, {
                "max_wait_ms": 0, "min_bytes": 0, "topics": [{"topic": "t", "partitions": [{
                    "partition": 0, "fetch_offset": 0, "partition_max_bytes": 1000}]}]},
                version=8)
            assert old.responses[0].partitions[0].error_code == 0
            await client.aclose()
    finally:
        manager.close()


@pytest.mark.parametrize(("region_bytes", "sendfiles"), [
    (1000, 0), (COPIED_RESPONSE_BYTES - 8, 0), (COPIED_RESPONSE_BYTES - 7, 1)])
async def test_small_responses_go_out_in_one_send_big_ones_use_sendfile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, region_bytes: int,
        sendfiles: int) -> None:
    """A follower's ~1 KiB Fetch answer is read from the file into the response buffer: one
    syscall and one TCP segment instead of a send and a sendfile. Big answers keep sendfile.
    (The response here is the region and 8 bytes around it.)"""
    data = bytes(range(256)) * (region_bytes // 256 + 1)
    path = tmp_path / "segment.log"
    path.write_bytes(b"x" * 7 + data)
    calls: list[int] = []
    real_sendfile = os.sendfile

    def counting(out_fd: int, in_fd: int, offset: int, count: int) -> int:
        calls.append(count)
        return real_sendfile(out_fd, in_fd, offset, count)

    monkeypatch.setattr(response_send.os, "sendfile", counting)
    fd = os.open(path, os.O_RDONLY)
    region = FileSlice(os.dup(fd), 7, region_bytes)
    os.close(fd)
    left, right = trio.socket.socketpair()
    received = bytearray()
    expected = b"head" + data[:region_bytes] + b"tail"

    async def receive() -> None:
        while len(received) < len(expected):
            received.extend(await right.recv(1 << 20))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receive)
        await response_send.send_chunks(trio.SocketStream(left), [b"head", region, b"tail"])
    assert bytes(received) == expected
    assert len(calls) == sendfiles
    assert region.fd == -1  # closed either way
    left.close()
    right.close()


async def test_a_long_poll_started_after_the_data_came_answers_at_once(tmp_path: Path) -> None:
    """The writer starts a request's waiting part only when it reaches that request. A Fetch
    whose first read found nothing, and whose data came before its long poll began, must
    answer at once: it used to wait for a wake-up already spent, until max_wait_ms."""
    config = ServerConfig.from_properties({"node.id": "1", "log.dirs": str(tmp_path)})
    manager = PartitionManager(tmp_path, node_id=1)
    partition = manager.ensure_partition("t", 0, {}, leader_epoch=0)
    apis = KafkaApis(config, cast(Quorum, SimpleNamespace(image=MetadataImage())), manager)
    body = {"replica_id": -1, "max_wait_ms": 5000, "min_bytes": 1, "topics": [
        {"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 0,
                                       "partition_max_bytes": 1 << 20}]}]}
    header = codec.RequestHeader(FETCH.key, 11, 1, "unit")
    context = RequestContext(FETCH, header, codec.decode(FETCH, 11, codec.encode_bytes(
        FETCH, 11, body, is_request=True), is_request=True), "test", Session("test"))
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(manager.run_flusher)
            deferred = apis.handlers()[FETCH.key](context)
            assert callable(deferred)  # nothing to read yet: it would wait
            partition.append(build_batch([(None, b"v", ())], timestamp_ms=now_ms()),
                             AppendOrigin.CLIENT)
            assert await partition.wait_high_watermark(1, trio.current_time() + 10)
            started = trio.current_time()
            answer = await deferred()
            assert trio.current_time() - started < 2.5  # not the 5 s of max_wait_ms
            assert answer is not None
            assert answer["responses"][0]["partitions"][0]["high_watermark"] == 1
            nursery.cancel_scope.cancel()
    finally:
        manager.close()
