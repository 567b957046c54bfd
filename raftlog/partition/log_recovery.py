"""Opening a partition's log after a crash: from the files on disk to a consistent log.

``recover_log`` finishes or discards interrupted compaction swaps (``log_swap``), deletes
temp files and orphaned index files, deletes segments below the checkpointed log start,
checks each sealed segment's indexes and tail and scans (header + CRC) the active one,
truncating a torn tail and dropping everything after a damaged sealed segment (the log must
stay a prefix), and loads the leader-epoch cache, trimmed to what survived. Blocking; the
caller (``PartitionLog.open``) then fsyncs everything once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from raftlog.partition.epoch_cache import (
    LEADER_EPOCH_CHECKPOINT,
    LeaderEpochCache,
    entries_from_batches,
)
from raftlog.partition.files import TMP_SUFFIX, fsync_directory
from raftlog.partition.log_config import LogConfig
from raftlog.partition.log_start_checkpoint import read_log_start_checkpoint
from raftlog.partition.log_swap import CLEANED_SUFFIX, SWAP_SUFFIX, finish_swaps
from raftlog.partition.segment import Segment
from raftlog.partition.segment_files import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SEGMENT_SUFFIXES,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    parse_base_offset,
    segment_file_name,
)

__all__ = ["RecoveredLog", "recover_log"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RecoveredLog:
    """What ``recover_log`` found: the segments (never empty; the last is active), the log
    start offset and the leader-epoch cache, all consistent with each other."""

    segments: list[Segment]
    log_start_offset: int
    epoch_cache: LeaderEpochCache


def recover_log(directory: Path, config: LogConfig, now_ms: int) -> RecoveredLog:
    """Open (or create) the log in ``directory`` and recover it after a crash. Blocking:
    scans and CRC-checks the active segment and truncates a torn tail; the segments are not
    yet fsynced."""
    if not directory.is_dir():
        directory.mkdir(parents=True)
        fsync_directory(directory.parent)  # the new directory's name must survive a crash
    finish_swaps(directory, config.index_interval_bytes)
    _remove_leftovers(directory)
    checkpoint = read_log_start_checkpoint(directory)
    segments = _load_segments(directory, config, now_ms, checkpoint)
    restarted = bool(segments) and checkpoint is not None \
        and checkpoint > segments[-1].next_offset
    if restarted:
        assert checkpoint is not None
        segments = _restart_at_checkpoint(directory, segments, checkpoint, config)
    if not segments:
        first_offset = 0 if checkpoint is None else checkpoint
        segments = [Segment.create(directory, first_offset, config.index_interval_bytes)]
    log_start_offset = _start_offset(checkpoint, segments)
    epoch_cache = _load_epoch_cache(directory, segments, log_start_offset)
    if restarted:  # no batch is left: no epoch describes any offset (Kafka clears it)
        epoch_cache.clear()
    return RecoveredLog(segments, log_start_offset, epoch_cache)


def _load_epoch_cache(directory: Path, segments: list[Segment], log_start_offset: int
                      ) -> LeaderEpochCache:
    """The leader-epoch checkpoint, trimmed to the recovered log; rebuilt from the batch
    headers when it is missing or unreadable (e.g. a log written before epochs were
    cached). A crash can leave the checkpoint ahead of the log (it is written before the
    append it describes), never behind."""
    path = directory / LEADER_EPOCH_CHECKPOINT
    cache = LeaderEpochCache.load(path)
    if cache is None:
        cache = LeaderEpochCache(path)
        entries = entries_from_batches(_batch_epochs(segments, log_start_offset))
        if entries:  # no file means no entries: a new log writes it on its first epoch
            cache.replace(entries)
            logger.info("%s: leader-epoch cache rebuilt from the log: %s",
                        directory, entries)
    cache.truncate_from_end(segments[-1].next_offset)
    cache.truncate_from_start(log_start_offset)
    return cache


def _batch_epochs(segments: list[Segment], log_start_offset: int) -> list[tuple[int, int]]:
    """(partitionLeaderEpoch, base offset) of every batch, reading headers only."""
    return [
        (header.partition_leader_epoch, header.base_offset)
        for segment in segments
        for _, header in segment.iter_headers(0)
        if header.next_offset > log_start_offset
    ]


def _remove_leftovers(directory: Path) -> None:
    """Delete temp files of interrupted writes, uncommitted compaction files and index files
    whose .log is gone."""
    for path in directory.iterdir():
        if path.name.endswith((TMP_SUFFIX, CLEANED_SUFFIX, SWAP_SUFFIX)):
            path.unlink()
            continue
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
            base_offset = parse_base_offset(path, suffix)
            if base_offset is not None and not path.with_suffix(LOG_SUFFIX).exists():
                path.unlink()


def _load_segments(directory: Path, config: LogConfig, now_ms: int,
                   checkpoint: int | None) -> list[Segment]:
    """Open every segment; sealed ones are tail-checked, the last one is recovered.

    First, segments wholly below the checkpointed log start (``checkpoint``: the next
    segment's base offset is at or below it) are deleted: a crash or a failed unlink while
    the start moved left them, and they need not be contiguous with what follows (a
    DeleteRecords that deleted a later one but not an older one, before this was fixed).
    A sealed segment that fails its checks is then recovered by scanning. If that drops
    bytes or leaves a gap, everything after it is deleted: later data was never
    acknowledged as flushed (a flush syncs every earlier segment too), and the log must
    stay a prefix.
    """
    base_offsets = sorted(
        offset
        for path in directory.glob("*" + LOG_SUFFIX)
        if (offset := parse_base_offset(path, LOG_SUFFIX)) is not None
    )
    base_offsets = _delete_below_start(directory, base_offsets, checkpoint)
    interval = config.index_interval_bytes
    segments = [Segment.open_existing(directory, base, interval) for base in base_offsets]
    for slot, segment in enumerate(segments[:-1]):
        next_base_offset = segments[slot + 1].base_offset
        if segment.load_sealed(next_base_offset):
            continue
        logger.warning("%s: index or tail check failed; recovering", segment.log_path)
        dropped_bytes = segment.recover(now_ms)
        if dropped_bytes == 0 and segment.next_offset == next_base_offset:
            segment.seal()  # rewrite the index files that failed the checks
            continue
        for later in segments[slot + 1 :]:
            logger.warning("%s: deleting segment after a recovered tail", later.log_path)
            later.delete()
        return segments[: slot + 1]
    if segments:
        segments[-1].recover(now_ms)
    return segments


def _delete_below_start(directory: Path, base_offsets: list[int], checkpoint: int | None
                        ) -> list[int]:
    """Unlink the segments (all their files) whose successor starts at or below the
    checkpointed log start; returns the base offsets that remain."""
    if checkpoint is None:
        return base_offsets
    keep_from = 0
    while keep_from + 1 < len(base_offsets) and base_offsets[keep_from + 1] <= checkpoint:
        keep_from += 1
    for base in base_offsets[:keep_from]:
        logger.info("%s: deleting segment %d below the log start offset %d", directory, base,
                    checkpoint)
        for suffix in SEGMENT_SUFFIXES:
            (directory / segment_file_name(base, suffix)).unlink(missing_ok=True)
    if keep_from:
        fsync_directory(directory)
    return base_offsets[keep_from:]


def _restart_at_checkpoint(directory: Path, segments: list[Segment], checkpoint: int,
                           config: LogConfig) -> list[Segment]:
    """The checkpointed log start is above the recovered log end (relaxed flushing lost an
    acknowledged-but-unflushed tail that DeleteRecords had already moved the start into, or
    recovery cut a sealed segment): delete every segment and start the log empty at the
    checkpoint (Kafka's LogLoader does the same). Lowering the start instead would hand out
    offsets below the checkpoint again, which the next open would hide or delete, and the
    start must never move back. A crash in between leaves fewer segments and the same
    checkpoint, so the next open does this again."""
    logger.warning("%s: deleting all segments because the log end offset %d is below the "
                   "checkpointed log start offset %d; the log restarts empty there",
                   directory, segments[-1].next_offset, checkpoint)
    for segment in segments:
        segment.delete()
    fresh = Segment.create(directory, checkpoint, config.index_interval_bytes)
    fsync_directory(directory)
    return [fresh]


def _start_offset(checkpoint: int | None, segments: list[Segment]) -> int:
    first_offset = segments[0].base_offset
    start_offset = first_offset if checkpoint is None else max(checkpoint, first_offset)
    # _restart_at_checkpoint: a checkpoint above the recovered end is never lowered.
    assert start_offset <= segments[-1].next_offset, (start_offset, segments[-1].next_offset)
    return start_offset
