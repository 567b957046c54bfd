"""STUB (skeleton for the metrics work; filled in by its owner before commit)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric


class LoopMonitor:
    pass


class RuntimeCollector:
    def __init__(self, loop: LoopMonitor) -> None:
        self._loop = loop

    def collect(self) -> Iterator[Metric]:
        yield from ()


def register_process_collector(registry: CollectorRegistry) -> None:
    pass
