"""``queued.max.request.bytes``: one budget for the request bytes a node holds in memory.

Kafka's broker takes every request's buffer from a memory pool and mutes the connections
that cannot get memory until some is given back. The listener does the same with trio
readers, with one difference: memory is granted as a frame's bytes arrive, chunk by chunk,
not for the size the frame declares, so a peer that announces 100 MiB and sends 2 bytes
holds one chunk, not 100 MiB.

Grants are first come, first served. A reader keeps the chunks it has filled while it waits
for the next one, so readers that each hold part of a frame could wait for one another for
ever. Hence, when the budget is short, the reader at the head of the queue takes the single
*overdraft lane* and finishes its frame beyond the budget; the lane is free again when that
frame is released. A frame larger than the whole budget is served the same way. The node
holds at most the budget plus one frame (twice that frame, briefly, while its chunks are
joined), the bound of Kafka's non-strict pool (budget plus one request).

Frames over 64 KiB start in a recycled buffer of ``FRAME_BUFFER_BYTES``. Allocating and
freeing a fresh megabyte for every produce request (now freed as soon as it is handled) made
glibc give the memory back to the kernel and fault it in again each time: ~94,000 page faults
per 200 MB produced against ~800 with recycling, and ~40% less produce throughput. At most
``SPARE_BUFFERS_MAX`` idle buffers are kept, outside the budget.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Final

import trio

log = logging.getLogger(__name__)

UNBOUNDED: Final = -1  # Kafka's default for queued.max.request.bytes (any value <= 0)
QUEUED_MAX_REQUEST_BYTES_DEFAULT: Final = 100 << 20  # raftlog's default: bounded
_EXHAUSTED_LOG_INTERVAL_S: Final = 10.0
# A frame's first buffer. Big enough for a produce request carrying one batch of Kafka's
# default message.max.bytes (1 MiB + 12) with its headers, so the common produce frame is
# read into one buffer and its records stay a view of it, without a copy.
FRAME_BUFFER_BYTES: Final = (1 << 20) + (64 << 10)
SPARE_BUFFERS_MAX: Final = 8


@dataclass(eq=False)
class FrameLease:
    """One frame's share of the budget: it grows as the frame's bytes are read and is given
    back, all at once, when nothing needs the frame any more."""

    memory: RequestMemory
    held: int = 0

    async def grow(self, nbytes: int, deadline: float = math.inf) -> None:
        """Waits until ``nbytes`` more may be allocated for this frame (trio.TooSlowError
        past ``deadline``)."""
        await self.memory.acquire(self, nbytes, deadline)

    def shrink(self, nbytes: int) -> None:
        self.memory.give_back(self, nbytes, done=False)

    def release(self) -> None:
        """Gives back everything; harmless to call again."""
        self.memory.give_back(self, self.held, done=True)


@dataclass(eq=False)
class _Waiter:
    lease: FrameLease
    nbytes: int
    granted: trio.Event = field(default_factory=trio.Event)


class RequestMemory:
    """The node's budget of request bytes being read or handled (one per listener)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity if capacity > 0 else UNBOUNDED
        self.used = 0
        self._lane: FrameLease | None = None
        self._queue: deque[_Waiter] = deque()
        self._logged_at = -math.inf
        self._spares: list[bytearray] = []

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def lease(self) -> FrameLease:
        return FrameLease(self)

    def frame_buffer(self) -> bytearray:
        """A buffer of FRAME_BUFFER_BYTES: a recycled one if any (its old bytes are not
        cleared: a frame only ever exposes the bytes it received)."""
        return self._spares.pop() if self._spares else bytearray(FRAME_BUFFER_BYTES)

    def recycle(self, buffer: bytearray) -> None:
        """Keeps ``buffer`` for a later frame. The caller guarantees that nothing views it."""
        if len(buffer) == FRAME_BUFFER_BYTES and len(self._spares) < SPARE_BUFFERS_MAX:
            self._spares.append(buffer)

    async def acquire(self, lease: FrameLease, nbytes: int, deadline: float = math.inf
                      ) -> None:
        # The lane's frame never queues: the queue may be waiting for exactly that frame.
        if (not self._queue or lease is self._lane) and self._admit(lease, nbytes):
            return
        waiter = _Waiter(lease, nbytes)
        self._queue.append(waiter)
        self._log_exhausted()
        try:
            with trio.fail_at(deadline):
                await waiter.granted.wait()
        except BaseException:
            # Cancelled (a timeout, the connection closing). Bytes granted meanwhile are
            # already in the lease, which its owner releases; otherwise leave the queue,
            # which may let the next reader in.
            if not waiter.granted.is_set():
                self._queue.remove(waiter)
                self._admit_waiting()
            raise

    def give_back(self, lease: FrameLease, nbytes: int, *, done: bool) -> None:
        nbytes = min(nbytes, lease.held)
        lease.held -= nbytes
        self.used -= nbytes
        if done and lease is self._lane:
            self._lane = None
        self._admit_waiting()

    def _admit(self, lease: FrameLease, nbytes: int) -> bool:
        if self.capacity != UNBOUNDED and lease is not self._lane and \
                self.used + nbytes > self.capacity:
            if self._lane is not None:
                return False
            self._lane = lease
            log.debug("request memory: a frame goes past the budget (%d of %d bytes in use)",
                      self.used, self.capacity)
        lease.held += nbytes
        self.used += nbytes
        return True

    def _admit_waiting(self) -> None:
        while self._queue and self._admit(self._queue[0].lease, self._queue[0].nbytes):
            self._queue.popleft().granted.set()

    def _log_exhausted(self) -> None:
        now = trio.current_time()
        if now - self._logged_at >= _EXHAUSTED_LOG_INTERVAL_S:
            self._logged_at = now
            log.info("request memory exhausted: %d of %d bytes (queued.max.request.bytes) "
                     "held by requests being read or handled; %d reader(s) wait",
                     self.used, self.capacity, len(self._queue))


def is_viewed(data: bytearray) -> bool:
    """Whether anything still holds a memoryview of ``data``. A bytearray cannot change size
    while it is viewed, so taking its last byte off and putting it back (in place, without a
    reallocation: O(1)) answers without keeping track of every view a handler made."""
    try:
        last = data.pop()
    except BufferError:
        return True
    data.append(last)
    return False
