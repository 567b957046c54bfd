"""One ``prometheus_client`` registry per node, every collector registered here."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from raftlog.config import ServerConfig
from raftlog.observe import (
    cluster,
    groups,
    quorum,
    quotas,
    replication,
    requests,
    runtime,
    security,
    storage,
    txn,
)
from raftlog.observe.parts import MetricsSettings, NodeParts
from raftlog.server.request_stats import RequestStats


def metrics_settings(config: ServerConfig) -> MetricsSettings:
    """The ``metrics.*`` opt-ins of ``config``."""
    return MetricsSettings(
        partition_detail=config.metrics_partition_detail_enable,
        group_lag_per_partition=config.metrics_consumer_group_lag_partition_enable,
    )


def build_registry(
    parts: NodeParts, settings: MetricsSettings, request_stats: RequestStats,
    loop: runtime.LoopMonitor,
) -> CollectorRegistry:
    """A registry (not prometheus_client's global one: tests run several nodes in one
    process) with every raftlog collector and the library's process collector."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in (
        requests.RequestCollector(request_stats),
        cluster.ClusterCollector(parts),
        storage.StorageCollector(parts, settings),
        replication.ReplicationCollector(parts, settings),
        quorum.QuorumCollector(parts),
        groups.GroupCollector(parts, settings),
        txn.TxnCollector(parts),
        security.SecurityCollector(parts),
        runtime.RuntimeCollector(loop, parts),
        quotas.QuotaCollector(parts),
    ):
        registry.register(collector)
    runtime.register_process_collector(registry)
    return registry
