"""Counters and histograms a part owns and updates on its hot path: a pure core.

Why not ``prometheus_client``'s own ``Counter``/``Histogram`` here: they take a lock on every
update and allocate per label lookup, and the parts that record (the listener, the log, the
replica fetchers) all run on the node's one trio thread. These recorders are plain integers
and lists, updated without locks or allocation; ``raftlog.observe`` turns them into
``prometheus_client`` metric families when Prometheus scrapes (the exposition format is the
library's, never hand-written).

Rules: update only from the trio thread (results of work done in worker threads are recorded
after ``trio.to_thread`` returns); label keys are tuples of strings fixed by the owner, and the
owner bounds how many there can be (API names, error codes, topics).
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterator
from typing import Final

# Milliseconds, for request stages, fsyncs and replication waits: 0.1 ms to 30 s.
LATENCY_MS_BUCKETS: Final = (
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0,
    5000.0, 10000.0, 30000.0,
)


class Counter:
    """A monotonically increasing count (``inc`` with a non-negative amount)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        assert amount >= 0, amount
        self.value += amount


class CounterMap:
    """Counters keyed by a tuple of label values; a key appears on its first ``inc``."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: dict[Hashable, int] = {}

    def inc(self, key: Hashable, amount: int = 1) -> None:
        assert amount >= 0, amount
        values = self._values
        values[key] = values.get(key, 0) + amount

    def get(self, key: Hashable) -> int:
        return self._values.get(key, 0)

    def items(self) -> Iterator[tuple[Hashable, int]]:
        # A copy: a scrape must not see the dict change size under it.
        return iter(list(self._values.items()))


class Histogram:
    """Observations counted into fixed cumulative-at-read buckets (upper bounds, inclusive).

    ``counts[i]`` counts observations in ``(bounds[i-1], bounds[i]]``; the last slot counts those
    above every bound (Prometheus's ``+Inf``).
    """

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_MS_BUCKETS) -> None:
        assert list(bounds) == sorted(bounds) and len(set(bounds)) == len(bounds), bounds
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, cumulative count)`` pairs ending with ``+Inf``, as the exposition wants."""
        total = 0
        out: list[tuple[str, int]] = []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), total))
        return out


class HistogramMap:
    """Histograms keyed by a tuple of label values, made on first ``observe``."""

    __slots__ = ("_bounds", "_histograms")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_MS_BUCKETS) -> None:
        self._bounds = bounds
        self._histograms: dict[Hashable, Histogram] = {}

    def observe(self, key: Hashable, value: float) -> None:
        histogram = self._histograms.get(key)
        if histogram is None:
            histogram = self._histograms[key] = Histogram(self._bounds)
        histogram.observe(value)

    def get(self, key: Hashable) -> Histogram | None:
        return self._histograms.get(key)

    def items(self) -> Iterator[tuple[Hashable, Histogram]]:
        return iter(list(self._histograms.items()))
