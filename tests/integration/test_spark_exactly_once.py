"""Exactly-once through Spark: read_committed input, the transactional sink, a query killed in
the middle of a micro-batch and restarted, and a partition leader SIGKILLed under a running
query. Real raftlog processes, real Spark (local[2], the session shared with the other
test_spark_* modules; the killed query runs in its own Spark process)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the Spark connector tests need pyspark (the [spark] extra)")

from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from pyspark.sql import SparkSession

from spark_connector.cluster import Cluster
from spark_connector.offsets import OffsetRange
from spark_connector.options import ClientSettings
from spark_connector.read import ReadSettings, _RangeReader
from tests.integration.cluster_harness import Cluster as Cluster3
from tests.integration.cluster_harness import cluster3, wait_until
from tests.integration.conftest import BrokerProcess
from tests.integration.spark_support import (
    REPO_ROOT,
    create_topic,
    produce,
    spark_session,
    start_copy_query,
)

__all__ = ["cluster3"]  # the fixture, imported for pytest


@pytest.fixture(scope="session")
def spark() -> SparkSession:
    """The one SparkSession of the pytest run (shared with the other test_spark_* modules)."""
    return spark_session()


def _values(spark: SparkSession, bootstrap: str, topic: str,
            isolation: str = "read_committed") -> list[str]:
    rows = (spark.read.format("raftlog").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic).option("isolation.level", isolation).load()
            .selectExpr("CAST(value AS STRING) AS v").collect())
    return [r.v for r in rows]


def _txn_producer(bootstrap: str, txn_id: str) -> Any:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id,
                         "transaction.timeout.ms": 60000, "linger.ms": 5})
    producer.init_transactions(30)
    return producer


def _in_txn(producer: Any, topic: str, values: list[str], *, commit: bool) -> None:
    producer.begin_transaction()
    for i, value in enumerate(values):
        producer.produce(topic, value.encode(), f"k{i}".encode())
    if commit:
        producer.commit_transaction(30)
    else:
        producer.flush(30)  # in the log, then aborted: the markers must hide them
        producer.abort_transaction(30)


def test_read_committed_never_sees_aborted_records(spark: SparkSession, broker: BrokerProcess,
                                                   tmp_path: Path) -> None:
    bootstrap = broker.bootstrap
    create_topic(bootstrap, "txn-in", 2)
    producer = _txn_producer(bootstrap, "spark-rc-test")
    committed = [f"c{i}" for i in range(300)]
    aborted = [f"a{i}" for i in range(200)]
    _in_txn(producer, "txn-in", committed[:100], commit=True)
    _in_txn(producer, "txn-in", aborted[:100], commit=False)
    produce(bootstrap, "txn-in", ({"value": f"p{i}".encode()} for i in range(50)))
    _in_txn(producer, "txn-in", committed[100:200], commit=True)
    _in_txn(producer, "txn-in", aborted[100:], commit=False)
    plain = [f"p{i}" for i in range(50)]

    # An open transaction while the queries run: under read_committed the end offsets are
    # the last stable offset, so none of it may be read (it is aborted afterwards).
    producer.begin_transaction()
    for i in range(30):
        producer.produce("txn-in", f"open{i}".encode())
    producer.flush(30)

    batch = _values(spark, bootstrap, "txn-in")
    assert sorted(batch) == sorted(committed[:200] + plain)
    everything = _values(spark, bootstrap, "txn-in", "read_uncommitted")
    assert {v for v in everything if v.startswith(("a", "open"))}  # the test can fail
    assert len(everything) == 200 + 50 + 200 + 30

    query = (spark.readStream.format("raftlog").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", "txn-in").option("startingOffsets", "earliest").load()
             .selectExpr("CAST(value AS STRING) AS v").writeStream.format("parquet")
             .option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120), "the availableNow query did not finish"
    assert query.exception() is None, query.exception()
    producer.abort_transaction(30)
    _in_txn(producer, "txn-in", committed[200:], commit=True)
    query = (spark.readStream.format("raftlog").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", "txn-in").option("startingOffsets", "earliest").load()
             .selectExpr("CAST(value AS STRING) AS v").writeStream.format("parquet")
             .option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120), "the availableNow query did not finish"
    assert query.exception() is None, query.exception()
    streamed = [r.v for r in spark.read.parquet(str(tmp_path / "out")).collect()]
    assert Counter(streamed) == Counter(committed + plain)


class CommittedCount:
    """How many records of `topic` are committed (read_committed), read incrementally."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "eos-counter",
                                  "enable.auto.commit": False,
                                  "isolation.level": "read_committed"})
        self.consumer.assign([KafkaTopicPartition(topic, p, 0) for p in range(partitions)])
        self.count = 0

    def poll(self, wait_s: float = 0.05) -> int:
        while True:
            messages = self.consumer.consume(1000, timeout=wait_s)
            self.count += sum(1 for m in messages if m.error() is None)
            if not messages:
                return self.count
            wait_s = 0.0


def _rows_through(checkpoint: Path, batch: int) -> int:
    """Input rows consumed by batches 0..batch: the end offsets in Spark's offset log (the
    input topic has no transaction markers, so offsets count records)."""
    source = json.loads((checkpoint / "offsets" / str(batch)).read_text().splitlines()[2])
    return sum(sum(partitions.values()) for partitions in source.values())


def _batches(checkpoint: Path, kind: str) -> set[int]:
    folder = checkpoint / kind
    if not folder.is_dir():
        return set()
    return {int(p.name) for p in folder.iterdir() if p.name.isdigit()}


def test_query_killed_mid_batch_and_restarted_writes_each_row_once(
        spark: SparkSession, broker: BrokerProcess, tmp_path: Path) -> None:
    bootstrap = broker.bootstrap
    create_topic(bootstrap, "eos-in", 3)
    create_topic(bootstrap, "eos-out", 2)
    inputs = [f"v{i}" for i in range(1_500)]
    produce(bootstrap, "eos-in", ({"key": f"k{i}".encode(), "value": v.encode()}
                                  for i, v in enumerate(inputs)))
    checkpoint = tmp_path / "checkpoint"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    with (tmp_path / "child.log").open("wb") as log:
        child = subprocess.Popen(
            [sys.executable, "-c", "from tests.integration.spark_support import"
             " copy_query_child; copy_query_child()", bootstrap, "eos-in", "eos-out",
             str(checkpoint), "300", "0.01"],
            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)  # its own process group: the JVM and the Python workers
    output = CommittedCount(bootstrap, "eos-out", 2)
    try:
        # The dangerous moment: batch n is planned, not in Spark's commit log, and some of
        # its tasks have already committed their transactions (more output than the batches
        # before n produced). A replay that does not skip them duplicates their rows.
        def mid_batch() -> bool:
            assert child.poll() is None, (tmp_path / "child.log").read_text()[-3000:]
            done, planned = _batches(checkpoint, "commits"), _batches(checkpoint, "offsets")
            return (bool(done) and bool(planned - done)
                    and output.poll() > _rows_through(checkpoint, max(done)))

        wait_until(mid_batch, 150, "the child query to be in the middle of a batch",
                   interval_s=0.02)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(30)
    killed_in = max(_batches(checkpoint, "offsets"))
    before = _rows_through(checkpoint, killed_in - 1)
    assert killed_in not in _batches(checkpoint, "commits")
    assert before < output.poll(0.5) < _rows_through(checkpoint, killed_in)
    output.consumer.close()
    query = start_copy_query(spark, bootstrap, "eos-in", "eos-out", checkpoint,
                             max_offsets=300, trigger={"availableNow": True})
    assert query.awaitTermination(180), "the restarted query did not finish"
    assert query.exception() is None, query.exception()
    assert min(p["batchId"] for p in query.recentProgress) == killed_in  # a replay

    out = _values(spark, bootstrap, "eos-out")
    duplicates = {v: n for v, n in Counter(out).items() if n > 1}
    assert not duplicates, f"{len(duplicates)} rows written more than once"
    assert sorted(out) == sorted(inputs)


def _leader(cluster: Cluster3, topic: str, partition: int) -> int:
    return int(cluster.partition(topic, partition).leader_id)


def test_partition_leader_killed_under_a_streaming_query_loses_and_duplicates_nothing(
        spark: SparkSession, cluster3: Cluster3, tmp_path: Path) -> None:
    bootstrap = cluster3.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for topic, partitions in (("fo-in", 3), ("fo-out", 2)):
        admin.create_topics([NewTopic(topic, partitions, 3)])[topic].result(timeout=30)
    half = 2_000
    killed, produced = threading.Event(), threading.Event()
    errors: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            errors.append(error.str())

    def feed() -> None:
        """Half the records before the kill, half during and after the failover."""
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                             "acks": "all", "linger.ms": 5, "on_delivery": delivered})
        for i in range(2 * half):
            if i == half:
                producer.flush(60)
                killed.wait(180)
            producer.produce("fo-in", f"v{i}".encode(), f"k{i}".encode())
            if i % 100 == 0:
                producer.poll(0)
                time.sleep(0.1)  # ~1,000 records/s
        if producer.flush(120) != 0:
            errors.append("unflushed records")
        produced.set()

    def copied() -> int:
        return len(_values(spark, cluster3.live_bootstrap(), "fo-out"))

    checkpoint = tmp_path / "checkpoint"
    query = start_copy_query(spark, bootstrap, "fo-in", "fo-out", checkpoint,
                             trigger={"processingTime": "500 milliseconds"})
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    restarts = 0
    try:
        wait_until(lambda: sum(p["numInputRows"] for p in query.recentProgress) >= 500,
                   120, "the query to copy its first rows", interval_s=0.2)
        victim = _leader(cluster3, "fo-in", 0)
        controller = cluster3.quorum_leader()
        # Long-lived clients that learnt the old leader, as the driver's offset lookups and
        # an executor's watermark lookup have: they must find the new one (regression: both
        # timed out until their deadline, since librdkafka kept asking the dead leader).
        settings = ClientSettings(bootstrap, (), api_timeout_ms=30_000)
        driver = Cluster(settings, "read_committed")
        tps = [("fo-in", p) for p in range(3)]
        driver.latest(tps)
        executor = Consumer(ReadSettings(settings, "read_committed", True, False, 30_000,
                                         "test").consumer_config())
        executor.get_watermark_offsets(KafkaTopicPartition("fo-in", 0), timeout=10)
        try:
            cluster3.nodes[victim].kill()
            killed.set()
            killed_at = time.monotonic()
            # Not at once: right after the kill a request fails fast (connection refused)
            # and librdkafka refreshes by itself; later ones wait for the dead broker.
            time.sleep(3.0)
            assert set(driver.latest(tps)) == set(tps)
            low, _ = _RangeReader(ReadSettings(settings, "read_committed", True, False,
                                               30_000, "test"),
                                  OffsetRange("fo-in", 0, 0, 1), executor)._watermarks()
            assert low == 0
        finally:
            driver.close()
            executor.close()
        # Wait for the feed and for the copy to catch up; a query that fails in the
        # failover is restarted from its checkpoint, as an operator (or a supervisor) would.
        deadline = time.monotonic() + 180
        while not (produced.is_set() and copied() >= 2 * half):
            assert time.monotonic() < deadline, "the copy did not catch up in time"
            if query.exception() is not None or not query.isActive:
                restarts += 1
                assert restarts <= 3, f"the query kept failing: {query.exception()}"
                query = start_copy_query(spark, bootstrap, "fo-in", "fo-out", checkpoint,
                                         trigger={"processingTime": "500 milliseconds"})
            time.sleep(1.0)
        caught_up_s = time.monotonic() - killed_at
        time.sleep(2.0)  # a few more triggers: nothing may be written twice meanwhile
    finally:
        query.stop()
        feeder.join(10)
    assert not errors, errors[:3]
    assert _leader(cluster3, "fo-in", 0) != victim
    out = _values(spark, cluster3.live_bootstrap(), "fo-out")
    duplicates = {v: n for v, n in Counter(out).items() if n > 1}
    assert not duplicates, f"{len(duplicates)} rows written more than once ({restarts} restarts)"
    assert sorted(out) == sorted(f"v{i}" for i in range(2 * half))
    print(f"leader {victim} killed (controller: {controller}); {restarts} query restart(s);"
          f" caught up {caught_up_s:.1f} s after the kill")


@pytest.mark.parametrize(("options", "expected"), [
    ({"raftlog.sink.guarantee": "twice"},
     "option 'raftlog.sink.guarantee': expected 'exactly_once' or 'at_least_once', got 'twice'"),
    ({"raftlog.sink.guarante": "exactly_once"},
     "option 'raftlog.sink.guarante': unknown option for writing; did you mean"
     " 'raftlog.sink.guarantee'"),
])
def test_bad_stream_sink_options_fail_the_query_before_it_writes(
        spark: SparkSession, broker: BrokerProcess, tmp_path: Path, options: dict[str, str],
        expected: str) -> None:
    create_topic(broker.bootstrap, "bad-in", 1)
    create_topic(broker.bootstrap, "bad-out", 1)
    produce(broker.bootstrap, "bad-in", ({"value": b"x"} for _ in range(10)))
    writer = (spark.readStream.format("raftlog")
              .option("kafka.bootstrap.servers", broker.bootstrap).option("subscribe", "bad-in")
              .option("startingOffsets", "earliest").load().select("value")
              .writeStream.format("raftlog").option("kafka.bootstrap.servers", broker.bootstrap)
              .option("topic", "bad-out")
              .option("checkpointLocation", str(tmp_path / "checkpoint")))
    for name, value in options.items():
        writer = writer.option(name, value)
    query = writer.trigger(availableNow=True).start()
    with pytest.raises(Exception, match=re.escape(expected)):
        query.awaitTermination(120)
    assert _values(spark, broker.bootstrap, "bad-out", "read_uncommitted") == []
