"""Consumer-group metrics of the groups this node coordinates (docs/metrics.md, "Groups and
transactions"), read from the group coordinator's state at scrape time.

Lag, per partition a group has committed: the partition's high watermark minus the committed
offset (0 when the commit is at or past it). The high watermark is this node's own when it
hosts a replica (exact as leader, as of the last fetch response as follower; with the usual
replication factor of 3 on 3 nodes every partition is hosted everywhere), otherwise the one its
leader last answered to ``raftlog.group.end_offsets`` (refreshed every few seconds). A
partition whose high watermark is unknown (no leader answered recently) has no lag and counts
in neither the sum nor the max. Only the coordinator reports a group, so a sum over nodes is
the cluster's value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

from raftlog.group.coordinator import (
    COMPLETING_REBALANCE,
    DEAD,
    EMPTY,
    PREPARING_REBALANCE,
    STABLE,
    Group,
)
from raftlog.group.end_offsets import RemoteEndOffsets
from raftlog.observe.families import counter, gauge_rows
from raftlog.observe.parts import MetricsSettings, NodeParts
from raftlog.partition.manager import PartitionManager

__all__ = ["GROUP_STATES", "GroupCollector", "GroupLag", "group_lags"]

# Kafka's GroupMetadataManager gauges, one per state (every state is reported, 0 included).
GROUP_STATES = (EMPTY, PREPARING_REBALANCE, COMPLETING_REBALANCE, STABLE, DEAD)

HighWatermark = Callable[[str, int], int | None]


@dataclass(frozen=True)
class GroupLag:
    """One group's lag: per committed partition with a known high watermark."""

    group_id: str
    partitions: tuple[tuple[str, int, int], ...]  # (topic, partition, lag)

    @property
    def total(self) -> int:
        return sum(lag for _, _, lag in self.partitions)

    @property
    def largest(self) -> int:
        return max((lag for _, _, lag in self.partitions), default=0)


def group_lags(groups: Iterable[Group], high_watermark: HighWatermark) -> list[GroupLag]:
    """The lag of every group with a committed offset whose high watermark is known."""
    out: list[GroupLag] = []
    for group in groups:
        rows: list[tuple[str, int, int]] = []
        for (topic, index), committed in list(group.offsets.items()):
            hw = high_watermark(topic, index)
            if hw is not None:
                rows.append((topic, index, max(0, hw - committed.offset)))
        if rows:
            out.append(GroupLag(group.group_id, tuple(sorted(rows))))
    return out


def high_watermarks(manager: PartitionManager, remote: RemoteEndOffsets | None
                    ) -> HighWatermark:
    """The high watermark of a partition: this node's replica's, else the leader's last
    answer to ``remote`` (None: unknown)."""

    def high_watermark(topic: str, index: int) -> int | None:
        partition = manager.get(topic, index)
        if partition is not None and not partition.deleted:
            return partition.high_watermark
        return None if remote is None else remote.get(topic, index)

    return high_watermark


class GroupCollector:
    def __init__(self, parts: NodeParts, settings: MetricsSettings) -> None:
        self._parts = parts
        self._settings = settings

    def collect(self) -> Iterator[Metric]:
        install = self._parts.groups
        if install is None:  # a controller-only node coordinates no groups
            return
        core = install.service.core
        groups = list(core.groups.values())
        by_state = dict.fromkeys(GROUP_STATES, 0)
        for group in groups:
            by_state[group.state] = by_state.get(group.state, 0) + 1
        yield gauge_rows(
            "kafka_coordinator_group_groupmetadatamanager_numgroups",
            "Groups this node coordinates, by state", ["state"],
            (([state], count) for state, count in by_state.items()))
        yield counter("raftlog_group_rebalances",
                      "Rebalances completed (generations started) by this coordinator",
                      core.rebalances)
        lags = group_lags(groups, high_watermarks(self._parts.manager, install.end_offsets))
        yield gauge_rows("kafka_consumergroup_lag_sum",
                         "Committed offset lag summed over the group's partitions", ["group"],
                         (([lag.group_id], lag.total) for lag in lags))
        yield gauge_rows("kafka_consumergroup_lag_max",
                         "The largest committed offset lag of one of the group's partitions",
                         ["group"], (([lag.group_id], lag.largest) for lag in lags))
        if self._settings.group_lag_per_partition:
            family = GaugeMetricFamily(
                "kafka_consumergroup_lag", "High watermark minus the group's committed offset",
                labels=["group", "topic", "partition"])
            for lag in lags:
                for topic, index, value in lag.partitions:
                    family.add_metric([lag.group_id, topic, str(index)], value)
            yield family
