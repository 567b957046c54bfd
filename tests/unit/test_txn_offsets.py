"""The group coordinator's pending transactional offsets and KIP-447 validation (pure)."""

from __future__ import annotations

from raftlog.group.coordinator import DEAD, Group, GroupCoordinator, Member
from raftlog.group.records import OffsetValue
from raftlog.group.txn_offsets import PendingTxnOffsets, validate_txn_commit
from raftlog.protocol.errors import ErrorCode


def test_stage_resolve_and_has_pending() -> None:
    pending = PendingTxnOffsets()
    pending.stage(7, 3, "g", {("t", 0): OffsetValue(5)})
    pending.stage(7, 3, "g", {("t", 1): OffsetValue(6)})
    pending.stage(8, 3, "g", {("t", 0): OffsetValue(9)})
    assert pending.has_pending("g") and pending.has_pending("g", ("t", 1))
    assert not pending.has_pending("g", ("t", 2)) and not pending.has_pending("other")
    assert pending.resolve(7, 3) == {"g": {("t", 0): OffsetValue(5), ("t", 1): OffsetValue(6)}}
    assert pending.resolve(7, 3) == {}
    assert pending.pending_partitions("g") == {("t", 0)}
    pending.drop_partition(3)
    assert not pending.has_pending("g") and pending.staged == {}


def _group() -> Group:
    member = Member("m1", None, "c", "h", 10_000, 10_000, (), 0)
    return Group("g", state="Stable", generation=4, members={"m1": member},
                 static={"i1": "m1"})


def test_kip447_validation() -> None:
    fenced = GroupCoordinator()._fenced
    group = _group()
    assert validate_txn_commit(None, -1, "", None, fenced) == ErrorCode.NONE
    assert validate_txn_commit(None, 3, "m1", None, fenced) == ErrorCode.ILLEGAL_GENERATION
    assert validate_txn_commit(group, -1, "", None, fenced) == ErrorCode.NONE  # v0-2 style
    assert validate_txn_commit(group, 4, "m1", None, fenced) == ErrorCode.NONE
    assert validate_txn_commit(group, 3, "m1", None, fenced) == ErrorCode.ILLEGAL_GENERATION
    assert validate_txn_commit(group, 4, "m2", None, fenced) == ErrorCode.UNKNOWN_MEMBER_ID
    assert validate_txn_commit(group, 4, "m2", "i1", fenced) == ErrorCode.FENCED_INSTANCE_ID
    group.state = DEAD
    assert validate_txn_commit(group, 4, "m1", None, fenced) == \
        ErrorCode.COORDINATOR_NOT_AVAILABLE
