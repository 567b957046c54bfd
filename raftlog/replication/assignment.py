"""What a replica fetcher works on: the partitions it follows, its stats, and what it needs
from the replica manager (``raftlog.replication.fetcher`` uses them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from raftlog.client.connection import ClusterLogin
from raftlog.metrics.recorders import Counter
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import Partition
from raftlog.replication.settings import PartitionKey, ReplicationSettings

__all__ = ["FetcherStats", "Follower", "FollowerAssignment"]


class FetcherStats:
    """What this node's replica fetchers did as a follower, over every leader (Kafka's
    FetcherStats and BrokerTopicMetrics ReplicationBytesInPerSec), read by
    ``raftlog.observe``: Fetch requests sent, record bytes they returned, bytes appended."""

    __slots__ = ("appended_bytes", "fetched_bytes", "requests")

    def __init__(self) -> None:
        self.requests = Counter()
        self.fetched_bytes = Counter()
        self.appended_bytes = Counter()


class Follower(Protocol):
    """What a fetcher needs from the replica manager that runs it."""

    node_id: int
    manager: PartitionManager
    settings: ReplicationSettings
    login: ClusterLogin | None
    fetcher_stats: FetcherStats

    def is_following(self, assignment: FollowerAssignment) -> bool: ...

    def broker_address(self, node_id: int) -> tuple[str, int] | None: ...


@dataclass(eq=False, slots=True)
class FollowerAssignment:
    """A partition this node follows, for one leader epoch. A new epoch is a new object, so
    a fetcher can tell, after any await, whether what it is about to do is still wanted."""

    partition: Partition
    leader_id: int
    leader_epoch: int
    needs_truncation: bool = True
    delayed_until: float = 0.0  # trio time; backoff after an error
    # The leader's high watermark in its latest Fetch answer (-1: none yet): the follower's
    # lag is how far its log end is behind it (Kafka's FetcherLagStats).
    leader_high_watermark: int = -1
    # The corrupt batch's offset this follower reported to the leader as its log end (-1:
    # none): it truncates only after that, see ``LeaderFetcher._drop_corrupt``.
    reported_corrupt_offset: int = -1

    @property
    def key(self) -> PartitionKey:
        return self.partition.topic, self.partition.index
