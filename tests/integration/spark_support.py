"""Shared pieces of the Spark connector tests: one local[2] SparkSession for the whole pytest
run (JVM start-up and the first query's worker warm-up cost ~15 s, so it is paid once), plus
small confluent-kafka helpers to create topics, produce and read back.

Import this module only after `pytest.importorskip("pyspark")`.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    NewPartitions,
    NewTopic,
)
from pyspark.sql import SparkSession

REPO_ROOT = Path(__file__).resolve().parents[2]

_session: SparkSession | None = None


def spark_session() -> SparkSession:
    """The process-wide SparkSession (created on first use, stopped at exit)."""
    global _session
    if _session is not None:
        return _session
    if shutil.which("java") is None:
        pytest.skip("the Spark connector tests need a Java runtime (java not on PATH)")
    # Workers must run this venv's Python (pyarrow, confluent-kafka, the connector).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # `pyspark_raftlog` (the auto-registration module) sits at the repository root. An
    # installed wheel puts it in site-packages; the editable install only maps packages, so
    # put the root on the workers' path explicitly rather than rely on pytest's cwd.
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    session = (
        SparkSession.builder.master("local[2]")
        .appName("raftlog-connector-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .config("spark.sql.streaming.stopTimeout", "10s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    _session = session
    atexit.register(session.stop)
    return session


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=15)


def recreate_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Delete `topic`, then create it again (empty) once the deletion has gone through."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(timeout=15)
    deadline = time.monotonic() + 15
    while True:
        try:
            admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=15)
            return
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def add_partitions(bootstrap: str, topic: str, total: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(topic, total)])[topic].result(timeout=15)


def produce(bootstrap: str, topic: str, records: Iterable[dict[str, Any]]) -> int:
    """Produce records given as dicts of produce() keyword arguments; return the count."""
    failures: list[Any] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(error)

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "enable.idempotence": False, "partitioner": "murmur2_random"})
    count = 0
    for record in records:
        producer.produce(topic, on_delivery=delivered, **record)
        count += 1
        if count % 5_000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0, "records left unacknowledged"
    assert not failures, failures[:3]
    return count


def start_copy_query(spark: SparkSession, bootstrap: str, source: str, target: str,
                     checkpoint: Path, *, max_offsets: int | None = None,
                     row_delay_s: float = 0.0, trigger: dict[str, Any] | None = None) -> Any:
    """source -> target through the raftlog sink (exactly-once, the streaming default).
    `row_delay_s` slows every row down in a Python UDF (to widen the window in which a
    micro-batch's transactions are open); the output rows do not depend on it."""
    from pyspark.sql import functions as F

    reader = (spark.readStream.format("raftlog").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", source).option("startingOffsets", "earliest"))
    if max_offsets is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets))
    df = reader.load()
    value = F.col("value")
    if row_delay_s > 0:
        def slow(v: bytes) -> bytes:
            time.sleep(row_delay_s)
            return v

        value = F.udf(slow, "binary")(value)
    return (df.select("key", value.alias("value")).writeStream.format("raftlog")
            .option("kafka.bootstrap.servers", bootstrap).option("topic", target)
            .option("checkpointLocation", str(checkpoint))
            .trigger(**(trigger or {"processingTime": "200 milliseconds"})).start())


def copy_query_child() -> None:
    """Entry point of the child process that the kill tests SIGKILL mid-batch:
    `python -c 'from tests.integration.spark_support import copy_query_child;
    copy_query_child()' BOOTSTRAP SOURCE TARGET CHECKPOINT MAX_OFFSETS ROW_DELAY_S`."""
    bootstrap, source, target, checkpoint, max_offsets, delay = sys.argv[1:7]
    global _session
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    _session = (
        SparkSession.builder.master("local[2]").appName("raftlog-kill-child")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        # Small Arrow batches: the sink receives rows while the slow UDF still works, so a
        # task's transaction stays open for most of the task.
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
        .config("spark.sql.execution.pythonUDF.arrow.enabled", "false")
        .getOrCreate())
    _session.sparkContext.setLogLevel("ERROR")
    query = start_copy_query(_session, bootstrap, source, target, Path(checkpoint),
                             max_offsets=int(max_offsets), row_delay_s=float(delay))
    print("child: query started", flush=True)
    query.awaitTermination()
