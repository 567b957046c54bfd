"""Kafka's broker replication properties (``replica.*``), shared by both sides of
replication (``raftlog.replication.leader`` and ``raftlog.replication.fetcher``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["PartitionKey", "ReplicationSettings"]

PartitionKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ReplicationSettings:
    """Kafka's broker replication properties (names in the comments) and their defaults."""

    replica_lag_time_max_ms: int = 30_000  # replica.lag.time.max.ms
    fetch_max_bytes: int = 4 << 20  # replica.fetch.max.bytes (per partition; see config.py)
    fetch_response_max_bytes: int = 10 << 20  # replica.fetch.response.max.bytes
    fetch_wait_max_ms: int = 500  # replica.fetch.wait.max.ms
    fetch_min_bytes: int = 1  # replica.fetch.min.bytes
    fetch_backoff_ms: int = 1000  # replica.fetch.backoff.ms (after an error)
    socket_timeout_ms: int = 30_000  # replica.socket.timeout.ms (every request)
    hw_checkpoint_interval_ms: int = 5000  # replica.high.watermark.checkpoint.interval.ms
    alter_isr_retry_backoff_ms: int = 1000  # how soon a failed AlterPartition is retried
    alter_isr_timeout_ms: int = 30_000  # an unanswered AlterPartition counts as failed

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> ReplicationSettings:
        """Build from Kafka property names (missing ones keep their defaults)."""
        names = {
            "replica_lag_time_max_ms": "replica.lag.time.max.ms",
            "fetch_max_bytes": "replica.fetch.max.bytes",
            "fetch_response_max_bytes": "replica.fetch.response.max.bytes",
            "fetch_wait_max_ms": "replica.fetch.wait.max.ms",
            "fetch_min_bytes": "replica.fetch.min.bytes",
            "fetch_backoff_ms": "replica.fetch.backoff.ms",
            "socket_timeout_ms": "replica.socket.timeout.ms",
            "hw_checkpoint_interval_ms": "replica.high.watermark.checkpoint.interval.ms",
        }
        values = {attr: int(properties[key]) for attr, key in names.items() if key in properties}
        return cls(**values)
