"""One local partition replica: its log, producer state, transaction index, role and HW.

``Partition.append`` is the only way bytes enter a partition (Kafka's ``UnifiedLog.append``
with an ``AppendOrigin``, ``raftlog.partition.append``): a produce, a coordinator's own
records or transaction markers, and a follower's copy of its leader's batches all go through
it. It validates, checks producer state, appends, commits producer state and notes the append
(group commit, high watermark, follower long polls); the transaction index is fed by the
log's append listener (``load_txn_index``). The caller then waits on the answer's offset
(``AckWait``, ``wait_replicated``).

Only the partition changes its own role (``become_leader``, ``become_follower``,
``go_offline``, ``mark_deleted``): ``replication.ReplicaManager`` decides, from the metadata
image, which one to call.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import trio

from raftlog.log_budget import LogBudget
from raftlog.metadata.image import NO_LEADER, PartitionImage
from raftlog.partition.append import AppendOrigin, AppendResult
from raftlog.partition.append_trace import AppendTrace
from raftlog.partition.batch import BatchHeader, validate_batches
from raftlog.partition.cleaner import has_record_without_key, is_compacted
from raftlog.partition.errors import OffsetOutOfRangeError
from raftlog.partition.log import PartitionLog
from raftlog.partition.producer_snapshot import (
    SnapshotFence,
    load_producer_state,
    log_headers,
    reset_producer_state,
    truncate_producer_state,
)
from raftlog.partition.producer_state import ProducerStateManager, headers_in
from raftlog.partition.replica_state import LeaderState
from raftlog.partition.txn_index import TxnIndex, open_txn_index, rebuild_txn_index
from raftlog.protocol.errors import ErrorCode

__all__ = [
    "DEFAULT_MIN_INSYNC_REPLICAS",
    "DEFAULT_REPLICA_LAG_TIME_MAX_MS",
    "AckWait",
    "Partition",
    "Replicated",
    "now_ms",
]

DEFAULT_MIN_INSYNC_REPLICAS = 1
DEFAULT_REPLICA_LAG_TIME_MAX_MS = 30_000
LOG_APPEND_TIME = "LogAppendTime"

log = logging.getLogger(__name__)
# Producer-state verdicts on client batches (retries answered from the log, refused
# sequences or epochs, producers accepted mid-sequence with no state): rare outside faults,
# and exactly what explains a duplicate or a loss afterwards, so they are logged, within a
# budget shared by every partition of the node.
_producer_verdicts = LogBudget(log, "producer-state verdicts")


def now_ms() -> int:
    return int(time.time() * 1000)


def _no_listener(partition: Partition) -> None:
    """A partition outside a ``PartitionManager`` (tests, tools): nobody to notify."""


class Replicated(enum.Enum):
    """How a wait for the high watermark under one leadership ended."""

    YES = "replicated"
    MOVED = "leadership moved or partition deleted"
    TIMED_OUT = "timed out"


@dataclass(eq=False)
class Partition:
    """One local partition replica: its log plus the trio-side watermark and role state.

    ``is_leader`` with ``leader_state`` None is a standalone leader (no followers): its high
    watermark is its own durable end, as on a single node. ``leadership_generation`` moves
    every time this replica stops leading, so a producer waiting for an acknowledgement can
    tell that the data it appended may have been truncated since. Those role fields are
    written only by the partition's own methods (``become_leader`` and the others below).
    """

    topic: str
    index: int
    log: PartitionLog
    leader_epoch: int
    high_watermark: int = 0
    deleted: bool = False
    is_leader: bool = True
    leader_id: int = -1
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()  # committed ISR, as the image (or an AlterPartition answer) says
    partition_epoch: int = 0
    leader_state: LeaderState | None = None
    min_insync_replicas: int = DEFAULT_MIN_INSYNC_REPLICAS
    replica_lag_time_max_ms: int = DEFAULT_REPLICA_LAG_TIME_MAX_MS
    leadership_generation: int = 0
    # Idempotent producers seen in this partition (leaders check, followers replay).
    producers: ProducerStateManager = field(default_factory=ProducerStateManager)
    producers_snapshot_offset: int = -1
    # Voids producer snapshots still being written when the log is truncated under them.
    snapshot_fence: SnapshotFence = field(default_factory=SnapshotFence, repr=False)
    # Open and aborted transactions (LSO, read_committed): fed by the log's append listener.
    txns: TxnIndex = field(default_factory=TxnIndex)
    # Called after every append: the owning PartitionManager's group commit and HW
    # bookkeeping (``PartitionManager.note_append``).
    on_append: Callable[[Partition], None] = field(default=_no_listener, repr=False)
    # Per-stage timing of one client append at a time (trace.produce.enable), else None.
    trace: AppendTrace | None = field(default=None, repr=False)
    _changed: trio.Event = field(default_factory=trio.Event)

    @property
    def durable_acks(self) -> bool:
        """True when acknowledgement waits for fsync (Kafka's flush.* left at default)."""
        config = self.log.config
        return config.flush_messages is None and config.flush_ms is None

    @property
    def last_stable_offset(self) -> int:
        """min(HW, first offset of the oldest open transaction): read_committed stops here.
        Never below the log start offset (Kafka's maybeIncrementFirstUnstableOffset): an
        open transaction that began below a DeleteRecords offset must not stall readers.
        The log start never passes the HW (DeleteRecords, retention and a follower's start
        are all bounded by it), so the ``min`` only guards that invariant: the LSO is never
        above the HW."""
        stable = self.txns.last_stable_offset(self.high_watermark)
        return max(stable, min(self.log.log_start_offset, self.high_watermark))

    def move_log_start_offset(self, offset: int) -> bool:
        """Move the log start up to ``offset`` (DeleteRecords on a leader, the leader's start
        on a follower; Kafka's maybeIncrementLogStartOffset): checkpointed durably, whole
        segments below it deleted, their aborted transactions forgotten; producer state is
        kept (as Kafka's). False when ``offset`` is not above the start or the partition
        was deleted.

        Synchronous on the event loop, like retention: one checkpoint fsync and one
        directory fsync (two when segments are unlinked; ``PartitionLog.
        advance_log_start_offset``). Being one call with no await, nothing (a leadership
        change, a reset, a deletion, another move) can happen between the caller's checks
        and the move, and no cancellation can stop it half way.

        Raises OffsetOutOfRangeError past the high watermark (Kafka's UnifiedLog refuses a
        start past it: it would delete data a follower may not have), KafkaStorageError
        while the log is offline, OSError from the disk (then nothing moved, in memory or
        on disk, so a retry writes the checkpoint again)."""
        if offset > self.high_watermark:
            raise OffsetOutOfRangeError(
                f"log start offset {offset} is past the high watermark {self.high_watermark}")
        if self.deleted or not self.log.advance_log_start_offset(offset):
            return False
        self.txns.drop_segments_below(self.log.segment_base_offsets)
        self.notify_changed()
        return True

    def low_watermark(self, is_alive: Callable[[int], bool]) -> int:
        """DeleteRecords' low watermark on a leader: the minimum log start offset of this
        replica and of every follower on a live broker (``LeaderState.low_watermark``)."""
        if self.leader_state is None:
            return self.log.log_start_offset
        return self.leader_state.low_watermark(self.log.log_start_offset, is_alive)

    def load_txn_index(self, *, on_open: bool = False) -> None:
        """Rebuild the transaction index from the log (open, truncation) and keep it fed by
        every later append (``raftlog.partition.txn_index``)."""
        if on_open:  # from the .txnindex files + the producer state's open transactions
            ongoing = {entry.producer_id: entry.current_txn_first_offset
                       for entry in self.producers.entries()
                       if entry.current_txn_first_offset >= 0}
            self.txns = open_txn_index(self.log, ongoing)
        else:
            self.txns = rebuild_txn_index(self.log)
        self.log.append_listener = self.txns.observe

    @property
    def corrupt_offset(self) -> int | None:
        """The first offset of the lowest batch found corrupt (``log_verify``) that is still
        in the log, or None."""
        offset = self.log.verifier.corrupt_offset
        return None if offset is None or offset < self.log.log_start_offset else offset

    @property
    def local_end_offset(self) -> int:
        """The end of what this replica counts as its own in the HW: fsynced data by default,
        everything written when flushing is relaxed."""
        return self.log.flushed_offset if self.durable_acks else self.log.log_end_offset

    @property
    def isr_size(self) -> int:
        """Committed ISR size for min.insync.replicas (1 for a standalone leader)."""
        return len(self.isr) if self.leader_state is not None else max(len(self.isr), 1)

    def notify_changed(self) -> None:
        """Wake every waiter on this partition (HW, flushed offset, role or deletion moved)."""
        self._changed.set()
        self._changed = trio.Event()

    def advance_high_watermark(self, offset: int) -> bool:
        assert offset <= self.log.log_end_offset, (offset, self.log.log_end_offset)
        if offset <= self.high_watermark:
            return False
        self.high_watermark = offset
        if self.trace is not None:
            self.trace.high_watermark(offset)
        self.notify_changed()
        return True

    def leader_high_watermark_candidate(self, now_ms: int, is_eligible: Callable[[int], bool]
                                        ) -> int:
        if self.leader_state is None:
            return self.local_end_offset
        return self.leader_state.high_watermark_candidate(
            self.local_end_offset, self.log.log_end_offset, now_ms,
            self.replica_lag_time_max_ms, is_eligible)

    def truncate_to(self, offset: int) -> int:
        """Truncate the log (a follower's divergent tail); the HW follows it down, also when
        the truncation fails half-way (KafkaStorageError: the log is offline)."""
        try:
            end_offset = self.log.truncate_to(offset)
        finally:
            self.high_watermark = min(self.high_watermark, self.log.log_end_offset)
            if self.trace is not None:
                self.trace.drop()
        self.load_txn_index()
        self.producers = truncate_producer_state(
            self.producers, self.log.directory, end_offset,
            log_start_offset=self.log.log_start_offset,
            read_headers=lambda start: log_headers(self.log, start), now_ms=now_ms(),
            fence=self.snapshot_fence)
        self.producers_snapshot_offset = min(self.producers_snapshot_offset, end_offset)
        self.notify_changed()
        return end_offset

    def reset_to(self, offset: int) -> None:
        """Empty the log and restart it at ``offset`` (below the leader's log start)."""
        self.log.reset_to(offset)
        self.high_watermark = offset
        if self.trace is not None:
            self.trace.drop()
        self.load_txn_index()
        self.producers = reset_producer_state(self.log.directory, offset, self.snapshot_fence)
        self.producers_snapshot_offset = -1
        self.notify_changed()

    def load_producers(self) -> None:
        """Producer state on open: the newest snapshot plus a header scan of the log after it,
        so deduplication survives restarts and a follower that becomes leader knows every
        producer."""
        self.producers = load_producer_state(
            self.log.directory, log_start_offset=self.log.log_start_offset,
            log_end_offset=self.log.log_end_offset,
            read_headers=lambda start: log_headers(self.log, start), now_ms=now_ms())
        self.producers_snapshot_offset = self.producers.end_offset

    def producer_snapshot(self) -> tuple[int, bytes, int] | None:
        """(offset, bytes, fence generation) of a new producer-state snapshot when the log
        moved since the last one; the caller writes it (in a worker thread) through
        ``write_snapshot_bytes`` with ``snapshot_fence`` and that generation."""
        self.producers.advance_end_offset(self.log.log_end_offset)
        offset = self.producers.end_offset
        if offset <= self.producers_snapshot_offset:
            return None
        self.producers_snapshot_offset = offset
        return offset, self.producers.to_bytes(), self.snapshot_fence.generation

    def producer_snapshot_failed(self) -> None:
        """The snapshot ``producer_snapshot`` made was not written: make the next one anew."""
        self.producers_snapshot_offset = -1

    # -- the one way in: append -------------------------------------------------------------

    def append(self, records: bytes | memoryview, origin: AppendOrigin, *,
               required_acks: int = -1, now: int | None = None) -> AppendResult:
        """Append ``records`` (Kafka's ``UnifiedLog.append``; ``raftlog.partition.append``
        says what each origin checks), commit producer state and note the append (group
        commit, the HW when flushing is relaxed, follower long polls).

        ``required_acks`` -1 refuses the append with NOT_ENOUGH_REPLICAS while the ISR is
        below min.insync.replicas, before writing anything (Kafka's appendRecordsToLeader);
        transaction markers pass 1: they are written whatever the ISR and wait for the HW.
        Refusals come back in the result; validation and storage failures are raised
        (``PartitionLogError`` including ``KafkaStorageError``, ``OSError``) with nothing
        written, for the caller to map to its API's error."""
        if now is None:
            now = now_ms()
        if origin is AppendOrigin.REPLICATION:
            return self._append_replicated(records, now)
        if not self.is_leader or self.deleted:
            return AppendResult.refused(ErrorCode.NOT_LEADER_OR_FOLLOWER,
                                        f"{self.topic}-{self.index} is not led here")
        allow_control = origin is AppendOrigin.COORDINATOR
        headers: list[BatchHeader] | None = None  # validated once; the append reuses them
        # A compacted topic refuses records without a key, as Kafka's LogValidator does. Only
        # compacted topics pay for reading (and, if compressed, decompressing) the records.
        if is_compacted(self.log.config.cleanup_policy):
            headers = validate_batches(records, allow_control=allow_control)
            if has_record_without_key(records):
                return AppendResult.refused(
                    ErrorCode.INVALID_RECORD, "Compacted topic cannot accept message without key")
        if required_acks == -1 and self.isr_size < self.min_insync_replicas:
            return AppendResult.refused(  # checked before appending, as Kafka does
                ErrorCode.NOT_ENOUGH_REPLICAS,
                f"The ISR has {self.isr_size} replicas, fewer than"
                f" min.insync.replicas={self.min_insync_replicas}.")
        if headers is None:
            headers = validate_batches(records, allow_control=allow_control)
        # Control batches carry their marker's coordinator epoch, which producer state needs.
        stated = list(headers_in(records)) if any(h.is_control for h in headers) else headers
        refusal = self._check_producers(stated, origin)
        if refusal is not None:
            return refusal
        info = self.log.append(records, leader_epoch=self.leader_epoch, now_ms=now,
                               allow_control=allow_control, validated=headers)
        if stated[0].producer_id >= 0:
            # Committed only after the append succeeded (checked on the side before).
            self.producers.commit_appends(stated, info.base_offset, now,
                                          info.log_append_time_ms)
        self.on_append(self)
        if self.trace is not None and origin is AppendOrigin.CLIENT:
            self.trace.appended(info.last_offset + 1, max(len(self.isr) - 1, 0))
        return AppendResult(base_offset=info.base_offset, last_offset=info.last_offset,
                            log_append_time_ms=info.log_append_time_ms,
                            leadership_generation=self.leadership_generation)

    def _check_producers(self, headers: list[BatchHeader], origin: AppendOrigin
                         ) -> AppendResult | None:
        """Producer state's verdict on a leader append: None to go ahead, else the refusal
        or, for a client's retried batch, the original's offsets (nothing is written)."""
        first = headers[0]
        if origin is AppendOrigin.COORDINATOR:
            if not first.is_control:
                return None  # the coordinators' own records: no sequence to check
            # A stale marker: the producer moved on (INVALID_PRODUCER_EPOCH), or it comes from
            # a replaced coordinator (TRANSACTION_COORDINATOR_FENCED), whose late COMMIT
            # would otherwise end the producer's next transaction here.
            refused = self.producers.check_marker(
                first.producer_id, first.producer_epoch,
                getattr(first, "coordinator_epoch", -1))
            return AppendResult.refused(refused, refused.name) if refused else None
        if first.producer_id < 0:
            return None  # not idempotent
        check = self.producers.check_appends(headers)
        if check.error:
            message = check.message or "producer state check failed"
            _producer_verdicts.log(logging.INFO, "partition %s-%d: refused a produce: %s (%s)",
                                   self.topic, self.index, ErrorCode(check.error).name, message)
            return AppendResult.refused(check.error, message)
        duplicate = check.duplicate
        if duplicate is None:
            if first.base_sequence != 0 and self.producers.get(first.producer_id) is None:
                _producer_verdicts.log(
                    logging.INFO, "partition %s-%d: producer %d (epoch %d) is unknown here; "
                    "accepting its batch at sequence %d (KIP-360)", self.topic, self.index,
                    first.producer_id, first.producer_epoch, first.base_sequence)
            return None
        _producer_verdicts.log(
            logging.INFO, "partition %s-%d: producer %d epoch %d sequence %d retried a batch "
            "already at offsets [%d, %d]", self.topic, self.index, first.producer_id,
            first.producer_epoch, first.base_sequence, duplicate.first_offset,
            duplicate.last_offset)
        log_append_time = self.log.config.message_timestamp_type == LOG_APPEND_TIME
        return AppendResult(base_offset=duplicate.first_offset,
                            last_offset=duplicate.last_offset,
                            log_append_time_ms=duplicate.timestamp_ms if log_append_time else -1,
                            duplicate=True, leadership_generation=self.leadership_generation)

    def _append_replicated(self, records: bytes | memoryview, now: int
                           ) -> AppendResult:
        """A follower's append of its leader's batches, as stored. Producer state is replayed
        from them, so a follower that becomes leader deduplicates retries exactly as the old
        leader would have."""
        info = self.log.append_replicated(records, now_ms=now)
        self.producers.rebuild(headers_in(records), now)
        self.on_append(self)
        return AppendResult(base_offset=info.base_offset, last_offset=info.last_offset,
                            leadership_generation=self.leadership_generation)

    # -- roles: only the partition changes its own ------------------------------------------

    def leads_epoch(self, leader_epoch: int) -> bool:
        """Whether this replica already leads at ``leader_epoch``."""
        state = self.leader_state
        return self.is_leader and state is not None and state.leader_epoch == leader_epoch

    def become_leader(self, node_id: int, state: PartitionImage, now: int) -> bool:
        """Lead at ``state.leader_epoch``: True when that is a new leadership (its epoch
        starts at the log end in the epoch cache, followers are tracked from now), False when
        it already led that epoch and only took the image's replicas and ISR. Raises OSError
        when the epoch cache cannot be written (the caller takes the partition offline)."""
        current = self.leader_state
        if current is not None and self.leads_epoch(state.leader_epoch):
            self.replicas = state.replicas
            current.update_replicas(state.replicas, now)
            self.take_committed_isr(state.isr, state.partition_epoch)
            return False
        self.log.assign_leader_epoch(state.leader_epoch)
        self.is_leader = True
        self.leader_id = node_id
        self.leader_epoch = state.leader_epoch
        self.replicas = state.replicas
        self.isr = state.isr
        self.partition_epoch = state.partition_epoch
        self.leader_state = LeaderState(
            node_id=node_id, replicas=state.replicas, isr=state.isr,
            leader_epoch=state.leader_epoch, partition_epoch=state.partition_epoch,
            epoch_start_offset=self.log.log_end_offset, now_ms=now)
        return True

    def take_committed_isr(self, isr: tuple[int, ...], partition_epoch: int) -> None:
        """A leader learns a committed ISR (the image, or an AlterPartition answer); kept
        when ``partition_epoch`` is newer than what it holds (``LeaderState.update_isr``)."""
        state = self.leader_state
        if state is not None and state.update_isr(isr, partition_epoch):
            self.isr = state.isr
            self.partition_epoch = state.partition_epoch

    def become_follower(self, state: PartitionImage, *, following: bool) -> bool:
        """Follow ``state.leader`` (nobody when it is -1) at its epoch. False when nothing
        changes: already a follower of that leader at that epoch and, unless there is no
        leader, ``following`` it (its fetcher has it)."""
        self.replicas = state.replicas
        self.isr = state.isr
        self.partition_epoch = state.partition_epoch
        if (not self.is_leader and self.leader_epoch == state.leader_epoch
                and self.leader_id == state.leader
                and (following or state.leader == NO_LEADER)):
            return False
        self._stop_leading()
        self.leader_id = state.leader
        self.leader_epoch = state.leader_epoch
        return True

    def go_offline(self) -> None:
        """Neither lead nor follow (a role change failed on disk; the next image retries)."""
        self._stop_leading()
        self.leader_id = NO_LEADER

    def await_role(self, checkpointed_high_watermark: int | None, *, replicated: bool) -> None:
        """Just opened for the replica manager: no role until it applies the image's. Only a
        single replica may treat everything it recovered as committed; a replicated one
        starts from its checkpointed HW (within its log)."""
        self.is_leader = False
        self.leader_id = NO_LEADER
        if replicated:
            start = self.log.log_start_offset
            hw = start if checkpointed_high_watermark is None else \
                max(checkpointed_high_watermark, start)
            self.high_watermark = min(hw, self.log.log_end_offset)

    def mark_deleted(self) -> None:
        """The topic (or this replica) is gone: stop leading and wake every waiter."""
        self.deleted = True
        self.is_leader = False
        self.leadership_generation += 1
        self.notify_changed()

    def _stop_leading(self) -> None:
        if self.is_leader:
            self.leadership_generation += 1  # producers waiting for acks=all must not trust it
        self.is_leader = False
        self.leader_state = None
        if self.trace is not None:
            self.trace.drop()

    def apply_configs(self, configs: Mapping[str, str]) -> None:
        """The topic's min.insync.replicas and replica.lag.time.max.ms, live."""
        self.min_insync_replicas = int(
            configs.get("min.insync.replicas", DEFAULT_MIN_INSYNC_REPLICAS))
        self.replica_lag_time_max_ms = int(
            configs.get("replica.lag.time.max.ms", DEFAULT_REPLICA_LAG_TIME_MAX_MS))

    # -- waiting ----------------------------------------------------------------------------

    async def wait_until(self, predicate: Callable[[], bool], deadline: float) -> bool:
        """Waits until ``predicate()`` holds (re-checked whenever this partition changes) or
        the deadline; returns the predicate's last value."""
        with trio.move_on_at(deadline):
            while not predicate():
                await self._changed.wait()
        return predicate()

    async def wait_replicated(self, offset: int, generation: int, deadline: float
                              ) -> Replicated:
        """Waits until the high watermark reaches ``offset`` while this replica still leads
        in leadership ``generation`` (what an internal-topic writer needs before it answers)."""
        def moved() -> bool:
            return self.deleted or self.leadership_generation != generation

        await self.wait_until(lambda: self.high_watermark >= offset or moved(), deadline)
        if moved():
            return Replicated.MOVED
        return Replicated.YES if self.high_watermark >= offset else Replicated.TIMED_OUT

    async def wait_high_watermark(self, offset: int, deadline: float) -> bool:
        """Waits until the high watermark reaches ``offset``; False on timeout or deletion."""
        return await self.wait_until(
            lambda: self.deleted or self.high_watermark >= offset, deadline
        ) and not self.deleted

    async def wait_flushed(self, offset: int, deadline: float) -> bool:
        """Waits until ``offset`` is fsynced; False on timeout or deletion."""
        return await self.wait_until(
            lambda: self.deleted or self.log.flushed_offset >= offset, deadline
        ) and not self.deleted




@dataclass(eq=False)
class AckWait:
    """A producer's (or a coordinator's) wait for one append's acknowledgement: acks=all
    until the HW passes ``target`` (every ISR member has it), acks=1 until this leader has
    fsynced it; settled early when the leadership moved or the log went offline."""

    partition: Partition
    target: int
    acks: int
    leadership_generation: int

    @classmethod
    def after(cls, partition: Partition, result: AppendResult, acks: int) -> AckWait:
        """The wait for an append (or a duplicate) that ``result`` answered."""
        return cls(partition, result.end_offset, acks, result.leadership_generation)

    def lost_leadership(self) -> bool:
        partition = self.partition
        return partition.deleted or partition.leadership_generation != self.leadership_generation

    def satisfied(self) -> bool:
        partition = self.partition
        if self.acks == -1:
            return partition.high_watermark >= self.target
        return not partition.durable_acks or partition.log.flushed_offset >= self.target

    def storage_failed(self) -> bool:
        """The log went offline (a failed fsync): the data may never become durable."""
        return self.partition.log.offline_reason is not None

    def settled(self) -> bool:
        return self.lost_leadership() or self.satisfied() or self.storage_failed()

    def error_code(self) -> int:
        partition = self.partition
        if self.lost_leadership():
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if not self.satisfied():
            if self.storage_failed():
                return ErrorCode.KAFKA_STORAGE_ERROR
            return ErrorCode.REQUEST_TIMED_OUT
        if self.acks == -1 and partition.isr_size < partition.min_insync_replicas:
            # Kafka: the records are in, but the ISR shrank below the minimum meanwhile.
            return ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        return ErrorCode.NONE
