"""Segment reads from the remembered newest batches (RECENT_BATCHES_MAX) agree with reads that
scan the file, and a read at the end of the log costs no file I/O."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.partition import segment as segment_module
from raftlog.partition.batch import build_batch, parse_header
from raftlog.partition.segment import RECENT_BATCHES_MAX, Segment

INDEX_INTERVAL_BYTES = 256  # small, so the file scans start from varied index entries


def _batch(base_offset: int, count: int, value_bytes: int) -> bytes:
    records = [(b"k", b"v" * value_bytes, []) for _ in range(count)]
    return build_batch(records, base_offset=base_offset, timestamp_ms=1_000 + base_offset)


def _fill(directory: Path, plan: list[tuple[int, int, int]]) -> Segment:
    """A segment of batches (gap before, record count, value bytes), one append each."""
    directory.mkdir()
    segment = Segment.create(directory, 0, INDEX_INTERVAL_BYTES)
    offset = 0
    for gap, count, value_bytes in plan:
        offset += gap  # compaction leaves gaps, and followers copy them
        data = _batch(offset, count, value_bytes)
        segment.append(data, [parse_header(data)], now_ms=1_000)
        offset += count
    return segment


def _slice(segment: Segment, offset: int, max_bytes: int, max_offset: int | None,
           min_one_batch: bool) -> tuple[int, int] | None:
    piece = segment.read(offset, max_bytes, max_offset=max_offset, min_one_batch=min_one_batch)
    if piece is None:
        return None
    piece.close()
    return piece.position, piece.size_bytes


_PLANS = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4), st.integers(0, 120)),
                  min_size=1, max_size=3 * RECENT_BATCHES_MAX)
_READS = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 2_000),
                            st.none() | st.integers(0, 200), st.booleans()), max_size=20)


@settings(max_examples=150, deadline=None)
@given(plan=_PLANS, reads=_READS)
def test_reads_from_memory_match_reads_from_the_file(
    plan: list[tuple[int, int, int]], reads: list[tuple[int, int, int | None, bool]]
) -> None:
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        remembering = _fill(Path(tmp) / "a", plan)
        patch.setattr(segment_module, "RECENT_BATCHES_MAX", 0)  # this one scans the file
        scanning = _fill(Path(tmp) / "b", plan)
        try:
            end = remembering.next_offset
            for offset, max_bytes, max_offset, min_one in [(end, 1 << 20, None, True),
                                                           *reads]:
                assert _slice(remembering, offset, max_bytes, max_offset, min_one) == \
                    _slice(scanning, offset, max_bytes, max_offset, min_one)
                assert remembering.find_batch(offset) == scanning.find_batch(offset)
        finally:
            remembering.close()
            scanning.close()


def test_a_read_from_a_recent_append_does_no_file_io(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    segment = _fill(tmp_path / "s", [(0, 1, 1000)] * 20)  # index entries every few batches
    preads: list[int] = []
    real_pread = os.pread

    def counting_pread(fd: int, size: int, position: int) -> bytes:
        preads.append(position)
        return real_pread(fd, size, position)

    monkeypatch.setattr(os, "pread", counting_pread)
    tail = _slice(segment, 18, 1 << 20, None, True)  # where a follower fetches next
    assert tail is not None and tail[1] == segment.size_bytes - tail[0]
    assert preads == [], "the batch position came from a file scan"
    _slice(segment, 2, 1 << 20, None, True)  # older than what is remembered: from the file
    assert preads
    segment.close()


def test_truncation_and_sealing_forget_the_remembered_batches(tmp_path: Path) -> None:
    segment = _fill(tmp_path / "s", [(0, 2, 50)] * 6)
    segment.truncate_to(6)  # batches from offset 6 on are gone
    assert segment.next_offset == 6
    assert segment.find_batch(6) is None and _slice(segment, 6, 1 << 20, None, True) is None
    data = _batch(6, 3, 10)
    segment.append(data, [parse_header(data)], now_ms=1_000)
    found = segment.find_batch(7)
    assert found is not None and found[1].base_offset == 6
    segment.seal()
    found = segment.find_batch(7)  # now from the file
    assert found is not None and found[1].base_offset == 6
    segment.close()
