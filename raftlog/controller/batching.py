"""One Raft entry for many partition moves: the controller's runs of PartitionChange
proposals become PartitionChanges records, and a batch's result is split back per change.

Fencing a broker, a new incarnation leaving what its predecessor held, a controlled shutdown
and the reconciliation can each move every partition a broker holds. Committed one entry at
a time that took minutes for a thousand partitions (each waits for its own Raft commit), and
a broker's registration timed out and was retried meanwhile. Kafka's controller writes such
moves as one record batch. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from raftlog.controller.decisions import Proposal
from raftlog.metadata import errors
from raftlog.metadata.records import PartitionChange, PartitionChanges
from raftlog.metadata.state import ApplyResult

__all__ = ["CHANGES_PER_ENTRY_MAX", "batch_partition_changes", "split_outcome"]

# Bounds one Raft entry (a PartitionChange encodes to well under 100 bytes).
CHANGES_PER_ENTRY_MAX: Final = 1000


def batch_partition_changes(proposals: Iterable[Proposal],
                            per_entry_max: int = CHANGES_PER_ENTRY_MAX) -> list[Proposal]:
    """``proposals`` in order, with each run of two or more PartitionChange proposals
    without a compare-and-set version (their partition epoch is their check) turned into
    PartitionChanges proposals of at most ``per_entry_max`` changes."""
    assert per_entry_max >= 1
    out: list[Proposal] = []
    run: list[Proposal] = []

    def flush() -> None:
        for start in range(0, len(run), per_entry_max):
            chunk = run[start:start + per_entry_max]
            if len(chunk) == 1:
                out.append(chunk[0])
                continue
            changes = tuple(p.record for p in chunk if isinstance(p.record, PartitionChange))
            reasons = sorted({p.reason for p in chunk})
            out.append(Proposal(PartitionChanges(changes), None, ", ".join(reasons)))
        run.clear()

    for proposal in proposals:
        if isinstance(proposal.record, PartitionChange) and proposal.expected_version is None:
            run.append(proposal)
            continue
        flush()
        out.append(proposal)
    flush()
    return out


def split_outcome(proposal: Proposal, result: ApplyResult
                  ) -> Sequence[tuple[Proposal, ApplyResult]]:
    """Each change's own proposal and result; other proposals come back as they are. A batch
    rejected as a whole (NOT_CONTROLLER) rejects every change the same way."""
    record = proposal.record
    if not isinstance(record, PartitionChanges):
        return ((proposal, result),)
    singles = [Proposal(change, None, proposal.reason) for change in record.changes]
    if not result.ok:
        return [(single, result) for single in singles]
    codes = result.value
    assert isinstance(codes, bytes) and len(codes) == 2 * len(singles), (codes, len(singles))
    outcomes = []
    for i, single in enumerate(singles):
        code = int.from_bytes(codes[2 * i:2 * i + 2], "big", signed=True)
        assert isinstance(single.record, PartitionChange)
        if code == errors.NONE:
            outcome = ApplyResult(errors.NONE, None, single.record.partition_epoch)
        else:
            outcome = ApplyResult(code, f"skipped in its batch: {errors.error_name(code)}")
        outcomes.append((single, outcome))
    return outcomes
