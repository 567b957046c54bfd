"""Process families (docs/metrics.md, "Process"): the event loop's lateness, the node's
identity, and prometheus_client's process collector (CPU, memory, file descriptors)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import trio
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric

from raftlog.metrics.recorders import Histogram
from raftlog.observe.families import histogram
from raftlog.observe.parts import NodeParts

LOOP_CHECK_INTERVAL_S: Final = 0.1


class LoopMonitor:
    """A task that sleeps ``interval_s`` over and over and records, in milliseconds, how late
    the trio loop wakes it: a loop blocked by a long synchronous step (a big fsync on the
    trio thread, a slow handler) shows up here first."""

    def __init__(self, interval_s: float = LOOP_CHECK_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.lag_ms = Histogram()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            due = trio.current_time() + self.interval_s
            await trio.sleep_until(due)
            self.lag_ms.observe(max(0.0, trio.current_time() - due) * 1000.0)


class RuntimeCollector:
    def __init__(self, loop: LoopMonitor, parts: NodeParts) -> None:
        self._loop = loop
        self._parts = parts

    def collect(self) -> Iterator[Metric]:
        yield histogram("raftlog_event_loop_lag_ms",
                        "How late, in milliseconds, the trio loop runs a check scheduled every "
                        f"{self._loop.interval_s * 1000:g} ms.", self._loop.lag_ms)
        config = self._parts.config
        info = GaugeMetricFamily("raftlog_node_info", "1, labelled with the node's identity.",
                                 labels=["node_id", "cluster_id", "roles"])
        info.add_metric([str(config.node_id), config.cluster_id or "",
                         ",".join(config.process_roles)], 1)
        yield info


def register_process_collector(registry: CollectorRegistry) -> None:
    """prometheus_client's ``process_*`` families (Linux /proc) on ``registry``."""
    ProcessCollector(registry=registry)
