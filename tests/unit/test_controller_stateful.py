"""Hypothesis state machine over the controller core and the real metadata state machine.

Random broker kills, restarts, pauses, controlled shutdowns, AlterPartition requests (fresh and
stale), controller failovers and clock jumps. Whatever happens:

* a leader is only ever elected from the ISR (unclean election disabled);
* the ISR is never empty, and a partition with a usable ISR member has a leader after a tick;
* the controller never drops a usable broker from an ISR (only the leader's AlterPartition
  may shrink it);
* partition epochs go up by exactly one per change, leader epochs never go down and go up
  whenever the leader changes;
* a broker that stopped heartbeating a full session ago is fenced and leads nothing;
* every record the core proposes on the current image is accepted by the state machine.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from raftlog.controller.core import (
    AlterPartitionRequest,
    ControllerCore,
    ControllerSettings,
    Heartbeat,
    Proposal,
    Registration,
)
from raftlog.metadata import errors
from raftlog.metadata.image import NO_LEADER, MetadataImage, PartitionImage
from raftlog.metadata.records import FenceBroker, PartitionChange
from raftlog.metadata.testing import MachineDriver

BROKERS = (1, 2, 3, 4)
SESSION_MS = 1000
TICK_MS = 100
TOPICS = {
    "a": ((1, 2, 3), (2, 3, 4), (3, 4, 1)),
    "b": ((4,), (1,)),
    "d": ((1, 2), (3, 4), (4, 2)),
    "c": ((2, 1, 4, 3),),
}


class ControllerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.driver = MachineDriver()
        self.now = 0
        self.alive: set[int] = set(BROKERS)
        self.last_heartbeat: dict[int, int] = {}
        self.incarnations = 0
        self.grace_from = 0
        self.core: ControllerCore

    @initialize()
    def bootstrap(self) -> None:
        self.driver.bootstrap(BROKERS)
        for name, replicas in TOPICS.items():
            assert self.driver.create_topic(name, replicas).ok
        self.new_controller()
        for node_id in BROKERS:
            self.last_heartbeat[node_id] = self.now

    @property
    def image(self) -> MetadataImage:
        return self.driver.machine.image

    def partitions(self) -> dict[tuple[str, int], PartitionImage]:
        return {
            (name, p.partition): p
            for name, topic in self.image.topics.items()
            for p in topic.partitions
        }

    def new_controller(self) -> None:
        self.grace_from = self.now  # a new controller grants every broker a full session
        self.core = ControllerCore(
            ControllerSettings(node_id=1, session_timeout_ms=SESSION_MS,
                               rebalance_interval_ms=700),
            self.image, self.now,
        )  # fmt: skip

    # --- Applying proposals with the safety checks ----------------------------------------

    def apply(self, proposal: Proposal, *, must_succeed: bool) -> bool:
        before = self.partitions()
        usable_before = self.core.usable_brokers(self.image, self.now)
        result = self.driver.apply(proposal.record, expected_version=proposal.expected_version)
        if must_succeed:
            assert result.ok, (proposal, result)
        record = proposal.record
        if result.ok and isinstance(record, PartitionChange):
            old = before[(record.topic, record.partition)]
            new = self.partitions()[(record.topic, record.partition)]
            assert new.isr, "the ISR must never become empty"
            assert new.partition_epoch == old.partition_epoch + 1
            assert new.leader_epoch >= old.leader_epoch
            if new.leader != old.leader:
                assert new.leader_epoch > old.leader_epoch
                if new.leader != NO_LEADER:
                    assert new.leader in old.isr, f"unclean election: {old} -> {new}"
                    assert not self.image.brokers[new.leader].fenced
            if proposal.reason == "reconcile":
                dropped = set(old.isr) - set(new.isr)
                assert not dropped & usable_before, f"dropped live ISR members {dropped}"
        return result.ok

    # --- Rules ------------------------------------------------------------------------------

    @rule(data=st.data())
    def kill(self, data: st.DataObject) -> None:
        if self.alive:
            self.alive.discard(data.draw(st.sampled_from(sorted(self.alive))))

    @rule(node_id=st.sampled_from(BROKERS))
    def restart(self, node_id: int) -> None:
        if node_id in self.alive:
            return
        self.incarnations += 1
        request = Registration(node_id, f"inc-{node_id}-{self.incarnations}", "127.0.0.1",
                               9092 + node_id)
        decision = self.core.register(self.image, request, self.now)
        if not decision.ok:
            # The old session is still valid: refused until it expires, as in Kafka.
            assert self.core.is_alive(self.image, node_id, self.now)
            return
        for proposal in decision.proposals:
            assert self.apply(proposal, must_succeed=True)
        assert self.image.brokers[node_id].fenced
        self.alive.add(node_id)
        self.last_heartbeat[node_id] = self.now

    @rule(ms=st.integers(1, 6 * TICK_MS))
    def advance(self, ms: int) -> None:
        target = self.now + ms
        while self.now < target:
            self.now = min(self.now + TICK_MS, target)
            self.heartbeat_alive()
            for proposal in self.core.tick(self.image, self.now):
                self.apply(proposal, must_succeed=True)
            self.check_after_tick()

    @rule(ms=st.integers(SESSION_MS, 5 * SESSION_MS))
    def controller_paused(self, ms: int) -> None:
        # No ticks and no heartbeats get through while the controller is stopped; when it
        # resumes it must not fence brokers for its own silence.
        self.now += ms
        proposals = self.core.tick(self.image, self.now)
        assert not any(isinstance(p.record, FenceBroker) for p in proposals), proposals
        for proposal in proposals:
            self.apply(proposal, must_succeed=True)
        self.grace_from = self.now

    @rule()
    def controller_failover(self) -> None:
        self.new_controller()

    @rule(data=st.data())
    def controlled_shutdown(self, data: st.DataObject) -> None:
        if not self.alive:
            return
        node_id = data.draw(st.sampled_from(sorted(self.alive)))
        broker = self.image.brokers[node_id]
        request = Heartbeat(node_id, broker.epoch, self.image.version, want_shut_down=True)
        decision = self.core.heartbeat(self.image, request, self.now)
        assert decision.ok
        for _ in range(3):
            for proposal in self.core.tick(self.image, self.now):
                self.apply(proposal, must_succeed=True)
        reply = self.core.heartbeat_reply(self.image, request)
        assert reply.should_shut_down
        assert not any(p.leader == node_id for p in self.partitions().values())
        self.alive.discard(node_id)

    @rule(data=st.data(), stale=st.booleans())
    def alter_isr(self, data: st.DataObject, stale: bool) -> None:
        key = data.draw(st.sampled_from(sorted(self.partitions())))
        partition = self.partitions()[key]
        leader = partition.leader
        if leader == NO_LEADER or leader not in self.alive:
            return
        others = [r for r in partition.replicas if r != leader]
        chosen = data.draw(st.lists(st.sampled_from(others), unique=True)) if others else []
        new_isr = (leader, *chosen)
        epoch_shift = data.draw(st.integers(-1, 0)) if stale else 0
        request = AlterPartitionRequest(
            leader, self.image.brokers[leader].epoch, key[0], key[1],
            partition.leader_epoch, new_isr, partition.partition_epoch + epoch_shift,
        )  # fmt: skip
        decision = self.core.alter_partition(self.image, request)
        if epoch_shift:
            assert decision.error_code == errors.INVALID_UPDATE_VERSION
        for proposal in decision.proposals:
            assert decision.ok
            self.apply(proposal, must_succeed=True)

    # --- Invariants ---------------------------------------------------------------------------

    def heartbeat_alive(self) -> None:
        for node_id in sorted(self.alive):
            broker = self.image.brokers[node_id]
            request = Heartbeat(node_id, broker.epoch, self.image.version)
            decision = self.core.heartbeat(self.image, request, self.now)
            if self.core.is_shutting_down(node_id):
                continue
            assert decision.ok, decision
            for proposal in decision.proposals:
                self.apply(proposal, must_succeed=True)
            self.last_heartbeat[node_id] = self.now

    def check_after_tick(self) -> None:
        usable = self.core.usable_brokers(self.image, self.now)
        for key, partition in self.partitions().items():
            if set(partition.isr) & usable:
                assert partition.leader != NO_LEADER, (key, partition, usable)
            if partition.leader != NO_LEADER:
                assert partition.leader in usable, (key, partition, usable)
        for node_id in BROKERS:
            silent_for = self.now - max(self.last_heartbeat.get(node_id, 0), self.grace_from)
            if node_id not in self.alive and silent_for > SESSION_MS + TICK_MS:
                assert self.image.brokers[node_id].fenced, node_id

    @invariant()
    def partitions_are_well_formed(self) -> None:
        for partition in self.partitions().values():
            assert partition.isr
            assert set(partition.isr) <= set(partition.replicas)
            assert partition.leader == NO_LEADER or partition.leader in partition.isr


ControllerMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestController = ControllerMachine.TestCase
