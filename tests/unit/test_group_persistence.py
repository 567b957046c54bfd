"""The pure group coordinator's persistence: what a coordinator reloads from its
``__consumer_offsets`` records after a restart (replay), and what happens when a group
metadata record does not reach the log (Kafka's ``storeGroup`` error callbacks).

The invariant behind both: a client never holds a member id or an assignment that a
coordinator reloading the log would not know — otherwise a static member is fenced
(FENCED_INSTANCE_ID, fatal for the consumer) after a broker restart or failover.
"""

from __future__ import annotations

import itertools
from typing import Any

from raftlog.group.coordinator import (
    PREPARING_REBALANCE,
    STABLE,
    GroupCoordinator,
)
from raftlog.group.records import GroupKey, OffsetKey, decode_group_value, decode_key
from raftlog.protocol.errors import ErrorCode

SESSION_MS = 10_000
G = "group"


def _core(prefix: str = "") -> GroupCoordinator:
    ids = itertools.count()
    return GroupCoordinator(new_member_id=lambda p: f"{prefix}{p}-{next(ids)}")


def _join(core: GroupCoordinator, token: int, member: str = "", now: int = 0,
          instance: str | None = None) -> Any:
    return core.join(token, G, member, instance_id=instance, protocol_type="consumer",
                     protocols=[("range", b"sub"), ("roundrobin", b"sub")],
                     session_timeout_ms=SESSION_MS, rebalance_timeout_ms=SESSION_MS,
                     client_id="c", client_host="/h", require_known_member_id=True,
                     now_ms=now)


def _answers(core: GroupCoordinator) -> dict[int, Any]:
    out = dict(core.outbox)
    core.outbox.clear()
    return out


def _log(core: GroupCoordinator) -> list[tuple[str, bytes, bytes | None]]:
    """The records the shell would have appended so far (and drains them)."""
    records = list(core.writes)
    core.writes.clear()
    core.persists.clear()
    return records


def _reload(records: list[tuple[str, bytes, bytes | None]], now: int) -> GroupCoordinator:
    """A new coordinator that replays ``records`` in log order, as GroupService._load does."""
    fresh = _core("reloaded-")
    for group_id, key, value in records:
        parsed = decode_key(key)
        if isinstance(parsed, GroupKey):
            fresh.load_group(group_id, None if value is None else decode_group_value(value),
                             now)
        elif isinstance(parsed, OffsetKey):
            raise AssertionError("no offsets in these scenarios")
    return fresh


def _static_member(core: GroupCoordinator, records: list[Any], instance: str = "app-1"
                   ) -> tuple[str, int]:
    """One static member joined and synced (Stable); its member id and generation."""
    _join(core, 1, instance=instance)
    joined = _answers(core)[1]
    member, generation = joined["member_id"], joined["generation_id"]
    core.sync(2, G, generation, member, instance_id=instance, assignments={member: b"A"},
              now_ms=0)
    assert _answers(core)[2] == {"error_code": 0, "assignment": b"A"}
    records.extend(_log(core))
    return member, generation


def test_replay_after_a_static_replacement_knows_the_new_member_id() -> None:
    core = _core()
    records: list[Any] = []
    first, generation = _static_member(core, records)
    # The application restarts: JoinGroup with no member id and the same instance id.
    assert _join(core, 3, instance="app-1", now=1_000) is None
    records.extend(_log(core))
    second = _answers(core)[3]["member_id"]
    assert second != first
    # A heartbeat and an offset commit in between write nothing that matters.
    assert core.heartbeat(G, generation, second, instance_id="app-1", now_ms=1_100) == 0

    # The broker is SIGKILLed and restarts: the reloaded group must name the new id.
    reloaded = _reload(records, now=2_000)
    group = reloaded.groups[G]
    assert group.state == STABLE and group.generation == generation
    assert group.static == {"app-1": second} and list(group.members) == [second]
    assert group.members[second].assignment == b"A"
    assert reloaded.heartbeat(G, generation, second, instance_id="app-1", now_ms=2_001) == 0
    assert reloaded.validate_commit(G, generation, second, "app-1") == 0
    # The consumer rejoins with its id: not fenced, the group rebalances around it.
    assert _join(reloaded, 4, member=second, instance="app-1", now=2_002) is None
    rejoined = _answers(reloaded)[4]
    assert rejoined["error_code"] == 0 and rejoined["member_id"] == second
    # The old incarnation is the one that is fenced.
    assert reloaded.heartbeat(G, generation, first, instance_id="app-1", now_ms=2_003) == \
        ErrorCode.FENCED_INSTANCE_ID


def test_replay_of_two_replacements_and_a_rebalance_keeps_the_latest_ids() -> None:
    core = _core()
    records: list[Any] = []
    a, generation = _static_member(core, records, "app-1")
    # A second static member joins: a rebalance, persisted when the leader syncs.
    _join(core, 10, instance="app-2", now=100)
    _join(core, 11, member=a, instance="app-1", now=101)
    joined = _answers(core)
    b, generation = joined[10]["member_id"], joined[10]["generation_id"]
    core.sync(12, G, generation, b, instance_id="app-2", assignments={}, now_ms=102)
    core.sync(13, G, generation, a, instance_id="app-1", assignments={a: b"A", b: b"B"},
              now_ms=102)
    records.extend(_log(core))
    # Both restart in turn.
    _join(core, 20, instance="app-1", now=200)
    _join(core, 21, instance="app-2", now=201)
    answers = _answers(core)
    records.extend(_log(core))
    new_a, new_b = answers[20]["member_id"], answers[21]["member_id"]
    reloaded = _reload(records, now=300)
    assert reloaded.groups[G].static == {"app-1": new_a, "app-2": new_b}
    assert reloaded.groups[G].leader == new_a
    for member, instance in ((new_a, "app-1"), (new_b, "app-2")):
        assert reloaded.heartbeat(G, generation, member, instance_id=instance,
                                  now_ms=301) == 0


def test_a_static_replacement_whose_record_failed_is_undone() -> None:
    core = _core()
    records: list[Any] = []
    first, generation = _static_member(core, records)
    _join(core, 3, instance="app-1", now=1_000)
    [persist] = core.persists
    assert persist.tokens == (3,)
    new_id = core.groups[G].static["app-1"]
    # The shell could not append the record (e.g. NOT_ENOUGH_REPLICAS): it is not in the log.
    core.writes.clear()
    core.persists.clear()
    core.outbox.clear()  # the success answer is superseded
    core.persist_failed(persist, ErrorCode.COORDINATOR_NOT_AVAILABLE, now_ms=1_001)
    assert _answers(core) == {3: {"error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                  "generation_id": -1, "protocol_name": "", "leader": "",
                                  "member_id": "", "members": []}}
    group = core.groups[G]
    assert group.static == {"app-1": first} and list(group.members) == [first]
    assert group.leader == first and group.members[first].assignment == b"A"
    assert core.heartbeat(G, generation, new_id, instance_id="app-1", now_ms=1_002) == \
        ErrorCode.FENCED_INSTANCE_ID
    # Memory and log agree again: a reload knows exactly what this coordinator knows.
    assert _reload(records, now=1_003).groups[G].static == group.static
    # The client retries with no member id and gets a new id, this time persisted.
    _join(core, 4, instance="app-1", now=1_100)
    retried = _answers(core)[4]
    records.extend(_log(core))
    assert retried["error_code"] == 0
    assert _reload(records, now=1_200).groups[G].static == {"app-1": retried["member_id"]}


def test_a_failed_undo_leaves_a_group_that_moved_on_alone() -> None:
    core = _core()
    records: list[Any] = []
    _static_member(core, records)
    _join(core, 3, instance="app-1", now=1_000)
    [persist] = core.persists
    core.writes.clear()
    core.persists.clear()
    # The new member left before the failure was known: nothing to undo.
    assert core.leave(G, [("", "app-1")], now_ms=1_001) == [0]
    static_before = dict(core.groups[G].static)
    core.persist_failed(persist, ErrorCode.COORDINATOR_NOT_AVAILABLE, now_ms=1_002)
    assert core.groups[G].static == static_before == {}


def test_a_sync_whose_record_failed_answers_the_error_and_rebalances() -> None:
    core = _core()
    _join(core, 1, instance="app-1")
    joined = _answers(core)[1]
    member, generation = joined["member_id"], joined["generation_id"]
    assert core.sync(2, G, generation, member, instance_id="app-1",
                     assignments={member: b"A"}, now_ms=0) is None
    [persist] = core.persists
    assert persist.tokens == (2,)
    core.writes.clear()
    core.persists.clear()
    core.outbox.clear()
    core.persist_failed(persist, ErrorCode.NOT_COORDINATOR, now_ms=1)
    assert _answers(core) == {2: {"error_code": ErrorCode.NOT_COORDINATOR,
                                  "assignment": b""}}
    group = core.groups[G]
    assert group.state == PREPARING_REBALANCE and group.members[member].assignment == b""
    assert core.heartbeat(G, generation, member, instance_id="app-1", now_ms=2) == \
        ErrorCode.REBALANCE_IN_PROGRESS
