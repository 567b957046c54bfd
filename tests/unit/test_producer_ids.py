"""Producer id blocks: the broker's ProducerIdManager, the controller's allocation behind
AllocateProducerIds, and the InitProducerId handler.

Goal: ids are unique and handed out without waiting while blocks last, the next block is
prefetched at 90 %, allocator failures and hangs are retried and never block a caller past
its timeout; the controller never hands out overlapping blocks (also under concurrent
requests and lost compare-and-set races) and answers the codes brokers expect; the handlers
answer what Kafka (and the clients) expect. Method: fake allocators under trio's autojump
clock for the manager; a real LocalQuorum, ControllerService and ControllerRpcs (with a hook
that injects rival blocks and quorum failures) for the controller side.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
import trio
import trio.testing

from raftlog.broker.lifecycle import BrokerLifecycle, ControllerChannel, call_in_process
from raftlog.config import ServerConfig
from raftlog.controller.core import STALE_BROKER_EPOCH, Registration
from raftlog.controller.rpcs import ControllerRpcs
from raftlog.controller.service import (
    ALLOCATION_ATTEMPTS,
    ControllerService,
    ControllerUnavailableError,
    settings_from_config,
)
from raftlog.metadata import errors
from raftlog.metadata.records import ProducerIdBlock, Record
from raftlog.metadata.state import ApplyResult, MetadataStateMachine
from raftlog.protocol import codec
from raftlog.protocol.codec import Api, RequestHeader, Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import ALLOCATE_PRODUCER_IDS, INIT_PRODUCER_ID
from raftlog.quorum.interface import (
    PROPOSE_TIMEOUT_S_DEFAULT,
    NotControllerError,
    ProposalTimeoutError,
)
from raftlog.quorum.local import LocalNode, LocalQuorum
from raftlog.server.listener import Body, RequestContext
from raftlog.txn.init_producer_id import EPOCH_EXHAUSTED, ProducerApis
from raftlog.txn.producer_ids import ProducerIdManager, ProducerIdsUnavailableError
from tests.unit.test_controller_service import SwitchableQuorum


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


# --- The controller side: ControllerCore + ControllerService behind ControllerRpcs -----------
#
# The one allocation path a node uses: ``BrokerLifecycle.allocate_block`` sends
# AllocateProducerIds through the ``ControllerChannel`` (in-process on a combined node) to
# ``ControllerRpcs``, whose handler calls ``ControllerService.allocate_producer_ids``: the core
# decides the block, the service proposes it under its term and retries a lost CAS race.

CONTROLLER_ID: Final = 1
KAFKA_PORT: Final = 9092  # advertised only: nothing listens in these tests
WAIT_S: Final = 10.0

Script = list[ApplyResult | Exception]


class InterposedQuorum(SwitchableQuorum):
    """A real ``LocalQuorum`` with a hook in front of ``ProducerIdBlock`` proposals.

    ``rivals`` blocks are committed straight to the inner quorum just before the next
    proposals are forwarded (a rival allocation that wins the compare-and-set); ``script``
    outcomes are returned or raised instead of forwarding. Every ``ProducerIdBlock`` proposal
    and its request id is recorded. ``ready`` False takes the controller role away.
    """

    def __init__(self, inner: LocalQuorum) -> None:
        super().__init__(inner)
        self.rivals = 0
        self.script: Script = []
        self.blocks: list[tuple[ProducerIdBlock, str | None]] = []

    async def propose(self, record: Record, *, expected_version: int | None = None,
                      request_id: str | None = None,
                      timeout_s: float = PROPOSE_TIMEOUT_S_DEFAULT) -> ApplyResult:
        if self.ready and isinstance(record, ProducerIdBlock):
            self.blocks.append((record, request_id))
            if self.script:
                outcome = self.script.pop(0)
                if isinstance(outcome, Exception):
                    raise outcome
                return outcome
            if self.rivals > 0:
                self.rivals -= 1
                rival = ProducerIdBlock(self.inner.image.next_producer_id, 1000, CONTROLLER_ID)
                assert (await self.inner.propose(rival)).ok
        return await super().propose(record, expected_version=expected_version,
                                     request_id=request_id, timeout_s=timeout_s)


@dataclass
class Controller:
    """A combined node's controller: quorum, controller service and its handlers."""

    config: ServerConfig
    quorum: InterposedQuorum
    service: ControllerService
    apis: ControllerRpcs
    nursery: trio.Nursery

    async def allocate(self, broker_id: int, broker_epoch: int) -> Struct:
        """AllocateProducerIds through the handler (and the codec), as a broker sends it."""
        handler = self.apis.handlers()[ALLOCATE_PRODUCER_IDS.key]
        body = {"broker_id": broker_id, "broker_epoch": broker_epoch}
        return await call_in_process(handler, ALLOCATE_PRODUCER_IDS, 0, body)

    def epoch(self, broker_id: int) -> int:
        return self.quorum.image.brokers[broker_id].epoch


def node_config(tmp_path: Path) -> ServerConfig:
    return ServerConfig.from_properties({
        "node.id": str(CONTROLLER_ID),
        "process.roles": "broker,controller",
        "listeners": f"PLAINTEXT://127.0.0.1:{KAFKA_PORT},CONTROLLER://127.0.0.1:9093",
        "controller.quorum.voters": f"{CONTROLLER_ID}@127.0.0.1:9093",
        "log.dirs": str(tmp_path / "data"),
        "cluster.id": "test-cluster",
    })


@asynccontextmanager
async def controller_node(tmp_path: Path) -> AsyncIterator[Controller]:
    config = node_config(tmp_path)
    node = LocalNode(CONTROLLER_ID, "127.0.0.1", KAFKA_PORT)
    async with LocalQuorum(tmp_path / "meta", MetadataStateMachine(), node=node) as local:
        quorum = InterposedQuorum(local)
        service = ControllerService(quorum, settings_from_config(config))
        apis = ControllerRpcs(config, quorum, service)
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await eventually(lambda: service.active, "the controller to start")
            yield Controller(config, quorum, service, apis, nursery)
            nursery.cancel_scope.cancel()


async def eventually(check: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = trio.current_time() + timeout_s
    while trio.current_time() < deadline:
        if check():
            return
        await trio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def expect_blocks(starts: list[int]) -> list[tuple[int, int]]:
    return [(start, 1000) for start in starts]


async def test_a_combined_node_fills_its_manager_through_its_own_controller(
    tmp_path: Path,
) -> None:
    """node.py's wiring: ProducerIdManager <- BrokerLifecycle.allocate_block <- the channel,
    in-process to ControllerRpcs <- ControllerService (proposals stamped with its term)."""
    async with controller_node(tmp_path) as controller:
        quorum = controller.quorum
        channel = ControllerChannel(CONTROLLER_ID, quorum)
        channel.set_local_handlers(controller.apis.handlers())
        lifecycle = BrokerLifecycle(
            controller.config, quorum, channel,
            advertised=("127.0.0.1", KAFKA_PORT),
            incarnation_id=quorum.image.brokers[CONTROLLER_ID].incarnation_id)
        manager = ProducerIdManager(lifecycle.allocate_block)
        assert set(ProducerApis(manager).handlers()) == {INIT_PRODUCER_ID.key}
        await controller.nursery.start(lifecycle.run)
        await controller.nursery.start(manager.run)
        ids = await take(manager, 1950, timeout_s=WAIT_S)
        assert ids == list(range(1950))
        await eventually(lambda: quorum.image.next_producer_id == 3000,
                         "the third block to be prefetched at 1900")
        term = controller.service.active_term
        assert [block for block, _ in quorum.blocks] == [
            ProducerIdBlock(start, 1000, CONTROLLER_ID) for start in (0, 1000, 2000)]
        assert all(rid is not None and rid.startswith(f"ctl-{CONTROLLER_ID}-{term}-")
                   for _, rid in quorum.blocks), quorum.blocks
        await channel.aclose()


async def test_the_allocate_producer_ids_handler(tmp_path: Path) -> None:
    async with controller_node(tmp_path) as controller:
        epoch = controller.epoch(CONTROLLER_ID)
        answers = [await controller.allocate(CONTROLLER_ID, broker_epoch)
                   for broker_epoch in (-1, epoch)]
        assert [a.to_dict() for a in answers] == [
            {"throttle_time_ms": 0, "error_code": 0, "producer_id_start": start,
             "producer_id_len": 1000} for start in (0, 1000)]
        refusals = {
            STALE_BROKER_EPOCH: (CONTROLLER_ID, epoch + 1),
            errors.BROKER_ID_NOT_REGISTERED: (9, -1),
        }
        for code, (broker_id, broker_epoch) in refusals.items():
            answer = await controller.allocate(broker_id, broker_epoch)
            assert (answer.error_code, answer.producer_id_len) == (code, 0)
        assert controller.quorum.image.next_producer_id == 2000, "refusals commit nothing"
        controller.quorum.ready = False  # another node won the election
        await eventually(lambda: not controller.service.active, "the service to step down")
        answer = await controller.allocate(CONTROLLER_ID, -1)
        assert answer.error_code == errors.NOT_CONTROLLER
        with pytest.raises(ControllerUnavailableError) as caught:
            await controller.service.allocate_producer_ids(CONTROLLER_ID, -1)
        assert caught.value.error_code == errors.NOT_CONTROLLER
        assert controller.quorum.image.next_producer_id == 2000


async def test_concurrent_allocations_for_several_brokers_never_overlap(tmp_path: Path) -> None:
    async with controller_node(tmp_path) as controller:
        for broker_id in (2, 3):
            code, _, _ = await controller.service.register(
                Registration(broker_id, uuid.uuid4().hex, "127.0.0.1", 9000 + broker_id,
                             cluster_id="test-cluster"))
            assert code == errors.NONE
        got: dict[int, list[tuple[int, int]]] = {1: [], 2: [], 3: []}

        async def allocate(broker_id: int) -> None:
            answer = await controller.allocate(broker_id, controller.epoch(broker_id))
            assert answer.error_code == errors.NONE, errors.error_name(answer.error_code)
            got[broker_id].append((answer.producer_id_start, answer.producer_id_len))

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                for broker_id in got:
                    nursery.start_soon(allocate, broker_id)
        blocks = sorted(block for owned in got.values() for block in owned)
        assert blocks == expect_blocks(list(range(0, 24_000, 1000))), "disjoint and gapless"
        assert all(len(owned) == 8 for owned in got.values())
        assert controller.quorum.image.next_producer_id == 24_000


@pytest.mark.parametrize(("rivals", "wins"), [(1, True), (ALLOCATION_ATTEMPTS, False)])
async def test_a_lost_allocation_race_is_retried(tmp_path: Path, rivals: int, wins: bool) -> None:
    """A rival block commits between the core's decision and the proposal: the proposal loses
    the compare-and-set on ``next_producer_id``, and the service decides again (at most
    ALLOCATION_ATTEMPTS times, then REQUEST_TIMED_OUT so the broker retries later)."""
    async with controller_node(tmp_path) as controller:
        controller.quorum.rivals = rivals
        answer = await controller.allocate(CONTROLLER_ID, -1)
        tried = [block.next_block_start for block, _ in controller.quorum.blocks]
        if wins:
            assert (answer.error_code, answer.producer_id_start) == (errors.NONE, 1000)
            assert tried == [0, 1000]
            assert controller.quorum.image.next_producer_id == 2000
        else:
            assert answer.error_code == errors.REQUEST_TIMED_OUT
            assert tried == [1000 * n for n in range(ALLOCATION_ATTEMPTS)]
            assert controller.quorum.image.next_producer_id == 1000 * ALLOCATION_ATTEMPTS
        # The broker's retry succeeds once nobody races it.
        retry = await controller.allocate(CONTROLLER_ID, -1)
        assert retry.error_code == errors.NONE
        assert retry.producer_id_start == controller.quorum.image.next_producer_id - 1000


@pytest.mark.parametrize(
    ("script", "code"),
    [
        ([NotControllerError("leader moved")], errors.NOT_CONTROLLER),
        ([ProposalTimeoutError("slow", outcome_unknown=False)], errors.REQUEST_TIMED_OUT),
        ([ProposalTimeoutError("slow", outcome_unknown=True)] * 2, errors.REQUEST_TIMED_OUT),
        ([ApplyResult(errors.INVALID_REQUEST, "producer ids exhausted")], errors.INVALID_REQUEST),
    ],
)
async def test_allocation_failures_answer_kafka_codes(
    tmp_path: Path, script: Script, code: int
) -> None:
    async with controller_node(tmp_path) as controller:
        controller.quorum.script = list(script)
        answer = await controller.allocate(CONTROLLER_ID, -1)
        assert (answer.error_code, answer.producer_id_len) == (code, 0)
        request_ids = [rid for _, rid in controller.quorum.blocks]
        # An unknown outcome is retried once under the same request id (applied at most once).
        assert len(request_ids) == len(script) and len(set(request_ids)) == 1
        assert controller.quorum.image.next_producer_id == 0
        answer = await controller.allocate(CONTROLLER_ID, -1)
        assert (answer.error_code, answer.producer_id_start) == (errors.NONE, 0)


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
