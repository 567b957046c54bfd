"""The controller's trio shell, its Kafka handlers and the broker lifecycle, end to end in one
process: a ``LocalQuorum`` controller (node 1) serving the internal APIs on a real listener,
and brokers 2 and 3 registering and heartbeating over TCP with ``BrokerLifecycle``.

The controller's clock is real time with short sessions (``SESSION_MS``); every wait in these
tests is bounded.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
import trio

from raftlog.broker.apis import KafkaApis
from raftlog.broker.controller_apis import ControllerApis
from raftlog.broker.lifecycle import (
    BrokerLifecycle,
    ControllerChannel,
    ControllerUnreachableError,
    call_in_process,
)
from raftlog.config import ConfigError, ServerConfig
from raftlog.controller.core import (
    DUPLICATE_BROKER_REGISTRATION,
    STALE_BROKER_EPOCH,
    ControllerSettings,
    Heartbeat,
    Registration,
)
from raftlog.controller.rpcs import ControllerRpcs, describe_quorum_request
from raftlog.controller.service import (
    ControllerService,
    ControllerUnavailableError,
    settings_from_config,
)
from raftlog.metadata import errors
from raftlog.metadata.image import MetadataImage
from raftlog.metadata.records import Record, RegisterBroker
from raftlog.metadata.state import ApplyResult, MetadataStateMachine
from raftlog.partition.manager import PartitionManager
from raftlog.protocol.schemas import (
    ALTER_PARTITION,
    BROKER_HEARTBEAT,
    BROKER_REGISTRATION,
    CREATE_TOPICS,
    DELETE_TOPICS,
    DESCRIBE_QUORUM,
)
from raftlog.quorum.interface import PROPOSE_TIMEOUT_S_DEFAULT, NotControllerError, QuorumStatus
from raftlog.quorum.local import LocalNode, LocalQuorum
from raftlog.server.listener import Handler, ListenerLimits, serve_listener

SESSION_MS: Final = 600
HEARTBEAT_MS: Final = 100
WAIT_S: Final = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class SwitchableQuorum:
    """A LocalQuorum whose controller role a test can take away and give back."""

    def __init__(self, inner: LocalQuorum) -> None:
        self.inner = inner
        self.ready = True

    @property
    def image(self) -> MetadataImage:
        return self.inner.image

    @property
    def controller_ready(self) -> bool:
        return self.ready and self.inner.controller_ready

    @property
    def leader_node_id(self) -> int | None:
        return self.inner.leader_node_id if self.ready else None

    def status(self) -> QuorumStatus:
        return self.inner.status()

    def leader_contact_age_s(self) -> float:
        return self.inner.leader_contact_age_s()

    def error_counts(self) -> Mapping[str, int]:
        return self.inner.error_counts()

    async def propose(self, record: Record, *, expected_version: int | None = None,
                      request_id: str | None = None,
                      timeout_s: float = PROPOSE_TIMEOUT_S_DEFAULT) -> ApplyResult:
        if not self.ready:
            raise NotControllerError("switched off by the test")
        return await self.inner.propose(record, expected_version=expected_version,
                                        request_id=request_id, timeout_s=timeout_s)

    async def wait_for_version(self, version: int, timeout_s: float) -> MetadataImage:
        return await self.inner.wait_for_version(version, timeout_s)

    async def wait_changed(self, since_version: int, timeout_s: float) -> MetadataImage:
        return await self.inner.wait_changed(since_version, timeout_s)


def server_config(tmp_path: Path, node_id: int, port: int, controller_port: int,
                  roles: str = "broker,controller") -> ServerConfig:
    listeners = f"PLAINTEXT://127.0.0.1:{port}"
    if "controller" in roles:
        listeners += f",CONTROLLER://127.0.0.1:{controller_port}"
    return ServerConfig.from_properties({
        "node.id": str(node_id),
        "process.roles": roles,
        "listeners": listeners,
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "log.dirs": str(tmp_path / f"node-{node_id}"),
        "broker.session.timeout.ms": str(SESSION_MS),
        "broker.heartbeat.interval.ms": str(HEARTBEAT_MS),
        "leader.imbalance.check.interval.seconds": "1",
        "cluster.id": "test-cluster",
    })


@dataclass
class Controller:
    """Node 1: the quorum, the controller service and its handlers on a real listener."""

    config: ServerConfig
    quorum: SwitchableQuorum
    service: ControllerService
    handlers: dict[int, Handler]
    port: int
    lifecycle: BrokerLifecycle

    async def call(self, api: Any, body: dict[str, Any], version: int) -> Any:
        return await call_in_process(self.handlers[api.key], api, version, body)


@asynccontextmanager
async def controller_node(tmp_path: Path) -> AsyncIterator[Controller]:
    port, controller_port = free_port(), free_port()
    config = server_config(tmp_path, 1, port, controller_port)
    node = LocalNode(1, "127.0.0.1", port)
    async with LocalQuorum(tmp_path / "meta", MetadataStateMachine(), node=node) as local:
        quorum = SwitchableQuorum(local)
        service = ControllerService(quorum, settings_from_config(config))
        manager = PartitionManager(tmp_path / "data-1", 1)
        kafka_apis = KafkaApis(config, quorum, manager)
        rpcs = ControllerRpcs(config, quorum, service)
        apis = ControllerApis(config, quorum, service, kafka_apis)
        controller_handlers = {**rpcs.handlers(), **apis.handlers()}
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            handlers = {**kafka_apis.handlers(), **controller_handlers}
            await nursery.start(serve_listener, "127.0.0.1", port, handlers,
                                ListenerLimits(100 << 20, -1))
            await eventually(lambda: service.active, "the controller to start")
            # Node 1's own broker heartbeats in-process, as in a combined node.
            channel = ControllerChannel(1, quorum)
            channel.set_local_handlers(controller_handlers)
            own = BrokerLifecycle(config, quorum, channel, advertised=("127.0.0.1", port),
                                  incarnation_id=quorum.image.brokers[1].incarnation_id)
            await nursery.start(own.run)
            yield Controller(config, quorum, service, controller_handlers, port, own)
            nursery.cancel_scope.cancel()
        manager.close()


def broker_lifecycle(tmp_path: Path, controller: Controller, node_id: int) -> BrokerLifecycle:
    port = free_port()
    config = server_config(tmp_path, node_id, port, controller.config.controller_quorum_voters[0]
                           .port, roles="broker")
    channel = ControllerChannel(node_id, controller.quorum)
    return BrokerLifecycle(config, controller.quorum, channel, advertised=("127.0.0.1", port))


async def eventually(check: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = trio.current_time() + timeout_s
    for _ in range(1_000_000):
        if check():
            return
        if trio.current_time() > deadline:
            break
        await trio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def started(nursery: trio.Nursery, fn: Callable[..., Awaitable[None]]) -> trio.CancelScope:
    """Start ``fn`` in its own cancel scope (so a test can stop just it)."""
    scope = trio.CancelScope()

    async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await fn(task_status=task_status)

    await nursery.start(run)
    return scope


# --- Lifecycle over TCP -----------------------------------------------------------------------


async def test_brokers_register_heartbeat_unfence_and_get_fenced_when_silent(
    tmp_path: Path,
) -> None:
    async with controller_node(tmp_path) as controller, trio.open_nursery() as nursery:
        two = broker_lifecycle(tmp_path, controller, 2)
        three = broker_lifecycle(tmp_path, controller, 3)
        await started(nursery, two.run)
        scope_three = await started(nursery, three.run)
        assert await two.wait_unfenced(WAIT_S)
        assert await three.wait_unfenced(WAIT_S)
        image = controller.quorum.image
        assert image.live_broker_ids() == (1, 2, 3)
        assert image.brokers[2].epoch == two.broker_epoch
        assert (image.brokers[2].host, image.brokers[2].port) == two.advertised
        # Broker 3 stops heartbeating: fenced after its session.
        scope_three.cancel()
        await eventually(lambda: controller.quorum.image.brokers[3].fenced,
                         "the silent broker to be fenced", SESSION_MS / 1000 * 5)
        assert not controller.quorum.image.brokers[2].fenced
        nursery.cancel_scope.cancel()


async def test_alter_isr_and_allocate_block_reach_the_controller(tmp_path: Path) -> None:
    async with controller_node(tmp_path) as controller, trio.open_nursery() as nursery:
        lifecycles = {n: broker_lifecycle(tmp_path, controller, n) for n in (2, 3)}
        for lifecycle in lifecycles.values():
            await started(nursery, lifecycle.run)
            assert await lifecycle.wait_unfenced(WAIT_S)
        response = await controller.call(CREATE_TOPICS, {
            "topics": [{"name": "t", "num_partitions": 3, "replication_factor": 3,
                        "assignments": [], "configs": []}],
            "timeout_ms": 5000, "validate_only": False}, 4)
        assert response.topics[0].error_code == 0
        topic = controller.quorum.image.topics["t"]
        leaders = [p.leader for p in topic.partitions]
        assert sorted(leaders) == [1, 2, 3], "the controller spreads leaders"
        partition = next(p for p in topic.partitions if p.leader == 2)
        shrunk = tuple(r for r in partition.isr if r != 3)
        code, committed = await lifecycles[2].alter_isr(
            "t", partition.partition, shrunk, partition.leader_epoch, partition.partition_epoch)
        assert code == errors.NONE and committed is not None
        assert committed.isr == shrunk
        assert committed.partition_epoch == partition.partition_epoch + 1
        assert controller.quorum.image.partition("t", partition.partition) == committed
        # A stale partition epoch loses the compare-and-set.
        code, current = await lifecycles[2].alter_isr(
            "t", partition.partition, partition.isr, partition.leader_epoch,
            partition.partition_epoch)
        assert code == errors.INVALID_UPDATE_VERSION
        assert current is not None and current.partition_epoch == committed.partition_epoch
        # Not the leader of that partition.
        code, _ = await lifecycles[3].alter_isr(
            "t", partition.partition, (2, 3), committed.leader_epoch, committed.partition_epoch)
        assert code == errors.INVALID_REQUEST
        blocks = [await lifecycles[n].allocate_block() for n in (2, 3, 2)]
        starts = [start for start, _ in blocks]
        assert starts == sorted(starts) and len(set(starts)) == 3
        assert all(length == 1000 for _, length in blocks)
        nursery.cancel_scope.cancel()


async def test_controlled_shutdown_moves_leadership_away_first(tmp_path: Path) -> None:
    async with controller_node(tmp_path) as controller, trio.open_nursery() as nursery:
        lifecycles = {n: broker_lifecycle(tmp_path, controller, n) for n in (2, 3)}
        for lifecycle in lifecycles.values():
            await started(nursery, lifecycle.run)
            assert await lifecycle.wait_unfenced(WAIT_S)
        await controller.call(CREATE_TOPICS, {
            "topics": [{"name": "t", "num_partitions": 6, "replication_factor": 2,
                        "assignments": [], "configs": []}],
            "timeout_ms": 5000, "validate_only": False}, 4)
        led_by_two = [p for p in controller.quorum.image.topics["t"].partitions if p.leader == 2]
        assert led_by_two
        assert await lifecycles[2].controlled_shutdown(WAIT_S)
        image = controller.quorum.image
        assert image.brokers[2].fenced
        for partition in image.topics["t"].partitions:
            assert partition.leader != 2
            assert 2 not in partition.isr or partition.isr == (2,)
        nursery.cancel_scope.cancel()


async def test_single_node_skips_controlled_shutdown(tmp_path: Path) -> None:
    async with controller_node(tmp_path) as controller:
        lifecycle = controller.lifecycle
        assert await lifecycle.wait_unfenced(WAIT_S)
        # Adopting the quorum's incarnation made registration a no-op: same epoch, unfenced.
        own = controller.quorum.image.brokers[1]
        assert lifecycle.broker_epoch == own.epoch
        version = controller.quorum.image.version
        assert not await lifecycle.controlled_shutdown(1.0)
        assert not controller.quorum.image.brokers[1].fenced
        await trio.sleep(3 * HEARTBEAT_MS / 1000)
        assert controller.quorum.image.version == version, "heartbeats must not write the log"


# --- Handlers on a node that is not the controller ---------------------------------------------


async def test_not_the_controller_answers_not_controller(tmp_path: Path) -> None:
    async with controller_node(tmp_path) as controller:
        controller.quorum.ready = False
        await eventually(lambda: not controller.service.active, "the service to step down")
        await trio.sleep(0.3)  # the term's watcher notices within LEADERSHIP_POLL_S
        registration = {"broker_id": 2, "cluster_id": "test-cluster",
                        "incarnation_id": uuid.uuid4(), "listeners": [
                            {"name": "PLAINTEXT", "host": "h", "port": 1,
                             "security_protocol": 0}], "features": [], "rack": None}
        response = await controller.call(BROKER_REGISTRATION, registration, 0)
        assert response.error_code == errors.NOT_CONTROLLER
        response = await controller.call(BROKER_HEARTBEAT, {
            "broker_id": 1, "broker_epoch": 0, "current_metadata_offset": 0,
            "want_fence": False, "want_shut_down": False}, 0)
        assert response.error_code == errors.NOT_CONTROLLER
        response = await controller.call(ALTER_PARTITION, {
            "broker_id": 1, "broker_epoch": -1, "topics": []}, 1)
        assert response.error_code == errors.NOT_CONTROLLER
        response = await controller.call(CREATE_TOPICS, {
            "topics": [{"name": "x", "num_partitions": 1, "replication_factor": 1,
                        "assignments": [], "configs": []}],
            "timeout_ms": 5000, "validate_only": False}, 4)
        assert [t.error_code for t in response.topics] == [errors.NOT_CONTROLLER]
        response = await controller.call(DELETE_TOPICS, {"topic_names": ["x", "y"],
                                                         "timeout_ms": 5000}, 3)
        assert [r.error_code for r in response.responses] == [errors.NOT_CONTROLLER] * 2
        response = await controller.call(DESCRIBE_QUORUM, describe_quorum_request(), 1)
        partition = response.topics[0].partitions[0]
        assert partition.error_code == errors.NOT_CONTROLLER
        assert [v.replica_id for v in partition.current_voters] == [1]
        with pytest.raises(ControllerUnavailableError) as caught:
            await controller.service.register(Registration(5, "x", "h", 1))
        assert caught.value.error_code == errors.NOT_CONTROLLER
        # Leadership comes back: a fresh term of the service, with fresh leases.
        served = controller.service.terms_served
        controller.quorum.ready = True
        await eventually(lambda: controller.service.active, "the service to take over")
        assert controller.service.terms_served == served + 1
        response = await controller.call(DESCRIBE_QUORUM, describe_quorum_request(), 1)
        partition = response.topics[0].partitions[0]
        assert (partition.error_code, partition.leader_id) == (0, 1)
        assert partition.high_watermark == controller.quorum.image.version


async def test_channel_gives_up_after_its_deadline(tmp_path: Path) -> None:
    async with controller_node(tmp_path) as controller:
        controller.quorum.ready = False
        channel = ControllerChannel(7, controller.quorum)
        with trio.fail_after(5), pytest.raises(ControllerUnreachableError):
            await channel.call(BROKER_HEARTBEAT, {
                "broker_id": 7, "broker_epoch": 0, "current_metadata_offset": 0,
                "want_fence": False, "want_shut_down": False}, version=0, timeout_s=0.5)
        await channel.aclose()


async def test_heartbeat_with_a_stale_epoch_makes_the_broker_register_again(
    tmp_path: Path,
) -> None:
    async with controller_node(tmp_path) as controller, trio.open_nursery() as nursery:
        lifecycle = broker_lifecycle(tmp_path, controller, 2)
        await started(nursery, lifecycle.run)
        assert await lifecycle.wait_unfenced(WAIT_S)
        first_epoch = lifecycle.broker_epoch
        reply = await controller.service.heartbeat(Heartbeat(2, first_epoch + 1000, 0))
        assert reply.error_code == STALE_BROKER_EPOCH
        # Another process claiming node id 2 is refused while broker 2's session lives.
        code, _, _ = await controller.service.register(
            Registration(2, uuid.uuid4().hex, "127.0.0.1", 1))
        assert code == DUPLICATE_BROKER_REGISTRATION
        # The registration changes behind the lifecycle's back: it registers again.
        result = await controller.quorum.propose(
            RegisterBroker(2, "127.0.0.1", 1, None, uuid.uuid4().hex))
        assert result.ok
        await eventually(lambda: lifecycle.broker_epoch > first_epoch
                         and not controller.quorum.image.brokers[2].fenced,
                         "broker 2 to register again and be unfenced")
        assert controller.quorum.image.brokers[2].incarnation_id == lifecycle.incarnation_id
        nursery.cancel_scope.cancel()


def test_settings_from_config(tmp_path: Path) -> None:
    config = server_config(tmp_path, 1, 9092, 9093)
    settings = settings_from_config(config)
    assert settings == ControllerSettings(
        node_id=1, session_timeout_ms=SESSION_MS, rebalance_interval_ms=1000,
        unclean_leader_election=False, cluster_id="test-cluster",
        disconnected_grace_ms=min(2 * HEARTBEAT_MS, SESSION_MS))


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"broker.heartbeat.interval.ms": "9000"}, "broker.heartbeat.interval.ms"),
        ({"broker.session.timeout.ms": "0"}, "broker.session.timeout.ms"),
        ({"unclean.leader.election.enable": "maybe"}, "unclean.leader.election.enable"),
    ],
)
def test_cluster_timing_config_is_validated(
    tmp_path: Path, overrides: dict[str, str], problem: str
) -> None:
    base = server_config(tmp_path, 1, 9092, 9093)
    properties = {"node.id": "1", "log.dirs": str(tmp_path), **overrides}
    with pytest.raises(ConfigError) as caught:
        ServerConfig.from_properties(properties)
    assert caught.value.property_name == problem
    assert base.broker_session_timeout_ms == SESSION_MS
    defaults = ServerConfig.from_properties({"node.id": "1", "log.dirs": str(tmp_path)})
    assert (defaults.broker_session_timeout_ms, defaults.broker_heartbeat_interval_ms,
            defaults.replica_lag_time_max_ms, defaults.unclean_leader_election_enable) == (
        9000, 2000, 30000, False)
