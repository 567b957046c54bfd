"""The leader side of replication: follower positions, the ISR and AlterPartition.

* ``record_follower_fetch``: a follower's fetch (served by ``FetchApis.fetch``) moves its
  position, maybe the high watermark, and maybe asks to expand the ISR.
* the ISR check task (Kafka's isr-expiration): shrink a follower not caught up within
  ``replica.lag.time.max.ms``, expand one whose end reached the HW, through the injected
  ``alter_isr`` (the AlterPartition RPC); the HW uses the maximal ISR until the outcome is
  known (``raftlog.partition.replica_state``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from raftlog.log_budget import LogBudget
from raftlog.metadata import errors as metadata_errors
from raftlog.metadata.image import PartitionImage
from raftlog.metrics.recorders import Counter
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import Partition, now_ms
from raftlog.partition.replica_state import LeaderState, PendingIsr
from raftlog.protocol.errors import ErrorCode
from raftlog.replication.settings import ReplicationSettings

__all__ = ["AlterIsr", "IsrManager", "IsrStats"]

log = logging.getLogger(__name__)

# alter_isr(topic, partition, new_isr, leader_epoch, partition_epoch) sends AlterPartition for
# one partition: ``partition_epoch`` is the committed epoch the change is based on (the
# controller compare-and-sets it). Returns (Kafka error code, the partition as committed, or
# None when the answer does not carry it). Raising (or timing out) means "outcome unknown".
AlterIsr = Callable[
    [str, int, tuple[int, ...], int, int], Awaitable[tuple[int, PartitionImage | None]]
]

# The controller refused the change for certain, and our view is not merely stale.
# OPERATION_NOT_ATTEMPTED is what it answers for a fenced or shutting-down replica (Kafka's
# answer before AlterPartition v3; INELIGIBLE_REPLICA after): nothing was applied, so Kafka's
# Partition.handleAlterPartitionError reverts to the committed state too.
_DEFINITIVE_ALTER_ERRORS = frozenset({
    metadata_errors.INELIGIBLE_REPLICA,
    int(ErrorCode.OPERATION_NOT_ATTEMPTED),
    metadata_errors.INVALID_REQUEST,
    metadata_errors.NOT_CONTROLLER,
    metadata_errors.UNKNOWN_TOPIC_OR_PARTITION,
    metadata_errors.FENCED_LEADER_EPOCH,
    metadata_errors.UNKNOWN_TOPIC_ID,
})


class IsrStats:
    """ISR changes of partitions this node leads that the controller committed (Kafka's
    ReplicaManager IsrShrinksPerSec / IsrExpandsPerSec), read by ``raftlog.observe``."""

    __slots__ = ("expands", "shrinks")

    def __init__(self) -> None:
        self.shrinks = Counter()
        self.expands = Counter()


class IsrManager:
    """Follower positions and ISR changes of the partitions this node leads. ``run`` (in
    the replica manager's nursery) runs the ISR checks and the AlterPartition requests; until
    it runs, nothing is sent."""

    def __init__(self, manager: PartitionManager, node_id: int, settings: ReplicationSettings,
                 alter_isr: AlterIsr | None, is_eligible: Callable[[int], bool],
                 registered_epoch: Callable[[int], int | None] = lambda _: None) -> None:
        self.manager = manager
        self.node_id = node_id
        self.settings = settings
        self.alter_isr = alter_isr
        self.is_eligible = is_eligible
        self.registered_epoch = registered_epoch  # a broker's epoch in the metadata now
        self.stats = IsrStats()
        self._nursery: trio.Nursery | None = None
        # (topic, partition, leader epoch) of resignations sent, and of lone corrupt leaders.
        self._resigning: set[tuple[str, int, int]] = set()
        self._alone_logged: set[tuple[str, int, int]] = set()
        # One unanswered AlterPartition request fails up to 200 partitions at once (and a
        # slow controller all of them, again and again): a few lines, then a count.
        self._failure_lines = LogBudget(log, "AlterPartition failure lines")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """The ISR checks and the AlterPartition requests, until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await self._run_isr_checks()
        finally:
            self._nursery = None

    # --- the leader side of follower fetches -----------------------------------------------

    def record_follower_fetch(self, partition: Partition, replica_id: int,
                              fetch_offset: int, log_start_offset: int = -1,
                              broker_epoch: int = -1) -> bool:
        """A follower fetched from ``fetch_offset`` reporting its ``log_start_offset``, over a
        connection authenticated at ``broker_epoch`` (the leader checked leadership, epoch,
        range and that the broker epoch is the registered one). Updates its position, maybe the HW,
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
                                  log_start_offset, broker_epoch):
            return False
        if follower is not None and follower.log_start_offset != start_before:
            partition.notify_changed()
        if partition.trace is not None:
            partition.trace.fetched(replica_id, fetch_offset)
        self.manager.update_high_watermark(partition)
        if replica_id not in state.isr or fetch_offset < partition.high_watermark:
            self.maybe_change_isr(partition, now)  # joining, or fell below the HW: shrink
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
            if partition.is_leader and partition.corrupt_offset is not None:
                self.resign(partition)  # retried until another ISR member leads
            elif partition.is_leader and partition.leader_state is not None:
                self.maybe_change_isr(partition, now)
                self.manager.update_high_watermark(partition)

    def resign(self, partition: Partition) -> None:
        """This leader's log holds a corrupt batch (``log_verify``): ask the controller to take
        it out of the ISR, which elects the first other ISR member (AlterPartition without the
        leader; raftlog's extension, see ``ControllerCore.alter_partition``). Once a follower,
        it truncates the batch and fetches the good copy. Alone in the ISR it keeps leading:
        it is the only copy there is, served up to the bad batch."""
        state = partition.leader_state
        if state is None or self.alter_isr is None or self._nursery is None:
            return
        others = tuple(r for r in state.isr if r != self.node_id and self.is_eligible(r))
        key = (partition.topic, partition.index, state.leader_epoch)
        if not others:
            if key not in self._alone_logged:
                self._alone_logged.add(key)
                log.error("partition %s-%d: the corrupt batch at offset %s has no good copy in "
                          "the ISR %s; still leading, serving the data before it",
                          partition.topic, partition.index, partition.corrupt_offset,
                          list(state.isr))
            return
        if key in self._resigning:
            return
        self._resigning.add(key)
        log.warning("partition %s-%d: corrupt batch at offset %s: asking the controller to "
                    "move leadership to the ISR %s", partition.topic, partition.index,
                    partition.corrupt_offset, list(others))
        self._nursery.start_soon(self._send_resignation, partition, state, others, key)

    async def _send_resignation(self, partition: Partition, state: LeaderState,
                                isr: tuple[int, ...], key: tuple[str, int, int]) -> None:
        assert self.alter_isr is not None
        try:
            with trio.fail_after(self.settings.alter_isr_timeout_ms / 1000):
                error, _ = await self.alter_isr(partition.topic, partition.index, isr,
                                                state.leader_epoch, state.partition_epoch)
        except Exception as exc:  # trio.TooSlowError included: the ISR check retries
            log.warning("partition %s-%d: AlterPartition (resign) failed: %r", partition.topic,
                        partition.index, exc)
            error = -1
        if error != ErrorCode.NONE:
            if error != -1:
                log.info("partition %s-%d: AlterPartition (resign) refused: %s",
                         partition.topic, partition.index, metadata_errors.error_name(error))
            await trio.sleep(self.settings.alter_isr_retry_backoff_ms / 1000)
            self._resigning.discard(key)  # the ISR check asks again

    def maybe_change_isr(self, partition: Partition, now: int) -> None:
        state = partition.leader_state
        if state is None or self.alter_isr is None or self._nursery is None:
            return
        settings = self.settings
        if not state.can_send_change(now, settings.alter_isr_retry_backoff_ms,
                                     settings.alter_isr_timeout_ms):
            return
        proposed = state.proposed_isr(partition.log.log_end_offset, partition.high_watermark,
                                      now, partition.replica_lag_time_max_ms, self.is_eligible,
                                      self.registered_epoch)
        if proposed is None:
            if state.pending is None:
                return
            proposed = state.isr  # settle a failed change whose outcome is unknown
        # A shrink or an expansion of the committed ISR (a retry that settles a change whose
        # outcome is unknown proposes the committed ISR itself: neither).
        growth = len(proposed) - len(state.isr)
        pending = state.begin_change(proposed, now)
        log.info("partition %s-%d: asking to change the ISR %s -> %s (partition epoch %d)",
                 partition.topic, partition.index, list(state.isr), list(proposed),
                 pending.partition_epoch)
        self._nursery.start_soon(self._send_alter_isr, partition, state, pending, growth)

    async def _send_alter_isr(self, partition: Partition, state: LeaderState,
                              pending: PendingIsr, growth: int = 0) -> None:
        assert self.alter_isr is not None
        try:
            with trio.fail_after(self.settings.alter_isr_timeout_ms / 1000):
                error, committed = await self.alter_isr(
                    partition.topic, partition.index, pending.proposed, state.leader_epoch,
                    pending.partition_epoch)
        except Exception as exc:  # trio.TooSlowError included: the outcome is unknown
            self._failure_lines.log(logging.WARNING, "partition %s-%d: AlterPartition failed:"
                                    " %r", partition.topic, partition.index, exc)
            state.change_failed(pending, now_ms(), definitive=False)
            return
        if partition.leader_state is not state:
            return  # no longer leading this epoch; metadata has taken over
        if error == ErrorCode.NONE:
            if growth < 0:
                self.stats.shrinks.inc()
            elif growth > 0:
                self.stats.expands.inc()
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
