"""The pure group coordinator: examples of Kafka's rules, a Hypothesis state machine over
join/sync/heartbeat/leave/session expiry, and the offsets-log record format."""

from __future__ import annotations

import itertools
import logging
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from raftlog.group.coordinator import (
    COMPLETING_REBALANCE,
    EMPTY,
    PREPARING_REBALANCE,
    STABLE,
    GroupCoordinator,
)
from raftlog.group.records import (
    GroupKey,
    GroupValue,
    MemberValue,
    OffsetKey,
    OffsetValue,
    decode_group_value,
    decode_key,
    decode_offset_value,
    encode_group_value,
    encode_key,
    encode_offset_value,
)
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.internal_topics import coordinator_partition, java_string_hash

SESSION = 10_000
REBALANCE = 20_000
G = "group"


def _core() -> GroupCoordinator:
    ids = itertools.count()
    return GroupCoordinator(new_member_id=lambda prefix: f"{prefix}-{next(ids)}")


def _join(core: GroupCoordinator, token: int, member: str = "", now: int = 0,
          instance: str | None = None, v4: bool = False, protocols: Any = None) -> Any:
    return core.join(token, G, member, instance_id=instance, protocol_type="consumer",
                     protocols=protocols or [("range", b"sub")], session_timeout_ms=SESSION,
                     rebalance_timeout_ms=REBALANCE, client_id="c", client_host="/h",
                     require_known_member_id=v4, now_ms=now)


def _answers(core: GroupCoordinator) -> dict[int, Any]:
    out = dict(core.outbox)
    core.outbox.clear()
    return out


def test_single_member_join_sync_heartbeat_leave() -> None:
    core = _core()
    assert _join(core, 1) is None
    joined = _answers(core)[1]
    assert joined["error_code"] == 0 and joined["generation_id"] == 1
    member = joined["member_id"]
    assert joined["leader"] == member and len(joined["members"]) == 1
    assert core.groups[G].state == COMPLETING_REBALANCE
    assert core.sync(2, G, 1, member, instance_id=None, assignments={member: b"A"},
                     now_ms=0) is None
    assert _answers(core)[2] == {"error_code": 0, "assignment": b"A"}
    assert core.groups[G].state == STABLE
    assert core.writes and core.writes[-1][0] == G  # group metadata persisted
    assert core.heartbeat(G, 1, member, instance_id=None, now_ms=1) == 0
    assert core.heartbeat(G, 0, member, instance_id=None, now_ms=1) == \
        ErrorCode.ILLEGAL_GENERATION
    assert core.heartbeat(G, 1, "nobody", instance_id=None, now_ms=1) == \
        ErrorCode.UNKNOWN_MEMBER_ID
    assert core.leave(G, [(member, None)], now_ms=2) == [0]
    assert core.groups[G].state == EMPTY and core.groups[G].generation == 2


def test_member_id_required_from_v4() -> None:
    core = _core()
    first = _join(core, 1, v4=True)
    assert first["error_code"] == ErrorCode.MEMBER_ID_REQUIRED and first["member_id"]
    assert _join(core, 2, member=first["member_id"], v4=True) is None
    assert _answers(core)[2]["member_id"] == first["member_id"]
    assert _join(core, 3, member="made-up", v4=True)["error_code"] == \
        ErrorCode.UNKNOWN_MEMBER_ID


def test_rebalance_waits_for_all_members_or_the_timeout() -> None:
    core = _core()
    _join(core, 1)
    a = _answers(core)[1]["member_id"]
    core.sync(2, G, 1, a, instance_id=None, assignments={}, now_ms=0)
    _answers(core)
    assert _join(core, 3, now=100) is None  # b joins: a must rejoin
    assert core.groups[G].state == PREPARING_REBALANCE
    assert core.heartbeat(G, 1, a, instance_id=None, now_ms=200) == \
        ErrorCode.REBALANCE_IN_PROGRESS
    assert not _answers(core)
    core.tick(100 + REBALANCE)  # a never rejoined: removed, b's join completes alone
    answers = _answers(core)
    assert answers[3]["generation_id"] == 2
    assert list(core.groups[G].members) == [answers[3]["member_id"]]


def test_stable_rejoin_rebalances_only_for_the_leader(caplog: pytest.LogCaptureFixture) -> None:
    """As Kafka: a follower's JoinGroup with unchanged metadata in a Stable group gets the
    current generation back; the leader's starts a rebalance (it may have seen topic metadata
    change). Each transition is logged at INFO with its reason, for operators."""
    caplog.set_level(logging.INFO, logger="raftlog.group.coordinator")
    core = _core()
    _join(core, 1)
    leader = _answers(core)[1]["member_id"]
    _join(core, 2)  # a second member: the leader must rejoin
    _join(core, 3, member=leader)
    joined = _answers(core)
    follower = joined[2]["member_id"]
    assert joined[3]["leader"] == leader and joined[2]["generation_id"] == 2
    core.sync(4, G, 2, follower, instance_id=None, assignments={}, now_ms=0)
    core.sync(5, G, 2, leader, instance_id=None, assignments={follower: b"f", leader: b"l"},
              now_ms=0)
    assert core.groups[G].state == STABLE
    again = _join(core, 6, member=follower, now=10)
    assert again["generation_id"] == 2 and core.groups[G].state == STABLE
    assert _join(core, 7, member=leader, now=20) is None
    assert core.groups[G].state == PREPARING_REBALANCE
    messages = [r.getMessage() for r in caplog.records]
    assert any("stabilized group group generation 2" in m for m in messages)
    assert any("assignment received from leader" in m for m in messages)
    assert any(f"member {leader}: the leader rejoined" in m for m in messages)


def test_session_timeout_evicts_and_triggers_rebalance() -> None:
    core = _core()
    _join(core, 1)
    a = _answers(core)[1]["member_id"]
    core.sync(2, G, 1, a, instance_id=None, assignments={}, now_ms=0)
    core.tick(SESSION - 1)
    assert a in core.groups[G].members
    core.tick(SESSION)
    assert core.groups[G].state == EMPTY and not core.groups[G].members


def test_static_member_rejoin_fences_the_old_id() -> None:
    core = _core()
    _join(core, 1, instance="i1")
    old = _answers(core)[1]["member_id"]
    core.sync(2, G, 1, old, instance_id="i1", assignments={old: b"x"}, now_ms=0)
    _answers(core)
    _join(core, 3, instance="i1", now=10)
    new = _answers(core)[3]["member_id"]
    assert new != old
    assert core.heartbeat(G, 2, old, instance_id="i1", now_ms=11) == \
        ErrorCode.FENCED_INSTANCE_ID


def test_commit_validation() -> None:
    core = _core()
    assert core.validate_commit(G, 1, "m", None) == ErrorCode.ILLEGAL_GENERATION
    assert core.validate_commit(G, -1, "", None) == 0
    core.apply_commit(G, {("t", 0): OffsetValue(5)}, 0)
    assert core.validate_commit(G, 1, "m", None) == ErrorCode.UNKNOWN_MEMBER_ID
    assert core.committed(G, [("t", 0), ("t", 1)]) == {("t", 0): OffsetValue(5), ("t", 1): None}
    code, tombstones = core.delete(G)
    assert code == 0 and len(tombstones) == 2 and all(v is None for _, v in tombstones)
    assert core.delete("missing")[0] == ErrorCode.GROUP_ID_NOT_FOUND


def test_records_round_trip_and_replay() -> None:
    key = OffsetKey("g", "topic", 3)
    assert decode_key(encode_key(key)) == key
    assert decode_key(encode_key(GroupKey("g"))) == GroupKey("g")
    value = OffsetValue(10, 4, "meta", 1234)
    assert decode_offset_value(encode_offset_value(value)) == value
    group = GroupValue("consumer", 7, "range", "m1", 99, (
        MemberValue("m1", None, "c", "/h", 300, 100, b"sub", b"asg"),))
    assert decode_group_value(encode_group_value(group)) == group
    core = _core()
    core.load_group("g", group, now_ms=0)
    core.load_offset("g", ("topic", 3), value)
    assert core.groups["g"].state == STABLE and core.groups["g"].generation == 7
    assert core.heartbeat("g", 7, "m1", instance_id=None, now_ms=1) == 0


def test_loaded_members_get_a_full_session_from_the_end_of_the_load() -> None:
    """Kafka schedules a loaded member's heartbeat expiry when the load completes: a load
    that took longer than the session (MemberValue session_timeout_ms=100 here) evicts
    nobody."""
    group = GroupValue("consumer", 7, "range", "m1", 99, (
        MemberValue("m1", None, "c", "/h", 300, 100, b"sub", b"asg"),))
    core = _core()
    core.load_group("g", group, now_ms=0)
    core.restart_sessions({"g", "unknown-group"}, now_ms=1_000)  # the load ended at 1 s
    core.tick(1_050)
    assert "m1" in core.groups["g"].members
    core.tick(1_100)
    assert "m1" not in core.groups["g"].members


def test_partition_for_matches_java() -> None:
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(1 << 31)
    assert coordinator_partition("polygenelubricants", 50) == 0
    assert 0 <= coordinator_partition("any-group", 10) < 10


class GroupMachine(RuleBasedStateMachine):
    """Random joins, syncs, heartbeats, leaves and clock jumps keep Kafka's invariants."""

    def __init__(self) -> None:
        super().__init__()
        self.core = _core()
        self.now = 0
        self.tokens = itertools.count(1)
        self.pending_joins: dict[int, str] = {}
        self.known: list[str] = []  # member ids this "client side" was given

    def _collect(self) -> None:
        for token, body in self.core.outbox:
            if token in self.pending_joins and body["error_code"] == 0 \
                    and body["member_id"] not in self.known:
                self.known.append(body["member_id"])
            self.pending_joins.pop(token, None)
        self.core.outbox.clear()

    @initialize(delay_ms=st.sampled_from([0, 3_000]))
    def initial_delay(self, delay_ms: int) -> None:
        self.core.initial_rebalance_delay_ms = delay_ms

    @rule(instance=st.sampled_from(["i1", "i2"]))
    def static_member_starts(self, instance: str) -> None:
        """A static member (re)starts: no member id, its group.instance.id."""
        token = next(self.tokens)
        self.pending_joins[token] = ""
        body = _join(self.core, token, instance=instance, now=self.now)
        if body is not None:
            self.pending_joins.pop(token)
        self._collect()

    @rule(offset=st.integers(0, 100))
    def simple_commit(self, offset: int) -> None:
        if self.core.validate_commit(G, -1, "", None) == 0:
            self.core.apply_commit(G, {("t", 0): OffsetValue(offset, -1, "", self.now)},
                                   self.now)

    @rule()
    def expire_offsets(self) -> None:
        group = self.core.groups.get(G)
        had_members = group is not None and bool(group.members)
        self.core.expire_offsets(self.now, REBALANCE)
        if had_members:
            assert G in self.core.groups  # a group with members never expires

    @rule()
    def new_member(self) -> None:
        token = next(self.tokens)
        self.pending_joins[token] = ""
        body = _join(self.core, token, now=self.now)
        if body is not None:
            self.pending_joins.pop(token)
        self._collect()

    @precondition(lambda self: self.known)
    @rule(data=st.data())
    def rejoin(self, data: st.DataObject) -> None:
        member = data.draw(st.sampled_from(self.known))
        token = next(self.tokens)
        self.pending_joins[token] = member
        body = _join(self.core, token, member=member, now=self.now)
        if body is not None:
            self.pending_joins.pop(token)
        self._collect()

    @precondition(lambda self: self.known)
    @rule(data=st.data())
    def sync(self, data: st.DataObject) -> None:
        member = data.draw(st.sampled_from(self.known))
        group = self.core.groups.get(G)
        generation = group.generation if group else 0
        self.core.sync(next(self.tokens), G, generation, member, instance_id=None,
                       assignments={m: m.encode() for m in self.known}, now_ms=self.now)
        self._collect()

    @precondition(lambda self: self.known)
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        member = data.draw(st.sampled_from(self.known))
        group = self.core.groups.get(G)
        generation = group.generation if group else 0
        code = self.core.heartbeat(G, generation, member, instance_id=None, now_ms=self.now)
        assert code in (0, ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.UNKNOWN_MEMBER_ID)

    @precondition(lambda self: self.known)
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        member = data.draw(st.sampled_from(self.known))
        self.core.leave(G, [(member, None)], now_ms=self.now)
        self._collect()

    @rule(ms=st.integers(0, 3 * REBALANCE))
    def advance(self, ms: int) -> None:
        self.now += ms
        self.core.tick(self.now)
        self._collect()

    @invariant()
    def kafka_invariants(self) -> None:
        group = self.core.groups.get(G)
        if group is None:
            return
        if group.state == EMPTY:
            assert not group.members
        else:
            assert group.members, group.state
            assert group.leader in group.members
        if group.state == STABLE:
            assert all(m.join_token is None for m in group.members.values())
        if group.state != PREPARING_REBALANCE:
            assert all(m.join_token is None for m in group.members.values())
            assert group.initial_delay_until_ms is None
        # group.instance.id ↔ member: one member per instance id, and it is a member.
        for instance, member_id in group.static.items():
            assert group.members[member_id].instance_id == instance
        assert len(group.static) == sum(1 for m in group.members.values()
                                        if m.instance_id is not None)
        # Every deadline the shell must wake up for is still ahead after a tick.
        deadline = self.core.next_deadline()
        assert deadline is None or deadline > self.now or self.now == 0


GroupMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                          deadline=None)
TestGroupMachine = GroupMachine.TestCase
