"""Which byte ranges of a segment file have had every batch's CRC-32C checked, and the pacing
of the background scrub. Pure and synchronous.

A segment's bytes are trusted only once checked in this process: appends check every batch
before writing (``validate_batches``), recovery scans the active segment with its CRCs, and
reads and the scrubber check the rest (``log_verify``). Ranges always start and end on batch
boundaries, so what is missing from a read's range is whole batches too.
"""

from __future__ import annotations

from bisect import bisect_right

__all__ = ["ScrubPacer", "VerifiedRanges"]


class VerifiedRanges:
    """Disjoint, sorted, non-adjacent [start, end) byte ranges that were CRC-checked, and
    where the first batch known to be bad starts (``bad_from``: the scrub stops there; what
    follows cannot be parsed with confidence)."""

    __slots__ = ("_ends", "_starts", "bad_from")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self.bad_from: int | None = None

    @property
    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._ends, strict=True))

    @property
    def watermark(self) -> int:
        """Every byte below this was checked (the verified prefix)."""
        return self._ends[0] if self._starts and self._starts[0] == 0 else 0

    @property
    def verified_bytes(self) -> int:
        return sum(end - start for start, end in zip(self._starts, self._ends, strict=True))

    def add(self, start: int, end: int) -> None:
        """Mark [start, end) as checked, merging with overlapping or adjacent ranges."""
        if end <= start:
            return
        first = bisect_right(self._ends, start - 1)  # first range ending at or after start
        last = bisect_right(self._starts, end)  # ranges from here on start after end
        if first < last:
            start = min(start, self._starts[first])
            end = max(end, self._ends[last - 1])
        self._starts[first:last] = [start]
        self._ends[first:last] = [end]

    def missing(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of [start, end) not yet checked, in order."""
        gaps: list[tuple[int, int]] = []
        position = start
        slot = bisect_right(self._ends, start)  # first range ending after start
        while position < end:
            if slot == len(self._starts) or self._starts[slot] >= end:
                gaps.append((position, end))
                break
            if self._starts[slot] > position:
                gaps.append((position, self._starts[slot]))
            position = max(position, self._ends[slot])
            slot += 1
        return gaps

    def mark_bad(self, position: int) -> None:
        """A batch starting at ``position`` failed its check."""
        if self.bad_from is None or position < self.bad_from:
            self.bad_from = position

    def first_gap(self, size: int) -> tuple[int, int] | None:
        """The first unchecked part of [0, size) before any known bad batch, or None."""
        if self.bad_from is not None:
            size = min(size, self.bad_from)
        gaps = self.missing(0, size) if size > 0 else []
        return gaps[0] if gaps else None

    def truncate(self, size: int) -> None:
        """Forget everything at or after ``size`` (the file was cut there)."""
        if self.bad_from is not None and self.bad_from >= size:
            self.bad_from = None
        while self._starts and self._starts[-1] >= size:
            self._starts.pop()
            self._ends.pop()
        if self._ends and self._ends[-1] > size:
            self._ends[-1] = size

    def clear(self) -> None:
        self.bad_from = None
        self._starts.clear()
        self._ends.clear()


class ScrubPacer:
    """A byte budget per second (``log.scrub.bytes.per.second``): after checking ``n`` bytes
    at time ``now``, the next chunk may start once ``n / rate`` seconds have passed since the
    previous one was allowed (so short pauses are made up, long idle time is not banked)."""

    __slots__ = ("_next_s", "rate")

    def __init__(self, bytes_per_second: int) -> None:
        assert bytes_per_second > 0
        self.rate = bytes_per_second
        self._next_s: float | None = None

    def delay_after(self, checked_bytes: int, now_s: float) -> float:
        """Seconds to wait before the next chunk, having just checked ``checked_bytes``."""
        start = now_s if self._next_s is None else max(self._next_s, now_s - 1.0)
        self._next_s = start + checked_bytes / self.rate
        return max(self._next_s - now_s, 0.0)
