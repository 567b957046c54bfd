"""The ``__transaction_state`` partitions this node leads: loading them, and persisting a
transactional id's new state.

* **Loading.** When this node becomes leader of one (or its leader epoch changes) the
  partition's whole log is replayed into memory (the last record of each id wins) and requests
  for its ids get COORDINATOR_LOAD_IN_PROGRESS meanwhile; the caller is told of each loaded
  partition (it completes the transactions found in a Prepare state). When leadership moves
  away, the state is dropped and requests get NOT_COORDINATOR. The coordinator epoch is the
  partition's leader epoch.
* **Persisting.** Every state change is one record (key: the transactional id, value: JSON of
  ``TxnMetadata``) appended through ``Partition.append`` and acknowledged only once the high
  watermark passed it (acks=all); only then is the in-memory state changed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

import trio

from raftlog.metadata.image import MetadataImage
from raftlog.partition.append import AppendOrigin
from raftlog.partition.batch import BatchHeader, build_batch, check_batch, decode_records
from raftlog.partition.errors import PartitionLogError
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import Partition, Replicated, now_ms
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.internal_topics import (
    TRANSACTION_STATE_TOPIC,
    UndecodableRecords,
    coordinator_partition,
)
from raftlog.quorum.interface import Quorum
from raftlog.txn import coordinator as core
from raftlog.txn.coordinator import CoordinatorPartitionState, TxnMetadata

__all__ = ["TXN_TOPIC", "NotCoordinatorError", "TxnStateLog"]

log = logging.getLogger(__name__)

TXN_TOPIC: Final = TRANSACTION_STATE_TOPIC
PERSIST_TIMEOUT_S: Final = 10.0


class NotCoordinatorError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class TxnStateLog:
    """The coordinator state of the ``__transaction_state`` partitions this node leads."""

    def __init__(self, quorum: Quorum, manager: PartitionManager) -> None:
        self.quorum = quorum
        self.manager = manager
        self.owned: dict[int, CoordinatorPartitionState] = {}
        self.loading: set[int] = set()
        self._locks: dict[int, trio.Lock] = {}
        # Records (or unreadable batches) of __transaction_state that loads skipped.
        self.undecodable_records_skipped = 0

    def partition_count(self, image: MetadataImage) -> int | None:
        topic = image.topics.get(TXN_TOPIC)
        return None if topic is None else len(topic.partitions)

    # -- loading ----------------------------------------------------------------------------

    def sync_ownership(self, nursery: trio.Nursery,
                       loaded: Callable[[CoordinatorPartitionState], None]) -> None:
        """Drop the partitions no longer led here (at the loaded epoch); start loading, in
        ``nursery``, the ones newly led; ``loaded`` is called with each loaded state."""
        for index, state in list(self.owned.items()):
            partition = self.manager.get(TXN_TOPIC, index)
            if partition is None or not partition.is_leader or \
                    partition.leader_epoch != state.coordinator_epoch:
                log.info("no longer transaction coordinator for %s-%d", TXN_TOPIC, index)
                del self.owned[index]
        for partition in self.manager.partitions_of(TXN_TOPIC):
            index = partition.index
            if not partition.is_leader or index in self.loading:
                continue
            if index in self.owned:
                continue
            self.loading.add(index)
            nursery.start_soon(self._load, index, partition, loaded)

    async def _load(self, index: int, partition: Partition,
                    loaded: Callable[[CoordinatorPartitionState], None]) -> None:
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
            loaded(state)
        except Exception:
            log.exception("loading %s-%d failed", TXN_TOPIC, index)
        finally:
            self.loading.discard(index)

    # -- the state of one transactional id --------------------------------------------------

    def owned_for(self, transactional_id: str) -> CoordinatorPartitionState:
        count = self.partition_count(self.quorum.image)
        if count is None:
            raise NotCoordinatorError(ErrorCode.NOT_COORDINATOR)
        index = coordinator_partition(transactional_id, count)
        if index in self.loading:
            raise NotCoordinatorError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        state = self.owned.get(index)
        partition = self.manager.get(TXN_TOPIC, index)
        if state is None or partition is None or not partition.is_leader or \
                partition.leader_epoch != state.coordinator_epoch:
            if partition is not None and partition.is_leader:
                raise NotCoordinatorError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
            raise NotCoordinatorError(ErrorCode.NOT_COORDINATOR)
        return state

    def lock(self, index: int) -> trio.Lock:
        """The lock that orders state changes of one ``__transaction_state`` partition."""
        return self._locks.setdefault(index, trio.Lock())

    # -- persisting -------------------------------------------------------------------------

    async def persist(self, state: CoordinatorPartitionState, metadata: TxnMetadata) -> int:
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
