"""The leader-epoch cache: Kafka's LeaderEpochFileCache semantics, persistence, and how the
partition log keeps it in step with appends, truncation, retention and crashes."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from raftlog.partition.batch import build_batch, parse_header
from raftlog.partition.epoch_cache import (
    LEADER_EPOCH_CHECKPOINT,
    EpochEntry,
    LeaderEpochCache,
    entries_from_batches,
)
from raftlog.partition.log import LogConfig, PartitionLog

T0 = 1_700_000_000_000


def cache_of(*pairs: tuple[int, int], path: Path | None = None) -> LeaderEpochCache:
    return LeaderEpochCache(path, [EpochEntry(e, s) for e, s in pairs])


def pairs(cache: LeaderEpochCache) -> list[tuple[int, int]]:
    return [(e.epoch, e.start_offset) for e in cache.entries]


# --- Kafka's semantics, by example (cf. LeaderEpochFileCacheTest) ------------------------------


def test_end_offset_for() -> None:
    cache = cache_of((2, 6), (3, 8), (5, 20))
    log_end = 30
    assert cache.end_offset_for(5, log_end) == (5, 30), "the latest epoch ends at the log end"
    assert cache.end_offset_for(3, log_end) == (3, 20), "an epoch ends where the next starts"
    assert cache.end_offset_for(4, log_end) == (3, 20), "an unknown epoch: the one below it"
    assert cache.end_offset_for(2, log_end) == (2, 8)
    assert cache.end_offset_for(1, log_end) == (1, 6), "older than all: the first start"
    assert cache.end_offset_for(6, log_end) == (-1, -1), "newer than all: undefined"
    assert cache.end_offset_for(-1, log_end) == (-1, -1)
    assert LeaderEpochCache(None).end_offset_for(0, 5) == (-1, -1), "empty: undefined"


def test_assign() -> None:
    cache = LeaderEpochCache(None)
    assert cache.assign(2, 10)
    assert not cache.assign(2, 10) and not cache.assign(2, 15), "the latest epoch: a no-op"
    assert cache.assign(3, 15)
    assert pairs(cache) == [(2, 10), (3, 15)]
    # An epoch that wrote nothing is replaced by the next one at the same offset.
    assert cache.assign(4, 15)
    assert pairs(cache) == [(2, 10), (4, 15)]
    # Contradicting entries go (Kafka's maybeTruncateNonMonotonicEntries).
    assert cache.assign(3, 12)
    assert pairs(cache) == [(2, 10), (3, 12)]
    assert cache.assign(3, 11), "the latest epoch moved to an earlier start"
    assert pairs(cache) == [(2, 10), (3, 11)]
    with pytest.raises(ValueError):
        cache.assign(-1, 0)
    with pytest.raises(ValueError):
        cache.assign(0, -1)


def test_truncate_from_end_and_start() -> None:
    cache = cache_of((1, 0), (2, 10), (4, 20))
    assert not cache.truncate_from_end(25)
    assert cache.truncate_from_end(20)
    assert pairs(cache) == [(1, 0), (2, 10)]
    assert not cache.truncate_from_start(0)
    assert cache.truncate_from_start(12)
    assert pairs(cache) == [(2, 12)], "the epoch covering the new start moves up to it"
    assert cache.truncate_from_start(30)
    assert pairs(cache) == [(2, 30)]
    assert cache.truncate_from_end(0)
    assert pairs(cache) == []


def test_checkpoint_round_trip_and_bad_files(tmp_path: Path) -> None:
    path = tmp_path / LEADER_EPOCH_CHECKPOINT
    assert LeaderEpochCache.load(path) is None
    cache = LeaderEpochCache(path)
    cache.assign(0, 0)
    cache.assign(3, 42)
    assert path.read_text() == "0\n2\n0 0\n3 42\n", "Kafka's checkpoint format"
    loaded = LeaderEpochCache.load(path)
    assert loaded is not None and pairs(loaded) == [(0, 0), (3, 42)]
    for garbage in ["", "1\n0\n", "0\n2\n0 0\n", "0\n1\n0 x\n", "0\n2\n3 0\n1 5\n"]:
        path.write_text(garbage)
        assert LeaderEpochCache.load(path) is None, garbage


# --- against a brute-force model ---------------------------------------------------------------

operations = st.lists(
    st.one_of(
        st.tuples(st.just("assign"), st.integers(0, 8), st.integers(0, 60)),
        st.tuples(st.just("end"), st.integers(0, 60)),
        st.tuples(st.just("start"), st.integers(0, 60)),
    ),
    max_size=30,
)


def model_end_offset_for(entries: list[tuple[int, int]], epoch: int, log_end: int
                         ) -> tuple[int, int]:
    """OffsetsForLeaderEpoch, spelt out: the largest epoch <= the requested one, and where
    the first larger epoch starts (the log end if none)."""
    if epoch < 0 or not entries or epoch > entries[-1][0]:
        return -1, -1
    larger = [start for e, start in entries if e > epoch]
    end = larger[0] if larger else log_end
    smaller_or_equal = [e for e, _ in entries if e <= epoch]
    return (smaller_or_equal[-1] if smaller_or_equal else epoch), end


@settings(max_examples=300, deadline=None)
@given(ops=operations, queries=st.lists(st.integers(-1, 10), max_size=10))
def test_matches_a_model(ops: list[tuple[object, ...]], queries: list[int]) -> None:
    cache = LeaderEpochCache(None)  # in memory: persistence is checked once, below
    model: list[tuple[int, int]] = []
    for op in ops:
        if op[0] == "assign":
            epoch, start = int(op[1]), int(op[2])  # type: ignore[call-overload]
            if not (model and model[-1][0] == epoch and model[-1][1] <= start):
                model = [(e, s) for e, s in model if e < epoch and s < start]
                model.append((epoch, start))
            cache.assign(epoch, start)
        elif op[0] == "end":
            offset = int(op[1])  # type: ignore[call-overload]
            model = [(e, s) for e, s in model if s < offset]
            cache.truncate_from_end(offset)
        else:
            offset = int(op[1])  # type: ignore[call-overload]
            below = [(e, s) for e, s in model if s <= offset]
            if below:
                model = [(below[-1][0], offset)] + [(e, s) for e, s in model if s > offset]
            cache.truncate_from_start(offset)
        assert pairs(cache) == model
    log_end = (model[-1][1] if model else 0) + 5
    for epoch in queries:
        assert cache.end_offset_for(epoch, log_end) == \
            model_end_offset_for(model, epoch, log_end), (model, epoch)


@settings(max_examples=30, deadline=None)
@given(ops=operations)
def test_every_change_is_persisted(ops: list[tuple[object, ...]]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / LEADER_EPOCH_CHECKPOINT
        cache = LeaderEpochCache(path)
        for op in ops:
            if op[0] == "assign":
                cache.assign(int(op[1]), int(op[2]))  # type: ignore[call-overload]
            elif op[0] == "end":
                cache.truncate_from_end(int(op[1]))  # type: ignore[call-overload]
            else:
                cache.truncate_from_start(int(op[1]))  # type: ignore[call-overload]
            reloaded = LeaderEpochCache.load(path)
            if reloaded is None:
                assert not cache.entries, "only a cache that never changed has no file"
            else:
                assert pairs(reloaded) == pairs(cache)


# --- the partition log keeps the cache ---------------------------------------------------------


def batch(count: int = 1) -> bytes:
    return build_batch([(b"k", b"v" * 20, ()) for _ in range(count)], timestamp_ms=T0)


def open_log(directory: Path, **settings: int) -> PartitionLog:
    return PartitionLog.open(directory / "t-0", LogConfig(**settings), T0)  # type: ignore[arg-type]


def test_log_appends_truncation_and_rebuild(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for epoch, count in [(0, 2), (0, 1), (2, 3), (5, 1), (5, 2)]:
        log.append(batch(count), leader_epoch=epoch, now_ms=T0)
    assert pairs(log.epoch_cache) == [(0, 0), (2, 3), (5, 6)]
    assert log.end_offset_for_epoch(2) == (2, 6)
    assert log.end_offset_for_epoch(5) == (5, 9)
    log.assign_leader_epoch(7)  # a new leader that has not written yet
    assert log.end_offset_for_epoch(5) == (5, 9) and log.latest_epoch == 7
    assert log.truncate_to(8) == 7, "the batch holding offset 8 goes whole"
    assert pairs(log.epoch_cache) == [(0, 0), (2, 3), (5, 6)], "truncation truncates the cache"
    assert log.truncate_to(5) == 3
    assert pairs(log.epoch_cache) == [(0, 0)]
    log.append(batch(1), leader_epoch=6, now_ms=T0)
    log.close()
    # A lost checkpoint is rebuilt from the batch headers.
    (tmp_path / "t-0" / LEADER_EPOCH_CHECKPOINT).unlink()
    log = open_log(tmp_path)
    assert pairs(log.epoch_cache) == [(0, 0), (6, 3)]
    assert (tmp_path / "t-0" / LEADER_EPOCH_CHECKPOINT).exists()
    log.close()


def test_a_checkpoint_ahead_of_a_crashed_log_is_trimmed(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(batch(2), leader_epoch=1, now_ms=T0)
    log.append(batch(2), leader_epoch=3, now_ms=T0)
    log.close()
    # The tail (epoch 3's batch) is torn off by a crash; the checkpoint still names epoch 3.
    segment = tmp_path / "t-0" / f"{0:020d}.log"
    size = len(segment.read_bytes())
    with segment.open("r+b") as file:
        file.truncate(size - 5)
    log = open_log(tmp_path)
    assert log.log_end_offset == 2
    assert pairs(log.epoch_cache) == [(1, 0)]
    log.close()


def test_retention_truncates_the_cache_from_the_start(tmp_path: Path) -> None:
    size = len(batch(1))
    log = open_log(tmp_path, segment_bytes=2 * size, retention_bytes=0)
    for epoch in (1, 1, 2, 2, 3, 3):
        log.append(batch(1), leader_epoch=epoch, now_ms=T0)
    assert log.segment_base_offsets == [0, 2, 4]
    assert log.enforce_retention(T0) == 2
    assert log.log_start_offset == 4
    assert pairs(log.epoch_cache) == [(3, 4)]
    log.close()


def test_entries_from_batches_skips_unstamped_batches() -> None:
    assert entries_from_batches([(-1, 0), (0, 3), (0, 5), (2, 9)]) == [
        EpochEntry(0, 3), EpochEntry(2, 9)]


class EpochCacheLogMachine(RuleBasedStateMachine):
    """Appends with non-decreasing epochs, new leaders that write nothing, truncation,
    retention, reopen, crash with a torn tail and lost checkpoints: the cache always equals
    the one implied by the batches in the log (plus at most one empty latest epoch)."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp())
        self.size = len(batch(1))
        self.config = LogConfig(segment_bytes=3 * self.size, retention_bytes=6 * self.size)
        self.log = PartitionLog.open(self.root / "t-0", self.config, T0)
        self.epoch = 0
        self.empty_epoch: int | None = None  # assigned by a new leader, no batch yet

    @rule(count=st.integers(1, 3))
    def append(self, count: int) -> None:
        self.log.append(batch(count), leader_epoch=self.epoch, now_ms=T0)
        self.empty_epoch = None

    @rule(step=st.integers(0, 2))
    def new_leader(self, step: int) -> None:
        self.epoch += step
        self.log.assign_leader_epoch(self.epoch)
        if self.log.latest_epoch == self.epoch and \
                self.log.epoch_cache.start_offset_of(self.epoch) == self.log.log_end_offset:
            self.empty_epoch = self.epoch

    @precondition(lambda self: self.log.log_end_offset > self.log.log_start_offset)
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.log.log_start_offset, self.log.log_end_offset))
        if offset < self.log.log_end_offset:
            self.log.truncate_to(offset)
            self.empty_epoch = None

    @rule()
    def retention(self) -> None:
        self.log.enforce_retention(T0)

    @rule(lose_checkpoint=st.booleans())
    def reopen(self, lose_checkpoint: bool) -> None:
        self.log.close()
        if lose_checkpoint:
            (self.root / "t-0" / LEADER_EPOCH_CHECKPOINT).unlink(missing_ok=True)
            self.empty_epoch = None
        self.log = PartitionLog.open(self.root / "t-0", self.config, T0)

    @rule(cut=st.integers(1, 40))
    def crash(self, cut: int) -> None:
        self.log.close()
        base = max(self.log.segment_base_offsets)
        segment = self.root / "t-0" / f"{base:020d}.log"
        size = segment.stat().st_size
        with segment.open("r+b") as file:
            file.truncate(max(size - cut, 0))
        self.log = PartitionLog.open(self.root / "t-0", self.config, T0)
        self.empty_epoch = None

    @invariant()
    def cache_matches_the_log(self) -> None:
        log = self.log
        implied = [(e.epoch, e.start_offset) for e in entries_from_batches(
            (parse_header(data).partition_leader_epoch, parse_header(data).base_offset)
            for data in _batches(log))]
        if implied and implied[0][1] < log.log_start_offset:
            implied[0] = (implied[0][0], log.log_start_offset)
        actual = pairs(log.epoch_cache)
        if self.empty_epoch is not None and actual and actual[-1] == (
                self.empty_epoch, log.log_end_offset):
            actual = actual[:-1]
        assert actual == implied

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)


def _batches(log: PartitionLog) -> list[bytes]:
    out = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        with log.read(offset, 0) as result:  # the first batch only
            data = result.read_bytes()
        out.append(data)
        header = parse_header(data)
        offset = header.next_offset
    return out


EpochCacheLogMachine.TestCase.settings = settings(
    max_examples=30, stateful_step_count=30, deadline=None)
TestEpochCacheLog = EpochCacheLogMachine.TestCase
