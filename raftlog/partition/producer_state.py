"""Idempotent-producer state of one partition: pure, synchronous, no I/O.

For every producer id that wrote to the partition we keep its epoch and the metadata of its
last five batches (first/last sequence, first/last offset, timestamp). The leader uses it to
deduplicate retries and to reject gaps and zombie epochs; followers and log recovery fold the
same updates over the replicated batches, so a new leader already knows every producer.

The rules follow Apache Kafka 3.x (``storage/.../log/ProducerAppendInfo.java``,
``ProducerStateEntry.java`` and ``UnifiedLog.analyzeAndValidateProducerState``), checked in
this order for a client batch with ``producerId >= 0``:

1. ``baseSequence < 0`` → INVALID_RECORD (87) (``LogValidator``: an idempotent batch needs a
   sequence). raftlog also refuses ``producerEpoch < 0`` with a producer id the same way; Kafka
   lets it through, but no client sends it and it would create an entry with "no epoch".
2. Duplicate: same epoch as the entry and the exact ``(firstSeq, lastSeq)`` of one of the
   retained batches → the cached offsets are returned, nothing is written
   (``ProducerStateEntry.findDuplicateBatch``; checked before anything else, against the
   committed state only).
3. ``epoch < current`` → INVALID_PRODUCER_EPOCH (47) (``checkProducerEpoch``; since Kafka 2.7
   the produce path uses 47 rather than PRODUCER_FENCED, KIP-588).
4. Sequence (``checkSequence``):
   * producer unknown (never seen, or expired): any sequence is accepted. Kafka stopped
     returning UNKNOWN_PRODUCER_ID (59) from the broker with KIP-360 (2.5): "If there is no
     current producer epoch (possibly because all producer records have been deleted due to
     retention or the DeleteRecords API) accept writes with any sequence number".
   * ``epoch > current``: the batch must start at sequence 0, else OUT_OF_ORDER_SEQUENCE_NUMBER
     (45).
   * same epoch: ``firstSeq`` must be ``lastSeq + 1``, wrapping from INT32_MAX to 0
     (``inSequence``); with no retained batch (the epoch was bumped by a marker) that means 0.
     Anything else, including an old batch that fell out of the 5-batch window → 45.
5. A non-transactional batch while the producer has an open transaction →
   INVALID_TXN_STATE (48) (``appendDataBatch``).

Transaction markers (``appendEndTxnMarker``) end the producer's open transaction and record
the coordinator epoch their record carries. The leader refuses a marker whose coordinator
epoch is below the recorded one (``check_marker``, Kafka's ``checkCoordinatorEpoch``): it
comes from a transaction coordinator that has since been replaced, e.g. one that was
paused and has not yet learnt it lost ``__transaction_state``. Without that check such a
late COMMIT for an earlier transaction ends the producer's *next* transaction in the
partition, and read_committed consumers see its records before it commits. Followers and
recovery take the epoch as stored, as Kafka does.

Batches without a producer id (``producerId == -1``, Kafka's ``hasProducerId`` is ``> -1``)
are always accepted.

Deliberate difference: Kafka expires a producer by its last batch's *client* timestamp
(``maxTimestamp``); raftlog uses the broker's clock at append/apply time (``now_ms``), so a
producer with a skewed clock is not expired early. Rebuilding from the log stamps every
replayed producer with the rebuild time, which can only keep state longer, never shorter.
A snapshot keeps all five batches of each producer (Kafka's keeps only the last one).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Final

import crc32c

from raftlog.partition.batch import RECORD_BATCH_OVERHEAD, BatchHeader, parse_header
from raftlog.partition.txn_index import marker_coordinator_epoch
from raftlog.protocol.errors import ErrorCode

__all__ = [
    "BATCHES_TO_RETAIN",
    "INT32_MAX",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS_DEFAULT",
    "PRODUCER_ID_EXPIRATION_MS_DEFAULT",
    "AppendCheck",
    "BatchMetadata",
    "CorruptSnapshotError",
    "MarkerHeader",
    "ProducerStateEntry",
    "ProducerStateManager",
    "batch_offsets",
    "header_at",
    "headers_in",
    "last_sequence",
]

NO_PRODUCER_ID: Final = -1
NO_PRODUCER_EPOCH: Final = -1
NO_SEQUENCE: Final = -1
NO_OFFSET: Final = -1
INT32_MAX: Final = 2**31 - 1
INT16_MAX: Final = 2**15 - 1
# ProducerStateEntry.NUM_BATCHES_TO_RETAIN: why clients allow at most 5 in-flight requests.
BATCHES_TO_RETAIN: Final = 5
# producer.id.expiration.ms (KIP-854, Kafka 3.4; before that transactional.id.expiration.ms).
PRODUCER_ID_EXPIRATION_MS_DEFAULT: Final = 86_400_000
PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS_DEFAULT: Final = 600_000

# --- snapshot format -------------------------------------------------------------------------
# version u8 | crc32c u32 over everything after it | body
# body: end_offset i64 | entry count i32 | entries sorted by producer id
# entry: producer_id i64 | epoch i16 | last_update_ms i64 | last_offset i64
#        | current_txn_first_offset i64 | coordinator_epoch i32 | batch count u8 | batches
# batch: first_seq i32 | last_seq i32 | first_offset i64 | last_offset i64 | timestamp_ms i64
SNAPSHOT_VERSION: Final = 1
_PREFIX = struct.Struct(">BI")
_BODY_HEADER = struct.Struct(">qi")
_ENTRY = struct.Struct(">qhqqqiB")
_BATCH = struct.Struct(">iiqqq")


class CorruptSnapshotError(Exception):
    """A producer-state snapshot failed its version, CRC or structure checks."""


def last_sequence(base_sequence: int, last_offset_delta: int) -> int:
    """The sequence of a batch's last record: Kafka's ``DefaultRecordBatch.incrementSequence``,
    which wraps from INT32_MAX to 0. ``NO_SEQUENCE`` stays ``NO_SEQUENCE``."""
    if base_sequence < 0:
        return NO_SEQUENCE
    return (base_sequence + last_offset_delta) % (INT32_MAX + 1)


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    """``ProducerAppendInfo.inSequence``: ``last + 1``, or 0 after INT32_MAX."""
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


def batch_offsets(headers: Sequence[BatchHeader], base_offset: int) -> list[tuple[int, int]]:
    """(first, last) offset of each batch when ``headers`` are appended at ``base_offset``, as
    ``assign_offsets`` numbers them."""
    offsets: list[tuple[int, int]] = []
    next_offset = base_offset
    for header in headers:
        offsets.append((next_offset, next_offset + header.last_offset_delta))
        next_offset += header.last_offset_delta + 1
    return offsets


@dataclass(frozen=True, slots=True)
class MarkerHeader(BatchHeader):
    """A control batch's header with the coordinator epoch of the transaction marker inside
    it (``EndTransactionMarker.coordinatorEpoch``; -1 when the record cannot be read)."""

    coordinator_epoch: int = -1


def header_at(records: bytes | bytearray | memoryview, position: int = 0) -> BatchHeader:
    """``parse_header``, but a control batch comes back as a ``MarkerHeader`` carrying its
    marker's coordinator epoch, which producer state needs (markers are rare: the one
    record is decoded only for them)."""
    header = parse_header(records, position)
    if not header.is_control:
        return header
    batch = memoryview(records)[position:position + header.size_bytes]
    return MarkerHeader(**{f.name: getattr(header, f.name) for f in fields(header)},
                        coordinator_epoch=marker_coordinator_epoch(batch))


def headers_in(records: bytes | bytearray | memoryview) -> Iterator[BatchHeader]:
    """The headers of the (already validated) batches in ``records``, e.g. what a follower
    just wrote with ``PartitionLog.append_replicated``: feed them to ``rebuild``. Control
    batches come as ``MarkerHeader``."""
    position = 0
    while position + RECORD_BATCH_OVERHEAD <= len(records):
        header = header_at(records, position)
        yield header
        position += header.size_bytes


# --- state -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """One retained batch of a producer (Kafka's ``BatchMetadata``)."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp_ms: int  # the batch's maxTimestamp, for the duplicate's Produce response


@dataclass(frozen=True, slots=True)
class ProducerStateEntry:
    """What one partition knows about one producer id. Immutable: updates build a new entry.

    Attributes:
        batches: The last ``BATCHES_TO_RETAIN`` data batches of ``epoch``, oldest first.
        last_update_ms: Broker time of the last batch applied for this producer (expiration).
        last_offset: Offset of the last batch (data or control) applied for this producer;
            a truncation below it invalidates the entry.
        current_txn_first_offset: First offset of the open transaction, or -1.
        coordinator_epoch: Of the last transaction marker, or -1 (transactions milestone).
    """

    producer_id: int
    epoch: int
    batches: tuple[BatchMetadata, ...]
    last_update_ms: int
    last_offset: int
    current_txn_first_offset: int = NO_OFFSET
    coordinator_epoch: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        """``ProducerStateEntry.findDuplicateBatch``: same epoch, exact sequence range."""
        if epoch != self.epoch:
            return None
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return batch
        return None


def _apply(
    entry: ProducerStateEntry | None,
    header: BatchHeader,
    first_offset: int,
    last_offset: int,
    now_ms: int,
) -> ProducerStateEntry:
    """The state transition for one batch with a producer id, shared by the leader (after
    its checks), followers and recovery, so that all of them compute the same state."""
    if entry is None:
        entry = ProducerStateEntry(header.producer_id, header.producer_epoch, (), now_ms,
                                   last_offset)
    batches = entry.batches
    if header.producer_epoch != entry.epoch:  # maybeUpdateProducerEpoch: a new epoch resets
        batches = ()
    if header.is_control:
        # appendEndTxnMarker: the transaction ends; markers carry no sequence. The coordinator
        # epoch lives in the marker record: ``headers_in``/``header_at`` read it.
        # An unreadable marker record (-1) keeps the known epoch rather than lifting the fence.
        coordinator_epoch = header.coordinator_epoch \
            if isinstance(header, MarkerHeader) and header.coordinator_epoch >= 0 \
            else entry.coordinator_epoch
        return replace(entry, epoch=header.producer_epoch, batches=batches,
                       last_update_ms=now_ms, last_offset=last_offset,
                       current_txn_first_offset=NO_OFFSET, coordinator_epoch=coordinator_epoch)
    metadata = BatchMetadata(
        first_seq=header.base_sequence if header.base_sequence >= 0 else NO_SEQUENCE,
        last_seq=last_sequence(header.base_sequence, header.last_offset_delta),
        first_offset=first_offset,
        last_offset=last_offset,
        timestamp_ms=header.max_timestamp,
    )
    txn_first_offset = entry.current_txn_first_offset
    if header.is_transactional and txn_first_offset == NO_OFFSET:
        txn_first_offset = first_offset
    return replace(entry, epoch=header.producer_epoch,
                   batches=(*batches, metadata)[-BATCHES_TO_RETAIN:], last_update_ms=now_ms,
                   last_offset=last_offset, current_txn_first_offset=txn_first_offset)


@dataclass(frozen=True, slots=True)
class AppendCheck:
    """The leader's verdict on a client append.

    * ``error != NONE``: refuse the append with that code (``message`` says why).
    * ``duplicate`` set: a retry of a batch already in the log; write nothing and answer
      success with ``duplicate.first_offset`` (and its timestamp).
    * otherwise (``ok``): append, then call ``commit_append``/``commit_appends``.
    """

    error: ErrorCode = ErrorCode.NONE
    message: str = ""
    duplicate: BatchMetadata | None = None

    @property
    def ok(self) -> bool:
        """Whether the batches should be written."""
        return self.error == ErrorCode.NONE and self.duplicate is None


_OK: Final = AppendCheck()


@dataclass
class ProducerStateManager:
    """Producer state of one partition (Kafka's ``ProducerStateManager``), without I/O.

    ``end_offset`` is the offset after the last batch folded into the state: a snapshot taken
    now describes exactly the batches below it. Not thread-safe; the partition's owner task
    calls every method.
    """

    end_offset: int = 0
    _entries: dict[int, ProducerStateEntry] = field(default_factory=dict)

    # -- reading -------------------------------------------------------------------------------

    def get(self, producer_id: int) -> ProducerStateEntry | None:
        return self._entries.get(producer_id)

    def entries(self) -> Iterator[ProducerStateEntry]:
        return iter(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    # -- leader: validate, then commit after the append succeeded ------------------------------

    def check_append(self, header: BatchHeader) -> AppendCheck:
        """Validate one client batch against the committed state, without mutating it."""
        return self.check_appends((header,))

    def check_appends(self, headers: Sequence[BatchHeader]) -> AppendCheck:
        """Validate the batches of one produce request for this partition, in order, without
        mutating anything. As in Kafka, each batch is checked against the state left by the
        earlier ones, while duplicates are looked up in the committed state only; the first
        duplicate or error decides for the whole request."""
        pending: dict[int, ProducerStateEntry] = {}
        for header in headers:
            if header.producer_id < 0:
                continue
            committed = self._entries.get(header.producer_id)
            first_seq = header.base_sequence
            last_seq = last_sequence(first_seq, header.last_offset_delta)
            if committed is not None and not header.is_control:
                duplicate = committed.find_duplicate(header.producer_epoch, first_seq, last_seq)
                if duplicate is not None:
                    return AppendCheck(duplicate=duplicate)
            current = pending.get(header.producer_id, committed)
            verdict = _check_batch(current, header)
            if verdict is not None:
                return verdict
            # Offsets are unknown before the append; the sequence checks do not need them.
            pending[header.producer_id] = _apply(current, header, NO_OFFSET, NO_OFFSET, 0)
        return _OK

    def check_marker(self, producer_id: int, producer_epoch: int,
                     coordinator_epoch: int) -> ErrorCode:
        """The leader's check of a WriteTxnMarkers entry before it appends the marker
        (``checkProducerEpoch`` then ``checkCoordinatorEpoch``): INVALID_PRODUCER_EPOCH when
        the producer has moved to a newer epoch, TRANSACTION_COORDINATOR_FENCED when a marker
        from a newer coordinator epoch was already written, else NONE."""
        entry = self._entries.get(producer_id)
        if entry is None:
            return ErrorCode.NONE
        if entry.epoch > producer_epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        if entry.coordinator_epoch > coordinator_epoch:
            return ErrorCode.TRANSACTION_COORDINATOR_FENCED
        return ErrorCode.NONE

    def commit_append(
        self,
        header: BatchHeader,
        first_offset: int,
        last_offset: int,
        now_ms: int,
        log_append_time_ms: int = -1,
    ) -> None:
        """Record a batch the leader validated and appended at ``[first_offset, last_offset]``.

        ``header`` may be the client's; pass ``AppendInfo.log_append_time_ms`` so that on a
        LogAppendTime topic the cached timestamp is the one the log stored, as followers and
        recovery will see it."""
        if last_offset - first_offset != header.last_offset_delta:
            raise ValueError(f"offsets [{first_offset}, {last_offset}] do not match "
                             f"lastOffsetDelta {header.last_offset_delta}")
        if log_append_time_ms >= 0:
            header = replace(header, max_timestamp=log_append_time_ms)
        self._fold(header, first_offset, last_offset, now_ms)

    def commit_appends(
        self,
        headers: Sequence[BatchHeader],
        base_offset: int,
        now_ms: int,
        log_append_time_ms: int = -1,
    ) -> None:
        """``commit_append`` for every batch of one append that started at ``base_offset``
        (``AppendInfo.base_offset`` and ``.log_append_time_ms``)."""
        for header, (first, last) in zip(headers, batch_offsets(headers, base_offset),
                                         strict=True):
            self.commit_append(header, first, last, now_ms, log_append_time_ms)

    # -- followers and recovery ------------------------------------------------------------------

    def apply_replicated(self, header: BatchHeader, now_ms: int) -> None:
        """Fold in a batch as stored in the log (real base offset), without checks: the leader
        checked it. A batch wholly below ``end_offset`` is already included and is skipped; one
        that straddles it (the first batch when the log start is inside it) is applied."""
        if header.last_offset < self.end_offset:
            return
        self._fold(header, header.base_offset, header.last_offset, now_ms, strict=False)

    def rebuild(self, headers: Iterable[BatchHeader], now_ms: int) -> None:
        """Replay stored batches in log order (from a snapshot's ``end_offset`` onwards)."""
        for header in headers:
            self.apply_replicated(header, now_ms)

    def _fold(self, header: BatchHeader, first_offset: int, last_offset: int,
              now_ms: int, *, strict: bool = True) -> None:
        if (first_offset if strict else last_offset) < self.end_offset:
            raise ValueError(f"batch at offset {first_offset} is below the state's end "
                             f"offset {self.end_offset}: batches must be applied in log order")
        if header.producer_id >= 0:
            entry = self._entries.get(header.producer_id)
            self._entries[header.producer_id] = _apply(entry, header, first_offset, last_offset,
                                                       now_ms)
        self.end_offset = last_offset + 1

    def advance_end_offset(self, offset: int) -> None:
        """Declare that the batches in ``[end_offset, offset)`` carry no producer id (a caller
        that does not fold non-idempotent batches in calls this before a snapshot)."""
        if offset < self.end_offset:
            raise ValueError(f"end offset {offset} is below {self.end_offset}")
        self.end_offset = offset

    # -- expiration and truncation ---------------------------------------------------------------

    def expire(
        self, now_ms: int, producer_id_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS_DEFAULT
    ) -> list[int]:
        """Forget producers idle for ``producer_id_expiration_ms`` that have no open
        transaction (``ProducerStateManager.removeExpiredProducers``). Returns their ids."""
        expired = [
            entry.producer_id
            for entry in self._entries.values()
            if entry.current_txn_first_offset == NO_OFFSET
            and now_ms - entry.last_update_ms >= producer_id_expiration_ms
        ]
        for producer_id in expired:
            del self._entries[producer_id]
        return expired

    def truncate_to(self, offset: int) -> bool:
        """Forget everything at offsets ``>= offset`` (the log was truncated there).

        Returns True if the state is still exact: no producer was touched by the removed
        batches, so only ``end_offset`` moves. Returns False, changing nothing, when some
        producer was: its older batches and epoch are not kept, so the caller must rebuild
        from a snapshot at or below ``offset`` plus the log (``snapshot.load_producer_state``).
        """
        if offset >= self.end_offset:
            return True
        if any(entry.last_offset >= offset for entry in self._entries.values()):
            return False
        self.end_offset = offset
        return True

    # -- snapshot encoding -----------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        body = bytearray(_BODY_HEADER.pack(self.end_offset, len(self._entries)))
        for producer_id in sorted(self._entries):
            entry = self._entries[producer_id]
            body += _ENTRY.pack(entry.producer_id, entry.epoch, entry.last_update_ms,
                                entry.last_offset, entry.current_txn_first_offset,
                                entry.coordinator_epoch, len(entry.batches))
            for batch in entry.batches:
                body += _BATCH.pack(batch.first_seq, batch.last_seq, batch.first_offset,
                                    batch.last_offset, batch.timestamp_ms)
        return _PREFIX.pack(SNAPSHOT_VERSION, crc32c.crc32c(body)) + bytes(body)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> ProducerStateManager:
        """Decode a snapshot; raises CorruptSnapshotError for any damage."""
        data = bytes(data)
        if len(data) < _PREFIX.size + _BODY_HEADER.size:
            raise CorruptSnapshotError(f"snapshot of {len(data)} bytes is too short")
        version, crc = _PREFIX.unpack_from(data)
        if version != SNAPSHOT_VERSION:
            raise CorruptSnapshotError(f"snapshot version {version}, expected "
                                       f"{SNAPSHOT_VERSION}")
        body = memoryview(data)[_PREFIX.size:]
        actual = crc32c.crc32c(body)
        if actual != crc:
            raise CorruptSnapshotError(f"snapshot CRC-32C {actual:#010x} != stored {crc:#010x}")
        try:
            return _decode_body(body)
        except struct.error as exc:
            raise CorruptSnapshotError(f"snapshot truncated: {exc}") from exc


def _check_batch(entry: ProducerStateEntry | None, header: BatchHeader) -> AppendCheck | None:
    """Kafka's epoch, sequence and transaction checks for one client batch (see the module
    docstring); None if it may be appended."""
    producer_id = header.producer_id
    epoch = header.producer_epoch
    first_seq = header.base_sequence
    if first_seq < 0 or epoch < 0:
        return AppendCheck(ErrorCode.INVALID_RECORD,
                           f"producer {producer_id}: an idempotent batch needs a baseSequence "
                           f"and producerEpoch >= 0 (got {first_seq}, {epoch})")
    if entry is None or entry.epoch == NO_PRODUCER_EPOCH:
        return None  # unknown producer: any sequence (KIP-360)
    if epoch < entry.epoch:
        return AppendCheck(ErrorCode.INVALID_PRODUCER_EPOCH,
                           f"producer {producer_id}: epoch {epoch} is older than the current "
                           f"epoch {entry.epoch}")
    if epoch > entry.epoch:
        if first_seq != 0:
            return AppendCheck(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                               f"producer {producer_id}: new epoch {epoch} must start at "
                               f"sequence 0, got {first_seq}")
    elif not _in_sequence(entry.last_seq, first_seq):
        return AppendCheck(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                           f"producer {producer_id}: sequence {first_seq} does not follow "
                           f"{entry.last_seq} (epoch {epoch})")
    if entry.current_txn_first_offset != NO_OFFSET and not header.is_transactional:
        return AppendCheck(ErrorCode.INVALID_TXN_STATE,
                           f"producer {producer_id}: non-transactional batch inside the "
                           f"transaction open since offset {entry.current_txn_first_offset}")
    return None


def _decode_body(body: memoryview) -> ProducerStateManager:
    end_offset, count = _BODY_HEADER.unpack_from(body)
    position = _BODY_HEADER.size
    if end_offset < 0 or count < 0:
        raise CorruptSnapshotError(f"snapshot end offset {end_offset}, {count} entries")
    entries: dict[int, ProducerStateEntry] = {}
    previous_id = -1
    for _ in range(count):
        (producer_id, epoch, last_update_ms, last_offset, txn_first_offset,
         coordinator_epoch, batch_count) = _ENTRY.unpack_from(body, position)
        position += _ENTRY.size
        if producer_id <= previous_id:
            raise CorruptSnapshotError(f"producer ids not ascending at {producer_id}")
        if batch_count > BATCHES_TO_RETAIN or not -1 <= last_offset < end_offset:
            raise CorruptSnapshotError(f"producer {producer_id}: {batch_count} batches, "
                                       f"last offset {last_offset}")
        batches = []
        for _ in range(batch_count):
            batch = BatchMetadata(*_BATCH.unpack_from(body, position))
            position += _BATCH.size
            if not 0 <= batch.first_offset <= batch.last_offset <= last_offset:
                raise CorruptSnapshotError(f"producer {producer_id}: batch {batch}")
            batches.append(batch)
        entries[producer_id] = ProducerStateEntry(producer_id, epoch, tuple(batches),
                                                  last_update_ms, last_offset,
                                                  txn_first_offset, coordinator_epoch)
        previous_id = producer_id
    if position != len(body):
        raise CorruptSnapshotError(f"{len(body) - position} bytes after the last entry")
    return ProducerStateManager(end_offset, entries)
