"""Receiving and sending on a plaintext trio socket without a scheduler pass per call.

trio's socket methods end every call that succeeded at once with a checkpoint, so that each
``await`` may switch tasks, and a timeout around a call is a cancel scope made and closed
each time. A Kafka request costs several of them (the size prefix, the body, the response):
the broker leading a partition went through the run loop 15 times per replicated produce,
and 12% of its time went to making and closing cancel scopes. These helpers make the system
call directly, and wait (under ``deadline``, a ``trio.current_time()`` instant) only when the
socket is not ready (EAGAIN), which is also where they can be cancelled. The callers yield
once per request elsewhere (the listener's response queue), so a peer that keeps the socket
full cannot starve other tasks.

Errors are the OS's (``ConnectionResetError``, ``BrokenPipeError``: ``ConnectionError``),
trio's ``ClosedResourceError`` when the socket is closed while waiting, and
``trio.TooSlowError`` past the deadline.
"""

from __future__ import annotations

import math
import os
from collections.abc import Awaitable, Callable

import trio

__all__ = ["recv_into", "send_all", "wait_writable"]


async def recv_into(sock: trio.socket.SocketType, view: memoryview, nbytes: int,
                    deadline: float = math.inf) -> int:
    """Up to ``nbytes`` bytes into ``view``; 0 at EOF. Waits only while none are there."""
    fd = sock.fileno()
    while True:
        try:
            return os.readv(fd, [view[:nbytes]])
        except BlockingIOError:
            await _wait(trio.lowlevel.wait_readable, sock, deadline)


async def send_all(sock: trio.socket.SocketType, data: bytes | bytearray | memoryview,
                   deadline: float = math.inf) -> None:
    """All of ``data``; waits only while the socket's send buffer is full."""
    view = memoryview(data).cast("B")
    fd = sock.fileno()
    while view:
        try:
            sent = os.write(fd, view)
        except BlockingIOError:
            await wait_writable(sock, deadline)
            continue
        view = view[sent:]


async def wait_writable(sock: trio.socket.SocketType, deadline: float = math.inf) -> None:
    """Until the send buffer has room (TooSlowError past ``deadline``)."""
    await _wait(trio.lowlevel.wait_writable, sock, deadline)


async def _wait(wait: Callable[[trio.socket.SocketType], Awaitable[None]],
                sock: trio.socket.SocketType, deadline: float) -> None:
    if deadline == math.inf:  # no cancel scope to make and close
        await wait(sock)
    else:
        with trio.fail_at(deadline):
            await wait(sock)
