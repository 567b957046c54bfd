"""The `raftlog` Spark source against a real raftlog node (Spark local[2], one shared session).

`format("raftlog")` is used without any `spark.dataSource.register()` call: PySpark finds it
through the top-level `pyspark_raftlog` module.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark connector tests need pyspark (the [spark] extra)")

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from tests.integration.conftest import BrokerProcess
from tests.integration.spark_support import (
    add_partitions,
    create_topic,
    produce,
    recreate_topic,
    spark_session,
)

TOPIC = "events"


@pytest.fixture(scope="session")
def spark() -> SparkSession:
    """The one SparkSession of the pytest run (shared with the other test_spark_* modules)."""
    return spark_session()


def _stream(spark: SparkSession, broker: BrokerProcess, **options: str) -> DataFrame:
    reader = (spark.readStream.format("raftlog")
              .option("kafka.bootstrap.servers", broker.bootstrap))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def _run_available_now(df: DataFrame, out: Path, checkpoint: Path) -> list[int]:
    """Run one availableNow query into a Parquet sink; return each batch's input row count."""
    query = (df.selectExpr("CAST(value AS STRING) AS value", "partition", "offset")
             .writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(120), "the availableNow query did not finish in 120 s"
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def test_available_now_reads_everything_then_exactly_the_new_records(
        spark: SparkSession, broker: BrokerProcess, tmp_path: Path) -> None:
    create_topic(broker.bootstrap, TOPIC, 3)
    produce(broker.bootstrap, TOPIC,
            ({"key": f"k{i}".encode(), "value": f"v{i}".encode()} for i in range(10_000)))
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    df = _stream(spark, broker, subscribe=TOPIC, startingOffsets="earliest")

    batches = _run_available_now(df, out, checkpoint)
    rows = spark.read.parquet(str(out))
    assert sum(batches) == 10_000
    assert rows.count() == 10_000
    assert rows.select("partition", "offset").distinct().count() == 10_000
    assert {r.value for r in rows.select("value").collect()} == {f"v{i}" for i in range(10_000)}
    assert rows.select("partition").distinct().count() == 3

    # A fourth partition and more records, then a restart from the checkpoint: exactly the
    # new records, the new partition included, no replay. The limit splits the availableNow
    # run into several micro-batches (Spark passes the source's default read limit under
    # AvailableNow).
    add_partitions(broker.bootstrap, TOPIC, 4)
    produce(broker.bootstrap, TOPIC,
            ({"key": f"k{i}".encode(), "value": f"v{i}".encode(), "partition": i % 4}
             for i in range(10_000, 12_500)))
    df = _stream(spark, broker, subscribe=TOPIC, startingOffsets="earliest",
                 maxOffsetsPerTrigger="1000")
    batches = _run_available_now(df, out, checkpoint)
    assert sum(batches) == 2_500
    assert batches == [1_000, 1_000, 500], batches  # 4 x 250 per trigger, then the rest
    rows = spark.read.parquet(str(out))
    assert rows.count() == 12_500
    assert rows.select("partition", "offset").distinct().count() == 12_500
    assert {r.value for r in rows.select("value").collect()} == {f"v{i}" for i in range(12_500)}
    assert rows.where("partition = 3").count() == 625


def test_batch_read_with_offset_json_and_all_columns(spark: SparkSession,
                                                     broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, TOPIC, 3)
    produce(broker.bootstrap, TOPIC, (
        {"key": f"k{i}".encode(), "value": f"v{i}".encode(), "partition": i % 3,
         "headers": [("n", str(i).encode()), ("empty", None)], "timestamp": 1_700_000_000_000 + i}
        for i in range(300)))
    starting = json.dumps({TOPIC: {"0": 10, "1": -2, "2": 50}})
    ending = json.dumps({TOPIC: {"0": 20, "1": -1, "2": 60}})
    df = (spark.read.format("raftlog").option("kafka.bootstrap.servers", broker.bootstrap)
          .option("subscribe", TOPIC).option("startingOffsets", starting)
          .option("endingOffsets", ending).option("includeHeaders", "true").load())
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp",
                          "timestampType", "headers"]
    rows = df.collect()
    got = sorted((r.partition, r.offset) for r in rows)
    expected = sorted([(0, o) for o in range(10, 20)] + [(1, o) for o in range(100)]
                      + [(2, o) for o in range(50, 60)])
    assert got == expected
    row = next(r for r in rows if r.partition == 2 and r.offset == 50)
    i = 50 * 3 + 2  # the 50th record of partition 2
    assert (bytes(row.key), bytes(row.value), row.topic) == (f"k{i}".encode(),
                                                            f"v{i}".encode(), TOPIC)
    assert int(row.timestamp.timestamp() * 1000) == 1_700_000_000_000 + i
    assert row.timestampType == 0  # CreateTime
    assert [(h.key, None if h.value is None else bytes(h.value)) for h in row.headers] == [
        ("n", str(i).encode()), ("empty", None)]

    # assign + startingTimestamp: the same partitions, from a point in time (the broker's
    # time index answers at batch granularity, so only a lower bound is asserted).
    df = (spark.read.format("raftlog").option("kafka.bootstrap.servers", broker.bootstrap)
          .option("assign", json.dumps({TOPIC: [1]}))
          .option("startingTimestamp", str(1_700_000_000_000 + 150)).load())
    offsets = [r.offset for r in df.select("offset").collect()]
    assert offsets and max(offsets) == 99 and min(offsets) <= 50


def test_a_recreated_topic_is_data_loss_unless_failOnDataLoss_is_false(
        spark: SparkSession, broker: BrokerProcess, tmp_path: Path) -> None:
    create_topic(broker.bootstrap, "lossy", 1)
    produce(broker.bootstrap, "lossy", ({"value": b"old"} for _ in range(50)))
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    assert sum(_run_available_now(_stream(spark, broker, subscribe="lossy",
                                          startingOffsets="earliest"), out, checkpoint)) == 50

    recreate_topic(broker.bootstrap, "lossy", 1)  # the checkpoint says 50, the log ends at 5
    produce(broker.bootstrap, "lossy", ({"value": b"new"} for _ in range(5)))
    with pytest.raises(Exception, match=r"went back from 50 to 5.*failOnDataLoss"):
        _run_available_now(_stream(spark, broker, subscribe="lossy"), out, checkpoint)

    # Allowed: the query continues from the log's new end, as Spark's Kafka source does.
    lenient = {"subscribe": "lossy", "failOnDataLoss": "false"}
    assert _run_available_now(_stream(spark, broker, **lenient), out, checkpoint) == []
    produce(broker.bootstrap, "lossy", ({"value": b"newer"} for _ in range(3)))
    assert sum(_run_available_now(_stream(spark, broker, **lenient), out, checkpoint)) == 3
    rows = spark.read.parquet(str(out)).where("value = 'newer'").collect()
    assert sorted(r.offset for r in rows) == [5, 6, 7]


@pytest.mark.parametrize(("options", "expected"), [
    ({"subscribe": TOPIC, "startingOffset": "earliest"},
     "option 'startingoffset': unknown option for reading; did you mean 'startingOffsets'"),
    ({"subscribe": TOPIC, "startingOffsets": '{"events": {"0": 1'},
     "option 'startingOffsets': malformed JSON"),
    ({"subscribe": TOPIC, "startingOffsets": '{"events": {"0": 0}}'},
     "option 'startingOffsets': must give an offset for every subscribed partition"),
    ({"subscribe": TOPIC, "endingOffsets": '{"events": {"0": 5, "1": -1, "2": -1}}'},
     "option 'endingOffsets': offset 5 of events-0 is beyond the end of its log (0)"),
    ({"subscribe": "no-such-topic"}, "option 'subscribe': topic(s) no-such-topic not found"),
    ({"assign": '{"events": [0, 7]}'}, "option 'assign': partition(s) events-7 not found"),
    ({"subscribe": TOPIC, "subscribePattern": "e.*"},
     "exactly one of 'subscribe', 'subscribePattern' or 'assign'"),
    ({"subscribe": TOPIC, "maxOffsetsPerTrigger": "10"},
     "option 'maxOffsetsPerTrigger': applies to streaming queries only"),
    ({"subscribe": TOPIC, "startingOffsets": "latest"},
     "option 'startingOffsets': 'latest' is not allowed as the start of a batch query"),
    ({"subscribe": TOPIC, "kafka.no.such.property": "1"}, "option 'kafka.no.such.property'"),
    ({"subscribe": TOPIC, "failOnDataLoss": "maybe"},
     "option 'failOnDataLoss': expected 'true' or 'false'"),
])
def test_bad_read_options_name_the_option(spark: SparkSession, broker: BrokerProcess,
                                          options: dict[str, str], expected: str) -> None:
    create_topic(broker.bootstrap, TOPIC, 3)
    reader = spark.read.format("raftlog").option("kafka.bootstrap.servers", broker.bootstrap)
    for name, value in options.items():
        reader = reader.option(name, value)
    with pytest.raises(Exception, match=_escape(expected)):
        reader.load().collect()


def test_unreachable_cluster_and_stream_only_rules(spark: SparkSession,
                                                  broker: BrokerProcess) -> None:
    reader = (spark.readStream.format("raftlog").option("kafka.bootstrap.servers", "127.0.0.1:9")
              .option("subscribe", TOPIC).option("kafka.default.api.timeout.ms", "2000"))
    with pytest.raises(Exception, match=_escape(
            "cannot reach the cluster at kafka.bootstrap.servers='127.0.0.1:9'")):
        reader.load()
    with pytest.raises(Exception, match=_escape("option 'kafka.bootstrap.servers': is required")):
        spark.readStream.format("raftlog").option("subscribe", TOPIC).load()
    # Batch-only options are caught when the stream reader is created, as the query starts.
    create_topic(broker.bootstrap, TOPIC, 1)
    query = (_stream(spark, broker, subscribe=TOPIC, endingOffsets="latest")
             .writeStream.format("noop").start())
    try:
        with pytest.raises(StreamingQueryException, match=_escape(
                "option 'endingOffsets': applies to batch queries only")):
            query.awaitTermination(60)
    finally:
        query.stop()


def _escape(text: str) -> str:
    return re.escape(text)
