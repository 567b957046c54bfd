"""Sparse offset and time indexes: lookups against an oracle, file format, sanity checks.

Reference: Kafka OffsetIndexTest.randomLookupTest (floor-entry oracle).
"""

from __future__ import annotations

import struct
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from raftlog.partition.index import OffsetIndex, TimeIndex

BASE = 1_000


def _offset_index(entries: list[tuple[int, int]]) -> OffsetIndex:
    index = OffsetIndex(BASE)
    for offset, position in entries:
        index.append(offset, position)
    return index


_increasing = st.lists(st.integers(1, 50), max_size=40).map(
    lambda steps: [sum(steps[: i + 1]) for i in range(len(steps))]
)


@given(offsets=_increasing, positions=_increasing, probes=st.lists(st.integers(-5, 2_500)))
def test_offset_lookup_matches_floor_oracle(
    offsets: list[int], positions: list[int], probes: list[int]
) -> None:
    entries = [(BASE + o, p) for o, p in zip(offsets, positions, strict=False)]
    index = _offset_index(entries)
    for probe in probes:
        floor = [entry for entry in entries if entry[0] <= BASE + probe]
        expected = floor[-1] if floor else (BASE, 0)
        assert index.lookup(BASE + probe) == expected, f"probe {probe}"


@given(timestamps=_increasing, offsets=_increasing, probes=st.lists(st.integers(-5, 2_500)))
def test_time_lookup_is_last_entry_strictly_below(
    timestamps: list[int], offsets: list[int], probes: list[int]
) -> None:
    index = TimeIndex(BASE)
    entries = list(zip(timestamps, offsets, strict=False))
    for timestamp, offset in entries:
        index.append(timestamp, BASE + offset)
    for probe in probes:
        below = [BASE + offset for timestamp, offset in entries if timestamp < probe]
        assert index.offset_before(probe) == (below[-1] if below else BASE), f"probe {probe}"


def test_offset_index_file_format(tmp_path: Path) -> None:
    index = _offset_index([(BASE + 3, 4096), (BASE + 9, 8200)])
    index.write(tmp_path / "x.index")
    data = (tmp_path / "x.index").read_bytes()
    assert data == struct.pack(">iiii", 3, 4096, 9, 8200)
    loaded = OffsetIndex.from_bytes(BASE, data, log_size_bytes=9000, offset_limit=BASE + 20)
    assert loaded is not None and loaded.entries() == index.entries()


def test_time_index_file_format(tmp_path: Path) -> None:
    index = TimeIndex(BASE)
    index.append(50, BASE)
    index.append(70, BASE + 4)
    index.write(tmp_path / "x.timeindex")
    data = (tmp_path / "x.timeindex").read_bytes()
    assert data == struct.pack(">qiqi", 50, 0, 70, 4)
    loaded = TimeIndex.from_bytes(BASE, data, offset_limit=BASE + 5)
    assert loaded is not None and loaded.entries() == index.entries()
    assert loaded.last_timestamp == 70 and loaded.last_offset == BASE + 4


def test_offset_index_sanity_checks() -> None:
    good = struct.pack(">iiii", 3, 100, 9, 200)

    def load(data: bytes, log_size_bytes: int = 1_000, limit: int = BASE + 20) -> bool:
        return (
            OffsetIndex.from_bytes(BASE, data, log_size_bytes=log_size_bytes, offset_limit=limit)
            is not None
        )

    assert load(good) and load(b"")
    assert not load(good[:-1]), "size must be a multiple of 8"
    assert not load(struct.pack(">iiii", 9, 100, 3, 200)), "offsets must increase"
    assert not load(struct.pack(">iiii", 3, 200, 9, 100)), "positions must increase"
    assert not load(good, log_size_bytes=200), "last position must be inside the log"
    assert not load(good, limit=BASE + 9), "offsets must be inside the segment"
    assert not load(struct.pack(">ii", -1, 0)), "relative offsets are not negative"


def test_time_index_sanity_checks() -> None:
    def load(data: bytes, limit: int = BASE + 20) -> bool:
        return TimeIndex.from_bytes(BASE, data, offset_limit=limit) is not None

    assert load(struct.pack(">qiqi", 5, 0, 6, 3)) and load(b"")
    assert not load(b"\x00" * 13)
    assert not load(struct.pack(">qiqi", 6, 0, 5, 3)), "timestamps must increase"
    assert not load(struct.pack(">qiqi", 5, 3, 6, 1)), "offsets must increase"
    assert not load(struct.pack(">qi", 5, 30)), "offsets must be inside the segment"
    assert not load(struct.pack(">qi", -7, 0)), "entries hold real timestamps"
