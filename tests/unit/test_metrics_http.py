"""The metrics and health endpoint (``raftlog.observe.http``) in-process, over real sockets:
routes and status codes, gzip, keep-alive, and its bounds (header size, idle timeout,
connection count)."""

from __future__ import annotations

import gzip
import json
import socket
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import trio
import trio.testing
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric

from raftlog.observe.http import HttpLimits, MetricsServer, endpoint_url, http_get


class OneCounter:
    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("unit_things", "Things counted by a unit test.")
        family.add_metric([], 7)
        yield family


class Readiness:
    def __init__(self) -> None:
        self.reasons: list[str] = ["not registered"]

    def __call__(self) -> list[str]:
        return self.reasons


@asynccontextmanager
async def serving(limits: HttpLimits | None = None,
                  ready: Readiness | None = None) -> AsyncIterator[int]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(OneCounter())
    server = MetricsServer(registry, ready or Readiness(), limits or HttpLimits())
    async with trio.open_nursery() as nursery:
        port = await server.start(nursery, "127.0.0.1", 0)
        yield port
        nursery.cancel_scope.cancel()


def urlopen(url: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


async def raw_exchange(port: int, data: bytes) -> bytes:
    """Sends ``data`` and reads until the server closes the connection."""
    with trio.fail_after(60):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(data)
            received = bytearray()
            while chunk := await stream.receive_some(65536):
                received += chunk
            return bytes(received)


async def test_routes_answer_with_meaningful_status_codes() -> None:
    ready = Readiness()
    async with serving(ready=ready) as port:
        base = endpoint_url("127.0.0.1", port)
        status, headers, body = await trio.to_thread.run_sync(urlopen, base + "/metrics")
        assert status == 200
        assert headers["Content-Type"].startswith("text/plain; version=")
        assert "# HELP unit_things_total Things counted by a unit test." in body.decode()
        assert "unit_things_total 7.0" in body.decode()
        assert (await trio.to_thread.run_sync(urlopen, base + "/health/live"))[0] == 200
        status, _, body = await trio.to_thread.run_sync(urlopen, base + "/health/ready")
        assert status == 503
        assert json.loads(body) == {"ready": False, "reasons": ["not registered"]}
        ready.reasons = []
        status, _, body = await trio.to_thread.run_sync(urlopen, base + "/health/ready")
        assert (status, json.loads(body)) == (200, {"ready": True, "reasons": []})
        assert (await trio.to_thread.run_sync(urlopen, base + "/nothing"))[0] == 404
        status, headers, _ = await trio.to_thread.run_sync(urlopen, base + "/metrics", "POST")
        assert status == 405
        assert headers["Allow"] == "GET"
        assert (await trio.to_thread.run_sync(urlopen, base + "/metrics?x=1"))[0] == 200


async def test_metrics_are_gzipped_when_the_client_accepts_it() -> None:
    async with serving() as port:
        status, headers, body = await http_get(
            "127.0.0.1", port, "/metrics", headers=[("Accept-Encoding", "gzip")])
        assert status == 200
        assert headers["content-encoding"] == "gzip"
        assert b"unit_things_total 7.0" in gzip.decompress(body)
        status, headers, body = await http_get("127.0.0.1", port, "/metrics")
        assert "content-encoding" not in headers
        assert b"unit_things_total 7.0" in body


async def test_keep_alive_serves_several_requests_on_one_connection() -> None:
    async with serving() as port:
        request = b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n"
        last = b"GET /health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        answer = await raw_exchange(port, request * 2 + last)
        assert answer.count(b"HTTP/1.1 200 OK\r\n") == 3


async def test_oversized_request_head_gets_431_and_the_connection_closes() -> None:
    async with serving(HttpLimits(header_bytes_max=4096)) as port:
        # h11 bounds what it buffers of an incomplete head: past the limit plus one receive.
        big = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (64 << 10) + b"\r\n\r\n"
        answer = await raw_exchange(port, big)
        assert answer.startswith(b"HTTP/1.1 431 ")
        # The next connection is served normally.
        assert (await http_get("127.0.0.1", port, "/health/live"))[0] == 200


async def test_garbage_gets_400() -> None:
    async with serving() as port:
        answer = await raw_exchange(port, b"NOT HTTP AT ALL\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400 ")


async def test_a_request_body_over_the_limit_gets_413() -> None:
    async with serving(HttpLimits(body_bytes_max=100)) as port:
        answer = await raw_exchange(
            port, b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
            + b"x" * 1000)
        assert answer.startswith(b"HTTP/1.1 413 ")


async def test_an_idle_connection_is_closed() -> None:
    async with serving(HttpLimits(idle_timeout_s=0.2)) as port:
        # Nothing sent: closed after the idle timeout, without a response.
        assert await raw_exchange(port, b"") == b""
        # After a kept-alive response: closed again once idle.
        answer = await raw_exchange(port, b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n")


async def test_a_request_that_stalls_midway_times_out() -> None:
    async with serving(HttpLimits(io_timeout_s=0.2)) as port:
        assert await raw_exchange(port, b"GET /metrics HTTP/1.1\r\nHo") == b""


async def test_connections_over_the_limit_wait_for_a_free_slot() -> None:
    async with serving(HttpLimits(connections_max=1)) as port:
        first = await trio.open_tcp_stream("127.0.0.1", port)
        # A plain socket, to look at its receive queue without waiting.
        second = socket.create_connection(("127.0.0.1", port), timeout=60)
        second.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await trio.testing.wait_all_tasks_blocked()
        second.setblocking(False)  # with a timeout, Python would wait out EAGAIN
        try:
            second.recv(1, socket.MSG_PEEK)
            raise AssertionError("the second connection was served while the first held the slot")
        except BlockingIOError:
            pass
        second.settimeout(60)
        await first.aclose()

        def read_all() -> bytes:
            received = bytearray()
            while chunk := second.recv(65536):
                received += chunk
            return bytes(received)

        try:
            assert (await trio.to_thread.run_sync(read_all)).startswith(b"HTTP/1.1 200 OK\r\n")
        finally:
            second.close()


def test_endpoint_url_shows_a_reachable_host() -> None:
    assert endpoint_url("0.0.0.0", 9) == "http://127.0.0.1:9"
    assert endpoint_url("::1", 9) == "http://[::1]:9"
    assert endpoint_url("localhost", 9) == "http://localhost:9"
