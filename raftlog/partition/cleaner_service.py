"""The log cleaner task: compacts the node's ``cleanup.policy=compact`` partitions.

A trio task in the node's nursery. Every ``log.cleaner.backoff.ms`` it visits each local
compacted partition (leader or follower: replicas clean independently, as in Kafka) and,
when ``cleaner.plan_pass`` finds it dirty enough, runs one bounded pass: the offset map and
each cleaned segment are built in a worker thread from private fds of the (immutable) sealed
segments, then each cleaned segment is swapped in on the trio thread
(``PartitionLog.replace_segments``), so the swap never races an append, a truncation or
retention. A pass that finds the log changed under it (the partition deleted, truncated, or
its segments deleted by retention) drops its work; the next pass starts over.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from raftlog.metrics.recorders import Counter
from raftlog.partition.cleaner import (
    AbortedRanges,
    CleanSource,
    SegmentInfo,
    build_segment_offset_map,
    last_batches_of_producers,
    plan_pass,
    read_cleaner_checkpoint,
    write_cleaned_segment,
    write_cleaner_checkpoint,
)
from raftlog.partition.errors import PartitionLogError
from raftlog.partition.log_health import describe_os_error

if TYPE_CHECKING:
    from raftlog.partition.manager import PartitionManager
    from raftlog.partition.partition import Partition

__all__ = ["CleanerSettings", "LogCleaner"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CleanerSettings:
    """Broker-level cleaner settings, Kafka's names."""

    enable: bool = True  # log.cleaner.enable
    backoff_ms: int = 15_000  # log.cleaner.backoff.ms: the sleep between visits
    dedupe_buffer_bytes: int = 128 << 20  # log.cleaner.dedupe.buffer.size: offset map bound


@dataclass(frozen=True, slots=True)
class PassResult:
    segments_before: int
    segments_after: int
    bytes_before: int
    bytes_after: int


class LogCleaner:
    """Owns the cleaning of every compacted partition of one ``PartitionManager``."""

    def __init__(self, manager: PartitionManager, settings: CleanerSettings) -> None:
        self.manager = manager
        self.settings = settings
        self.passes = Counter()  # passes that completed, having swapped every segment
        self.bytes_cleaned = Counter()  # bytes of the segments swapped out for cleaned ones

    async def run(self) -> None:
        if not self.settings.enable:
            return
        while True:
            await trio.sleep(self.settings.backoff_ms / 1000)
            await self.clean_all()

    async def clean_all(self) -> int:
        """One visit of every compacted partition; returns how many passes changed a log."""
        changed = 0
        for partition in list(self.manager.partitions.values()):
            if partition.deleted or not partition.log.config.compacts or \
                    partition.log.offline_reason is not None:
                continue
            try:
                result = await self.clean_partition(partition)
            except (OSError, PartitionLogError) as error:  # retried at the next visit
                detail = describe_os_error(error) if isinstance(error, OSError) else error
                logger.warning("partition %s-%d: cleaning failed: %s", partition.topic,
                               partition.index, detail)
                continue
            except Exception:  # a cleaner bug must not take the node down
                logger.exception("partition %s-%d: cleaning failed", partition.topic,
                                 partition.index)
                continue
            if result is not None:
                changed += 1
        return changed

    async def clean_partition(self, partition: Partition) -> PassResult | None:
        """One pass over one partition; None when it was not dirty enough or changed
        under the pass."""
        log = partition.log
        config = log.config
        segments = log.segments
        now_ms = int(time.time() * 1000)
        plan = plan_pass(
            [SegmentInfo(s.base_offset, s.next_offset, s.size_bytes, s.largest_timestamp_ms())
             for s in segments],
            first_dirty_offset=read_cleaner_checkpoint(log.directory),
            uncleanable_offset=min(partition.last_stable_offset, segments[-1].base_offset),
            now_ms=now_ms, min_cleanable_dirty_ratio=config.min_cleanable_dirty_ratio,
            min_compaction_lag_ms=config.min_compaction_lag_ms)
        if plan is None:
            return None
        generation = log.generation
        aborted = AbortedRanges((t.producer_id, t.first_offset, t.last_offset)
                                for t in partition.txns.all_aborted())
        sources: list[CleanSource] = []
        try:
            for segment in segments[:plan.cleanable_count]:
                txn_index = segment.read_txn_index()
                if txn_index is None:  # rebuilt on the next open; clean after that
                    logger.info("partition %s-%d: %s missing; not cleaning until a restart "
                                "rebuilds it", partition.topic, partition.index,
                                segment.txn_index_path)
                    return None
                sources.append(CleanSource(segment, segment.dup_fd(), segment.size_bytes,
                                           txn_index))
            return await self._run_pass(partition, plan.first_dirty_slot, sources, aborted,
                                        generation, now_ms)
        finally:
            for source in sources:
                source.close()

    async def _run_pass(self, partition: Partition, first_dirty_slot: int,
                        sources: list[CleanSource], aborted: AbortedRanges, generation: int,
                        now_ms: int) -> PassResult | None:
        log = partition.log
        config = log.config
        offset_map, covered = await trio.to_thread.run_sync(
            build_segment_offset_map, sources[first_dirty_slot:], aborted,
            self.settings.dedupe_buffer_bytes)
        mapped = sources[:first_dirty_slot + covered]
        first_dirty_offset = mapped[-1].segment.next_offset
        bytes_before = sum(source.size_bytes for source in mapped)
        producers_last = await trio.to_thread.run_sync(last_batches_of_producers, mapped)
        bytes_after = 0
        segments_after = 0
        remaining = mapped
        while remaining:
            if partition.deleted or log.generation != generation:
                return None
            used, cleaned = await trio.to_thread.run_sync(functools.partial(
                write_cleaned_segment, log.directory, remaining, offset_map, aborted=aborted,
                producers_last=producers_last, now_ms=now_ms,
                delete_retention_ms=config.delete_retention_ms,
                segment_bytes=config.segment_bytes,
                index_interval_bytes=config.index_interval_bytes))
            group, remaining = remaining[:used], remaining[used:]
            if partition.deleted or log.generation != generation:
                with contextlib.suppress(OSError):
                    cleaned.delete()
                return None
            if not log.replace_segments([source.segment for source in group], cleaned):
                return None
            partition.txns.merge_segments([source.segment.base_offset for source in group])
            self.bytes_cleaned.inc(sum(source.size_bytes for source in group))
            bytes_after += cleaned.size_bytes
            segments_after += 1
        write_cleaner_checkpoint(log.directory, first_dirty_offset)
        self.passes.inc()
        logger.info("partition %s-%d: cleaned %d segments (%d bytes) into %d (%d bytes), "
                    "first dirty offset now %d", partition.topic, partition.index,
                    len(mapped), bytes_before, segments_after, bytes_after, first_dirty_offset)
        return PassResult(len(mapped), segments_after, bytes_before, bytes_after)
