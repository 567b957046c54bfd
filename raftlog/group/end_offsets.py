"""High watermarks of partitions this node does not host, for consumer-group lag.

A group's lag on a partition is the partition's high watermark minus the group's committed
offset. The coordinator knows the committed offsets; the high watermark it knows only for the
partitions it hosts (exact as their leader, the last one a fetch response carried as a
follower). For the others (topics with fewer replicas than nodes), this task asks the leaders:
every ``interval_s``, one ListOffsets (latest, read_uncommitted: the high watermark) per leader
for the partitions the loaded groups have committed and this node does not host, each request
bounded by a timeout. The answers are kept in a bounded table that the metrics read at scrape
time (no I/O there); an answer older than ``stale_after_s`` is not used, so a partition whose
leader stopped answering has no lag rather than a frozen one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Final

import trio

from raftlog.client.connection import ClusterLogin, KafkaClientError
from raftlog.client.peers import PeerConnections, registered_address
from raftlog.metadata.image import NO_LEADER
from raftlog.partition.manager import PartitionManager
from raftlog.protocol.schemas import LIST_OFFSETS
from raftlog.quorum.interface import Quorum

__all__ = ["RemoteEndOffsets"]

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

REFRESH_INTERVAL_S: Final = 5.0
REQUEST_TIMEOUT_S: Final = 5.0
# Partitions tracked at most (the loaded groups' committed partitions not hosted here).
MAX_PARTITIONS: Final = 10_000
LATEST: Final = -1


class RemoteEndOffsets:
    """See the module docstring. ``wanted`` lists the partitions the loaded groups have
    committed offsets for (this task leaves out the ones this node hosts)."""

    def __init__(self, node_id: int, quorum: Quorum, manager: PartitionManager,
                 wanted: Callable[[], Iterable[TopicPartition]], *,
                 login: ClusterLogin | None = None, interval_s: float = REFRESH_INTERVAL_S,
                 max_partitions: int = MAX_PARTITIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node_id = node_id
        self.quorum = quorum
        self.manager = manager
        self._wanted = wanted
        self.interval_s = interval_s
        self.stale_after_s = 3 * interval_s + REQUEST_TIMEOUT_S
        self.max_partitions = max_partitions
        self._clock = clock
        # partition → (high watermark, when it was answered on ``clock``)
        self._values: dict[TopicPartition, tuple[int, float]] = {}
        self._peers = PeerConnections(registered_address(lambda: quorum.image),
                                      client_id=f"group-lag-{node_id}",
                                      timeout_s=REQUEST_TIMEOUT_S, login=login)

    def get(self, topic: str, index: int) -> int | None:
        """The partition's high watermark as its leader last answered, unless stale."""
        entry = self._values.get((topic, index))
        if entry is None or self._clock() - entry[1] > self.stale_after_s:
            return None
        return entry[0]

    def _hosted(self, tp: TopicPartition) -> bool:
        partition = self.manager.get(*tp)
        return partition is not None and not partition.deleted

    def remote_partitions(self) -> list[TopicPartition]:
        """The wanted partitions this node does not host, at most ``max_partitions``."""
        remote = sorted({tp for tp in self._wanted() if not self._hosted(tp)})
        return remote[: self.max_partitions]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        task_status.started()
        try:
            while True:
                await trio.sleep(self.interval_s)
                try:
                    await self.refresh()
                except Exception:  # never take the node down for a metric
                    log.exception("refreshing end offsets for group lag failed")
        finally:
            with trio.CancelScope(shield=True):
                await self.aclose()

    async def aclose(self) -> None:
        await self._peers.aclose()

    async def refresh(self) -> None:
        """One round: ask every leader of a remote partition for its high watermark."""
        remote = self.remote_partitions()
        wanted = set(remote)
        for tp in [tp for tp in self._values if tp not in wanted]:
            del self._values[tp]  # bounded: only what the groups still need
        image = self.quorum.image
        by_leader: dict[int, list[TopicPartition]] = {}
        for topic, index in remote:
            known = image.topics.get(topic)
            if known is None or index >= len(known.partitions):
                continue
            leader = known.partitions[index].leader
            if leader not in (NO_LEADER, self.node_id):
                by_leader.setdefault(leader, []).append((topic, index))
        for leader, partitions in by_leader.items():
            await self._ask(leader, partitions)

    async def _ask(self, leader: int, partitions: list[TopicPartition]) -> None:
        topics: dict[str, list[dict[str, int]]] = {}
        for topic, index in partitions:
            topics.setdefault(topic, []).append({"partition_index": index,
                                                 "timestamp": LATEST})
        body = {"replica_id": -1, "isolation_level": 0, "topics": [
            {"name": name, "partitions": parts} for name, parts in topics.items()]}
        try:
            response = await self._peers.request(leader, LIST_OFFSETS, body)
        except KafkaClientError as exc:
            log.debug("ListOffsets to node %d for group lag failed: %s", leader, exc)
            return
        now = self._clock()
        for topic in response.topics:
            for result in topic.partitions:
                if not result.error_code and result.offset >= 0:
                    self._values[(topic.name, result.partition_index)] = (result.offset, now)
