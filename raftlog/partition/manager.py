"""The node's partitions: which logs exist here, group commit, high watermarks, retention.

``PartitionLog`` is plain synchronous storage; this module is its trio shell. It owns:

* the set of local partitions, kept in step with the metadata image (create and delete);
* group commit: appends land in the page cache at once and one flusher task fsyncs every
  dirty log in a worker thread, so one fsync covers every request that arrived meanwhile;
* the high watermark: with the default durability (``flush.messages`` unset) a record is
  visible to consumers and acknowledged to producers only once it is fsynced. Relaxed
  ``flush.messages`` / ``flush.ms`` make it visible at once and fsync on that policy. On a
  leader with followers the HW is also bounded by the ISR's log end offsets
  (``replica_state.LeaderState``); on a follower it is the leader's, capped at its own end;
* waiting: producers wait for the high watermark (acks=all) or the flushed offset (acks=1)
  to pass their offsets, long-poll fetches wait for any high watermark to move, follower
  fetches for any append.

Each partition starts as a standalone leader (itself the only replica), which is exactly the
single-node behaviour; ``replication.ReplicaManager`` assigns roles from the metadata image.
"""

from __future__ import annotations

import enum
import logging
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import trio

from raftlog.config import LOG_RETENTION_CHECK_INTERVAL_MS_DEFAULT
from raftlog.partition.errors import OffsetOutOfRangeError, PartitionLogError
from raftlog.partition.log import (
    FlushTicket,
    LogConfig,
    PartitionLog,
    describe_os_error,
)
from raftlog.partition.producer_snapshot import (
    load_producer_state,
    log_headers,
    prune_snapshots,
    reset_producer_state,
    truncate_producer_state,
    write_snapshot_bytes,
)
from raftlog.partition.producer_state import PRODUCER_ID_EXPIRATION_MS_DEFAULT, ProducerStateManager
from raftlog.partition.replica_state import LeaderState
from raftlog.partition.txn_index import TxnIndex, open_txn_index, rebuild_txn_index

log = logging.getLogger(__name__)

FLUSH_POLL_INTERVAL_S = 0.1
DEFAULT_MIN_INSYNC_REPLICAS = 1
DEFAULT_REPLICA_LAG_TIME_MAX_MS = 30_000


def now_ms() -> int:
    return int(time.time() * 1000)


def _int_or_none(value: str | None) -> int | None:
    if value is None:
        return None
    number = int(value)
    # Kafka's default for flush.messages / flush.ms is Long.MAX_VALUE, meaning "never".
    return None if number >= 2**62 else number


def log_config_for(configs: Mapping[str, str]) -> LogConfig:
    """Topic-level properties (Kafka's names, broker defaults merged in) to a LogConfig."""
    defaults = LogConfig()
    return LogConfig(
        segment_bytes=int(configs.get("segment.bytes", defaults.segment_bytes)),
        segment_ms=int(configs.get("segment.ms", defaults.segment_ms)),
        retention_ms=int(configs.get("retention.ms", defaults.retention_ms)),
        retention_bytes=int(configs.get("retention.bytes", defaults.retention_bytes)),
        index_interval_bytes=int(
            configs.get("index.interval.bytes", defaults.index_interval_bytes)
        ),
        flush_messages=_int_or_none(configs.get("flush.messages")),
        flush_ms=_int_or_none(configs.get("flush.ms")),
        message_timestamp_type=configs.get(
            "message.timestamp.type", defaults.message_timestamp_type
        ),
        max_message_bytes=int(configs.get("max.message.bytes", defaults.max_message_bytes)),
        # Log compaction (raftlog.partition.cleaner); retention deletes only with "delete".
        cleanup_policy=configs.get("cleanup.policy", defaults.cleanup_policy),
        delete_retention_ms=int(
            configs.get("delete.retention.ms", defaults.delete_retention_ms)),
        min_cleanable_dirty_ratio=float(
            configs.get("min.cleanable.dirty.ratio", defaults.min_cleanable_dirty_ratio)),
        min_compaction_lag_ms=int(
            configs.get("min.compaction.lag.ms", defaults.min_compaction_lag_ms)),
    )


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
    tell that the data it appended may have been truncated since.
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
    # Open and aborted transactions (LSO, read_committed): fed by the log's append listener.
    txns: TxnIndex = field(default_factory=TxnIndex)
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
        self.load_txn_index()
        self.producers = truncate_producer_state(
            self.producers, self.log.directory, end_offset,
            log_start_offset=self.log.log_start_offset,
            read_headers=lambda start: log_headers(self.log, start), now_ms=now_ms())
        self.notify_changed()
        return end_offset

    def reset_to(self, offset: int) -> None:
        """Empty the log and restart it at ``offset`` (below the leader's log start)."""
        self.log.reset_to(offset)
        self.high_watermark = offset
        self.load_txn_index()
        self.producers = reset_producer_state(self.log.directory, offset)
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

    def producer_snapshot(self) -> tuple[int, bytes] | None:
        """(offset, bytes) of a new producer-state snapshot when the log moved since the
        last one; the caller writes it (in a worker thread)."""
        self.producers.advance_end_offset(self.log.log_end_offset)
        offset = self.producers.end_offset
        if offset <= self.producers_snapshot_offset:
            return None
        self.producers_snapshot_offset = offset
        return offset, self.producers.to_bytes()

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


class PartitionManager:
    """Owns every local partition of the node and the tasks that maintain them."""

    def __init__(self, data_dir: Path, node_id: int) -> None:
        self.data_dir = data_dir
        self.node_id = node_id
        self.partitions: dict[tuple[str, int], Partition] = {}
        self._dirty: set[Partition] = set()
        self._flush_wanted = trio.Event()
        self._data_arrived = trio.Event()  # some high watermark moved (consumer long polls)
        self._appended = trio.Event()  # some log end moved (follower long polls)
        # Whether a follower counts for the HW while joining: set by the ReplicaManager.
        self.is_replica_eligible: Callable[[int], bool] = lambda node_id: True
        self.flush_rounds = 0  # fsync rounds run so far (group commit makes it << appends)
        self.producer_id_expiration_ms = PRODUCER_ID_EXPIRATION_MS_DEFAULT  # the node sets it
        # log.retention.check.interval.ms; the node sets it from server.properties.
        self.retention_check_interval_ms = LOG_RETENTION_CHECK_INTERVAL_MS_DEFAULT

    def get(self, topic: str, index: int) -> Partition | None:
        return self.partitions.get((topic, index))

    # -- lifecycle driven by the metadata image ----------------------------------------------

    def ensure_partition(
        self, topic: str, index: int, configs: Mapping[str, str], leader_epoch: int
    ) -> Partition:
        existing = self.partitions.get((topic, index))
        if existing is not None:
            existing.leader_epoch = leader_epoch
            return existing
        directory = self.data_dir / f"{topic}-{index}"
        partition_log = PartitionLog.open(directory, log_config_for(configs), now_ms())
        partition = Partition(topic, index, partition_log, leader_epoch,
                              leader_id=self.node_id, replicas=(self.node_id,),
                              isr=(self.node_id,))
        _apply_replication_configs(partition, configs)
        partition.load_producers()
        partition.load_txn_index(on_open=True)
        # On open everything recovered is already on disk: visible and durable. (A replicated
        # partition's HW is reset by the ReplicaManager from its checkpoint.)
        partition.high_watermark = partition_log.log_end_offset
        self.partitions[(topic, index)] = partition
        log.info("partition %s-%d open at offsets [%d, %d)", topic, index,
                 partition_log.log_start_offset, partition_log.log_end_offset)
        return partition

    def remove_partition(self, topic: str, index: int) -> None:
        partition = self.partitions.pop((topic, index), None)
        if partition is None:
            return
        partition.deleted = True
        partition.is_leader = False
        partition.leadership_generation += 1
        partition.notify_changed()
        self._wake_fetches()
        self._dirty.discard(partition)
        partition.log.close()
        directory = self.data_dir / f"{topic}-{index}"
        # Rename first so a crash mid-delete never leaves a half-deleted live directory.
        doomed = directory.with_name(f"{directory.name}.{now_ms()}-delete")
        directory.rename(doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        log.info("partition %s-%d deleted", topic, index)

    def update_configs(self, topic: str, configs: Mapping[str, str]) -> None:
        """Apply ``topic``'s effective configs (its overrides over the broker defaults) to its
        local partitions, live: every reader of ``log.config`` (roll, retention, flush,
        append validation, the cleaner) and min.insync.replicas see them from now on."""
        new_config: LogConfig | None = None
        for (name, _), partition in self.partitions.items():
            if name != topic:
                continue
            new_config = new_config or log_config_for(configs)
            if partition.log.config != new_config:
                log.info("partition %s-%d: log config changed to %s", topic, partition.index,
                         new_config)
                partition.log.config = new_config
            _apply_replication_configs(partition, configs)

    def purge_leftover_deletions(self) -> None:
        for doomed in self.data_dir.glob("*-delete"):
            shutil.rmtree(doomed, ignore_errors=True)

    def close(self) -> None:
        for partition in self.partitions.values():
            _write_producer_snapshot(partition)
            partition.log.close()
        self.partitions.clear()

    # -- appends and group commit -----------------------------------------------------------

    def note_append(self, partition: Partition) -> None:
        """Called after every append (leader or follower): schedules the fsync or, if relaxed,
        lets a leader expose the data at once; wakes follower long polls."""
        if partition.durable_acks or partition.log.needs_flush(now_ms()):
            self._dirty.add(partition)
            self._flush_wanted.set()
        self._appended.set()
        self._appended = trio.Event()
        if not partition.durable_acks:
            self.update_high_watermark(partition)

    def update_high_watermark(self, partition: Partition) -> bool:
        """Recompute a leader's HW after its own, a follower's or the ISR's progress."""
        if not partition.is_leader or partition.deleted:
            return False
        candidate = partition.leader_high_watermark_candidate(
            now_ms(), self.is_replica_eligible)
        if partition.advance_high_watermark(min(candidate, partition.log.log_end_offset)):
            self._wake_fetches()
            return True
        return False

    def set_follower_high_watermark(self, partition: Partition, leader_high_watermark: int
                                    ) -> None:
        """A follower's HW: the leader's, capped at its own log end."""
        partition.advance_high_watermark(
            min(leader_high_watermark, partition.log.log_end_offset))

    def _wake_fetches(self) -> None:
        self._data_arrived.set()
        self._data_arrived = trio.Event()
        self._appended.set()
        self._appended = trio.Event()

    async def wait_for_data(self, deadline: float) -> None:
        """Waits until any local high watermark moves, or the deadline."""
        with trio.move_on_at(deadline):
            await self._data_arrived.wait()

    async def wait_for_append(self, deadline: float) -> None:
        """Waits until any local log end or high watermark moves, or the deadline."""
        with trio.move_on_at(deadline):
            await self._appended.wait()

    def note_role_change(self, partition: Partition) -> None:
        """Wake everything that waits on this partition or on any partition."""
        partition.notify_changed()
        self._wake_fetches()

    async def run_flusher(self) -> None:
        """Group commit: one fsync round covers every append made since the last one."""
        while True:
            with trio.move_on_after(FLUSH_POLL_INTERVAL_S):
                await self._flush_wanted.wait()
            self._flush_wanted = trio.Event()
            self._collect_timed_flushes()
            if self._dirty:
                await self._flush_round()

    def _collect_timed_flushes(self) -> None:
        now = now_ms()
        for partition in self.partitions.values():
            if not partition.durable_acks and partition.log.needs_flush(now):
                self._dirty.add(partition)

    async def _flush_round(self) -> None:
        """One group-commit round. A failed fsync (or EMFILE before it) takes that
        partition's log offline (``PartitionLog.mark_offline``: one ERROR line, appends get
        KAFKA_STORAGE_ERROR, waiting producers are answered) and never the node down."""
        batch = list(self._dirty)
        self._dirty.clear()
        tickets: list[tuple[Partition, FlushTicket]] = []
        for partition in batch:
            try:
                ticket = partition.log.begin_flush()
            except OSError as error:
                self._storage_failed(partition, "preparing fsync", error)
                continue
            if ticket is not None:
                tickets.append((partition, ticket))
        failures = await trio.to_thread.run_sync(_run_tickets, [t for _, t in tickets])
        self.flush_rounds += 1
        for (partition, ticket), failure in zip(tickets, failures, strict=True):
            if partition.deleted:
                continue
            if failure is not None:
                self._storage_failed(partition, "fsync", failure)
                continue
            partition.log.complete_flush(ticket)
            partition.notify_changed()  # acks=1 producers and followers wait for this
            if partition.durable_acks:
                self.update_high_watermark(partition)

    def _storage_failed(self, partition: Partition, operation: str, error: OSError) -> None:
        if partition.deleted:
            return
        partition.log.mark_offline(operation, error)
        partition.notify_changed()  # producers waiting for this data get their answer now

    async def run_retention(self) -> None:
        """Every log.retention.check.interval.ms: retention, then producer-state snapshots."""
        while True:
            await trio.sleep(self.retention_check_interval_ms / 1000)
            self.enforce_retention()
            await self.snapshot_producers()

    async def snapshot_producers(self) -> None:
        """Snapshot producer state so a restart replays only the log written since, and
        forget producers idle longer than producer.id.expiration.ms."""
        now = now_ms()
        for partition in list(self.partitions.values()):
            partition.producers.expire(now, self.producer_id_expiration_ms)
            snapshot = partition.producer_snapshot()
            if snapshot is None:
                continue
            directory = partition.log.directory
            try:
                await trio.to_thread.run_sync(_store_snapshot, directory, *snapshot)
            except OSError as error:  # e.g. a full disk; a restart replays more of the log
                partition.producers_snapshot_offset = -1
                log.warning("partition %s-%d: cannot write a producer-state snapshot: %s",
                            partition.topic, partition.index, describe_os_error(error))

    def enforce_retention(self) -> int:
        deleted = 0
        for partition in list(self.partitions.values()):
            try:
                # Bounded by this replica's HW (a leader's or a follower's own), so the
                # log start never passes it (Kafka's deletableSegments).
                count = partition.log.enforce_retention(now_ms(), partition.high_watermark)
                partition.txns.drop_segments_below(partition.log.segment_base_offsets)
                deleted += count
                if count:  # the log start moved: wake fetches waiting on it (as DeleteRecords)
                    self.note_role_change(partition)
            except OSError as error:  # retried at the next check
                log.warning("partition %s-%d: retention failed: %s", partition.topic,
                            partition.index, describe_os_error(error))
            except PartitionLogError as error:  # a failed fsync took the log offline
                log.warning("partition %s-%d: retention failed: %s", partition.topic,
                            partition.index, error)
        return deleted


def _apply_replication_configs(partition: Partition, configs: Mapping[str, str]) -> None:
    partition.min_insync_replicas = int(
        configs.get("min.insync.replicas", DEFAULT_MIN_INSYNC_REPLICAS))
    partition.replica_lag_time_max_ms = int(
        configs.get("replica.lag.time.max.ms", DEFAULT_REPLICA_LAG_TIME_MAX_MS))


def _run_tickets(tickets: Iterable[FlushTicket]) -> list[OSError | None]:
    """Run every ticket (each closes its fds whatever happens); per ticket, its error."""
    failures: list[OSError | None] = []
    for ticket in tickets:
        try:
            ticket.run()
        except OSError as error:
            failures.append(error)
        else:
            failures.append(None)
    return failures


def _store_snapshot(directory: Path, offset: int, data: bytes) -> None:
    if not directory.exists():
        return  # the partition was deleted meanwhile
    write_snapshot_bytes(directory, offset, data)
    prune_snapshots(directory, keep=2)


def _write_producer_snapshot(partition: Partition) -> None:
    snapshot = partition.producer_snapshot()
    if snapshot is not None:
        try:
            _store_snapshot(partition.log.directory, *snapshot)
        except OSError as exc:  # a restart rebuilds from the log instead
            log.warning("partition %s-%d: producer snapshot failed: %s", partition.topic,
                        partition.index, exc)
