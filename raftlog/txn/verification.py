"""Produce verification (KIP-890 part 1), both ends of it.

A partition leader accepts a transactional batch only for a partition in the producer's
Ongoing transaction. When this node is the id's coordinator it checks its own state;
otherwise, unless the partition already holds an open transaction of that producer and epoch
(verified at its first batch, which is how Kafka caches a positive answer: the COMMIT/ABORT
marker clears it), it asks the coordinator with AddPartitionsToTxn v4 ``verify_only`` (bounded
by ``VERIFY_TIMEOUT_S``). Produce requests needing the same verification queue behind it and
append in arrival order; a marker that lands while the question is out invalidates the answer
(Kafka's verification guard, ``invalidate``). The coordinator's side of the question is
``verify_partitions``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import trio

from raftlog.client.connection import ClusterLogin, KafkaClientError
from raftlog.client.peers import PeerConnections, registered_address
from raftlog.metadata.image import NO_LEADER
from raftlog.partition.manager import PartitionManager
from raftlog.partition.producer_state import NO_OFFSET
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.internal_topics import coordinator_partition
from raftlog.protocol.schemas_txn import ADD_PARTITIONS_TO_TXN
from raftlog.quorum.interface import Quorum
from raftlog.txn import coordinator as core
from raftlog.txn.state_log import TXN_TOPIC, NotCoordinatorError, TxnStateLog

__all__ = ["VERIFY_TIMEOUT_S", "PendingVerification", "ProduceVerifier", "Verdict"]

log = logging.getLogger(__name__)

# A partition leader's wait for the coordinator's verify_only answer; past it the produce gets
# a retriable error (NOT_ENOUGH_REPLICAS, as Kafka converts coordinator errors).
VERIFY_TIMEOUT_S: Final = 5.0
VERIFICATIONS_MAX: Final = 10_000  # in flight on one node; more are refused (retriable)
# Coordinator answers a producer may retry: Kafka's AddPartitionsToTxnManager turns them into
# NOT_ENOUGH_REPLICAS, which every client retries on Produce.
_RETRIABLE_VERIFY_ERRORS: Final = frozenset({
    ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.CONCURRENT_TRANSACTIONS,
    ErrorCode.REQUEST_TIMED_OUT})

# None: the transactional batch may be appended; else (error code, message) for the produce.
Verdict = tuple[int, str] | None


@dataclass(eq=False)
class PendingVerification:
    """A verify_only question in flight for (topic, partition, producer id, epoch). Produce
    requests that need its answer register a continuation; they run synchronously, in the
    order registered, once the answer is in (so appends keep the producer's order), and
    ``done`` is set afterwards."""

    key: tuple[str, int, int, int]
    continuations: list[Callable[[Verdict], None]] = field(default_factory=list)
    done: trio.Event = field(default_factory=trio.Event)


class ProduceVerifier:
    """KIP-890 part 1 for one node: the partition leader's questions and the coordinator's
    answers. ``run`` (in the coordinator service's nursery) carries the questions in flight;
    until it runs, a question is refused as retriable."""

    def __init__(self, node_id: int, quorum: Quorum, manager: PartitionManager,
                 state_log: TxnStateLog, login: ClusterLogin | None) -> None:
        self.node_id = node_id
        self.quorum = quorum
        self.manager = manager
        self.state_log = state_log
        self._nursery: trio.Nursery | None = None
        # Questions in flight, their own connections (so they never queue behind a marker
        # write's acks=all wait), and per (topic, partition, producer id) the guard a marker
        # clears.
        self._verifications: dict[tuple[str, int, int, int], PendingVerification] = {}
        self._peers = PeerConnections(registered_address(lambda: quorum.image),
                                      client_id=f"txn-verifier-{node_id}",
                                      timeout_s=VERIFY_TIMEOUT_S, login=login)
        self._guards: dict[tuple[str, int, int], object] = {}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            await self._peers.aclose()

    def invalidate(self, topic: str, index: int, producer_id: int) -> None:
        """A marker of ``producer_id`` was written to the partition: a verify_only answer
        still in flight predates it and must not be used."""
        self._guards.pop((topic, index, producer_id), None)

    def verify_transactional_produce(self, topic: str, index: int,
                                     transactional_id: str | None, producer_id: int,
                                     epoch: int) -> Verdict | PendingVerification:
        """KIP-890 part 1 on the produce path: a transactional batch must belong to an Ongoing
        transaction of that producer and epoch that lists this partition. Answered at once
        when this node is the id's coordinator or the partition already holds the producer's
        open transaction; otherwise the coordinator is asked (``PendingVerification``)."""
        image = self.quorum.image
        count = self.state_log.partition_count(image)
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
        self._guards[(topic, index, producer_id)] = guard
        self._nursery.start_soon(self._run_verification, pending, coordinator,
                                 transactional_id, guard)
        return pending

    def _verify_locally(self, topic: str, index: int, transactional_id: str,
                        producer_id: int, epoch: int) -> Verdict:
        try:
            state = self.state_log.owned_for(transactional_id)
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
        for state in self.state_log.owned.values():
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
            if self._guards.get(guard_key) is guard:
                del self._guards[guard_key]
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
            response = await self._peers.request(coordinator, ADD_PARTITIONS_TO_TXN, body,
                                                 version=4)
        except KafkaClientError as exc:
            log.info("verify_only AddPartitionsToTxn to node %d failed: %s", coordinator, exc)
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
            state = self.state_log.owned_for(transactional_id)
        except NotCoordinatorError as exc:
            return dict.fromkeys(partitions, exc.code)
        codes = core.verify_partitions(state.txns.get(transactional_id), producer_id, epoch,
                                       partitions)
        return {tp: int(code) for tp, code in codes.items()}


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
