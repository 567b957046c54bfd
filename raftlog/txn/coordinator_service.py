"""The transaction coordinator's trio shell (Kafka's ``TransactionCoordinator`` +
``TransactionStateManager`` + ``TransactionMarkerChannelManager``).

* **Where state lives.** The internal topic ``__transaction_state`` (created on first use with
  ``TxnSettings.num_partitions`` partitions, replication factor min(3, live brokers),
  ``min.insync.replicas`` min(2, RF)). A transactional id belongs to partition
  ``abs(javaHash(id)) % partitions``; its coordinator is that partition's leader. Loading the
  partitions this node leads and persisting each state change (acks=all, before the client is
  answered): ``raftlog.txn.state_log``.
* **Client requests.** InitProducerId, AddPartitionsToTxn, EndTxn: the decision is the pure
  core's (``raftlog.txn.coordinator``), made under the partition's lock, persisted, then
  applied.
* **Markers.** Completing a transaction in a Prepare state (markers to every partition, then
  the Complete state), and the partition leader's side of markers: ``raftlog.txn.markers``.
* **Timeouts.** Every ``abort_check_interval_s`` the transactions open for longer than their
  ``transaction.timeout.ms`` are aborted with the epoch bumped (the producer is fenced).
  (Producer-id expiry belongs to the partitions: ``PartitionManager.run_producer_expiration``.)
* **Produce verification (KIP-890 part 1):** ``raftlog.txn.verification``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import trio

from raftlog.client.connection import ClusterLogin
from raftlog.metadata.image import NO_LEADER
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import now_ms
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.internal_topics import OFFSETS_TOPIC, coordinator_partition
from raftlog.quorum.interface import Quorum
from raftlog.server.find_coordinator import CoordinatorLocation
from raftlog.txn import coordinator as core
from raftlog.txn.coordinator import (
    CoordinatorPartitionState,
    Transition,
    TxnMetadata,
    TxnState,
    TxnStats,
)
from raftlog.txn.markers import PendingOffsets, TxnCompletion
from raftlog.txn.state_log import TXN_TOPIC, NotCoordinatorError, TxnStateLog
from raftlog.txn.verification import (
    VERIFY_TIMEOUT_S,
    PendingVerification,
    ProduceVerifier,
    Verdict,
)

__all__ = [
    "OFFSETS_TOPIC",
    "TXN_TOPIC",
    "VERIFY_TIMEOUT_S",
    "CoordinatorLookup",
    "PendingOffsets",
    "PendingVerification",
    "TxnCoordinatorService",
    "TxnSettings",
    "Verdict",
]

log = logging.getLogger(__name__)

TRANSACTIONAL_ID_NOT_FOUND: Final = 105  # not in raftlog.protocol.errors.ErrorCode
WATCH_INTERVAL_S: Final = 0.1

# (error, node_id, host, port) of the coordinator for a key.
CoordinatorLookup = tuple[int, int, str, int]
CreateTopic = Callable[[Mapping[str, Any]], Any]


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


class TxnCoordinatorService:
    """Transaction coordinator of one node for the ``__transaction_state`` partitions it
    leads (``state_log``), with its transactions' completions and the partition-leader side
    of markers (``completion``) and produce verification (``verifier``)."""

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
        self.quorum = quorum
        self.manager = manager
        self._next_producer_id = next_producer_id  # async () -> int
        self._create_topic = create_topic
        self.settings = settings or TxnSettings()
        self.state_log = TxnStateLog(quorum, manager)
        self.stats = TxnStats()  # completions and timeouts (raftlog.observe.txn)
        self.verifier = ProduceVerifier(node_id, quorum, manager, self.state_log, login)
        self.completion = TxnCompletion(node_id, quorum, manager, self.state_log,
                                        self.verifier, pending_offsets, login, self.stats)
        self._nursery: trio.Nursery | None = None
        self._creating = False

    # -- lifecycle -----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.completion.run)
            await nursery.start(self.verifier.run)
            nursery.start_soon(self._watch_leadership)
            nursery.start_soon(self._abort_timed_out)
            task_status.started()

    async def _watch_leadership(self) -> None:
        assert self._nursery is not None
        while True:
            self.state_log.sync_ownership(self._nursery, self.completion.spawn_preparing)
            await trio.sleep(WATCH_INTERVAL_S)

    # -- routing -------------------------------------------------------------------------------

    async def find_coordinator(self, transactional_id: str) -> CoordinatorLookup:
        """FindCoordinator key_type 1: the leader of the id's partition, creating the topic
        on first use."""
        image = self.quorum.image
        count = self.state_log.partition_count(image)
        if count is None:
            await self._ensure_topic()
            image = self.quorum.image
            count = self.state_log.partition_count(image)
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
        count = self.state_log.partition_count(image)
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

    def describe(self, transactional_id: str) -> TxnMetadata | None:
        try:
            return self.state_log.owned_for(transactional_id).txns.get(transactional_id)
        except NotCoordinatorError:
            return None

    def all_transactions(self) -> list[TxnMetadata]:
        return [m for state in self.state_log.owned.values() for m in state.txns.values()]

    def loading(self) -> bool:
        return bool(self.state_log.loading)

    def describe_error(self, transactional_id: str) -> tuple[int, TxnMetadata | None]:
        """DescribeTransactions: (error, metadata) for one id."""
        try:
            state = self.state_log.owned_for(transactional_id)
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
            state = self.state_log.owned_for(transactional_id)
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

        async with self.state_log.lock(state.partition):
            try:
                state = self.state_log.owned_for(transactional_id)
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
            state = self.state_log.owned_for(transactional_id)
        except NotCoordinatorError as exc:
            return exc.code
        async with self.state_log.lock(state.partition):
            try:
                state = self.state_log.owned_for(transactional_id)
            except NotCoordinatorError as exc:
                return exc.code
            transition = core.add_partitions(state.txns.get(transactional_id), producer_id,
                                             epoch, partitions, now_ms(), groups=groups)
            error = await self._apply(state, transition)
        return error or transition.error

    async def end_txn(self, transactional_id: str, producer_id: int, epoch: int,
                      commit: bool) -> int:
        try:
            state = self.state_log.owned_for(transactional_id)
        except NotCoordinatorError as exc:
            return exc.code
        async with self.state_log.lock(state.partition):
            try:
                state = self.state_log.owned_for(transactional_id)
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
        error = await self.state_log.persist(state, new)
        if error:
            return error
        if transition.markers:
            self.completion.spawn(state, new)
        return ErrorCode.NONE

    # -- the other duties' entry points ----------------------------------------------------

    async def append_marker(self, topic: str, index: int, producer_id: int, epoch: int,
                            commit: bool, coordinator_epoch: int) -> int:
        """WriteTxnMarkers on this partition leader (``TxnCompletion.append_marker``)."""
        return await self.completion.append_marker(topic, index, producer_id, epoch, commit,
                                                   coordinator_epoch)

    def verify_transactional_produce(self, topic: str, index: int,
                                     transactional_id: str | None, producer_id: int,
                                     epoch: int) -> Verdict | PendingVerification:
        """The produce path's check (``ProduceVerifier.verify_transactional_produce``)."""
        return self.verifier.verify_transactional_produce(topic, index, transactional_id,
                                                          producer_id, epoch)

    def verify_partitions(self, transactional_id: str, producer_id: int, epoch: int,
                          partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """AddPartitionsToTxn v4 verify_only (``ProduceVerifier.verify_partitions``)."""
        return self.verifier.verify_partitions(transactional_id, producer_id, epoch,
                                               partitions)

    # -- timeouts --------------------------------------------------------------------------

    async def _abort_timed_out(self) -> None:
        while True:
            await trio.sleep(self.settings.abort_check_interval_s)
            now = now_ms()
            for state in list(self.state_log.owned.values()):
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
        async with self.state_log.lock(state.partition):
            if state.txns.get(metadata.transactional_id) is not metadata or \
                    self.state_log.owned.get(state.partition) is not state:
                return
            log.info("aborting transaction %r (producer %d): open for more than %d ms",
                     metadata.transactional_id, metadata.producer_id, metadata.timeout_ms)
            transition = core.begin_timeout_abort(metadata, now_ms(),
                                                  lambda: spare if spare is not None else -1)
            if not await self._apply(state, transition):
                self.stats.timeouts.inc()
