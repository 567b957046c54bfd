"""The sink: `df.write.format("raftlog")` and `df.writeStream.format("raftlog")`.

Delivery is **at-least-once**: each Spark task publishes its rows with a confluent-kafka
Producer (acks=all) and returns only after every record is acknowledged; a failed task is
retried by Spark and a failed micro-batch is replayed, both of which can publish duplicates.

Exactly-once needs Kafka transactions, which raftlog does not have yet. The seam for it is
`open_task_publisher()`: the only place that decides how a task's rows reach the log. The
design for the transactional publisher (one transactional producer per query + Spark
partition, batches skipped after a replay by (query id, batch id)) is in
spark_connector/README.md. Nothing here pretends to be exactly-once.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from spark_connector.cluster import client_config_error
from spark_connector.errors import RaftLogOptionError, RaftLogWriteError
from spark_connector.options import DEFAULT_DELIVERY_TIMEOUT_MS, ClientSettings, SinkOptions
from spark_connector.schema import SINK_COLUMNS

log = logging.getLogger("spark_connector")


# -- validation (driver) --------------------------------------------------------------------


def check_sink_schema(schema: StructType, sink: SinkOptions, overwrite: bool) -> None:
    """Spark's Kafka sink rules: a STRING/BINARY `value`, optional `key` (STRING/BINARY),
    `topic` (STRING, unless the 'topic' option is set), `partition` (INT) and `headers`
    (ARRAY<STRUCT<key: STRING, value: BINARY>>); other columns are ignored."""
    if overwrite:
        raise RaftLogOptionError("mode", "'overwrite' is not supported: a topic is an"
                                 " append-only log; use mode('append')")
    fields = {f.name.lower(): f for f in schema.fields}
    if "value" not in fields:
        raise RaftLogOptionError("value", "the DataFrame to write needs a 'value' column"
                                 f" (STRING or BINARY); it has {schema.simpleString()}")
    for name, accepted in SINK_COLUMNS.items():
        field = fields.get(name)
        if field is not None and field.dataType not in accepted:
            raise RaftLogOptionError(
                name, f"column '{field.name}' has type {field.dataType.simpleString()}; expected"
                f" {' or '.join(t.simpleString() for t in accepted)}")
    if "topic" not in fields and sink.topic is None:
        raise RaftLogOptionError("topic", "set the 'topic' option or give the DataFrame a"
                                 " 'topic' column")


def _column_names(schema: StructType) -> dict[str, str]:
    """Sink role -> the DataFrame's column name (matched case-insensitively, like Spark)."""
    return {f.name.lower(): f.name for f in schema.fields if f.name.lower() in SINK_COLUMNS}


# -- the task side (executors) --------------------------------------------------------------


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What one write task reports to the driver (must not be None: reference, pitfall 7)."""

    rows: int
    partition_id: int
    attempt: int
    query_id: str | None = None
    batch_id: int | None = None


@dataclass(frozen=True)
class TaskIdentity:
    """Which Spark task is writing. For streams, (query_id, batch_id) is the replay-stable key
    that an exactly-once publisher dedupes on (query_id survives restarts)."""

    partition_id: int
    attempt: int
    query_id: str | None
    batch_id: int | None

    @classmethod
    def current(cls) -> TaskIdentity:
        ctx = TaskContext.get()
        if ctx is None:  # outside Spark (direct calls in tests)
            return cls(0, 0, None, None)
        batch = ctx.getLocalProperty("streaming.sql.batchId")
        return cls(ctx.partitionId(), ctx.attemptNumber(),
                   ctx.getLocalProperty("sql.streaming.queryId"),
                   int(batch) if batch is not None else None)


@dataclass
class SinkRows:
    """One Arrow batch as Python columns, ready for Producer.produce()."""

    topics: Iterable[str | None]
    values: Sequence[bytes | str | None]
    keys: Iterable[bytes | str | None]
    partitions: Iterable[int | None]
    headers: Iterable[list[tuple[str, str | bytes | None]] | None]


class TaskPublisher(Protocol):
    """How one write task's rows reach the log. Implementations: AtLeastOncePublisher (now);
    a transactional one once raftlog has transactions (see README)."""

    def send(self, rows: SinkRows) -> None: ...

    def finish(self) -> int:
        """Make everything sent durable; return the number of records; raise on failure."""
        ...

    def close(self) -> None: ...


class AtLeastOncePublisher:
    """A confluent-kafka Producer with acks=all. `finish()` returns only when every record is
    acknowledged; any delivery failure fails the task (Spark retries it: duplicates possible).
    """

    def __init__(self, client: ClientSettings, task: TaskIdentity) -> None:
        self.client = client
        self.task = task
        self.sent = 0
        self.failed = 0
        self.first_error: str | None = None
        timeout_ms = int(dict(client.extra).get(
            "message.timeout.ms", dict(client.extra).get("delivery.timeout.ms",
                                                          DEFAULT_DELIVERY_TIMEOUT_MS)))
        self.flush_timeout_s = timeout_ms / 1000.0 + 10.0
        conf = client.config(**{
            "acks": "all",
            # raftlog has no idempotent producers yet (InitProducerId is not served).
            "enable.idempotence": False,
            # Java's default partitioner: the same key lands where a Java client puts it.
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            "message.timeout.ms": DEFAULT_DELIVERY_TIMEOUT_MS,
            "delivery.report.only.error": True,
            "on_delivery": self._delivered,
        })
        try:
            self.producer = Producer(conf)
        except (KafkaException, ValueError) as exc:
            raise client_config_error("kafka.", exc) or RaftLogWriteError(
                f"raftlog: cannot create a producer for {client.bootstrap_servers}: {exc}"
            ) from None

    def _delivered(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.failed += 1
            if self.first_error is None:
                self.first_error = (f"{message.topic()}-{message.partition()}: {error.str()}")

    def send(self, rows: SinkRows) -> None:
        produce = self.producer.produce
        poll = self.producer.poll
        count = 0
        for topic, value, key, partition, headers in zip(
                rows.topics, rows.values, rows.keys, rows.partitions, rows.headers,
                strict=False):
            if topic is None:
                raise RaftLogWriteError("raftlog: a row has a null 'topic' and the option"
                                        " 'topic' is not set")
            while True:
                try:
                    produce(topic, value=value, key=key,
                            partition=-1 if partition is None else partition, headers=headers)
                    break
                except BufferError:  # local queue full: let librdkafka drain it
                    poll(0.05)
                except KafkaException as exc:
                    raise RaftLogWriteError(f"raftlog: producing to {topic!r} at"
                                            f" {self.client.bootstrap_servers} failed:"
                                            f" {exc.args[0].str()}") from None
            count += 1
            if count % 10_000 == 0:
                poll(0)
        self.sent += count

    def finish(self) -> int:
        started = time.monotonic()
        remaining = self.producer.flush(self.flush_timeout_s)
        if remaining:
            raise RaftLogWriteError(
                f"raftlog: {remaining} of {self.sent} records not acknowledged by"
                f" {self.client.bootstrap_servers} after {time.monotonic() - started:.0f} s")
        if self.failed:
            raise RaftLogWriteError(
                f"raftlog: {self.failed} of {self.sent} records failed at"
                f" {self.client.bootstrap_servers}; first: {self.first_error}")
        return self.sent

    def close(self) -> None:
        # Undelivered records are abandoned with the producer; the task is failing anyway.
        self.producer.purge()


def open_task_publisher(sink: SinkOptions, task: TaskIdentity) -> TaskPublisher:
    """THE EXACTLY-ONCE SEAM. Today every task, batch or streaming, gets the at-least-once
    publisher. The transactional publisher described in spark_connector/README.md plugs in
    here for streaming tasks (task.query_id and task.batch_id are set), and
    RaftLogStreamWriter.commit() is where its driver half goes."""
    return AtLeastOncePublisher(sink.client, task)


def _rows(batch: pa.RecordBatch, columns: dict[str, str], topic: str | None) -> SinkRows:
    n = batch.num_rows

    def column(role: str) -> list[Any] | None:
        name = columns.get(role)
        return batch.column(name).to_pylist() if name is not None else None

    values = column("value")
    assert values is not None
    keys = column("key")
    topics = column("topic") if topic is None else None
    partitions = column("partition")
    raw_headers = column("headers")
    headers: list[list[tuple[str, str | bytes | None]] | None] | None = None
    if raw_headers is not None:
        headers = [None if hs is None else [(h["key"], h["value"]) for h in hs]
                   for hs in raw_headers]
    none: Iterable[None] = itertools.repeat(None, n)
    return SinkRows(
        topics=topics if topics is not None else itertools.repeat(topic, n),
        values=values,
        keys=keys if keys is not None else none,
        partitions=partitions if partitions is not None else itertools.repeat(None, n),
        headers=headers if headers is not None else itertools.repeat(None, n),
    )


def write_task(sink: SinkOptions, columns: dict[str, str],
               batches: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
    task = TaskIdentity.current()
    publisher = open_task_publisher(sink, task)
    try:
        for batch in batches:
            publisher.send(_rows(batch, columns, sink.topic))
        rows = publisher.finish()
    except BaseException:
        publisher.close()
        raise
    return SinkCommitMessage(rows, task.partition_id, task.attempt, task.query_id,
                             task.batch_id)


def _total(messages: Sequence[WriterCommitMessage | None]) -> tuple[int, int]:
    done = [m for m in messages if isinstance(m, SinkCommitMessage)]
    return sum(m.rows for m in done), len(messages) - len(done)


# -- the writers Spark sees -----------------------------------------------------------------


class RaftLogBatchWriter(DataSourceArrowWriter):
    """`df.write.format("raftlog").mode("append")`: at-least-once."""

    def __init__(self, sink: SinkOptions, schema: StructType) -> None:
        self.sink = sink
        self.columns = _column_names(schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return write_task(self.sink, self.columns, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        rows, _ = _total(messages)
        log.info("raftlog: wrote %d records", rows)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        rows, failed = _total(messages)
        log.warning("raftlog: write failed in %d task(s); %d records of the successful tasks"
                    " stay published (at-least-once: there is no rollback)", failed, rows)


class RaftLogStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("raftlog")`: at-least-once. A replayed micro-batch (after a
    failure between the tasks' writes and Spark's commit log) is published again."""

    delivery_guarantee = "at-least-once"

    def __init__(self, sink: SinkOptions, schema: StructType) -> None:
        self.sink = sink
        self.columns = _column_names(schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return write_task(self.sink, self.columns, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Driver half of the seam: at-least-once has nothing left to do here (every record is
        # already acknowledged). The transactional design keeps this a no-op too; see README.
        rows, _ = _total(messages)
        log.info("raftlog: micro-batch %d wrote %d records", batchId, rows)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        rows, failed = _total(messages)
        log.warning("raftlog: micro-batch %d failed in %d task(s); %d records stay published"
                    " and the batch will be replayed (at-least-once: duplicates)", batchId,
                    failed, rows)
