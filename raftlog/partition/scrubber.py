"""The background scrub: CRC-checks the segment bytes no read has checked yet, at
``log.scrub.bytes.per.second`` (0 = off).

Segments loaded from disk start unverified (``log_verify``), so after every start (clean or
not: a crash is when sealed segments are most likely damaged, and bits rot at rest anyway) the
scrubber walks every partition's segments, oldest first, one chunk at a time and partitions in
turn. The preads and CRCs run in a worker thread on a dup'd fd; the result is applied on the
event loop only if the segment is still part of its log unchanged (no truncation, swap or
deletion meanwhile). A bad batch is reported like one a read finds (``LogVerifier.found``):
logged, counted, and the replica manager gets the good copy from another replica.
Once everything is verified it idles; bytes appended later were checked on the way in.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import trio

from raftlog.partition.log_verify import BadBatch, check_region
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import Partition
from raftlog.partition.segment import Segment
from raftlog.partition.verified_ranges import ScrubPacer

__all__ = ["LogScrubber", "ScrubChunk"]

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
IDLE_S = 1.0


@dataclass(frozen=True, slots=True)
class ScrubChunk:
    """One piece of work: [start, end) of ``segment`` (a gap), as of log ``generation``."""

    partition: Partition
    segment: Segment
    start: int
    end: int
    first_offset: int
    generation: int


class LogScrubber:
    """Checks every partition's unverified segment bytes in the background (see module)."""

    def __init__(self, manager: PartitionManager, bytes_per_second: int, *,
                 chunk_bytes: int = CHUNK_BYTES, idle_s: float = IDLE_S) -> None:
        self.manager = manager
        self.bytes_per_second = bytes_per_second
        self.chunk_bytes = chunk_bytes
        self.idle_s = idle_s
        self._cursor = 0
        self._ordered: list[Partition] = []
        self._ordered_version = -1
        self._announced = False
        # Set whenever a pass finds nothing left to check (for tests and operators).
        self.caught_up = trio.Event()

    async def run(self) -> None:
        """Until cancelled; returns at once when the scrub is off."""
        if self.bytes_per_second <= 0:
            logger.info("log scrub is off (log.scrub.bytes.per.second=0)")
            return
        pacer = ScrubPacer(self.bytes_per_second)
        while True:
            chunk = self.next_chunk()
            if chunk is None:
                self.caught_up.set()
                if self._announced:
                    logger.info("log scrub: every segment's CRCs checked")
                    self._announced = False
                await trio.sleep(self.idle_s)
                continue
            if self.caught_up.is_set():
                self.caught_up = trio.Event()
            if not self._announced:
                logger.info("log scrub: checking segments loaded from disk at %d bytes/s",
                            self.bytes_per_second)
                self._announced = True
            checked = await self.check(chunk)
            await trio.sleep(pacer.delay_after(checked, trio.current_time()))

    def next_chunk(self) -> ScrubChunk | None:
        """The next unverified range, partitions in turn (round-robin), segments oldest
        first; None when everything is verified."""
        partitions = self._partitions_in_order()
        for step in range(len(partitions)):
            slot = (self._cursor + step) % len(partitions)
            partition = partitions[slot]
            if partition.deleted or partition.log.offline_reason is not None:
                continue
            for segment in partition.log.segments:
                gap = segment.verified.first_gap(segment.size_bytes)
                if gap is not None:
                    self._cursor = slot
                    start, end = gap
                    return ScrubChunk(partition, segment, start, end,
                                      segment.offset_at_or_before(start),
                                      partition.log.generation)
        return None

    def _partitions_in_order(self) -> list[Partition]:
        # Sorted again only when partitions opened or went: once per chunk, a restart of
        # 10,000 partitions (each with a segment to check) sorted 10,000 partitions 10,000
        # times.
        version = self.manager.membership_version
        if self._ordered_version != version:
            self._ordered = [p for _, p in sorted(self.manager.partitions.items())]
            self._ordered_version = version
        return self._ordered

    async def check(self, chunk: ScrubChunk) -> int:
        """Check ``chunk`` (up to ``chunk_bytes``) in a worker thread and record the outcome;
        the bytes read."""
        try:
            fd = chunk.segment.dup_fd()
        except OSError as error:  # closed (deleted) meanwhile, or out of fds
            logger.debug("log scrub: cannot read %s: %s", chunk.segment.log_path, error)
            self._cursor += 1
            return 0
        try:
            good_end, bad = await trio.to_thread.run_sync(
                check_region, fd, chunk.start, chunk.end, chunk.first_offset, self.chunk_bytes)
        except OSError as error:  # EIO: the read path reports it when a client reads there
            logger.warning("log scrub: cannot read %s at %d: %s", chunk.segment.log_path,
                           chunk.start, error)
            self._cursor += 1
            return 0
        finally:
            os.close(fd)
        self.record(chunk, good_end, bad)
        return good_end - chunk.start + (0 if bad is None else 1)

    def record(self, chunk: ScrubChunk, good_end: int, bad: BadBatch | None) -> None:
        """Apply a check's outcome if the segment is still what was checked."""
        partition = chunk.partition
        log = partition.log
        current = (self.manager.partitions.get((partition.topic, partition.index)) is partition
                   and log.generation == chunk.generation
                   and any(segment is chunk.segment for segment in log.segments)
                   and good_end <= chunk.segment.size_bytes)
        if not current:
            return
        self.manager.stats.scrubbed_bytes.inc(good_end - chunk.start)
        chunk.segment.verified.add(chunk.start, good_end)
        if bad is not None:
            log.verifier.found(chunk.segment, bad)  # marks it: the scrub skips it from now on
            self._cursor += 1
