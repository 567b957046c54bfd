"""Completing transactions: COMMIT/ABORT markers, then PrepareX -> CompleteX.

For a Prepare state, a COMMIT/ABORT control batch is written to every partition of the
transaction by its leader: locally (``append_marker``, the partition leader's side), or with
the internal WriteTxnMarkers (27) RPC over the Kafka listener. Failures are retried (with the
current leader from the metadata image) until every partition has its marker or this node
stops being the coordinator; then the Complete state is persisted. A leader that refuses a
marker as coming from a replaced coordinator (TRANSACTION_COORDINATOR_FENCED) ends the
completion: the new coordinator finishes it.
"""

from __future__ import annotations

import logging
from typing import Final, Protocol

import trio

from raftlog.client.connection import ClusterLogin, KafkaClientError
from raftlog.client.peers import PeerConnections, registered_address
from raftlog.metadata.image import NO_LEADER
from raftlog.partition.append import AppendOrigin
from raftlog.partition.errors import PartitionLogError
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import Replicated, now_ms
from raftlog.partition.txn_index import build_marker
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.internal_topics import OFFSETS_TOPIC
from raftlog.protocol.schemas_txn import WRITE_TXN_MARKERS
from raftlog.quorum.interface import Quorum
from raftlog.txn import coordinator as core
from raftlog.txn.coordinator import CoordinatorPartitionState, TxnMetadata, TxnState, TxnStats
from raftlog.txn.state_log import PERSIST_TIMEOUT_S, TxnStateLog
from raftlog.txn.verification import ProduceVerifier

__all__ = ["PendingOffsets", "TxnCompletion"]

log = logging.getLogger(__name__)

MARKER_RETRY_S: Final = 0.2
RPC_TIMEOUT_S: Final = 10.0
# In the set ``_send_markers`` returns: a leader refused a marker as coming from a replaced
# coordinator (TRANSACTION_COORDINATOR_FENCED).
FENCED: Final = ("", -1)


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


class TxnCompletion:
    """The completions of the transactions this node coordinates, and the markers it writes
    as a partition leader. ``run`` (in the coordinator service's nursery) carries the
    completions; until it runs, none starts."""

    def __init__(self, node_id: int, quorum: Quorum, manager: PartitionManager,
                 state_log: TxnStateLog, verifier: ProduceVerifier,
                 pending_offsets: PendingOffsets | None, login: ClusterLogin | None,
                 stats: TxnStats | None = None) -> None:
        self.node_id = node_id
        self.quorum = quorum
        self.manager = manager
        self.state_log = state_log
        self.verifier = verifier
        self.pending_offsets = pending_offsets
        self.stats = stats or TxnStats()
        self._completing: set[str] = set()
        self._nursery: trio.Nursery | None = None
        self._peers = PeerConnections(registered_address(lambda: quorum.image),
                                      client_id=f"txn-coordinator-{node_id}",
                                      timeout_s=RPC_TIMEOUT_S, login=login)

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

    def spawn_preparing(self, state: CoordinatorPartitionState) -> None:
        """A partition was loaded: complete every transaction it holds in a Prepare state."""
        for metadata in state.txns.values():
            if metadata.state.preparing:
                self.spawn(state, metadata)

    def spawn(self, state: CoordinatorPartitionState, metadata: TxnMetadata) -> None:
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
                if self.state_log.owned.get(state.partition) is not state:
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
                if self.state_log.owned.get(state.partition) is not state or \
                        state.txns.get(txn_id) is not metadata:
                    return
                async with self.state_log.lock(state.partition):
                    if state.txns.get(txn_id) is not metadata:
                        return
                    error = await self.state_log.persist(state, core.complete(metadata, now_ms()))
                if not error:
                    self.stats.completed.inc("commit" if commit else "abort")
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
        current = self.state_log.owned.get(state.partition)
        if current is None or current is state:
            return
        metadata = current.txns.get(txn_id)
        if metadata is not None and metadata.state.preparing:
            self.spawn(current, metadata)

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
            response = await self._peers.request(leader, WRITE_TXN_MARKERS, body, version=1)
        except KafkaClientError as exc:
            log.info("WriteTxnMarkers to node %d failed: %s", leader, exc)
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


    # -- the partition leader's side ------------------------------------------------------

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
        self.verifier.invalidate(topic, index, producer_id)
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


def _marker_retriable(code: int) -> bool:
    # Deleted partitions and stale epochs need no marker; everything else is retried
    # (TRANSACTION_COORDINATOR_FENCED ends the whole completion: see ``_complete``).
    return code not in (ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                        ErrorCode.INVALID_PRODUCER_EPOCH,
                        ErrorCode.TRANSACTION_COORDINATOR_FENCED)
