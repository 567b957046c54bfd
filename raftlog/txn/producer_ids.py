"""Producer ids: blocks from the controller, handed out one id at a time by each broker.

Kafka 3.x (KIP-730, ``RPCProducerIdManager``): a broker asks the controller for a block of
1000 ids with AllocateProducerIds (67); the controller commits a ``ProducerIdsRecord`` so no
two brokers ever get overlapping blocks. Once 90 % of the current block is used
(``PidPrefetchThreshold = 0.90``) the next block is requested in the background; a request
that finds no id left waits at most its timeout and then fails with
COORDINATOR_LOAD_IN_PROGRESS, which every client retries.

* ``ProducerIdManager`` is the broker side. Its block source is an injected async callback
  ``allocate_block() -> (start, length)``: the AllocateProducerIds RPC to the controller, or,
  on a single node, ``QuorumBlockAllocator.for_node(node_id)``.
* ``QuorumBlockAllocator`` is the controller side: it proposes a ``ProducerIdBlock`` record
  (compare-and-set on the image's ``next_producer_id``) and is what the AllocateProducerIds
  handler calls.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import trio

from raftlog.fetch.errors import ErrorCode
from raftlog.metadata import errors as metadata_errors
from raftlog.metadata import quorum as quorum_module
from raftlog.metadata.errors import wire_error_code
from raftlog.metadata.quorum import Quorum, QuorumError
from raftlog.metadata.records import ProducerIdBlock

__all__ = [
    "BLOCK_SIZE",
    "STALE_BROKER_EPOCH",
    "AllocateBlock",
    "ProducerIdAllocationError",
    "ProducerIdManager",
    "ProducerIdsUnavailableError",
    "QuorumBlockAllocator",
]

log = logging.getLogger(__name__)

# ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE
BLOCK_SIZE: Final = 1000
PREFETCH_THRESHOLD: Final = 0.9
INT64_MAX: Final = 2**63 - 1
# Errors.STALE_BROKER_EPOCH, not (yet) in raftlog.fetch.errors.ErrorCode.
STALE_BROKER_EPOCH: Final = 77

AllocateBlock = Callable[[], Awaitable[tuple[int, int]]]


class ProducerIdsUnavailableError(Exception):
    """No producer id could be handed out within the caller's timeout."""


class ProducerIdAllocationError(Exception):
    """The controller refused or failed to allocate a block; ``error_code`` is the Kafka code
    for the AllocateProducerIds response."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


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


class QuorumBlockAllocator:
    """Controller side of AllocateProducerIds: commits a ``ProducerIdBlock`` record.

    Kafka's ``ProducerIdControlManager.generateNextProducerId``: the broker's epoch must match
    its registration (else STALE_BROKER_EPOCH 77); a node that is not the controller answers
    NOT_CONTROLLER (41). A lost compare-and-set race (two proposals read the same
    ``next_producer_id``) is retried; proposals are serialised so that this is rare.
    """

    def __init__(
        self,
        quorum: Quorum,
        *,
        block_size: int = BLOCK_SIZE,
        propose_timeout_s: float = 5.0,
        attempts: int = 3,
    ) -> None:
        assert block_size >= 1 and propose_timeout_s > 0 and attempts >= 1
        self._quorum = quorum
        self._block_size = block_size
        self._propose_timeout_s = propose_timeout_s
        self._attempts = attempts
        self._lock = trio.Lock()

    def for_node(self, node_id: int) -> AllocateBlock:
        """An ``allocate_block`` for a node that is itself the controller (single node)."""

        async def allocate_block() -> tuple[int, int]:
            return await self(node_id, -1)

        return allocate_block

    async def __call__(self, broker_id: int, broker_epoch: int) -> tuple[int, int]:
        """Allocate a block for ``broker_id``; ``broker_epoch`` -1 skips the epoch check.

        Raises:
            ProducerIdAllocationError: with the code for the response.
        """
        if not getattr(self._quorum, "controller_ready", True):
            raise ProducerIdAllocationError(ErrorCode.NOT_CONTROLLER, "not the controller")
        broker = self._quorum.image.brokers.get(broker_id)
        if broker is None or (broker_epoch != -1 and broker_epoch != broker.epoch):
            known = "not registered" if broker is None else f"registered with epoch {broker.epoch}"
            raise ProducerIdAllocationError(
                STALE_BROKER_EPOCH, f"broker {broker_id} epoch {broker_epoch}: {known}")
        # Bounds the wait for the lock too (another allocation in progress).
        with trio.move_on_after(self._propose_timeout_s * (self._attempts + 1)):
            async with self._lock:
                return await self._propose(broker_id)
        raise ProducerIdAllocationError(ErrorCode.REQUEST_TIMED_OUT,
                                        "producer id allocation timed out")

    async def _propose(self, broker_id: int) -> tuple[int, int]:
        message = "no attempt made"
        for _ in range(self._attempts):
            start = self._quorum.image.next_producer_id
            record = ProducerIdBlock(next_block_start=start, block_size=self._block_size,
                                     node_id=broker_id)
            try:
                result = await self._quorum.propose(record, timeout_s=self._propose_timeout_s)
            except _NOT_CONTROLLER_ERRORS as exc:
                raise ProducerIdAllocationError(ErrorCode.NOT_CONTROLLER, str(exc)) from exc
            except QuorumError as exc:
                raise ProducerIdAllocationError(
                    ErrorCode.REQUEST_TIMED_OUT, f"the metadata quorum did not commit: {exc}"
                ) from exc
            if result.ok:
                assert result.value == start, (result.value, start)
                return start, self._block_size
            message = result.message or f"error {result.error_code}"
            if result.error_code != metadata_errors.STALE_METADATA_VERSION:
                raise ProducerIdAllocationError(wire_error_code(result.error_code), message)
        raise ProducerIdAllocationError(ErrorCode.REQUEST_TIMED_OUT,
                                        f"lost {self._attempts} allocation races: {message}")


def _not_controller_errors() -> tuple[type[BaseException], ...]:
    # The Raft quorum raises NotControllerError (cluster-design.md); LocalQuorum has none.
    error = getattr(quorum_module, "NotControllerError", None)
    return (error,) if isinstance(error, type) and issubclass(error, BaseException) else ()


_NOT_CONTROLLER_ERRORS: Final = _not_controller_errors()
