"""LSO tracking and the aborted-transaction index (raftlog/partition/txn_index.py), fed by
the log's append listener on a real partition, rebuilt on reopen and truncation."""

from __future__ import annotations

from pathlib import Path

from raftlog.partition.batch import build_batch, parse_header
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import Partition
from raftlog.partition.txn_index import (
    ABORT,
    COMMIT,
    AbortedTxn,
    TxnIndex,
    build_marker,
    marker_type,
)

TXN = 0x10


def _data(pid: int, seq: int, n: int = 1, *, transactional: bool = True) -> bytes:
    return build_batch([(b"k", b"v%d" % i, ()) for i in range(n)], producer_id=pid,
                       producer_epoch=0, base_sequence=seq,
                       attributes=TXN if transactional else 0)


def _append(partition: Partition, records: bytes, *, control: bool = False) -> int:
    """Append as the produce path and the coordinator's markers do: the producer state is
    committed after the append (reopening takes the open transactions from it)."""
    info = partition.log.append(records, leader_epoch=0, now_ms=0, allow_control=control)
    header = parse_header(records)
    if header.producer_id >= 0:
        partition.producers.commit_append(header, info.base_offset, info.last_offset, 0)
    partition.high_watermark = partition.log.log_end_offset
    return info.base_offset


def _open(tmp_path: Path, segment_bytes: int | None = None) -> tuple[PartitionManager, Partition]:
    manager = PartitionManager(tmp_path, 1)
    configs = {} if segment_bytes is None else {"segment.bytes": str(segment_bytes)}
    return manager, manager.ensure_partition("t", 0, configs, 0)


def test_marker_roundtrip() -> None:
    assert marker_type(build_marker(7, 1, True, 3, 0)) == COMMIT
    assert marker_type(build_marker(7, 1, False, 3, 0)) == ABORT


def test_lso_follows_open_transactions(tmp_path: Path) -> None:
    manager, partition = _open(tmp_path)
    assert partition.last_stable_offset == 0
    _append(partition, _data(-1, -1, 2, transactional=False))  # offsets 0-1
    assert partition.last_stable_offset == 2
    first_a = _append(partition, _data(10, 0, 2))  # 2-3 open
    _append(partition, _data(11, 0))  # 4 open
    assert partition.last_stable_offset == first_a == 2
    _append(partition, build_marker(10, 0, True, 0, 0), control=True)  # 5 commit A
    assert partition.last_stable_offset == 4  # B still open
    _append(partition, build_marker(11, 0, False, 0, 0), control=True)  # 6 abort B
    assert partition.last_stable_offset == partition.high_watermark == 7
    assert partition.txns.aborted_between(0, 7) == [AbortedTxn(11, 4, 6)]
    assert partition.txns.aborted_between(7, 10) == []
    assert partition.txns.aborted_between(0, 4) == []  # begins at 4: not in [0, 4)
    # The HW bounds the LSO too.
    partition.high_watermark = 3
    assert partition.last_stable_offset == 3
    manager.close()


def test_rebuilt_on_reopen_and_truncation(tmp_path: Path) -> None:
    manager, partition = _open(tmp_path, segment_bytes=200)
    _append(partition, _data(20, 0))  # 0
    _append(partition, build_marker(20, 0, False, 0, 0), control=True)  # 1 abort
    _append(partition, _data(21, 0, 3))  # 2-4 open
    _append(partition, _data(20, 1))  # 5 open (pid 20's next txn)
    assert len(partition.log.segment_base_offsets) > 1
    manager.close()
    manager, partition = _open(tmp_path, segment_bytes=200)
    assert partition.txns.ongoing == {21: 2, 20: 5}
    assert partition.last_stable_offset == 2
    assert list(partition.txns.all_aborted()) == [AbortedTxn(20, 0, 1)]
    partition.truncate_to(2)
    assert partition.txns.ongoing == {}
    assert partition.last_stable_offset == 2
    assert list(partition.txns.all_aborted()) == [AbortedTxn(20, 0, 1)]
    partition.truncate_to(1)
    assert partition.txns.ongoing == {20: 0}
    assert list(partition.txns.all_aborted()) == []
    manager.close()


def test_replicated_appends_feed_the_index(tmp_path: Path) -> None:
    manager, leader = _open(tmp_path / "a")
    _append(leader, _data(30, 0))
    _append(leader, build_marker(30, 0, False, 0, 0), control=True)
    with leader.log.read(0, 1 << 20) as piece:
        data = piece.read_bytes()
    follower_manager, follower = _open(tmp_path / "b")
    follower.log.append_replicated(data, now_ms=0)
    assert list(follower.txns.all_aborted()) == [AbortedTxn(30, 0, 1)]
    manager.close()
    follower_manager.close()


def test_segment_buckets_dropped_with_segments() -> None:
    index = TxnIndex()
    index.observe(_data(1, 0), [_header(_data(1, 0), 0)], 0)
    index.end_transaction(1, 5, ABORT, 0)
    index.ongoing[2] = 10
    index.end_transaction(2, 20, ABORT, 15)
    assert [t.producer_id for t in index.aborted_between(0, 100)] == [1, 2]
    assert [t.producer_id for t in index.aborted_between(6, 100)] == [2]
    index.drop_segments_below([15])
    assert [t.producer_id for t in index.aborted_between(0, 100)] == [2]


def _header(batch: bytes, offset: int):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from raftlog.partition.batch import parse_header
    return replace(parse_header(batch), base_offset=offset)
