"""Producer id blocks (ProducerIdManager, QuorumBlockAllocator) and the InitProducerId /
AllocateProducerIds handlers.

Goal: ids are unique and handed out without waiting while blocks last, the next block is
prefetched at 90 %, allocator failures and hangs are retried and never block a caller past
its timeout, and the handlers answer what Kafka (and the clients) expect. Method: fake
allocators under trio's autojump clock; a real LocalQuorum for the controller side.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from raftlog.fetch import codec
from raftlog.fetch.codec import Api, RequestHeader
from raftlog.fetch.errors import ErrorCode
from raftlog.fetch.schemas import ALLOCATE_PRODUCER_IDS, INIT_PRODUCER_ID
from raftlog.fetch.server import Body, RequestContext
from raftlog.metadata import errors as metadata_errors
from raftlog.metadata.quorum import LocalNode, LocalQuorum, ProposalTimeoutError
from raftlog.metadata.records import ProducerIdBlock, Record
from raftlog.metadata.state import ApplyResult, MetadataImage, MetadataStateMachine
from raftlog.txn.apis import EPOCH_EXHAUSTED, ProducerApis
from raftlog.txn.producer_ids import (
    STALE_BROKER_EPOCH,
    ProducerIdAllocationError,
    ProducerIdManager,
    ProducerIdsUnavailableError,
    QuorumBlockAllocator,
)

NODE = LocalNode(node_id=1, host="127.0.0.1", port=9092)


class FakeAllocator:
    """Hands out ``blocks`` in order (or raises/hangs as scripted); counts calls."""

    def __init__(self, blocks: list[tuple[int, int] | Exception | None]) -> None:
        self.blocks = blocks
        self.calls = 0

    async def __call__(self) -> tuple[int, int]:
        self.calls += 1
        step = self.blocks.pop(0) if self.blocks else None
        if step is None:
            await trio.sleep_forever()
        if isinstance(step, Exception):
            raise step
        assert step is not None
        return step


def sequential_blocks(length: int, count: int) -> list[tuple[int, int] | Exception | None]:
    return [(i * length, length) for i in range(count)]


async def take(manager: ProducerIdManager, count: int, timeout_s: float = 1.0) -> list[int]:
    return [await manager.next_producer_id(timeout_s) for _ in range(count)]


# --- ProducerIdManager -----------------------------------------------------------------------


async def test_ids_are_unique_and_come_from_the_blocks_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    allocator = FakeAllocator(sequential_blocks(10, 5))
    manager = ProducerIdManager(allocator)
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        assert await take(manager, 35) == list(range(35))
        nursery.cancel_scope.cancel()
    assert allocator.calls == 4  # three used up, the fourth prefetched at id 39 * 0.9


async def test_the_next_block_is_prefetched_at_ninety_percent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    allocator = FakeAllocator(sequential_blocks(10, 3))
    manager = ProducerIdManager(allocator)
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        await take(manager, 8)
        await trio.testing.wait_all_tasks_blocked()
        assert allocator.calls == 1 and manager.remaining == 2
        await take(manager, 1)  # 9 of 10 used
        await trio.testing.wait_all_tasks_blocked()
        assert allocator.calls == 2 and manager.remaining == 11
        start = trio.current_time()
        assert await take(manager, 11) == list(range(9, 20))
        assert trio.current_time() == start, "no caller waited at the block boundary"
        nursery.cancel_scope.cancel()


async def test_failures_are_retried_with_backoff(autojump_clock: trio.testing.MockClock) -> None:
    allocator = FakeAllocator([RuntimeError("controller moved"), OSError("refused"), (0, 5)])
    manager = ProducerIdManager(allocator, backoff_s=0.1, backoff_max_s=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        start = trio.current_time()
        assert await manager.next_producer_id(5.0) == 0
        assert trio.current_time() - start == pytest.approx(0.1 + 0.2)
        nursery.cancel_scope.cancel()
    assert allocator.calls == 3


async def test_a_hung_allocator_never_blocks_a_caller_past_its_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    allocator = FakeAllocator([None, (100, 10)])  # the first call never returns
    manager = ProducerIdManager(allocator, allocate_timeout_s=3.0, backoff_s=0.5)
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        start = trio.current_time()
        with pytest.raises(ProducerIdsUnavailableError):
            await manager.next_producer_id(1.0)
        assert trio.current_time() - start == pytest.approx(1.0)
        assert await manager.next_producer_id(10.0) == 100  # after timeout 3 s + backoff
        assert trio.current_time() - start == pytest.approx(3.5)
        nursery.cancel_scope.cancel()


async def test_overlapping_and_invalid_blocks_are_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    allocator = FakeAllocator([(0, 10), (5, 10), (-1, 10), (10, 0), (10, 10)])
    manager = ProducerIdManager(allocator)
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        assert await take(manager, 20, timeout_s=10.0) == list(range(20))
        nursery.cancel_scope.cancel()
    assert allocator.calls == 6  # five answers, then the prefetch of the block after (10, 10)


async def test_concurrent_callers_get_distinct_ids(autojump_clock: trio.testing.MockClock) -> None:
    allocator = FakeAllocator(sequential_blocks(7, 30))
    manager = ProducerIdManager(allocator)
    got: list[int] = []

    async def caller() -> None:
        got.extend(await take(manager, 10, timeout_s=5.0))

    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        async with trio.open_nursery() as callers:
            for _ in range(12):
                callers.start_soon(caller)
        nursery.cancel_scope.cancel()
    assert sorted(got) == list(range(120))


# --- QuorumBlockAllocator ------------------------------------------------------------------


async def test_blocks_from_a_local_quorum(tmp_path: Path) -> None:
    async with LocalQuorum(tmp_path, MetadataStateMachine(), node=NODE) as quorum:
        allocator = QuorumBlockAllocator(quorum)
        assert await allocator(1, -1) == (0, 1000)
        epoch = quorum.image.brokers[1].epoch
        assert await allocator(1, epoch) == (1000, 1000)
        for broker_id, broker_epoch in ((1, epoch + 1), (7, -1)):
            with pytest.raises(ProducerIdAllocationError) as caught:
                await allocator(broker_id, broker_epoch)
            assert caught.value.error_code == STALE_BROKER_EPOCH
        assert quorum.image.next_producer_id == 2000

        manager = ProducerIdManager(allocator.for_node(1))
        async with trio.open_nursery() as nursery:
            await nursery.start(manager.run)
            ids = await take(manager, 1500, timeout_s=5.0)
            nursery.cancel_scope.cancel()
        assert ids == list(range(2000, 3500))
        assert quorum.image.next_producer_id == 4000  # the third block was prefetched


class ScriptedQuorum:
    """A quorum whose proposals return (or raise) scripted outcomes."""

    def __init__(self, outcomes: list[ApplyResult | Exception], *, ready: bool = True) -> None:
        self.outcomes = outcomes
        self.controller_ready = ready
        self.proposed: list[Record] = []
        self._image = MetadataImage(next_producer_id=5000)

    @property
    def image(self) -> MetadataImage:
        return self._image

    async def propose(self, record: Record, **kwargs: Any) -> ApplyResult:
        self.proposed.append(record)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def _registered(quorum: ScriptedQuorum) -> ScriptedQuorum:
    from raftlog.metadata.image import BrokerImage, frozen_mapping

    broker = BrokerImage(1, "h", 1, None, "x", fenced=False, epoch=3, version=3)
    quorum._image = MetadataImage(next_producer_id=5000, brokers=frozen_mapping({1: broker}))
    return quorum


async def test_a_lost_allocation_race_is_retried() -> None:
    stale = ApplyResult(metadata_errors.STALE_METADATA_VERSION, "raced")
    quorum = _registered(ScriptedQuorum([stale, ApplyResult(0, value=5000)]))
    assert await QuorumBlockAllocator(quorum)(1, 3) == (5000, 1000)  # type: ignore[arg-type]
    assert quorum.proposed == [ProducerIdBlock(5000, 1000, 1)] * 2


@pytest.mark.parametrize(
    ("outcomes", "ready", "code"),
    [
        ([], False, ErrorCode.NOT_CONTROLLER),
        ([ProposalTimeoutError("slow", outcome_unknown=True)], True, ErrorCode.REQUEST_TIMED_OUT),
        ([ApplyResult(metadata_errors.STALE_METADATA_VERSION)] * 2, True,
         ErrorCode.REQUEST_TIMED_OUT),
        ([ApplyResult(metadata_errors.INVALID_REQUEST, "exhausted")], True,
         ErrorCode.INVALID_REQUEST),
    ],
)
async def test_allocation_errors(
    outcomes: list[ApplyResult | Exception], ready: bool, code: int
) -> None:
    quorum = _registered(ScriptedQuorum(outcomes, ready=ready))
    allocator = QuorumBlockAllocator(quorum, attempts=2)  # type: ignore[arg-type]
    with pytest.raises(ProducerIdAllocationError) as caught:
        await allocator(1, -1)
    assert caught.value.error_code == code


async def test_not_controller_from_the_raft_quorum() -> None:
    from raftlog.metadata import quorum as quorum_module

    error_type = getattr(quorum_module, "NotControllerError", None)
    if error_type is None:
        pytest.skip("this tree has no NotControllerError yet")
    quorum = _registered(ScriptedQuorum([error_type("leader moved")]))
    with pytest.raises(ProducerIdAllocationError) as caught:
        await QuorumBlockAllocator(quorum)(1, -1)  # type: ignore[arg-type]
    assert caught.value.error_code == ErrorCode.NOT_CONTROLLER


# --- handlers ------------------------------------------------------------------------------


def context(api: Api, version: int, body: dict[str, Any]) -> RequestContext:
    raw = codec.encode_bytes(api, version, body, is_request=True)
    decoded = codec.decode(api, version, raw, is_request=True)
    return RequestContext(api, RequestHeader(api.key, version, 1, "test"), decoded, "peer")


async def call(handler: Callable[[RequestContext], Any], ctx: RequestContext) -> Body:
    result = handler(ctx)
    if callable(result):
        result = await result()
    assert isinstance(result, dict)
    # The body must encode at the request's version (the response is what clients decode).
    raw = codec.encode_bytes(ctx.api, ctx.header.api_version, result)
    decoded = codec.decode(ctx.api, ctx.header.api_version, raw, is_request=False)
    return decoded.to_dict()


def init_request(version: int, transactional_id: str | None = None, producer_id: int = -1,
                 producer_epoch: int = -1) -> RequestContext:
    return context(INIT_PRODUCER_ID, version, {
        "transactional_id": transactional_id, "transaction_timeout_ms": 60000,
        "producer_id": producer_id, "producer_epoch": producer_epoch,
    })


async def with_apis(
    blocks: list[tuple[int, int] | Exception | None],
    test: Callable[[ProducerApis], Awaitable[None]],
    **kwargs: Any,
) -> None:
    manager = ProducerIdManager(FakeAllocator(blocks))
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        await test(ProducerApis(manager, **kwargs))
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("version", range(5))
async def test_init_producer_id_hands_out_new_ids(version: int) -> None:
    async def check(apis: ProducerApis) -> None:
        for expected in (500, 501):
            body = await call(apis.init_producer_id, init_request(version))
            assert body == {"throttle_time_ms": 0, "error_code": 0, "producer_id": expected,
                            "producer_epoch": 0}

    await with_apis([(500, 1000)], check)


async def test_init_producer_id_bumps_the_epoch_kip_360() -> None:
    async def check(apis: ProducerApis) -> None:
        body = await call(apis.init_producer_id, init_request(3, None, 42, 7))
        assert (body["error_code"], body["producer_id"], body["producer_epoch"]) == (0, 42, 8)
        body = await call(apis.init_producer_id, init_request(4, None, 42, EPOCH_EXHAUSTED))
        assert (body["error_code"], body["producer_id"], body["producer_epoch"]) == (0, 500, 0)

    await with_apis([(500, 1000)], check)


@pytest.mark.parametrize(
    ("version", "transactional_id", "producer_id", "producer_epoch", "code"),
    [
        (0, "txn-1", -1, -1, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
        (4, "txn-1", 3, 1, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
        (2, "", -1, -1, ErrorCode.INVALID_REQUEST),
        (3, None, 5, -1, ErrorCode.INVALID_REQUEST),
        (3, None, -1, 0, ErrorCode.INVALID_REQUEST),
        (4, None, -7, -7, ErrorCode.INVALID_REQUEST),
    ],
)
async def test_init_producer_id_errors(
    version: int, transactional_id: str | None, producer_id: int, producer_epoch: int, code: int
) -> None:
    async def check(apis: ProducerApis) -> None:
        ctx = init_request(version, transactional_id, producer_id, producer_epoch)
        body = await call(apis.init_producer_id, ctx)
        assert body == {"throttle_time_ms": 0, "error_code": code, "producer_id": -1,
                        "producer_epoch": -1}

    await with_apis([(0, 10)], check)


async def test_init_producer_id_without_ids_answers_load_in_progress(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def check(apis: ProducerApis) -> None:
        start = trio.current_time()
        body = await call(apis.init_producer_id, init_request(4))
        assert body["error_code"] == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        assert trio.current_time() - start == pytest.approx(2.0)

    await with_apis([None], check, init_timeout_s=2.0)


async def test_allocate_producer_ids_handler(tmp_path: Path) -> None:
    request = context(ALLOCATE_PRODUCER_IDS, 0, {"broker_id": 1, "broker_epoch": -1})
    async with LocalQuorum(tmp_path, MetadataStateMachine(), node=NODE) as quorum:

        async def check(apis: ProducerApis) -> None:
            assert set(apis.handlers()) == {INIT_PRODUCER_ID.key, ALLOCATE_PRODUCER_IDS.key}
            body = await call(apis.allocate_producer_ids, request)
            assert body == {"throttle_time_ms": 0, "error_code": 0, "producer_id_start": 0,
                            "producer_id_len": 1000}
            unknown = context(ALLOCATE_PRODUCER_IDS, 0, {"broker_id": 9, "broker_epoch": 1})
            body = await call(apis.allocate_producer_ids, unknown)
            assert body["error_code"] == STALE_BROKER_EPOCH

        await with_apis([(0, 10)], check, allocate_for_broker=QuorumBlockAllocator(quorum))

    async def not_controller(apis: ProducerApis) -> None:
        assert set(apis.handlers()) == {INIT_PRODUCER_ID.key}
        body = await call(apis.allocate_producer_ids, request)
        assert body["error_code"] == ErrorCode.NOT_CONTROLLER

    await with_apis([(0, 10)], not_controller)
