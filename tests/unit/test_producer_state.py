"""ProducerStateManager: Kafka's idempotent-producer checks, snapshots and recovery.

Goal: every idempotent batch is written at most once, retries inside the 5-batch window get
their original offsets back, and errors are the ones Kafka 3.x returns. Method: examples for
each rule, and a Hypothesis state machine of producers that retry, reorder and bump epochs
against a model that keeps the whole history (not a 5-batch window); the broker side restarts
from snapshots and log replays and truncates its log along the way.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass, field
from pathlib import Path

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from raftlog.partition import producer_snapshot as snapshot
from raftlog.partition.batch import BatchHeader, build_batch, validate_batches
from raftlog.partition.log import LogConfig, PartitionLog
from raftlog.partition.producer_state import (
    BATCHES_TO_RETAIN,
    INT32_MAX,
    BatchMetadata,
    CorruptSnapshotError,
    MarkerHeader,
    ProducerStateEntry,
    ProducerStateManager,
    headers_in,
    last_sequence,
)
from raftlog.partition.txn_index import build_marker
from raftlog.protocol.errors import ErrorCode

T0 = 1_700_000_000_000
TRANSACTIONAL = 0x10
CONTROL = 0x20


def header(
    pid: int,
    epoch: int,
    seq: int,
    count: int = 1,
    *,
    base_offset: int = 0,
    attributes: int = 0,
    timestamp_ms: int = T0,
) -> BatchHeader:
    """A client batch header (base offset 0 unless stored)."""
    return BatchHeader(
        base_offset=base_offset, batch_length=49, partition_leader_epoch=-1, magic=2, crc=0,
        attributes=attributes, last_offset_delta=count - 1, base_timestamp=timestamp_ms,
        max_timestamp=timestamp_ms, producer_id=pid, producer_epoch=epoch,
        base_sequence=seq, records_count=count,
    )


class Broker:
    """A leader: check, 'append' at the log end, commit."""

    def __init__(self) -> None:
        self.state = ProducerStateManager()
        self.stored: list[BatchHeader] = []
        self.now_ms = T0

    def produce(self, h: BatchHeader) -> tuple[ErrorCode, int]:
        """(error, base offset) as a Produce response would carry them."""
        check = self.state.check_append(h)
        if check.error:
            return check.error, -1
        if check.duplicate is not None:
            return ErrorCode.NONE, check.duplicate.first_offset
        first = self.state.end_offset
        self.now_ms += 1
        self.state.commit_append(h, first, first + h.last_offset_delta, self.now_ms)
        self.stored.append(dataclasses.replace(h, base_offset=first))
        return ErrorCode.NONE, first


# --- the rules, one by one -------------------------------------------------------------------


def test_non_idempotent_batches_are_always_accepted() -> None:
    broker = Broker()
    assert broker.produce(header(-1, -1, -1, 3)) == (0, 0)
    assert broker.produce(header(-1, -1, -1, 3)) == (0, 3)
    assert len(broker.state) == 0 and broker.state.end_offset == 6


def test_in_sequence_batches_and_gaps() -> None:
    broker = Broker()
    assert broker.produce(header(7, 0, 0, 2)) == (0, 0)
    assert broker.produce(header(7, 0, 2, 3)) == (0, 2)
    assert broker.produce(header(7, 0, 6)) == (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    assert broker.produce(header(7, 0, 4)) == (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    assert broker.produce(header(7, 0, 5)) == (0, 5)


def test_a_producer_without_state_is_accepted_at_any_sequence() -> None:
    """Kafka >= 2.5 (KIP-360): no UNKNOWN_PRODUCER_ID; the first batch may start anywhere."""
    broker = Broker()
    assert broker.produce(header(9, 3, 12345, 2)) == (0, 0)
    assert broker.produce(header(9, 3, 12347)) == (0, 2)


def test_epochs_fence_and_reset_sequences() -> None:
    broker = Broker()
    broker.produce(header(1, 0, 0, 5))
    assert broker.produce(header(1, 1, 5)) == (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    assert broker.produce(header(1, 1, 0)) == (0, 5)
    assert broker.produce(header(1, 0, 5)) == (ErrorCode.INVALID_PRODUCER_EPOCH, -1)
    # The old epoch's batches are gone from the window: its retry is fenced, not a duplicate.
    assert broker.produce(header(1, 0, 0, 5)) == (ErrorCode.INVALID_PRODUCER_EPOCH, -1)
    assert broker.produce(header(1, 1, 1)) == (0, 6)


def test_duplicates_within_the_window_get_their_offsets_back() -> None:
    broker = Broker()
    offsets = [broker.produce(header(4, 0, 2 * i, 2))[1] for i in range(BATCHES_TO_RETAIN + 1)]
    assert offsets == [0, 2, 4, 6, 8, 10]
    for i in range(1, BATCHES_TO_RETAIN + 1):
        check = broker.state.check_append(header(4, 0, 2 * i, 2))
        assert check.duplicate == BatchMetadata(2 * i, 2 * i + 1, offsets[i], offsets[i] + 1, T0)
        assert not check.ok and check.error == 0
    # Out of the window: Kafka answers OUT_OF_ORDER_SEQUENCE_NUMBER, never a second write.
    assert broker.produce(header(4, 0, 0, 2)) == (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    # Same first sequence, different length: not a duplicate.
    assert broker.produce(header(4, 0, 10, 1)) == (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    assert broker.state.end_offset == 12


def test_duplicate_reports_the_original_timestamp() -> None:
    broker = Broker()
    broker.produce(header(4, 0, 0, timestamp_ms=T0 + 5))
    check = broker.state.check_append(header(4, 0, 0, timestamp_ms=T0 + 99))
    assert check.duplicate is not None and check.duplicate.timestamp_ms == T0 + 5
    # LogAppendTime topic: the stored (broker) timestamp, as a follower's replay sees it.
    broker.state.commit_append(header(4, 0, 1, timestamp_ms=T0), 1, 1, T0, T0 + 777)
    check = broker.state.check_append(header(4, 0, 1))
    assert check.duplicate is not None and check.duplicate.timestamp_ms == T0 + 777


def test_sequences_wrap_from_int32_max_to_zero() -> None:
    assert last_sequence(INT32_MAX - 1, 3) == 1
    broker = Broker()
    assert broker.produce(header(2, 0, INT32_MAX - 1, 2)) == (0, 0)
    entry = broker.state.get(2)
    assert entry is not None and entry.last_seq == INT32_MAX
    assert broker.produce(header(2, 0, 0, 3)) == (0, 2)
    assert broker.produce(header(2, 0, 3)) == (0, 5)
    wrapped = header(3, 0, INT32_MAX, 4)
    assert broker.produce(wrapped) == (0, 6)
    assert broker.state.check_append(wrapped).duplicate is not None
    assert broker.produce(header(3, 0, 3)) == (0, 10)


def test_invalid_idempotent_batches() -> None:
    broker = Broker()
    assert broker.produce(header(5, 0, -1))[0] == ErrorCode.INVALID_RECORD
    assert broker.produce(header(5, -1, 0))[0] == ErrorCode.INVALID_RECORD
    assert len(broker.state) == 0


def test_check_does_not_mutate() -> None:
    broker = Broker()
    broker.produce(header(1, 0, 0))
    before = broker.state.to_bytes()
    for h in (header(1, 0, 1), header(1, 1, 0), header(1, 0, 0), header(2, 0, 9)):
        broker.state.check_append(h)
    assert broker.state.to_bytes() == before


def test_transactions_are_tracked_for_the_next_milestone() -> None:
    broker = Broker()
    assert broker.produce(header(8, 0, 0, 2, attributes=TRANSACTIONAL)) == (0, 0)
    assert broker.produce(header(8, 0, 2, attributes=TRANSACTIONAL)) == (0, 2)
    entry = broker.state.get(8)
    assert entry is not None and entry.current_txn_first_offset == 0
    assert broker.produce(header(8, 0, 3))[0] == ErrorCode.INVALID_TXN_STATE
    # The marker (written by the leader, applied like a replicated batch) ends it.
    broker.state.apply_replicated(header(8, 0, -1, base_offset=3,
                                         attributes=TRANSACTIONAL | CONTROL), T0)
    entry = broker.state.get(8)
    assert entry is not None and entry.current_txn_first_offset == -1
    assert entry.last_seq == 2 and broker.state.end_offset == 4
    assert broker.produce(header(8, 0, 3)) == (0, 4)
    # A marker with a bumped epoch resets the sequence: the next batch starts at 0.
    broker.state.apply_replicated(header(8, 1, -1, base_offset=5,
                                         attributes=TRANSACTIONAL | CONTROL), T0)
    assert broker.produce(header(8, 1, 4))[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert broker.produce(header(8, 1, 0)) == (0, 6)


def _marker_bytes(pid: int, epoch: int, coordinator_epoch: int) -> bytes:
    return build_marker(pid, epoch, True, coordinator_epoch, T0)  # at base offset 0


def test_markers_record_their_coordinator_epoch_and_older_ones_are_fenced() -> None:
    """Kafka's ``checkCoordinatorEpoch``. The campaign's precommitted-read (txn under all
    faults, seed 1085) was a replaced coordinator's late COMMIT ending the producer's next
    transaction."""
    state = ProducerStateManager()
    assert state.check_marker(8, 0, 0) == ErrorCode.NONE  # unknown producer
    state.commit_append(header(8, 0, 0, attributes=TRANSACTIONAL), 0, 0, T0)
    (marker,) = headers_in(_marker_bytes(8, 0, 3))
    state.commit_append(marker, 1, 1, T0)
    entry = state.get(8)
    assert entry is not None and entry.coordinator_epoch == 3
    state.commit_append(header(8, 0, 1, attributes=TRANSACTIONAL), 2, 2, T0)  # next txn
    assert state.check_marker(8, 0, 2) == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert state.check_marker(8, 0, 3) == ErrorCode.NONE
    assert state.check_marker(8, 0, 4) == ErrorCode.NONE
    assert state.check_marker(7, 0, 0) == ErrorCode.NONE
    # A newer producer epoch is checked first (checkProducerEpoch), as in Kafka.
    state.commit_append(header(8, 1, 0, attributes=TRANSACTIONAL), 3, 3, T0)
    assert state.check_marker(8, 0, 9) == ErrorCode.INVALID_PRODUCER_EPOCH
    # Followers, recovery (headers_in reads the marker record) and snapshots keep it too.
    follower = ProducerStateManager()
    follower.rebuild(headers_in(_marker_bytes(8, 0, 5)), T0)
    entry = follower.get(8)
    assert entry is not None and entry.coordinator_epoch == 5
    restored = ProducerStateManager.from_bytes(follower.to_bytes()).get(8)
    assert restored is not None and restored.coordinator_epoch == 5
    # A marker whose record cannot be read (-1) keeps the known epoch: the fence stays.
    (unreadable,) = headers_in(_marker_bytes(8, 0, 5))
    assert isinstance(unreadable, MarkerHeader)
    follower.commit_append(dataclasses.replace(unreadable, coordinator_epoch=-1), 1, 1, T0)
    entry = follower.get(8)
    assert entry is not None and entry.coordinator_epoch == 5


def test_multi_batch_requests_check_each_batch_against_the_previous_one() -> None:
    state = ProducerStateManager()
    first, second = header(1, 0, 0, 2), header(1, 0, 2, 3)
    assert state.check_appends([first, second]).ok
    assert state.check_appends([first, header(1, 0, 3)]).error == 45
    assert state.check_appends([header(-1, -1, -1), first, header(2, 0, 0)]).ok
    state.commit_appends([header(-1, -1, -1, 4), first, second], base_offset=10, now_ms=T0)
    assert state.end_offset == 19
    entry = state.get(1)
    assert entry is not None
    assert [(b.first_offset, b.last_offset) for b in entry.batches] == [(14, 15), (16, 18)]
    # A retry of the pair: the first duplicate decides (Kafka returns it for the request).
    check = state.check_appends([first, second])
    assert check.duplicate is not None and check.duplicate.first_offset == 14


def test_commit_rejects_offsets_out_of_log_order() -> None:
    state = ProducerStateManager(end_offset=10)
    with pytest.raises(ValueError):
        state.commit_append(header(1, 0, 0), 9, 9, T0)
    with pytest.raises(ValueError):
        state.commit_append(header(1, 0, 0, 2), 10, 10, T0)


def test_apply_replicated_skips_batches_already_included() -> None:
    state = ProducerStateManager(end_offset=10)
    state.apply_replicated(header(1, 0, 0, 5, base_offset=0), T0)
    assert len(state) == 0
    state.apply_replicated(header(1, 0, 0, 5, base_offset=8), T0)  # straddles: log start inside
    assert state.get(1) is not None and state.end_offset == 13


def test_expire_forgets_idle_producers_without_open_transactions() -> None:
    state = ProducerStateManager()
    state.commit_append(header(1, 0, 0), 0, 0, now_ms=T0)
    state.commit_append(header(2, 0, 0, attributes=TRANSACTIONAL), 1, 1, now_ms=T0)
    state.commit_append(header(3, 0, 0), 2, 2, now_ms=T0 + 500)
    assert state.expire(T0 + 999, 1000) == []
    assert state.expire(T0 + 1000, 1000) == [1]
    assert sorted(e.producer_id for e in state.entries()) == [2, 3]
    # Expired means unknown again: any sequence is accepted (Kafka 3.x).
    assert state.check_append(header(1, 0, 77)).ok


def test_truncate_is_exact_only_when_no_producer_is_touched() -> None:
    broker = Broker()
    broker.produce(header(1, 0, 0, 2))  # 0-1
    broker.produce(header(-1, -1, -1, 3))  # 2-4
    assert broker.state.truncate_to(3) and broker.state.end_offset == 3
    before = broker.state.to_bytes()
    assert not broker.state.truncate_to(1)
    assert broker.state.to_bytes() == before, "a refused truncation changes nothing"


# --- snapshots -----------------------------------------------------------------------------


@st.composite
def states(draw: st.DrawFn) -> ProducerStateManager:
    """States reached by replaying random batches (data, transactional, markers, no pid)."""
    state = ProducerStateManager(end_offset=draw(st.integers(0, 1000)))
    for _ in range(draw(st.integers(0, 30))):
        count = draw(st.integers(1, 4))
        kind = draw(st.sampled_from(["data", "data", "txn", "marker", "none"]))
        pid = draw(st.integers(0, 5)) if kind != "none" else -1
        epoch = draw(st.integers(0, 3)) if kind != "none" else -1
        seq = draw(st.integers(0, INT32_MAX)) if kind in ("data", "txn") else -1
        attributes = {"txn": TRANSACTIONAL, "marker": TRANSACTIONAL | CONTROL}.get(kind, 0)
        h = header(pid, epoch, seq, count if kind != "marker" else 1,
                   base_offset=state.end_offset + draw(st.integers(0, 3)),
                   attributes=attributes, timestamp_ms=draw(st.integers(-1, 2**40)))
        state.apply_replicated(h, draw(st.integers(0, 2**45)))
    return state


@settings(max_examples=200, deadline=None)
@given(states())
def test_snapshot_round_trip(state: ProducerStateManager) -> None:
    data = state.to_bytes()
    restored = ProducerStateManager.from_bytes(data)
    assert restored == state
    assert restored.to_bytes() == data


@settings(max_examples=200, deadline=None)
@given(states(), st.data())
def test_any_damaged_byte_is_detected(state: ProducerStateManager, data: st.DataObject) -> None:
    encoded = bytearray(state.to_bytes())
    position = data.draw(st.integers(0, len(encoded) - 1))
    encoded[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptSnapshotError):
        ProducerStateManager.from_bytes(encoded)


@settings(max_examples=100, deadline=None)
@given(states(), st.data())
def test_truncated_snapshots_are_detected(state: ProducerStateManager, data: st.DataObject) -> None:
    encoded = state.to_bytes()
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(CorruptSnapshotError):
        ProducerStateManager.from_bytes(encoded[:cut])


def test_snapshot_with_a_valid_crc_but_bad_structure_is_rejected() -> None:
    state = ProducerStateManager()
    state.commit_append(header(1, 0, 0), 3, 3, T0)
    body = bytearray(state.to_bytes()[5:])
    struct.pack_into(">q", body, 0, 0)  # end offset 0, below the entry's last offset
    with pytest.raises(CorruptSnapshotError, match="last offset"):
        ProducerStateManager.from_bytes(struct.pack(">BI", 1, crc32c.crc32c(body)) + body)
    with pytest.raises(CorruptSnapshotError, match="version"):
        ProducerStateManager.from_bytes(b"\x02" + state.to_bytes()[1:])


# --- snapshot files and recovery over a real PartitionLog ---------------------------------


def test_snapshot_files(tmp_path: Path) -> None:
    state = ProducerStateManager()
    state.commit_append(header(1, 0, 0, 3), 0, 2, T0)
    assert snapshot.write_snapshot(tmp_path, state).name == f"{3:020d}.snapshot"
    state.commit_append(header(1, 0, 3), 3, 3, T0)
    snapshot.write_snapshot(tmp_path, state, offset=10)  # offsets 4-9 carry no producer id
    assert state.end_offset == 10
    (tmp_path / f"{20:020d}.snapshot").write_bytes(state.to_bytes())  # name != contents
    (tmp_path / f"{30:020d}.snapshot").write_bytes(b"junk")
    (tmp_path / f"{40:020d}.snapshot").write_bytes(state.to_bytes())
    (tmp_path / f"{50:020d}.snapshot.tmp").write_bytes(b"half")
    loaded = snapshot.load_latest_snapshot(tmp_path, max_offset=39)
    assert loaded is not None and loaded[0] == 10 and loaded[1] == state
    assert snapshot.list_snapshots(tmp_path) == [3, 10], "above max, corrupt and tmp are gone"
    assert snapshot.load_latest_snapshot(tmp_path, max_offset=9, min_offset=4) is None
    assert snapshot.list_snapshots(tmp_path) == []


def test_snapshot_pruning_and_reset(tmp_path: Path) -> None:
    for offset in (5, 9, 12, 40):
        snapshot.write_snapshot_bytes(tmp_path, offset, ProducerStateManager(offset).to_bytes(),
                                      snapshot.SnapshotFence(), 0)
    assert snapshot.prune_snapshots(tmp_path, keep=2) == [5, 9]
    assert snapshot.delete_snapshots(tmp_path, above=20) == [40]
    state = snapshot.reset_producer_state(tmp_path, 100, snapshot.SnapshotFence())
    assert snapshot.list_snapshots(tmp_path) == [] and state.end_offset == 100 and not len(state)


def test_headers_in_a_follower_append() -> None:
    raw = b"".join(
        build_batch([(None, b"x", [])] * count, base_offset=offset, producer_id=3,
                    producer_epoch=0, base_sequence=offset)
        for offset, count in ((10, 2), (12, 3))
    )
    state = ProducerStateManager(end_offset=10)
    state.rebuild(headers_in(raw), T0)
    entry = state.get(3)
    assert state.end_offset == 15 and entry is not None
    assert [(b.first_seq, b.last_seq, b.first_offset) for b in entry.batches] == [
        (10, 11, 10), (12, 14, 12)]


def _produce(log: PartitionLog, broker_state: ProducerStateManager, pid: int, epoch: int,
             seq: int, count: int, now_ms: int) -> int:
    raw = build_batch([(None, b"v%d" % i, []) for i in range(count)], timestamp_ms=now_ms,
                      producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    headers = validate_batches(raw)
    check = broker_state.check_appends(headers)
    assert check.ok, check
    segments_before = log.segment_base_offsets
    info = log.append(raw, leader_epoch=0, now_ms=now_ms)
    if log.segment_base_offsets != segments_before:  # rolled: snapshot at the new base
        snapshot.write_snapshot(log.directory, broker_state, offset=info.base_offset)
    broker_state.commit_appends(headers, info.base_offset, now_ms, info.log_append_time_ms)
    return info.base_offset


def test_recovery_from_snapshot_and_log(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    config = LogConfig(segment_bytes=400)
    log = PartitionLog.open(directory, config, T0)
    state = ProducerStateManager()
    for i in range(30):
        _produce(log, state, pid=i % 3, epoch=0, seq=(i // 3) * 2, count=2, now_ms=T0 + i)
    assert len(log.segment_base_offsets) > 3 and snapshot.list_snapshots(directory)

    def read_headers(offset: int) -> list[BatchHeader]:
        return list(snapshot.log_headers(log, offset))

    def recover() -> ProducerStateManager:
        return snapshot.load_producer_state(
            directory, log_start_offset=log.log_start_offset,
            log_end_offset=log.log_end_offset, read_headers=read_headers, now_ms=T0)

    assert _normalized(recover()) == _normalized(state)
    # Corrupt the newest snapshot: the next older one is used, the broken one deleted.
    newest = snapshot.list_snapshots(directory)[-1]
    snapshot.snapshot_path(directory, newest).write_bytes(b"\x01garbage")
    assert _normalized(recover()) == _normalized(state)
    assert newest not in snapshot.list_snapshots(directory)
    # No snapshot at all: a full replay.
    snapshot.delete_snapshots(directory, below=1 << 62)
    assert _normalized(recover()) == _normalized(state)

    # Truncation into producer 0's last batch: a reload from snapshot + log.
    for seq in (0, 20):  # two big batches, each in a new segment, so snapshots exist again
        _produce(log, state, pid=9, epoch=0, seq=seq, count=20, now_ms=T0 + 100)
    cut = state.end_offset - 25
    new_end = log.truncate_to(cut)
    state = snapshot.truncate_producer_state(state, directory, new_end,
                                             log_start_offset=log.log_start_offset,
                                             read_headers=read_headers, now_ms=T0,
                                             fence=snapshot.SnapshotFence())
    assert all(offset <= new_end for offset in snapshot.list_snapshots(directory))
    assert _normalized(state) == _normalized(recover())
    fresh = ProducerStateManager()
    fresh.rebuild(read_headers(0), T0)
    assert _normalized(state) == _normalized(fresh)
    log.close()


def _normalized(state: ProducerStateManager) -> tuple[int, dict[int, ProducerStateEntry]]:
    """The state without broker clock readings (a replay stamps its own time)."""
    return state.end_offset, {
        e.producer_id: dataclasses.replace(e, last_update_ms=0) for e in state.entries()
    }


# --- the model-based test ------------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    batch_id: int
    pid: int
    epoch: int
    first_seq: int
    count: int

    @property
    def last_seq(self) -> int:
        return (self.first_seq + self.count - 1) % (INT32_MAX + 1)

    def header(self) -> BatchHeader:
        return header(self.pid, self.epoch, self.first_seq, self.count,
                      timestamp_ms=T0 + self.batch_id)


@dataclass(frozen=True)
class Written:
    sent: Sent
    first_offset: int

    @property
    def stored(self) -> BatchHeader:
        return dataclasses.replace(self.sent.header(), base_offset=self.first_offset)


DELIVERED = st.integers(0, 5).map(bool)  # most requests arrive


@dataclass
class Client:
    pid: int
    epoch: int = 0
    next_seq: int = 0
    sent: list[Sent] = field(default_factory=list)


class IdempotentProducerMachine(RuleBasedStateMachine):
    """Producers send, retry (in any order), lose responses and bump epochs; the broker
    restarts from snapshots or replays, and truncates its log. The model keeps every write."""

    def __init__(self) -> None:
        super().__init__()
        self.state = ProducerStateManager()
        self.log: list[Written] = []
        self.clients: list[Client] = []
        self.next_batch_id = 0
        self.now_ms = T0

    @property
    def log_end(self) -> int:
        return self.log[-1].first_offset + self.log[-1].sent.count if self.log else 0

    # -- the model: Kafka's rules over the full history ----------------------------------------

    def expected(self, sent: Sent) -> tuple[int, Written | None]:
        history = [w for w in self.log if w.sent.pid == sent.pid]
        if not history:
            return 0, None  # unknown producer: any sequence
        epoch = history[-1].sent.epoch
        window = [w for w in history if w.sent.epoch == epoch][-BATCHES_TO_RETAIN:]
        if sent.epoch == epoch:
            for w in window:
                if (w.sent.first_seq, w.sent.last_seq) == (sent.first_seq, sent.last_seq):
                    return 0, w
        if sent.epoch < epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH, None
        if sent.epoch > epoch:
            return (0 if sent.first_seq == 0 else ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER), None
        follows = sent.first_seq == (window[-1].sent.last_seq + 1) % (INT32_MAX + 1)
        return (0 if follows else ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER), None

    def deliver(self, sent: Sent) -> None:
        expected_error, expected_duplicate = self.expected(sent)
        before = self.state.to_bytes()
        check = self.state.check_append(sent.header())
        assert self.state.to_bytes() == before
        assert check.error == expected_error, (sent, check)
        if expected_duplicate is not None:
            assert check.duplicate is not None
            assert check.duplicate.first_offset == expected_duplicate.first_offset
            assert check.duplicate.last_offset == expected_duplicate.first_offset + sent.count - 1
            assert check.duplicate.timestamp_ms == T0 + expected_duplicate.sent.batch_id
            assert expected_duplicate.sent == sent, "only the same batch can match exactly"
            return
        assert check.duplicate is None
        if check.ok:
            self.now_ms += 1
            first = self.log_end
            self.state.commit_append(sent.header(), first, first + sent.count - 1, self.now_ms)
            self.log.append(Written(sent, first))

    # -- rules ---------------------------------------------------------------------------------

    @precondition(lambda self: len(self.clients) < 3)
    @rule(first_seq=st.sampled_from([0, 0, 17, INT32_MAX - 2, INT32_MAX - 7]))
    def new_producer(self, first_seq: int) -> None:
        """``first_seq != 0`` stands for a producer whose state the broker lost."""
        self.clients.append(Client(pid=100 + len(self.clients), next_seq=first_seq))

    @precondition(lambda self: bool(self.clients))
    @rule(data=st.data(), batches=st.lists(st.tuples(st.integers(1, 4), DELIVERED),
                                           min_size=1, max_size=6))
    def send(self, data: st.DataObject, batches: list[tuple[int, bool]]) -> None:
        """A pipeline of requests; some are lost before they reach the broker."""
        client = data.draw(st.sampled_from(self.clients), label="client")
        for count, delivered in batches:
            sent = Sent(self.next_batch_id, client.pid, client.epoch, client.next_seq, count)
            self.next_batch_id += 1
            client.next_seq = (client.next_seq + count) % (INT32_MAX + 1)
            client.sent.append(sent)
            if delivered:
                self.deliver(sent)

    @precondition(lambda self: any(c.sent for c in self.clients))
    @rule(data=st.data(), backs=st.lists(st.integers(1, 8), min_size=1, max_size=6))
    def retry(self, data: st.DataObject, backs: list[int]) -> None:
        """Resend batches whose responses were lost: recent ones mostly, in any order."""
        client = data.draw(st.sampled_from([c for c in self.clients if c.sent]), label="client")
        for back in backs:
            self.deliver(client.sent[-min(back, len(client.sent))])

    @rule(
        action=st.sampled_from(["bump_epoch", "plain", "snapshot", "replay",
                                "snapshot+replay", "truncate"]),
        data=st.data(),
    )
    def maintain(self, action: str, data: st.DataObject) -> None:
        """The rarer events, in one rule so that sends and retries dominate."""
        if action == "bump_epoch":
            self.bump_epoch(data)
        elif action == "plain":
            self.now_ms += 1
            count = data.draw(st.integers(1, 3), label="count")
            self.state.commit_append(header(-1, -1, -1, count), self.log_end,
                                     self.log_end + count - 1, self.now_ms)
            self.log.append(Written(Sent(self.next_batch_id, -1, -1, -1, count), self.log_end))
            self.next_batch_id += 1
        elif action == "truncate":
            self.truncate(data)
        else:
            self.restart(action, data)

    def bump_epoch(self, data: st.DataObject) -> None:
        """KIP-360: the client bumps its epoch and restarts its sequences at 0."""
        if self.clients:
            client = data.draw(st.sampled_from(self.clients), label="client")
            client.epoch += 1
            client.next_seq = 0

    def restart(self, how: str, data: st.DataObject) -> None:
        stored = [w.stored for w in self.log]
        if how == "snapshot":
            restored = ProducerStateManager.from_bytes(self.state.to_bytes())
            assert restored == self.state
        else:
            cut = data.draw(st.integers(0, len(stored)), label="cut") if how != "replay" else 0
            restored = ProducerStateManager()
            restored.rebuild(stored[:cut], self.now_ms)
            restored = ProducerStateManager.from_bytes(restored.to_bytes())
            restored.rebuild(stored[cut:], self.now_ms)
            assert _normalized(restored) == _normalized(self.state)
        self.state = restored

    def truncate(self, data: st.DataObject) -> None:
        """A follower drops an unacknowledged tail when the leader changes."""
        if not self.log:
            return
        keep = data.draw(st.integers(max(0, len(self.log) - 4), len(self.log) - 1), label="keep")
        self.log = self.log[:keep]
        if not self.state.truncate_to(self.log_end):
            self.state = ProducerStateManager()
            self.state.rebuild((w.stored for w in self.log), self.now_ms)
        assert self.state.end_offset == self.log_end

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def every_batch_is_written_at_most_once(self) -> None:
        ids = [w.sent.batch_id for w in self.log]  # plain batches have unique ids too
        assert len(ids) == len(set(ids))

    @invariant()
    def state_matches_the_model(self) -> None:
        assert self.state.end_offset == self.log_end
        pids = {w.sent.pid for w in self.log if w.sent.pid >= 0}
        assert {e.producer_id for e in self.state.entries()} == pids
        for pid in pids:
            history = [w for w in self.log if w.sent.pid == pid]
            epoch = history[-1].sent.epoch
            window = [w for w in history if w.sent.epoch == epoch][-BATCHES_TO_RETAIN:]
            entry = self.state.get(pid)
            assert entry is not None and entry.epoch == epoch
            assert [(b.first_seq, b.last_seq, b.first_offset) for b in entry.batches] == [
                (w.sent.first_seq, w.sent.last_seq, w.first_offset) for w in window
            ]


IdempotentProducerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=60, deadline=None
)
TestIdempotentProducer = IdempotentProducerMachine.TestCase
