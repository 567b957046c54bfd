"""The pure group coordinator: group.initial.rebalance.delay.ms, static membership (KIP-345:
a restarted static member rejoins a Stable group without a rebalance; a duplicate instance id
is fenced) and offset expiry (offsets.retention.ms, KIP-211)."""

from __future__ import annotations

import itertools
from typing import Any

from raftlog.group.coordinator import (
    COMPLETING_REBALANCE,
    EMPTY,
    PREPARING_REBALANCE,
    STABLE,
    GroupCoordinator,
)
from raftlog.group.records import GroupKey, OffsetKey, OffsetValue, decode_key
from raftlog.protocol.errors import ErrorCode

SESSION_MS = 10_000
REBALANCE_MS = 20_000
DELAY_MS = 3_000
RETENTION_MS = 60_000
G = "group"


def _core(delay_ms: int = 0) -> GroupCoordinator:
    ids = itertools.count()
    return GroupCoordinator(new_member_id=lambda prefix: f"{prefix}-{next(ids)}",
                            initial_rebalance_delay_ms=delay_ms)


def _join(core: GroupCoordinator, token: int, member: str = "", now: int = 0,
          instance: str | None = None, protocols: Any = None) -> Any:
    return core.join(token, G, member, instance_id=instance, protocol_type="consumer",
                     protocols=protocols or [("range", b"sub")], session_timeout_ms=SESSION_MS,
                     rebalance_timeout_ms=REBALANCE_MS, client_id="c", client_host="/h",
                     require_known_member_id=False, now_ms=now)


def _answers(core: GroupCoordinator) -> dict[int, Any]:
    out = dict(core.outbox)
    core.outbox.clear()
    return out


def _stable_static_group(core: GroupCoordinator) -> tuple[str, str]:
    """Two static members i1 (the leader) and i2 in a Stable generation 1 (an initial delay
    gathers both into it)."""
    core.initial_rebalance_delay_ms = DELAY_MS
    _join(core, 1, instance="i1")
    _join(core, 2, instance="i2")
    core.tick(DELAY_MS)
    core.initial_rebalance_delay_ms = 0
    answers = _answers(core)
    a, b = answers[1]["member_id"], answers[2]["member_id"]
    assert answers[1]["leader"] == a and answers[1]["generation_id"] == 1
    core.sync(3, G, 1, b, instance_id="i2", assignments={}, now_ms=0)
    core.sync(4, G, 1, a, instance_id="i1", assignments={a: b"A", b: b"B"}, now_ms=0)
    synced = _answers(core)
    assert synced[3]["assignment"] == b"B" and synced[4]["assignment"] == b"A"
    core.writes.clear()
    return a, b


# -- group.initial.rebalance.delay.ms --------------------------------------------------------


def test_initial_delay_gathers_members_into_one_generation() -> None:
    core = _core(DELAY_MS)
    assert _join(core, 1, now=0) is None
    core.tick(DELAY_MS - 1)
    assert not core.outbox  # without the delay, generation 1 would hold one member only
    assert core.next_deadline() == DELAY_MS
    assert _join(core, 2, now=1_000) is None  # a new member extends the delay
    core.tick(DELAY_MS + 500)
    assert not core.outbox and core.groups[G].state == PREPARING_REBALANCE
    core.tick(1_000 + DELAY_MS)
    answers = _answers(core)
    assert {a["generation_id"] for a in answers.values()} == {1}
    assert len(answers) == 2 and core.groups[G].state == COMPLETING_REBALANCE


def test_initial_delay_never_passes_the_rebalance_timeout() -> None:
    core = _core(DELAY_MS)
    _join(core, 1, now=0)
    answered_at_ms = None
    for token, now in enumerate(range(2_000, 3 * REBALANCE_MS, 2_000), start=2):
        # A join every 2 s would extend a 3 s delay forever; the rebalance timeout caps it.
        core.tick(now - 1)
        if core.outbox:
            answered_at_ms = now - 1
            break
        _join(core, token, now=now)
        if core.outbox:
            answered_at_ms = now
            break
    assert answered_at_ms is not None and answered_at_ms <= REBALANCE_MS
    assert {a["generation_id"] for a in _answers(core).values()} == {1}


def test_no_delay_for_a_group_that_already_has_members() -> None:
    core = _core(DELAY_MS)
    _join(core, 1, now=0)
    core.tick(DELAY_MS)
    a = _answers(core)[1]["member_id"]
    core.sync(2, G, 1, a, instance_id=None, assignments={a: b"x"}, now_ms=DELAY_MS)
    _answers(core)
    _join(core, 3, now=DELAY_MS + 10)  # b joins a Stable group: a rejoins, no initial delay
    _join(core, 4, member=a, now=DELAY_MS + 20)
    assert {v["generation_id"] for v in _answers(core).values()} == {2}


# -- static membership ---------------------------------------------------------------------


def test_static_member_restart_in_stable_group_is_not_a_rebalance() -> None:
    core = _core()
    a, b = _stable_static_group(core)
    assert _join(core, 10, instance="i2", now=100) is None  # answered once persisted
    assert core.writes and decode_key(core.writes[-1][1]) == GroupKey(G)
    answer = _answers(core)[10]
    new_b = answer["member_id"]
    assert answer["error_code"] == 0 and new_b != b
    assert answer["generation_id"] == 1 and answer["leader"] == a and answer["members"] == []
    group = core.groups[G]
    assert group.state == STABLE and group.generation == 1
    assert list(group.members) == [a, new_b] and group.static["i2"] == new_b
    # SyncGroup in the Stable group hands back the old assignment.
    assert core.sync(11, G, 1, new_b, instance_id="i2", assignments={}, now_ms=101) == \
        {"error_code": 0, "assignment": b"B"}
    # The other member sees no rebalance.
    assert core.heartbeat(G, 1, a, instance_id="i1", now_ms=102) == ErrorCode.NONE
    # The old id is fenced everywhere.
    assert core.heartbeat(G, 1, b, instance_id="i2", now_ms=103) == \
        ErrorCode.FENCED_INSTANCE_ID
    assert core.sync(12, G, 1, b, instance_id="i2", assignments={}, now_ms=103) == \
        {"error_code": ErrorCode.FENCED_INSTANCE_ID, "assignment": b""}
    assert core.validate_commit(G, 1, b, "i2") == ErrorCode.FENCED_INSTANCE_ID
    assert core.validate_commit(G, 1, new_b, "i2") == ErrorCode.NONE


def test_static_leader_restart_keeps_leadership_without_rebalance() -> None:
    core = _core()
    a, b = _stable_static_group(core)
    _join(core, 10, instance="i1", now=100)
    answer = _answers(core)[10]
    new_a = answer["member_id"]
    assert answer["generation_id"] == 1 and answer["leader"] == new_a != a
    assert {m["member_id"] for m in answer["members"]} == {new_a, b}
    assert core.groups[G].state == STABLE and core.groups[G].leader == new_a
    # Whatever the leader computes now, the Stable group keeps its assignments.
    assert core.sync(11, G, 1, new_a, instance_id="i1", assignments={new_a: b"X", b: b"Y"},
                     now_ms=101) == {"error_code": 0, "assignment": b"A"}
    assert core.sync(12, G, 1, b, instance_id="i2", assignments={}, now_ms=101) == \
        {"error_code": 0, "assignment": b"B"}
    assert core.heartbeat(G, 1, b, instance_id="i2", now_ms=101) == ErrorCode.NONE


def test_static_member_whose_restart_changes_the_protocol_vote_triggers_a_rebalance() -> None:
    core = _core()
    both = [("range", b""), ("roundrobin", b"")]
    _join(core, 1, instance="i1", protocols=both)
    old = _answers(core)[1]["member_id"]
    core.sync(2, G, 1, old, instance_id="i1", assignments={old: b"A"}, now_ms=0)
    _answers(core)
    assert core.groups[G].protocol == "range"
    # Same protocols: no rebalance.
    _join(core, 3, instance="i1", now=10, protocols=both)
    assert _answers(core)[3]["generation_id"] == 1
    # Preferring another protocol changes the vote: a rebalance, as in Kafka.
    _join(core, 4, instance="i1", now=20, protocols=list(reversed(both)))
    answer = _answers(core)[4]
    assert answer["generation_id"] == 2 and answer["protocol_name"] == "roundrobin"


def test_static_member_restart_during_rebalance_waits_for_the_join() -> None:
    core = _core()
    a, b = _stable_static_group(core)
    _join(core, 10, now=100)  # a dynamic member joins: PreparingRebalance
    assert core.groups[G].state == PREPARING_REBALANCE
    _join(core, 11, instance="i2", now=110)  # i2 restarted meanwhile
    _join(core, 12, member=a, instance="i1", now=120)
    answers = _answers(core)
    assert {answers[t]["generation_id"] for t in (10, 11, 12)} == {2}
    assert answers[11]["member_id"] != b and b not in core.groups[G].members


def test_duplicate_instance_id_with_another_member_id_is_fenced() -> None:
    core = _core()
    a, _ = _stable_static_group(core)
    before = (core.groups[G].generation, dict(core.groups[G].static))
    assert _join(core, 20, member="impostor", instance="i2", now=50)["error_code"] == \
        ErrorCode.FENCED_INSTANCE_ID
    assert _join(core, 21, member=a, instance="i2", now=50)["error_code"] == \
        ErrorCode.FENCED_INSTANCE_ID
    assert core.leave(G, [("impostor", "i2")], now_ms=50) == [ErrorCode.FENCED_INSTANCE_ID]
    assert core.heartbeat(G, 1, a, instance_id="i2", now_ms=50) == \
        ErrorCode.FENCED_INSTANCE_ID
    assert (core.groups[G].generation, core.groups[G].static) == before
    assert core.groups[G].state == STABLE and not core.writes and not core.outbox


def test_static_member_gone_longer_than_session_timeout_is_removed() -> None:
    core = _core()
    a, b = _stable_static_group(core)
    core.heartbeat(G, 1, a, instance_id="i1", now_ms=SESSION_MS - 1)
    core.tick(SESSION_MS)  # b stopped heartbeating: evicted, a must rejoin alone
    assert b not in core.groups[G].members and "i2" not in core.groups[G].static
    assert core.groups[G].state == PREPARING_REBALANCE


# -- offsets.retention.ms (KIP-211) ---------------------------------------------------------


def _tombstones(core: GroupCoordinator) -> set[Any]:
    out = {decode_key(key) for _, key, value in core.writes if value is None}
    core.writes.clear()
    return out


def test_empty_group_offsets_expire_retention_after_it_became_empty() -> None:
    core = _core()
    _join(core, 1, now=0)
    a = _answers(core)[1]["member_id"]
    core.sync(2, G, 1, a, instance_id=None, assignments={}, now_ms=0)
    core.apply_commit(G, {("t", 0): OffsetValue(5, commit_timestamp_ms=10),
                          ("t", 1): OffsetValue(7, commit_timestamp_ms=10)}, 10)
    # Members keep every offset, however old its commit.
    core.heartbeat(G, 1, a, instance_id=None, now_ms=RETENTION_MS)
    assert core.expire_offsets(RETENTION_MS + 100, RETENTION_MS) == 0
    left_ms = RETENTION_MS + 200
    core.leave(G, [(a, None)], now_ms=left_ms)
    assert core.groups[G].state == EMPTY
    core.writes.clear()
    assert core.expire_offsets(left_ms + RETENTION_MS - 1, RETENTION_MS) == 0
    assert not core.writes and len(core.groups[G].offsets) == 2
    assert core.expire_offsets(left_ms + RETENTION_MS, RETENTION_MS) == 2
    assert _tombstones(core) == {OffsetKey(G, "t", 0), OffsetKey(G, "t", 1), GroupKey(G)}
    assert G not in core.groups


def test_simple_group_offsets_expire_by_commit_time_and_busy_ones_stay() -> None:
    core = _core()
    core.apply_commit(G, {("t", 0): OffsetValue(1, commit_timestamp_ms=0)}, 0)
    core.apply_commit(G, {("t", 1): OffsetValue(2, commit_timestamp_ms=500)}, 500)
    core.apply_commit(G, {("t", 2): OffsetValue(3, commit_timestamp_ms=0)}, 500)
    assert core.expire_offsets(RETENTION_MS, RETENTION_MS, lambda g: {("t", 2)}) == 1
    assert _tombstones(core) == {OffsetKey(G, "t", 0)}
    assert set(core.groups[G].offsets) == {("t", 1), ("t", 2)}
    assert core.expire_offsets(RETENTION_MS + 500, RETENTION_MS) == 2
    assert _tombstones(core) == {OffsetKey(G, "t", 1), OffsetKey(G, "t", 2), GroupKey(G)}
    assert core.committed(G, [("t", 1)]) == {("t", 1): None}


def test_expiry_leaves_groups_with_members_or_pending_joins_alone() -> None:
    core = _core()
    _join(core, 1, now=0)  # a member: CompletingRebalance
    core.apply_commit(G, {("t", 0): OffsetValue(1, commit_timestamp_ms=0)}, 0)
    core.groups["other"] = core.groups.pop(G)
    core.groups["other"].group_id = "other"
    pending = core.join(2, "pending", "", instance_id=None, protocol_type="consumer",
                        protocols=[("range", b"")], session_timeout_ms=SESSION_MS,
                        rebalance_timeout_ms=REBALANCE_MS, client_id="c", client_host="/h",
                        require_known_member_id=True, now_ms=0)
    assert pending is not None and pending["error_code"] == ErrorCode.MEMBER_ID_REQUIRED
    assert core.expire_offsets(10 * RETENTION_MS, RETENTION_MS) == 0
    assert set(core.groups) == {"other", "pending"} and not core.writes


def test_a_valid_commit_counts_as_a_heartbeat() -> None:
    core = _core()
    _join(core, 1, now=0)
    a = _answers(core)[1]["member_id"]
    core.sync(2, G, 1, a, instance_id=None, assignments={}, now_ms=0)
    assert core.validate_commit(G, 1, a, None, now_ms=SESSION_MS - 1) == ErrorCode.NONE
    assert core.validate_commit(G, 0, a, None, now_ms=SESSION_MS - 1) == \
        ErrorCode.ILLEGAL_GENERATION
    core.tick(SESSION_MS + 10)  # the commit moved the session deadline
    assert a in core.groups[G].members
    core.tick(2 * SESSION_MS)
    assert a not in core.groups[G].members


def test_initial_delay_longer_than_the_rebalance_timeout_is_not_cut_short() -> None:
    core = _core(DELAY_MS)

    def join(token: int, now: int) -> Any:
        return core.join(token, G, "", instance_id=None, protocol_type="consumer",
                         protocols=[("range", b"")], session_timeout_ms=SESSION_MS,
                         rebalance_timeout_ms=1_000, client_id="c", client_host="/h",
                         require_known_member_id=False, now_ms=now)

    join(1, 0)
    join(2, 100)
    core.tick(DELAY_MS - 1)  # past the 1 s rebalance timeout, inside the 3 s delay
    assert not core.outbox
    core.tick(DELAY_MS)
    assert {a["generation_id"] for a in _answers(core).values()} == {1}
