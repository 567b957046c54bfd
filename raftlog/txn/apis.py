"""Handlers of the transaction APIs: InitProducerId with a transactional id (delegated from
``raftlog.txn.init_producer_id``), AddPartitionsToTxn (24, v0-3; v4 with verify_only between
brokers, not advertised), AddOffsetsToTxn (25, v0-3), EndTxn (26, v0-3), the internal
WriteTxnMarkers (27, v0-1), and the operator APIs DescribeProducers (61, v0),
DescribeTransactions (65, v0) and ListTransactions (66, v0-1). TxnOffsetCommit (28) is a group
API (``raftlog.group.txn_offsets``); FindCoordinator key_type 1 is answered by
``raftlog.server.find_coordinator`` with the lookup ``TxnCoordinatorService.locate``.

AddOffsetsToTxn adds the group's ``__consumer_offsets`` partition (``abs(javaHash(group)) %
partitions``, as the group coordinator routes it) to the transaction, and the group to
``TxnMetadata.groups``: the COMMIT/ABORT marker then goes to that partition too, where the
group coordinator learns the outcome (``PendingOffsets``).

Every handler answers with the coordinator's decision (``raftlog.txn.coordinator``); the
PRODUCER_FENCED of the core becomes INVALID_PRODUCER_EPOCH for request versions older than
KIP-588 (AddPartitionsToTxn/EndTxn/AddOffsetsToTxn < 2, InitProducerId < 4), as Kafka's
``KafkaApis`` does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from raftlog.client.connection import ClusterLogin
from raftlog.metadata.image import MetadataImage
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import now_ms
from raftlog.protocol.codec import Api, Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.internal_topics import OFFSETS_TOPIC_PARTITIONS, coordinator_partition
from raftlog.protocol.schemas import CREATE_TOPICS
from raftlog.protocol.schemas_txn import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    DESCRIBE_PRODUCERS,
    DESCRIBE_TRANSACTIONS,
    END_TXN,
    LIST_TRANSACTIONS,
    WRITE_TXN_MARKERS,
)
from raftlog.quorum.interface import Quorum
from raftlog.server.listener import Body, Handler, HandlerResult, RequestContext
from raftlog.server.sasl import ClusterActionGate
from raftlog.txn.coordinator import TxnState
from raftlog.txn.coordinator_service import (
    OFFSETS_TOPIC,
    TXN_TOPIC,
    PendingOffsets,
    TxnCoordinatorService,
    TxnSettings,
)
from raftlog.txn.producer_ids import ProducerIdManager

__all__ = ["ControllerCall", "TxnApis", "build_coordinator", "fenced_code"]

log = logging.getLogger(__name__)


def fenced_code(code: int, version: int, first_fenced_version: int) -> int:
    if code == ErrorCode.PRODUCER_FENCED and version < first_fenced_version:
        return int(ErrorCode.INVALID_PRODUCER_EPOCH)
    return int(code)


class TxnApis:
    """Transaction handlers bound to this node's coordinator service."""

    def __init__(self, service: TxnCoordinatorService, gate: ClusterActionGate) -> None:
        self.service = service
        self.gate = gate  # AddPartitionsToTxn v4+ is for brokers only (KIP-890)

    def handlers(self) -> dict[int, Handler]:
        table: dict[int, Callable[[RequestContext], HandlerResult]] = {
            ADD_PARTITIONS_TO_TXN.key: self.add_partitions_to_txn,
            ADD_OFFSETS_TO_TXN.key: self.add_offsets_to_txn,
            END_TXN.key: self.end_txn,
            WRITE_TXN_MARKERS.key: self.write_txn_markers,
            DESCRIBE_PRODUCERS.key: self.describe_producers,
            DESCRIBE_TRANSACTIONS.key: self.describe_transactions,
            LIST_TRANSACTIONS.key: self.list_transactions,
        }
        return dict(table)

    # -- InitProducerId (transactional) ----------------------------------------------------------

    def init_producer_id(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        version = ctx.header.api_version

        async def init() -> Body:
            error, producer_id, epoch = await self.service.init_producer_id(
                request.transactional_id, request.transaction_timeout_ms,
                request.producer_id, request.producer_epoch)
            return {"throttle_time_ms": 0, "error_code": fenced_code(error, version, 4),
                    "producer_id": producer_id, "producer_epoch": epoch}

        return init

    # -- AddPartitionsToTxn ----------------------------------------------------------------------

    def add_partitions_to_txn(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        version = ctx.header.api_version
        if version >= 4:
            if not self.gate.allows(ctx):  # Kafka: v4+ needs ClusterAction on the cluster
                return {"throttle_time_ms": 0, "results_by_transaction": [],
                        "error_code": int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)}
            return self._add_partitions_batched(request)
        wanted = [(t.name, p) for t in request.v3_and_below_topics for p in t.partitions]
        image = self.service.quorum.image
        unknown = {(t, p) for t, p in wanted if t not in image.topics or t == TXN_TOPIC
                   or not 0 <= p < len(image.topics[t].partitions)}

        def body(codes: dict[tuple[str, int], int]) -> Body:
            topics: dict[str, list[Body]] = {}
            for topic, index in wanted:
                topics.setdefault(topic, []).append(
                    {"partition_index": index, "partition_error_code": codes[(topic, index)]})
            return {"throttle_time_ms": 0, "results_by_topic_v3_and_below": [
                {"name": name, "results_by_partition": parts} for name, parts in topics.items()]}

        if unknown:
            # Kafka: the unknown ones get their error, the rest OPERATION_NOT_ATTEMPTED.
            return body({tp: int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION) if tp in unknown
                         else int(ErrorCode.OPERATION_NOT_ATTEMPTED) for tp in wanted})

        async def add() -> Body:
            code = await self.service.add_partitions(
                request.v3_and_below_transactional_id, request.v3_and_below_producer_id,
                request.v3_and_below_producer_epoch, wanted)
            code = fenced_code(code, version, 2)
            return body({tp: code for tp in wanted})

        return add

    def _add_partitions_batched(self, request: Any) -> HandlerResult:
        """v4+, from partition leaders (KIP-890 part 1): several transactions per request;
        with verify_only nothing is added, each partition is answered NONE when it is in the
        producer's Ongoing transaction (``TxnCoordinatorService.verify_partitions``)."""

        def result(txn_id: str, codes: Mapping[tuple[str, int], int]) -> Body:
            topics: dict[str, list[Body]] = {}
            for (topic, index), code in codes.items():
                topics.setdefault(topic, []).append(
                    {"partition_index": index, "partition_error_code": int(code)})
            return {"transactional_id": txn_id, "topic_results": [
                {"name": name, "results_by_partition": parts} for name, parts in topics.items()]}

        async def handle() -> Body:
            results = []
            for txn in request.transactions:
                wanted = [(t.name, p) for t in txn.topics for p in t.partitions]
                if txn.verify_only:
                    codes = self.service.verify_partitions(
                        txn.transactional_id, txn.producer_id, txn.producer_epoch, wanted)
                else:
                    code = await self.service.add_partitions(
                        txn.transactional_id, txn.producer_id, txn.producer_epoch, wanted)
                    codes = dict.fromkeys(wanted, code)
                results.append(result(txn.transactional_id, codes))
            return {"throttle_time_ms": 0, "error_code": 0, "results_by_transaction": results}

        return handle

    # -- AddOffsetsToTxn --------------------------------------------------------------------------

    def add_offsets_to_txn(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        version = ctx.header.api_version
        if not request.group_id:
            return {"throttle_time_ms": 0, "error_code": int(ErrorCode.INVALID_GROUP_ID)}
        known = self.service.quorum.image.topics.get(OFFSETS_TOPIC)
        count = len(known.partitions) if known is not None else OFFSETS_TOPIC_PARTITIONS
        index = coordinator_partition(request.group_id, count)

        async def add() -> Body:
            code = await self.service.add_partitions(
                request.transactional_id, request.producer_id, request.producer_epoch,
                [(OFFSETS_TOPIC, index)], groups=(request.group_id,))
            return {"throttle_time_ms": 0, "error_code": fenced_code(code, version, 2)}

        return add

    # -- operator APIs -----------------------------------------------------------------------

    def describe_producers(self, ctx: RequestContext) -> HandlerResult:
        """DescribeProducers: the active producers of partitions this node leads."""
        manager = self.service.manager
        image = self.service.quorum.image
        topics = []
        for topic in ctx.body.topics:
            parts = []
            for index in topic.partition_indexes:
                entry: Body = {"partition_index": index, "error_code": 0,
                               "error_message": None, "active_producers": []}
                partition = manager.get(topic.name, index)
                known = image.topics.get(topic.name)
                if partition is None:
                    entry["error_code"] = int(
                        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                        if known is None or not 0 <= index < len(known.partitions)
                        else ErrorCode.NOT_LEADER_OR_FOLLOWER)
                elif not partition.is_leader:
                    entry["error_code"] = int(ErrorCode.NOT_LEADER_OR_FOLLOWER)
                else:
                    entry["active_producers"] = [{
                        "producer_id": p.producer_id, "producer_epoch": p.epoch,
                        "last_sequence": p.last_seq,
                        "last_timestamp": p.batches[-1].timestamp_ms if p.batches else -1,
                        "coordinator_epoch": p.coordinator_epoch,
                        "current_txn_start_offset": p.current_txn_first_offset,
                    } for p in sorted(partition.producers.entries(),
                                      key=lambda e: e.producer_id)]
                parts.append(entry)
            topics.append({"name": topic.name, "partitions": parts})
        return {"throttle_time_ms": 0, "topics": topics}

    def describe_transactions(self, ctx: RequestContext) -> HandlerResult:
        states = []
        for txn_id in ctx.body.transactional_ids:
            error, metadata = self.service.describe_error(txn_id)
            if metadata is None:
                states.append({"error_code": int(error), "transactional_id": txn_id,
                               "transaction_state": "", "transaction_timeout_ms": 0,
                               "transaction_start_time_ms": -1, "producer_id": -1,
                               "producer_epoch": -1, "topics": []})
                continue
            topics: dict[str, list[int]] = {}
            for topic, index in sorted(metadata.partitions):
                topics.setdefault(topic, []).append(index)
            states.append({
                "error_code": 0, "transactional_id": txn_id,
                "transaction_state": metadata.state.value,
                "transaction_timeout_ms": metadata.timeout_ms,
                "transaction_start_time_ms": metadata.txn_start_ms,
                "producer_id": metadata.producer_id,
                "producer_epoch": metadata.producer_epoch,
                "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()]})
        return {"throttle_time_ms": 0, "transaction_states": states}

    def list_transactions(self, ctx: RequestContext) -> HandlerResult:
        """ListTransactions: the transactions of the coordinator partitions this node leads."""
        request = ctx.body
        version = ctx.header.api_version
        known_states = {s.value for s in TxnState}
        state_filters = set(request.state_filters)
        unknown = sorted(state_filters - known_states)
        producer_filters = set(request.producer_id_filters)
        duration = request.duration_filter if version >= 1 else -1
        now = now_ms()
        listed = []
        for metadata in sorted(self.service.all_transactions(),
                               key=lambda m: m.transactional_id):
            if state_filters and metadata.state.value not in state_filters:
                continue
            if producer_filters and metadata.producer_id not in producer_filters:
                continue
            if duration >= 0 and (metadata.state != TxnState.ONGOING or
                                  now - metadata.txn_start_ms < duration):
                continue
            listed.append({"transactional_id": metadata.transactional_id,
                           "producer_id": metadata.producer_id,
                           "transaction_state": metadata.state.value})
        error = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if self.service.loading() \
            else ErrorCode.NONE
        return {"throttle_time_ms": 0, "error_code": int(error),
                "unknown_state_filters": unknown, "transaction_states": listed}

    # -- EndTxn ----------------------------------------------------------------------------------

    def end_txn(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        version = ctx.header.api_version

        async def end() -> Body:
            code = await self.service.end_txn(request.transactional_id, request.producer_id,
                                              request.producer_epoch, request.committed)
            return {"throttle_time_ms": 0, "error_code": fenced_code(code, version, 2)}

        return end

    # -- WriteTxnMarkers (internal) --------------------------------------------------------------

    def write_txn_markers(self, ctx: RequestContext) -> HandlerResult:
        """Behind the ClusterAction gate (``raftlog.server.sasl``): only cluster members
        get here. A broker's marker must also come from a current transaction coordinator:
        ``coordinator_epoch`` must be the leader epoch of a ``__transaction_state`` partition
        that the sender leads in this node's image (an operator's abort, authenticated as
        the admin, is checked by the producer state alone, as Kafka's tool is)."""
        request = ctx.body
        sender = ctx.session.broker_id
        coordinator_epochs = None if sender is None else \
            _coordinator_epochs_led_by(self.service.quorum.image, sender)

        async def write() -> Body:
            markers = []
            for marker in request.markers:
                refused = _marker_sender_error(sender, coordinator_epochs,
                                               marker.coordinator_epoch)
                topics = []
                for topic in marker.topics:
                    parts = []
                    for index in topic.partition_indexes:
                        if refused:
                            parts.append({"partition_index": index, "error_code": refused})
                            continue
                        code = await self.service.append_marker(
                            topic.name, index, marker.producer_id, marker.producer_epoch,
                            marker.transaction_result, marker.coordinator_epoch)
                        parts.append({"partition_index": index, "error_code": int(code)})
                    topics.append({"name": topic.name, "partitions": parts})
                markers.append({"producer_id": marker.producer_id, "topics": topics})
            return {"markers": markers}

        return write


def _coordinator_epochs_led_by(image: MetadataImage, node_id: int) -> frozenset[int]:
    """The leader epochs of the ``__transaction_state`` partitions ``node_id`` leads: a
    transaction coordinator's epoch is its partition's leader epoch."""
    topic = image.topics.get(TXN_TOPIC)
    if topic is None:
        return frozenset()
    return frozenset(p.leader_epoch for p in topic.partitions if p.leader == node_id)


def _marker_sender_error(sender: int | None, coordinator_epochs: frozenset[int] | None,
                         coordinator_epoch: int) -> int:
    """0 when a marker's sender may write it, else the error for every partition of it.

    A broker that does not lead a transaction partition at ``coordinator_epoch`` in this
    node's image gets NOT_COORDINATOR, which the coordinator retries: either this image lags
    (a new coordinator; the retry succeeds once it catches up) or the sender was replaced,
    and then its own loop sees it and stops. Never TRANSACTION_COORDINATOR_FENCED here: that
    ends a completion, and a lagging image must not end a live coordinator's."""
    if sender is None or coordinator_epochs is None:
        return 0  # the operator's abort (admin principal): the producer state decides
    if coordinator_epoch in coordinator_epochs:
        return 0
    log.info("refused markers from node %d at coordinator epoch %d: it leads no transaction"
             " partition at that epoch here (epochs %s)", sender, coordinator_epoch,
             sorted(coordinator_epochs))
    return int(ErrorCode.NOT_COORDINATOR)


class ControllerCall(Protocol):
    """A request to the active controller, retried elsewhere on NOT_CONTROLLER (the broker's
    ``ControllerChannel.call``): how the coordinator creates ``__transaction_state``."""

    async def __call__(self, api: Api, body: Mapping[str, Any], *, version: int,
                       timeout_s: float, is_not_controller: Callable[[Struct], bool]
                       ) -> Struct: ...


def build_coordinator(
    node_id: int,
    quorum: Quorum,
    manager: PartitionManager,
    producer_ids: ProducerIdManager,
    call_controller: ControllerCall,
    settings: TxnSettings | None = None,
    *,
    pending_offsets: PendingOffsets | None = None,
    login: ClusterLogin | None = None,
) -> TxnCoordinatorService:
    """This node's transaction coordinator (the caller runs ``service.run`` in its nursery):
    it creates its topic through the controller and takes producer ids from this broker's
    block. The node serves its handlers (``TxnApis``), gives its verifiers to the produce
    path, its ``locate`` to FindCoordinator, and ``TxnApis.init_producer_id`` to
    ``ProducerApis`` for InitProducerId with a transactional id."""

    async def create_topic(body: Mapping[str, Any]) -> Any:
        return await call_controller(
            CREATE_TOPICS, body, version=4, timeout_s=10.0,
            is_not_controller=lambda r: any(
                t.error_code == ErrorCode.NOT_CONTROLLER for t in r.topics))

    async def next_producer_id() -> int:
        return await producer_ids.next_producer_id(5.0)

    return TxnCoordinatorService(node_id, quorum, manager, next_producer_id,
                                 create_topic=create_topic, settings=settings,
                                 pending_offsets=pending_offsets, login=login)
