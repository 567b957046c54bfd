"""Metadata quorum metrics: this node's Raft role, leader, term and log positions (Kafka's
``raft-metrics`` names), how long since it heard from the leader, and quorum-side errors.

Read at scrape time from ``Quorum.status()`` (a few attribute reads and one small tuple per
voter), ``Quorum.leader_contact_age_s()`` and ``Quorum.error_counts()``; the Raft quorum's
tick thread writes what they read as plain attributes, so nothing here blocks or locks.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from raftlog.observe import families
from raftlog.observe.parts import NodeParts
from raftlog.quorum.interface import QUORUM_ERROR_KINDS

RAFT_STATES = ("leader", "follower", "candidate", "observer")


class QuorumCollector:
    """The rows of docs/metrics.md, "Metadata quorum"."""

    def __init__(self, parts: NodeParts) -> None:
        self._parts = parts

    def collect(self) -> Iterator[Metric]:
        quorum = self._parts.quorum
        status = quorum.status()
        yield families.gauge_rows(
            "kafka_server_raft_metrics_current_state", "1 for this node's Raft role",
            ["state"], (((state,), 1 if status.role == state else 0) for state in RAFT_STATES))
        leader = status.leader_node_id
        yield families.gauge("kafka_server_raft_metrics_current_leader",
                             "The Raft leader's node id (-1: none known)",
                             -1 if leader is None else leader)
        yield families.gauge("kafka_server_raft_metrics_current_epoch", "The Raft term",
                             status.term)
        yield families.gauge("kafka_server_raft_metrics_high_watermark",
                             "Highest committed metadata log index", status.commit_index)
        yield families.gauge("kafka_server_raft_metrics_log_end_offset",
                             "Highest index in this node's metadata log", status.last_log_index)
        yield families.gauge(
            "kafka_server_broker_metadata_metrics_last_applied_record_offset",
            "Highest metadata log index applied to this node's image", status.last_applied)
        yield families.gauge("raftlog_metadata_version", "The metadata image version",
                             status.metadata_version)
        yield families.gauge(
            "raftlog_quorum_leader_last_contact_seconds",
            "Seconds since this node last heard from the Raft leader (0 on the leader)",
            quorum.leader_contact_age_s())
        counts = quorum.error_counts()
        errors = CounterMetricFamily(
            "raftlog_quorum_errors",
            "Quorum-side failures: proposal timeouts, transport and storage errors",
            labels=["kind"])
        for kind in QUORUM_ERROR_KINDS:
            errors.add_metric([kind], counts.get(kind, 0))
        yield errors
