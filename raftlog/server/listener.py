"""The Kafka listener: framing, pipelining and ordered responses over trio sockets.

Each connection has a reader task and a writer task in the connection's own nursery. The
reader takes frames in arrival order and calls the handler's synchronous part *in that
order* (so two produce requests on one connection append in the order they were sent), then
queues a response slot. A handler may return a body at once or an awaitable that finishes it
later (waiting for fsync, a long-poll fetch, a quorum commit). The writer awaits those and
sends the responses strictly in request order, as Kafka requires; so, as in Kafka, the
waiting parts of one connection's requests run one at a time. The slot queue is bounded,
which is the per-connection back-pressure.

Each request's stage times, its error codes and the connection counts go to the listener's
``RequestStats`` (``request_stats.py``), which the metrics endpoint reads.

Node-wide, the bytes of requests being read or handled share one budget,
``queued.max.request.bytes`` (``request_memory.py``): a frame's buffer is allocated as its
bytes arrive, each chunk only once the budget allows it, and the frame counts until its
handler no longer needs it. Readers short of memory stop reading their sockets.
"""

from __future__ import annotations

import logging
import math
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from raftlog.client.tls_stream import TlsStream
from raftlog.protocol import codec
from raftlog.protocol.api_table import APIS_BY_KEY
from raftlog.protocol.codec import Api, DecodeError, Region
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import API_VERSIONS
from raftlog.protocol.schemas_security import SECURITY_APIS
from raftlog.security.session import KafkaPrincipal, SaslState, Session
from raftlog.server.quotas import ConnectionQuota, QuotaEnforcer
from raftlog.server.request_memory import (
    FRAME_BUFFER_BYTES,
    QUEUED_MAX_REQUEST_BYTES_DEFAULT,
    FrameLease,
    RequestMemory,
    is_viewed,
)
from raftlog.server.request_stats import RequestStats, request_name
from raftlog.server.response_send import PlainSocket, chunk_size, send_chunks
from raftlog.server.tls import TlsListener, accept_tls

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
INFLIGHT_REQUESTS_MAX = 64
SEND_TIMEOUT_S = 30.0
# Frames up to this size get a buffer of their exact size; bigger ones start in a recycled
# buffer of FRAME_BUFFER_BYTES (see request_memory.py).
SMALL_FRAME_BYTES = 64 << 10
LISTENER_NAME = "PLAINTEXT"  # the default listener name (the metrics label)
_now = time.perf_counter_ns  # request stage instants (request_stats.py)

Body = dict[str, Any]
Deferred = Callable[[], Awaitable[Body | None]]
# A handler returns a body, None (no response: produce with acks=0) or a Deferred.
HandlerResult = Body | Deferred | None


class Handler(Protocol):
    def __call__(self, request: RequestContext) -> HandlerResult: ...


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
    lease: FrameLease  # the request's bytes, counted until its handler is done with them
    read: int  # perf_counter_ns instants of the request's stages (request_stats.py)
    # The rest of a handler that has to wait (a long poll, acks=all): the writer awaits it in
    # request order, as Kafka handles one request of a connection at a time. No task of its
    # own: a task per request cost a spawn and one more pass of the scheduler per response.
    deferred: Deferred | None = None
    body: Body | None = None
    respond: bool = True
    name: str = ""  # the metrics' request name (Fetch is FetchConsumer or FetchFollower)
    size: int = 0  # the request's bytes and client id (for quotas, ``quotas.py``)
    client_id: str | None = None
    start: int = 0
    local: int = 0
    ready: int = 0


@dataclass(frozen=True)
class ListenerLimits:
    request_bytes_max: int  # socket.request.max.bytes
    idle_ms_max: int  # connections.max.idle.ms
    queued_request_bytes_max: int = QUEUED_MAX_REQUEST_BYTES_DEFAULT  # queued.max.request.bytes


class ConnectionClosed(Exception):
    """The peer closed or broke the protocol; the connection is dropped."""


class _Receiver(Protocol):
    async def recv_into(self, view: memoryview, nbytes: int, deadline: float) -> int: ...


class _TlsReceiver:
    """A TLS connection's reads, each under the frame's deadline."""

    __slots__ = ("_stream",)

    def __init__(self, stream: TlsStream) -> None:
        self._stream = stream

    async def recv_into(self, view: memoryview, nbytes: int, deadline: float) -> int:
        with trio.fail_at(deadline):
            return await self._stream.recv_into(view, nbytes)


async def serve_connection(
    stream: trio.SocketStream | TlsStream, handlers: dict[int, Handler],
    limits: ListenerLimits,
    memory: RequestMemory | None = None,
    stats: RequestStats | None = None,
    listener: str = LISTENER_NAME,
    principal: KafkaPrincipal | None = None,
    sasl_required: bool = False,
    quotas: QuotaEnforcer | None = None,
) -> None:
    """Serves one client connection until it closes, idles out or breaks the protocol.

    ``memory`` is the node's budget of request bytes, shared by all its connections;
    ``stats`` records its requests and counts it under ``listener``. ``stream`` is a TCP
    stream or, on an SSL listener, a TLS stream whose handshake is done; ``principal`` is
    its client certificate's.
    """
    tcp = stream if isinstance(stream, trio.SocketStream) else stream.transport_stream
    peer = _peer_name(tcp)
    session = Session(peer, listener=listener, sasl_required=sasl_required)
    if principal is not None:
        session.principal = principal
        log.debug("%s on %s authenticated by its certificate as %s", peer, listener, principal)
    if memory is None:
        memory = RequestMemory(limits.queued_request_bytes_max)
    if stats is None:
        stats = RequestStats()
    stats.connection_opened(listener)
    send_slots, receive_slots = trio.open_memory_channel[_Slot](INFLIGHT_REQUESTS_MAX)
    quota = None if quotas is None else quotas.connection(session)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_write_responses, stream, receive_slots, stats, quota)
            async with send_slots:
                await _read_requests(stream, handlers, limits, send_slots, session, memory,
                                     quota)
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
        stats.connection_closed(listener)
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
    stream: trio.SocketStream | TlsStream,
    handlers: dict[int, Handler],
    limits: ListenerLimits,
    slots: trio.MemorySendChannel[_Slot],
    session: Session,
    memory: RequestMemory,
    quota: ConnectionQuota | None = None,
) -> None:
    peer = session.peer
    receiver: _Receiver = (PlainSocket(stream.socket) if isinstance(stream, trio.SocketStream)
                           else _TlsReceiver(stream))
    reader = _FrameReader(receiver, limits, session, memory)
    while True:
        try:
            slot = await _next_request(reader, handlers, session, quota)
            if slot is None:
                return
        except ConnectionClosed as exc:
            # Requests read before the bad one were already handled (a produce may be in the
            # log), so their responses still go out, in order, before the close: otherwise a
            # client that pipelined a produce never learns it was appended and retries it.
            # Returning closes the slot channel; the writer drains it and the connection ends.
            log.warning("closing connection from %s: %s", peer, exc)
            return
        await slots.send(slot)


@dataclass
class _Frame:
    buffer: bytearray  # the frame is its first ``size`` bytes (a recycled buffer is longer)
    size: int
    lease: FrameLease
    recyclable: bool = False

    def view(self) -> memoryview:
        return memoryview(self.buffer)[:self.size]


async def _next_request(
    reader: _FrameReader, handlers: dict[int, Handler], session: Session,
    quota: ConnectionQuota | None,
) -> _Slot | None:
    """Reads and dispatches the next frame. Kept apart from the reading loop so that no
    variable of the loop keeps a frame alive after its lease is given back."""
    frame = await reader.next_frame()
    if frame is None:
        return None
    try:
        if quota is not None:  # a throttled connection's next request waits (KIP-219)
            await quota.wait_unmuted()
        read = _now()
        slot = _dispatch(frame.view(), handlers, session, frame.lease, read)
        if quota is not None:
            quota.dispatched(slot)
    except BaseException:
        frame.lease.release()
        raise
    viewed = is_viewed(frame.buffer)
    if slot.deferred is None or not viewed:
        # The handler is done with the request's bytes (Produce has appended its records,
        # and what waits for the acknowledgement keeps no view of them): stop counting them.
        # A deferred part still holding a view gives the lease back when it finishes.
        frame.lease.release()
    if frame.recyclable and not viewed:
        reader.recycle(frame.buffer)
    return slot


def _dispatch(
    frame: memoryview, handlers: dict[int, Handler], session: Session, lease: FrameLease,
    read: int,
) -> _Slot:
    key, version, correlation_id = codec.peek_request_header(frame)
    api = APIS_BY_KEY.get(key)
    if api is None or key not in handlers:
        raise ConnectionClosed(f"unknown API key {key} (v{version}, correlation {correlation_id})")
    if not session.may_send(key, _SASL_KEYS):
        # Kafka: after a failed authentication, or during a SASL exchange, any other request
        # closes the connection.
        state = ("before authentication on a SASL listener"
                 if session.sasl_required and session.sasl_state is SaslState.NONE
                 else f"in SASL state {session.sasl_state.value}")
        raise ConnectionClosed(f"{api.name} not allowed {state}")
    slot = _Slot(api, version, correlation_id, lease, read, name=api.name, size=len(frame))
    if not api.supports(version):
        if api is API_VERSIONS:
            # KIP-511: answer with a v0 body carrying UNSUPPORTED_VERSION and our ranges.
            slot.version = 0
            slot.body = api_versions_body(ErrorCode.UNSUPPORTED_VERSION, handlers)
            slot.start = slot.local = slot.ready = _now()
            return slot
        raise ConnectionClosed(f"unsupported {api.name} version {version}")
    try:
        header, pos = codec.decode_request_header(frame, api.is_flexible(version))
        body = codec.decode(api, version, frame[pos:], is_request=True, allow_trailing=True)
    except DecodeError as exc:
        raise ConnectionClosed(f"malformed {api.name} v{version} request: {exc}") from exc
    slot.name, slot.client_id = request_name(api.name, body), header.client_id
    slot.start = _now()
    result = handlers[key](RequestContext(api, header, body, session.peer, session))
    slot.local = slot.ready = _now()
    if result is None:
        slot.respond = False
    elif isinstance(result, dict):
        slot.body = result
    else:
        slot.deferred = result
    return slot


async def _finish_deferred(slot: _Slot, deferred: Deferred) -> None:
    slot.deferred = None
    try:
        body = await deferred()
    finally:
        slot.ready = _now()
        slot.lease.release()  # a deferred part may have kept a view of the request's bytes
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
    """Reads size-prefixed frames with recv_into, growing each frame's buffer as its bytes
    arrive: never a buffer of the declared size before the bytes exist, so a peer that
    announces a big frame and sends little holds little memory."""

    def __init__(self, sock: _Receiver, limits: ListenerLimits,
                 session: Session, memory: RequestMemory) -> None:
        self._sock = sock
        self._limits = limits
        self._session = session
        self._memory = memory
        self._waiting_for_memory = False
        self._deadline = math.inf  # the frame being read must have arrived by then
        # A negative connections.max.idle.ms (the config accepts -1) disables the idle
        # timeout, as in Kafka; trio refuses negative timeouts, so it must become "never".
        idle_ms = limits.idle_ms_max
        self._idle_s = idle_ms / 1000 if idle_ms >= 0 else math.inf

    async def next_frame(self) -> _Frame | None:
        """The next frame with its lease on the node's request memory, or None at EOF."""
        size = await self._next_size()
        if size is None:
            return None
        lease = self._memory.lease()
        try:
            return await self._read_body_in_time(size, lease)
        except BaseException:
            lease.release()
            raise

    def recycle(self, buffer: bytearray) -> None:
        self._memory.recycle(buffer)

    async def _read_body_in_time(self, size: int, lease: FrameLease) -> _Frame:
        # Timeouts are deadlines handed down to the waits: a cancel scope around every
        # frame cost more than reading it (``raftlog.client.socket_io``).
        self._waiting_for_memory = False
        try:
            self._deadline = trio.current_time() + self._idle_s
            return await self._read_body(size, lease)
        except trio.TooSlowError:
            pass
        if self._waiting_for_memory:
            raise ConnectionClosed(f"no memory for a {size}-byte request within"
                                   f" {self._idle_s:g} s (queued.max.request.bytes)")
        # Said plainly (a bare TooSlowError logged only "send or receive timed out").
        raise ConnectionClosed(f"only part of a {size}-byte request arrived within"
                               f" {self._idle_s:g} s (connections.max.idle.ms)")

    async def _next_size(self) -> int | None:
        try:
            prefix = await self._read_prefix(trio.current_time() + self._idle_s)
        except trio.TooSlowError:
            raise ConnectionClosed(
                f"idle for {self._idle_s:g} s (connections.max.idle.ms)") from None
        if prefix is None:
            return None
        size: int = _SIZE.unpack(prefix)[0]
        if size < 8 or size > self._limits.request_bytes_max:
            raise ConnectionClosed(
                f"frame of {size} bytes outside [8, {self._limits.request_bytes_max}]"
                " (socket.request.max.bytes)"
            )
        pre_auth_max = self._session.frame_bytes_max
        if pre_auth_max is not None and size > pre_auth_max:
            raise ConnectionClosed(f"frame of {size} bytes during authentication"
                                   f" (limit {pre_auth_max})")
        return size

    async def _read_prefix(self, deadline: float) -> bytearray | None:
        prefix = bytearray(4)
        have = 0
        while have < 4:
            received = await self._sock.recv_into(memoryview(prefix)[have:], 4 - have,
                                                  deadline)
            if received == 0:
                if have == 0:
                    return None
                raise ConnectionClosed("peer closed the connection mid-frame")
            have += received
        return prefix

    async def _read_body(self, size: int, lease: FrameLease) -> _Frame:
        if size <= SMALL_FRAME_BYTES:
            await self._reserve(lease, size)
            return _Frame(await self._fill(bytearray(size)), size, lease)
        await self._reserve(lease, FRAME_BUFFER_BYTES)
        first = self._memory.frame_buffer()
        if size <= len(first):  # the common produce request: one buffer, no copy
            await self._fill(first, size)
            return _Frame(first, size, lease, recyclable=True)
        chunks = [await self._fill(first)]
        await self._read_more_chunks(chunks, size, lease)
        # The codec needs the frame in one piece: one copy, counted against the budget
        # until the chunks are gone.
        await self._reserve(lease, size)
        frame = bytearray().join(chunks)
        chunks.clear()
        self._memory.recycle(first)
        lease.shrink(lease.held - size)
        return _Frame(frame, size, lease)

    async def _read_more_chunks(self, chunks: list[bytearray], size: int,
                                lease: FrameLease) -> None:
        """The rest of a big frame in chunks that double as its bytes arrive, each allocated
        only once the budget grants it: a frame holds at most about twice what its peer has
        sent, never the size it declared."""
        have = sum(len(chunk) for chunk in chunks)
        while have < size:
            nbytes = min(size - have, max(FRAME_BUFFER_BYTES, have))
            await self._reserve(lease, nbytes)
            chunks.append(await self._fill(bytearray(nbytes)))
            have += nbytes

    async def _reserve(self, lease: FrameLease, nbytes: int) -> None:
        # Waiting here stops reading this socket: the back-pressure on the peer.
        self._waiting_for_memory = True
        await lease.grow(nbytes, self._deadline)
        self._waiting_for_memory = False

    async def _fill(self, buffer: bytearray, size: int | None = None) -> bytearray:
        """Receives exactly ``size`` bytes (all of ``buffer`` by default) into ``buffer``."""
        size = len(buffer) if size is None else size
        view = memoryview(buffer)
        have = 0
        while have < size:
            received = await self._sock.recv_into(view[have:size], size - have,
                                                  self._deadline)
            if received == 0:
                raise ConnectionClosed("peer closed the connection mid-frame")
            have += received
        view.release()  # the buffer may be joined, checked for views or recycled later
        return buffer


async def _write_responses(
    stream: trio.SocketStream | TlsStream,
    slots: trio.MemoryReceiveChannel[_Slot], stats: RequestStats,
    quota: ConnectionQuota | None = None,
) -> None:
    async with slots:
        async for slot in slots:
            if slot.deferred is not None:
                await _finish_deferred(slot, slot.deferred)
            if quota is not None:
                await quota.account(slot)
            taken = _now()
            if not slot.respond:
                stats.record(slot.name, None, slot.read, slot.start, slot.local, slot.ready,
                             taken, taken)
                continue
            if slot.body is None:
                raise ConnectionClosed(f"{slot.api.name} handler failed")
            chunks = _encode_response(slot)
            try:
                await send_chunks(stream, chunks, trio.current_time() + SEND_TIMEOUT_S)
            except EOFError as exc:
                raise ConnectionClosed(str(exc)) from exc
            if quota is not None:
                quota.sent()
            stats.record(slot.name, slot.body, slot.read, slot.start, slot.local, slot.ready,
                         taken, _now())


def _encode_response(slot: _Slot) -> list[bytes | bytearray | memoryview | Region]:
    assert slot.body is not None
    # KIP-511: the ApiVersions response header is always v0, even at flexible versions.
    flexible_header = slot.api.is_flexible(slot.version) and slot.api is not API_VERSIONS
    header = codec.encode_response_header(slot.correlation_id, flexible_header)
    body = codec.encode(slot.api, slot.version, slot.body, is_request=False)
    size = len(header) + sum(chunk_size(c) for c in body)
    return [_SIZE.pack(size) + header, *body]


async def serve_listener(
    host: str,
    port: int,
    handlers: dict[int, Handler],
    limits: ListenerLimits,
    stats: RequestStats | None = None,
    *,
    listener: str = LISTENER_NAME,
    tls: TlsListener | None = None,
    memory: RequestMemory | None = None,
    sasl_required: bool = False,
    quotas: QuotaEnforcer | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listens on host:port and serves every connection in this task's own nursery,
    recording requests and connections in ``stats`` (the node's; a fresh one by default).
    With ``tls`` every connection first completes a TLS handshake. ``memory`` is the node's
    request budget, shared by its listeners (a fresh one by default)."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound_port = listeners[0].socket.getsockname()[1]
    protocol = ("SASL_" if sasl_required else "") + ("SSL" if tls else "PLAINTEXT")
    log.info("Kafka listener %s (%s) on %s:%d", listener, protocol, host, bound_port)

    if memory is None:
        memory = RequestMemory(limits.queued_request_bytes_max)  # one budget for the node
    request_stats = RequestStats() if stats is None else stats

    async def handle(stream: trio.SocketStream) -> None:
        if tls is None:
            await serve_connection(stream, handlers, limits, memory, request_stats, listener,
                                   sasl_required=sasl_required, quotas=quotas)
            return
        accepted = await accept_tls(stream, tls, _peer_name(stream))
        if accepted is None:
            with trio.move_on_after(1) as cleanup:
                cleanup.shield = True
                await stream.aclose()
            return
        await serve_connection(accepted[0], handlers, limits, memory, request_stats, listener,
                               principal=accepted[1], sasl_required=sasl_required,
                               quotas=quotas)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handle, listeners)
        task_status.started(bound_port)
