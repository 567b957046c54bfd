"""STUB (skeleton for the metrics work; filled in by its owner before commit)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from raftlog.observe.parts import NodeParts


class ClusterCollector:
    def __init__(self, parts: NodeParts) -> None:
        self._parts = parts

    def collect(self) -> Iterator[Metric]:
        yield from ()
