"""TlsStream: a real TLS handshake over loopback sockets, both directions at once with large
payloads, many records decrypted per receive, end of stream with and without close_notify,
and a handshake refused for an untrusted certificate."""

from __future__ import annotations

import hashlib
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from raftlog.client.tls_stream import TlsStream
from tests.integration.tls_certs import Certs, make_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("tls-stream"))


def _server_context(certs: Certs) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.server)
    return context


def _client_context(ca: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=ca)
    return context


@asynccontextmanager
async def _pair(certs: Certs, ca: Path | None = None
                ) -> AsyncIterator[tuple[TlsStream, TlsStream]]:
    """A connected (client, server) pair with both handshakes done."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        accepted: list[TlsStream] = []

        async def accept() -> None:
            tcp = await listeners[0].accept()
            server = TlsStream(tcp, _server_context(certs), server_side=True)
            await server.do_handshake()
            accepted.append(server)

        nursery.start_soon(accept)
        tcp = await trio.open_tcp_stream("127.0.0.1", port)
        client = TlsStream(tcp, _client_context(ca or certs.ca), server_side=False,
                           server_hostname="localhost")
        with trio.fail_after(30):
            await client.do_handshake()
    assert accepted
    try:
        yield client, accepted[0]
    finally:
        for stream in (client, accepted[0]):
            await stream.aclose()
        await listeners[0].aclose()


async def _read_exactly(stream: TlsStream, total: int, chunk: int) -> tuple[bytes, int]:
    """Reads ``total`` bytes with recv_into of at most ``chunk`` bytes; returns the SHA-256
    and how many calls it took."""
    digest, calls, buffer = hashlib.sha256(), 0, memoryview(bytearray(chunk))
    remaining = total
    while remaining:
        count = await stream.recv_into(buffer, min(chunk, remaining))
        assert count > 0, "end of stream before all bytes arrived"
        digest.update(buffer[:count])
        remaining -= count
        calls += 1
    return digest.digest(), calls


def _run(test: Callable[[], Awaitable[None]]) -> None:
    trio.run(test)


def test_large_payloads_cross_in_both_directions_at_once(certs: Certs) -> None:
    up, down = os.urandom(3 * 1024 * 1024 + 17), os.urandom(2 * 1024 * 1024 + 5)

    async def main() -> None:
        async with _pair(certs) as (client, server):
            results: dict[str, bytes] = {}

            async def send(stream: TlsStream, data: bytes) -> None:
                for start in range(0, len(data), 1 << 20):  # as the listener sends: 1 MiB
                    await stream.send_all(data[start:start + (1 << 20)])

            async def receive(name: str, stream: TlsStream, total: int) -> None:
                results[name], _ = await _read_exactly(stream, total, 1 << 20)

            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(send, client, up)
                    nursery.start_soon(send, server, down)
                    nursery.start_soon(receive, "up", server, len(up))
                    nursery.start_soon(receive, "down", client, len(down))
            assert results["up"] == hashlib.sha256(up).digest()
            assert results["down"] == hashlib.sha256(down).digest()

    _run(main)


def test_one_receive_decrypts_every_record_that_has_arrived(certs: Certs) -> None:
    """What trio.SSLStream does not do: 1 MiB sent at once arrives in far fewer receives than
    its 64 TLS records (each call drains everything already read from the socket)."""
    payload = os.urandom(1 << 20)

    async def main() -> None:
        async with _pair(certs) as (client, server):
            with trio.fail_after(30):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(client.send_all, payload)
                    digest, calls = await _read_exactly(server, len(payload), len(payload))
            assert digest == hashlib.sha256(payload).digest()
            assert calls < 64 // 2, f"{calls} receives for 64 records"

    _run(main)


def test_close_notify_and_a_bare_close_both_read_as_end_of_stream(certs: Certs) -> None:
    async def main() -> None:
        async with _pair(certs) as (client, server):
            await client.send_all(b"last words")
            await client.aclose()  # close_notify, then the socket
            buffer = memoryview(bytearray(64))
            with trio.fail_after(30):
                count = await server.recv_into(buffer, 64)
                assert bytes(buffer[:count]) == b"last words"
                assert await server.recv_into(buffer, 64) == 0
        async with _pair(certs) as (client, server):
            # The client reads first, so it has consumed the server's TLS 1.3 session tickets
            # (closing with unread bytes would be a reset, not an end of stream).
            await server.send_all(b"hello")
            with trio.fail_after(30):
                assert await client.recv_into(memoryview(bytearray(8)), 8) == 5
            await client.transport_stream.aclose()  # no close_notify
            with trio.fail_after(30):
                assert await server.recv_into(memoryview(bytearray(8)), 8) == 0

    _run(main)


def test_a_client_that_does_not_trust_the_server_fails_the_handshake(certs: Certs) -> None:
    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        server_failed = trio.Event()

        async def accept() -> None:
            tcp = await listeners[0].accept()
            server = TlsStream(tcp, _server_context(certs), server_side=True)
            with pytest.raises(trio.BrokenResourceError):
                await server.do_handshake()
            server_failed.set()
            await server.aclose()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(accept)
            tcp = await trio.open_tcp_stream("127.0.0.1", port)
            client = TlsStream(tcp, _client_context(certs.untrusted_ca), server_side=False,
                               server_hostname="localhost")
            with trio.fail_after(30):
                with pytest.raises(trio.BrokenResourceError, match="CERTIFICATE_VERIFY_FAILED"):
                    await client.do_handshake()
                await client.aclose()
                await server_failed.wait()
        await listeners[0].aclose()

    _run(main)
