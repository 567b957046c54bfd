"""How the listener writes a response: bytes and file regions, over plaintext or TLS.

A Fetch answer's records are file regions (``FileSlice``: a dup'd fd, a position, a size),
never decoded by the broker. Big answers go out with ``sendfile``; an answer of at most
``COPIED_RESPONSE_BYTES`` is one ``send``, its regions read with ``pread`` (a follower's ~1
KiB answer cost a second syscall and a second TCP segment with sendfile); over TLS every answer
is copied through one bounded buffer (``raftlog.server.tls.send_copying``). Plaintext sockets
are written without a scheduler pass per call (``raftlog.client.socket_io``).
"""

from __future__ import annotations

import errno
import math
import os
from typing import Protocol

import trio

from raftlog.client import socket_io
from raftlog.client.tls_stream import TlsStream
from raftlog.protocol.codec import Region
from raftlog.server.tls import send_copying

__all__ = ["COPIED_RESPONSE_BYTES", "FileRegion", "PlainSocket", "chunk_size", "send_chunks"]

# A response up to this size goes out in one send: its file regions are read into the buffer
# (pread) rather than sent with sendfile after the bytes before them. A follower's Fetch answer
# at light load is ~1 KiB: sendfile cost the leader a second syscall (measured 139 us against
# 66 us for the send) and the follower a second wake-up for the second TCP segment.
COPIED_RESPONSE_BYTES = 64 << 10


class FileRegion(Region, Protocol):
    """A region backed by a file descriptor that the writer sends with sendfile."""

    fd: int
    position: int

    def read_bytes(self) -> bytes: ...

    def close(self) -> None: ...


class PlainSocket:
    """A plaintext connection's socket as the listener reads it: without a scheduler pass
    per call, the timeout only around an actual wait (``raftlog.client.socket_io``). A TLS
    connection is read through its ``TlsStream``."""

    __slots__ = ("socket",)

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.socket = sock

    async def recv_into(self, view: memoryview, nbytes: int, deadline: float) -> int:
        return await socket_io.recv_into(self.socket, view, nbytes, deadline)


def chunk_size(chunk: bytes | bytearray | memoryview | Region) -> int:
    if isinstance(chunk, bytes | bytearray | memoryview):
        return len(chunk)
    return chunk.size_bytes


async def send_chunks(
    stream: trio.SocketStream | TlsStream,
    chunks: list[bytes | bytearray | memoryview | Region],
    deadline: float = math.inf,
) -> None:
    """Sends bytes with send_all and file regions with sendfile, closing every region, all
    by ``deadline`` (trio.TooSlowError after it); EOFError when a region's file is shorter
    than the region (a truncated segment). Over TLS the regions are copied through one
    bounded buffer with the bytes around them (``raftlog.server.tls.send_copying``); a
    plaintext response of at most COPIED_RESPONSE_BYTES is read into one buffer and sent
    at once."""
    pending = bytearray()
    try:
        if not isinstance(stream, trio.SocketStream):
            with trio.fail_at(deadline):
                await send_copying(stream, chunks)
            return
        sock = stream.socket
        if sum(chunk_size(c) for c in chunks) <= COPIED_RESPONSE_BYTES:
            await socket_io.send_all(sock, b"".join(_copied(chunks)), deadline)
            return
        for chunk in chunks:
            if isinstance(chunk, bytes | bytearray | memoryview):
                pending += chunk
                continue
            if pending:
                await socket_io.send_all(sock, pending, deadline)
                pending = bytearray()
            await _sendfile(sock, chunk, deadline)  # type: ignore[arg-type]
        if pending:
            await socket_io.send_all(sock, pending, deadline)
    finally:
        for chunk in chunks:
            close = getattr(chunk, "close", None)
            if close is not None and not isinstance(chunk, bytes | bytearray | memoryview):
                close()


def _copied(chunks: list[bytes | bytearray | memoryview | Region]
            ) -> list[bytes | bytearray | memoryview]:
    """The chunks as bytes, each file region read whole (``FileSlice.read_bytes``; EOFError
    when the file is shorter than the region: a truncated segment)."""
    parts: list[bytes | bytearray | memoryview] = []
    for chunk in chunks:
        if isinstance(chunk, bytes | bytearray | memoryview):
            parts.append(chunk)
            continue
        region: FileRegion = chunk  # type: ignore[assignment]
        data = region.read_bytes()
        if len(data) != region.size_bytes:
            raise EOFError("file region shorter than expected (segment truncated?)")
        parts.append(data)
    return parts


async def _sendfile(sock: trio.socket.SocketType, region: FileRegion, deadline: float) -> None:
    offset = region.position
    remaining = region.size_bytes
    while remaining > 0:
        try:
            sent = os.sendfile(sock.fileno(), region.fd, offset, remaining)
        except BlockingIOError:
            await socket_io.wait_writable(sock, deadline)
            continue
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                await socket_io.wait_writable(sock, deadline)
                continue
            raise
        if sent == 0:
            raise EOFError("file region shorter than expected (segment truncated?)")
        offset += sent
        remaining -= sent
    await trio.lowlevel.checkpoint()
