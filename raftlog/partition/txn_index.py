"""Transaction bookkeeping of one partition replica: open transactions (for the last stable
offset) and the aborted-transaction index (for read_committed fetches). Pure, no trio.

Kafka keeps, per partition, the first offset of every producer's open transaction
(``ProducerStateManager.ongoingTxns``) and, per segment, a ``.txnindex`` of aborted
transactions ``(producerId, firstOffset, lastOffset)`` where ``lastOffset`` is the ABORT
marker's offset. The last stable offset (LSO) is ``min(HW, first offset of the oldest open
transaction)``; a read_committed Fetch stops at the LSO and returns the aborted transactions
that overlap the fetched range, so the consumer drops their batches.

Here every batch written to the log (a leader's client append, a follower's replicated
append, a marker written by the leader) is fed to ``observe`` by the log's append listener,
so leaders and followers keep the same index, and a follower that becomes leader already
knows the open transactions. The aborted entries are bucketed by the base offset of the
segment holding the marker (Kafka's per-segment index) and kept in memory; each ABORT marker
also appends an entry to its segment's ``.txnindex`` file (``txn_index_file``), fsynced by
the next flush before the segment's data.

On open (``open_txn_index``) the aborted entries come from those files and the open
transactions from the producer state (snapshot + replay), so no log scan is needed. Only
the active segment is checked against the log (it may have lost a tail in a crash): every
ABORT marker in it must have its entry, entries past the log end are dropped. A missing or
insane file, or a marker without its entry, falls back to the full scan
(``rebuild_txn_index``), which rewrites every file. A truncation also rebuilds by the full
scan (its files were cut by ``Segment.truncate_to``). Buckets of deleted segments are
dropped; compaction merges the buckets of the segments it merged.
"""

from __future__ import annotations

import logging
import os
import struct
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raftlog.partition.batch import (
    CONTROL_BIT,
    RECORD_BATCH_OVERHEAD,
    TRANSACTIONAL_BIT,
    BatchHeader,
    Record,
    build_batch,
    decode_records,
    parse_header,
)
from raftlog.partition.txn_index_file import TxnIndexEntry, decode_entries, encode_entries

if TYPE_CHECKING:
    from raftlog.partition.log import PartitionLog
    from raftlog.partition.segment import Segment

__all__ = [
    "ABORT",
    "COMMIT",
    "AbortedTxn",
    "TxnIndex",
    "build_marker",
    "marker_coordinator_epoch",
    "marker_type",
    "open_txn_index",
    "rebuild_txn_index",
]

logger = logging.getLogger(__name__)

ABORT = 0
COMMIT = 1
_CONTROL_KEY = struct.Struct(">hh")  # version, type
_MARKER_VALUE = struct.Struct(">hi")  # version, coordinatorEpoch


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset


def build_marker(producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                 timestamp_ms: int) -> bytes:
    """A COMMIT or ABORT control batch (Kafka's ``MemoryRecords.withEndTransactionMarker``):
    transactional + control attributes, baseSequence -1, one record whose key is
    ``(version 0, type)`` and value ``(version 0, coordinatorEpoch)``."""
    key = _CONTROL_KEY.pack(0, COMMIT if commit else ABORT)
    value = _MARKER_VALUE.pack(0, coordinator_epoch)
    return build_batch([(key, value, ())], timestamp_ms=timestamp_ms, producer_id=producer_id,
                       producer_epoch=producer_epoch, base_sequence=-1,
                       attributes=TRANSACTIONAL_BIT | CONTROL_BIT)


def _control_record(batch: bytes | bytearray | memoryview) -> Record | None:
    """The one record of a control batch, or None if it cannot be read."""
    try:
        records = decode_records(batch, include_control=True)
    except Exception:  # a batch the log already checked: unreadable means "unknown"
        return None
    return records[0] if len(records) == 1 else None


def marker_coordinator_epoch(batch: bytes | bytearray | memoryview) -> int:
    """The coordinator epoch in one control batch's marker record (its value is
    ``(version, coordinatorEpoch)``), or -1 if the record cannot be read."""
    record = _control_record(batch)
    if record is None or record.value is None or len(record.value) < _MARKER_VALUE.size:
        return -1
    _, epoch = _MARKER_VALUE.unpack_from(record.value)
    return int(epoch)


def marker_type(batch: bytes | bytearray | memoryview) -> int | None:
    """COMMIT, ABORT or another control type (KRaft's) of one control batch; None if its key
    cannot be read."""
    record = _control_record(batch)
    if record is None or record.key is None or len(record.key) < _CONTROL_KEY.size:
        return None
    _, kind = _CONTROL_KEY.unpack_from(record.key)
    return int(kind)


@dataclass
class TxnIndex:
    """Open transactions and aborted transactions of one partition replica."""

    # producer id -> first offset of its open transaction in this partition
    ongoing: dict[int, int] = field(default_factory=dict)
    # segment base offset -> aborted transactions whose marker is in that segment, in order
    _aborted: dict[int, list[AbortedTxn]] = field(default_factory=dict)
    _segment_bases: list[int] = field(default_factory=list)
    # Where ABORT entries are persisted (the log's .txnindex files), once attached.
    _log: PartitionLog | None = None
    # During a full rebuild: segment base -> every entry, to rewrite the files.
    _collected: dict[int, list[TxnIndexEntry]] | None = None

    def attach(self, log: PartitionLog) -> None:
        """Persist every later ABORT entry to ``log``'s ``.txnindex`` files."""
        self._log = log

    # -- feeding ---------------------------------------------------------------------------

    def observe(self, buf: bytes | bytearray | memoryview, headers: Sequence[BatchHeader],
                segment_base: int) -> None:
        """Fold in batches just written (``headers`` are the stored headers of ``buf``'s
        batches, in order) into the segment starting at ``segment_base``."""
        position = 0
        for header in headers:
            size = header.size_bytes
            if header.is_transactional and header.producer_id >= 0:
                if header.is_control:
                    kind = marker_type(memoryview(buf)[position:position + size])
                    self.end_transaction(header.producer_id, header.base_offset, kind,
                                         segment_base)
                else:
                    self.ongoing.setdefault(header.producer_id, header.base_offset)
            position += size

    def end_transaction(self, producer_id: int, marker_offset: int, kind: int | None,
                        segment_base: int) -> None:
        first = self.ongoing.pop(producer_id, None)
        if kind != ABORT:
            return
        if first is not None:
            self._add(segment_base, AbortedTxn(producer_id, first, marker_offset))
        # The file gets an entry for every ABORT marker (see txn_index_file).
        stable = min(self.ongoing.values(), default=marker_offset + 1)
        entry = TxnIndexEntry(producer_id, marker_offset if first is None else first,
                              marker_offset, min(stable, marker_offset + 1))
        if self._collected is not None:
            self._collected.setdefault(segment_base, []).append(entry)
        if self._log is not None:
            self._log.append_txn_index(segment_base, encode_entries([entry]))

    def _add(self, segment_base: int, txn: AbortedTxn) -> None:
        if not self._segment_bases or self._segment_bases[-1] < segment_base:
            self._segment_bases.append(segment_base)
        self._aborted.setdefault(segment_base, []).append(txn)

    def clear(self) -> None:
        self.ongoing.clear()
        self._aborted.clear()
        self._segment_bases.clear()

    # -- reading ---------------------------------------------------------------------------

    @property
    def first_unstable_offset(self) -> int | None:
        """First offset of the oldest open transaction, or None."""
        return min(self.ongoing.values()) if self.ongoing else None

    def last_stable_offset(self, high_watermark: int) -> int:
        first = self.first_unstable_offset
        return high_watermark if first is None else min(first, high_watermark)

    def aborted_between(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping ``[start, end)`` (Kafka's
        ``collectAbortedTransactions``): marker at or after ``start``, first offset below
        ``end``; ordered by first offset."""
        found: list[AbortedTxn] = []
        # Markers at or after `start` live in the segment containing `start` or later ones.
        first_bucket = max(bisect_right(self._segment_bases, start) - 1, 0)
        for base in self._segment_bases[first_bucket:]:
            for txn in self._aborted.get(base, ()):
                if txn.last_offset >= start and txn.first_offset < end:
                    found.append(txn)
        found.sort(key=lambda txn: txn.first_offset)
        return found

    def all_aborted(self) -> Iterable[AbortedTxn]:
        for base in self._segment_bases:
            yield from self._aborted.get(base, ())

    # -- retention -------------------------------------------------------------------------

    def drop_segments_below(self, live_bases: Sequence[int]) -> None:
        """Forget the buckets of segments that no longer exist (retention deleted them)."""
        oldest = live_bases[0] if live_bases else None
        if oldest is None:
            return
        while self._segment_bases and self._segment_bases[0] < oldest:
            self._aborted.pop(self._segment_bases.pop(0), None)

    def merge_segments(self, bases: Sequence[int]) -> None:
        """Compaction replaced the segments at ``bases`` by one at ``bases[0]``: one bucket."""
        merged: list[AbortedTxn] = []
        for base in bases:
            merged.extend(self._aborted.pop(base, ()))
        self._segment_bases = [b for b in self._segment_bases if b not in bases[1:]]
        if merged:
            self._aborted[bases[0]] = merged
            if bases[0] not in self._segment_bases:
                self._segment_bases.append(bases[0])
                self._segment_bases.sort()
        elif bases[0] in self._segment_bases:
            self._segment_bases.remove(bases[0])


def rebuild_txn_index(log: PartitionLog, chunk_bytes: int = 1 << 20, *,
                      rewrite_files: bool = False) -> TxnIndex:
    """Scan the whole log (headers; the records of control batches only) into a TxnIndex,
    attached to ``log``. ``rewrite_files``: also replace every segment's ``.txnindex`` with
    the entries found (blocking: one fsync per segment)."""
    index = TxnIndex()
    index._collected = {} if rewrite_files else None
    bases = log.segment_base_offsets
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        with log.read(offset, chunk_bytes) as piece:
            data = piece.read_bytes()
        if not data:
            raise ValueError(f"empty read at offset {offset} below the log end")
        position = 0
        while position + RECORD_BATCH_OVERHEAD <= len(data):
            header = parse_header(data, position)
            if position + header.size_bytes > len(data):
                break
            segment_base = bases[max(bisect_right(bases, header.base_offset) - 1, 0)]
            index.observe(memoryview(data)[position:position + header.size_bytes], [header],
                          segment_base)
            position += header.size_bytes
            offset = header.next_offset
    if index._collected is not None:
        for segment in log.segments:
            segment.write_txn_index(encode_entries(index._collected.get(segment.base_offset,
                                                                         ())))
        index._collected = None
    index.attach(log)
    return index


def open_txn_index(log: PartitionLog, ongoing: Mapping[int, int]) -> TxnIndex:
    """The index of a log just opened: aborted entries from the ``.txnindex`` files, open
    transactions (producer id -> first offset) from the producer state. Falls back to the
    full scan when a file is missing or insane or the active segment's file misses an ABORT
    marker (a crash between writing the marker and fsyncing the file); see the module
    docstring. Blocking."""
    loaded = _load_entries(log)
    if loaded is None:
        logger.info("%s: rebuilding the aborted-transaction index from the log", log.directory)
        return rebuild_txn_index(log, rewrite_files=True)
    index = TxnIndex(ongoing=dict(ongoing))
    for segment_base, entries in loaded:
        for entry in entries:
            if entry.first_offset < entry.last_offset and \
                    entry.last_offset >= log.log_start_offset:
                index._add(segment_base, AbortedTxn(entry.producer_id, entry.first_offset,
                                                    entry.last_offset))
    index.attach(log)
    return index


def _load_entries(log: PartitionLog) -> list[tuple[int, list[TxnIndexEntry]]] | None:
    segments = log.segments
    loaded: list[tuple[int, list[TxnIndexEntry]]] = []
    for slot, segment in enumerate(segments):
        data = segment.read_txn_index()
        if data is None:
            return None
        active = slot == len(segments) - 1
        end = log.log_end_offset if active else segments[slot + 1].base_offset
        # The active segment's file may run past a tail that recovery cut off.
        entries = decode_entries(data, base_offset=segment.base_offset,
                                 end_offset=(1 << 63) - 1 if active else end)
        if entries is None:
            logger.warning("%s fails its sanity check", segment.txn_index_path)
            return None
        if active:
            kept = [e for e in entries if e.last_offset < end]
            if len(kept) != len(entries):
                segment.write_txn_index(encode_entries(kept))
            start = log.log_start_offset
            if {e.last_offset for e in kept if e.last_offset >= start} != \
                    _abort_marker_offsets(segment, start):
                logger.warning("%s misses ABORT markers of its segment",
                               segment.txn_index_path)
                return None
            entries = kept
        loaded.append((segment.base_offset, entries))
    return loaded


def _abort_marker_offsets(segment: Segment, start_offset: int) -> set[int]:
    """Offsets (from ``start_offset``) of the ABORT markers in one segment (a header scan;
    only markers are read)."""
    found: set[int] = set()
    fd = segment.dup_fd()
    try:
        for position, header in segment.iter_headers(0):
            if header.is_control and header.is_transactional and header.producer_id >= 0 \
                    and header.base_offset >= start_offset:
                batch = os.pread(fd, header.size_bytes, position)
                if marker_type(batch) == ABORT:
                    found.add(header.base_offset)
    finally:
        os.close(fd)
    return found
