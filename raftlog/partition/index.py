"""Sparse offset and time indexes of one segment, in Kafka's on-disk formats.

Both are kept in memory as parallel ``array`` columns (4-8 bytes per value instead of a
Python int object) and searched with ``bisect``. Files are written whole when a segment is
sealed; like Kafka, nothing is checksummed, so a file that fails the sanity checks is thrown
away and the index is rebuilt from the log. Neither class is thread-safe.
"""

from __future__ import annotations

import operator
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from itertools import islice
from pathlib import Path

from raftlog.partition.files import write_atomically

__all__ = ["INT32_MAX", "OffsetIndex", "TimeIndex"]

INT32_MAX = (1 << 31) - 1
_TIME_ENTRY = struct.Struct(">qi")
assert array("i").itemsize == 4 and array("q").itemsize == 8


def _strictly_increasing(values: array[int]) -> bool:
    # map(operator.lt, ...) keeps the loop in C: indexes can hold ~10^5 entries per segment.
    return all(map(operator.lt, values, islice(values, 1, None)))


def _big_endian(values: array[int]) -> bytes:
    if sys.byteorder == "little":
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


class OffsetIndex:
    """Maps offsets to the file position of a batch starting at or before them.

    File format (``.index``): entries of relative offset int32 + position int32, big-endian,
    both strictly increasing. An entry is the base offset of a batch and its start position.
    """

    ENTRY_BYTES = 8

    def __init__(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self._relative_offsets: array[int] = array("i")
        self._positions: array[int] = array("i")

    def __len__(self) -> int:
        return len(self._positions)

    @property
    def last_position(self) -> int:
        """Position of the last indexed batch; 0 (the first batch) when empty."""
        return self._positions[-1] if self._positions else 0

    def append(self, offset: int, position: int) -> None:
        relative_offset = offset - self.base_offset
        assert 0 <= relative_offset <= INT32_MAX, f"offset {offset} outside the segment"
        assert 0 <= position <= INT32_MAX, f"position {position} does not fit an int32"
        if self._positions:
            assert relative_offset > self._relative_offsets[-1], "offsets must increase"
            assert position > self._positions[-1], "positions must increase"
        self._relative_offsets.append(relative_offset)
        self._positions.append(position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """The last entry with offset <= ``offset`` as (offset, position); the segment start
        (base_offset, 0) when there is none."""
        slot = bisect_right(self._relative_offsets, offset - self.base_offset) - 1
        if slot < 0:
            return self.base_offset, 0
        return self.base_offset + self._relative_offsets[slot], self._positions[slot]

    def offset_before_position(self, position: int) -> int:
        """The offset of the last entry at or before ``position``: a batch starting at
        ``position`` has at least this offset (base_offset when no entry is that early)."""
        slot = bisect_right(self._positions, position) - 1
        return self.base_offset + (self._relative_offsets[slot] if slot >= 0 else 0)

    def entries(self) -> list[tuple[int, int]]:
        """(offset, position) pairs; visible for testing."""
        pairs = zip(self._relative_offsets, self._positions, strict=True)
        return [(self.base_offset + relative, position) for relative, position in pairs]

    def to_bytes(self) -> bytes:
        interleaved = array("i", bytes(2 * len(self) * 4))
        interleaved[0::2] = self._relative_offsets
        interleaved[1::2] = self._positions
        return _big_endian(interleaved)

    def write(self, path: Path) -> None:
        """Write and fsync the file (not its directory entry: a lost file is rebuilt)."""
        write_atomically(path, self.to_bytes(), sync_directory=False)

    @classmethod
    def from_bytes(
        cls, base_offset: int, data: bytes, *, log_size_bytes: int, offset_limit: int
    ) -> OffsetIndex | None:
        """Parse an index file; None when it fails a sanity check: size not a multiple of 8,
        entries not strictly increasing, a position at or past the end of the log, or an
        offset at or past ``offset_limit`` (the segment's end offset)."""
        if len(data) % cls.ENTRY_BYTES:
            return None
        interleaved = array("i", data)
        if sys.byteorder == "little":
            interleaved.byteswap()
        index = cls(base_offset)
        index._relative_offsets = interleaved[0::2]
        index._positions = interleaved[1::2]
        return index if index._is_sane(log_size_bytes, offset_limit) else None

    def _is_sane(self, log_size_bytes: int, offset_limit: int) -> bool:
        if not self._positions:
            return True
        return (
            self._relative_offsets[0] >= 0
            and self._positions[0] >= 0
            and self._positions[-1] < log_size_bytes
            and self.base_offset + self._relative_offsets[-1] < offset_limit
            and _strictly_increasing(self._relative_offsets)
            and _strictly_increasing(self._positions)
        )


class TimeIndex:
    """Maps timestamps to the first batch at which the segment's max timestamp reached them.

    File format (``.timeindex``): entries of timestamp int64 + relative offset int32,
    big-endian. An entry (T, O) says: the batch at offset O has maxTimestamp T and every
    earlier batch of the segment has a smaller one. Both columns strictly increase, and the
    last entry of a sealed segment holds the segment's largest timestamp.
    """

    ENTRY_BYTES = _TIME_ENTRY.size

    def __init__(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self._timestamps: array[int] = array("q")
        self._relative_offsets: array[int] = array("i")

    def __len__(self) -> int:
        return len(self._timestamps)

    @property
    def last_timestamp(self) -> int:
        """Largest indexed timestamp; -1 (Kafka's NO_TIMESTAMP) when empty."""
        return self._timestamps[-1] if self._timestamps else -1

    @property
    def last_offset(self) -> int:
        return self.base_offset + self._relative_offsets[-1] if self else self.base_offset

    def append(self, timestamp_ms: int, offset: int) -> None:
        relative_offset = offset - self.base_offset
        assert 0 <= relative_offset <= INT32_MAX, f"offset {offset} outside the segment"
        assert timestamp_ms > self.last_timestamp, "time index entries mark growth only"
        if self._relative_offsets:
            assert relative_offset > self._relative_offsets[-1]
        self._timestamps.append(timestamp_ms)
        self._relative_offsets.append(relative_offset)

    def offset_before(self, timestamp_ms: int) -> int:
        """Offset of the last entry whose timestamp is < ``timestamp_ms``, else base_offset.
        No batch before the returned offset can have a timestamp >= ``timestamp_ms``."""
        slot = bisect_left(self._timestamps, timestamp_ms) - 1
        if slot < 0:
            return self.base_offset
        return self.base_offset + self._relative_offsets[slot]

    def entries(self) -> list[tuple[int, int]]:
        """(timestamp, offset) pairs; visible for testing."""
        pairs = zip(self._timestamps, self._relative_offsets, strict=True)
        return [(timestamp, self.base_offset + relative) for timestamp, relative in pairs]

    def to_bytes(self) -> bytes:
        return b"".join(
            _TIME_ENTRY.pack(timestamp, relative)
            for timestamp, relative in zip(self._timestamps, self._relative_offsets, strict=True)
        )

    def write(self, path: Path) -> None:
        """Write and fsync the file (not its directory entry: a lost file is rebuilt)."""
        write_atomically(path, self.to_bytes(), sync_directory=False)

    @classmethod
    def from_bytes(cls, base_offset: int, data: bytes, *, offset_limit: int) -> TimeIndex | None:
        """Parse a time index file; None when it fails a sanity check (size, monotonicity,
        an offset at or past ``offset_limit``)."""
        if len(data) % cls.ENTRY_BYTES:
            return None
        index = cls(base_offset)
        for timestamp_ms, relative_offset in _TIME_ENTRY.iter_unpack(data):
            index._timestamps.append(timestamp_ms)
            index._relative_offsets.append(relative_offset)
        return index if index._is_sane(offset_limit) else None

    def _is_sane(self, offset_limit: int) -> bool:
        if not self._timestamps:
            return True
        return (
            self._relative_offsets[0] >= 0
            and self._timestamps[0] >= 0
            and self.base_offset + self._relative_offsets[-1] < offset_limit
            and _strictly_increasing(self._timestamps)
            and _strictly_increasing(self._relative_offsets)
        )
