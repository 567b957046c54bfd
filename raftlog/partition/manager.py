"""The node's partitions: which logs exist here, group commit, high watermarks, retention.

``PartitionLog`` is plain synchronous storage; this module is its trio shell. It owns:

* the set of local partitions, kept in step with the metadata image (create and delete);
* group commit: appends land in the page cache at once and one flusher task fsyncs every
  dirty log in a worker thread, so one fsync covers every request that arrived meanwhile;
* the high watermark: with the default durability (``flush.messages`` unset) a record is
  visible to consumers and acknowledged to producers only once it is fsynced. Relaxed
  ``flush.messages`` / ``flush.ms`` make it visible at once and fsync on that policy;
* waiting: producers wait for the high watermark to pass their offsets, long-poll fetches
  wait for any high watermark to move.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import trio

from raftlog.partition.log import LogConfig, PartitionLog

log = logging.getLogger(__name__)

RETENTION_CHECK_INTERVAL_S = 30.0
FLUSH_POLL_INTERVAL_S = 0.1


def now_ms() -> int:
    return int(time.time() * 1000)


def _int_or_none(value: str | None) -> int | None:
    if value is None:
        return None
    number = int(value)
    # Kafka's default for flush.messages / flush.ms is Long.MAX_VALUE, meaning "never".
    return None if number >= 2**62 else number


def log_config_for(configs: Mapping[str, str]) -> LogConfig:
    """Topic-level properties (Kafka's names, broker defaults merged in) to a LogConfig."""
    defaults = LogConfig()
    return LogConfig(
        segment_bytes=int(configs.get("segment.bytes", defaults.segment_bytes)),
        segment_ms=int(configs.get("segment.ms", defaults.segment_ms)),
        retention_ms=int(configs.get("retention.ms", defaults.retention_ms)),
        retention_bytes=int(configs.get("retention.bytes", defaults.retention_bytes)),
        index_interval_bytes=int(
            configs.get("index.interval.bytes", defaults.index_interval_bytes)
        ),
        flush_messages=_int_or_none(configs.get("flush.messages")),
        flush_ms=_int_or_none(configs.get("flush.ms")),
        message_timestamp_type=configs.get(
            "message.timestamp.type", defaults.message_timestamp_type
        ),
        max_message_bytes=int(configs.get("max.message.bytes", defaults.max_message_bytes)),
    )


@dataclass(eq=False)
class Partition:
    """One local partition replica: its log plus the trio-side watermark state."""

    topic: str
    index: int
    log: PartitionLog
    leader_epoch: int
    high_watermark: int = 0
    deleted: bool = False
    _hw_moved: trio.Event = field(default_factory=trio.Event)

    @property
    def durable_acks(self) -> bool:
        """True when acknowledgement waits for fsync (Kafka's flush.* left at default)."""
        config = self.log.config
        return config.flush_messages is None and config.flush_ms is None

    @property
    def last_stable_offset(self) -> int:
        # No transactions yet, so every offset below the high watermark is stable.
        return self.high_watermark

    def advance_high_watermark(self, offset: int) -> bool:
        assert offset <= self.log.log_end_offset, (offset, self.log.log_end_offset)
        if offset <= self.high_watermark:
            return False
        self.high_watermark = offset
        self._hw_moved.set()
        self._hw_moved = trio.Event()
        return True

    async def wait_high_watermark(self, offset: int, deadline: float) -> bool:
        """Waits until the high watermark reaches ``offset``; False on timeout or deletion."""
        with trio.move_on_at(deadline):
            while self.high_watermark < offset and not self.deleted:
                await self._hw_moved.wait()
        return self.high_watermark >= offset and not self.deleted


class PartitionManager:
    """Owns every local partition of the node and the tasks that maintain them."""

    def __init__(self, data_dir: Path, node_id: int) -> None:
        self.data_dir = data_dir
        self.node_id = node_id
        self.partitions: dict[tuple[str, int], Partition] = {}
        self._dirty: set[Partition] = set()
        self._flush_wanted = trio.Event()
        self._data_arrived = trio.Event()
        self.flush_rounds = 0  # fsync rounds run so far (group commit makes it << appends)

    def get(self, topic: str, index: int) -> Partition | None:
        return self.partitions.get((topic, index))

    # -- lifecycle driven by the metadata image ----------------------------------------------

    def ensure_partition(
        self, topic: str, index: int, configs: Mapping[str, str], leader_epoch: int
    ) -> Partition:
        existing = self.partitions.get((topic, index))
        if existing is not None:
            existing.leader_epoch = leader_epoch
            return existing
        directory = self.data_dir / f"{topic}-{index}"
        partition_log = PartitionLog.open(directory, log_config_for(configs), now_ms())
        partition = Partition(topic, index, partition_log, leader_epoch)
        # On open everything recovered is already on disk: visible and durable.
        partition.high_watermark = partition_log.log_end_offset
        self.partitions[(topic, index)] = partition
        log.info("partition %s-%d open at offsets [%d, %d)", topic, index,
                 partition_log.log_start_offset, partition_log.log_end_offset)
        return partition

    def remove_partition(self, topic: str, index: int) -> None:
        partition = self.partitions.pop((topic, index), None)
        if partition is None:
            return
        partition.deleted = True
        partition._hw_moved.set()
        self._dirty.discard(partition)
        partition.log.close()
        directory = self.data_dir / f"{topic}-{index}"
        # Rename first so a crash mid-delete never leaves a half-deleted live directory.
        doomed = directory.with_name(f"{directory.name}.{now_ms()}-delete")
        directory.rename(doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        log.info("partition %s-%d deleted", topic, index)

    def update_configs(self, topic: str, configs: Mapping[str, str]) -> None:
        for (name, _), partition in self.partitions.items():
            if name == topic:
                partition.log.config = log_config_for(configs)

    def purge_leftover_deletions(self) -> None:
        for doomed in self.data_dir.glob("*-delete"):
            shutil.rmtree(doomed, ignore_errors=True)

    def close(self) -> None:
        for partition in self.partitions.values():
            partition.log.close()
        self.partitions.clear()

    # -- appends and group commit -----------------------------------------------------------

    def note_append(self, partition: Partition) -> None:
        """Called after every append: schedules the fsync or, if relaxed, exposes at once."""
        if partition.durable_acks or partition.log.needs_flush(now_ms()):
            self._dirty.add(partition)
            self._flush_wanted.set()
        if not partition.durable_acks:
            self._expose(partition, partition.log.log_end_offset)

    def _expose(self, partition: Partition, offset: int) -> None:
        if partition.advance_high_watermark(offset):
            self._data_arrived.set()
            self._data_arrived = trio.Event()

    async def wait_for_data(self, deadline: float) -> None:
        """Waits until any local high watermark moves, or the deadline."""
        with trio.move_on_at(deadline):
            await self._data_arrived.wait()

    async def run_flusher(self) -> None:
        """Group commit: one fsync round covers every append made since the last one."""
        while True:
            with trio.move_on_after(FLUSH_POLL_INTERVAL_S):
                await self._flush_wanted.wait()
            self._flush_wanted = trio.Event()
            self._collect_timed_flushes()
            if self._dirty:
                await self._flush_round()

    def _collect_timed_flushes(self) -> None:
        now = now_ms()
        for partition in self.partitions.values():
            if not partition.durable_acks and partition.log.needs_flush(now):
                self._dirty.add(partition)

    async def _flush_round(self) -> None:
        batch = list(self._dirty)
        self._dirty.clear()
        tickets = [(p, p.log.begin_flush()) for p in batch]
        runnable = [t for _, t in tickets if t is not None]
        await trio.to_thread.run_sync(_run_tickets, runnable)
        self.flush_rounds += 1
        for partition, ticket in tickets:
            if ticket is None or partition.deleted:
                continue
            partition.log.complete_flush(ticket)
            if partition.durable_acks:
                self._expose(partition, partition.log.flushed_offset)

    async def run_retention(self) -> None:
        while True:
            await trio.sleep(RETENTION_CHECK_INTERVAL_S)
            self.enforce_retention()

    def enforce_retention(self) -> int:
        deleted = 0
        for partition in list(self.partitions.values()):
            deleted += partition.log.enforce_retention(now_ms())
        return deleted


def _run_tickets(tickets: Iterable[object]) -> None:
    for ticket in tickets:
        ticket.run()  # type: ignore[attr-defined]
