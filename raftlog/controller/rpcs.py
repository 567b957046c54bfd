"""The controller's side of KRaft's broker-to-controller RPCs, and DescribeQuorum.

* BrokerRegistration (62), BrokerHeartbeat (63), AlterPartition (56), AllocateProducerIds (67):
  served by the :class:`~raftlog.controller.service.ControllerService` while this
  node is the ready controller; anywhere else they answer NOT_CONTROLLER (41) and the broker
  re-resolves the controller.
* DescribeQuorum (55): this node's view of the metadata quorum (``quorum.status()``); the
  partition-level error is NOT_CONTROLLER on a node that is not the controller, whose view
  of per-voter progress is only partial.

The admin requests clients send (CreateTopics, AlterConfigs, Envelope...) are routed by
:mod:`raftlog.broker.controller_apis`, which needs the broker's request handlers; these RPCs need
only the controller and the quorum.

Handlers follow ``raftlog.server.listener``'s contract: never raise for bad input, return a body or
a coroutine function that produces one, and bound every wait.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from raftlog.config import ServerConfig
from raftlog.controller.core import (
    STALE_BROKER_EPOCH,
    AlterPartitionRequest,
    Heartbeat,
    Registration,
)
from raftlog.controller.service import (
    AlterPartitionResult,
    ControllerService,
    ControllerUnavailableError,
)
from raftlog.metadata import errors
from raftlog.metadata.image import BrokerEndpoint
from raftlog.metadata.state import METADATA_TOPIC_NAME
from raftlog.protocol.codec import Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import (
    ALLOCATE_PRODUCER_IDS,
    ALTER_PARTITION,
    BROKER_HEARTBEAT,
    BROKER_REGISTRATION,
    DESCRIBE_QUORUM,
)
from raftlog.quorum.interface import Quorum, QuorumStatus
from raftlog.server.listener import Body, Handler, HandlerResult, RequestContext

log = logging.getLogger(__name__)


class ControllerRpcs:
    """The handlers of the RPCs brokers send the controller, and DescribeQuorum.

    Args:
        config: This node's configuration (the inter-broker listener a registration names).
        quorum: The metadata quorum (DescribeQuorum's view).
        controller: Decides and commits registrations, heartbeats, ISR changes and producer id
            blocks while this node is the active controller.
    """

    def __init__(self, config: ServerConfig, quorum: Quorum, controller: ControllerService) -> None:
        self.config = config
        self.quorum = quorum
        self.controller = controller

    def handlers(self) -> dict[int, Handler]:
        table: dict[int, Callable[[RequestContext], HandlerResult]] = {
            BROKER_REGISTRATION.key: self.broker_registration,
            BROKER_HEARTBEAT.key: self.broker_heartbeat,
            ALTER_PARTITION.key: self.alter_partition,
            ALLOCATE_PRODUCER_IDS.key: self.allocate_producer_ids,
            DESCRIBE_QUORUM.key: self.describe_quorum,
        }
        return dict(table)

    # -- BrokerRegistration, BrokerHeartbeat -------------------------------------------------

    def broker_registration(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        if not self.controller.active:
            return _registration_body(errors.NOT_CONTROLLER)
        listener = _pick_listener(request.listeners, self.config.inter_broker_listener_name)
        if listener is None:
            return _registration_body(errors.INVALID_REQUEST)
        endpoints = _endpoints(request.listeners)
        if endpoints is None:
            return _registration_body(errors.INVALID_REQUEST)
        registration = Registration(
            broker_id=request.broker_id,
            incarnation_id=request.incarnation_id.hex,
            host=listener.host,
            port=listener.port,
            rack=request.rack or None,
            cluster_id=request.cluster_id or None,
            endpoints=endpoints,
        )

        async def register() -> Body:
            try:
                code, message, epoch = await self.controller.register(registration)
            except ControllerUnavailableError as exc:
                return _registration_body(exc.error_code)
            if code != errors.NONE:
                log.info("registration of broker %d refused: %s", request.broker_id, message)
            return _registration_body(code, epoch)

        return register

    def broker_heartbeat(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        if not self.controller.active:
            return _heartbeat_body(errors.NOT_CONTROLLER)
        heartbeat = Heartbeat(
            broker_id=request.broker_id,
            broker_epoch=request.broker_epoch,
            current_metadata_offset=request.current_metadata_offset,
            want_fence=request.want_fence,
            want_shut_down=request.want_shut_down,
        )

        async def beat() -> Body:
            try:
                reply = await self.controller.heartbeat(heartbeat)
            except ControllerUnavailableError as exc:
                return _heartbeat_body(exc.error_code)
            return _heartbeat_body(reply.error_code, is_caught_up=reply.is_caught_up,
                                   is_fenced=reply.is_fenced,
                                   should_shut_down=reply.should_shut_down)

        return beat

    # -- AlterPartition ------------------------------------------------------------------------

    def alter_partition(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        if not self.controller.active:
            return {"throttle_time_ms": 0, "error_code": errors.NOT_CONTROLLER, "topics": []}
        wanted = [
            AlterPartitionRequest(
                request.broker_id, request.broker_epoch, topic.topic_name,
                partition.partition_index, partition.leader_epoch, tuple(partition.new_isr),
                partition.partition_epoch,
            )
            for topic in request.topics
            for partition in topic.partitions
        ]

        async def alter_all() -> Body:
            try:
                answers = await self.controller.alter_partitions(wanted)
            except ControllerUnavailableError as exc:
                if exc.error_code == errors.NOT_CONTROLLER:
                    return {"throttle_time_ms": 0, "error_code": exc.error_code, "topics": []}
                answers = [AlterPartitionResult(exc.error_code) for _ in wanted]
            results: dict[str, list[Body]] = {}
            for item, result in zip(wanted, answers, strict=True):
                results.setdefault(item.topic, []).append(_alter_result(item, result))
            top = _top_level_alter_error(results)
            if top is not None:
                return {"throttle_time_ms": 0, "error_code": top, "topics": []}
            topics = [{"topic_name": name, "partitions": parts} for name, parts in results.items()]
            return {"throttle_time_ms": 0, "error_code": errors.NONE, "topics": topics}

        return alter_all

    # -- AllocateProducerIds -------------------------------------------------------------------

    def allocate_producer_ids(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        if not self.controller.active:
            return _allocate_body(errors.NOT_CONTROLLER)

        async def allocate() -> Body:
            try:
                start, length = await self.controller.allocate_producer_ids(
                    request.broker_id, request.broker_epoch
                )
            except ControllerUnavailableError as exc:
                log.info("AllocateProducerIds for broker %d: %s", request.broker_id, exc)
                return _allocate_body(exc.error_code)
            return _allocate_body(errors.NONE, start, length)

        return allocate

    # -- DescribeQuorum ------------------------------------------------------------------------

    def describe_quorum(self, ctx: RequestContext) -> HandlerResult:
        status = self.quorum.status()
        error = errors.NONE if self.quorum.controller_ready else errors.NOT_CONTROLLER
        topics = []
        for topic in ctx.body.topics:
            partitions = []
            for partition in topic.partitions:
                if topic.topic_name != METADATA_TOPIC_NAME or partition.partition_index != 0:
                    partitions.append(_unknown_quorum_partition(partition.partition_index))
                else:
                    partitions.append(_quorum_partition(status, error))
            topics.append({"topic_name": topic.topic_name, "partitions": partitions})
        return {"error_code": errors.NONE, "topics": topics}


# -- Bodies --------------------------------------------------------------------------------------


# BrokerRegistration's security_protocol ids (Kafka's SecurityProtocol).
_SECURITY_PROTOCOLS: Final = {0: "PLAINTEXT", 1: "SSL", 2: "SASL_PLAINTEXT", 3: "SASL_SSL"}


def _endpoints(listeners: Sequence[Struct]) -> tuple[BrokerEndpoint, ...] | None:
    """Every listener of a registration by name, or None when one has an unknown protocol."""
    endpoints = []
    for listener in listeners:
        protocol = _SECURITY_PROTOCOLS.get(listener.security_protocol)
        if protocol is None:
            return None
        endpoints.append(BrokerEndpoint(listener.name.upper(), listener.host, listener.port,
                                        protocol))
    return tuple(sorted(endpoints, key=lambda endpoint: endpoint.name))


def _pick_listener(listeners: Sequence[Struct], name: str) -> Struct | None:
    for listener in listeners:
        if listener.name.upper() == name.upper():
            return listener
    return listeners[0] if listeners else None


def _registration_body(error: int, epoch: int = -1) -> Body:
    return {"throttle_time_ms": 0, "error_code": error, "broker_epoch": epoch}


def _heartbeat_body(error: int, *, is_caught_up: bool = False, is_fenced: bool = True,
                    should_shut_down: bool = False) -> Body:
    return {"throttle_time_ms": 0, "error_code": error, "is_caught_up": is_caught_up,
            "is_fenced": is_fenced, "should_shut_down": should_shut_down}


def _allocate_body(error: int, start: int = -1, length: int = 0) -> Body:
    return {"throttle_time_ms": 0, "error_code": error, "producer_id_start": start,
            "producer_id_len": length}


def _alter_result(item: AlterPartitionRequest, result: AlterPartitionResult) -> Body:
    partition = result.partition
    return {
        "partition_index": item.partition,
        "error_code": result.error_code,
        "leader_id": -1 if partition is None else partition.leader,
        "leader_epoch": -1 if partition is None else partition.leader_epoch,
        "isr": [] if partition is None else list(partition.isr),
        "leader_recovery_state": 0,
        "partition_epoch": -1 if partition is None else partition.partition_epoch,
    }


_BROKER_LEVEL_ERRORS: Final = frozenset({errors.BROKER_ID_NOT_REGISTERED, STALE_BROKER_EPOCH})


def _top_level_alter_error(results: dict[str, list[Body]]) -> int | None:
    """Kafka answers a stale broker epoch for the whole request, not per partition."""
    for parts in results.values():
        for part in parts:
            if part["error_code"] in _BROKER_LEVEL_ERRORS:
                return int(part["error_code"])
    return None


def _unknown_quorum_partition(index: int) -> Body:
    return {"partition_index": index, "error_code": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            "leader_id": -1, "leader_epoch": -1, "high_watermark": -1,
            "current_voters": [], "observers": []}


def _quorum_partition(status: QuorumStatus, error: int) -> Body:
    now_ms = int(time.time() * 1000)

    def contact_ms(seconds: float | None) -> int:
        return -1 if seconds is None else now_ms - int(seconds * 1000)

    voters = [
        {"replica_id": v.node_id,
         "log_end_offset": -1 if v.match_index is None else v.match_index,
         "last_fetch_timestamp": contact_ms(v.last_contact_s),
         "last_caught_up_timestamp": -1 if v.lag != 0 else contact_ms(v.last_contact_s)}
        for v in status.voters
    ]  # fmt: skip
    observers = [
        {"replica_id": -1 if o.node_id is None else o.node_id,
         "log_end_offset": -1 if o.match_index is None else o.match_index,
         "last_fetch_timestamp": -1, "last_caught_up_timestamp": -1}
        for o in status.observers
    ]  # fmt: skip
    return {
        "partition_index": 0,
        "error_code": error,
        "leader_id": -1 if status.leader_node_id is None else status.leader_node_id,
        "leader_epoch": status.term,
        "high_watermark": status.commit_index,
        "current_voters": voters,
        "observers": observers,
    }


def describe_quorum_request() -> dict[str, Any]:
    """The DescribeQuorum request body for the metadata partition."""
    return {"topics": [{"topic_name": METADATA_TOPIC_NAME,
                        "partitions": [{"partition_index": 0}]}]}

