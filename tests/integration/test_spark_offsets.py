"""Connector logic that needs neither Spark's JVM nor a broker: offset ranges with gaps
(transaction markers, compacted records: neither exists in raftlog yet, so a fake consumer
plays the log), canonical offset JSON, the maxOffsetsPerTrigger split and option parsing."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the Spark connector tests need pyspark (the [spark] extra)")

from confluent_kafka import KafkaError

from spark_connector import read as read_module
from spark_connector.errors import RaftLogDataLossError, RaftLogOptionError, RaftLogReadError
from spark_connector.offsets import OffsetRange, from_json, rate_limit, to_json
from spark_connector.options import (
    ClientSettings,
    check_batch_read,
    parse_sink_options,
    parse_source_options,
)
from spark_connector.read import ReadSettings, _RangeReader
from spark_connector.schema import source_arrow_schema


@dataclass
class FakeError:
    value: int

    def code(self) -> int:
        return self.value

    def str(self) -> str:
        return f"error {self.value}"

    def fatal(self) -> bool:
        return False

    def retriable(self) -> bool:
        return False


@dataclass
class FakeMessage:
    at: int
    event: FakeError | None = None

    def error(self) -> FakeError | None:
        return self.event

    def offset(self) -> int:
        return self.at

    def key(self) -> bytes:
        return f"k{self.at}".encode()

    def value(self) -> bytes:
        return f"v{self.at}".encode()

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000 + self.at)

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return None


@dataclass
class FakeConsumer:
    """A partition log whose record offsets may have gaps; serves `consume` like librdkafka:
    records from the assigned position, then one end-of-partition event at the high mark."""

    offsets: Sequence[int]
    low: int
    high: int
    queue: list[FakeMessage] = field(default_factory=list)
    calls: int = 0
    events_first: Sequence[FakeMessage] = ()  # e.g. transport errors before the records
    eof: bool = True

    def get_watermark_offsets(self, _tp: Any, timeout: float) -> tuple[int, int]:
        return self.low, self.high

    def assign(self, tps: list[Any]) -> None:
        position = tps[0].offset
        self.queue = [*self.events_first, *(FakeMessage(o) for o in self.offsets if o >= position)]
        if self.eof:
            self.queue.append(FakeMessage(self.high, FakeError(KafkaError._PARTITION_EOF)))

    def consume(self, n: int, timeout: float) -> list[FakeMessage]:
        self.calls += 1
        batch, self.queue = self.queue[:n], self.queue[n:]
        return batch


def _read(consumer: FakeConsumer, start: int, end: int, *, fail: bool = True,
          poll_timeout_ms: int = 1_000) -> list[int]:
    settings = ReadSettings(ClientSettings("127.0.0.1:1"), "read_committed", fail, False,
                            poll_timeout_ms, "test")
    reader = _RangeReader(settings, OffsetRange("t", 0, start, end), consumer)  # type: ignore[arg-type]
    batches = list(reader.run())
    for batch in batches:
        assert batch.schema.equals(source_arrow_schema(False))
    return [o for b in batches for o in b.column("offset").to_pylist()]


# Offsets 3, 6 and 8 are not records (say, transaction markers); the high watermark is 10.
GAPPY = [0, 1, 2, 4, 5, 7, 9]


@pytest.mark.parametrize(("start", "end", "expected"), [
    (0, 10, GAPPY),  # ends on a record (9 = end - 1)
    (2, 9, [2, 4, 5, 7]),  # ends in a gap: stops at the first record at or past the end
    (3, 4, []),  # a range holding only a marker
    (4, 8, [4, 5, 7]),
])
def test_ranges_end_at_offsets_not_record_counts(start: int, end: int,
                                                 expected: list[int]) -> None:
    assert _read(FakeConsumer(GAPPY, 0, 10), start, end) == expected


def test_a_range_ending_in_a_gap_at_the_high_watermark_ends_on_the_eof_event() -> None:
    consumer = FakeConsumer([0, 1, 2], 0, 4)  # offset 3 is a marker, high watermark 4
    assert _read(consumer, 0, 4) == [0, 1, 2]
    assert consumer.queue == []  # the end-of-partition event was consumed: no waiting


def test_vanished_offsets_are_data_loss_unless_allowed() -> None:
    with pytest.raises(RaftLogDataLossError, match="failOnDataLoss"):
        _read(FakeConsumer(range(5, 10), 5, 10), 0, 10)
    assert _read(FakeConsumer(range(5, 10), 5, 10), 0, 10, fail=False) == [5, 6, 7, 8, 9]
    with pytest.raises(RaftLogDataLossError, match="ends at offset 6"):
        _read(FakeConsumer(range(6), 0, 6), 0, 10)


def test_transient_errors_are_retried_until_the_poll_timeout() -> None:
    transport = FakeMessage(-1, FakeError(KafkaError._TRANSPORT))
    consumer = FakeConsumer(range(5), 0, 10, events_first=[transport], eof=False)
    with pytest.raises(RaftLogReadError, match=re.escape(
            "no data from t-0 at offset 5 for")) as caught:
        _read(consumer, 0, 10, poll_timeout_ms=200)
    assert f"last client error: error {KafkaError._TRANSPORT}" in str(caught.value)
    consumer = FakeConsumer(range(10), 0, 10, events_first=[transport])
    assert _read(consumer, 0, 10) == list(range(10))


def test_read_range_builds_full_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(read_module, "MAX_BATCH_ROWS", 4)
    settings = ReadSettings(ClientSettings("127.0.0.1:1"), "read_committed", True, True, 1_000,
                            "test")
    reader = _RangeReader(settings, OffsetRange("t", 0, 0, 10),
                          FakeConsumer(range(10), 0, 10))  # type: ignore[arg-type]
    batches = list(reader.run())
    assert [b.num_rows for b in batches] == [4, 4, 2]
    row = batches[1].to_pylist()[0]
    assert row["key"] == b"k4" and row["value"] == b"v4" and row["topic"] == "t"
    assert row["partition"] == 0 and row["timestampType"] == 0 and row["headers"] is None
    assert int(row["timestamp"].timestamp() * 1000) == 1_700_000_000_004


def test_offsets_json_is_canonical() -> None:
    a = to_json({("b", 10): 1, ("b", 2): 2, ("a", 0): 3})
    b = to_json(from_json(json.loads('{"b": {"10": 1, "2": 2}, "a": {"0": 3}}')))
    assert json.dumps(a) == json.dumps(b) == '{"a": {"0": 3}, "b": {"2": 2, "10": 1}}'


def test_max_offsets_per_trigger_is_split_by_backlog() -> None:
    start = {("t", 0): 0, ("t", 1): 100}
    latest = {("t", 0): 900, ("t", 1): 200, ("t", 2): 0}
    assert rate_limit(100, start, latest) == {("t", 0): 90, ("t", 1): 110, ("t", 2): 0}
    assert rate_limit(5_000, start, latest) == latest
    # A tiny share still advances (rounds up below 1), so no partition starves.
    assert rate_limit(2, {}, {("t", 0): 1_000, ("t", 1): 1})[("t", 1)] == 1


def _rejects(options: dict[str, str], text: str) -> None:
    with pytest.raises(RaftLogOptionError, match=re.escape(text)):
        check_batch_read(parse_source_options(options))


def test_option_parsing() -> None:
    base = {"kafka.bootstrap.servers": "h1:9092, h2:9093", "subscribe": "a,b,a"}
    source = parse_source_options({k.lower(): v for k, v in base.items()})
    assert source.client.bootstrap_servers == "h1:9092,h2:9093"
    assert source.subscription.topics == ("a", "b")
    assert source.isolation_level == "read_committed" and source.fail_on_data_loss
    _rejects({**base, "kafka.bootstrap.servers": "h1"}, "'kafka.bootstrap.servers': 'h1' is not")
    _rejects({**base, "startingoffsets": "earliest", "startingtimestamp": "1"},
             "conflicts with 'startingTimestamp'")
    _rejects({**base, "isolation.level": "serializable"}, "'isolation.level': expected")
    _rejects({**base, "kafka.auto.offset.reset": "earliest"},
             "'kafka.auto.offset.reset': not supported")
    _rejects({**base, "minoffsetspertrigger": "5"}, "'minOffsetsPerTrigger': not supported")
    _rejects({**base, "endingoffsets": '{"a": {"0": -2}}'}, "-2 (earliest) is not allowed")
    _rejects({**base, "assign": '{"a": [0]}'}, "exactly one of 'subscribe'")
    sink = parse_sink_options({"kafka.bootstrap.servers": "h:1", "topic": "out",
                               "kafka.linger.ms": "20", "checkpointlocation": "/tmp/x"})
    assert sink.topic == "out" and sink.client.extra == (("linger.ms", "20"),)



def _option_error(text: str) -> Any:
    return pytest.raises(RaftLogOptionError, match=re.escape(text))


def test_sink_guarantee_options() -> None:
    from spark_connector.sink import check_stream_sink

    base = {"kafka.bootstrap.servers": "h:1", "topic": "out"}
    sink = parse_sink_options(base)
    assert sink.resolve_guarantee(streaming=True) == "exactly_once"  # the stream default
    assert sink.resolve_guarantee(streaming=False) == "at_least_once"
    assert sink.marker == "out"
    check_stream_sink(sink)
    relaxed = parse_sink_options({**base, "raftlog.sink.guarantee": "AT-LEAST-ONCE"})
    assert relaxed.resolve_guarantee(streaming=True) == "at_least_once"
    exactly = parse_sink_options({**base, "raftlog.sink.guarantee": "exactly_once"})
    with _option_error("'raftlog.sink.guarantee': 'exactly_once' applies to streaming writes"):
        exactly.resolve_guarantee(streaming=False)
    with _option_error("'raftlog.sink.guarantee': expected 'exactly_once' or"):
        parse_sink_options({**base, "raftlog.sink.guarantee": "twice"})
    # Rows routed by a 'topic' column: the markers need a topic of their own.
    routed = parse_sink_options({"kafka.bootstrap.servers": "h:1"})
    with _option_error("'raftlog.sink.markerTopic': the exactly_once sink needs"):
        check_stream_sink(routed)
    marked = parse_sink_options({"kafka.bootstrap.servers": "h:1",
                                 "raftlog.sink.markertopic": "progress"})
    check_stream_sink(marked)
    assert marked.marker == "progress"
    with _option_error("'raftlog.sink.markerTopic': 'a b' is not a valid topic name"):
        parse_sink_options({**base, "raftlog.sink.markertopic": "a b"})
    with _option_error("'raftlog.sink.guarantee': is not an option for reading"):
        parse_source_options({"kafka.bootstrap.servers": "h:1", "subscribe": "a",
                              "raftlog.sink.guarantee": "exactly_once"})
