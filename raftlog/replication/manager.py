"""Partition replication: roles from the metadata image, follower fetchers, ISR changes.

The trio shell around ``PartitionManager`` for replicated partitions (see
``docs/cluster-design.md``, "Replication"). One ``ReplicaManager`` per node:

* ``apply_image(image)`` derives each local partition's role. Leader (image leader == this
  node): its epoch starts at its log end in the epoch cache, follower fetches are served by
  ``KafkaApis.fetch`` (which calls ``record_follower_fetch``). Follower: the partition joins the
  ``LeaderFetcher`` of its leader. A new leader epoch is a role change even for the same leader.
* one ``LeaderFetcher`` task per leader node: first OffsetForLeaderEpoch (v3) for partitions
  whose leader epoch is new, truncating divergent tails; then a loop of Fetch (v11, replica_id
  = this node) from each partition's log end, ``append_replicated``, fsync through the
  manager's group commit, HW = min(leader HW, own end).
* the leader's ISR: shrink a follower not caught up within ``replica.lag.time.max.ms``, expand
  one whose end reached the HW, through the injected ``alter_isr`` (the AlterPartition RPC);
  the HW uses the maximal ISR until the outcome is known (``replica_state``).
* a ``replication-offset-checkpoint`` of high watermarks (Kafka's name and format), so a
  restarted leader shows consumers what was committed before followers fetch again.

Every network wait has a timeout; fetch errors back a partition (or the whole fetcher) off.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from raftlog.client.connection import ClusterLogin, KafkaClientError, KafkaConnection
from raftlog.metadata import errors as metadata_errors
from raftlog.metadata.image import NO_LEADER, MetadataImage, PartitionImage
from raftlog.partition.append import AppendOrigin
from raftlog.partition.batch import BATCH_LENGTH_OFFSET, LOG_OVERHEAD, RECORD_BATCH_OVERHEAD
from raftlog.partition.epoch_cache import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
from raftlog.partition.errors import PartitionLogError, UnexpectedOffsetError
from raftlog.partition.files import write_atomically
from raftlog.partition.log import KafkaStorageError
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import Partition, now_ms
from raftlog.partition.replica_state import LeaderState, PendingIsr
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import FETCH, LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH

__all__ = [
    "HW_CHECKPOINT",
    "AlterIsr",
    "FollowerAssignment",
    "LeaderFetcher",
    "ReplicaManager",
    "ReplicationSettings",
]

log = logging.getLogger(__name__)

HW_CHECKPOINT = "replication-offset-checkpoint"
FETCH_VERSION = 11
OFFSET_FOR_LEADER_EPOCH_VERSION = 3
LIST_OFFSETS_VERSION = 5
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
IDLE_WAIT_S = 1.0
# After STALE_BROKER_EPOCH: a restarted follower's registration reaches the leader's image (and
# its own) within milliseconds, so it reconnects this soon rather than after the full backoff
# (which added a second to every restarted node's return to the ISR); doubling per stale answer
# in a row, up to the backoff, so a follower whose image stays behind does not spin.
STALE_EPOCH_RETRY_S = 0.05

# alter_isr(topic, partition, new_isr, leader_epoch, partition_epoch) sends AlterPartition for
# one partition: ``partition_epoch`` is the committed epoch the change is based on (the
# controller compare-and-sets it). Returns (Kafka error code, the partition as committed, or
# None when the answer does not carry it). Raising (or timing out) means "outcome unknown".
AlterIsr = Callable[
    [str, int, tuple[int, ...], int, int], Awaitable[tuple[int, PartitionImage | None]]
]

PartitionKey = tuple[str, int]

# The controller refused the change for certain, and our view is not merely stale.
_DEFINITIVE_ALTER_ERRORS = frozenset({
    metadata_errors.INELIGIBLE_REPLICA,
    metadata_errors.INVALID_REQUEST,
    metadata_errors.NOT_CONTROLLER,
    metadata_errors.UNKNOWN_TOPIC_OR_PARTITION,
    metadata_errors.FENCED_LEADER_EPOCH,
    metadata_errors.UNKNOWN_TOPIC_ID,
})
# Errors after which a follower waits for new metadata (and retries after a backoff).
_METADATA_ERRORS = frozenset({
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.STALE_BROKER_EPOCH,  # our registration is not in the leader's image yet
})


@dataclass(frozen=True, slots=True)
class ReplicationSettings:
    """Kafka's broker replication properties (names in the comments) and their defaults."""

    replica_lag_time_max_ms: int = 30_000  # replica.lag.time.max.ms
    fetch_max_bytes: int = 4 << 20  # replica.fetch.max.bytes (per partition; see config.py)
    fetch_response_max_bytes: int = 10 << 20  # replica.fetch.response.max.bytes
    fetch_wait_max_ms: int = 500  # replica.fetch.wait.max.ms
    fetch_min_bytes: int = 1  # replica.fetch.min.bytes
    fetch_backoff_ms: int = 1000  # replica.fetch.backoff.ms (after an error)
    socket_timeout_ms: int = 30_000  # replica.socket.timeout.ms (every request)
    hw_checkpoint_interval_ms: int = 5000  # replica.high.watermark.checkpoint.interval.ms
    alter_isr_retry_backoff_ms: int = 1000  # how soon a failed AlterPartition is retried
    alter_isr_timeout_ms: int = 30_000  # an unanswered AlterPartition counts as failed

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> ReplicationSettings:
        """Build from Kafka property names (missing ones keep their defaults)."""
        names = {
            "replica_lag_time_max_ms": "replica.lag.time.max.ms",
            "fetch_max_bytes": "replica.fetch.max.bytes",
            "fetch_response_max_bytes": "replica.fetch.response.max.bytes",
            "fetch_wait_max_ms": "replica.fetch.wait.max.ms",
            "fetch_min_bytes": "replica.fetch.min.bytes",
            "fetch_backoff_ms": "replica.fetch.backoff.ms",
            "socket_timeout_ms": "replica.socket.timeout.ms",
            "hw_checkpoint_interval_ms": "replica.high.watermark.checkpoint.interval.ms",
        }
        values = {attr: int(properties[key]) for attr, key in names.items() if key in properties}
        return cls(**values)


@dataclass(eq=False, slots=True)
class FollowerAssignment:
    """A partition this node follows, for one leader epoch. A new epoch is a new object, so
    a fetcher can tell, after any await, whether what it is about to do is still wanted."""

    partition: Partition
    leader_id: int
    leader_epoch: int
    needs_truncation: bool = True
    delayed_until: float = 0.0  # trio time; backoff after an error

    @property
    def key(self) -> PartitionKey:
        return self.partition.topic, self.partition.index


class ReplicaManager:
    """Roles, fetchers and ISR maintenance for one node's partitions (see module docstring).

    Call ``apply_image`` with every new metadata image (it is synchronous), and run ``run``
    in the node's nursery: it owns the fetcher tasks, the ISR checks and the HW checkpoint.
    """

    def __init__(
        self,
        manager: PartitionManager,
        *,
        settings: ReplicationSettings | None = None,
        alter_isr: AlterIsr | None = None,
        incarnation_id: str | None = None,
        login: ClusterLogin | None = None,
    ) -> None:
        self.manager = manager
        self.node_id = manager.node_id
        # How fetchers prove to leaders that they are this broker (raft.secret); None only
        # where no other node exists to fetch from.
        self.login = login
        self.settings = ReplicationSettings() if settings is None else settings
        self.alter_isr = alter_isr
        # When set, this node leads only once the image holds its registration with this
        # incarnation, unfenced: an image replayed at start-up may name it leader of an epoch
        # whose unflushed tail it lost in a crash, and followers may have that tail.
        self.incarnation_id = incarnation_id
        self._may_lead_logged: bool | None = None
        self.image: MetadataImage | None = None
        self.fetchers: dict[int, LeaderFetcher] = {}
        self._followed: dict[PartitionKey, FollowerAssignment] = {}
        self._nursery: trio.Nursery | None = None
        self._hw_checkpoint_path = manager.data_dir / HW_CHECKPOINT
        self._checkpointed_hws = _read_hw_checkpoint(self._hw_checkpoint_path)
        self._written_hws: dict[PartitionKey, int] = dict(self._checkpointed_hws)
        manager.is_replica_eligible = self.is_eligible

    # --- the task tree ---------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Runs fetchers, ISR checks and HW checkpoints until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for fetcher in self.fetchers.values():
                    fetcher.start(nursery)
                nursery.start_soon(self._run_isr_checks)
                nursery.start_soon(self._run_hw_checkpoints)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            try:
                self.write_hw_checkpoint()
            except OSError as exc:
                log.error("cannot write %s: %s", self._hw_checkpoint_path, exc)

    # --- roles from metadata ---------------------------------------------------------------

    def apply_image(self, image: MetadataImage,
                    topic_defaults: Mapping[str, str] | None = None) -> None:
        """Bring local partitions in step with ``image``: open assigned ones, set each one's
        role, delete the ones no longer assigned here. ``topic_defaults`` are the broker's
        topic-level defaults (``ServerConfig.topic_defaults()``)."""
        self.image = image
        defaults = {"replica.lag.time.max.ms": str(self.settings.replica_lag_time_max_ms),
                    **(topic_defaults or {})}
        wanted: set[PartitionKey] = set()
        may_lead = self._may_lead(image)
        for topic in image.topics.values():
            configs = {**defaults, **dict(topic.configs)}
            self.manager.update_configs(topic.name, configs)
            for state in topic.partitions:
                if self.node_id not in state.replicas:
                    continue
                wanted.add((topic.name, state.partition))
                partition = self._open(topic.name, state, configs)
                if partition is None:
                    continue
                try:
                    if state.leader == self.node_id and may_lead:
                        self.become_leader(partition, state)
                    elif state.leader == self.node_id:
                        self.become_follower(partition, dataclasses.replace(
                            state, leader=NO_LEADER))  # offline here until unfenced
                    else:
                        self.become_follower(partition, state)
                except OSError as exc:
                    # The epoch checkpoint or a truncation failed: the partition stays
                    # offline here (NOT_LEADER_OR_FOLLOWER) and the next image retries.
                    log.error("cannot change the role of %s-%d: %s", topic.name,
                              state.partition, exc)
                    self._go_offline(partition)
        for key in list(self.manager.partitions):
            if key not in wanted:
                self._stop_following(key)
                self.manager.remove_partition(*key)
        self._stop_idle_fetchers()

    def _may_lead(self, image: MetadataImage) -> bool:
        if self.incarnation_id is None:
            return True
        me = image.brokers.get(self.node_id)
        ready = me is not None and me.incarnation_id == self.incarnation_id and not me.fenced
        if ready != self._may_lead_logged:
            self._may_lead_logged = ready
            log.info("node %d %s", self.node_id, "may lead partitions" if ready else
                     "is not registered and unfenced in this incarnation: leading nothing")
        return ready

    def _open(self, topic: str, state: PartitionImage, configs: Mapping[str, str]
              ) -> Partition | None:
        existing = self.manager.get(topic, state.partition)
        if existing is not None:
            return existing
        try:
            partition = self.manager.ensure_partition(topic, state.partition, configs,
                                                      state.leader_epoch)
        except OSError as exc:
            # Out of file descriptors or disk: this partition stays offline (clients get
            # NOT_LEADER_OR_FOLLOWER and retry) and the next metadata change retries the open.
            log.error("cannot open partition %s-%d: %s", topic, state.partition, exc)
            return None
        partition.await_role(self._checkpointed_hws.get((topic, state.partition)),
                             replicated=len(state.replicas) > 1)
        return partition

    def become_leader(self, partition: Partition, state: PartitionImage) -> None:
        """This node leads ``partition`` at ``state.leader_epoch`` (idempotent per epoch; an
        image with the same epoch only updates replicas and ISR)."""
        if not partition.leads_epoch(state.leader_epoch):
            self._stop_following((partition.topic, partition.index))
        if partition.become_leader(self.node_id, state, now_ms()):
            log.info("partition %s-%d: leader at epoch %d, ISR %s, offsets [%d, %d), HW %d",
                     partition.topic, partition.index, state.leader_epoch, list(state.isr),
                     partition.log.log_start_offset, partition.log.log_end_offset,
                     partition.high_watermark)
            self.manager.note_role_change(partition)
        self.manager.update_high_watermark(partition)

    def become_follower(self, partition: Partition, state: PartitionImage) -> None:
        """This node follows ``state.leader`` (or nobody, when it is -1) at its epoch."""
        key = (partition.topic, partition.index)
        if not partition.become_follower(state, following=key in self._followed):
            return  # same leader, same epoch: nothing to do
        self._stop_following(key)
        self.manager.note_role_change(partition)
        log.info("partition %s-%d: follower of %d at epoch %d, offsets [%d, %d)",
                 partition.topic, partition.index, state.leader, state.leader_epoch,
                 partition.log.log_start_offset, partition.log.log_end_offset)
        if state.leader == NO_LEADER:
            return
        assignment = FollowerAssignment(partition, state.leader, state.leader_epoch)
        self._followed[key] = assignment
        fetcher = self.fetchers.get(state.leader)
        if fetcher is None:
            fetcher = self.fetchers[state.leader] = LeaderFetcher(self, state.leader)
            if self._nursery is not None:
                fetcher.start(self._nursery)
        fetcher.add(assignment)

    def _go_offline(self, partition: Partition) -> None:
        self._stop_following((partition.topic, partition.index))
        partition.go_offline()
        self.manager.note_role_change(partition)

    def _stop_following(self, key: PartitionKey) -> None:
        assignment = self._followed.pop(key, None)
        if assignment is None:
            return
        fetcher = self.fetchers.get(assignment.leader_id)
        if fetcher is not None:
            fetcher.remove(assignment)

    def _stop_idle_fetchers(self) -> None:
        for leader_id, fetcher in list(self.fetchers.items()):
            if not fetcher.assignments:
                fetcher.stop()
                del self.fetchers[leader_id]

    def is_following(self, assignment: FollowerAssignment) -> bool:
        """Whether ``assignment`` is still what this node should be doing."""
        partition = assignment.partition
        return (self._followed.get(assignment.key) is assignment and not partition.deleted
                and not partition.is_leader)

    def is_eligible(self, node_id: int) -> bool:
        """Whether a broker may join an ISR: registered and not fenced."""
        image = self.image
        if image is None:
            return True
        broker = image.brokers.get(node_id)
        return broker is not None and not broker.fenced

    def broker_address(self, node_id: int) -> tuple[str, int] | None:
        image = self.image
        broker = None if image is None else image.brokers.get(node_id)
        return None if broker is None else (broker.host, broker.port)

    # --- the leader side of follower fetches -----------------------------------------------

    def record_follower_fetch(self, partition: Partition, replica_id: int,
                              fetch_offset: int, log_start_offset: int = -1) -> bool:
        """A follower fetched from ``fetch_offset`` reporting its ``log_start_offset`` (the
        leader checked leadership, epoch and range). Updates its position, maybe the HW,
        maybe asks to expand the ISR; wakes DeleteRecords waiting for the low watermark when
        its log start moved. False when ``replica_id`` is not one of the partition's
        replicas."""
        state = partition.leader_state
        if state is None:
            return False
        now = now_ms()
        follower = state.followers.get(replica_id)
        start_before = None if follower is None else follower.log_start_offset
        if not state.record_fetch(replica_id, fetch_offset, partition.log.log_end_offset, now,
                                  log_start_offset):
            return False
        if follower is not None and follower.log_start_offset != start_before:
            partition.notify_changed()
        self.manager.update_high_watermark(partition)
        if replica_id not in state.isr:
            self.maybe_change_isr(partition, now)
        return True

    # --- ISR changes -----------------------------------------------------------------------

    async def _run_isr_checks(self) -> None:
        """Kafka's isr-expiration task: every half lag time (at most each second)."""
        while True:
            lag_times = [p.replica_lag_time_max_ms for p in self.manager.partitions.values()
                         if p.leader_state is not None]
            interval_ms = min([*lag_times, self.settings.replica_lag_time_max_ms]) / 2
            await trio.sleep(min(max(interval_ms, 10), 1000) / 1000)
            self.check_isr()

    def check_isr(self) -> None:
        """Shrink (or expand, or retry) the ISR of every partition this node leads."""
        now = now_ms()
        for partition in list(self.manager.partitions.values()):
            if partition.is_leader and partition.leader_state is not None:
                self.maybe_change_isr(partition, now)
                self.manager.update_high_watermark(partition)

    def maybe_change_isr(self, partition: Partition, now: int) -> None:
        state = partition.leader_state
        if state is None or self.alter_isr is None or self._nursery is None:
            return
        settings = self.settings
        if not state.can_send_change(now, settings.alter_isr_retry_backoff_ms,
                                     settings.alter_isr_timeout_ms):
            return
        proposed = state.proposed_isr(partition.log.log_end_offset, partition.high_watermark,
                                      now, partition.replica_lag_time_max_ms, self.is_eligible)
        if proposed is None:
            if state.pending is None:
                return
            proposed = state.isr  # settle a failed change whose outcome is unknown
        pending = state.begin_change(proposed, now)
        log.info("partition %s-%d: asking to change the ISR %s -> %s (partition epoch %d)",
                 partition.topic, partition.index, list(state.isr), list(proposed),
                 pending.partition_epoch)
        self._nursery.start_soon(self._send_alter_isr, partition, state, pending)

    async def _send_alter_isr(self, partition: Partition, state: LeaderState,
                              pending: PendingIsr) -> None:
        assert self.alter_isr is not None
        try:
            with trio.fail_after(self.settings.alter_isr_timeout_ms / 1000):
                error, committed = await self.alter_isr(
                    partition.topic, partition.index, pending.proposed, state.leader_epoch,
                    pending.partition_epoch)
        except Exception as exc:  # trio.TooSlowError included: the outcome is unknown
            log.warning("partition %s-%d: AlterPartition failed: %r", partition.topic,
                        partition.index, exc)
            state.change_failed(pending, now_ms(), definitive=False)
            return
        if partition.leader_state is not state:
            return  # no longer leading this epoch; metadata has taken over
        if error == ErrorCode.NONE:
            if committed is not None and committed.leader == self.node_id and \
                    committed.leader_epoch == state.leader_epoch:
                partition.take_committed_isr(committed.isr, committed.partition_epoch)
                log.info("partition %s-%d: ISR now %s (partition epoch %d)", partition.topic,
                         partition.index, list(state.isr), state.partition_epoch)
            else:
                state.change_accepted(pending)
        else:
            log.info("partition %s-%d: AlterPartition to %s refused: %s", partition.topic,
                     partition.index, list(pending.proposed),
                     metadata_errors.error_name(error))
            state.change_failed(pending, now_ms(),
                                definitive=error in _DEFINITIVE_ALTER_ERRORS)
        self.manager.update_high_watermark(partition)

    # --- high-watermark checkpoint ---------------------------------------------------------

    async def _run_hw_checkpoints(self) -> None:
        while True:
            await trio.sleep(self.settings.hw_checkpoint_interval_ms / 1000)
            hws = self._current_hws()
            if hws != self._written_hws:
                data = _hw_checkpoint_bytes(hws)
                try:
                    await trio.to_thread.run_sync(write_atomically, self._hw_checkpoint_path,
                                                  data)
                except OSError as exc:
                    log.error("cannot write %s: %s", self._hw_checkpoint_path, exc)
                    continue
                self._written_hws = hws

    def write_hw_checkpoint(self) -> None:
        """Write the high-watermark checkpoint now (blocking), if anything changed."""
        hws = self._current_hws()
        if hws != self._written_hws:
            write_atomically(self._hw_checkpoint_path, _hw_checkpoint_bytes(hws))
            self._written_hws = hws

    def _current_hws(self) -> dict[PartitionKey, int]:
        return {key: p.high_watermark for key, p in self.manager.partitions.items()}


class LeaderFetcher:
    """Replicates every partition this node follows from one leader, over one connection."""

    def __init__(self, replicas: ReplicaManager, leader_id: int) -> None:
        self.replicas = replicas
        self.manager = replicas.manager
        self.settings = replicas.settings
        self.leader_id = leader_id
        self.assignments: dict[PartitionKey, FollowerAssignment] = {}
        self.cancel_scope = trio.CancelScope()
        self.fetch_rounds = 0  # visible for testing
        self._started = False
        self._changed = trio.Event()
        self._connection: KafkaConnection | None = None
        self._address: tuple[str, int] | None = None
        self._rotation = 0
        self._stale_answers = 0  # STALE_BROKER_EPOCH answers in a row

    def start(self, nursery: trio.Nursery) -> None:
        if not self._started:
            self._started = True
            nursery.start_soon(self.run)

    def stop(self) -> None:
        self.cancel_scope.cancel()

    def add(self, assignment: FollowerAssignment) -> None:
        self.assignments[assignment.key] = assignment
        self._wake()

    def remove(self, assignment: FollowerAssignment) -> None:
        if self.assignments.get(assignment.key) is assignment:
            del self.assignments[assignment.key]
            self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _current(self, assignment: FollowerAssignment) -> bool:
        return (self.assignments.get(assignment.key) is assignment
                and self.replicas.is_following(assignment))

    async def run(self) -> None:
        with self.cancel_scope:
            try:
                while True:
                    await self._run_once()
            finally:
                await self._disconnect()

    async def _run_once(self) -> None:
        if not self.assignments:
            await self._wait_changed(IDLE_WAIT_S)
            return
        connection = await self._connect()
        if connection is None:
            await trio.sleep(self.settings.fetch_backoff_ms / 1000)
            return
        try:
            await self._truncate_diverged(connection)
            await self._fetch(connection)
        except KafkaClientError as exc:
            log.warning("replica fetcher %d -> %d: %s; reconnecting", self.replicas.node_id,
                        self.leader_id, exc)
        except Exception:
            # A bug or a disk error must cost a retry, never the node.
            log.exception("replica fetcher %d -> %d failed; retrying", self.replicas.node_id,
                          self.leader_id)
        else:
            return
        await self._disconnect()
        await trio.sleep(self.settings.fetch_backoff_ms / 1000)

    async def _wait_changed(self, timeout_s: float) -> None:
        changed = self._changed
        with trio.move_on_after(timeout_s):
            await changed.wait()

    # --- connection ------------------------------------------------------------------------

    async def _connect(self) -> KafkaConnection | None:
        address = self.replicas.broker_address(self.leader_id)
        if address is None:
            log.warning("replica fetcher %d: leader %d has no registered address",
                        self.replicas.node_id, self.leader_id)
            return None
        if self._connection is not None and address == self._address:
            return self._connection
        await self._disconnect()
        try:
            self._connection = await KafkaConnection.connect(
                *address, client_id=f"raftlog-replica-{self.replicas.node_id}",
                timeout_s=self.settings.socket_timeout_ms / 1000, login=self.replicas.login)
        except KafkaClientError as exc:
            log.warning("replica fetcher %d: cannot reach leader %d at %s:%d: %s",
                        self.replicas.node_id, self.leader_id, *address, exc)
            return None
        self._address = address
        return self._connection

    async def _disconnect(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with trio.move_on_after(1) as cleanup:
                cleanup.shield = True
                await connection.aclose()

    async def _request(self, connection: KafkaConnection, api: Any, body: dict[str, Any],
                       version: int, extra_wait_s: float = 0.0) -> Any:
        return await connection.request(
            api, body, version=version,
            timeout_s=self.settings.socket_timeout_ms / 1000 + extra_wait_s)

    # --- epoch validation and truncation ---------------------------------------------------

    async def _truncate_diverged(self, connection: KafkaConnection) -> None:
        """OffsetForLeaderEpoch for every partition with a new leader epoch; truncate each to
        where its log and the leader's agree (Kafka's getOffsetTruncationState)."""
        while True:
            now = trio.current_time()
            pending = [a for a in self.assignments.values()
                       if a.needs_truncation and a.delayed_until <= now]
            asking = []
            for assignment in pending:
                partition = assignment.partition
                if partition.log.latest_epoch == UNDEFINED_EPOCH:
                    # No epochs (an empty log): nothing can have diverged beyond the HW.
                    if self._truncate(assignment, partition.high_watermark):
                        assignment.needs_truncation = False
                else:
                    asking.append(assignment)
            if not asking:
                return
            by_topic: dict[str, list[dict[str, int]]] = {}
            for assignment in asking:
                by_topic.setdefault(assignment.partition.topic, []).append({
                    "partition": assignment.partition.index,
                    "current_leader_epoch": assignment.leader_epoch,
                    "leader_epoch": assignment.partition.log.latest_epoch,
                })
            response = await self._request(connection, OFFSET_FOR_LEADER_EPOCH, {
                "replica_id": self.replicas.node_id,
                "topics": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
            }, OFFSET_FOR_LEADER_EPOCH_VERSION)
            sent = {a.key: a for a in asking}
            again = False
            for topic in response.topics:
                for result in topic.partitions:
                    answered = sent.get((topic.topic, result.partition))
                    if answered is None or not self._current(answered):
                        continue
                    again = self._apply_epoch_end(answered, result) or again
            if not again:
                return

    def _apply_epoch_end(self, assignment: FollowerAssignment, result: Any) -> bool:
        """Truncate per one OffsetForLeaderEpoch answer; True when another round is needed."""
        partition = assignment.partition
        if result.error_code != ErrorCode.NONE:
            self._back_off(assignment, result.error_code, "OffsetForLeaderEpoch")
            return False
        end = partition.log.log_end_offset
        leader_epoch, leader_end = result.leader_epoch, result.end_offset
        done = True
        if leader_end == UNDEFINED_EPOCH_OFFSET:
            target = partition.high_watermark
        elif leader_epoch == UNDEFINED_EPOCH:
            target = min(leader_end, end)
        else:
            own_epoch, own_end = partition.log.end_offset_for_epoch(leader_epoch)
            if own_end == UNDEFINED_EPOCH_OFFSET:
                target = min(leader_end, end)
            elif own_epoch != leader_epoch:
                # We never saw the leader's epoch: cut back to where our older one ends and
                # ask again with the epoch that is then our latest.
                target = min(own_end, end)
                done = False
            else:
                target = min(own_end, leader_end, end)
        if not self._truncate(assignment, target):
            return False  # backed off; validated again after the backoff
        if done or partition.log.latest_epoch == UNDEFINED_EPOCH:
            assignment.needs_truncation = False
            return False
        return True

    def _truncate(self, assignment: FollowerAssignment, offset: int) -> bool:
        """Cut the log back to ``offset``; False (the partition backed off, still needing
        truncation) when its log is offline after an I/O error."""
        partition = assignment.partition
        log_ = partition.log
        if offset >= log_.log_end_offset:
            return True
        log.info("partition %s-%d: truncating from %d to %d (leader %d, epoch %d)",
                 partition.topic, partition.index, log_.log_end_offset, offset,
                 assignment.leader_id, assignment.leader_epoch)
        try:
            if offset < log_.log_start_offset:
                partition.reset_to(offset)
            else:
                partition.truncate_to(offset)
        except KafkaStorageError as exc:
            self._back_off_offline(assignment, "truncate", exc)
            return False
        self.manager.note_role_change(partition)
        return True

    def _back_off_offline(self, assignment: FollowerAssignment, operation: str,
                          exc: KafkaStorageError) -> None:
        """The partition's log is offline (a restart recovers it): log it and retry only
        after the backoff, so an offline partition neither spins nor stalls the others."""
        partition = assignment.partition
        log.warning("partition %s-%d: cannot %s: %s; retrying after %d ms", partition.topic,
                    partition.index, operation, exc, self.settings.fetch_backoff_ms)
        assignment.delayed_until = trio.current_time() + self.settings.fetch_backoff_ms / 1000

    # --- fetching --------------------------------------------------------------------------

    async def _fetch(self, connection: KafkaConnection) -> None:
        now = trio.current_time()
        ready = [a for a in self.assignments.values()
                 if not a.needs_truncation and a.delayed_until <= now]
        if not ready:
            if any(a.needs_truncation and a.delayed_until <= now
                   for a in self.assignments.values()):
                return  # added while we were busy: validate its epoch first
            delays = [a.delayed_until for a in self.assignments.values()
                      if a.delayed_until > now]
            await self._wait_changed(min(delays, default=now + IDLE_WAIT_S) - now)
            return
        self._rotation = (self._rotation + 1) % len(ready)
        ready = ready[self._rotation:] + ready[:self._rotation]  # fairness under max_bytes
        by_topic: dict[str, list[dict[str, int]]] = {}
        for assignment in ready:
            partition = assignment.partition
            by_topic.setdefault(partition.topic, []).append({
                "partition": partition.index,
                "current_leader_epoch": assignment.leader_epoch,
                "fetch_offset": partition.log.log_end_offset,
                "log_start_offset": partition.log.log_start_offset,
                "partition_max_bytes": self.settings.fetch_max_bytes,
            })
        wait_s = self.settings.fetch_wait_max_ms / 1000
        response = await self._request(connection, FETCH, {
            "replica_id": self.replicas.node_id,
            "max_wait_ms": self.settings.fetch_wait_max_ms,
            "min_bytes": self.settings.fetch_min_bytes,
            "max_bytes": self.settings.fetch_response_max_bytes,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
            "forgotten_topics_data": [],
            "rack_id": "",
        }, FETCH_VERSION, extra_wait_s=wait_s)
        self.fetch_rounds += 1
        if response.error_code != ErrorCode.NONE:
            for assignment in ready:
                self._back_off(assignment, response.error_code, "Fetch")
            return
        sent = {a.key: a for a in ready}
        appended: list[tuple[FollowerAssignment, int, int, int]] = []
        out_of_range: list[FollowerAssignment] = []
        stale_epoch = False
        for topic in response.responses:
            for result in topic.partitions:
                answered = sent.get((topic.topic, result.partition_index))
                if answered is None or not self._current(answered):
                    continue
                stale_epoch = stale_epoch or result.error_code == ErrorCode.STALE_BROKER_EPOCH
                if result.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
                    out_of_range.append(answered)
                elif result.error_code == ErrorCode.STALE_BROKER_EPOCH:
                    answered.delayed_until = trio.current_time() + min(
                        STALE_EPOCH_RETRY_S * 2 ** min(self._stale_answers, 10),
                        self.settings.fetch_backoff_ms / 1000)
                elif result.error_code != ErrorCode.NONE:
                    self._back_off(answered, result.error_code, "Fetch")
                elif self._append(answered, result.records):
                    appended.append((answered, answered.partition.log.log_end_offset,
                                     result.high_watermark, result.log_start_offset))
        await self._sync_and_advance(appended)
        self._stale_answers = self._stale_answers + 1 if stale_epoch else 0
        if stale_epoch:
            # The connection authenticated with a broker epoch the leader does not hold as
            # ours (KIP-903): a new connection claims the epoch our image has now.
            log.info("replica fetcher %d: leader %d holds another broker epoch for us;"
                     " reconnecting", self.replicas.node_id, self.leader_id)
            await self._disconnect()
            return
        for assignment in out_of_range:
            if self._current(assignment):
                await self._handle_out_of_range(connection, assignment)

    def _append(self, assignment: FollowerAssignment, records: memoryview | None) -> bool:
        """Append a fetch answer's batches; False after an error (the partition backs off)."""
        partition = assignment.partition
        data = _whole_batches(records)
        if not data:
            return True  # nothing new: still learn the leader's HW
        try:
            partition.append(data, AppendOrigin.REPLICATION)
        except UnexpectedOffsetError as exc:
            log.warning("partition %s-%d: %s; validating the epoch again", partition.topic,
                        partition.index, exc)
            assignment.needs_truncation = True
            return False
        except (PartitionLogError, OSError) as exc:
            log.error("partition %s-%d: cannot append replicated batches: %s",
                      partition.topic, partition.index, exc)
            assignment.delayed_until = trio.current_time() + self.settings.fetch_backoff_ms / 1000
            return False
        return True

    async def _sync_and_advance(
            self, appended: list[tuple[FollowerAssignment, int, int, int]]) -> None:
        """fsync what was appended (one group-commit round covers all of them), then set
        each HW to min(leader HW, own end): only then may the next fetch report the end.
        Then follow the leader's log start offset (DeleteRecords, retention)."""
        timeout_s = self.settings.socket_timeout_ms / 1000
        for assignment, end_offset, leader_high_watermark, leader_start in appended:
            partition = assignment.partition
            if partition.durable_acks:
                while not await partition.wait_flushed(end_offset,
                                                       trio.current_time() + timeout_s):
                    if not self._current(assignment):
                        break
                    log.warning("partition %s-%d: still waiting for fsync to offset %d",
                                partition.topic, partition.index, end_offset)
            if self._current(assignment):
                self.manager.set_follower_high_watermark(partition, leader_high_watermark)
                self._follow_log_start(assignment, leader_start)

    def _follow_log_start(self, assignment: FollowerAssignment, leader_start: int) -> None:
        """Kafka's ReplicaFetcherThread ``maybeIncrementLogStartOffset``: advance to the
        leader's log start, capped at our HW (UnifiedLog refuses a start past it), so the
        next Fetch reports it and the leader's DeleteRecords can complete. Synchronous, on
        the event loop (``Partition.move_log_start_offset``: the checkpoint's fsyncs and a
        directory fsync after any unlinks; no await, so no cancellation or role change can
        interleave). A failure changes nothing (the retry writes the checkpoint again) and
        backs the partition off (the leader answers a follower whose reported start is
        behind at once, so retrying without a pause would spin)."""
        partition = assignment.partition
        target = min(leader_start, partition.high_watermark)
        if target <= partition.log.log_start_offset:
            return
        try:
            if partition.move_log_start_offset(target):
                log.info("partition %s-%d: log start offset advanced to %d (the leader's)",
                         partition.topic, partition.index, target)
        except (PartitionLogError, OSError) as exc:  # retried after the backoff
            log.warning("partition %s-%d: cannot advance the log start offset to %d: %s",
                        partition.topic, partition.index, target, exc)
            assignment.delayed_until = trio.current_time() + self.settings.fetch_backoff_ms / 1000

    async def _handle_out_of_range(self, connection: KafkaConnection,
                                   assignment: FollowerAssignment) -> None:
        """Kafka's handleOutOfRangeError: our end is past the leader's (validate the epoch
        again) or below its log start (start over at the leader's log start)."""
        partition = assignment.partition
        latest = await self._list_offset(connection, assignment, LATEST_TIMESTAMP)
        earliest = await self._list_offset(connection, assignment, EARLIEST_TIMESTAMP)
        if latest is None or earliest is None or not self._current(assignment):
            return
        end = partition.log.log_end_offset
        if latest < end:
            assignment.needs_truncation = True
        elif earliest > end:
            log.warning("partition %s-%d: log end %d is below the leader's log start %d; "
                        "starting over there", partition.topic, partition.index, end, earliest)
            try:
                partition.reset_to(earliest)
            except KafkaStorageError as exc:
                self._back_off_offline(assignment, f"restart the log at {earliest}", exc)
                return
            self.manager.note_role_change(partition)
        else:  # in range again (retention or an append raced the fetch): retry shortly
            assignment.delayed_until = trio.current_time() + self.settings.fetch_backoff_ms / 1000

    async def _list_offset(self, connection: KafkaConnection, assignment: FollowerAssignment,
                           timestamp: int) -> int | None:
        partition = assignment.partition
        response = await self._request(connection, LIST_OFFSETS, {
            "replica_id": self.replicas.node_id,
            "isolation_level": 0,
            "topics": [{"name": partition.topic, "partitions": [{
                "partition_index": partition.index,
                "current_leader_epoch": assignment.leader_epoch,
                "timestamp": timestamp}]}],
        }, LIST_OFFSETS_VERSION)
        result = response.topics[0].partitions[0]
        if result.error_code != ErrorCode.NONE:
            self._back_off(assignment, result.error_code, "ListOffsets")
            return None
        offset: int = result.offset
        return offset

    def _back_off(self, assignment: FollowerAssignment, error_code: int, api: str) -> None:
        partition = assignment.partition
        name = _error_name(error_code)
        level = logging.INFO if error_code in _METADATA_ERRORS else logging.WARNING
        log.log(level, "partition %s-%d: %s from leader %d answered %s; backing off",
                partition.topic, partition.index, api, self.leader_id, name)
        assignment.delayed_until = trio.current_time() + self.settings.fetch_backoff_ms / 1000


def _error_name(error_code: int) -> str:
    try:
        return ErrorCode(error_code).name
    except ValueError:
        return f"error {error_code}"


def _whole_batches(records: memoryview | bytes | None) -> memoryview:
    """The complete batches at the start of ``records`` (a leader may cut the last one)."""
    if records is None:
        return memoryview(b"")
    view = memoryview(records)
    position = 0
    while len(view) - position >= RECORD_BATCH_OVERHEAD:
        batch_length = int.from_bytes(view[position + BATCH_LENGTH_OFFSET:position + LOG_OVERHEAD],
                                      "big", signed=True)
        size = batch_length + LOG_OVERHEAD
        if batch_length <= 0 or position + size > len(view):
            break
        position += size
    return view[:position]


def _hw_checkpoint_bytes(hws: Mapping[PartitionKey, int]) -> bytes:
    lines = ["0", str(len(hws))]
    lines += [f"{topic} {index} {hw}" for (topic, index), hw in sorted(hws.items())]
    return ("\n".join(lines) + "\n").encode()


def _read_hw_checkpoint(path: Path) -> dict[PartitionKey, int]:
    """Kafka's replication-offset-checkpoint: ``0``, a count, then ``topic partition hw``
    lines (topic names never contain spaces). Unreadable files count as empty."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        log.warning("cannot read %s: %s", path, exc)
        return {}
    hws: dict[PartitionKey, int] = {}
    if len(lines) < 2 or lines[0] != "0" or not lines[1].isdigit() \
            or len(lines) != 2 + int(lines[1]):
        log.warning("%s is unreadable; ignoring it", path)
        return {}
    for line in lines[2:]:
        fields = line.split(" ")
        if len(fields) != 3 or not fields[1].isdigit() or not fields[2].isdigit():
            log.warning("%s is unreadable; ignoring it", path)
            return {}
        hws[(fields[0], int(fields[1]))] = int(fields[2])
    return hws
