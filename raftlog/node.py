"""A raftlog node: one trio nursery owning the quorum, the partitions and the Kafka listener.

Start-up order matters: the metadata quorum replays its log first (so topics are known), the
partitions this node hosts are opened and recovered from that image, and only then does the
Kafka listener accept clients. SIGINT/SIGTERM cancel the nursery; logs are closed cleanly.
"""

from __future__ import annotations

import logging
import resource
import signal
from pathlib import Path

import trio

from raftlog.config import ServerConfig
from raftlog.fetch.apis import KafkaApis
from raftlog.fetch.server import ListenerLimits, serve_listener
from raftlog.metadata.quorum import LocalNode, LocalQuorum, QuorumTimeoutError
from raftlog.metadata.state import MetadataStateMachine
from raftlog.partition.manager import PartitionManager

log = logging.getLogger(__name__)
METADATA_WATCH_TIMEOUT_S = 1.0


class Node:
    """Owns every long-lived task of one raftlog process."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.data_dir = Path(config.log_dirs[0])
        self.manager = PartitionManager(self.data_dir, config.node_id)
        self.kafka_port: int | None = None

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        _raise_open_file_limit()
        host, port = self.config.listener("PLAINTEXT")
        advertised_host, advertised_port = self.config.advertised_listener()
        node = LocalNode(self.config.node_id, advertised_host, advertised_port)
        async with LocalQuorum(self.config.metadata_log_dir, MetadataStateMachine(),
                               node=node) as quorum:
            await self._serve(quorum, host, port, task_status)

    async def _serve(self, quorum: LocalQuorum, host: str, port: int,
                     task_status: trio.TaskStatus[int]) -> None:
        apis = KafkaApis(self.config, quorum, self.manager)
        self.manager.purge_leftover_deletions()
        apis.sync_partitions()
        limits = ListenerLimits(
            request_bytes_max=self.config.socket_request_max_bytes,
            idle_ms_max=self.config.connections_max_idle_ms,
        )
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.manager.run_flusher)
                nursery.start_soon(self.manager.run_retention)
                nursery.start_soon(_follow_metadata, quorum, apis)
                self.kafka_port = await nursery.start(
                    serve_listener, host, port, apis.handlers(), limits
                )
                log.info("node %d ready: Kafka on %s:%d", self.config.node_id, host,
                         self.kafka_port)
                task_status.started(self.kafka_port)
        finally:
            self.manager.close()
            log.info("node %d stopped", self.config.node_id)


def _raise_open_file_limit() -> None:
    """Each partition holds a few file descriptors; lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        log.info("open-file limit raised from %d to %d", soft, hard)


async def _follow_metadata(quorum: LocalQuorum, apis: KafkaApis) -> None:
    """Keeps local partitions in step with metadata committed by anyone."""
    version = quorum.image.version
    while True:
        try:
            image = await quorum.wait_changed(version, timeout_s=METADATA_WATCH_TIMEOUT_S)
        except QuorumTimeoutError:
            continue
        version = image.version
        apis.sync_partitions()


async def run_until_signalled(config: ServerConfig) -> None:
    """Runs a node until SIGINT or SIGTERM, then shuts it down cleanly."""
    node = Node(config)
    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            nursery.start_soon(node.run)
            async for signum in signals:
                log.info("received %s: shutting down", signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break
