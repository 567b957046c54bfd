"""The transaction coordinator's state machine: pure, synchronous, no I/O.

One ``TxnMetadata`` per transactional id (Kafka's ``TransactionMetadata``), in the states of
Kafka's ``TransactionState``::

    Empty --AddPartitions--> Ongoing --EndTxn(commit)--> PrepareCommit --markers--> CompleteCommit
                                     --EndTxn(abort)---> PrepareAbort  --markers--> CompleteAbort
    Ongoing --InitProducerId (new incarnation) or transaction.timeout.ms--> PrepareAbort,
              with the epoch bumped first, so the old incarnation is fenced
    Complete*/Empty --InitProducerId--> Empty (epoch + 1; a new producer id once exhausted)
    Dead: the transactional id expired (not produced by this coordinator yet)

Each decision is a ``Transition``: the error for the client and, when the state changes, the
new metadata the service must persist (to ``__transaction_state``, acks=all) *before* it
applies it and answers. ``markers`` says the new state is a Prepare state whose COMMIT/ABORT
markers the service must write to every partition of the transaction before completing.

Errors follow Kafka's ``TransactionCoordinator``: an unknown transactional id or another
producer id → INVALID_PRODUCER_ID_MAPPING (49); an epoch other than the current one →
PRODUCER_FENCED (90) (the handlers turn it into INVALID_PRODUCER_EPOCH (47) for request
versions that predate KIP-588); a request while markers are being written →
CONCURRENT_TRANSACTIONS (51); an EndTxn that does not fit the state → INVALID_TXN_STATE (48).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Final

from raftlog.metrics.recorders import Counter, CounterMap
from raftlog.protocol.errors import ErrorCode

__all__ = [
    "DEFAULT_TXN_TIMEOUT_MS",
    "MAX_TXN_TIMEOUT_MS",
    "OPEN_STATES",
    "Transition",
    "TxnMetadata",
    "TxnRecordError",
    "TxnState",
    "TxnStats",
    "add_partitions",
    "begin_timeout_abort",
    "complete",
    "decode_metadata",
    "encode_metadata",
    "end_txn",
    "init_producer_id",
    "replay_record",
    "timed_out",
]

# transaction.max.timeout.ms (Kafka's default: 15 minutes).
MAX_TXN_TIMEOUT_MS: Final = 900_000
DEFAULT_TXN_TIMEOUT_MS: Final = 60_000
# TransactionMetadata.isEpochExhausted: Short.MaxValue - 1.
EPOCH_EXHAUSTED: Final = 2**15 - 2
NO_PRODUCER_ID: Final = -1
NO_EPOCH: Final = -1


class TxnState(enum.Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"

    @property
    def preparing(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


TopicPartition = tuple[str, int]

# The states of a transaction that is open: begun and not yet completed.
OPEN_STATES: Final = frozenset(
    {TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT})


class TxnStats:
    """What this coordinator counts for its metrics (``raftlog.observe.txn``): transactions
    completed (``completed`` keyed by ``"commit"``/``"abort"``: the Complete state persisted
    after every marker was written) and those it aborted on ``transaction.timeout.ms``."""

    __slots__ = ("completed", "timeouts")

    def __init__(self) -> None:
        self.completed = CounterMap()
        self.timeouts = Counter()


@dataclass(frozen=True)
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition] = frozenset()
    txn_start_ms: int = -1
    last_update_ms: int = -1
    last_producer_epoch: int = NO_EPOCH
    # Consumer groups whose offsets are part of the transaction (AddOffsetsToTxn).
    groups: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Transition:
    error: ErrorCode = ErrorCode.NONE
    new: TxnMetadata | None = None  # persist, then apply
    markers: bool = False  # new is a Prepare state: write markers, then complete

    @property
    def producer_id(self) -> int:
        return self.new.producer_id if self.new is not None else NO_PRODUCER_ID

    @property
    def producer_epoch(self) -> int:
        return self.new.producer_epoch if self.new is not None else NO_EPOCH


def _fence(current: TxnMetadata, producer_id: int, epoch: int) -> ErrorCode | None:
    if current.producer_id != producer_id:
        return ErrorCode.INVALID_PRODUCER_ID_MAPPING
    if epoch != current.producer_epoch:
        return ErrorCode.PRODUCER_FENCED
    return None


def _bump(current: TxnMetadata, new_producer_id: Callable[[], int]) -> tuple[int, int]:
    if current.producer_epoch >= EPOCH_EXHAUSTED:
        return new_producer_id(), 0
    return current.producer_id, current.producer_epoch + 1


def init_producer_id(
    current: TxnMetadata | None,
    transactional_id: str,
    timeout_ms: int,
    expected_producer_id: int,
    expected_epoch: int,
    now_ms: int,
    new_producer_id: Callable[[], int],
    *,
    max_timeout_ms: int = MAX_TXN_TIMEOUT_MS,
) -> Transition:
    """``TransactionCoordinator.handleInitProducerId`` for a transactional id."""
    if not 0 < timeout_ms <= max_timeout_ms:
        return Transition(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
    if current is None or current.state == TxnState.DEAD:
        return Transition(new=TxnMetadata(
            transactional_id, new_producer_id(), 0, timeout_ms, TxnState.EMPTY,
            last_update_ms=now_ms))
    if expected_producer_id != NO_PRODUCER_ID:
        # KIP-360 (v3+): the producer says which incarnation it was. A retry of a bump that
        # already happened is answered with the current id and epoch.
        if (expected_producer_id == current.producer_id
                and expected_epoch == current.last_producer_epoch
                and current.state == TxnState.EMPTY):
            return Transition(new=current)
        if expected_producer_id != current.producer_id or \
                expected_epoch != current.producer_epoch:
            return Transition(ErrorCode.PRODUCER_FENCED)
    if current.state.preparing:
        return Transition(ErrorCode.CONCURRENT_TRANSACTIONS)
    if current.state == TxnState.ONGOING:
        # A new incarnation while the old one has a transaction open: fence the old epoch and
        # abort; the client retries (CONCURRENT_TRANSACTIONS) until the abort completed.
        producer_id, epoch = _bump(current, new_producer_id)
        aborting = replace(current, producer_id=producer_id, producer_epoch=epoch,
                           last_producer_epoch=current.producer_epoch,
                           state=TxnState.PREPARE_ABORT, last_update_ms=now_ms)
        return Transition(ErrorCode.CONCURRENT_TRANSACTIONS, new=aborting, markers=True)
    producer_id, epoch = _bump(current, new_producer_id)
    return Transition(new=replace(
        current, producer_id=producer_id, producer_epoch=epoch,
        last_producer_epoch=current.producer_epoch if producer_id == current.producer_id
        else NO_EPOCH, timeout_ms=timeout_ms, state=TxnState.EMPTY, partitions=frozenset(),
        groups=frozenset(), txn_start_ms=-1, last_update_ms=now_ms))


def add_partitions(
    current: TxnMetadata | None,
    producer_id: int,
    epoch: int,
    partitions: Iterable[TopicPartition] = (),
    now_ms: int = 0,
    *,
    groups: Iterable[str] = (),
) -> Transition:
    """AddPartitionsToTxn (and AddOffsetsToTxn, which adds a group): the transaction is
    Ongoing afterwards and lists the partitions."""
    if current is None:
        return Transition(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
    fenced = _fence(current, producer_id, epoch)
    if fenced is not None:
        return Transition(fenced)
    if current.state.preparing:
        return Transition(ErrorCode.CONCURRENT_TRANSACTIONS)
    if current.state == TxnState.DEAD:
        return Transition(ErrorCode.INVALID_TXN_STATE)
    wanted = frozenset(partitions)
    wanted_groups = frozenset(groups)
    if current.state == TxnState.ONGOING and wanted <= current.partitions \
            and wanted_groups <= current.groups:
        return Transition()  # nothing new: no write
    starting = current.state != TxnState.ONGOING
    return Transition(new=replace(
        current, state=TxnState.ONGOING,
        partitions=(frozenset() if starting else current.partitions) | wanted,
        groups=(frozenset() if starting else current.groups) | wanted_groups,
        txn_start_ms=now_ms if starting else current.txn_start_ms, last_update_ms=now_ms))


def end_txn(current: TxnMetadata | None, producer_id: int, epoch: int, commit: bool,
            now_ms: int) -> Transition:
    """EndTxn: Ongoing → Prepare*, whose markers the service then writes."""
    if current is None:
        return Transition(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
    fenced = _fence(current, producer_id, epoch)
    if fenced is not None:
        return Transition(fenced)
    state = current.state
    if state == TxnState.ONGOING:
        target = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        return Transition(new=replace(current, state=target, last_update_ms=now_ms),
                          markers=True)
    if (state == TxnState.COMPLETE_COMMIT and commit) or \
            (state == TxnState.COMPLETE_ABORT and not commit):
        return Transition()  # a retry of an EndTxn that already completed
    if (state == TxnState.PREPARE_COMMIT and commit) or \
            (state == TxnState.PREPARE_ABORT and not commit):
        return Transition(ErrorCode.CONCURRENT_TRANSACTIONS)
    return Transition(ErrorCode.INVALID_TXN_STATE)


def verify_partitions(current: TxnMetadata | None, producer_id: int, epoch: int,
                      partitions: Iterable[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
    """AddPartitionsToTxn v4+ with verify_only (KIP-890 part 1, Kafka's
    ``handleVerifyPartitionsInTransaction``): changes nothing; a partition is verified (NONE)
    when the producer's current epoch has an Ongoing transaction that lists it."""
    wanted = list(partitions)

    def every(code: ErrorCode) -> dict[TopicPartition, ErrorCode]:
        return dict.fromkeys(wanted, code)

    if current is None or current.state == TxnState.DEAD:
        return every(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
    fenced = _fence(current, producer_id, epoch)
    if fenced is not None:
        return every(fenced)
    if current.state.preparing:
        return every(ErrorCode.CONCURRENT_TRANSACTIONS)  # retriable: ask again later
    if current.state != TxnState.ONGOING:
        return every(ErrorCode.INVALID_TXN_STATE)
    return {tp: ErrorCode.NONE if tp in current.partitions else ErrorCode.INVALID_TXN_STATE
            for tp in wanted}


def complete(current: TxnMetadata, now_ms: int) -> TxnMetadata:
    """Prepare* → Complete* once every marker is written."""
    assert current.state.preparing, current
    target = TxnState.COMPLETE_COMMIT if current.state == TxnState.PREPARE_COMMIT \
        else TxnState.COMPLETE_ABORT
    return replace(current, state=target, partitions=frozenset(), groups=frozenset(),
                   last_update_ms=now_ms)


def timed_out(current: TxnMetadata, now_ms: int) -> bool:
    return current.state == TxnState.ONGOING and \
        now_ms - current.txn_start_ms > current.timeout_ms


def begin_timeout_abort(current: TxnMetadata, now_ms: int,
                        new_producer_id: Callable[[], int]) -> Transition:
    """``abortTimedOutTransactions``: bump the epoch (fencing the producer) and abort."""
    producer_id, epoch = _bump(current, new_producer_id)
    return Transition(new=replace(
        current, producer_id=producer_id, producer_epoch=epoch,
        last_producer_epoch=current.producer_epoch, state=TxnState.PREPARE_ABORT,
        last_update_ms=now_ms), markers=True)


# -- the __transaction_state record value -------------------------------------------------------

def encode_metadata(metadata: TxnMetadata) -> bytes:
    value: dict[str, Any] = {
        "v": 0,
        "producer_id": metadata.producer_id,
        "producer_epoch": metadata.producer_epoch,
        "last_producer_epoch": metadata.last_producer_epoch,
        "timeout_ms": metadata.timeout_ms,
        "state": metadata.state.value,
        "partitions": sorted([t, p] for t, p in metadata.partitions),
        "groups": sorted(metadata.groups),
        "txn_start_ms": metadata.txn_start_ms,
        "last_update_ms": metadata.last_update_ms,
    }
    return json.dumps(value, separators=(",", ":")).encode()


class TxnRecordError(ValueError):
    """A ``__transaction_state`` record this coordinator cannot decode: a key that is not
    UTF-8, a value that is not the JSON object ``encode_metadata`` writes (an unknown version,
    a missing field, a field of the wrong type or out of its wire range). The decoders raise
    nothing else for any input bytes, so the replay skips the record instead of failing."""


_INT16: Final = 16
_INT32: Final = 32
_INT64: Final = 64
_VALUE_VERSION: Final = 0


def decode_transactional_id(key: bytes) -> str:
    try:
        return key.decode()
    except UnicodeDecodeError as exc:
        raise TxnRecordError(f"transactional id is not UTF-8: {exc}") from exc


def decode_metadata(transactional_id: str, data: bytes) -> TxnMetadata:
    """The value ``encode_metadata`` wrote, checked field by field: every number must fit the
    wire field it is answered in (producer id int64, epochs int16, timeout int32), so a bad
    record cannot turn into a failed response encoding later."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError
        raise TxnRecordError(f"value is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise TxnRecordError(f"value is a JSON {type(value).__name__}, not an object")
    try:
        if value.get("v", _VALUE_VERSION) != _VALUE_VERSION:
            raise ValueError(f"unknown value version {value.get('v')!r}")
        return TxnMetadata(
            transactional_id=transactional_id,
            producer_id=_int(value, "producer_id", _INT64),
            producer_epoch=_int(value, "producer_epoch", _INT16),
            timeout_ms=_int(value, "timeout_ms", _INT32),
            state=TxnState(value["state"]),
            partitions=frozenset(_topic_partition(tp) for tp in _list(value, "partitions")),
            txn_start_ms=_int(value, "txn_start_ms", _INT64),
            last_update_ms=_int(value, "last_update_ms", _INT64),
            last_producer_epoch=_int(value, "last_producer_epoch", _INT16, NO_EPOCH),
            groups=frozenset(_str(group) for group in _list(value, "groups", required=False)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise TxnRecordError(f"bad transaction metadata: {exc!r}") from exc


def _int(value: dict[str, Any], key: str, bits: int, default: int | None = None) -> int:
    number = value.get(key, default)
    if type(number) is not int:  # not bool, float or str: what encode_metadata never writes
        raise TypeError(f"{key} is {number!r}, not an integer")
    if not -(1 << (bits - 1)) <= number < 1 << (bits - 1):
        raise ValueError(f"{key} {number} does not fit int{bits}")
    return number


def _list(value: dict[str, Any], key: str, *, required: bool = True) -> list[Any]:
    if not required and key not in value:
        return []
    items = value[key]
    if not isinstance(items, list):
        raise TypeError(f"{key} is {items!r}, not a list")
    return items


def _str(item: Any) -> str:
    if not isinstance(item, str):
        raise TypeError(f"{item!r} is not a string")
    return item


def _topic_partition(item: Any) -> TopicPartition:
    if not isinstance(item, list) or len(item) != 2:
        raise TypeError(f"partition {item!r} is not [topic, index]")
    topic, index = item
    number = _int({"partition": index}, "partition", _INT32)
    if number < 0:
        raise ValueError(f"partition index {number} is negative")
    return _str(topic), number


def replay_record(txns: dict[str, TxnMetadata], key: bytes, value: bytes | None) -> None:
    """Apply one ``__transaction_state`` record to ``txns`` (the last record of an id wins; a
    null value deletes the id). Raises TxnRecordError, with ``txns`` unchanged."""
    transactional_id = decode_transactional_id(key)
    if value is None:
        txns.pop(transactional_id, None)
    else:
        txns[transactional_id] = decode_metadata(transactional_id, value)


@dataclass
class CoordinatorPartitionState:
    """The transactions of one ``__transaction_state`` partition this node leads."""

    partition: int
    coordinator_epoch: int
    txns: dict[str, TxnMetadata] = field(default_factory=dict)

    def by_producer_id(self, producer_id: int) -> TxnMetadata | None:
        for metadata in self.txns.values():
            if metadata.producer_id == producer_id:
                return metadata
        return None
