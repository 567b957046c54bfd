"""The Raft layer's storage: journal, term/vote metadata, snapshots and meta.properties.

Goal: what pysyncobj is told is stored survives a crash once flushed, a torn tail is dropped
(never acknowledged data), compaction never leaves a moment where entries are in neither the
journal nor a durable snapshot, and a data directory cannot be adopted by the wrong node.
Method: real files in tmp_path; crashes are simulated by reopening without closing, and fsyncs
are observed by wrapping ``os.fsync``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlog.quorum.raft_storage import (
    DurableJournal,
    MetaPropertiesError,
    RaftSnapshot,
    RaftStorageError,
    check_meta_properties,
    decode_snapshot,
    encode_snapshot,
    read_snapshot_file,
    write_snapshot_file,
)


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Names of the files fsynced while the test runs."""
    names: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        names.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    yield names


def journal(tmp_path: Path) -> DurableJournal:
    return DurableJournal(tmp_path / "raft.journal", tmp_path / "raft.snapshot")


def entries(j: DurableJournal) -> list[tuple[bytes, int, int]]:
    return j[:]


def test_entries_survive_reopen_after_flush(tmp_path: Path) -> None:
    j = journal(tmp_path)
    for idx in range(1, 6):
        j.add(b"cmd-%d" % idx, idx, 1)
    j.flush()
    # No close: a crash after the flush.
    again = journal(tmp_path)
    assert entries(again) == [(b"cmd-%d" % i, i, 1) for i in range(1, 6)]


def test_flush_fsyncs_once_per_batch_and_only_when_dirty(
    tmp_path: Path, fsynced: list[str]
) -> None:
    j = journal(tmp_path)
    fsynced.clear()
    for idx in range(1, 4):
        j.add(b"x", idx, 1)
    j.flush()
    j.flush()
    assert fsynced == ["raft.journal"]
    assert j.fsync_count == 1


def test_torn_tail_is_truncated_and_appends_continue(tmp_path: Path) -> None:
    j = journal(tmp_path)
    for idx in range(1, 4):
        j.add(b"payload", idx, 2)
    j.flush()
    path = tmp_path / "raft.journal"
    size = path.stat().st_size
    with open(path, "r+b") as file:
        file.truncate(size - 3)
    again = journal(tmp_path)
    assert [e[1] for e in entries(again)] == [1, 2]
    again.add(b"new", 3, 3)
    again.flush()
    assert entries(journal(tmp_path))[-1] == (b"new", 3, 3)


def test_corrupt_middle_frame_keeps_only_the_good_prefix(tmp_path: Path) -> None:
    j = journal(tmp_path)
    for idx in range(1, 4):
        j.add(b"payload-%d" % idx, idx, 1)
    j.flush()
    path = tmp_path / "raft.journal"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF  # inside the last frame: its CRC fails
    path.write_bytes(bytes(data))
    assert [e[1] for e in entries(journal(tmp_path))] == [1, 2]


def test_delete_entries_from_truncates_conflicting_tail(tmp_path: Path) -> None:
    j = journal(tmp_path)
    for idx in range(1, 6):
        j.add(b"old", idx, 1)
    j.deleteEntriesFrom(3)  # list positions >= 3: indexes 4 and 5
    j.add(b"new", 4, 2)
    j.flush()
    assert [(e[1], e[2]) for e in entries(journal(tmp_path))] == [(1, 1), (2, 1), (3, 1), (4, 2)]


def test_compaction_makes_snapshot_durable_before_dropping_entries(
    tmp_path: Path, fsynced: list[str]
) -> None:
    j = journal(tmp_path)
    for idx in range(1, 11):
        j.add(b"e", idx, 1)
    j.flush()
    (tmp_path / "raft.snapshot").write_bytes(b"snapshot bytes")
    fsynced.clear()
    j.deleteEntriesTo(8)
    # Snapshot first, then its directory entry, then the rewritten journal (tmp, rename, dir).
    assert fsynced[:2] == ["raft.snapshot", tmp_path.name]
    assert "raft.journal.tmp" in fsynced
    assert fsynced.index("raft.snapshot") < fsynced.index("raft.journal.tmp")
    assert [e[1] for e in entries(journal(tmp_path))] == [9, 10]


def test_term_and_vote_are_durable_and_commit_index_is_lazy(
    tmp_path: Path, fsynced: list[str]
) -> None:
    j = journal(tmp_path)
    fsynced.clear()
    j.setCurrentTerm(7, "127.0.0.1:9093")
    assert fsynced == ["raft.journal.meta.tmp", tmp_path.name]
    j.setRaftCommitIndex(42)
    again = journal(tmp_path)
    assert (again.getCurrentTerm(), again.getVotedForNodeId()) == (7, "127.0.0.1:9093")
    assert again.getRaftCommitIndex() == 1  # not stored yet: a hint only
    j.onOneSecondTimer()
    assert journal(tmp_path).getRaftCommitIndex() == 42


def test_unreadable_vote_metadata_refuses_to_start(tmp_path: Path) -> None:
    journal(tmp_path).setCurrentTerm(3, None)
    (tmp_path / "raft.journal.meta").write_text("{not json")
    with pytest.raises(RaftStorageError, match="term/vote"):
        journal(tmp_path)


def test_foreign_journal_is_refused(tmp_path: Path) -> None:
    (tmp_path / "raft.journal").write_bytes(b"PYSYNCOBJ\0" * 8)
    with pytest.raises(RaftStorageError, match="not a raftlog journal"):
        journal(tmp_path)


def test_snapshot_round_trip_and_damage(tmp_path: Path, fsynced: list[str]) -> None:
    snapshot = RaftSnapshot((b"\x01", 10, 2), (b"\x00abc", 9, 2), ("127.0.0.1:1",), b"state")
    assert decode_snapshot(encode_snapshot(snapshot)) == snapshot
    path = tmp_path / "raft.snapshot.tmp"
    write_snapshot_file(path, snapshot)
    assert fsynced == ["raft.snapshot.tmp"]
    assert read_snapshot_file(path) == snapshot
    damaged = bytearray(path.read_bytes())
    damaged[-1] ^= 1
    with pytest.raises(RaftStorageError):
        decode_snapshot(bytes(damaged))


def test_meta_properties_written_once_then_checked(tmp_path: Path) -> None:
    stored = check_meta_properties(tmp_path, None, 1, lambda: "generated-id")
    assert stored.cluster_id == "generated-id"
    assert check_meta_properties(tmp_path, "generated-id", 1, lambda: "other").node_id == 1
    assert check_meta_properties(tmp_path, None, 1, lambda: "other").cluster_id == "generated-id"
    with pytest.raises(MetaPropertiesError, match="belongs to cluster 'generated-id'"):
        check_meta_properties(tmp_path, "another-cluster", 1, lambda: "x")
    with pytest.raises(MetaPropertiesError, match=r"belongs to node\.id 1"):
        check_meta_properties(tmp_path, "generated-id", 2, lambda: "x")
