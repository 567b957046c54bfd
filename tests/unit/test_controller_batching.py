"""Many partition moves in one Raft entry: PartitionChanges applies each change on its own
terms, and the controller batches its runs of PartitionChange and splits the result back."""

from __future__ import annotations

from raftlog.controller.batching import batch_partition_changes, split_outcome
from raftlog.controller.decisions import Proposal
from raftlog.metadata import errors
from raftlog.metadata.records import (
    CreateTopic,
    FenceBroker,
    PartitionChange,
    PartitionChanges,
    encode_command,
)
from raftlog.metadata.state import ApplyResult
from raftlog.metadata.testing import MachineDriver, make_topic_id
from raftlog.quorum.raft_transport import RAFT_COMMAND_MAX_BYTES


def _driver_with_topic(partitions: int) -> MachineDriver:
    driver = MachineDriver()
    driver.bootstrap((1, 2, 3))
    replicas = tuple((1, 2, 3) for _ in range(partitions))
    assert driver.apply(CreateTopic("t", make_topic_id(5), replicas, ())).ok
    return driver


def _leave(partition: int, epoch: int = 1) -> PartitionChange:
    """Broker 1 leaves: broker 2 leads with ISR (2, 3)."""
    return PartitionChange("t", partition, 2, (2, 3), leader_epoch=1, partition_epoch=epoch)


def test_each_change_applies_on_its_own_and_a_stale_one_is_skipped() -> None:
    driver = _driver_with_topic(3)
    stale = _leave(1, epoch=5)  # the partition is at epoch 0: only 1 would apply
    result = driver.apply(PartitionChanges((_leave(0), stale, _leave(2))))
    assert result.ok
    assert result.value == bytes([0, 0]) + errors.INVALID_UPDATE_VERSION.to_bytes(
        2, "big", signed=True) + bytes([0, 0])
    image = driver.machine.image
    moved = [image.partition("t", p) for p in range(3)]
    assert [(p.leader, p.isr) for p in moved if p is not None] == [
        (2, (2, 3)), (1, (1, 2, 3)), (2, (2, 3))]


def test_runs_of_partition_changes_become_batches_in_order() -> None:
    fence = Proposal(FenceBroker(1), 7, "expired")
    cas = Proposal(_leave(9), 3, "with a version")  # a compare-and-set stays on its own
    moves = [Proposal(_leave(p), None, "reconcile") for p in range(5)]
    batched = batch_partition_changes([*moves[:3], fence, moves[3], cas, moves[4]],
                                      per_entry_max=2)
    kinds = [type(p.record).__name__ for p in batched]
    assert kinds == ["PartitionChanges", "PartitionChange", "FenceBroker", "PartitionChange",
                     "PartitionChange", "PartitionChange"]
    first = batched[0].record
    assert isinstance(first, PartitionChanges)
    assert [c.partition for c in first.changes] == [0, 1]
    assert batched[0].reason == "reconcile" and batched[2] is fence and batched[4] is cas


def test_split_outcome_gives_each_change_its_result() -> None:
    batch = Proposal(PartitionChanges((_leave(0), _leave(1))), None, "new incarnation")
    codes = bytes(2) + errors.INVALID_UPDATE_VERSION.to_bytes(2, "big", signed=True)
    (first, ok), (second, skipped) = split_outcome(batch, ApplyResult(errors.NONE, None, codes))
    assert first.record == _leave(0) and ok.ok and ok.value == 1
    assert second.record == _leave(1) and skipped.error_code == errors.INVALID_UPDATE_VERSION
    refused = ApplyResult(errors.NOT_CONTROLLER, "stale term")
    assert [r for _, r in split_outcome(batch, refused)] == [refused, refused]
    single = Proposal(FenceBroker(1))
    assert list(split_outcome(single, refused)) == [(single, refused)]


def test_a_full_batch_fits_in_one_raft_command() -> None:
    from raftlog.controller.batching import CHANGES_PER_ENTRY_MAX
    from raftlog.metadata.records import Command

    changes = tuple(PartitionChange("a-topic-name-of-sixty-characters-" + "x" * 27, p,
                                    1001, (1001, 1002, 1003), 2**31 - 1, 2**31 - 1)
                    for p in range(CHANGES_PER_ENTRY_MAX))
    encoded = encode_command(Command(PartitionChanges(changes), 2**31 - 1, "ctl-1-1-1"))
    assert len(encoded) < RAFT_COMMAND_MAX_BYTES // 4, len(encoded)
