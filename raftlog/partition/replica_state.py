"""Leader-side replication state of one partition: follower positions, the ISR, the HW rule.

Pure and synchronous (time is passed in), so every rule here is unit-testable without trio.
It follows Kafka's ``Partition`` / ``Replica`` (KIP-497 AlterPartition):

* a follower's log end offset is the fetch offset of its latest fetch (followers fsync before
  fetching again, so it is durable); ``last_caught_up_ms`` moves as in Kafka's
  ``Replica.updateFetchStateOrThrow``: to now when it fetched at the leader's log end, else to
  the time of its previous fetch if it has reached the leader's log end as of that fetch;
* the ISR the controller committed is ``isr``; while an AlterPartition is in flight the
  proposed one is ``pending``, and the high watermark uses the *maximal* ISR (their union:
  the expanded set while expanding, the old set while shrinking), so a change the controller
  may or may not have applied can never let the HW pass a replica that might lead next;
* HW = min(the leader's own durable end, LEO of every maximal-ISR member, and of caught-up
  eligible replicas about to join); it never moves backwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["FollowerState", "LeaderState", "PendingIsr"]

UNKNOWN_OFFSET = -1


@dataclass(slots=True)
class FollowerState:
    """What the leader knows about one follower during the current leader epoch."""

    log_end_offset: int = UNKNOWN_OFFSET  # unknown until its first fetch in this epoch
    last_caught_up_ms: int = 0
    last_fetch_ms: int = 0
    last_fetch_leader_end_offset: int = 0
    # Its log start offset, from the ``log_start_offset`` of its Fetch requests (v5+):
    # DeleteRecords answers once every live replica's has reached the requested offset.
    log_start_offset: int = UNKNOWN_OFFSET
    # The broker epoch its fetches were authenticated with (KIP-903; -1: not known). A follower
    # that registered again (a restart) is a new incarnation: its position from before says
    # nothing about the log it has now (it may have lost or dropped data since).
    broker_epoch: int = -1

    def is_caught_up(self, leader_end_offset: int, now_ms: int, lag_time_max_ms: int) -> bool:
        """Kafka's ``ReplicaState.isCaughtUp``."""
        return (
            self.log_end_offset == leader_end_offset
            or now_ms - self.last_caught_up_ms <= lag_time_max_ms
        )


@dataclass(frozen=True, slots=True)
class PendingIsr:
    """An ISR change sent to the controller and not yet seen committed.

    ``partition_epoch`` is the committed epoch the request was based on: metadata carrying a
    newer one resolves it. ``maximal`` is the union of the committed ISR and every proposal
    whose outcome is not yet known (a retry after a timeout keeps the earlier proposal in).
    ``failed_at_ms`` is set once the request failed or timed out: the change may be retried.
    ``ambiguous``: some attempt may have been applied by the controller without our knowing.
    """

    proposed: tuple[int, ...]
    partition_epoch: int
    maximal: tuple[int, ...]
    sent_at_ms: int
    failed_at_ms: int | None = None
    ambiguous: bool = False


class LeaderState:
    """Follower positions and ISR of a partition this node leads, for one leader epoch."""

    def __init__(
        self,
        *,
        node_id: int,
        replicas: Iterable[int],
        isr: Iterable[int],
        leader_epoch: int,
        partition_epoch: int,
        epoch_start_offset: int,
        now_ms: int,
    ) -> None:
        self.node_id = node_id
        self.leader_epoch = leader_epoch
        self.epoch_start_offset = epoch_start_offset  # the LEO when this epoch began
        self.started_ms = now_ms  # when this leadership began (the metrics' lag floor)
        self.isr: tuple[int, ...] = tuple(isr)
        self.partition_epoch = partition_epoch
        self.pending: PendingIsr | None = None
        self.replicas: tuple[int, ...] = ()
        self.followers: dict[int, FollowerState] = {}
        self.update_replicas(replicas, now_ms)

    # --- membership ------------------------------------------------------------------------

    def update_replicas(self, replicas: Iterable[int], now_ms: int) -> None:
        """Track the assigned replicas; a new follower that is in the ISR counts as caught up
        now (Kafka's resetReplicaState), others as never."""
        self.replicas = tuple(replicas)
        wanted = [r for r in self.replicas if r != self.node_id]
        self.followers = {
            r: self.followers.get(r) or FollowerState(
                last_caught_up_ms=now_ms if r in self.isr else 0)
            for r in wanted
        }

    def update_isr(self, isr: Iterable[int], partition_epoch: int) -> bool:
        """Adopt a committed ISR (from metadata or an AlterPartition answer) if it is newer.
        Clears the pending change it resolves. Returns True when anything changed."""
        if partition_epoch < self.partition_epoch:
            return False
        changed = partition_epoch > self.partition_epoch or tuple(isr) != self.isr
        self.isr = tuple(isr)
        self.partition_epoch = partition_epoch
        if self.pending is not None and partition_epoch > self.pending.partition_epoch:
            self.pending = None
            changed = True
        return changed

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        if self.pending is None:
            return self.isr
        return self.isr + tuple(r for r in self.pending.maximal if r not in self.isr)

    # --- follower fetches ------------------------------------------------------------------

    def record_fetch(
        self, replica: int, fetch_offset: int, leader_end_offset: int, now_ms: int,
        log_start_offset: int = UNKNOWN_OFFSET, broker_epoch: int = -1,
    ) -> bool:
        """A follower fetched from ``fetch_offset`` while the leader's log ended at
        ``leader_end_offset``, reporting its own ``log_start_offset`` (-1: not reported).
        False for a replica that is not assigned."""
        state = self.followers.get(replica)
        if state is None:
            return False
        if log_start_offset >= 0:
            state.log_start_offset = log_start_offset
        state.broker_epoch = broker_epoch
        if fetch_offset >= leader_end_offset:
            state.last_caught_up_ms = max(state.last_caught_up_ms, now_ms)
        elif fetch_offset >= state.last_fetch_leader_end_offset:
            state.last_caught_up_ms = max(state.last_caught_up_ms, state.last_fetch_ms)
        state.log_end_offset = fetch_offset
        state.last_fetch_leader_end_offset = max(
            leader_end_offset, state.last_fetch_leader_end_offset)
        state.last_fetch_ms = now_ms
        return True

    # --- the low watermark (DeleteRecords) ---------------------------------------------------

    def low_watermark(self, local_start_offset: int, is_alive: Callable[[int], bool]) -> int:
        """Kafka's ``Partition.lowWatermarkIfLeader``: the minimum log start offset of the
        leader and of every assigned follower on a live (registered, unfenced) broker, in or
        out of the ISR; -1 while such a follower has not reported one in this epoch."""
        low = local_start_offset
        for replica, state in self.followers.items():
            if is_alive(replica):
                low = min(low, state.log_start_offset)
        return low

    # --- the high watermark ----------------------------------------------------------------

    def high_watermark_candidate(
        self,
        local_end_offset: int,
        leader_end_offset: int,
        now_ms: int,
        lag_time_max_ms: int,
        is_eligible: Callable[[int], bool],
    ) -> int:
        """Kafka's maybeIncrementLeaderHW: the minimum of the leader's own durable end and the
        LEO of every maximal-ISR follower and of every caught-up eligible follower that is
        about to join (so joining cannot let the HW pass a future ISR member)."""
        candidate = local_end_offset
        maximal = self.maximal_isr
        for replica, state in self.followers.items():
            if state.log_end_offset >= candidate:
                continue
            if replica in maximal or (
                state.is_caught_up(leader_end_offset, now_ms, lag_time_max_ms)
                and is_eligible(replica)
            ):
                candidate = state.log_end_offset
        return candidate

    # --- ISR changes -----------------------------------------------------------------------

    def out_of_sync(
        self, leader_end_offset: int, now_ms: int, lag_time_max_ms: int,
        high_watermark: int | None = None,
    ) -> list[int]:
        """Committed ISR followers that have not caught up within the lag time, or whose log
        end fell below ``high_watermark``: it lacks committed data (a follower that found a
        corrupt batch reports its offset, ``LeaderFetcher._drop_corrupt``), so it must not
        stay eligible to lead."""
        return [
            replica for replica in self.isr
            if replica != self.node_id and (state := self.followers.get(replica)) is not None
            and (not state.is_caught_up(leader_end_offset, now_ms, lag_time_max_ms)
                 or UNKNOWN_OFFSET < state.log_end_offset < (high_watermark or 0))
        ]

    def in_sync_outside_isr(
        self, high_watermark: int, is_eligible: Callable[[int], bool],
        registered_epoch: Callable[[int], int | None] = lambda _: None,
    ) -> list[int]:
        """Followers outside the committed ISR whose LEO has reached the HW and this epoch's
        start offset (Kafka's isFollowerInSync), in replica order. The LEO must come from a
        fetch in the broker epoch the metadata has registered now (``registered_epoch``; None:
        not checked), as Kafka's KIP-903 ISR rule: a follower restarted with a damaged or
        shorter log must not be added back on the position it reported before."""
        return [
            replica for replica, state in self.followers.items()
            if replica not in self.isr
            and state.log_end_offset >= high_watermark
            and state.log_end_offset >= self.epoch_start_offset
            and is_eligible(replica)
            and registered_epoch(replica) in (None, state.broker_epoch)
        ]

    def proposed_isr(
        self,
        leader_end_offset: int,
        high_watermark: int,
        now_ms: int,
        lag_time_max_ms: int,
        is_eligible: Callable[[int], bool],
        registered_epoch: Callable[[int], int | None] = lambda _: None,
    ) -> tuple[int, ...] | None:
        """The ISR to ask for now, or None: one change at a time, shrink first (as Kafka's
        isr-expiration task and fetch path do). The leader always stays in."""
        lagging = self.out_of_sync(leader_end_offset, now_ms, lag_time_max_ms, high_watermark)
        if lagging:
            return tuple(r for r in self.isr if r not in lagging)
        joining = self.in_sync_outside_isr(high_watermark, is_eligible, registered_epoch)
        if joining:
            members = set(self.isr) | set(joining)
            ordered = [r for r in self.replicas if r in members]
            return tuple(ordered + [r for r in self.isr if r not in ordered])
        return None

    def can_send_change(self, now_ms: int, retry_backoff_ms: int, timeout_ms: int) -> bool:
        """No change in flight, or the last one failed at least ``retry_backoff_ms`` ago, or
        it was sent ``timeout_ms`` ago and metadata never showed its outcome."""
        pending = self.pending
        if pending is None:
            return True
        if pending.failed_at_ms is not None:
            return now_ms - pending.failed_at_ms >= retry_backoff_ms
        return now_ms - pending.sent_at_ms >= timeout_ms

    def begin_change(self, proposed: tuple[int, ...], now_ms: int) -> PendingIsr:
        """Record an AlterPartition about to be sent; the HW now uses the maximal ISR."""
        assert self.node_id in proposed, "the leader never leaves its own ISR"
        previous = self.pending
        maximal = list(self.isr)
        earlier = () if previous is None else previous.maximal
        for replica in (*proposed, *earlier):
            if replica not in maximal:
                maximal.append(replica)
        self.pending = PendingIsr(
            proposed=proposed,
            partition_epoch=self.partition_epoch,
            maximal=tuple(maximal),
            sent_at_ms=now_ms,
            ambiguous=previous is not None and previous.ambiguous,
        )
        return self.pending

    def change_accepted(self, pending: PendingIsr) -> None:
        """The controller applied ``pending`` but did not say how: wait for metadata (or the
        change timeout) with the maximal ISR in force."""
        if self.pending is pending:
            self.pending = PendingIsr(
                proposed=pending.proposed,
                partition_epoch=pending.partition_epoch,
                maximal=pending.maximal,
                sent_at_ms=pending.sent_at_ms,
                ambiguous=True,
            )

    def change_failed(self, pending: PendingIsr, now_ms: int, *, definitive: bool) -> None:
        """The request for ``pending`` failed. ``definitive``: the controller rejected it, so
        if no earlier attempt is in doubt the committed ISR alone is in force again."""
        if self.pending is not pending:
            return  # already resolved by metadata, or superseded
        if definitive and not pending.ambiguous:
            self.pending = None
            return
        self.pending = PendingIsr(
            proposed=pending.proposed,
            partition_epoch=pending.partition_epoch,
            maximal=pending.maximal,
            sent_at_ms=pending.sent_at_ms,
            failed_at_ms=now_ms,
            ambiguous=pending.ambiguous or not definitive,
        )
