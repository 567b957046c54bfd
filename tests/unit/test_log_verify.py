"""Never serve a batch whose CRC fails: verified ranges, checks on read, the scrubber's pacing
and its walk over the segments (``verified_ranges``, ``log_verify``, ``scrubber``)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

import raftlog.partition.scrubber as scrubber_module
from raftlog.metrics.recorders import Counter
from raftlog.partition.batch import build_batch, check_batch
from raftlog.partition.log import LogConfig, PartitionLog
from raftlog.partition.log_verify import CorruptLogError, check_region
from raftlog.partition.manager import PartitionManager
from raftlog.partition.scrubber import LogScrubber
from raftlog.partition.verified_ranges import ScrubPacer, VerifiedRanges

T0 = 1_700_000_000_000

# --- VerifiedRanges: a model of a set of verified bytes ----------------------------------------

operations = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 60), st.integers(0, 60)),
    st.tuples(st.just("truncate"), st.integers(0, 60), st.just(0)),
), max_size=30)


@given(operations, st.integers(0, 60), st.integers(0, 60))
def test_verified_ranges_match_a_set_of_bytes(ops: list[tuple[str, int, int]], start: int,
                                              end: int) -> None:
    ranges = VerifiedRanges()
    model: set[int] = set()
    for op, a, b in ops:
        if op == "add":
            ranges.add(a, b)
            model.update(range(a, b))
        else:
            ranges.truncate(a)
            model = {byte for byte in model if byte < a}
    pairs = ranges.ranges
    assert all(s < e for s, e in pairs)
    assert all(e1 < s2 for (_, e1), (s2, _) in itertools.pairwise(pairs)), \
        "disjoint and never adjacent"
    assert {byte for s, e in pairs for byte in range(s, e)} == model
    assert ranges.verified_bytes == len(model)
    watermark = 0
    while watermark in model:
        watermark += 1
    assert ranges.watermark == watermark
    missing = {byte for s, e in ranges.missing(start, end) for byte in range(s, e)}
    assert missing == set(range(start, end)) - model


def test_the_scrub_stops_at_a_known_bad_batch_until_it_is_cut_off() -> None:
    ranges = VerifiedRanges()
    ranges.add(0, 100)
    ranges.mark_bad(150)
    assert ranges.first_gap(400) == (100, 150)
    ranges.add(100, 150)
    assert ranges.first_gap(400) is None
    assert ranges.missing(100, 200) == [(150, 200)], "reads still check it"
    ranges.truncate(150)
    assert ranges.bad_from is None


def test_pacer_spreads_chunks_at_the_rate_and_banks_at_most_a_second() -> None:
    pacer = ScrubPacer(1000)
    assert pacer.delay_after(500, now_s=0.0) == pytest.approx(0.5)
    assert pacer.delay_after(500, now_s=0.5) == pytest.approx(0.5)
    # A long pause (a slow disk, a busy loop) is not made up beyond one second's budget.
    assert pacer.delay_after(1000, now_s=100.0) == pytest.approx(0.0)
    assert pacer.delay_after(1000, now_s=100.0) == pytest.approx(1.0)


# --- check_region -------------------------------------------------------------------------------


def _batches(count: int, *, value_bytes: int = 100, first_offset: int = 0) -> bytes:
    out = bytearray()
    for i in range(count):
        data = bytearray(build_batch([(b"k", b"v%03d" % i + b"x" * value_bytes, [])]))
        data[0:8] = (first_offset + i).to_bytes(8, "big")  # baseOffset: not CRC-covered
        out += data
    return bytes(out)


def _write(tmp_path: Path, data: bytes) -> int:
    path = tmp_path / "segment"
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY)


def test_check_region_finds_the_first_bad_batch(tmp_path: Path) -> None:
    data = bytearray(_batches(10))
    size = check_batch(data).size_bytes
    data[3 * size + 80] ^= 0xFF  # inside the fourth batch's record
    fd = _write(tmp_path, bytes(data))
    try:
        good_end, bad = check_region(fd, 0, len(data), 0)
        assert good_end == 3 * size
        assert bad is not None and (bad.position, bad.offset) == (3 * size, 3)
        assert "CRC" in bad.reason
        assert check_region(fd, 0, 3 * size, 0) == (3 * size, None)
        # max_bytes stops at a batch boundary past the budget.
        assert check_region(fd, 0, len(data), 0, max_bytes=size + 1) == (2 * size, None)
    finally:
        os.close(fd)


def test_check_region_reads_batches_larger_than_a_chunk(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("raftlog.partition.log_verify.CHECK_CHUNK_BYTES", 150)
    data = _batches(5, value_bytes=400)
    fd = _write(tmp_path, data)
    try:
        assert check_region(fd, 0, len(data), 0) == (len(data), None)
    finally:
        os.close(fd)


# --- reads of a log loaded from disk -------------------------------------------------------------


def _filled_log(tmp_path: Path, batches: int = 40) -> PartitionLog:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=2000), T0)
    for i in range(batches):
        log.append(build_batch([(b"k", b"value-%04d" % i + b"x" * 100, [])]), leader_epoch=0,
                   now_ms=T0)
    return log


def _reopen(tmp_path: Path, log: PartitionLog, counter: Counter | None = None
            ) -> PartitionLog:
    ticket = log.begin_flush()
    assert ticket is not None
    ticket.run()
    log.complete_flush(ticket)
    log.close()
    return PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=2000), T0,
                             corrupt_batches=counter)


def _flip(log: PartitionLog, segment_slot: int, batch_slot: int) -> tuple[int, int]:
    """Flip a byte inside a record of a sealed segment's batch: its (offset, position)."""
    segment = log.segments[segment_slot]
    positions = [(h.base_offset, p) for p, h in segment.iter_headers(0)]
    offset, position = positions[batch_slot]
    with segment.log_path.open("r+b") as out:
        out.seek(position + 70)
        byte = out.read(1)
        out.seek(position + 70)
        out.write(bytes([byte[0] ^ 0xFF]))
    return offset, position


def test_appended_bytes_are_verified_and_loaded_sealed_segments_are_not(tmp_path: Path) -> None:
    log = _filled_log(tmp_path)
    assert log.segment_count > 3
    assert all(s.verified.watermark == s.size_bytes for s in log.segments)
    log = _reopen(tmp_path, log)
    sealed, active = log.segments[:-1], log.segments[-1]
    assert all(s.verified.verified_bytes == 0 for s in sealed)
    assert active.verified.watermark == active.size_bytes, "recovery scanned it with its CRCs"
    with log.read(0, 1 << 20) as read:  # the first read of old data checks it, once
        assert read.size_bytes == sealed[0].size_bytes
    assert sealed[0].verified.watermark == sealed[0].size_bytes


def test_a_bad_batch_is_never_served(tmp_path: Path) -> None:
    counter = Counter()
    log = _filled_log(tmp_path)
    log = _reopen(tmp_path, log, counter)
    told: list[int] = []
    log.verifier.listener = lambda: told.append(1)
    offset, position = _flip(log, 1, 2)
    segment = log.segments[1]
    # A read from the segment's start serves the good batches before the bad one only.
    with log.read(segment.base_offset, 1 << 20) as read:
        assert read.slices[0].position == 0 and read.size_bytes == position
    assert log.verifier.corrupt_offset == offset and counter.value == 1 and told == [1]
    # A read that starts with it gets KAFKA_STORAGE_ERROR; it is counted and logged once.
    for _ in range(2):
        with pytest.raises(CorruptLogError) as raised:
            log.read(offset, 1 << 20)
        assert raised.value.error_code == 56
    assert counter.value == 1
    # Later segments are still served; truncating to the bad batch forgets it.
    with log.read(log.segments[2].base_offset, 1 << 20) as read:
        assert read.size_bytes > 0
    log.truncate_to(offset)
    assert log.log_end_offset == offset and log.verifier.corrupt_offset is None
    assert log.segments[-1].verified.watermark == log.segments[-1].size_bytes


# --- the scrubber -------------------------------------------------------------------------------


def _manager_with_log(tmp_path: Path, batches: int = 40) -> PartitionManager:
    manager = PartitionManager(tmp_path, 1)
    partition = manager.ensure_partition("t", 0, {"segment.bytes": "2000"}, 0)
    for i in range(batches):
        partition.log.append(build_batch([(b"k", b"value-%04d" % i + b"x" * 100, [])]),
                             leader_epoch=0, now_ms=T0)
    ticket = partition.log.begin_flush()
    assert ticket is not None
    ticket.run()
    partition.log.complete_flush(ticket)
    manager.close()
    reopened = PartitionManager(tmp_path, 1)
    reopened.ensure_partition("t", 0, {"segment.bytes": "2000"}, 0)
    return reopened


def test_scrubber_verifies_every_segment_at_the_configured_rate(tmp_path: Path) -> None:
    manager = _manager_with_log(tmp_path)
    log = manager.partitions[("t", 0)].log
    total = sum(s.size_bytes for s in log.segments[:-1])
    rate = 1000  # bytes a second: the sealed segments take total / rate seconds
    scrubber = LogScrubber(manager, rate, chunk_bytes=500, idle_s=3600)

    async def main() -> float:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(scrubber.run)
            await scrubber.caught_up.wait()
            took = trio.current_time()
            nursery.cancel_scope.cancel()
        return took

    # Autojump only once the worker thread is done (it runs in real time).
    took = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0.01))
    assert all(s.verified.watermark == s.size_bytes for s in log.segments)
    assert manager.stats.scrubbed_bytes.value == total
    assert total / rate - 1.0 <= took <= total / rate + 0.1, (took, total / rate)
    manager.close()


def test_scrubber_reports_a_bad_batch_once_and_moves_on(tmp_path: Path) -> None:
    manager = _manager_with_log(tmp_path)
    partition = manager.partitions[("t", 0)]
    found: list[int | None] = []
    manager.on_corrupt = lambda p: found.append(p.corrupt_offset)
    offset, _ = _flip(partition.log, 2, 1)
    scrubber = LogScrubber(manager, 1 << 30, idle_s=3600)

    async def main() -> None:
        while (chunk := scrubber.next_chunk()) is not None:
            await scrubber.check(chunk)

    trio.run(main)
    assert found == [offset] and partition.corrupt_offset == offset
    assert manager.stats.corrupt_batches.value == 1
    later = partition.log.segments[3:]
    assert all(s.verified.watermark == s.size_bytes for s in later), "went on past it"
    manager.close()


def test_scrubber_is_off_at_zero(tmp_path: Path) -> None:
    manager = PartitionManager(tmp_path, 1)
    trio.run(LogScrubber(manager, 0).run)  # returns at once


def test_the_scrubber_sorts_the_partitions_only_when_they_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A restart of 10,000 partitions gave the scrubber 10,000 chunks, and it sorted every
    # partition for each one.
    manager = _manager_with_log(tmp_path)
    scrubber = LogScrubber(manager, 1 << 30, idle_s=3600)
    sorts = 0
    real_sorted = sorted

    def counting_sorted(*args: Any, **kwargs: Any) -> Any:
        nonlocal sorts
        sorts += 1
        return real_sorted(*args, **kwargs)

    monkeypatch.setattr(scrubber_module, "sorted", counting_sorted, raising=False)

    async def main() -> int:
        chunks = 0
        while (chunk := scrubber.next_chunk()) is not None:
            await scrubber.check(chunk)
            chunks += 1
        return chunks

    assert trio.run(main) >= 3
    assert sorts == 1
    manager.ensure_partition("u", 0, {}, 0)  # a partition opened: sorted again
    assert scrubber.next_chunk() is None and sorts == 2
    manager.close()
