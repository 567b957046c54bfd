"""The metrics and health endpoint: a small HTTP/1.1 server on trio, framed by ``h11``.

=================  =============================================================================
``GET /metrics``   the registry in Prometheus's text format (gzip when the client accepts it)
``/health/live``   ``200`` while the loop serves requests at all
``/health/ready``  ``200`` when ``ready()`` names no reason not to be, else ``503`` and the
                   reasons (JSON)
=================  =============================================================================

Anything else is ``404``; a known path with another method ``405``. The registry is collected
on the trio thread (the collectors only read the parts' state; nothing here starts a thread).

Bounds: a request head of at most ``header_bytes_max`` (``431`` past it), a body of at most
``body_bytes_max`` (``413``), every receive and send within ``io_timeout_s``, a kept-alive
connection closed after ``idle_timeout_s`` without a request, and at most
``connections_max`` connections at once (further ones wait in the listen backlog).
"""

from __future__ import annotations

import errno
import gzip
import http
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import h11
import trio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.exposition import gzip_accepted
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

RECEIVE_BYTES: Final = 16 << 10
# accept() errors that mean "out of resources for now": wait and accept again (as trio's
# serve_listeners does) instead of stopping the endpoint.
_ACCEPT_RETRY_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM,
                                         errno.ENOBUFS})
_ACCEPT_RETRY_S: Final = 0.1
_LINGER_S: Final = 1.0
_LINGER_BYTES_MAX: Final = 256 << 10
METRICS_PATH: Final = b"/metrics"
LIVE_PATH: Final = b"/health/live"
READY_PATH: Final = b"/health/ready"
_PATHS: Final = frozenset({METRICS_PATH, LIVE_PATH, READY_PATH})

# Why this node is not ready (empty: it is).
Readiness = Callable[[], Sequence[str]]


@dataclass(frozen=True)
class HttpLimits:
    connections_max: int = 32
    header_bytes_max: int = 16 << 10
    body_bytes_max: int = 64 << 10
    io_timeout_s: float = 10.0
    # Longer than Prometheus's usual scrape intervals (15 s, 60 s), so a scraper's kept-alive
    # connection is still there for its next scrape.
    idle_timeout_s: float = 75.0


@dataclass(frozen=True)
class _Response:
    status: int
    content_type: bytes
    body: bytes
    extra_headers: tuple[tuple[bytes, bytes], ...] = ()


class _TooLarge(Exception):
    """The request body is over ``body_bytes_max``."""


class MetricsServer:
    """Serves ``registry`` and the health checks; ``start`` runs it in a caller's nursery."""

    def __init__(self, registry: Collector, ready: Readiness,
                 limits: HttpLimits = HttpLimits()) -> None:
        self._registry = registry
        self._ready = ready
        self._limits = limits
        self._slots = trio.Semaphore(limits.connections_max)

    async def start(self, nursery: trio.Nursery, host: str, port: int) -> int:
        """Binds host:port (0: a free port) and serves in ``nursery`` (the accept loop and
        every connection are tasks there); returns the bound port."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        if port == 0:
            # Each address of a name gets its own free port: serve the one reported.
            for extra in listeners[1:]:
                await extra.aclose()
            listeners = listeners[:1]
        for listener in listeners:
            nursery.start_soon(self._accept, listener, nursery)
        bound: int = listeners[0].socket.getsockname()[1]
        return bound

    async def _accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        async with listener:
            while True:
                await self._slots.acquire()
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    self._slots.release()
                    if exc.errno not in _ACCEPT_RETRY_ERRNOS:
                        raise
                    log.warning("metrics endpoint: accept failed (%s); retrying", exc)
                    await trio.sleep(_ACCEPT_RETRY_S)
                    continue
                except BaseException:
                    self._slots.release()
                    raise
                nursery.start_soon(self._serve_connection, stream)

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self._limits.header_bytes_max)
        try:
            await self._serve_requests(stream, conn)
        except h11.RemoteProtocolError as exc:
            await self._refuse(stream, conn, exc.error_status_hint, str(exc))
        except _TooLarge:
            await self._refuse(stream, conn, 413, "request body too large")
        except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError,
                OSError, h11.LocalProtocolError) as exc:
            log.debug("metrics endpoint: connection dropped: %r", exc)
        except Exception:  # a bug must cost one connection, never the node
            log.exception("metrics endpoint: connection failed")
        finally:
            self._slots.release()
            with trio.move_on_after(1) as cleanup:
                cleanup.shield = True
                await stream.aclose()

    async def _serve_requests(self, stream: trio.SocketStream, conn: h11.Connection) -> None:
        while True:
            request = await self._read_request(stream, conn)
            if request is None:
                return
            try:
                response = self._answer(request)
            except Exception:  # a failing collector: say so, keep serving
                log.exception("metrics endpoint: answering %r failed", request.target)
                response = _text(500, "internal error\n")
            await self._send(stream, conn, response)
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return  # "Connection: close" or HTTP/1.0: h11 says MUST_CLOSE
            conn.start_next_cycle()

    async def _read_request(self, stream: trio.SocketStream,
                            conn: h11.Connection) -> h11.Request | None:
        """The next request, its body read and dropped; None when the peer closed or the
        connection idled out between requests."""
        limits = self._limits
        deadline = trio.current_time() + limits.idle_timeout_s
        started = False  # any byte of this request received (then the I/O timeout applies)
        request: h11.Request | None = None
        body_bytes = 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                with trio.move_on_at(deadline):
                    data = await stream.receive_some(RECEIVE_BYTES)
                    if not started:
                        started = True
                        deadline = trio.current_time() + limits.io_timeout_s
                    conn.receive_data(data)
                    continue
                if not started:
                    return None  # idle keep-alive connection
                raise trio.TooSlowError
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body_bytes += len(event.data)
                if body_bytes > limits.body_bytes_max:
                    raise _TooLarge
            elif isinstance(event, h11.EndOfMessage):
                return request
            elif isinstance(event, h11.ConnectionClosed):
                return None

    def _answer(self, request: h11.Request) -> _Response:
        path = request.target.split(b"?", 1)[0]
        if path not in _PATHS:
            return _text(404, "not found\n")
        if request.method != b"GET":
            return _Response(405, b"text/plain; charset=utf-8", b"only GET\n",
                             ((b"Allow", b"GET"),))
        if path == METRICS_PATH:
            return self._metrics(request)
        if path == LIVE_PATH:
            return _text(200, "live\n")
        reasons = list(self._ready())
        body = json.dumps({"ready": not reasons, "reasons": reasons}).encode() + b"\n"
        return _Response(503 if reasons else 200, b"application/json", body)

    def _metrics(self, request: h11.Request) -> _Response:
        output = generate_latest(self._registry)
        accept = b", ".join(value for name, value in request.headers
                            if name == b"accept-encoding").decode("latin-1")
        if gzip_accepted(accept):
            # Level 1: text metrics compress well anyway, and this runs on the trio thread.
            return _Response(200, CONTENT_TYPE_LATEST.encode(), gzip.compress(output, 1),
                             ((b"Content-Encoding", b"gzip"),))
        return _Response(200, CONTENT_TYPE_LATEST.encode(), output)

    async def _send(self, stream: trio.SocketStream, conn: h11.Connection,
                    response: _Response, *, close: bool = False) -> None:
        headers = [(b"Content-Type", response.content_type),
                   (b"Content-Length", b"%d" % len(response.body)), *response.extra_headers]
        if close:
            headers.append((b"Connection", b"close"))
        with trio.fail_after(self._limits.io_timeout_s):
            await stream.send_all(conn.send(h11.Response(
                status_code=response.status, headers=headers,
                reason=http.HTTPStatus(response.status).phrase)))
            await stream.send_all(conn.send(h11.Data(data=response.body)))
            await stream.send_all(conn.send(h11.EndOfMessage()))

    async def _refuse(self, stream: trio.SocketStream, conn: h11.Connection, status: int,
                      reason: str) -> None:
        """Answers a broken request with ``status`` (when no response started) before the
        connection closes."""
        log.debug("metrics endpoint: %d %s", status, reason)
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        try:
            await self._send(stream, conn, _text(status, f"{reason}\n"), close=True)
            # A lingering close: closing with unread bytes would reset the connection, and
            # the client could lose the answer. Say EOF, then read what it still sends, for
            # a bounded time and amount.
            with trio.move_on_after(_LINGER_S):
                await stream.send_eof()
                drained = 0
                while drained < _LINGER_BYTES_MAX:
                    chunk = await stream.receive_some(RECEIVE_BYTES)
                    if not chunk:
                        break
                    drained += len(chunk)
        except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError,
                OSError, h11.LocalProtocolError) as exc:
            log.debug("metrics endpoint: could not send %d: %r", status, exc)


def _text(status: int, text: str) -> _Response:
    return _Response(status, b"text/plain; charset=utf-8", text.encode())


def endpoint_url(host: str, port: int) -> str:
    """The base URL of an endpoint bound on host:port (a wildcard host as 127.0.0.1)."""
    shown = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}"



async def http_get(host: str, port: int, path: str, *, timeout_s: float = 5.0,
                   headers: Sequence[tuple[str, str]] = (),
                   body_bytes_max: int = 64 << 20) -> tuple[int, dict[str, str], bytes]:
    """GET ``path`` from an HTTP/1.1 server (one connection, closed after): status, headers
    (lower-case names) and body. For ``raftlog cluster up`` and tests.

    Raises:
        OSError, trio.BrokenResourceError, h11.ProtocolError: no (complete) answer.
        trio.TooSlowError: no answer within ``timeout_s``.
    """
    with trio.fail_after(timeout_s):
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            conn = h11.Connection(h11.CLIENT)
            request = h11.Request(method="GET", target=path, headers=[
                ("Host", f"{host}:{port}"), ("Connection", "close"), *headers])
            await stream.send_all(conn.send(request))
            await stream.send_all(conn.send(h11.EndOfMessage()))
            status, answered, body = 0, {}, bytearray()
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive_some(RECEIVE_BYTES))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                    answered = {name.decode(): value.decode("latin-1")
                                for name, value in event.headers}
                elif isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > body_bytes_max:
                        raise h11.RemoteProtocolError("response body too large")
                elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                    return status, answered, bytes(body)
