"""Log compaction on disk (raftlog/partition/cleaner.py + cleaner_service.py +
PartitionLog.replace_segments): real segment files, real swaps, crash at every swap step."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import raftlog.partition.log_swap as log_swap
from raftlog.partition.batch import Record, build_batch, decode_records, parse_header
from raftlog.partition.cleaner import read_cleaner_checkpoint
from raftlog.partition.cleaner_service import CleanerSettings, LogCleaner, PassResult
from raftlog.partition.log import LogConfig, PartitionLog
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import Partition
from raftlog.partition.txn_index import AbortedTxn, build_marker

T0 = 1_700_000_000_000
KEYS = 10
COMPACTED = {"cleanup.policy": "compact", "segment.bytes": "1500",
             "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "1000"}


def _open(directory: Path, configs: dict[str, str] | None = None
          ) -> tuple[PartitionManager, Partition]:
    manager = PartitionManager(directory, 1)
    return manager, manager.ensure_partition("t", 0, dict(configs or COMPACTED), 0)


def _append(partition: Partition, records: list[tuple[bytes | None, bytes | None]], *,
            timestamp_ms: int = T0, producer_id: int = -1, sequence: int = -1,
            transactional: bool = False) -> int:
    batch = build_batch([(k, v, ()) for k, v in records], timestamp_ms=timestamp_ms,
                        producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                        base_sequence=sequence, attributes=0x10 if transactional else 0)
    info = partition.log.append(batch, leader_epoch=0, now_ms=timestamp_ms)
    if producer_id >= 0:
        partition.producers.commit_append(parse_header(batch), info.base_offset,
                                          info.last_offset, timestamp_ms)
    partition.high_watermark = partition.log.log_end_offset
    return info.base_offset


def _marker(partition: Partition, producer_id: int, *, commit: bool) -> int:
    batch = build_marker(producer_id, 0, commit, 0, T0)
    info = partition.log.append(batch, leader_epoch=0, now_ms=T0, allow_control=True)
    partition.producers.commit_append(parse_header(batch), info.base_offset, info.last_offset,
                                      T0)
    partition.high_watermark = partition.log.log_end_offset
    return info.base_offset


def _fill(partition: Partition, updates: int) -> dict[bytes, tuple[int, bytes]]:
    """``updates`` single-record batches over KEYS keys; key -> (offset, value) latest."""
    latest: dict[bytes, tuple[int, bytes]] = {}
    for i in range(updates):
        key, value = b"key-%d" % (i % KEYS), b"value-%d" % i
        latest[key] = (_append(partition, [(key, value)]), value)
    return latest


def _records(log: PartitionLog) -> list[Record]:
    """Every record, fetching from each returned batch's next offset (gaps included)."""
    records: list[Record] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        with log.read(offset, 1 << 20) as piece:
            data = piece.read_bytes()
        assert data, f"empty read at {offset} below the log end {log.log_end_offset}"
        records.extend(r for r in decode_records(data) if r.offset >= offset)
        offset = _last_next_offset(data)
    return records


def _last_next_offset(data: bytes) -> int:
    position, next_offset = 0, -1
    while position < len(data):
        header = parse_header(data, position)
        position += header.size_bytes
        next_offset = header.next_offset
    return next_offset


def _clean(partition: Partition, manager: PartitionManager,
           settings: CleanerSettings | None = None) -> PassResult | None:
    cleaner = LogCleaner(manager, settings or CleanerSettings())
    return trio.run(cleaner.clean_partition, partition)


def _check_latest(records: list[Record], latest: dict[bytes, tuple[int, bytes]]) -> None:
    seen: dict[bytes, tuple[int, bytes | None]] = {}
    for record in records:
        assert record.key is not None
        previous = seen.get(record.key)
        assert previous is None or previous[0] < record.offset  # offsets only increase
        seen[record.key] = (record.offset, record.value)
    assert seen == latest


def test_cleaning_keeps_the_latest_value_per_key_at_its_offset(tmp_path: Path) -> None:
    manager, partition = _open(tmp_path)
    latest = _fill(partition, 400)
    log = partition.log
    end, segments_before = log.log_end_offset, len(log.segments)
    assert segments_before > 5
    result = _clean(partition, manager)
    assert result is not None and result.bytes_after < result.bytes_before / 5
    assert result.segments_after < result.segments_before / 5  # small outputs merge
    assert log.log_end_offset == end
    records = _records(log)
    active_base = log.segments[-1].base_offset
    # Below the active segment: exactly one record per key.
    assert len([r for r in records if r.offset < active_base]) <= KEYS
    _check_latest(records, latest)
    assert read_cleaner_checkpoint(log.directory) == active_base
    # Every offset can be fetched; an offset compacted away reads the next batch.
    for offset in range(0, end, 7):
        with log.read(offset, 1 << 20) as piece:
            data = piece.read_bytes()
        assert data and _last_next_offset(data) > offset
    assert log.offset_for_timestamp(T0) is not None
    manager.close()
    # A restart keeps everything (the cleaned segments pass the sealed-segment checks).
    manager, partition = _open(tmp_path)
    assert partition.log.log_end_offset == end
    _check_latest(_records(partition.log), latest)
    assert not list(tmp_path.glob("t-0/*.cleaned")) and not list(tmp_path.glob("t-0/*.swap"))
    manager.close()


def test_a_second_pass_cleans_new_updates_and_merges_small_segments(tmp_path: Path) -> None:
    manager, partition = _open(tmp_path)
    _fill(partition, 300)
    first = _clean(partition, manager)
    assert first is not None  # groups by input size: full segments are not merged yet
    latest = _fill(partition, 300)
    second = _clean(partition, manager)
    # The first pass's small outputs merge with each other and the new dirty segments.
    assert second is not None and second.segments_after < second.segments_before / 2
    records = _records(partition.log)
    active_base = partition.log.segments[-1].base_offset
    assert len([r for r in records if r.offset < active_base]) <= KEYS
    _check_latest(records, latest)
    assert _clean(partition, manager) is None  # nothing dirty left
    manager.close()


def test_a_small_dedupe_buffer_spreads_the_work_over_passes(tmp_path: Path) -> None:
    manager, partition = _open(tmp_path)
    latest = _fill(partition, 400)
    active_base = partition.log.segments[-1].base_offset
    tiny = CleanerSettings(dedupe_buffer_bytes=1)  # the map takes one segment per pass
    checkpoints = []
    while (result := _clean(partition, manager, tiny)) is not None:
        assert result.segments_before >= 1
        checkpoints.append(read_cleaner_checkpoint(partition.log.directory))
    assert len(checkpoints) > 3 and checkpoints == sorted(checkpoints)
    assert checkpoints[-1] == active_base
    records = _records(partition.log)
    assert len([r for r in records if r.offset < active_base]) <= KEYS
    _check_latest(records, latest)
    manager.close()


def test_expired_tombstone_is_removed_and_a_young_one_kept(tmp_path: Path) -> None:
    manager, partition = _open(tmp_path)
    for i in range(50):
        _append(partition, [(b"gone", b"v%d" % i), (b"kept", b"v%d" % i)])
    _append(partition, [(b"gone", None)], timestamp_ms=T0)  # T0 is years ago
    young = _append(partition, [(b"kept", None)], timestamp_ms=2 ** 60)
    for i in range(60):  # other keys, so both tombstones end up in sealed segments
        _append(partition, [(b"other-%d" % (i % 3), b"x")])
    assert _clean(partition, manager) is not None
    by_key = {r.key: r for r in _records(partition.log)}
    assert b"gone" not in by_key  # its values and its expired tombstone are gone
    assert by_key[b"kept"].offset == young and by_key[b"kept"].value is None
    manager.close()


def test_aborted_records_are_removed_and_never_shadow_committed_ones(tmp_path: Path) -> None:
    manager, partition = _open(tmp_path)
    committed = _append(partition, [(b"k", b"committed")])
    _append(partition, [(b"k", b"aborted")], producer_id=7, sequence=0, transactional=True)
    marker = _marker(partition, 7, commit=False)
    _append(partition, [(b"j", b"in-txn")], producer_id=8, sequence=0, transactional=True)
    _marker(partition, 8, commit=True)
    for i in range(80):
        _append(partition, [(b"other-%d" % (i % 3), b"x")])
    assert list(partition.txns.all_aborted()) == [AbortedTxn(7, committed + 1, marker)]
    assert _clean(partition, manager) is not None
    records = _records(partition.log)
    values = {r.key: r.value for r in records}
    assert values[b"k"] == b"committed" and values[b"j"] == b"in-txn"
    assert b"aborted" not in [r.value for r in records]
    # Markers stay, and the aborted-transaction index survives the swap and a restart.
    assert partition.txns.aborted_between(0, partition.log.log_end_offset) == [
        AbortedTxn(7, committed + 1, marker)]
    manager.close()
    manager, partition = _open(tmp_path)
    assert list(partition.txns.all_aborted()) == [AbortedTxn(7, committed + 1, marker)]
    manager.close()


def test_the_cleaner_stops_at_the_last_stable_offset(tmp_path: Path) -> None:
    manager, partition = _open(tmp_path)
    _append(partition, [(b"k", b"old")])
    _append(partition, [(b"k", b"open")], producer_id=9, sequence=0, transactional=True)
    for i in range(80):
        _append(partition, [(b"other-%d" % (i % 3), b"x")])
    assert partition.last_stable_offset == 1
    assert _clean(partition, manager) is None  # nothing below the LSO fills a segment
    assert [r.value for r in _records(partition.log) if r.key == b"k"] == [b"old", b"open"]
    manager.close()


def test_a_follower_copies_a_compacted_log_and_truncates_inside_gaps(tmp_path: Path) -> None:
    manager, leader = _open(tmp_path / "leader")
    latest = _fill(leader, 300)
    assert _clean(leader, manager) is not None
    with leader.log.read(0, 1 << 30) as piece:
        first = piece.read_bytes()
    follower_manager, follower = _open(tmp_path / "follower", {"segment.bytes": "1500"})
    offset = 0
    while offset < leader.log.log_end_offset:  # as the replica fetcher does
        with leader.log.read(offset, 1 << 30) as piece:
            data = piece.read_bytes()
        follower.log.append_replicated(data, now_ms=T0)
        offset = follower.log.log_end_offset
    assert follower.log.log_end_offset == leader.log.log_end_offset
    assert first and _records(follower.log) == _records(leader.log)
    _check_latest(_records(follower.log), latest)
    # Recovery accepts the gaps (sealed and active segments alike).
    follower_manager.close()
    follower_manager, follower = _open(tmp_path / "follower", {"segment.bytes": "1500"})
    assert follower.log.log_end_offset == leader.log.log_end_offset
    assert _records(follower.log) == _records(leader.log)
    # Truncating at an offset that was compacted away cuts at the next batch.
    gap = next(o for o in range(1, 300) if o not in {r.offset for r in _records(follower.log)})
    follower.truncate_to(gap)
    assert all(r.offset < gap for r in _records(follower.log))
    manager.close()
    follower_manager.close()


def test_compact_delete_also_applies_retention(tmp_path: Path) -> None:
    configs = dict(COMPACTED, **{"cleanup.policy": "compact,delete", "retention.ms": "1000"})
    manager, partition = _open(tmp_path, configs)
    _fill(partition, 300)
    assert manager.enforce_retention() > 0
    manager.close()
    manager, partition = _open(tmp_path, dict(COMPACTED, **{"retention.ms": "1000"}))
    _fill(partition, 300)
    assert manager.enforce_retention() == 0  # compact alone: retention never deletes
    manager.close()


SWAP_STEPS = ["rename-indexes-to-swap", "rename-log-to-swap", "delete-old-segments",
              "rename-swap-over-old", "fsync-directory"]


class Crash(Exception):
    pass


@pytest.fixture
def crash_at() -> Iterator[list[str]]:
    steps: list[str] = []

    def hook(step: str) -> None:
        if steps and step == steps[0]:
            raise Crash(step)

    log_swap.swap_crash_hook = hook
    yield steps
    log_swap.swap_crash_hook = None


@pytest.mark.parametrize("step", SWAP_STEPS)
def test_recovery_after_a_crash_at_each_swap_step(tmp_path: Path, step: str,
                                                  crash_at: list[str]) -> None:
    manager, partition = _open(tmp_path / "a")
    latest = _fill(partition, 200)
    end = partition.log.log_end_offset
    before = _records(partition.log)
    crash_at.append(step)
    with pytest.raises(Crash):
        _clean(partition, manager)
    partition.log.close()  # the process dies here: nothing else runs
    crashed = tmp_path / "a" / "t-0"
    copy = tmp_path / "b" / "t-0"
    shutil.copytree(crashed, copy)
    crash_at.clear()
    log = PartitionLog.open(copy, LogConfig(segment_bytes=1500), T0)
    committed = step not in ("rename-indexes-to-swap", "rename-log-to-swap")
    after = _records(log)
    assert log.log_end_offset == end
    if committed:  # the .log.swap existed: recovery completes the swap
        assert len(after) < len(before)
    else:  # it did not: the old segments stay, the leftovers go
        assert after == before
    _check_latest(after, latest)
    names = [path.name for path in copy.iterdir()]
    assert not [n for n in names if n.endswith((".cleaned", ".swap", ".tmp"))], names
    log.close()
    # And the recovered log can be cleaned (again) normally.
    manager2, partition2 = _open(tmp_path / "b")
    _clean(partition2, manager2)
    _check_latest(_records(partition2.log), latest)
    manager2.close()


_put = st.tuples(st.just("put"), st.integers(0, 3), st.booleans())  # key, tombstone
_op = st.one_of(_put, _put, _put, st.tuples(
    st.sampled_from(["commit", "clean", "reopen", "truncate"]), st.integers(0, 9),
    st.booleans()))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_op, min_size=1, max_size=60))
def test_cleaning_mixed_with_truncation_and_restarts_keeps_the_model(
        tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int, bool]]) -> None:
    """A model check: appends (young tombstones included), high-watermark moves, cleaning,
    follower truncation above the high watermark and restarts, in any order. The log only
    ever loses older values: every record is the one written at its offset, and every key's
    latest record in the model is in the log."""
    directory = tmp_path_factory.mktemp("clean")
    configs = dict(COMPACTED, **{"segment.bytes": "160"})  # two records a segment
    manager, partition = _open(directory, configs)
    model: list[tuple[int, bytes, bytes | None]] = []
    high_watermark = 0
    try:
        for op, number, flag in ops:
            if op == "put":
                key, value = b"k%d" % number, None if flag else b"v%d" % len(model)
                offset = _append(partition, [(key, value)], timestamp_ms=2 ** 60)
                model.append((offset, key, value))
            elif op == "commit":
                high_watermark = partition.log.log_end_offset
            elif op == "truncate":
                end = partition.log.log_end_offset
                target = high_watermark + (end - high_watermark) * number // 9
                partition.truncate_to(target)
                model = [r for r in model if r[0] < partition.log.log_end_offset]
            elif op == "clean":
                partition.high_watermark = high_watermark
                _clean(partition, manager)
            else:
                manager.close()
                manager, partition = _open(directory, configs)
            partition.high_watermark = partition.log.log_end_offset  # _append moved it
            records = [(r.offset, r.key, r.value) for r in _records(partition.log)]
            assert set(records) <= set(model)
            assert [r[0] for r in records] == sorted({r[0] for r in records})
            latest = {key: (offset, key, value) for offset, key, value in model}
            assert set(latest.values()) <= set(records)
            assert partition.log.log_end_offset == (model[-1][0] + 1 if model else 0) or \
                not model
    finally:
        manager.close()
