"""STUB (skeleton for the metrics work; filled in by its owner before commit)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric


class RequestStats:
    """Owned by the listener (moves to raftlog.server when filled in)."""


class RequestCollector:
    def __init__(self, stats: RequestStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        yield from ()
