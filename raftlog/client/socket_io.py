"""Receiving and sending on a plaintext trio socket without a scheduler pass per call.

trio's socket methods end every call that succeeded at once with a checkpoint, so that each
``await`` may switch tasks. A Kafka request costs several of them (the size prefix, the
body, the response), each one more pass through the run loop with its ``epoll_wait``: the
broker leading a partition went through the loop 15 times per replicated produce. These
helpers make the system call directly and wait only when the socket is not ready (EAGAIN),
which is also where they can be cancelled. The callers yield once per request elsewhere (the
listener's response queue), so a peer that keeps the socket full cannot starve other tasks.

Errors are the OS's (``ConnectionResetError``, ``BrokenPipeError``: ``ConnectionError``),
and trio's ``ClosedResourceError`` when the socket is closed while waiting.
"""

from __future__ import annotations

import os

import trio

__all__ = ["recv_into", "send_all"]


async def recv_into(sock: trio.socket.SocketType, view: memoryview, nbytes: int) -> int:
    """Up to ``nbytes`` bytes into ``view``; 0 at EOF. Waits only while none are there."""
    fd = sock.fileno()
    while True:
        try:
            return os.readv(fd, [view[:nbytes]])
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)


async def send_all(sock: trio.socket.SocketType, data: bytes | bytearray | memoryview) -> None:
    """All of ``data``; waits only while the socket's send buffer is full."""
    view = memoryview(data).cast("B")
    fd = sock.fileno()
    while view:
        try:
            sent = os.write(fd, view)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
            continue
        view = view[sent:]
