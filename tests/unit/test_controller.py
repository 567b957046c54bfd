"""The controller core: liveness, fencing, elections, AlterPartition, rebalancing, placement.

Every test drives the pure core with an explicit clock and applies its proposals through the
real state machine, so the records it produces are also checked to be acceptable in log order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pytest

from raftlog.controller.core import (
    DUPLICATE_BROKER_REGISTRATION,
    INCONSISTENT_CLUSTER_ID,
    OPERATION_NOT_ATTEMPTED,
    STALE_BROKER_EPOCH,
    AlterPartitionRequest,
    ControllerCore,
    ControllerSettings,
    Heartbeat,
    Proposal,
    Registration,
    elect,
    plan_partition,
)
from raftlog.metadata import errors
from raftlog.metadata.image import NO_LEADER, MetadataImage, PartitionImage
from raftlog.metadata.placement import PlacementError
from raftlog.metadata.records import (
    AlterConfigs,
    FenceBroker,
    PartitionChange,
    ProducerIdBlock,
    RegisterBroker,
    UnfenceBroker,
)
from raftlog.metadata.state import RESOURCE_TYPE_TOPIC, ApplyResult
from raftlog.metadata.testing import MachineDriver

SESSION_MS = 1000
REBALANCE_MS = 5000
TICK_MS = 100


def settings(**overrides: object) -> ControllerSettings:
    values: dict[str, object] = {
        "node_id": 1,
        "session_timeout_ms": SESSION_MS,
        "rebalance_interval_ms": REBALANCE_MS,
    }
    values.update(overrides)
    return ControllerSettings(**values)  # type: ignore[arg-type]


class Cluster:
    """A state machine with brokers 1..n and a controller core over it."""

    def __init__(self, brokers: Sequence[int] = (1, 2, 3), **overrides: object) -> None:
        self.driver = MachineDriver()
        self.driver.bootstrap(brokers)
        self.now = 0
        self.core = ControllerCore(settings(**overrides), self.image, self.now)

    @property
    def image(self) -> MetadataImage:
        return self.driver.machine.image

    def apply(self, proposals: Iterable[Proposal]) -> list[ApplyResult]:
        results = []
        for proposal in proposals:
            results.append(
                self.driver.apply(proposal.record, expected_version=proposal.expected_version)
            )
        return results

    def apply_ok(self, proposals: Iterable[Proposal]) -> None:
        for result in self.apply(proposals):
            assert result.ok, result

    def tick(self, advance_ms: int = 0) -> list[Proposal]:
        """Advance the clock in steps of at most TICK_MS, ticking (as the service does)."""
        target = self.now + advance_ms
        proposals: list[Proposal] = []
        while True:
            self.now = min(self.now + TICK_MS, target)
            step = self.core.tick(self.image, self.now)
            self.apply_ok(step)
            proposals.extend(step)
            if self.now == target:
                return proposals

    def run(self, advance_ms: int, alive: Iterable[int] = ()) -> list[Proposal]:
        """Advance the clock in ticks; brokers in ``alive`` heartbeat before every tick."""
        alive = tuple(alive)
        target = self.now + advance_ms
        proposals: list[Proposal] = []
        while self.now < target:
            for node_id in alive:
                self.heartbeat(node_id)
            proposals.extend(self.tick(min(TICK_MS, target - self.now)))
        return proposals

    def heartbeat(self, node_id: int, *, offset: int | None = None,
                  shut_down: bool = False, fence: bool = False) -> Heartbeat:
        broker = self.image.brokers[node_id]
        request = Heartbeat(node_id, broker.epoch,
                            self.image.version if offset is None else offset,
                            want_fence=fence, want_shut_down=shut_down)
        decision = self.core.heartbeat(self.image, request, self.now)
        assert decision.ok, decision
        self.apply_ok(decision.proposals)
        return request

    def heartbeat_all(self, nodes: Iterable[int]) -> None:
        for node_id in nodes:
            self.heartbeat(node_id)

    def partition(self, topic: str = "t", index: int = 0) -> PartitionImage:
        partition = self.image.partition(topic, index)
        assert partition is not None
        return partition

    def create(self, topic: str, *replicas: tuple[int, ...]) -> None:
        assert self.driver.create_topic(topic, replicas).ok

    def register(self, node_id: int, incarnation: str) -> ApplyResult:
        decision = self.core.register(
            self.image, Registration(node_id, incarnation, "127.0.0.1", 9092 + node_id),
            self.now,
        )  # fmt: skip
        assert decision.ok, decision
        *leaves, result = self.apply(decision.proposals)
        assert all(left.ok for left in leaves), leaves
        return result

    def alter(self, node_id: int, isr: tuple[int, ...], *, topic: str = "t", index: int = 0,
              leader_epoch: int | None = None, partition_epoch: int | None = None,
              broker_epoch: int | None = None) -> tuple[int, list[ApplyResult]]:
        current = self.partition(topic, index)
        request = AlterPartitionRequest(
            node_id,
            self.image.brokers[node_id].epoch if broker_epoch is None else broker_epoch,
            topic, index,
            current.leader_epoch if leader_epoch is None else leader_epoch,
            isr,
            current.partition_epoch if partition_epoch is None else partition_epoch,
        )  # fmt: skip
        decision = self.core.alter_partition(self.image, request)
        return decision.error_code, self.apply(decision.proposals)


# --- Leases and fencing ---------------------------------------------------------------------


def test_new_controller_grants_every_broker_a_full_session() -> None:
    cluster = Cluster()
    assert cluster.tick(SESSION_MS - 1) == []
    proposals = cluster.tick(2)
    assert {p.record for p in proposals} >= {FenceBroker(1), FenceBroker(2), FenceBroker(3)}
    assert all(cluster.image.brokers[n].fenced for n in (1, 2, 3))


def test_heartbeats_keep_brokers_unfenced() -> None:
    cluster = Cluster()
    cluster.create("t", (1, 2, 3))
    assert cluster.run(10 * SESSION_MS, alive=(1, 2, 3)) == []
    assert cluster.image.live_broker_ids() == (1, 2, 3)


GRACE_MS = 300


def test_a_dropped_quorum_link_fences_a_silent_broker_after_the_grace_only() -> None:
    cluster = Cluster(disconnected_grace_ms=GRACE_MS)
    cluster.create("t", (2, 1, 3))
    cluster.run(SESSION_MS // 2, alive=(1, 2, 3))
    cluster.core.note_unreachable(cluster.image, frozenset({2}), cluster.now)
    cluster.run(GRACE_MS - TICK_MS, alive=(1, 3))
    assert not cluster.image.brokers[2].fenced  # still within the grace
    cluster.run(2 * TICK_MS, alive=(1, 3))
    assert cluster.image.brokers[2].fenced, "well before its session would have ended"
    assert cluster.partition().leader == 1


def test_a_live_broker_with_a_broken_quorum_link_keeps_heartbeating_unfenced() -> None:
    cluster = Cluster(disconnected_grace_ms=GRACE_MS)
    cluster.create("t", (2, 1, 3))
    for _ in range(20):  # the link stays down: only the first sighting shortens the lease
        cluster.core.note_unreachable(cluster.image, frozenset({2}), cluster.now)
        cluster.run(SESSION_MS // 4, alive=(1, 2, 3))
    assert cluster.image.live_broker_ids() == (1, 2, 3)
    assert cluster.partition().leader == 2


def test_a_new_controller_fences_a_disconnected_old_one_without_waiting_a_session() -> None:
    cluster = Cluster(disconnected_grace_ms=GRACE_MS)
    cluster.create("t", (3, 1, 2))
    # A fresh core (a new term) grants full sessions, but node 3's link is already down.
    cluster.core.note_unreachable(cluster.image, frozenset({3}), cluster.now)
    cluster.run(GRACE_MS + TICK_MS, alive=(1, 2))
    assert cluster.image.brokers[3].fenced
    assert cluster.partition().leader == 1


def test_fenced_leader_is_replaced_by_the_next_isr_member_in_replica_order() -> None:
    cluster = Cluster()
    cluster.create("t", (1, 3, 2))
    before = cluster.partition()
    proposals = cluster.run(SESSION_MS + 1, alive=(2, 3))
    # Partition moves come before the fence, as in Kafka.
    assert [type(p.record) for p in proposals] == [PartitionChange, FenceBroker]
    after = cluster.partition()
    assert after.leader == 3
    assert after.isr == (3, 2)
    assert after.leader_epoch == before.leader_epoch + 1
    assert after.partition_epoch == before.partition_epoch + 1


def test_fenced_follower_leaves_the_isr_without_a_new_leader_epoch() -> None:
    cluster = Cluster()
    cluster.create("t", (1, 2, 3))
    cluster.run(SESSION_MS + 1, alive=(1, 2))
    after = cluster.partition()
    assert (after.leader, after.isr, after.leader_epoch, after.partition_epoch) == (1, (1, 2), 0, 1)


def test_last_isr_member_fenced_leaves_the_partition_offline_with_its_isr() -> None:
    cluster = Cluster()
    cluster.create("t", (1, 2))
    assert cluster.alter(1, (1,))[0] == errors.NONE
    cluster.run(SESSION_MS + 1, alive=(2, 3))
    after = cluster.partition()
    assert (after.leader, after.isr) == (NO_LEADER, (1,))
    # Broker 2 is alive but was not in the ISR: it must not lead (no unclean election).
    assert cluster.run(REBALANCE_MS + 1, alive=(2, 3)) == []
    assert cluster.partition().leader == NO_LEADER


def test_unclean_election_when_the_topic_allows_it() -> None:
    cluster = Cluster()
    cluster.create("t", (1, 2))
    assert cluster.alter(1, (1,))[0] == errors.NONE
    assert cluster.driver.apply(AlterConfigs(
        RESOURCE_TYPE_TOPIC, "t", (("unclean.leader.election.enable", "true"),), ())).ok
    cluster.run(SESSION_MS + 1, alive=(2, 3))
    after = cluster.partition()
    assert (after.leader, after.isr) == (2, (2,))


def test_all_isr_members_fenced_at_once_keeps_the_isr() -> None:
    cluster = Cluster()
    cluster.create("t", (1, 2))
    cluster.run(SESSION_MS + 1, alive=(3,))
    after = cluster.partition()
    assert (after.leader, after.isr, after.leader_epoch) == (NO_LEADER, (1, 2), 1)


def test_caught_up_heartbeat_unfences_and_the_offline_partition_gets_its_leader_back() -> None:
    cluster = Cluster()
    cluster.create("t", (1,))
    cluster.run(SESSION_MS + 1, alive=(2, 3))
    assert cluster.image.brokers[1].fenced
    assert cluster.partition().leader == NO_LEADER
    fenced_at = cluster.image.brokers[1].version
    # Behind: the broker has not applied its own fencing yet.
    request = cluster.heartbeat(1, offset=fenced_at - 1)
    assert cluster.image.brokers[1].fenced
    reply = cluster.core.heartbeat_reply(cluster.image, request)
    assert (reply.is_fenced, reply.is_caught_up) == (True, False)
    request = cluster.heartbeat(1, offset=fenced_at)
    assert not cluster.image.brokers[1].fenced
    reply = cluster.core.heartbeat_reply(cluster.image, request)
    assert (reply.error_code, reply.is_fenced, reply.is_caught_up) == (0, False, True)
    cluster.tick()
    after = cluster.partition()
    assert (after.leader, after.isr, after.leader_epoch) == (1, (1,), 2)


def test_heartbeat_errors() -> None:
    cluster = Cluster()
    core, image = cluster.core, cluster.image
    decision = core.heartbeat(image, Heartbeat(9, 0, 0), 0)
    assert decision.error_code == errors.BROKER_ID_NOT_REGISTERED
    epoch = image.brokers[2].epoch
    decision = core.heartbeat(image, Heartbeat(2, epoch + 1, 0), 0)
    assert decision.error_code == STALE_BROKER_EPOCH
    assert core.heartbeat_reply(image, Heartbeat(2, epoch + 1, 0)).error_code == STALE_BROKER_EPOCH


def test_want_fence_ends_the_session() -> None:
    cluster = Cluster()
    cluster.heartbeat(2, fence=True)
    proposals = cluster.tick(1)
    assert [p.record for p in proposals] == [FenceBroker(2)]


def test_controller_pause_grants_a_fresh_session_instead_of_fencing_everyone() -> None:
    cluster = Cluster()
    cluster.tick(SESSION_MS // 4)
    # The controller did not run for two sessions; brokers could not reach it.
    cluster.now += 2 * SESSION_MS
    assert cluster.tick() == []
    assert cluster.tick(SESSION_MS // 4) == []
    assert cluster.tick(SESSION_MS // 4) == []
    assert cluster.tick(SESSION_MS // 4) == []
    assert len(cluster.tick(SESSION_MS // 4 + 1)) == 3


def test_a_busy_reconciliation_is_not_mistaken_for_a_pause() -> None:
    # Ticks are late (the shell was proposing a long batch) but heartbeats kept arriving:
    # the controller was running, so the silent broker is fenced on time.
    cluster = Cluster()
    for _ in range(2 * SESSION_MS // TICK_MS):
        cluster.now += TICK_MS
        cluster.heartbeat_all((1, 2))
    proposals = cluster.tick()
    assert [p.record for p in proposals] == [FenceBroker(3)]


# --- Registration -----------------------------------------------------------------------------


def test_new_incarnation_starts_fenced_and_is_refused_while_the_old_session_lives() -> None:
    cluster = Cluster()
    cluster.create("t", (2, 1))
    # Another process (another port) claiming node 2 while node 2's session lives.
    decision = cluster.core.register(
        cluster.image, Registration(2, "other", "127.0.0.1", 9999), cluster.now)
    assert decision.error_code == DUPLICATE_BROKER_REGISTRATION
    cluster.run(SESSION_MS + 1, alive=(1, 3))
    result = cluster.register(2, "other")
    assert result.ok and result.value == cluster.image.brokers[2].epoch
    assert cluster.image.brokers[2].fenced
    # The old incarnation was fenced when its session ended and its leadership moved away.
    assert cluster.partition().leader == 1
    assert cluster.partition().isr == (1,)
    # The new incarnation unfences once caught up, then may rejoin the ISR.
    cluster.heartbeat(2)
    assert not cluster.image.brokers[2].fenced
    assert cluster.alter(1, (1, 2))[0] == errors.NONE


def test_a_restart_on_the_same_listener_registers_without_waiting_out_the_old_session() -> None:
    # The old process cannot still hold 127.0.0.1:9094 if the new one listens there.
    cluster = Cluster()
    cluster.create("t", (2, 1))
    result = cluster.register(2, "restarted")
    assert result.ok and cluster.image.brokers[2].incarnation_id == "restarted"
    assert cluster.image.brokers[2].fenced
    cluster.tick(TICK_MS)
    assert cluster.partition().leader == 1, "the old incarnation's leadership moved away"


def test_a_new_incarnation_leaves_every_isr_and_leadership_before_it_registers() -> None:
    """A node back with an empty disk (or one short of what it acknowledged) under its old
    id, before its old session ended: the registration first takes it out of the ISR and
    leadership its predecessor held, so it cannot lead at the old epoch (its followers would
    truncate to its empty log) and rejoins only when a leader sees it caught up."""
    cluster = Cluster()
    cluster.create("t", (2, 1, 3))
    assert cluster.partition().leader == 2 and 2 in cluster.partition().isr
    epoch = cluster.partition().leader_epoch
    decision = cluster.core.register(
        cluster.image, Registration(2, "wiped", "127.0.0.1", 9094), cluster.now)
    assert decision.ok
    *leaves, registration = decision.proposals
    assert isinstance(registration.record, RegisterBroker) and leaves
    assert all(isinstance(p.record, PartitionChange) for p in leaves)
    cluster.apply_ok(decision.proposals)
    partition = cluster.partition()
    assert partition.leader == 1 and partition.leader_epoch == epoch + 1
    assert 2 not in partition.isr and partition.isr == (1, 3)
    # Unfenced once it caught up with the metadata, it still is no ISR member or leader.
    cluster.heartbeat(2)
    cluster.tick(TICK_MS)
    assert cluster.partition().leader == 1 and 2 not in cluster.partition().isr


def test_same_incarnation_registers_again_as_a_no_op() -> None:
    cluster = Cluster()
    incarnation = cluster.image.brokers[2].incarnation_id
    epoch = cluster.image.brokers[2].epoch
    result = cluster.register(2, incarnation)
    assert result.ok and result.value == epoch
    assert not cluster.image.brokers[2].fenced


def test_registration_from_another_cluster_is_refused() -> None:
    cluster = Cluster(cluster_id="abc")
    decision = cluster.core.register(
        cluster.image, Registration(4, "x", "127.0.0.1", 9000, None, "other"), 0)
    assert decision.error_code == INCONSISTENT_CLUSTER_ID
    assert cluster.core.register(
        cluster.image, Registration(4, "x", "127.0.0.1", 9000, None, "abc"), 0).ok


def test_a_registered_broker_unknown_to_the_controller_gets_a_session_from_first_sight() -> None:
    cluster = Cluster(brokers=(1, 2))
    cluster.run(SESSION_MS - 10, alive=(1, 2))
    assert cluster.driver.apply(RegisterBroker(3, "127.0.0.1", 9095, None, "inc-3")).ok
    assert cluster.driver.apply(UnfenceBroker(3)).ok
    assert cluster.run(SESSION_MS - 10, alive=(1, 2)) == []
    assert cluster.image.live_broker_ids() == (1, 2, 3)
    assert [p.record for p in cluster.run(150, alive=(1, 2))] == [FenceBroker(3)]


# --- Controlled shutdown --------------------------------------------------------------------


def test_controlled_shutdown_moves_leadership_then_fences() -> None:
    cluster = Cluster()
    cluster.create("t", (1, 2, 3))
    cluster.create("solo", (1,))
    request = cluster.heartbeat(1, shut_down=True)
    assert not cluster.core.heartbeat_reply(cluster.image, request).should_shut_down
    cluster.tick()
    assert (cluster.partition().leader, cluster.partition().isr) == (2, (2, 3))
    solo = cluster.partition("solo")
    assert (solo.leader, solo.isr) == (NO_LEADER, (1,))
    assert cluster.image.brokers[1].fenced
    request = cluster.heartbeat(1, shut_down=True)
    reply = cluster.core.heartbeat_reply(cluster.image, request)
    assert reply.should_shut_down and reply.is_fenced
    # A shutting-down broker is never unfenced by its (caught-up) heartbeats.
    assert cluster.image.brokers[1].fenced


def test_shutting_down_broker_cannot_rejoin_an_isr() -> None:
    cluster = Cluster()
    cluster.create("t", (1, 2, 3))
    cluster.heartbeat(3, shut_down=True)
    cluster.tick()
    assert cluster.partition().isr == (1, 2)
    code, _ = cluster.alter(1, (1, 2, 3))
    assert code == OPERATION_NOT_ATTEMPTED


# --- AlterPartition ---------------------------------------------------------------------------


def test_alter_partition_shrinks_and_expands_under_compare_and_set() -> None:
    cluster = Cluster()
    cluster.create("t", (1, 2, 3))
    code, results = cluster.alter(1, (1, 2))
    assert code == errors.NONE and all(r.ok for r in results)
    after = cluster.partition()
    assert (after.isr, after.leader_epoch, after.partition_epoch) == ((1, 2), 0, 1)
    # A retry with the old partition epoch loses the compare-and-set.
    code, _ = cluster.alter(1, (1, 2, 3), partition_epoch=0)
    assert code == errors.INVALID_UPDATE_VERSION
    code, _ = cluster.alter(1, (1, 2, 3))
    assert code == errors.NONE and cluster.partition().isr == (1, 2, 3)


@pytest.mark.parametrize(
    ("node_id", "isr", "overrides", "expected"),
    [
        (1, (1, 2), {"leader_epoch": -1}, errors.FENCED_LEADER_EPOCH),
        (1, (1, 2), {"leader_epoch": 5}, errors.NOT_CONTROLLER),
        (1, (1, 2), {"partition_epoch": 5}, errors.NOT_CONTROLLER),
        (2, (1, 2), {}, errors.INVALID_REQUEST),
        (1, (), {}, errors.INVALID_REQUEST),
        (1, (1, 4), {}, errors.INVALID_REQUEST),
        (1, (1, 1), {}, errors.INVALID_REQUEST),
        (1, (1, 2), {"broker_epoch": 12345}, STALE_BROKER_EPOCH),
        (1, (1, 2), {"topic": "nope"}, errors.UNKNOWN_TOPIC_OR_PARTITION),
    ],
)
def test_alter_partition_rejections(
    node_id: int, isr: tuple[int, ...], overrides: dict[str, object], expected: int
) -> None:
    cluster = Cluster()
    cluster.create("t", (1, 2, 3))
    topic = overrides.pop("topic", "t")
    current = cluster.partition()
    request = AlterPartitionRequest(
        node_id,
        int(overrides.get("broker_epoch", cluster.image.brokers[node_id].epoch)),  # type: ignore[call-overload]
        str(topic), 0,
        int(overrides.get("leader_epoch", current.leader_epoch)),  # type: ignore[call-overload]
        isr,
        int(overrides.get("partition_epoch", current.partition_epoch)),  # type: ignore[call-overload]
    )  # fmt: skip
    decision = cluster.core.alter_partition(cluster.image, request)
    assert decision.error_code == expected
    assert decision.proposals == ()


def test_a_leader_leaving_the_isr_hands_leadership_to_the_next_member() -> None:
    # raftlog's extension for a leader whose log holds a corrupt batch (log_verify).
    cluster = Cluster()
    cluster.create("t", (1, 2, 3))
    code, results = cluster.alter(1, (2, 3))
    assert code == errors.NONE and all(r.ok for r in results)
    after = cluster.partition()
    assert (after.leader, after.isr, after.leader_epoch, after.partition_epoch) == \
        (2, (2, 3), 1, 1)


def test_a_resigning_leader_cannot_add_members_or_empty_the_isr() -> None:
    cluster = Cluster()
    cluster.create("t", (1, 2, 3))
    cluster.alter(1, (1, 2))
    code, _ = cluster.alter(1, (2, 3))  # 3 is not in the ISR: it may lack committed data
    assert code == errors.INVALID_REQUEST
    code, _ = cluster.alter(1, ())
    assert code == errors.INVALID_REQUEST
    assert cluster.partition().leader == 1


def test_alter_partition_refuses_a_fenced_replica() -> None:
    cluster = Cluster()
    cluster.create("t", (1, 2, 3))
    cluster.alter(1, (1, 2))
    cluster.run(SESSION_MS + 1, alive=(1, 2))
    assert cluster.image.brokers[3].fenced
    code, _ = cluster.alter(1, (1, 2, 3))
    assert code == OPERATION_NOT_ATTEMPTED


def test_alter_partition_without_a_change_commits_a_new_partition_epoch() -> None:
    # A leader settling a change whose outcome it does not know asks for the committed ISR.
    # The answer must be a new partition epoch: an earlier proposal based on the old epoch,
    # still in flight when the core decided from the committed image, then fails its
    # compare-and-set instead of landing after the leader was told the ISR (the HW stall of
    # 2026-11-28: the leader kept a fenced replica in its maximal ISR for 90 s).
    cluster = Cluster()
    cluster.create("t", (1, 2, 3))
    current = cluster.partition()
    in_flight = cluster.core.alter_partition(cluster.image, AlterPartitionRequest(
        1, -1, "t", 0, current.leader_epoch, (1, 2), current.partition_epoch))
    settle = cluster.core.alter_partition(cluster.image, AlterPartitionRequest(
        1, -1, "t", 0, current.leader_epoch, current.isr, current.partition_epoch))
    assert settle.ok and settle.partition == current
    (result,) = cluster.apply(settle.proposals)
    assert result.ok
    settled = cluster.partition()
    assert settled.isr == current.isr and settled.leader == current.leader
    assert settled.leader_epoch == current.leader_epoch
    assert settled.partition_epoch == current.partition_epoch + 1
    (late,) = cluster.apply(in_flight.proposals)
    assert not late.ok, "the earlier proposal lands after the answer"
    assert cluster.partition() == settled


# --- Preferred leaders ------------------------------------------------------------------------


def test_preferred_leader_returns_once_it_is_back_in_the_isr() -> None:
    cluster = Cluster()
    cluster.create("t", (1, 2, 3))
    cluster.run(SESSION_MS + 1, alive=(2, 3))
    assert cluster.partition().leader == 2
    cluster.heartbeat_all((1, 2, 3))  # 1 unfenced, but not in the ISR yet
    assert cluster.tick() == []
    assert cluster.alter(2, (2, 3, 1))[0] == errors.NONE
    before = cluster.partition()
    # Nothing moves until the rebalance interval is up.
    assert cluster.run(REBALANCE_MS - cluster.now - 1, alive=(1, 2, 3)) == []
    proposals = cluster.run(2, alive=(1, 2, 3))
    assert len(proposals) == 1
    after = cluster.partition()
    assert (after.leader, after.isr, after.leader_epoch) == (1, (2, 3, 1),
                                                             before.leader_epoch + 1)


def test_rebalancing_can_be_disabled() -> None:
    partition = PartitionImage(0, (1, 2), (1, 2), 2, 3, 4)
    assert elect(partition, frozenset({1, 2}), preferred=False) == (2, (1, 2))
    assert elect(partition, frozenset({1, 2}), preferred=True) == (1, (1, 2))
    assert plan_partition("t", partition, frozenset({1, 2})) is None
    cluster = Cluster(rebalance_interval_ms=0)
    cluster.create("t", (1, 2))
    assert cluster.driver.apply(PartitionChange("t", 0, 2, (1, 2), 1, 1)).ok
    assert cluster.run(3 * REBALANCE_MS, alive=(1, 2, 3)) == []


# --- Producer ids and placement ---------------------------------------------------------------


def test_producer_id_blocks_are_consecutive() -> None:
    cluster = Cluster()
    starts = []
    for node_id in (1, 2, 1):
        decision = cluster.core.allocate_producer_ids(cluster.image, node_id, -1)
        (proposal,) = decision.proposals
        assert isinstance(proposal.record, ProducerIdBlock)
        (result,) = cluster.apply(decision.proposals)
        starts.append(result.value)
    assert starts == [0, 1000, 2000]
    stale = cluster.core.allocate_producer_ids(cluster.image, 1, 999)
    assert stale.error_code == STALE_BROKER_EPOCH


def test_placement_uses_usable_brokers_and_spreads_leaders_by_topic_name() -> None:
    cluster = Cluster(brokers=(1, 2, 3, 4))
    first_leaders = {
        cluster.core.place_replicas(cluster.image, 0, f"topic-{i}", 1, 3)[0][0]
        for i in range(40)
    }
    assert first_leaders == {1, 2, 3, 4}
    cluster.run(SESSION_MS + 1, alive=(1, 2, 3))
    for i in range(20):
        assignment = cluster.core.place_replicas(cluster.image, cluster.now, f"t{i}", 3, 3)
        assert all(4 not in replicas for replicas in assignment)
    with pytest.raises(PlacementError):
        cluster.core.place_replicas(cluster.image, cluster.now, "t", 1, 4)
    # Same name, same placement: a retried CreateTopics places alike.
    place = cluster.core.place_replicas
    assert place(cluster.image, 0, "x", 6, 2) == place(cluster.image, 0, "x", 6, 2)


def test_a_settled_image_is_not_planned_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # The reconciliation ran plan_partition_changes over every partition on every tick (about
    # 50 ms each at 10,000 partitions, several ticks a second) although nothing had changed.
    import raftlog.controller.core as core_module

    planned: list[int] = []
    real = core_module.plan_partition_changes

    def counting(image: MetadataImage, *args: object, **kwargs: object) -> object:
        planned.append(image.version)
        return real(image, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(core_module, "plan_partition_changes", counting)
    cluster = Cluster()
    cluster.create("t", (1, 2, 3))
    cluster.run(3 * TICK_MS, alive=(1, 2, 3))
    settled = len(planned)
    cluster.run(5 * TICK_MS, alive=(1, 2, 3))
    assert len(planned) == settled, "the same image and brokers are not planned again"
    # A broker that stops heartbeating changes the usable brokers: planned again, and its
    # leadership moves as before.
    before = cluster.image.topics["t"].partitions[0].leader
    cluster.run(2 * SESSION_MS, alive=[b for b in (1, 2, 3) if b != before])
    assert len(planned) > settled
    assert cluster.image.topics["t"].partitions[0].leader != before
