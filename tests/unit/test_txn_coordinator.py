"""The pure transaction state machine (raftlog/txn/coordinator.py)."""

from __future__ import annotations

import itertools

from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.internal_topics import coordinator_partition
from raftlog.txn import coordinator as core
from raftlog.txn.coordinator import TxnState

_ids = itertools.count(1000)


def _new_id() -> int:
    return next(_ids)


def _init(current: core.TxnMetadata | None = None, pid: int = -1, epoch: int = -1
          ) -> core.Transition:
    return core.init_producer_id(current, "t", 60_000, pid, epoch, 0, _new_id)


def test_partition_for_matches_java_hash() -> None:
    # "abc".hashCode() == 96354; "transactional-id" checked against Java by hand.
    assert coordinator_partition("abc", 50) == 96354 % 50
    assert 0 <= coordinator_partition("\u00e9\u4e2d", 50) < 50


def test_happy_path_commit_and_abort() -> None:
    meta = _init().new
    assert meta is not None and meta.state == TxnState.EMPTY and meta.producer_epoch == 0
    added = core.add_partitions(meta, meta.producer_id, 0, [("a", 0)], 10).new
    assert added is not None and added.state == TxnState.ONGOING and added.txn_start_ms == 10
    assert core.add_partitions(added, meta.producer_id, 0, [("a", 0)], 11).new is None
    ending = core.end_txn(added, meta.producer_id, 0, True, 12)
    assert ending.markers and ending.new is not None
    assert ending.new.state == TxnState.PREPARE_COMMIT
    assert core.end_txn(ending.new, meta.producer_id, 0, True, 13).error == \
        ErrorCode.CONCURRENT_TRANSACTIONS
    assert core.add_partitions(ending.new, meta.producer_id, 0, [("b", 0)], 13).error == \
        ErrorCode.CONCURRENT_TRANSACTIONS
    done = core.complete(ending.new, 14)
    assert done.state == TxnState.COMPLETE_COMMIT and not done.partitions
    assert core.end_txn(done, meta.producer_id, 0, True, 15).error == ErrorCode.NONE  # retry
    assert core.end_txn(done, meta.producer_id, 0, False, 15).error == \
        ErrorCode.INVALID_TXN_STATE
    again = core.add_partitions(done, meta.producer_id, 0, [("b", 1)], 20).new
    assert again is not None and again.partitions == {("b", 1)} and again.txn_start_ms == 20


def test_fencing_and_errors() -> None:
    meta = _init().new
    assert meta is not None
    assert core.end_txn(None, 1, 0, True, 0).error == ErrorCode.INVALID_PRODUCER_ID_MAPPING
    assert core.end_txn(meta, meta.producer_id + 1, 0, True, 0).error == \
        ErrorCode.INVALID_PRODUCER_ID_MAPPING
    assert core.end_txn(meta, meta.producer_id, 0, True, 0).error == ErrorCode.INVALID_TXN_STATE
    ongoing = core.add_partitions(meta, meta.producer_id, 0, [("a", 0)], 1).new
    assert ongoing is not None
    # A new incarnation: epoch bumped, the open transaction aborted, the client told to retry.
    fence = _init(ongoing)
    assert fence.error == ErrorCode.CONCURRENT_TRANSACTIONS and fence.markers
    assert fence.new is not None and fence.new.state == TxnState.PREPARE_ABORT
    assert fence.new.producer_epoch == 1
    assert core.add_partitions(fence.new, meta.producer_id, 0, [("a", 0)], 2).error == \
        ErrorCode.PRODUCER_FENCED
    assert _init(fence.new).error == ErrorCode.CONCURRENT_TRANSACTIONS
    aborted = core.complete(fence.new, 3)
    retry = _init(aborted)
    assert retry.error == ErrorCode.NONE and retry.new is not None
    assert retry.new.producer_epoch == 2 and retry.new.state == TxnState.EMPTY
    # KIP-360: a bump with a stale epoch is fenced; the retry of the last bump is answered.
    assert _init(retry.new, meta.producer_id, 0).error == ErrorCode.PRODUCER_FENCED
    assert _init(retry.new, meta.producer_id, 1).new == retry.new
    assert core.init_producer_id(None, "t", 0, -1, -1, 0, _new_id).error == \
        ErrorCode.INVALID_TRANSACTION_TIMEOUT


def test_epoch_exhaustion_gives_a_new_producer_id() -> None:
    meta = _init().new
    assert meta is not None
    from dataclasses import replace
    worn = replace(meta, producer_epoch=core.EPOCH_EXHAUSTED)
    bumped = _init(worn).new
    assert bumped is not None and bumped.producer_id != meta.producer_id
    assert bumped.producer_epoch == 0


def test_timeout_abort_bumps_the_epoch() -> None:
    meta = _init().new
    assert meta is not None
    ongoing = core.add_partitions(meta, meta.producer_id, 0, [("a", 0)], 100).new
    assert ongoing is not None
    assert not core.timed_out(ongoing, 100 + 60_000)
    assert core.timed_out(ongoing, 100 + 60_001)
    abort = core.begin_timeout_abort(ongoing, 60_200, _new_id)
    assert abort.markers and abort.new is not None
    assert abort.new.state == TxnState.PREPARE_ABORT and abort.new.producer_epoch == 1


def test_metadata_roundtrip() -> None:
    meta = _init().new
    assert meta is not None
    ongoing = core.add_partitions(meta, meta.producer_id, 0, [("a", 0), ("b", 3)], 5,
                                  groups=["g"]).new
    assert ongoing is not None
    assert core.decode_metadata("t", core.encode_metadata(ongoing)) == ongoing


def test_verify_partitions_answers_without_changing_anything() -> None:
    """AddPartitionsToTxn v4 verify_only (KIP-890 part 1), the coordinator's answer."""
    meta = _init().new
    assert meta is not None
    pid = meta.producer_id
    assert core.verify_partitions(None, pid, 0, [("a", 0)]) == \
        {("a", 0): ErrorCode.INVALID_PRODUCER_ID_MAPPING}
    assert core.verify_partitions(meta, pid, 0, [("a", 0)]) == \
        {("a", 0): ErrorCode.INVALID_TXN_STATE}  # Empty: no transaction open
    added = core.add_partitions(meta, pid, 0, [("a", 0)], 10).new
    assert added is not None
    assert core.verify_partitions(added, pid, 0, [("a", 0), ("a", 1)]) == {
        ("a", 0): ErrorCode.NONE, ("a", 1): ErrorCode.INVALID_TXN_STATE}
    assert core.verify_partitions(added, pid, 1, [("a", 0)]) == \
        {("a", 0): ErrorCode.PRODUCER_FENCED}
    assert core.verify_partitions(added, pid + 1, 0, [("a", 0)]) == \
        {("a", 0): ErrorCode.INVALID_PRODUCER_ID_MAPPING}
    preparing = core.end_txn(added, pid, 0, True, 11).new
    assert preparing is not None
    assert core.verify_partitions(preparing, pid, 0, [("a", 0)]) == \
        {("a", 0): ErrorCode.CONCURRENT_TRANSACTIONS}  # retriable: ask again
    done = core.complete(preparing, 12)
    assert core.verify_partitions(done, pid, 0, [("a", 0)]) == \
        {("a", 0): ErrorCode.INVALID_TXN_STATE}
