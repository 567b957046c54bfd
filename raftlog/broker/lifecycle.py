"""The broker side of KRaft's broker-to-controller protocol: registration, heartbeats, shutdown.

``ControllerChannel`` sends one internal request (BrokerRegistration, BrokerHeartbeat,
AlterPartition, AllocateProducerIds, CreateTopics, or an Envelope carrying a client's
forwarded admin request, see :mod:`raftlog.protocol.envelope`) to whichever node is the
controller *now*: the Raft leader this node believes in (``quorum.leader_node_id``), else the
image's ``controller_node_id``, reached over that node's Kafka listener as registered in the
image. When that node is this node, the request is handled in-process (encoded and decoded
through the codec exactly like a network request), which is how a combined node's controller
registers its own broker before any address is known: every other broker waits until the
controller's registration shows up in the image. A NOT_CONTROLLER answer, a refused connection
or a timeout makes it re-resolve and retry, with backoff, until the caller's deadline.

``BrokerLifecycle`` keeps this broker registered and heartbeating (KRaft's
``BrokerLifecycleManager``): it registers a new incarnation on start (a broker starts fenced),
heartbeats every ``broker.heartbeat.interval.ms`` reporting its metadata offset (faster while
fenced, so it is unfenced as soon as it has caught up), re-registers on STALE_BROKER_EPOCH or
BROKER_ID_NOT_REGISTERED, and performs the controlled shutdown. It also provides the callbacks
other parts use: ``alter_isr`` for the replica manager's ISR changes and ``allocate_block`` for
the producer-id manager.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final

import trio

from raftlog.broker.alter_partition_sender import AlterPartitionSender
from raftlog.client.connection import ClusterLogin, KafkaClientError, KafkaConnection
from raftlog.config import ServerConfig
from raftlog.controller.core import (
    INCONSISTENT_CLUSTER_ID,
    STALE_BROKER_EPOCH,
)
from raftlog.metadata import errors
from raftlog.metadata.image import PartitionImage
from raftlog.protocol import codec
from raftlog.protocol.codec import Api, Struct
from raftlog.protocol.schemas import (
    ALLOCATE_PRODUCER_IDS,
    ALTER_PARTITION,
    BROKER_HEARTBEAT,
    BROKER_REGISTRATION,
)
from raftlog.quorum.interface import Quorum, QuorumTimeoutError
from raftlog.security.session import Session
from raftlog.server.listener import Handler, RequestContext
from raftlog.server.sasl import local_session

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S_MAX: Final = 5.0
REQUEST_TIMEOUT_S_MIN: Final = 1.0
CONNECT_TIMEOUT_S: Final = 2.0
BACKOFF_S_MIN: Final = 0.02
# Why 0.1 s (Kafka's retry.backoff.ms): a node that has just won the Raft election answers
# NOT_CONTROLLER until its controller service is running, and nothing else wakes the waiters
# then; a 0.5 s cap cost every fresh cluster ~0.5 s before the first registration.
BACKOFF_S_MAX: Final = 0.1
FENCED_HEARTBEAT_INTERVAL_S: Final = 0.1
SHUTDOWN_HEARTBEAT_INTERVAL_S: Final = 0.05
CONTROLLED_SHUTDOWN_TIMEOUT_S: Final = 5.0
REGISTRATION_WAIT_S: Final = 5.0
MISCONFIGURED_RETRY_S: Final = 5.0
SECURITY_PROTOCOL_PLAINTEXT: Final = 0
SECURITY_PROTOCOL_IDS: Final = {"PLAINTEXT": 0, "SSL": 1, "SASL_PLAINTEXT": 2, "SASL_SSL": 3}
ALTER_PARTITION_VERSION: Final = 1


class ControllerUnreachableError(Exception):
    """No controller answered (other than NOT_CONTROLLER) before the deadline."""


class BrokerLifecycleError(Exception):
    """The controller refused this broker for good (e.g. another cluster's id)."""


def _default_is_not_controller(response: Struct) -> bool:
    return bool(response.get("error_code") == errors.NOT_CONTROLLER)


async def call_in_process(
    handler: Handler, api: Api, version: int, body: Mapping[str, Any],
    session: Session | None = None,
) -> Struct:
    """Run ``handler`` on ``body`` as if it had arrived over the network, and return the
    decoded response (both directions go through the codec, so the semantics are the same)."""
    payload = codec.encode_bytes(api, version, body, is_request=True)
    request = codec.decode(api, version, payload, is_request=True)
    header = codec.RequestHeader(api.key, version, 0, "in-process")
    result = handler(RequestContext(api, header, request, "in-process",
                                    session or Session("in-process")))
    if result is not None and not isinstance(result, dict):
        result = await result()
    if result is None:
        raise KafkaClientError(f"{api.name} handler sent no response")
    return codec.decode(api, version, codec.encode_bytes(api, version, result), is_request=False)


class ControllerChannel:
    """Sends broker-to-controller requests to the current controller. See the module doc."""

    def __init__(
        self,
        node_id: int,
        quorum: Quorum,
        *,
        local_handlers: Mapping[int, Handler] | None = None,
        login: ClusterLogin | None = None,
    ) -> None:
        self.node_id = node_id
        self._login = login
        self._local_session = local_session(node_id)
        self._quorum = quorum
        self._local_handlers = local_handlers
        # Only for the peer's logs: a forwarded request is recognised by its Envelope.
        self._client_id = f"raftlog-broker-{node_id}"
        self._connections: dict[int, tuple[tuple[str, int], KafkaConnection]] = {}
        self._connect_locks: dict[int, trio.Lock] = {}

    def set_local_handlers(self, handlers: Mapping[int, Handler]) -> None:
        """The handlers of this node's own controller (combined mode)."""
        self._local_handlers = handlers

    def candidates(self) -> list[int]:
        """Controller candidates, best guess first."""
        out: list[int] = []
        for node_id in (self._quorum.leader_node_id, self._quorum.image.controller_node_id):
            if node_id is not None and node_id >= 0 and node_id not in out:
                out.append(node_id)
        return out

    async def call(
        self,
        api: Api,
        body: Mapping[str, Any],
        *,
        version: int,
        timeout_s: float,
        is_not_controller: Callable[[Struct], bool] = _default_is_not_controller,
    ) -> Struct:
        """Send ``body`` to the controller; retry elsewhere on NOT_CONTROLLER or failure.

        Raises:
            ControllerUnreachableError: nothing but failures until ``timeout_s`` passed.
        """
        deadline = trio.current_time() + timeout_s
        backoff = BACKOFF_S_MIN
        last_problem = "no controller known"
        skip: set[int] = set()
        while True:
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                raise ControllerUnreachableError(f"{api.name}: {last_problem}")
            candidates = [c for c in self.candidates() if c not in skip] or self.candidates()
            skip.clear()
            target = candidates[0] if candidates else None
            if target is not None:
                try:
                    response = await self._send(target, api, version, body, remaining)
                except (KafkaClientError, OSError, trio.TooSlowError) as exc:
                    last_problem = f"node {target}: {exc}"
                    await self._drop(target)
                    skip.add(target)
                else:
                    if not is_not_controller(response):
                        return response
                    last_problem = f"node {target} is not the controller"
                    skip.add(target)
            await self._pause(min(backoff, max(deadline - trio.current_time(), 0)))
            backoff = min(backoff * 2, BACKOFF_S_MAX)

    async def _pause(self, seconds: float) -> None:
        """Sleep, but wake early when the metadata changes (a new controller may be known)."""
        if seconds <= 0:
            return
        with contextlib.suppress(QuorumTimeoutError):
            await self._quorum.wait_changed(self._quorum.image.version, timeout_s=seconds)

    async def _send(
        self, target: int, api: Api, version: int, body: Mapping[str, Any], timeout_s: float
    ) -> Struct:
        handler = None if self._local_handlers is None else self._local_handlers.get(api.key)
        if target == self.node_id and handler is not None:
            with trio.fail_after(timeout_s):
                return await call_in_process(handler, api, version, body, self._local_session)
        broker = self._quorum.image.brokers.get(target)
        if broker is None:
            raise KafkaClientError(f"node {target} has not registered an address yet")
        connection = await self._connection(target, (broker.host, broker.port), timeout_s)
        try:
            return await connection.request(api, body, version=version, timeout_s=timeout_s)
        except BaseException:
            # Failed or cancelled mid-request: the connection's framing state is unknown.
            await self._drop(target)
            raise

    async def _connection(
        self, target: int, address: tuple[str, int], timeout_s: float
    ) -> KafkaConnection:
        lock = self._connect_locks.setdefault(target, trio.Lock())
        with trio.fail_after(timeout_s):
            async with lock:
                cached = self._connections.get(target)
                if cached is not None and cached[0] == address:
                    return cached[1]
                if cached is not None:
                    await self._drop(target)
                with trio.fail_after(min(timeout_s, CONNECT_TIMEOUT_S)):
                    connection = await KafkaConnection.connect(
                        *address, client_id=self._client_id, timeout_s=CONNECT_TIMEOUT_S,
                        login=self._login,
                    )
                self._connections[target] = (address, connection)
                return connection

    async def _drop(self, target: int) -> None:
        cached = self._connections.pop(target, None)
        if cached is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await cached[1].aclose()

    async def aclose(self) -> None:
        for target in list(self._connections):
            await self._drop(target)


class BrokerLifecycle:
    """Keeps this broker registered with and heartbeating to the controller."""

    def __init__(
        self,
        config: ServerConfig,
        quorum: Quorum,
        channel: ControllerChannel,
        *,
        advertised: tuple[str, int],
        incarnation_id: str | None = None,
        endpoints: Callable[[], list[tuple[str, str, int]]] | None = None,
        heartbeat_channel: ControllerChannel | None = None,
    ) -> None:
        self.config = config
        self.node_id = config.node_id
        self._quorum = quorum
        self.channel = channel
        # Registration and heartbeats on their own connection (Kafka's separate heartbeat
        # channel): answers come in request order on a connection, so behind a thousand
        # AlterPartition requests waiting for their commits a heartbeat came too late and
        # the broker was fenced; and a timed-out request drops its connection.
        self._heartbeat_channel = channel if heartbeat_channel is None else heartbeat_channel
        self.advertised = advertised
        # (listener, host, port) of every advertised listener, read at each registration (a
        # listener on port 0 knows its port once bound); the config's by default.
        self._endpoints = endpoints or (lambda: [
            (listener.name, listener.host, listener.port)
            for listener in config.advertised_listeners])
        self.incarnation_id = incarnation_id or uuid.uuid4().hex
        self.broker_epoch = -1
        self.fenced = True
        self._interval_s = config.broker_heartbeat_interval_ms / 1000
        self._request_timeout_s = min(
            max(2 * self._interval_s, REQUEST_TIMEOUT_S_MIN), REQUEST_TIMEOUT_S_MAX
        )
        self._want_shut_down = False
        self._shut_down_granted = trio.Event()
        self._registered = trio.Event()
        self._state_changed = trio.Event()
        self._wake = trio.Event()
        self._isr_sender = AlterPartitionSender(
            self._send_alter_partition, self.node_id, lambda: self.broker_epoch,
            self._partition_from)

    # --- Observers ------------------------------------------------------------------------

    async def wait_registered(self, timeout_s: float) -> bool:
        with trio.move_on_after(timeout_s):
            await self._registered.wait()
        return self._registered.is_set()

    async def wait_unfenced(self, timeout_s: float) -> bool:
        """Wait until the controller says this broker is registered and unfenced."""
        with trio.move_on_after(timeout_s):
            while self.fenced or self.broker_epoch < 0:
                await self._state_changed.wait()
        return not self.fenced and self.broker_epoch >= 0

    def _changed(self) -> None:
        self._state_changed.set()
        self._state_changed = trio.Event()

    # --- The service task -------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register, then heartbeat; re-register whenever the controller forgets us. Also
        sends the ISR changes (``alter_isr``)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._isr_sender.run)
            task_status.started()
            while True:
                await self._register()
                await self._heartbeat_until_stale()

    def _registration_body(self) -> dict[str, Any]:
        """Every advertised listener, the inter-broker one first (KRaft registers them all;
        a client is answered with the endpoints of the listener it came in on)."""
        host, port = self.advertised
        name = self.config.inter_broker_listener_name or "PLAINTEXT"
        listeners = [(name, host, port)] + [
            endpoint for endpoint in self._endpoints() if endpoint[0] != name]
        return {
            "broker_id": self.node_id,
            "cluster_id": self.config.cluster_id or "",
            "incarnation_id": uuid.UUID(hex=self.incarnation_id),
            "listeners": [{"name": listener, "host": address, "port": number,
                           "security_protocol": SECURITY_PROTOCOL_IDS.get(
                               self.config.protocol_of(listener), SECURITY_PROTOCOL_PLAINTEXT)}
                          for listener, address, number in listeners],
            "features": [],
            "rack": None,
        }

    async def _register(self) -> None:
        backoff = BACKOFF_S_MIN
        while True:
            try:
                response = await self._heartbeat_channel.call(
                    BROKER_REGISTRATION, self._registration_body(), version=0,
                    timeout_s=self._request_timeout_s,
                )  # fmt: skip
            except ControllerUnreachableError as exc:
                log.info("broker %d registration: %s; retrying", self.node_id, exc)
            else:
                code = response.error_code
                if code == errors.NONE:
                    self.broker_epoch = response.broker_epoch
                    self.fenced = True
                    self._registered.set()
                    self._changed()
                    log.info("broker %d registered with epoch %d", self.node_id,
                             self.broker_epoch)
                    return
                if code == INCONSISTENT_CLUSTER_ID:
                    # A configuration error: keep trying, slowly, so a fix of the other side
                    # is picked up, without flooding the log.
                    log.error("broker %d: the controller belongs to another cluster than "
                              "cluster.id %r", self.node_id, self.config.cluster_id)
                    backoff = MISCONFIGURED_RETRY_S
                else:
                    # DUPLICATE_BROKER_REGISTRATION: our previous incarnation's session has to
                    # expire first (it crashed rather than shutting down cleanly).
                    log.debug("broker %d registration refused: %s", self.node_id,
                              errors.error_name(code))
            await trio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_S_MAX)

    async def _heartbeat_until_stale(self) -> None:
        while True:
            try:
                response = await self._heartbeat_channel.call(
                    BROKER_HEARTBEAT, self._heartbeat_body(), version=0,
                    timeout_s=self._request_timeout_s,
                )  # fmt: skip
            except ControllerUnreachableError as exc:
                log.info("broker %d heartbeat: %s", self.node_id, exc)
            else:
                code = response.error_code
                if code in (STALE_BROKER_EPOCH, errors.BROKER_ID_NOT_REGISTERED):
                    log.warning("broker %d: heartbeat answered %s; registering again",
                                self.node_id, errors.error_name(code))
                    self.broker_epoch = -1
                    self.fenced = True
                    self._changed()
                    return
                if code == errors.NONE:
                    self._note_heartbeat(response)
            self._wake = trio.Event()
            with trio.move_on_after(self._next_interval_s()):
                await self._wake.wait()

    def _heartbeat_body(self) -> dict[str, Any]:
        return {
            "broker_id": self.node_id,
            "broker_epoch": self.broker_epoch,
            "current_metadata_offset": self._quorum.image.version,
            "want_fence": False,
            "want_shut_down": self._want_shut_down,
        }

    def _note_heartbeat(self, response: Struct) -> None:
        fenced = bool(response.is_fenced)
        if fenced != self.fenced:
            log.info("broker %d is %s", self.node_id, "fenced" if fenced else "unfenced")
            self.fenced = fenced
            self._changed()
        if self._want_shut_down and response.should_shut_down:
            self._shut_down_granted.set()

    def _next_interval_s(self) -> float:
        if self._want_shut_down:
            return min(self._interval_s, SHUTDOWN_HEARTBEAT_INTERVAL_S)
        if self.fenced:
            return min(self._interval_s, FENCED_HEARTBEAT_INTERVAL_S)
        return self._interval_s

    # --- Controlled shutdown ----------------------------------------------------------------

    def controlled_shutdown_useful(self) -> bool:
        """Whether another broker could take over: else a controlled shutdown only takes
        every partition offline (a single node keeps its leaderships across a restart)."""
        image = self._quorum.image
        me = image.brokers.get(self.node_id)
        others = [b for b in image.brokers.values() if b.node_id != self.node_id and not b.fenced]
        return me is not None and not me.fenced and bool(others) and self.broker_epoch >= 0

    async def controlled_shutdown(self, timeout_s: float = CONTROLLED_SHUTDOWN_TIMEOUT_S) -> bool:
        """Ask the controller to move leadership away and fence us; True once it agreed.

        Bounded by ``timeout_s``: a shutdown never hangs on an unreachable controller.
        """
        if not self.config.controlled_shutdown_enable or not self.controlled_shutdown_useful():
            return False
        log.info("broker %d: controlled shutdown", self.node_id)
        self._want_shut_down = True
        self._wake.set()
        with trio.move_on_after(timeout_s):
            await self._shut_down_granted.wait()
        done = self._shut_down_granted.is_set()
        log.info("broker %d: controlled shutdown %s", self.node_id,
                 "complete" if done else f"not confirmed within {timeout_s:g} s")
        return done

    # --- Callbacks for the replica manager and the producer-id manager ----------------------

    async def alter_isr(
        self,
        topic: str,
        partition: int,
        new_isr: tuple[int, ...],
        leader_epoch: int,
        partition_epoch: int,
    ) -> tuple[int, PartitionImage | None]:
        """AlterPartition for one partition this broker leads (``ReplicaManager``'s
        ``alter_isr``), sent with every other change queued meanwhile
        (``AlterPartitionSender``): returns the error code and the partition as the
        controller committed it (on success) or currently has it (on a refusal that carries
        it), else None.

        Raises:
            AlterPartitionUnansweredError: no controller answered in time (outcome unknown:
                the change may or may not have been committed).
            SupersededError: a newer change of this partition replaced it before it was sent.
        """
        return await self._isr_sender.alter_isr(topic, partition, new_isr, leader_epoch,
                                                partition_epoch)

    async def _send_alter_partition(self, body: dict[str, Any]) -> Struct:
        # Not the heartbeat's timeout (twice its interval): a batch of ISR changes waits for
        # a Raft commit of all of them, and a timeout makes every outcome unknown.
        return await self.channel.call(ALTER_PARTITION, body, version=ALTER_PARTITION_VERSION,
                                       timeout_s=REQUEST_TIMEOUT_S_MAX)

    def _partition_from(self, topic: str, result: Struct) -> PartitionImage | None:
        """The partition as an AlterPartition answer gives it (None without an epoch)."""
        if result.partition_epoch < 0:
            return None
        known = self._quorum.image.partition(topic, result.partition_index)
        return PartitionImage(
            result.partition_index, () if known is None else known.replicas, tuple(result.isr),
            result.leader_id, result.leader_epoch, result.partition_epoch,
        )  # fmt: skip

    async def allocate_block(self) -> tuple[int, int]:
        """AllocateProducerIds: (first id, length) of a new block for this broker.

        Raises:
            ControllerUnreachableError, BrokerLifecycleError: no block (the caller retries).
        """
        if not await self.wait_registered(REGISTRATION_WAIT_S):
            raise ControllerUnreachableError("not registered with the controller yet")
        response = await self.channel.call(
            ALLOCATE_PRODUCER_IDS,
            {"broker_id": self.node_id, "broker_epoch": self.broker_epoch},
            version=0, timeout_s=self._request_timeout_s,
        )  # fmt: skip
        if response.error_code != errors.NONE:
            raise BrokerLifecycleError(
                f"AllocateProducerIds failed: {errors.error_name(response.error_code)}")
        return response.producer_id_start, response.producer_id_len
