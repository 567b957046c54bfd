"""The Kafka listener: framing, pipelining and ordered responses over trio sockets.

Each connection has a reader task and a writer task in the connection's own nursery. The
reader takes frames in arrival order and calls the handler's synchronous part *in that
order* (so two produce requests on one connection append in the order they were sent), then
queues a response slot. A handler may return a body at once or an awaitable that finishes it
later (waiting for fsync, a long-poll fetch, a quorum commit); those run concurrently. The
writer sends slots strictly in request order, as Kafka requires. The slot queue is bounded,
which is the per-connection back-pressure.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from raftlog.fetch import codec
from raftlog.fetch.codec import Api, DecodeError, Region
from raftlog.fetch.errors import ErrorCode
from raftlog.fetch.schemas import API_VERSIONS, APIS_BY_KEY
from raftlog.fetch.schemas_security import SECURITY_APIS
from raftlog.security.session import Session

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
INFLIGHT_REQUESTS_MAX = 64
SEND_TIMEOUT_S = 30.0

Body = dict[str, Any]
Deferred = Callable[[], Awaitable[Body | None]]
# A handler returns a body, None (no response: produce with acks=0) or a Deferred.
HandlerResult = Body | Deferred | None


class Handler(Protocol):
    def __call__(self, request: RequestContext) -> HandlerResult: ...


class FileRegion(Region, Protocol):
    """A region backed by a file descriptor that the writer sends with sendfile."""

    fd: int
    position: int

    def close(self) -> None: ...


@dataclass(frozen=True)
class RequestContext:
    api: Api
    header: codec.RequestHeader
    body: codec.Struct
    peer: str
    # The connection's identity (anonymous unless it authenticated); requests made inside the
    # node (a local controller call) carry a session of the node itself.
    session: Session = field(default_factory=lambda: Session("?"))


_SASL_KEYS = frozenset(api.key for api in SECURITY_APIS)


@dataclass
class _Slot:
    api: Api
    version: int
    correlation_id: int
    done: trio.Event = field(default_factory=trio.Event)
    body: Body | None = None
    respond: bool = True


@dataclass(frozen=True)
class ListenerLimits:
    request_bytes_max: int  # socket.request.max.bytes
    idle_ms_max: int  # connections.max.idle.ms


class ConnectionClosed(Exception):
    """The peer closed or broke the protocol; the connection is dropped."""


async def serve_connection(
    stream: trio.SocketStream, handlers: dict[int, Handler], limits: ListenerLimits
) -> None:
    """Serves one client connection until it closes, idles out or breaks the protocol."""
    peer = _peer_name(stream)
    session = Session(peer)
    send_slots, receive_slots = trio.open_memory_channel[_Slot](INFLIGHT_REQUESTS_MAX)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_write_responses, stream, receive_slots, peer)
            async with send_slots:
                await _read_requests(stream, handlers, limits, send_slots, nursery, session)
    except* ConnectionClosed as group:
        log.warning("closing connection from %s: %s", peer, group.exceptions[0])
    except* (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError) as group:
        log.debug("connection from %s broke: %s", peer, group.exceptions[0])
    except* trio.TooSlowError:
        log.warning("closing connection from %s: send or receive timed out", peer)
    except* Exception as group:
        # A handler bug must cost one connection, never the node.
        log.error("closing connection from %s after an internal error", peer,
                  exc_info=group.exceptions[0])
    finally:
        with trio.move_on_after(1) as cleanup:
            cleanup.shield = True
            await stream.aclose()


def _peer_name(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "?"


async def _read_requests(
    stream: trio.SocketStream,
    handlers: dict[int, Handler],
    limits: ListenerLimits,
    slots: trio.MemorySendChannel[_Slot],
    nursery: trio.Nursery,
    session: Session,
) -> None:
    peer = session.peer
    reader = _FrameReader(stream.socket, limits, session)
    while True:
        try:
            frame = await reader.next_frame()
            if frame is None:
                return
            slot = _dispatch(frame, handlers, nursery, session)
        except ConnectionClosed as exc:
            # Requests read before the bad one were already handled (a produce may be in the
            # log), so their responses still go out, in order, before the close: otherwise a
            # client that pipelined a produce never learns it was appended and retries it.
            # Returning closes the slot channel; the writer drains it and the connection ends.
            log.warning("closing connection from %s: %s", peer, exc)
            return
        await slots.send(slot)


def _dispatch(
    frame: memoryview, handlers: dict[int, Handler], nursery: trio.Nursery, session: Session
) -> _Slot:
    key, version, correlation_id = codec.peek_request_header(frame)
    api = APIS_BY_KEY.get(key)
    if api is None or key not in handlers:
        raise ConnectionClosed(f"unknown API key {key} (v{version}, correlation {correlation_id})")
    if not session.may_send(key, _SASL_KEYS):
        # Kafka: after a failed authentication, or during a SASL exchange, any other request
        # closes the connection.
        raise ConnectionClosed(f"{api.name} not allowed in SASL state {session.sasl_state.value}")
    slot = _Slot(api, version, correlation_id)
    if not api.supports(version):
        if api is API_VERSIONS:
            # KIP-511: answer with a v0 body carrying UNSUPPORTED_VERSION and our ranges.
            slot.version = 0
            slot.body = api_versions_body(ErrorCode.UNSUPPORTED_VERSION, handlers)
            slot.done.set()
            return slot
        raise ConnectionClosed(f"unsupported {api.name} version {version}")
    try:
        header, pos = codec.decode_request_header(frame, api.is_flexible(version))
        body = codec.decode(api, version, frame[pos:], is_request=True, allow_trailing=True)
    except DecodeError as exc:
        raise ConnectionClosed(f"malformed {api.name} v{version} request: {exc}") from exc
    result = handlers[key](RequestContext(api, header, body, session.peer, session))
    _complete(slot, result, nursery)
    return slot


def _complete(slot: _Slot, result: HandlerResult, nursery: trio.Nursery) -> None:
    if result is None:
        slot.respond = False
        slot.done.set()
    elif isinstance(result, dict):
        slot.body = result
        slot.done.set()
    else:
        nursery.start_soon(_finish_deferred, slot, result)


async def _finish_deferred(slot: _Slot, deferred: Deferred) -> None:
    try:
        body = await deferred()
    finally:
        slot.done.set()  # the writer must never wait forever on a failed handler
    if body is None:
        slot.respond = False
    slot.body = body


def api_versions_body(error: ErrorCode, handlers: dict[int, Handler]) -> Body:
    keys = [
        {"api_key": api.key, "min_version": api.min_version, "max_version": api.advertised_max}
        for api in sorted(APIS_BY_KEY.values(), key=lambda a: a.key)
        if api.key in handlers and not api.internal
    ]
    return {"error_code": int(error), "api_keys": keys, "throttle_time_ms": 0}


class _FrameReader:
    """Reads size-prefixed frames straight into one buffer per frame (recv_into)."""

    def __init__(self, sock: trio.socket.SocketType, limits: ListenerLimits,
                 session: Session) -> None:
        self._sock = sock
        self._limits = limits
        self._session = session
        self._pending = bytearray()

    async def next_frame(self) -> memoryview | None:
        # A negative connections.max.idle.ms (the config accepts -1) disables the idle timeout,
        # as in Kafka; trio refuses negative timeouts, so it must become "never".
        idle_ms = self._limits.idle_ms_max
        idle_s = idle_ms / 1000 if idle_ms >= 0 else math.inf
        with trio.move_on_after(idle_s) as idle:
            prefix = await self._read_exactly(4, eof_ok=True)
        if idle.cancelled_caught:
            raise ConnectionClosed(f"idle for {idle_s:g} s (connections.max.idle.ms)")
        if prefix is None:
            return None
        (size,) = _SIZE.unpack(prefix)
        if size < 8 or size > self._limits.request_bytes_max:
            raise ConnectionClosed(
                f"frame of {size} bytes outside [8, {self._limits.request_bytes_max}]"
                " (socket.request.max.bytes)"
            )
        pre_auth_max = self._session.frame_bytes_max
        if pre_auth_max is not None and size > pre_auth_max:
            raise ConnectionClosed(f"frame of {size} bytes during authentication"
                                   f" (limit {pre_auth_max})")
        with trio.move_on_after(idle_s) as stalled:
            frame = await self._read_exactly(size, eof_ok=False)
        if stalled.cancelled_caught:
            # Said plainly (a bare TooSlowError logged only "send or receive timed out").
            raise ConnectionClosed(f"only part of a {size}-byte request arrived within"
                                   f" {idle_s:g} s (connections.max.idle.ms)")
        assert frame is not None
        return frame

    async def _read_exactly(self, size: int, *, eof_ok: bool) -> memoryview | None:
        buf = bytearray(size)
        view = memoryview(buf)
        have = min(len(self._pending), size)
        view[:have] = self._pending[:have]
        del self._pending[:have]
        while have < size:
            received = await self._sock.recv_into(view[have:], size - have)
            if received == 0:
                if eof_ok and have == 0:
                    return None
                raise ConnectionClosed("peer closed the connection mid-frame")
            have += received
        return view


async def _write_responses(
    stream: trio.SocketStream, slots: trio.MemoryReceiveChannel[_Slot], peer: str
) -> None:
    async with slots:
        async for slot in slots:
            await slot.done.wait()
            if not slot.respond:
                continue
            if slot.body is None:
                raise ConnectionClosed(f"{slot.api.name} handler failed")
            chunks = _encode_response(slot)
            with trio.fail_after(SEND_TIMEOUT_S):
                await _send_chunks(stream, chunks)


def _encode_response(slot: _Slot) -> list[bytes | bytearray | memoryview | Region]:
    assert slot.body is not None
    # KIP-511: the ApiVersions response header is always v0, even at flexible versions.
    flexible_header = slot.api.is_flexible(slot.version) and slot.api is not API_VERSIONS
    header = codec.encode_response_header(slot.correlation_id, flexible_header)
    body = codec.encode(slot.api, slot.version, slot.body, is_request=False)
    size = len(header) + sum(_chunk_size(c) for c in body)
    return [_SIZE.pack(size) + header, *body]


def _chunk_size(chunk: bytes | bytearray | memoryview | Region) -> int:
    if isinstance(chunk, bytes | bytearray | memoryview):
        return len(chunk)
    return chunk.size_bytes


async def _send_chunks(
    stream: trio.SocketStream, chunks: list[bytes | bytearray | memoryview | Region]
) -> None:
    """Sends bytes with send_all and file regions with sendfile, closing every region."""
    pending = bytearray()
    try:
        for chunk in chunks:
            if isinstance(chunk, bytes | bytearray | memoryview):
                pending += chunk
                continue
            if pending:
                await stream.send_all(pending)
                pending = bytearray()
            await _sendfile(stream, chunk)  # type: ignore[arg-type]
        if pending:
            await stream.send_all(pending)
    finally:
        for chunk in chunks:
            close = getattr(chunk, "close", None)
            if close is not None and not isinstance(chunk, bytes | bytearray | memoryview):
                close()


async def _sendfile(stream: trio.SocketStream, region: FileRegion) -> None:
    sock = stream.socket
    offset = region.position
    remaining = region.size_bytes
    while remaining > 0:
        try:
            sent = os.sendfile(sock.fileno(), region.fd, offset, remaining)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
            continue
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                await trio.lowlevel.wait_writable(sock)
                continue
            raise
        if sent == 0:
            raise ConnectionClosed("file region shorter than expected (segment truncated?)")
        offset += sent
        remaining -= sent
    await trio.lowlevel.checkpoint()


async def serve_listener(
    host: str,
    port: int,
    handlers: dict[int, Handler],
    limits: ListenerLimits,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listens on host:port and serves every connection in this task's own nursery."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound_port = listeners[0].socket.getsockname()[1]
    log.info("Kafka listener on %s:%d", host, bound_port)

    async def handle(stream: trio.SocketStream) -> None:
        await serve_connection(stream, handlers, limits)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handle, listeners)
        task_status.started(bound_port)
