"""Producer ids: blocks from the controller, handed out one id at a time by each broker.

Kafka 3.x (KIP-730, ``RPCProducerIdManager``): a broker asks the controller for a block of
1000 ids with AllocateProducerIds (67); the controller commits a ``ProducerIdsRecord`` so no
two brokers ever get overlapping blocks. Once 90 % of the current block is used
(``PidPrefetchThreshold = 0.90``) the next block is requested in the background; a request
that finds no id left waits at most its timeout and then fails with
COORDINATOR_LOAD_IN_PROGRESS, which every client retries.

``ProducerIdManager`` is the broker side. Its block source is an injected async callback
``allocate_block() -> (start, length)``; a node passes ``BrokerLifecycle.allocate_block``,
the AllocateProducerIds request through the ``ControllerChannel`` (in-process on a combined
node that is the controller, over TCP otherwise). The controller side is the one in
``raftlog.controller.core`` (decision) and ``raftlog.controller.service`` (the proposal, with the
controller's term and the compare-and-set on ``next_producer_id``), served by
``raftlog.controller.rpcs``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import trio

__all__ = [
    "AllocateBlock",
    "ProducerIdManager",
    "ProducerIdsUnavailableError",
]

log = logging.getLogger(__name__)

PREFETCH_THRESHOLD: Final = 0.9
INT64_MAX: Final = 2**63 - 1

AllocateBlock = Callable[[], Awaitable[tuple[int, int]]]


class ProducerIdsUnavailableError(Exception):
    """No producer id could be handed out within the caller's timeout."""


@dataclass(slots=True)
class _Block:
    start: int
    length: int
    next_id: int

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def remaining(self) -> int:
        return self.end - self.next_id

    @property
    def prefetch_due(self) -> bool:
        """Kafka: ``nextProducerId >= firstProducerId + size * PidPrefetchThreshold``."""
        return self.next_id - self.start >= self.length * PREFETCH_THRESHOLD


class ProducerIdManager:
    """Hands out producer ids from controller-allocated blocks (broker side).

    ``run`` is the service task that fetches blocks; start it in the node's nursery with
    ``await nursery.start(manager.run)``. It fetches the first block at once and the next one
    when 90 % of the current block is used, retrying failures with capped exponential backoff,
    each ``allocate_block`` call bounded by ``allocate_timeout_s``.
    """

    def __init__(
        self,
        allocate_block: AllocateBlock,
        *,
        allocate_timeout_s: float = 10.0,
        backoff_s: float = 0.05,
        backoff_max_s: float = 2.0,
    ) -> None:
        assert allocate_timeout_s > 0 and 0 < backoff_s <= backoff_max_s
        self._allocate_block = allocate_block
        self._allocate_timeout_s = allocate_timeout_s
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._current: _Block | None = None
        self._next: _Block | None = None
        self._highest_end = 0  # end of the newest block received: blocks must not go back
        self._fetch_wanted = trio.Event()
        self._fetch_wanted.set()  # the first block, at startup
        self._block_arrived = trio.Event()
        self.blocks_received = 0  # for status and tests

    @property
    def remaining(self) -> int:
        """Ids available without waiting."""
        return sum(block.remaining for block in (self._current, self._next) if block)

    async def next_producer_id(self, timeout_s: float) -> int:
        """The next unused producer id; waits at most ``timeout_s`` for a block.

        Raises:
            ProducerIdsUnavailableError: none arrived in time (answer
                COORDINATOR_LOAD_IN_PROGRESS, as Kafka does).
        """
        with trio.move_on_after(max(timeout_s, 0)):
            while True:
                producer_id = self._take()
                if producer_id is not None:
                    return producer_id
                self._fetch_wanted.set()
                await self._block_arrived.wait()
        raise ProducerIdsUnavailableError(
            f"no producer id block arrived within {timeout_s:g} s")

    def _take(self) -> int | None:
        block = self._current
        if block is None or block.remaining == 0:
            block, self._current, self._next = self._next, self._next, None
            if block is None:
                return None
        producer_id = block.next_id
        block.next_id += 1
        if block.prefetch_due and self._next is None:
            self._fetch_wanted.set()
        return producer_id

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Fetch blocks whenever one is wanted, forever (cancel to stop)."""
        task_status.started()
        while True:
            await self._fetch_wanted.wait()
            block = await self._fetch_block()
            self._install(block)
            self._fetch_wanted = trio.Event()
            if self._current is None or (self._current.prefetch_due and self._next is None):
                self._fetch_wanted.set()  # e.g. a tiny block already 90 % "used"

    async def _fetch_block(self) -> _Block:
        delay_s = self._backoff_s
        while True:
            failure: str
            with trio.move_on_after(self._allocate_timeout_s) as scope:
                try:
                    start, length = await self._allocate_block()
                except Exception as exc:  # any failure of the RPC/proposal: retry
                    failure = f"{type(exc).__name__}: {exc}"
                else:
                    problem = self._check_block(start, length)
                    if problem is None:
                        return _Block(start, length, start)
                    failure = problem
            if scope.cancelled_caught:
                failure = f"no answer within {self._allocate_timeout_s:g} s"
            log.warning("producer id block allocation failed (%s); retrying in %.2f s",
                        failure, delay_s)
            await trio.sleep(delay_s)
            delay_s = min(delay_s * 2, self._backoff_max_s)

    def _check_block(self, start: int, length: int) -> str | None:
        if start < 0 or length < 1 or start + length - 1 > INT64_MAX:
            return f"invalid block [{start}, +{length})"
        if start < self._highest_end:
            # RPCProducerIdManager: "Producer ID block is not monotonic with current block".
            return f"block at {start} overlaps ids already received (up to {self._highest_end})"
        return None

    def _install(self, block: _Block) -> None:
        self._highest_end = block.end
        self.blocks_received += 1
        if self._current is None or self._current.remaining == 0:
            self._current = block
        else:
            assert self._next is None, "a block is fetched only while none is waiting"
            self._next = block
        arrived, self._block_arrived = self._block_arrived, trio.Event()
        arrived.set()
