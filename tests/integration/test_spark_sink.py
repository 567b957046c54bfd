"""The `raftlog` Spark sink against a real raftlog node, read back through the source: batch
writes and the at-least-once streaming mode (the exactly-once default is tested in
test_spark_exactly_once.py). Shares the process-wide SparkSession of spark_support."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark connector tests need pyspark (the [spark] extra)")

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from tests.integration.conftest import BrokerProcess
from tests.integration.spark_support import create_topic, produce, spark_session


@pytest.fixture(scope="session")
def spark() -> SparkSession:
    """The one SparkSession of the pytest run (shared with the other test_spark_* modules)."""
    return spark_session()


def _read(spark: SparkSession, broker: BrokerProcess, topic: str) -> DataFrame:
    return (spark.read.format("raftlog").option("kafka.bootstrap.servers", broker.bootstrap)
            .option("subscribe", topic).option("includeHeaders", "true").load())


def test_batch_write_then_read_back(spark: SparkSession, broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "out", 3)
    create_topic(broker.bootstrap, "other", 1)
    rows = [(f"k{i}", f"v{i}", i % 3, [("n", str(i).encode())] if i % 2 else None)
            for i in range(200)]
    df = spark.createDataFrame(rows, "key STRING, value STRING, partition INT,"
                                     " headers ARRAY<STRUCT<key: STRING, value: BINARY>>")
    (df.write.format("raftlog").option("kafka.bootstrap.servers", broker.bootstrap)
     .option("topic", "out").mode("append").save())

    back = _read(spark, broker, "out").collect()
    assert len(back) == 200
    got = sorted((bytes(r.key).decode(), bytes(r.value).decode(), r.partition,
                  None if r.headers is None else [(h.key, bytes(h.value)) for h in r.headers])
                 for r in back)
    assert got == sorted((k, v, p, h) for k, v, p, h in rows)

    # A `topic` column routes rows when the option is absent; BINARY values pass unchanged.
    routed = spark.createDataFrame(
        [("other" if i % 4 == 0 else "out", bytes([i])) for i in range(40)],
        "topic STRING, value BINARY")
    (routed.write.format("raftlog").option("kafka.bootstrap.servers", broker.bootstrap)
     .mode("append").save())
    other = _read(spark, broker, "other").collect()
    assert sorted(bytes(r.value) for r in other) == [bytes([i]) for i in range(0, 40, 4)]
    assert _read(spark, broker, "out").count() == 200 + 30


def _wait_for_rows(query: StreamingQuery, rows: int, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while sum(p["numInputRows"] for p in query.recentProgress) < rows:
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"the query did not read {rows} rows in time"
        time.sleep(0.2)


def test_streaming_write_at_least_once_then_read_back(
        spark: SparkSession, broker: BrokerProcess, tmp_path: Path) -> None:
    create_topic(broker.bootstrap, "in", 3)
    create_topic(broker.bootstrap, "copy", 2)
    produce(broker.bootstrap, "in",
            ({"key": f"k{i}".encode(), "value": f"v{i}".encode()} for i in range(1_000)))
    query = (spark.readStream.format("raftlog")
             .option("kafka.bootstrap.servers", broker.bootstrap)
             .option("subscribe", "in").option("startingOffsets", "earliest").load()
             .selectExpr("key", "upper(CAST(value AS STRING)) AS value")
             .writeStream.format("raftlog")
             .option("kafka.bootstrap.servers", broker.bootstrap).option("topic", "copy")
             .option("raftlog.sink.guarantee", "at_least_once")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(processingTime="250 milliseconds").start())
    try:
        _wait_for_rows(query, 1_000)
        # Records produced while the query runs are picked up by the next triggers.
        produce(broker.bootstrap, "in", ({"key": f"k{i}".encode(), "value": f"v{i}".encode()}
                                         for i in range(1_000, 1_500)))
        _wait_for_rows(query, 1_500)
        # Idle: offsets are canonical JSON, so an unchanged log must not look like new data
        # (Spark compares the JSON strings): no further micro-batch may run.
        progress = query.lastProgress
        assert progress is not None
        last_batch = progress["batchId"]
        time.sleep(2.0)
        assert all(p["batchId"] <= last_batch for p in query.recentProgress)
    finally:
        query.stop()
    assert query.exception() is None, query.exception()

    back = _read(spark, broker, "copy").collect()
    # At-least-once allows duplicates after a failure; this run has none, so exact.
    assert sorted((bytes(r.key), bytes(r.value)) for r in back) == sorted(
        (f"k{i}".encode(), f"V{i}".encode()) for i in range(1_500))
    # Same key -> same partition (murmur2, as Java clients).
    partitions_by_key: dict[bytes, set[int]] = {}
    for r in back:
        partitions_by_key.setdefault(bytes(r.key), set()).add(r.partition)
    assert all(len(p) == 1 for p in partitions_by_key.values())


@pytest.mark.parametrize(("columns", "options", "mode", "expected"), [
    ("key STRING", {"topic": "out"}, "append", "needs a 'value' column"),
    ("value STRING", {}, "append", "option 'topic': set the 'topic' option or give"),
    ("value INT", {"topic": "out"}, "append", "column 'value' has type int"),
    ("value STRING", {"topic": "out"}, "overwrite", "'overwrite' is not supported"),
    ("value STRING", {"topic": "out", "subscribe": "x"}, "append",
     "option 'subscribe': is not an option for writing"),
    ("value STRING", {"topic": "out", "tpoic": "x"}, "append",
     "option 'tpoic': unknown option for writing; did you mean 'topic'"),
    ("value STRING", {"topic": "out", "kafka.transactional.id": "x"}, "append",
     "option 'kafka.transactional.id': not supported"),
    ("value STRING", {"topic": "out", "raftlog.sink.guarantee": "exactly_once"}, "append",
     "option 'raftlog.sink.guarantee': 'exactly_once' applies to streaming writes"),
    ("value STRING", {"topic": "out", "raftlog.sink.guarantee": "maybe"}, "append",
     "option 'raftlog.sink.guarantee': expected 'exactly_once' or 'at_least_once', got"
     " 'maybe'"),
])
def test_bad_write_options_fail_before_writing(
        spark: SparkSession, broker: BrokerProcess, columns: str, options: dict[str, str],
        mode: str, expected: str) -> None:
    create_topic(broker.bootstrap, "out", 1)
    value = 1 if "INT" in columns else "x"
    writer = (spark.createDataFrame([(value,)], columns).write.format("raftlog")
              .option("kafka.bootstrap.servers", broker.bootstrap).mode(mode))
    for name, setting in options.items():
        writer = writer.option(name, setting)
    with pytest.raises(Exception, match=re.escape(expected)):
        writer.save()
    assert _read(spark, broker, "out").count() == 0
