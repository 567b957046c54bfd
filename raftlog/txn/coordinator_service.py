"""The transaction coordinator's trio shell (Kafka's ``TransactionCoordinator`` +
``TransactionStateManager`` + ``TransactionMarkerChannelManager``).

* **Where state lives.** The internal topic ``__transaction_state`` (created on first use with
  ``TxnSettings.num_partitions`` partitions, replication factor min(3, live brokers),
  ``min.insync.replicas`` min(2, RF)). A transactional id belongs to partition
  ``abs(javaHash(id)) % partitions``; its coordinator is that partition's leader. Every state
  change is one record (key: the transactional id, value: JSON of ``TxnMetadata``) appended
  through the partition's normal leader append and acknowledged only once the high watermark
  passed it (acks=all); only then is the in-memory state changed and the client answered.
* **Leadership.** ``run`` watches the local replicas of ``__transaction_state``: when this node
  becomes leader of one (or its leader epoch changes) the partition's whole log is replayed
  into memory (the last record of each id wins) and requests for its ids get
  COORDINATOR_LOAD_IN_PROGRESS meanwhile; transactions found in a Prepare state get their
  markers written and are completed. When leadership moves away, the state is dropped and
  requests get NOT_COORDINATOR. The coordinator epoch is the partition's leader epoch.
* **Markers.** For a Prepare state, a COMMIT/ABORT control batch is written to every partition
  of the transaction by its leader: locally, or with the internal WriteTxnMarkers (27) RPC
  over the Kafka listener. Failures are retried (with the current leader from the metadata
  image) until every partition has its marker or this node stops being the coordinator;
  then the Complete state is persisted.
* **Timeouts.** Every ``abort_check_interval_s`` the transactions open for longer than their
  ``transaction.timeout.ms`` are aborted with the epoch bumped (the producer is fenced).
* **Produce verification (KIP-890 part 1).** A partition leader accepts a transactional batch
  only for a partition in the producer's Ongoing transaction. When this node is the id's
  coordinator it checks its own state; otherwise, unless the partition already holds an open
  transaction of that producer and epoch (verified at its first batch, which is how Kafka caches
  a positive answer: the COMMIT/ABORT marker clears it), it asks the coordinator with
  AddPartitionsToTxn v4 ``verify_only`` (bounded by ``VERIFY_TIMEOUT_S``). Produce requests
  needing the same verification queue behind it and append in arrival order; a marker that
  lands while the question is out invalidates the answer (Kafka's verification guard).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import trio

from raftlog.client.connection import ClusterLogin, KafkaClientError, KafkaConnection
from raftlog.metadata.image import NO_LEADER, MetadataImage
from raftlog.partition.append import AppendOrigin
from raftlog.partition.batch import BatchHeader, build_batch, check_batch, decode_records
from raftlog.partition.errors import PartitionLogError
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import Partition, Replicated, now_ms
from raftlog.partition.producer_state import NO_OFFSET
from raftlog.partition.txn_index import build_marker
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.internal_topics import (
    OFFSETS_TOPIC,
    TRANSACTION_STATE_TOPIC,
    UndecodableRecords,
    coordinator_partition,
)
from raftlog.protocol.schemas_txn import ADD_PARTITIONS_TO_TXN, WRITE_TXN_MARKERS
from raftlog.quorum.local import Quorum
from raftlog.server.find_coordinator import CoordinatorLocation
from raftlog.server.listener import Body
from raftlog.txn import coordinator as core
from raftlog.txn.coordinator import (
    CoordinatorPartitionState,
    Transition,
    TxnMetadata,
    TxnState,
)

__all__ = [
    "OFFSETS_TOPIC",
    "TXN_TOPIC",
    "CoordinatorLookup",
    "PendingOffsets",
    "PendingVerification",
    "TxnCoordinatorService",
    "TxnSettings",
    "Verdict",
]

log = logging.getLogger(__name__)

TXN_TOPIC: Final = TRANSACTION_STATE_TOPIC
TRANSACTIONAL_ID_NOT_FOUND: Final = 105  # not in raftlog.protocol.errors.ErrorCode
PERSIST_TIMEOUT_S: Final = 10.0
MARKER_RETRY_S: Final = 0.2
WATCH_INTERVAL_S: Final = 0.1
RPC_TIMEOUT_S: Final = 10.0
# A partition leader's wait for the coordinator's verify_only answer; past it the produce gets
# a retriable error (NOT_ENOUGH_REPLICAS, as Kafka converts coordinator errors).
VERIFY_TIMEOUT_S: Final = 5.0
# In the set ``_send_markers`` returns: a leader refused a marker as coming from a replaced
# coordinator (TRANSACTION_COORDINATOR_FENCED).
FENCED: Final = ("", -1)
VERIFICATIONS_MAX: Final = 10_000  # in flight on one node; more are refused (retriable)
# Coordinator answers a producer may retry: Kafka's AddPartitionsToTxnManager turns them into
# NOT_ENOUGH_REPLICAS, which every client retries on Produce.
_RETRIABLE_VERIFY_ERRORS: Final = frozenset({
    ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.CONCURRENT_TRANSACTIONS,
    ErrorCode.REQUEST_TIMED_OUT})

# None: the transactional batch may be appended; else (error code, message) for the produce.
Verdict = tuple[int, str] | None

# (error, node_id, host, port) of the coordinator for a key.
CoordinatorLookup = tuple[int, int, str, int]
CreateTopic = Callable[[Mapping[str, Any]], Any]


class PendingOffsets(Protocol):
    """The seam to the group coordinator for offsets in transactions (KIP-98/447), implemented
    by ``raftlog.group.txn_offsets.TxnOffsets``. TxnOffsetCommit (a group API) writes the
    offsets to the group's ``__consumer_offsets`` partition as transactional records of the
    producer and stages them; AddOffsetsToTxn added that partition to the transaction, so
    its COMMIT/ABORT marker is written there like on any other partition, and
    ``append_marker`` (run by the partition's leader, which is the group's coordinator) calls
    ``complete`` once the marker is replicated."""

    def complete(self, producer_id: int, index: int, commit: bool) -> None: ...

    def has_pending(self, group: str, tp: tuple[str, int] | None = None) -> bool: ...


@dataclass(frozen=True)
class TxnSettings:
    # transaction.state.log.num.partitions: Kafka defaults to 50; 10 keeps a laptop cluster light.
    num_partitions: int = 10
    replication_factor: int = 3  # transaction.state.log.replication.factor (capped)
    min_isr: int = 2  # transaction.state.log.min.isr (capped at the RF)
    max_timeout_ms: int = core.MAX_TXN_TIMEOUT_MS  # transaction.max.timeout.ms
    abort_check_interval_s: float = 1.0  # ...abort.timed.out.transaction.cleanup.interval.ms

    @classmethod
    def from_config(cls, config: Any) -> TxnSettings:
        """From a ``raftlog.config.ServerConfig`` (Kafka's property names)."""
        return cls(
            max_timeout_ms=config.transaction_max_timeout_ms,
            abort_check_interval_s=(
                config.transaction_abort_timed_out_transaction_cleanup_interval_ms / 1000))


@dataclass(eq=False)
class PendingVerification:
    """A verify_only question in flight for (topic, partition, producer id, epoch). Produce
    requests that need its answer register a continuation; they run synchronously, in the
    order registered, once the answer is in (so appends keep the producer's order), and
    ``done`` is set afterwards."""

    key: tuple[str, int, int, int]
    continuations: list[Callable[[Verdict], None]] = field(default_factory=list)
    done: trio.Event = field(default_factory=trio.Event)


class NotCoordinatorError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class TxnCoordinatorService:
    """Transaction coordinator of one node for the ``__transaction_state`` partitions it
    leads, plus the partition-leader side of markers (``append_marker``)."""

    def __init__(
        self,
        node_id: int,
        quorum: Quorum,
        manager: PartitionManager,
        next_producer_id: Callable[[], Any],
        create_topic: CreateTopic | None = None,
        settings: TxnSettings | None = None,
        pending_offsets: PendingOffsets | None = None,
        login: ClusterLogin | None = None,
    ) -> None:
        self.node_id = node_id
        self._login = login  # markers and verify_only questions are cluster actions
        self.pending_offsets = pending_offsets
        self.quorum = quorum
        self.manager = manager
        self._next_producer_id = next_producer_id  # async () -> int
        self._create_topic = create_topic
        self.settings = settings or TxnSettings()
        self.owned: dict[int, CoordinatorPartitionState] = {}
        self._loading: set[int] = set()
        self._locks: dict[int, trio.Lock] = {}
        self._completing: set[str] = set()
        self._nursery: trio.Nursery | None = None
        self._connections: dict[int, KafkaConnection] = {}
        self._creating = False
        # KIP-890 part 1, partition-leader side: questions in flight, their own connections
        # (so they never queue behind a marker write's acks=all wait), and per (topic,
        # partition, producer id) the guard a marker clears.
        self._verifications: dict[tuple[str, int, int, int], PendingVerification] = {}
        self._verify_connections: dict[int, KafkaConnection] = {}
        self._verify_guards: dict[tuple[str, int, int], object] = {}
        # Records (or unreadable batches) of __transaction_state that loads skipped.
        self.undecodable_records_skipped = 0

    # -- lifecycle -----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._watch_leadership)
                nursery.start_soon(self._abort_timed_out)
                task_status.started()
        finally:
            for connection in [*self._connections.values(),
                               *self._verify_connections.values()]:
                with trio.CancelScope(shield=True):
                    await connection.aclose()
            self._connections.clear()
            self._verify_connections.clear()

    async def _watch_leadership(self) -> None:
        while True:
            self._sync_ownership()
            await trio.sleep(WATCH_INTERVAL_S)

    def _sync_ownership(self) -> None:
        for index, state in list(self.owned.items()):
            partition = self.manager.get(TXN_TOPIC, index)
            if partition is None or not partition.is_leader or \
                    partition.leader_epoch != state.coordinator_epoch:
                log.info("no longer transaction coordinator for %s-%d", TXN_TOPIC, index)
                del self.owned[index]
        for (topic, index), partition in list(self.manager.partitions.items()):
            if topic != TXN_TOPIC or not partition.is_leader or index in self._loading:
                continue
            if index in self.owned:
                continue
            self._loading.add(index)
            assert self._nursery is not None
            self._nursery.start_soon(self._load, index, partition)

    async def _load(self, index: int, partition: Partition) -> None:
        try:
            epoch = partition.leader_epoch
            txns, skipped = await trio.to_thread.run_sync(_replay, partition)
            if not partition.is_leader or partition.leader_epoch != epoch:
                return
            if skipped.count:
                self.undecodable_records_skipped += skipped.count
                log.warning("%s", skipped.summary(f"{TXN_TOPIC}-{index}"))
            state = CoordinatorPartitionState(index, epoch, txns)
            self.owned[index] = state
            log.info("transaction coordinator for %s-%d (epoch %d): %d transactional ids",
                     TXN_TOPIC, index, epoch, len(txns))
            for metadata in txns.values():
                if metadata.state.preparing:
                    self._spawn_completion(state, metadata)
        except Exception:
            log.exception("loading %s-%d failed", TXN_TOPIC, index)
        finally:
            self._loading.discard(index)

    # -- routing -------------------------------------------------------------------------------

    def _txn_partition_count(self, image: MetadataImage) -> int | None:
        topic = image.topics.get(TXN_TOPIC)
        return None if topic is None else len(topic.partitions)

    async def find_coordinator(self, transactional_id: str) -> CoordinatorLookup:
        """FindCoordinator key_type 1: the leader of the id's partition, creating the topic
        on first use."""
        image = self.quorum.image
        count = self._txn_partition_count(image)
        if count is None:
            await self._ensure_topic()
            image = self.quorum.image
            count = self._txn_partition_count(image)
            if count is None:
                return ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, "", -1
        index = coordinator_partition(transactional_id, count)
        leader = image.topics[TXN_TOPIC].partitions[index].leader
        broker = image.brokers.get(leader)
        if leader == NO_LEADER or broker is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, "", -1
        return ErrorCode.NONE, leader, broker.host, broker.port

    def locate(self, transactional_id: str) -> CoordinatorLocation:
        """The synchronous lookup of ``raftlog.server.find_coordinator``: creating the topic
        starts in the background and COORDINATOR_NOT_AVAILABLE is answered meanwhile."""
        image = self.quorum.image
        count = self._txn_partition_count(image)
        if count is None:
            if self._nursery is not None and not self._creating:
                self._nursery.start_soon(self._ensure_topic)
            return CoordinatorLocation(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                       message=f"creating {TXN_TOPIC}")
        index = coordinator_partition(transactional_id, count)
        leader = image.topics[TXN_TOPIC].partitions[index].leader
        broker = image.brokers.get(leader)
        if leader == NO_LEADER or broker is None:
            return CoordinatorLocation(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                       message=f"{TXN_TOPIC}-{index} has no leader")
        return CoordinatorLocation(ErrorCode.NONE, leader, broker.host, broker.port)

    async def _ensure_topic(self) -> None:
        if self._create_topic is None or self._creating:
            return
        self._creating = True
        try:
            live = len(list(self.quorum.image.live_broker_ids()))
            rf = max(1, min(self.settings.replication_factor, live))
            body = {"topics": [{
                "name": TXN_TOPIC, "num_partitions": self.settings.num_partitions,
                "replication_factor": rf, "assignments": [],
                # Compacted, as in Kafka: each record holds a transactional id's whole state.
                "configs": [{"name": "min.insync.replicas",
                             "value": str(min(self.settings.min_isr, rf))},
                            {"name": "cleanup.policy", "value": "compact"}]}],
                "timeout_ms": 10_000, "validate_only": False}
            try:
                await self._create_topic(body)
            except Exception as exc:
                log.warning("creating %s failed: %s", TXN_TOPIC, exc)
        finally:
            self._creating = False

    def _owned_for(self, transactional_id: str) -> CoordinatorPartitionState:
        count = self._txn_partition_count(self.quorum.image)
        if count is None:
            raise NotCoordinatorError(ErrorCode.NOT_COORDINATOR)
        index = coordinator_partition(transactional_id, count)
        if index in self._loading:
            raise NotCoordinatorError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        state = self.owned.get(index)
        partition = self.manager.get(TXN_TOPIC, index)
        if state is None or partition is None or not partition.is_leader or \
                partition.leader_epoch != state.coordinator_epoch:
            if partition is not None and partition.is_leader:
                raise NotCoordinatorError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
            raise NotCoordinatorError(ErrorCode.NOT_COORDINATOR)
        return state

    def _lock(self, index: int) -> trio.Lock:
        return self._locks.setdefault(index, trio.Lock())

    def describe(self, transactional_id: str) -> TxnMetadata | None:
        try:
            return self._owned_for(transactional_id).txns.get(transactional_id)
        except NotCoordinatorError:
            return None

    def all_transactions(self) -> list[TxnMetadata]:
        return [m for state in self.owned.values() for m in state.txns.values()]

    def loading(self) -> bool:
        return bool(self._loading)

    def describe_error(self, transactional_id: str) -> tuple[int, TxnMetadata | None]:
        """DescribeTransactions: (error, metadata) for one id."""
        try:
            state = self._owned_for(transactional_id)
        except NotCoordinatorError as exc:
            return exc.code, None
        metadata = state.txns.get(transactional_id)
        if metadata is None or metadata.state == TxnState.DEAD:
            return TRANSACTIONAL_ID_NOT_FOUND, None
        return ErrorCode.NONE, metadata

    # -- client requests -----------------------------------------------------------------------

    async def init_producer_id(self, transactional_id: str, timeout_ms: int,
                               producer_id: int, producer_epoch: int) -> tuple[int, int, int]:
        """(error, producer id, epoch)."""
        try:
            state = self._owned_for(transactional_id)
        except NotCoordinatorError as exc:
            return exc.code, -1, -1
        current = state.txns.get(transactional_id)
        spare: int | None = None
        if current is None or current.producer_epoch >= core.EPOCH_EXHAUSTED - 1:
            try:
                spare = await self._next_producer_id()
            except Exception as exc:
                log.warning("InitProducerId(%r): no producer id: %s", transactional_id, exc)
                return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, -1, -1

        def new_id() -> int:
            assert spare is not None, "a producer id was allocated up front"
            return spare

        async with self._lock(state.partition):
            try:
                state = self._owned_for(transactional_id)
            except NotCoordinatorError as exc:
                return exc.code, -1, -1
            current = state.txns.get(transactional_id)
            if spare is None and (current is None or
                                  current.producer_epoch >= core.EPOCH_EXHAUSTED - 1):
                return ErrorCode.CONCURRENT_TRANSACTIONS, -1, -1  # raced: the client retries
            transition = core.init_producer_id(
                current, transactional_id, timeout_ms, producer_id, producer_epoch, now_ms(),
                new_id, max_timeout_ms=self.settings.max_timeout_ms)
            error = await self._apply(state, transition)
        if error:
            return error, -1, -1
        if transition.error:
            return transition.error, -1, -1
        return ErrorCode.NONE, transition.producer_id, transition.producer_epoch

    async def add_partitions(self, transactional_id: str, producer_id: int, epoch: int,
                             partitions: list[tuple[str, int]], groups: tuple[str, ...] = ()
                             ) -> int:
        try:
            state = self._owned_for(transactional_id)
        except NotCoordinatorError as exc:
            return exc.code
        async with self._lock(state.partition):
            try:
                state = self._owned_for(transactional_id)
            except NotCoordinatorError as exc:
                return exc.code
            transition = core.add_partitions(state.txns.get(transactional_id), producer_id,
                                             epoch, partitions, now_ms(), groups=groups)
            error = await self._apply(state, transition)
        return error or transition.error

    async def end_txn(self, transactional_id: str, producer_id: int, epoch: int,
                      commit: bool) -> int:
        try:
            state = self._owned_for(transactional_id)
        except NotCoordinatorError as exc:
            return exc.code
        async with self._lock(state.partition):
            try:
                state = self._owned_for(transactional_id)
            except NotCoordinatorError as exc:
                return exc.code
            transition = core.end_txn(state.txns.get(transactional_id), producer_id, epoch,
                                      commit, now_ms())
            error = await self._apply(state, transition)
        return error or transition.error

    async def _apply(self, state: CoordinatorPartitionState, transition: Transition) -> int:
        """Persist ``transition.new`` (acks=all), apply it, start markers if it asks."""
        new = transition.new
        if new is None or state.txns.get(new.transactional_id) is new:
            return ErrorCode.NONE
        error = await self._persist(state, new)
        if error:
            return error
        if transition.markers:
            self._spawn_completion(state, new)
        return ErrorCode.NONE

    async def _persist(self, state: CoordinatorPartitionState, metadata: TxnMetadata) -> int:
        partition = self.manager.get(TXN_TOPIC, state.partition)
        if partition is None or not partition.is_leader or \
                partition.leader_epoch != state.coordinator_epoch:
            return ErrorCode.NOT_COORDINATOR
        batch = build_batch([(metadata.transactional_id.encode(),
                              core.encode_metadata(metadata), ())], timestamp_ms=now_ms())
        try:
            appended = partition.append(batch, AppendOrigin.COORDINATOR)
        except (PartitionLogError, OSError) as exc:
            log.warning("cannot persist transaction %r: %s", metadata.transactional_id, exc)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if appended.error:  # the ISR is below min.insync.replicas: nothing was written
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        replicated = await partition.wait_replicated(
            appended.end_offset, appended.leadership_generation,
            trio.current_time() + PERSIST_TIMEOUT_S)
        if replicated is Replicated.MOVED:
            return ErrorCode.NOT_COORDINATOR
        if replicated is Replicated.TIMED_OUT:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        state.txns[metadata.transactional_id] = metadata
        return ErrorCode.NONE

    # -- markers and completion ----------------------------------------------------------------

    def _spawn_completion(self, state: CoordinatorPartitionState, metadata: TxnMetadata) -> None:
        if metadata.transactional_id in self._completing or self._nursery is None:
            return
        self._completing.add(metadata.transactional_id)
        self._nursery.start_soon(self._complete, state, metadata)

    async def _complete(self, state: CoordinatorPartitionState, metadata: TxnMetadata) -> None:
        txn_id = metadata.transactional_id
        try:
            commit = metadata.state == TxnState.PREPARE_COMMIT
            pending = set(metadata.partitions)
            while pending:
                if self.owned.get(state.partition) is not state:
                    return  # the next coordinator resumes from the log
                pending = await self._send_markers(metadata, commit, state.coordinator_epoch,
                                                   pending)
                if FENCED in pending:
                    # A leader has a marker from a newer coordinator epoch: this node lost
                    # the coordinator role (it may not know yet); the new one finishes.
                    log.info("transaction %r: markers refused, coordinator epoch %d is fenced",
                             txn_id, state.coordinator_epoch)
                    return
                if pending:
                    await trio.sleep(MARKER_RETRY_S)
            while True:
                if self.owned.get(state.partition) is not state or \
                        state.txns.get(txn_id) is not metadata:
                    return
                async with self._lock(state.partition):
                    if state.txns.get(txn_id) is not metadata:
                        return
                    error = await self._persist(state, core.complete(metadata, now_ms()))
                if not error:
                    log.info("transaction %r (producer %d, epoch %d) %s", txn_id,
                             metadata.producer_id, metadata.producer_epoch,
                             "committed" if commit else "aborted")
                    return
                if error == ErrorCode.NOT_COORDINATOR:
                    return
                await trio.sleep(MARKER_RETRY_S)
        finally:
            self._completing.discard(txn_id)
            self._resume_if_moved(state, txn_id)

    def _resume_if_moved(self, state: CoordinatorPartitionState, txn_id: str) -> None:
        """This node lost the partition and won it back while this completion ran, so the
        load skipped the new ownership's completion (one task per id): start it now."""
        current = self.owned.get(state.partition)
        if current is None or current is state:
            return
        metadata = current.txns.get(txn_id)
        if metadata is not None and metadata.state.preparing:
            self._spawn_completion(current, metadata)

    async def _send_markers(self, metadata: TxnMetadata, commit: bool, coordinator_epoch: int,
                            pending: set[tuple[str, int]]) -> set[tuple[str, int]]:
        """One round: every pending partition's marker to its current leader; the ones that
        still need one are returned, with ``FENCED`` among them if a leader refused a marker
        because a newer coordinator epoch already wrote one."""
        image = self.quorum.image
        by_leader: dict[int, list[tuple[str, int]]] = {}
        for topic, index in sorted(pending):
            known = image.topics.get(topic)
            if known is None or index >= len(known.partitions):
                continue  # deleted: nothing to mark
            by_leader.setdefault(known.partitions[index].leader, []).append((topic, index))
        left: set[tuple[str, int]] = set()
        for leader, partitions in by_leader.items():
            if leader == NO_LEADER:
                left.update(partitions)
            elif leader == self.node_id:
                for topic, index in partitions:
                    code = await self.append_marker(topic, index, metadata.producer_id,
                                                    metadata.producer_epoch, commit,
                                                    coordinator_epoch)
                    if code == ErrorCode.TRANSACTION_COORDINATOR_FENCED:
                        left.add(FENCED)
                    elif _marker_retriable(code):
                        left.add((topic, index))
            else:
                left.update(await self._remote_markers(leader, metadata, commit,
                                                       coordinator_epoch, partitions))
        return left

    async def _remote_markers(self, leader: int, metadata: TxnMetadata, commit: bool,
                              coordinator_epoch: int, partitions: list[tuple[str, int]]
                              ) -> set[tuple[str, int]]:
        topics: dict[str, list[int]] = {}
        for topic, index in partitions:
            topics.setdefault(topic, []).append(index)
        body = {"markers": [{
            "producer_id": metadata.producer_id, "producer_epoch": metadata.producer_epoch,
            "transaction_result": commit, "coordinator_epoch": coordinator_epoch,
            "topics": [{"name": t, "partition_indexes": ps} for t, ps in topics.items()]}]}
        try:
            connection = await self._connection(leader)
            response = await connection.request(WRITE_TXN_MARKERS, body, version=1,
                                                timeout_s=RPC_TIMEOUT_S)
        except (KafkaClientError, OSError) as exc:
            log.info("WriteTxnMarkers to node %d failed: %s", leader, exc)
            stale = self._connections.pop(leader, None)
            if stale is not None:
                await stale.aclose()
            return set(partitions)
        left: set[tuple[str, int]] = set()
        for marker in response.markers:
            for topic in marker.topics:
                for result in topic.partitions:
                    if result.error_code == ErrorCode.TRANSACTION_COORDINATOR_FENCED:
                        left.add(FENCED)
                    elif _marker_retriable(result.error_code):
                        left.add((topic.name, result.partition_index))
        return left

    async def _connection(self, node_id: int) -> KafkaConnection:
        connection = self._connections.get(node_id)
        if connection is None:
            broker = self.quorum.image.brokers.get(node_id)
            if broker is None:
                raise KafkaClientError(f"node {node_id} is not registered")
            connection = await KafkaConnection.connect(broker.host, broker.port,
                                                       client_id=f"txn-coordinator-{self.node_id}",
                                                       login=self._login)
            self._connections[node_id] = connection
        return connection

    # -- partition leader side -----------------------------------------------------------------

    async def append_marker(self, topic: str, index: int, producer_id: int, epoch: int,
                            commit: bool, coordinator_epoch: int) -> int:
        """Write one COMMIT/ABORT marker as this partition's leader; wait for acks=all."""
        partition = self.manager.get(topic, index)
        if partition is None:
            known = self.quorum.image.topics.get(topic)
            if known is None or index >= len(known.partitions):
                return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if not partition.is_leader:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        batch = build_marker(producer_id, epoch, commit, coordinator_epoch, now_ms())
        try:
            # Written whatever the ISR (required_acks=1), then waited for like acks=all.
            appended = partition.append(batch, AppendOrigin.COORDINATOR, required_acks=1)
        except PartitionLogError as exc:
            log.warning("marker for producer %d on %s-%d: %s", producer_id, topic, index, exc)
            return exc.error_code
        except OSError as exc:
            log.warning("marker for producer %d on %s-%d: %s", producer_id, topic, index, exc)
            return ErrorCode.KAFKA_STORAGE_ERROR
        if appended.error:  # a stale marker (``Partition.append``): nothing was written
            log.info("refused a marker for producer %d on %s-%d: %s (coordinator epoch %d)",
                     producer_id, topic, index, appended.message, coordinator_epoch)
            return appended.error
        # A verify_only answer still in flight predates this marker: it must not be used.
        self._verify_guards.pop((topic, index, producer_id), None)
        replicated = await partition.wait_replicated(
            appended.end_offset, appended.leadership_generation,
            trio.current_time() + PERSIST_TIMEOUT_S)
        if replicated is Replicated.MOVED:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if replicated is Replicated.TIMED_OUT:
            return ErrorCode.REQUEST_TIMED_OUT
        if topic == OFFSETS_TOPIC and self.pending_offsets is not None:
            self.pending_offsets.complete(producer_id, index, commit)
        return ErrorCode.NONE

    def verify_transactional_produce(self, topic: str, index: int,
                                     transactional_id: str | None, producer_id: int,
                                     epoch: int) -> Verdict | PendingVerification:
        """KIP-890 part 1 on the produce path: a transactional batch must belong to an Ongoing
        transaction of that producer and epoch that lists this partition. Answered at once
        when this node is the id's coordinator or the partition already holds the producer's
        open transaction; otherwise the coordinator is asked (``PendingVerification``)."""
        image = self.quorum.image
        count = self._txn_partition_count(image)
        if not transactional_id or count is None:
            return self._verify_by_producer(topic, index, producer_id, epoch)
        coordinator = image.topics[TXN_TOPIC].partitions[
            coordinator_partition(transactional_id, count)].leader
        if coordinator == self.node_id:
            return self._verify_locally(topic, index, transactional_id, producer_id, epoch)
        partition = self.manager.get(topic, index)
        if partition is None:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{topic}-{index} is not led here"
        entry = partition.producers.get(producer_id)
        if entry is not None and entry.epoch == epoch and \
                entry.current_txn_first_offset != NO_OFFSET:
            return None  # verified at the transaction's first batch here; a marker ends it
        if coordinator == NO_LEADER:
            return (ErrorCode.NOT_ENOUGH_REPLICAS,
                    f"the coordinator of {transactional_id!r} has no leader: retry")
        key = (topic, index, producer_id, epoch)
        pending = self._verifications.get(key)
        if pending is not None:
            return pending
        if len(self._verifications) >= VERIFICATIONS_MAX or self._nursery is None:
            return ErrorCode.NOT_ENOUGH_REPLICAS, "too many transaction verifications: retry"
        pending = PendingVerification(key)
        self._verifications[key] = pending
        guard = object()
        self._verify_guards[(topic, index, producer_id)] = guard
        self._nursery.start_soon(self._run_verification, pending, coordinator,
                                 transactional_id, guard)
        return pending

    def verify_by_producer_id(self, topic: str, index: int, producer_id: int,
                              epoch: int) -> tuple[int, str] | None:
        """The check for writes that carry no transactional id to route by (TxnOffsetCommit
        in ``raftlog.group.txn_offsets``): against the transactions this node coordinates;
        when the id's coordinator may be another node, only the partition's own producer
        state (the caller's epoch check) stands."""
        for state in self.owned.values():
            metadata = state.by_producer_id(producer_id)
            if metadata is None:
                continue
            if metadata.producer_epoch != epoch:
                return (ErrorCode.INVALID_PRODUCER_EPOCH,
                        f"producer {producer_id}: epoch {epoch} is not the transaction's "
                        f"current epoch {metadata.producer_epoch}")
            if metadata.state != TxnState.ONGOING or \
                    (topic, index) not in metadata.partitions:
                return (ErrorCode.INVALID_TXN_STATE,
                        f"{topic}-{index} was not added to the transaction of producer "
                        f"{producer_id} (AddPartitionsToTxn first)")
            return None
        known = self.quorum.image.topics.get(TXN_TOPIC)
        if known is not None and any(p.leader != self.node_id for p in known.partitions):
            return None  # the coordinator may be elsewhere
        return (ErrorCode.INVALID_TXN_STATE,
                f"producer {producer_id} has no ongoing transaction")

    def _verify_locally(self, topic: str, index: int, transactional_id: str,
                        producer_id: int, epoch: int) -> Verdict:
        try:
            state = self._owned_for(transactional_id)
        except NotCoordinatorError as exc:
            return (ErrorCode.NOT_ENOUGH_REPLICAS,
                    f"transaction coordinator not ready (error {exc.code}): retry")
        codes = core.verify_partitions(state.txns.get(transactional_id), producer_id, epoch,
                                       [(topic, index)])
        return _produce_verdict(codes[(topic, index)], topic, index, producer_id)

    def _verify_by_producer(self, topic: str, index: int, producer_id: int,
                            epoch: int) -> Verdict:
        """No transactional id in the request (Produce < v3 or a hand-made one): only a
        transaction this node coordinates can vouch for the batch."""
        for state in self.owned.values():
            metadata = state.by_producer_id(producer_id)
            if metadata is not None:
                codes = core.verify_partitions(metadata, producer_id, epoch, [(topic, index)])
                return _produce_verdict(codes[(topic, index)], topic, index, producer_id)
        return (ErrorCode.INVALID_TXN_STATE,
                f"producer {producer_id} has no ongoing transaction")

    async def _run_verification(self, pending: PendingVerification, coordinator: int,
                                transactional_id: str, guard: object) -> None:
        topic, index, producer_id, epoch = pending.key
        verdict: Verdict = (ErrorCode.NOT_ENOUGH_REPLICAS,
                            f"could not verify the transaction of {transactional_id!r}: retry")
        try:
            verdict = await self._ask_coordinator(coordinator, transactional_id, topic, index,
                                                  producer_id, epoch)
        except Exception:
            log.exception("verifying %r for %s-%d failed", transactional_id, topic, index)
        finally:
            self._verifications.pop(pending.key, None)
            guard_key = (topic, index, producer_id)
            if self._verify_guards.get(guard_key) is guard:
                del self._verify_guards[guard_key]
            elif verdict is None:
                verdict = (ErrorCode.INVALID_TXN_STATE,
                           f"the transaction of producer {producer_id} ended on {topic}-{index} "
                           f"while it was being verified")
            for continuation in pending.continuations:
                try:
                    continuation(verdict)
                except Exception:  # one produce's bug must not strand the others
                    log.exception("resuming a verified produce to %s-%d failed", topic, index)
            pending.done.set()

    async def _ask_coordinator(self, coordinator: int, transactional_id: str, topic: str,
                               index: int, producer_id: int, epoch: int) -> Verdict:
        body = {"transactions": [{
            "transactional_id": transactional_id, "producer_id": producer_id,
            "producer_epoch": epoch, "verify_only": True,
            "topics": [{"name": topic, "partitions": [index]}]}]}
        try:
            with trio.fail_after(VERIFY_TIMEOUT_S):
                connection = self._verify_connections.get(coordinator)
                if connection is None:
                    broker = self.quorum.image.brokers.get(coordinator)
                    if broker is None:
                        raise KafkaClientError(f"node {coordinator} is not registered")
                    connection = await KafkaConnection.connect(
                        broker.host, broker.port, timeout_s=VERIFY_TIMEOUT_S,
                        client_id=f"txn-verifier-{self.node_id}", login=self._login)
                    self._verify_connections[coordinator] = connection
                response = await connection.request(ADD_PARTITIONS_TO_TXN, body, version=4,
                                                    timeout_s=VERIFY_TIMEOUT_S)
        except (KafkaClientError, OSError, trio.TooSlowError) as exc:
            log.info("verify_only AddPartitionsToTxn to node %d failed: %s", coordinator, exc)
            stale = self._verify_connections.pop(coordinator, None)
            if stale is not None:
                with trio.CancelScope(shield=True):
                    await stale.aclose()
            return (ErrorCode.NOT_ENOUGH_REPLICAS,
                    f"the transaction coordinator (node {coordinator}) did not answer: retry")
        code: int = response.error_code or ErrorCode.UNKNOWN_SERVER_ERROR
        if not response.error_code:
            for txn in response.results_by_transaction:
                for result in txn.topic_results:
                    for part in result.results_by_partition:
                        if result.name == topic and part.partition_index == index:
                            code = part.partition_error_code
        return _produce_verdict(code, topic, index, producer_id)

    def verify_partitions(self, transactional_id: str, producer_id: int, epoch: int,
                          partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The coordinator's side of AddPartitionsToTxn v4 verify_only."""
        try:
            state = self._owned_for(transactional_id)
        except NotCoordinatorError as exc:
            return dict.fromkeys(partitions, exc.code)
        codes = core.verify_partitions(state.txns.get(transactional_id), producer_id, epoch,
                                       partitions)
        return {tp: int(code) for tp, code in codes.items()}

    async def _abort_timed_out(self) -> None:
        while True:
            await trio.sleep(self.settings.abort_check_interval_s)
            now = now_ms()
            for state in list(self.owned.values()):
                for metadata in list(state.txns.values()):
                    if core.timed_out(metadata, now):
                        await self._abort_one(state, metadata)

    async def _abort_one(self, state: CoordinatorPartitionState, metadata: TxnMetadata) -> None:
        spare: int | None = None
        if metadata.producer_epoch >= core.EPOCH_EXHAUSTED - 1:
            try:
                spare = await self._next_producer_id()
            except Exception:
                return
        async with self._lock(state.partition):
            if state.txns.get(metadata.transactional_id) is not metadata or \
                    self.owned.get(state.partition) is not state:
                return
            log.info("aborting transaction %r (producer %d): open for more than %d ms",
                     metadata.transactional_id, metadata.producer_id, metadata.timeout_ms)
            transition = core.begin_timeout_abort(metadata, now_ms(),
                                                  lambda: spare if spare is not None else -1)
            await self._apply(state, transition)


def _produce_verdict(code: int, topic: str, index: int, producer_id: int) -> Verdict:
    """A coordinator's verify_only answer as the produce error (Kafka's ReplicaManager):
    retriable coordinator trouble → NOT_ENOUGH_REPLICAS, an old epoch →
    INVALID_PRODUCER_EPOCH, anything else (not in the transaction) → INVALID_TXN_STATE."""
    if code == ErrorCode.NONE:
        return None
    if code in _RETRIABLE_VERIFY_ERRORS:
        return (ErrorCode.NOT_ENOUGH_REPLICAS,
                f"transaction verification for {topic}-{index} got error {code}: retry")
    if code in (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH):
        return (ErrorCode.INVALID_PRODUCER_EPOCH,
                f"producer {producer_id}: the epoch is not the transaction's current epoch")
    return (ErrorCode.INVALID_TXN_STATE,
            f"{topic}-{index} was not added to the transaction of producer {producer_id} "
            f"(AddPartitionsToTxn first; coordinator error {code})")


def _marker_retriable(code: int) -> bool:
    # Deleted partitions and stale epochs need no marker; everything else is retried
    # (TRANSACTION_COORDINATOR_FENCED ends the whole completion: see ``_complete``).
    return code not in (ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                        ErrorCode.INVALID_PRODUCER_EPOCH,
                        ErrorCode.TRANSACTION_COORDINATOR_FENCED)


def _replay(partition: Partition) -> tuple[dict[str, TxnMetadata], UndecodableRecords]:
    """Every record of a ``__transaction_state`` partition, the last per id winning, and what
    could not be decoded: skipped (as Kafka skips unknown record versions), never fatal, so
    one bad record cannot keep the partition's transactional ids unavailable."""
    txns: dict[str, TxnMetadata] = {}
    skipped = UndecodableRecords()
    log_ = partition.log
    offset = log_.log_start_offset
    end = log_.log_end_offset
    while offset < end:
        with log_.read(offset, 1 << 20) as piece:
            data = piece.read_bytes()
        if not data:
            break
        next_offset = offset
        position = 0
        while position < len(data):
            header = check_batch(data, position)
            _replay_batch(txns, header, data[position:position + header.size_bytes], offset,
                          skipped)
            next_offset = header.next_offset
            position += header.size_bytes
        offset = max(next_offset, offset + 1)
    return txns, skipped


def _replay_batch(txns: dict[str, TxnMetadata], header: BatchHeader, batch: bytes,
                  from_offset: int, skipped: UndecodableRecords) -> None:
    try:
        records = decode_records(batch)  # control batches: none (no markers are written here)
    except PartitionLogError as exc:  # a compressed batch, a record overrunning the batch
        skipped.add(header.base_offset, f"unreadable batch: {exc}")
        return
    for record in records:
        if record.offset < from_offset or record.key is None:
            continue
        try:
            core.replay_record(txns, record.key, record.value)
        except core.TxnRecordError as exc:
            skipped.add(record.offset, str(exc))


def error_body(code: int) -> Body:
    return {"throttle_time_ms": 0, "error_code": int(code)}

