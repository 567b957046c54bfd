"""Executor side of the source: read one offset range [start, end) into Arrow record batches.

The range ends at an *offset*, not after a number of records: offsets can have gaps
(transaction markers, aborted records under read_committed, compacted-away keys), so the loop
stops once it has seen a record at or past `end - 1`, or the end-of-partition event at or past
`end`, never by counting. Records at or past `end` (fetched because the broker returns whole
batches) are dropped.

The consumer is a plain `assign()` consumer: enable.auto.commit=false, a unique group.id that
is never used for group membership, auto.offset.reset=error (a vanished offset is data loss,
not a silent jump).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KafkaTopicPartition

from spark_connector.errors import RaftLogDataLossError, RaftLogReadError
from spark_connector.offsets import OffsetRange
from spark_connector.options import ClientSettings, SourceOptions
from spark_connector.schema import source_arrow_schema

MAX_BATCH_ROWS = 10_000  # rows per Arrow batch (Spark's arrow.maxRecordsPerBatch default)
WATERMARK_ATTEMPT_S = 3.0  # one watermark lookup; see _RangeReader._watermarks
CONSUME_WAIT_S = 0.2  # one consume() call; the range's deadline is kafkaConsumer.pollTimeoutMs
_GONE = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION,
         KafkaError._UNKNOWN_TOPIC}
_US = pa.timestamp("us", tz="UTC")
_MS = pa.timestamp("ms", tz="UTC")

# Executor consumer tuning. librdkafka 2.x pauses a partition's fetching for
# fetch.queue.backoff.ms (default 1000 ms) whenever its local queue is over queued.min.messages
# (default 100,000, i.e. only ~10 MB of 100-byte records): a reader that drains the queue in
# 0.1 s then idles for 0.9 s. Measured here: ~200k rows/s with the defaults, 1M+ with these.
_FETCH_TUNING: dict[str, Any] = {
    "fetch.queue.backoff.ms": 10,
    "queued.min.messages": 500_000,
    "fetch.message.max.bytes": 4 << 20,
}


@dataclass(frozen=True)
class ReadSettings:
    """What an executor needs besides the range (pickled with the reader)."""

    client: ClientSettings
    isolation_level: str
    fail_on_data_loss: bool
    include_headers: bool
    poll_timeout_ms: int
    group_id_prefix: str

    @classmethod
    def from_options(cls, source: SourceOptions) -> ReadSettings:
        return cls(source.client, source.isolation_level, source.fail_on_data_loss,
                   source.include_headers, source.poll_timeout_ms, source.group_id_prefix)

    def consumer_config(self) -> dict[str, Any]:
        return self.client.config(**{
            **_FETCH_TUNING,
            "group.id": f"{self.group_id_prefix}-executor-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            "isolation.level": self.isolation_level,
        })


def read_range(settings: ReadSettings, part: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Yield the records of `part` as Arrow batches in the source schema."""
    consumer = Consumer(settings.consumer_config())
    try:
        yield from _RangeReader(settings, part, consumer).run()
    finally:
        consumer.close()


def _offset(message: Message) -> int:
    offset = message.offset()
    assert offset is not None  # only events without a position have none
    return offset


class _RangeReader:
    def __init__(self, settings: ReadSettings, part: OffsetRange, consumer: Consumer) -> None:
        self.settings = settings
        self.part = part
        self.consumer = consumer
        self.schema = source_arrow_schema(settings.include_headers)
        self.name = f"{part.topic}-{part.partition}"
        self.last_error: str | None = None

    def _data_loss(self, message: str) -> None:
        if self.settings.fail_on_data_loss:
            raise RaftLogDataLossError(message)

    def _watermarks(self) -> tuple[int, int]:
        tp = KafkaTopicPartition(self.part.topic, self.part.partition)
        deadline = time.monotonic() + self.settings.client.api_timeout_s
        while True:
            problem = "timed out"
            try:
                # Short attempts, each failed one followed by a metadata refresh: librdkafka
                # asks the leader in its metadata cache, and after a leader died that cache
                # is not corrected by the lookup's own failures (measured: a timeout until
                # the deadline while the cluster had long elected a new leader).
                marks = self.consumer.get_watermark_offsets(tp, timeout=max(
                    0.1, min(WATERMARK_ATTEMPT_S, deadline - time.monotonic())))
                if marks is not None:  # older confluent-kafka versions return None on timeout
                    return int(marks[0]), int(marks[1])
            except KafkaException as exc:
                problem = exc.args[0].str()
            if time.monotonic() >= deadline:
                raise RaftLogReadError(
                    f"raftlog: cannot list the offsets of {self.name} at"
                    f" {self.settings.client.bootstrap_servers}: {problem}")
            with contextlib.suppress(KafkaException):  # the next attempt says what is wrong
                self.consumer.list_topics(self.part.topic, timeout=WATERMARK_ATTEMPT_S)
            time.sleep(0.1)

    def run(self) -> Iterator[pa.RecordBatch]:
        start, end = self.part.start, self.part.end
        low, high = self._watermarks()
        if start < low:
            self._data_loss(f"offsets {start}..{min(low, end) - 1} of {self.name} are no"
                            f" longer in the log (it now starts at {low})")
            start = low
        if high < end:
            self._data_loss(f"{self.name} now ends at offset {high}, before the planned end"
                            f" {end} (truncated or re-created?)")
            end = high
        if start >= end:
            return
        self.consumer.assign([KafkaTopicPartition(self.part.topic, self.part.partition, start)])
        position = start
        idle_since = time.monotonic()
        while position < end:
            messages = self.consumer.consume(min(MAX_BATCH_ROWS, end - position),
                                             timeout=CONSUME_WAIT_S)
            records = [m for m in messages if m.error() is None]
            done, restart = False, None
            if len(records) != len(messages):
                done, restart = self._events([m for m in messages if m.error() is not None],
                                             end)
            if restart is not None:  # position deleted, and failOnDataLoss=false: skip ahead
                position = max(position, restart)
                self.consumer.assign([KafkaTopicPartition(self.part.topic, self.part.partition,
                                                          position)])
                continue
            if records:
                idle_since = time.monotonic()
                last = _offset(records[-1])
                if last >= end - 1:
                    done = True
                    if last >= end:
                        records = [m for m in records if _offset(m) < end]
                position = last + 1
                if records:
                    yield self._batch(records)
            if done:
                return
            waited_ms = (time.monotonic() - idle_since) * 1000
            if not records and waited_ms > self.settings.poll_timeout_ms:
                raise RaftLogReadError(
                    f"raftlog: no data from {self.name} at offset {position} for"
                    f" {waited_ms:.0f} ms (kafkaConsumer.pollTimeoutMs); reading"
                    f" [{self.part.start}, {self.part.end}) from"
                    f" {self.settings.client.bootstrap_servers}; last client error:"
                    f" {self.last_error or 'none'}")

    def _events(self, events: Sequence[Message], end: int) -> tuple[bool, int | None]:
        """Handle consumer events: (range complete?, offset to restart from or None)."""
        done, restart = False, None
        for event in events:
            error = event.error()
            assert error is not None
            code = error.code()
            if code == KafkaError._PARTITION_EOF:
                eof = event.offset()
                if eof is None or eof < end:
                    self._data_loss(f"{self.name} ends at offset {eof}, before the planned"
                                    f" end {end} (truncated or re-created?)")
                done = True
            elif code == KafkaError._AUTO_OFFSET_RESET:  # our position was deleted under us
                low, _ = self._watermarks()
                self._data_loss(f"offsets of {self.name} before {low} were deleted while"
                                f" reading [{self.part.start}, {self.part.end})")
                restart = low
            elif code in _GONE:
                self._data_loss(f"{self.name} disappeared while reading it: {error.str()}")
                done = True
            elif error.fatal():
                raise RaftLogReadError(f"raftlog: reading {self.name}: {error.str()}")
            else:
                # Transport errors and the like: librdkafka reconnects and retries by itself;
                # kafkaConsumer.pollTimeoutMs bounds how long we wait for it.
                self.last_error = error.str()
        return done, restart

    def _batch(self, records: Sequence[Message]) -> pa.RecordBatch:
        n = len(records)
        part = self.part
        stamps = [m.timestamp() for m in records]  # (type, ms); zip(*stamps) is 10x slower
        columns: list[pa.Array] = [
            pa.array([m.key() for m in records], pa.binary()),
            pa.array([m.value() for m in records], pa.binary()),
            pa.repeat(pa.scalar(part.topic, pa.string()), n),
            pa.repeat(pa.scalar(part.partition, pa.int32()), n),
            pa.array([m.offset() for m in records], pa.int64()),
            pa.array([s[1] for s in stamps], _MS).cast(_US),
            # librdkafka: 0 none, 1 CreateTime, 2 LogAppendTime; Kafka's ids are -1, 0, 1.
            pc.subtract(pa.array([s[0] for s in stamps], pa.int32()), pa.scalar(1, pa.int32())),
        ]
        if self.settings.include_headers:
            columns.append(pa.array([m.headers() for m in records],
                                    self.schema.field("headers").type))
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)
