"""The persisted per-segment aborted-transaction index (``<base>.txnindex``, Kafka's
TransactionIndex format): written with ABORT markers, fsynced with the segment, loaded on
open instead of a log scan, rebuilt when missing, insane or behind the log, cut by
truncation, deleted by retention."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import raftlog.partition.manager as manager_module
import raftlog.partition.txn_index as txn_index_module
from raftlog.partition.batch import build_batch, parse_header
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import Partition
from raftlog.partition.txn_index import AbortedTxn, build_marker
from raftlog.partition.txn_index_file import (
    ENTRY_BYTES,
    TxnIndexEntry,
    decode_entries,
    encode_entries,
    entries_below,
)

TXN = 0x10


def _open(tmp_path: Path, configs: dict[str, str] | None = None
          ) -> tuple[PartitionManager, Partition]:
    manager = PartitionManager(tmp_path, 1)
    return manager, manager.ensure_partition("t", 0, configs or {"segment.bytes": "300"}, 0)


def _append(partition: Partition, records: bytes, *, control: bool = False) -> int:
    info = partition.log.append(records, leader_epoch=0, now_ms=0, allow_control=control)
    header = parse_header(records)
    if header.producer_id >= 0:
        partition.producers.commit_append(header, info.base_offset, info.last_offset, 0)
    partition.high_watermark = partition.log.log_end_offset
    return info.base_offset


def _data(pid: int, seq: int, n: int = 1) -> bytes:
    return build_batch([(b"k", b"v%d" % i, ()) for i in range(n)], producer_id=pid,
                       producer_epoch=0, base_sequence=seq, attributes=TXN)


def _txn(partition: Partition, pid: int, seq: int, *, commit: bool) -> AbortedTxn | None:
    first = _append(partition, _data(pid, seq, 2))
    marker = _append(partition, build_marker(pid, 0, commit, 0, 0), control=True)
    return None if commit else AbortedTxn(pid, first, marker)


def _flush(partition: Partition) -> None:
    ticket = partition.log.begin_flush()
    if ticket is not None:
        ticket.run()
        partition.log.complete_flush(ticket)


def _fill(partition: Partition, count: int) -> list[AbortedTxn]:
    aborted = []
    for i in range(count):
        txn = _txn(partition, 100 + i % 3, 2 * (i // 3), commit=i % 2 == 0)
        if txn is not None:
            aborted.append(txn)
    return aborted


def _no_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("the log was scanned")

    monkeypatch.setattr(txn_index_module, "rebuild_txn_index", fail)


def test_format_roundtrip_and_sanity_checks() -> None:
    entries = [TxnIndexEntry(7, 10, 12, 13), TxnIndexEntry(8, 11, 20, 21)]
    data = encode_entries(entries)
    assert len(data) == 2 * ENTRY_BYTES == 68
    assert decode_entries(data, base_offset=10, end_offset=30) == entries
    assert decode_entries(data[:-1], base_offset=10, end_offset=30) is None  # torn
    assert decode_entries(data, base_offset=10, end_offset=20) is None  # marker past end
    assert decode_entries(data, base_offset=13, end_offset=30) is None  # before the segment
    assert decode_entries(data[34:] + data[:34], base_offset=10, end_offset=30) is None
    assert decode_entries(b"\x00\x01" + data[2:], base_offset=10, end_offset=30) is None
    assert entries_below(data, 20) == data[:34]


def test_aborts_are_persisted_per_segment_and_loaded_without_a_scan(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manager, partition = _open(tmp_path)
    aborted = _fill(partition, 12)
    assert len(partition.log.segments) > 2 and len(aborted) == 6
    active = partition.log.segments[-1]
    assert active.txn_index_written_bytes > active.txn_index_synced_bytes  # not yet fsynced
    _flush(partition)
    assert active.txn_index_written_bytes == active.txn_index_synced_bytes  # the flush did
    on_disk = [e for s in partition.log.segments
               for e in decode_entries(s.read_txn_index() or b"", base_offset=s.base_offset,
                                       end_offset=s.next_offset) or []]
    assert [(e.producer_id, e.first_offset, e.last_offset) for e in on_disk] == \
        [(t.producer_id, t.first_offset, t.last_offset) for t in aborted]
    assert all(e.last_stable_offset == e.last_offset + 1 for e in on_disk)
    manager.close()
    _no_scan(monkeypatch)
    manager, partition = _open(tmp_path)
    assert list(partition.txns.all_aborted()) == aborted
    assert partition.txns.ongoing == {}
    manager.close()


def test_an_open_transaction_comes_from_the_producer_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manager, partition = _open(tmp_path)
    aborted = _fill(partition, 5)
    first = _append(partition, _data(200, 0))
    manager.close()
    _no_scan(monkeypatch)
    manager, partition = _open(tmp_path)
    assert partition.txns.ongoing == {200: first}
    assert partition.last_stable_offset == first
    assert list(partition.txns.all_aborted()) == aborted
    manager.close()


def test_missing_or_insane_files_are_rebuilt_from_the_log(tmp_path: Path) -> None:
    manager, partition = _open(tmp_path)
    aborted = _fill(partition, 12)
    segments = partition.log.segments
    manager.close()
    segments[1].txn_index_path.unlink()
    segments[2].txn_index_path.write_bytes(b"garbage")
    manager, partition = _open(tmp_path)
    assert list(partition.txns.all_aborted()) == aborted
    for segment in partition.log.segments:  # rewritten, so the next open needs no scan
        data = segment.read_txn_index()
        assert data is not None and decode_entries(
            data, base_offset=segment.base_offset, end_offset=segment.next_offset) is not None
    manager.close()


def test_an_abort_whose_entry_was_lost_in_a_crash_is_found_again(tmp_path: Path) -> None:
    manager, partition = _open(tmp_path, {"segment.bytes": str(1 << 20)})
    aborted = _fill(partition, 4)
    active = partition.log.segments[-1]
    # A crash after the marker reached the disk but before its entry did.
    active.txn_index_path.write_bytes(active.read_txn_index()[:-ENTRY_BYTES])  # type: ignore[index]
    manager.close()
    manager, partition = _open(tmp_path, {"segment.bytes": str(1 << 20)})
    assert list(partition.txns.all_aborted()) == aborted
    manager.close()


def test_entries_past_a_lost_tail_are_dropped(tmp_path: Path) -> None:
    manager, partition = _open(tmp_path, {"segment.bytes": str(1 << 20)})
    aborted = _fill(partition, 4)
    log_path = partition.log.segments[-1].log_path
    manager.close()
    # The log lost its last batch (the last ABORT marker) but its entry was synced.
    size = log_path.stat().st_size
    marker_size = len(build_marker(1, 0, False, 0, 0))
    with log_path.open("r+b") as file:
        file.truncate(size - marker_size)
    manager, partition = _open(tmp_path, {"segment.bytes": str(1 << 20)})
    assert list(partition.txns.all_aborted()) == aborted[:-1]
    manager.close()


def test_an_empty_abort_has_an_entry_on_disk_but_none_in_memory(tmp_path: Path) -> None:
    manager, partition = _open(tmp_path, {"segment.bytes": str(1 << 20)})
    marker = _append(partition, build_marker(5, 0, False, 0, 0), control=True)
    assert list(partition.txns.all_aborted()) == []
    entries = decode_entries(partition.log.segments[-1].read_txn_index() or b"",
                             base_offset=0, end_offset=1)
    assert entries == [TxnIndexEntry(5, marker, marker, marker + 1)]
    manager.close()


def test_truncation_cuts_the_file_and_retention_deletes_it(tmp_path: Path) -> None:
    manager, partition = _open(tmp_path, {"segment.bytes": "300", "retention.bytes": "0"})
    aborted = _fill(partition, 12)
    last = aborted[-1]
    partition.truncate_to(last.last_offset)
    assert list(partition.txns.all_aborted()) == aborted[:-1]
    active = partition.log.segments[-1]
    assert all(e.last_offset < last.last_offset for e in decode_entries(
        active.read_txn_index() or b"", base_offset=active.base_offset,
        end_offset=active.next_offset + 1) or [])
    doomed = partition.log.segments[0].txn_index_path
    assert manager.enforce_retention() > 0
    assert not doomed.exists()
    manager.close()


Op = tuple[str, int]
_ops = st.lists(st.tuples(st.sampled_from(["data", "plain", "commit", "abort", "reopen",
                                           "truncate", "roll", "snapshot", "crash"]),
                          st.integers(1, 3)), min_size=1, max_size=40)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_ops)
def test_opening_from_files_equals_a_full_scan(tmp_path_factory: pytest.TempPathFactory,
                                               ops: list[Op]) -> None:
    """Whatever happened (transactions, aborts, rolls, truncations, restarts), the index
    opened from the .txnindex files and the producer state is the one a scan builds."""
    directory = tmp_path_factory.mktemp("txn")
    configs = {"segment.bytes": "250"}
    manager, partition = _open(directory, configs)
    sequences: dict[int, int] = {}
    try:
        for op, pid in ops:
            if op == "data":
                _append(partition, _data(pid, sequences.get(pid, 0)))
                sequences[pid] = sequences.get(pid, 0) + 1
            elif op == "plain":
                _append(partition, build_batch([(b"k", b"v", ())]))
            elif op in ("commit", "abort"):
                _append(partition, build_marker(pid, 0, op == "commit", 0, 0), control=True)
            elif op == "truncate":
                partition.truncate_to(partition.log.log_end_offset * pid // 4)
            elif op == "roll":
                partition.log.segments[-1].rolling_base_ms = -10**12  # next append rolls
            elif op == "snapshot":  # as the 30 s task does
                manager_module._write_producer_snapshots([partition])
            elif op == "crash":  # no shutdown snapshot: the producer state replays the log
                _flush(partition)
                partition.log.close()
                manager, partition = _open(directory, configs)
            else:
                manager.close()
                manager, partition = _open(directory, configs)
            scanned = txn_index_module.rebuild_txn_index(partition.log)
            assert partition.txns.ongoing == scanned.ongoing, op
            assert list(partition.txns.all_aborted()) == list(scanned.all_aborted()), op
    finally:
        manager.close()
