"""Hypothesis state machine over PartitionLog against a list-of-batches model.

Random appends (sizes, batch counts, timestamps), reads at random offsets and limits,
flushes, reopen, retention, truncation and torn tails. Every read must return the appended
batches byte-identical apart from the broker-rewritten baseOffset and partitionLeaderEpoch.
"""

from __future__ import annotations

import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from raftlog.partition.batch import build_batch, validate_batches
from raftlog.partition.log import LogConfig, PartitionLog

T0 = 1_700_000_000_000


@dataclass(frozen=True)
class Sent:
    base_offset: int
    leader_epoch: int
    original: bytes  # as the producer sent it

    @property
    def next_offset(self) -> int:
        return self.base_offset + validate_batches(self.original)[0].records_count


class PartitionLogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="raftlog-stateful-"))
        self.model: list[Sent] = []
        self.now_ms = T0
        self.epoch = 0
        self.config = LogConfig()
        self.log: PartitionLog | None = None

    @initialize(
        segment_bytes=st.integers(300, 3_000),
        index_interval_bytes=st.integers(0, 600),
        retention_bytes=st.integers(-1, 4_000),
    )
    def open_log(self, segment_bytes: int, index_interval_bytes: int, retention_bytes: int) -> None:
        self.config = LogConfig(
            segment_bytes=segment_bytes,
            index_interval_bytes=index_interval_bytes,
            retention_bytes=retention_bytes,
        )
        self.log = PartitionLog.open(self.root / "t-0", self.config, self.now_ms)

    @property
    def opened(self) -> PartitionLog:
        assert self.log is not None
        return self.log

    @rule(
        sizes=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 400)), min_size=1, max_size=3),
        timestamp_delta_ms=st.integers(-50, 100),
    )
    def append(self, sizes: list[tuple[int, int]], timestamp_delta_ms: int) -> None:
        self.now_ms += 10
        batches = [
            build_batch(
                [(b"k", bytes([i % 251]) * value_bytes, []) for i in range(count)],
                timestamp_ms=self.now_ms + timestamp_delta_ms,
            )
            for count, value_bytes in sizes
        ]
        info = self.opened.append(b"".join(batches), leader_epoch=self.epoch, now_ms=self.now_ms)
        offset = info.base_offset
        for original in batches:
            self.model.append(Sent(offset, self.epoch, original))
            offset = self.model[-1].next_offset
        assert offset == info.last_offset + 1 == self.opened.log_end_offset

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data(), max_bytes=st.integers(0, 3_000), min_one_batch=st.booleans())
    def read(self, data: st.DataObject, max_bytes: int, min_one_batch: bool) -> None:
        slot = data.draw(st.integers(0, len(self.model) - 1))
        sent = self.model[slot]
        offset = data.draw(st.integers(sent.base_offset, sent.next_offset - 1))
        with self.opened.read(offset, max_bytes, min_one_batch=min_one_batch) as result:
            stored = result.read_bytes()
        if not stored:
            assert not min_one_batch and len(sent.original) > max_bytes
            return
        assert len(stored) <= max_bytes or len(validate_batches(stored)) == 1
        position = 0
        returned = 0
        for expected in self.model[slot:]:
            if position == len(stored):
                break
            _assert_same_batch(stored[position : position + len(expected.original)], expected)
            position += len(expected.original)
            returned += 1
        assert position == len(stored), "a read returns whole batches only"
        self._check_read_was_maximal(slot + returned, len(stored), max_bytes)

    def _check_read_was_maximal(self, next_slot: int, read_bytes: int, max_bytes: int) -> None:
        """The batch after a read must not have fitted: it is in the next segment, or it
        would have exceeded max_bytes."""
        if next_slot == len(self.model):
            return
        following = self.model[next_slot]
        same_segment = following.base_offset not in self.opened.segment_base_offsets
        assert not same_segment or read_bytes + len(following.original) > max_bytes

    @rule(
        action=st.sampled_from(["flush", "flush", "reopen", "crash", "retention", "truncate"]),
        data=st.data(),
    )
    def maintain(self, action: str, data: st.DataObject) -> None:
        """One rule for the rarer operations, so that appends and reads dominate."""
        if action == "flush":
            self.flush()
        elif action == "reopen":
            self.reopen()
        elif action == "crash":
            self.crash_with_torn_tail(data.draw(st.integers(1, 500), label="cut_bytes"))
        elif action == "retention":
            self.retention()
        elif self.model:
            self.truncate(data)

    def flush(self) -> None:
        ticket = self.opened.begin_flush()
        if ticket is not None:
            ticket.run()
            self.opened.complete_flush(ticket)
        assert self.opened.flushed_offset == self.opened.log_end_offset

    def reopen(self) -> None:
        end_offset = self.opened.log_end_offset
        self.opened.close()
        self.log = PartitionLog.open(self.root / "t-0", self.config, self.now_ms)
        assert self.opened.log_end_offset == end_offset
        self.epoch += 1

    def crash_with_torn_tail(self, cut_bytes: int) -> None:
        """Lose the end of the active segment file, as an OS crash can."""
        log = self.opened
        active_base = log.segment_base_offsets[-1]
        log.close()
        path = self.root / "t-0" / f"{active_base:020d}.log"
        size = max(path.stat().st_size - cut_bytes, 0)
        with path.open("r+b") as file:
            file.truncate(size)
        kept = 0
        in_active = [s for s in self.model if s.base_offset >= active_base]
        for sent in in_active:
            if kept + len(sent.original) > size:
                self.model = self.model[: self.model.index(sent)]
                break
            kept += len(sent.original)
        self.log = PartitionLog.open(self.root / "t-0", self.config, self.now_ms)

    def retention(self) -> None:
        self.opened.enforce_retention(self.now_ms)
        start = self.opened.log_start_offset
        self.model = [sent for sent in self.model if sent.base_offset >= start]

    def truncate(self, data: st.DataObject) -> None:
        log = self.opened
        offset = data.draw(st.integers(log.log_start_offset, log.log_end_offset))
        end_offset = log.truncate_to(offset)
        self.model = [sent for sent in self.model if sent.next_offset <= offset]
        expected_end = self.model[-1].next_offset if self.model else log.log_start_offset
        assert end_offset == expected_end
        self.epoch += 1

    @invariant()
    def offsets_agree(self) -> None:
        if self.log is None:
            return
        expected_end = self.model[-1].next_offset if self.model else self.log.log_end_offset
        assert self.log.log_end_offset == expected_end
        assert self.log.log_start_offset <= self.log.log_end_offset
        if self.model:
            assert self.log.log_start_offset == self.model[0].base_offset

    @invariant()
    def log_matches_model(self) -> None:
        """Walk the whole log segment by segment; it must equal the model exactly."""
        if self.log is None:
            return
        offset = self.log.log_start_offset
        slot = 0
        while offset < self.log.log_end_offset:
            with self.log.read(offset, 1 << 20) as result:
                stored = result.read_bytes()
            for header in validate_batches(stored):
                sent = self.model[slot]
                _assert_same_batch(stored[: header.size_bytes], sent)
                stored = stored[header.size_bytes :]
                slot += 1
                offset = sent.next_offset
        assert slot == len(self.model)

    def teardown(self) -> None:
        if self.log is not None:
            self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)


def _assert_same_batch(stored: bytes, sent: Sent) -> None:
    original = sent.original
    assert len(stored) == len(original)
    assert struct.unpack_from(">q", stored, 0)[0] == sent.base_offset
    assert struct.unpack_from(">i", stored, 12)[0] == sent.leader_epoch
    assert stored[8:12] == original[8:12] and stored[16:] == original[16:]


PartitionLogMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=50, deadline=None
)
TestPartitionLog = PartitionLogMachine.TestCase
