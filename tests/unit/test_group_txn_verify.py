"""TxnOffsetCommit's errors for the transaction coordinator's verification verdicts (KIP-890
part 1): the produce path's codes, as Kafka's group coordinator converts append errors."""

from __future__ import annotations

import pytest

from raftlog.group.txn_offsets import _verify_error
from raftlog.protocol.errors import ErrorCode
from raftlog.txn.verification import _produce_verdict


@pytest.mark.parametrize(("coordinator_code", "expected"), [
    (ErrorCode.INVALID_TXN_STATE, ErrorCode.INVALID_TXN_STATE),  # offsets not added
    (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH),
    (ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.INVALID_PRODUCER_EPOCH),
    # Could not ask, or the coordinator is busy: retriable for the client.
    (ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.COORDINATOR_NOT_AVAILABLE),
    (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE),
    (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE),
    (ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.COORDINATOR_NOT_AVAILABLE),
    (ErrorCode.REQUEST_TIMED_OUT, ErrorCode.COORDINATOR_NOT_AVAILABLE),
])
def test_coordinator_answers_become_txn_offset_commit_errors(coordinator_code: int,
                                                             expected: int) -> None:
    verdict = _produce_verdict(coordinator_code, "__consumer_offsets", 3, 7)
    assert verdict is not None
    assert _verify_error(verdict[0]) == expected


def test_partition_trouble_and_unreachable_coordinator() -> None:
    assert _verify_error(ErrorCode.NOT_LEADER_OR_FOLLOWER) == ErrorCode.NOT_COORDINATOR
    # The verifier's own "could not reach the coordinator" verdict.
    assert _verify_error(ErrorCode.NOT_ENOUGH_REPLICAS) == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert _produce_verdict(ErrorCode.NONE, "__consumer_offsets", 3, 7) is None
