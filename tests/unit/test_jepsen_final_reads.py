"""When the harness's final reads stop, without a broker: stand-ins for the two librdkafka
consumers (the read_committed reader and the read_uncommitted watermark probe) replay what a
cluster would answer. The real-node cases are in ``tests/jepsen/test_final_reads.py``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from jepsen.runner import Recorder
from jepsen.workloads.queue import _poll_to_ends

pytest.importorskip("confluent_kafka")

TOPIC = "jepsen"


@dataclass
class Message:
    partition_index: int
    offset_value: int

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return self.partition_index

    def offset(self) -> int:
        return self.offset_value

    def value(self) -> bytes:
        return str(1000 + self.offset_value).encode()


@dataclass
class Reader:
    """Hands out ``batches`` one per ``consume``; positions are what was consumed (or a
    librdkafka invalid offset, -1001, before anything was)."""

    batches: list[list[Message]]
    positions: dict[int, int] = field(default_factory=dict)
    markers_end: dict[int, int] = field(default_factory=dict)  # where control records end

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        if not self.batches:
            # librdkafka moves the position past control records without returning them.
            self.positions.update(self.markers_end)
            time.sleep(0.01)
            return []
        batch = self.batches.pop(0)
        for m in batch:
            self.positions[m.partition_index] = m.offset_value + 1
        return batch

    def position(self, partitions: list[Any]) -> list[Any]:
        for tp in partitions:
            tp.offset = self.positions.get(tp.partition, -1001)
        return partitions


@dataclass
class Probe:
    """High watermarks per partition; ``None`` makes the lookup fail as on a timeout."""

    high: dict[int, int | None]
    calls: int = 0

    def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        self.calls += 1
        high = self.high[tp.partition]
        if high is None:
            raise RuntimeError("KafkaError{code=_TIMED_OUT}")
        return 0, high


@pytest.fixture
def recorder(tmp_path: Path) -> Iterator[Recorder]:
    r = Recorder(tmp_path / "history.jsonl")
    yield r
    r.close()


def _run(recorder: Recorder, reader: Reader, probe: Probe, keys: list[str],
         budget_s: float) -> str | None:
    return _poll_to_ends(reader, probe, recorder, 0, keys, TOPIC, time.monotonic() + budget_s)


def test_stops_once_every_position_reaches_a_fresh_high_watermark(recorder: Recorder) -> None:
    # Partition 0 ends in a commit marker at offset 2.
    reader = Reader([[Message(0, 0), Message(0, 1)], [Message(1, 0)]], markers_end={0: 3})
    probe = Probe({0: 3, 1: 1})
    assert _run(recorder, reader, probe, ["jepsen-0", "jepsen-1"], 5.0) is None
    assert probe.calls >= 4  # the ends were read once more before stopping


def test_a_position_held_below_the_high_watermark_runs_to_the_deadline(recorder: Recorder) -> None:
    # What an open transaction does: the read_committed reader cannot pass its first record.
    reader = Reader([[Message(0, 0)]])
    probe = Probe({0: 5})
    started = time.monotonic()
    note = _run(recorder, reader, probe, ["jepsen-0"], 0.5)
    assert time.monotonic() - started >= 0.5
    assert note is not None and "'jepsen-0': (1, 5)" in note


def test_an_end_that_cannot_be_read_never_counts_as_caught_up(recorder: Recorder) -> None:
    reader = Reader([[Message(0, 0)]])
    probe = Probe({0: 1, 1: None})  # partition 1 is empty but its end is unknown
    note = _run(recorder, reader, probe, ["jepsen-0", "jepsen-1"], 0.5)
    assert note is not None and "'jepsen-1': (0, 'unknown')" in note
    assert "jepsen-0" not in note


def test_an_end_that_becomes_readable_lets_the_reads_finish(recorder: Recorder) -> None:
    reader = Reader([[Message(0, 0)]])
    probe = Probe({0: 1, 1: None})

    original = probe.get_watermark_offsets

    def recovering(tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        if probe.calls >= 2:
            probe.high[1] = 0  # the partition's leader answers again: it is empty
        return original(tp, timeout, cached)

    probe.get_watermark_offsets = recovering  # type: ignore[method-assign]
    assert _run(recorder, reader, probe, ["jepsen-0", "jepsen-1"], 10.0) is None
