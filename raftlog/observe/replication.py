"""Replication (docs/metrics.md, "Replication") and the replication byte counters of
"Requests" (``kafka_server_brokertopicmetrics_replicationbytesin``/``out``).

As leader: how long each follower has not been caught up, from the leader state the
partitions keep (``LeaderState.followers``); as follower: how far each followed partition's
log end is behind the leader's high watermark of the latest Fetch answer
(``FollowerAssignment.leader_high_watermark``). One pass over this node's partitions and one
over its fetchers' assignments, at scrape time. Counters are the recorders the parts own
(``ReplicaManager.fetcher_stats``, ``FetchApis.stats``).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from raftlog.observe import families
from raftlog.observe.parts import MetricsSettings, NodeParts
from raftlog.partition.partition import now_ms
from raftlog.partition.replica_state import FollowerState

__all__ = ["ReplicationCollector", "follower_lag_seconds"]


class ReplicationCollector:
    def __init__(self, parts: NodeParts, settings: MetricsSettings) -> None:
        self._parts = parts
        self._settings = settings

    def collect(self) -> Iterator[Metric]:
        parts = self._parts
        detail = self._settings.partition_detail
        now = now_ms()
        lag_seconds_max = 0.0
        lag_messages_rows: list[tuple[list[str], float]] = []
        lag_seconds_rows: list[tuple[list[str], float]] = []
        for partition in list(parts.manager.partitions.values()):
            state = partition.leader_state
            if state is None or not partition.is_leader or partition.deleted:
                continue
            end = partition.log.log_end_offset
            for replica, follower in list(state.followers.items()):
                seconds = follower_lag_seconds(follower, end, state.started_ms, now)
                lag_seconds_max = max(lag_seconds_max, seconds)
                if detail:
                    labels = [partition.topic, str(partition.index), str(replica)]
                    # Not fetched yet in this leadership: behind by everything the leader has.
                    known = follower.log_end_offset if follower.log_end_offset >= 0 \
                        else partition.log.log_start_offset
                    lag_messages_rows.append((labels, max(end - known, 0)))
                    lag_seconds_rows.append((labels, seconds))
        max_lag = 0
        for fetcher in list(parts.replicas.fetchers.values()):
            for assignment in list(fetcher.assignments.values()):
                leader_high_watermark = assignment.leader_high_watermark
                if leader_high_watermark >= 0:
                    max_lag = max(max_lag, leader_high_watermark
                                  - assignment.partition.log.log_end_offset)
        yield families.gauge(
            "kafka_server_replicafetchermanager_maxlag",
            "As follower: the largest (leader's high watermark - own log end offset) over"
            " followed partitions, in messages.", max_lag)
        yield families.gauge(
            "raftlog_replica_lag_seconds_max",
            "As leader: the longest time any follower has not been caught up.",
            lag_seconds_max)
        if detail:
            yield families.gauge_rows(
                "raftlog_replica_lag_messages",
                "As leader: leader log end offset - the follower's log end offset.",
                ["topic", "partition", "replica"], lag_messages_rows)
            yield families.gauge_rows(
                "raftlog_replica_lag_seconds",
                "As leader: time since that follower was last caught up.",
                ["topic", "partition", "replica"], lag_seconds_rows)
        fetcher_stats = parts.replicas.fetcher_stats
        yield families.counter(
            "kafka_server_fetcherstats_requests",
            "Replica fetch requests this node sent as follower.", fetcher_stats.requests)
        yield families.counter(
            "kafka_server_fetcherstats_bytes",
            "Record bytes this node's replica fetches returned.", fetcher_stats.fetched_bytes)
        yield families.counter(
            "kafka_server_brokertopicmetrics_replicationbytesin",
            "Bytes appended as follower.", fetcher_stats.appended_bytes)
        yield families.counter(
            "kafka_server_brokertopicmetrics_replicationbytesout",
            "Record bytes served to followers.",
            parts.apis.fetch_apis.stats.replication_bytes_out)


def follower_lag_seconds(follower: FollowerState, leader_end_offset: int,
                         leadership_started_ms: int, now: int) -> float:
    """0 for a follower at the leader's log end, else the seconds since it was last caught
    up (Kafka's ``lastCaughtUpTimeMs``), counted at most from when this leadership began
    (before that, this leader knows nothing about it)."""
    if follower.log_end_offset >= leader_end_offset:
        return 0.0
    since = max(follower.last_caught_up_ms, leadership_started_ms)
    return max(now - since, 0) / 1000
