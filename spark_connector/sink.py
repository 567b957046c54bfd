"""The sink: `df.write.format("raftlog")` and `df.writeStream.format("raftlog")`.

Two delivery guarantees (option `raftlog.sink.guarantee`):

* **exactly_once** (the default of `writeStream`): each Spark task writes its part of a
  micro-batch in one Kafka transaction whose `transactional.id` is
  `raftlog-spark-<queryId>-<partitionId>`, so the task's next incarnation (a retried attempt,
  or the replay after a restart) fences the earlier one and aborts whatever it left open.
  Inside the same transaction the task commits a *progress marker*: offset `batchId + 1` of
  partition 0 of the marker topic, for the synthetic consumer group
  `raftlog-spark-sink-<queryId>-<partitionId>` (TxnOffsetCommit, as Kafka Streams stores its
  progress). The rows and the marker become visible atomically, so "was batch n already
  written by this partition?" is answered by the marker alone: a replayed task that finds
  its marker at n or beyond publishes nothing. See `TransactionalTask`.
* **at_least_once** (the only guarantee of batch writes): a plain acks=all Producer; a failed
  task is retried by Spark and a failed micro-batch is replayed, both of which can publish
  duplicates.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from spark_connector.cluster import client_config_error
from spark_connector.errors import RaftLogOptionError, RaftLogWriteError
from spark_connector.options import (
    DEFAULT_DELIVERY_TIMEOUT_MS,
    DEFAULT_TRANSACTION_TIMEOUT_MS,
    EXACTLY_ONCE,
    GUARANTEE,
    MARKER_TOPIC,
    ClientSettings,
    SinkOptions,
)
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


def check_stream_sink(sink: SinkOptions) -> None:
    """The exactly-once sink keys its progress markers on partition 0 of an existing topic:
    the 'topic' option, or 'raftlog.sink.markerTopic' when rows name their own topics."""
    if sink.resolve_guarantee(streaming=True) == EXACTLY_ONCE and sink.marker is None:
        raise RaftLogOptionError(
            MARKER_TOPIC, "the exactly_once sink needs the 'topic' option or, when a 'topic'"
            " column routes the rows, 'raftlog.sink.markerTopic' (an existing topic whose"
            f" partition 0 keys the progress markers); or set '{GUARANTEE}' to"
            " 'at_least_once'")


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
    skipped: bool = False  # exactly-once: a replay of a batch this partition already wrote
    transactions: int = 0  # exactly-once: transactions begun (> 1 after a retried one)


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
    """How one at-least-once write task's rows reach the log."""

    def send(self, rows: SinkRows) -> None: ...

    def finish(self) -> int:
        """Make everything sent durable; return the number of records; raise on failure."""
        ...

    def close(self) -> None: ...


def _produce_rows(producer: Producer, rows: SinkRows) -> int:
    """Hand every row to librdkafka; return the count. Raises KafkaException as is."""
    produce = producer.produce
    poll = producer.poll
    count = 0
    for topic, value, key, partition, headers in zip(
            rows.topics, rows.values, rows.keys, rows.partitions, rows.headers, strict=False):
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
        count += 1
        if count % 10_000 == 0:
            poll(0)
    return count


def _delivery_timeout_ms(client: ClientSettings, default_ms: int) -> int:
    extra = dict(client.extra)
    return int(extra.get("message.timeout.ms", extra.get("delivery.timeout.ms", default_ms)))


def _new_producer(client: ClientSettings, conf: dict[str, Any]) -> Producer:
    try:
        return Producer(conf)
    except (KafkaException, ValueError) as exc:
        raise client_config_error("kafka.", exc) or RaftLogWriteError(
            f"raftlog: cannot create a producer for {client.bootstrap_servers}: {exc}"
        ) from None


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
        self.flush_timeout_s = _delivery_timeout_ms(client, DEFAULT_DELIVERY_TIMEOUT_MS) / 1000.0 \
            + 10.0
        self.producer = _new_producer(client, client.config(**{
            "acks": "all",
            # Idempotent: librdkafka's own retries do not duplicate (Spark's still can).
            "enable.idempotence": True,
            # Java's default partitioner: the same key lands where a Java client puts it.
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            "message.timeout.ms": DEFAULT_DELIVERY_TIMEOUT_MS,
            "delivery.report.only.error": True,
            "on_delivery": self._delivered,
        }))

    def _delivered(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.failed += 1
            if self.first_error is None:
                self.first_error = (f"{message.topic()}-{message.partition()}: {error.str()}")

    def send(self, rows: SinkRows) -> None:
        try:
            self.sent += _produce_rows(self.producer, rows)
        except KafkaException as exc:
            raise RaftLogWriteError(f"raftlog: producing at {self.client.bootstrap_servers}"
                                    f" failed: {exc.args[0].str()}") from None

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
    """The at-least-once publisher (exactly-once tasks run TransactionalTask instead)."""
    return AtLeastOncePublisher(sink.client, task)


# -- exactly-once ---------------------------------------------------------------------------

TXN_ATTEMPTS_MAX = 5  # transactions one task may begin before it gives up (then Spark decides)
TXN_RETRY_BACKOFF_S = 0.5
NO_MARKER = -1


def transactional_id(query_id: str, partition_id: int) -> str:
    """Stable across restarts of the query (the query id lives in the checkpoint), so a new
    incarnation of a task fences the old one."""
    return f"raftlog-spark-{query_id}-{partition_id}"


def marker_group(query_id: str, partition_id: int) -> str:
    """The synthetic consumer group whose committed offset is this partition's progress."""
    return f"raftlog-spark-sink-{query_id}-{partition_id}"


class TransactionalTask:
    """One exactly-once write task: its rows and its progress marker in one transaction.

    1. `init_transactions()` with the (query, partition) transactional.id: fences every older
       incarnation and completes (commits or aborts) any transaction it left open, so the
       marker read next is final.
    2. Read the marker (read_committed: OffsetFetch with require_stable). If it says this
       partition already wrote batch `batchId` or a later one, this is a replay: drain the
       rows and publish nothing.
    3. Otherwise begin, produce the rows as they arrive, add the marker (offset batchId + 1)
       with send_offsets_to_transaction, commit. The task returns only after the commit.

    The Arrow batches are kept until the commit so that a transaction aborted by the cluster
    (a partition leader or the transaction coordinator failing over) can be redone inside the
    task, up to TXN_ATTEMPTS_MAX times, instead of failing it: a task holds its share of one
    micro-batch in memory, as Arrow.
    """

    def __init__(self, sink: SinkOptions, columns: dict[str, str], task: TaskIdentity) -> None:
        if task.query_id is None or task.batch_id is None:
            raise RaftLogWriteError("raftlog: the exactly_once sink runs only inside a streaming"
                                    " query (no query id or batch id in the task context)")
        marker = sink.marker
        if marker is None:
            raise RaftLogOptionError(MARKER_TOPIC, "not set, and no 'topic' option")
        self.sink = sink
        self.columns = columns
        self.task = task
        self.query_id: str = task.query_id
        self.batch_id: int = task.batch_id
        self.marker = KafkaTopicPartition(marker, 0)
        self.txn_id = transactional_id(self.query_id, task.partition_id)
        self.group = marker_group(self.query_id, task.partition_id)
        self.timeout_s = sink.client.api_timeout_s
        self.where = f"{self.txn_id} at {sink.client.bootstrap_servers}"

    def _producer(self) -> Producer:
        client = self.sink.client
        raw = dict(client.extra).get("transaction.timeout.ms", "")
        # A malformed value is left to librdkafka, which names the property.
        txn_timeout_ms = int(raw) if raw.isdigit() else DEFAULT_TRANSACTION_TIMEOUT_MS
        timeout_ms = _delivery_timeout_ms(client, txn_timeout_ms)
        return _new_producer(client, client.config(**{
            "transactional.id": self.txn_id,
            "transaction.timeout.ms": txn_timeout_ms,
            # librdkafka requires message.timeout.ms <= transaction.timeout.ms.
            "message.timeout.ms": min(timeout_ms, txn_timeout_ms),
            "acks": "all",
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            "log_level": 3,  # fencing of zombies is expected here; errors are raised instead
        }))

    def _consumer(self) -> Consumer:
        conf = self.sink.client.config(**{
            "group.id": self.group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",  # OffsetFetch require_stable
            "log_level": 3,
        })
        for key in list(conf):  # producer-only properties the user may have set
            if key in ("acks", "linger.ms", "compression.type", "message.timeout.ms",
                       "delivery.timeout.ms", "transaction.timeout.ms", "batch.size",
                       "enable.idempotence", "partitioner", "retries", "batch.num.messages"):
                conf.pop(key)
        return Consumer(conf)

    def _retrying(self, what: str, call: Callable[[float], Any]) -> Any:
        """Repeat `call(timeout_s)` while it fails with a retriable error, until the deadline."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return call(max(1.0, deadline - time.monotonic()))
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.retriable() and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                raise

    def _committed_batch(self, consumer: Consumer) -> int:
        """The last batch id this (query, partition) committed, or NO_MARKER."""
        found = self._retrying("reading the progress marker",
                               lambda t: consumer.committed([self.marker], timeout=t))
        position = found[0]
        if position.error is not None:
            raise RaftLogWriteError(f"raftlog: reading the progress marker of {self.where}"
                                    f" ({self.marker.topic}-0) failed: {position.error.str()}")
        offset = int(position.offset)
        return offset - 1 if offset >= 0 else NO_MARKER

    def run(self, batches: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        try:
            return self._run(batches)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                KafkaError.INVALID_PRODUCER_EPOCH):
                raise RaftLogWriteError(
                    f"raftlog: writer {self.where} was fenced by a newer incarnation of this"
                    f" task (a retried attempt or a restarted query); batch {self.batch_id}"
                    " is left to it") from None
            raise RaftLogWriteError(f"raftlog: transactional write of batch {self.batch_id}"
                                    f" by {self.where} failed: {error.str()}") from None

    def _run(self, batches: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        producer = self._producer()
        consumer = self._consumer()
        try:
            self._retrying("initializing transactions", producer.init_transactions)
            done = self._committed_batch(consumer)
            if done >= self.batch_id:
                drained = sum(b.num_rows for b in batches)
                log.info("raftlog: %s already committed batch %d (marker at %d): skipping %d"
                         " replayed rows", self.txn_id, self.batch_id, done, drained)
                return self._message(0, skipped=True, transactions=0)
            rows, transactions = self._write(producer, consumer, batches)
            return self._message(rows, skipped=False, transactions=transactions)
        except BaseException:
            # An open transaction is aborted by the next incarnation's init_transactions (or
            # after transaction.timeout.ms); purge so that nothing more is sent meanwhile.
            producer.purge()
            raise
        finally:
            consumer.close()

    def _write(self, producer: Producer, consumer: Consumer,
               batches: Iterator[pa.RecordBatch]) -> tuple[int, int]:
        kept: list[pa.RecordBatch] = []
        metadata = consumer.consumer_group_metadata()
        marker = KafkaTopicPartition(
            self.marker.topic, 0, self.batch_id + 1,
            metadata=f"raftlog-spark-sink query={self.query_id} batch={self.batch_id}")
        for attempt in range(1, TXN_ATTEMPTS_MAX + 1):
            rows = 0
            try:
                producer.begin_transaction()
                for batch in kept:
                    rows += _produce_rows(producer, _rows(batch, self.columns, self.sink.topic))
                for batch in batches:
                    kept.append(batch)
                    rows += _produce_rows(producer, _rows(batch, self.columns, self.sink.topic))
                self._retrying("adding the progress marker",
                               lambda t: producer.send_offsets_to_transaction(
                                   [marker], metadata, t))
                self._retrying("committing", producer.commit_transaction)
                return rows, attempt
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if not error.txn_requires_abort() or attempt == TXN_ATTEMPTS_MAX:
                    raise
                log.warning("raftlog: %s: transaction %d of batch %d aborted (%s); retrying",
                            self.txn_id, attempt, self.batch_id, error.str())
                self._retrying("aborting", producer.abort_transaction)
                time.sleep(TXN_RETRY_BACKOFF_S * attempt)
        raise AssertionError("unreachable")

    def _message(self, rows: int, *, skipped: bool, transactions: int) -> SinkCommitMessage:
        return SinkCommitMessage(rows, self.task.partition_id, self.task.attempt, self.query_id,
                                 self.batch_id, skipped, transactions)


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
               batches: Iterator[pa.RecordBatch], *, streaming: bool) -> SinkCommitMessage:
    task = TaskIdentity.current()
    if sink.resolve_guarantee(streaming=streaming) == EXACTLY_ONCE:
        return TransactionalTask(sink, columns, task).run(batches)
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
        return write_task(self.sink, self.columns, iterator, streaming=False)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        rows, _ = _total(messages)
        log.info("raftlog: wrote %d records", rows)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        rows, failed = _total(messages)
        log.warning("raftlog: write failed in %d task(s); %d records of the successful tasks"
                    " stay published (at-least-once: there is no rollback)", failed, rows)


class RaftLogStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("raftlog")`: exactly-once by default (see TransactionalTask),
    at-least-once with raftlog.sink.guarantee=at_least_once."""

    def __init__(self, sink: SinkOptions, schema: StructType) -> None:
        self.sink = sink
        self.columns = _column_names(schema)
        self.guarantee = sink.resolve_guarantee(streaming=True)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return write_task(self.sink, self.columns, iterator, streaming=True)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Exactly-once: every task committed its own transaction before returning (the driver
        # cannot finish another process's transaction; Kafka has no hand-over), so there is
        # nothing left to do here. This runs in a fresh process per batch (reference, s. 4).
        rows, _ = _total(messages)
        skipped = sum(1 for m in messages if isinstance(m, SinkCommitMessage) and m.skipped)
        log.info("raftlog: micro-batch %d wrote %d records (%s; %d task(s) skipped as"
                 " replays)", batchId, rows, self.guarantee, skipped)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        rows, failed = _total(messages)
        if self.guarantee == EXACTLY_ONCE:
            log.warning("raftlog: micro-batch %d failed in %d task(s); the replay skips the"
                        " partitions that committed (%d records) and fences the rest", batchId,
                        failed, rows)
            return
        log.warning("raftlog: micro-batch %d failed in %d task(s); %d records stay published"
                    " and the batch will be replayed (at-least-once: duplicates)", batchId,
                    failed, rows)
