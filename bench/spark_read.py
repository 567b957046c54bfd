"""Spark connector read throughput: `spark.read.format("raftlog")` vs the same rows in Parquet.

    python bench/spark_read.py [--records 1000000] [--partitions 4] [--record-bytes 100]
                               [--repeats 3] [--json out.json]

One raftlog node (default durability) gets a topic with --partitions partitions and --records
records of --record-bytes random bytes (no key), produced with confluent-kafka. A local[2]
SparkSession (the tests' configuration) then reads the whole topic through the connector, and,
in the same run, reads the same rows (all seven columns, written once by the connector's own
read) from a Parquet directory. Both reads are forced to the end with Spark's `noop` sink, so
every column of every row is materialised; Parquet's `count()` would only read footers.

One warm-up read of each comes first (JVM JIT and Python workers), then --repeats interleaved
pairs (raftlog, parquet, raftlog, parquet, ...). Printed: median and range of rows/s and MB/s of
payload, broker CPU and whole-box CPU during the raftlog reads, and PASS/MISS against the
target of 300,000 rows/s. It is a benchmark, not a test: the exit status is 0 whatever the
figures (2 when pyspark or Java is missing).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _raftlog_side import RaftlogNode
from _support import CpuUsage, Spread, measure_cpu

REPO_ROOT = Path(__file__).resolve().parent.parent
TOPIC = "spark-bench"
TARGET_ROWS_PER_S = 300_000.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write every raw number here")
    parser.add_argument("--jvm-options", default="",
                        help="spark.driver.extraJavaOptions (default: none, i.e. the JVM's full"
                             " JIT; the tests use -XX:TieredStopAtLevel=1 for a faster start)")
    return parser.parse_args(argv)


def produce(bootstrap: str, records: int, partitions: int, record_bytes: int) -> float:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})  # keep a reference: see result()
    admin.create_topics([NewTopic(TOPIC, partitions, 1)])[TOPIC].result(timeout=20)
    errors: list[str] = []
    producer = Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False,
        "linger.ms": 5, "batch.size": 1_000_000, "queue.buffering.max.messages": 2_000_000,
        "queue.buffering.max.kbytes": 2_097_151, "delivery.report.only.error": True,
        "on_delivery": lambda e, _m: errors.append(str(e)),
    })
    payloads = [os.urandom(record_bytes) for _ in range(1024)]
    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                producer.produce(TOPIC, payloads[i % 1024], partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120) or errors:
        raise RuntimeError(f"produce failed: {errors[:3]}")
    return time.perf_counter() - started


def spark_session(jvm_options: str) -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))  # pyspark_raftlog
    builder = (SparkSession.builder.master("local[2]").appName("raftlog-spark-read-bench")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2"))
    if jvm_options:
        builder = builder.config("spark.driver.extraJavaOptions", jvm_options)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def timed_noop(df: Any) -> float:
    started = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print("needs pyspark: pip install -e '.[spark]'")
        return 2
    if shutil.which("java") is None:
        print("needs a Java runtime (java on PATH)")
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="raftlog-spark-bench-"))
    node = RaftlogNode(workdir)
    spark = None
    results: dict[str, Any] = {"records": args.records, "partitions": args.partitions,
                               "record_bytes": args.record_bytes, "jvm_options": args.jvm_options,
                               "raftlog": [], "parquet": []}
    try:
        node.start()
        produce_s = produce(node.bootstrap, args.records, args.partitions, args.record_bytes)
        print(f"produced {args.records:,} x {args.record_bytes} B into {args.partitions}"
              f" partitions in {produce_s:.1f} s")
        started = time.perf_counter()
        spark = spark_session(args.jvm_options)
        print(f"SparkSession local[2] ready in {time.perf_counter() - started:.1f} s"
              f" (JVM options: {args.jvm_options or 'defaults'})")

        def connector() -> Any:
            return (spark.read.format("raftlog")
                    .option("kafka.bootstrap.servers", node.bootstrap)
                    .option("subscribe", TOPIC).load())

        parquet_dir = workdir / "rows.parquet"
        warm = timed_noop(connector())
        rows = connector().count()
        assert rows == args.records, f"the connector read {rows} rows, expected {args.records}"
        connector().write.parquet(str(parquet_dir))
        warm_parquet = timed_noop(spark.read.parquet(str(parquet_dir)))
        print(f"warm-up: raftlog {warm:.2f} s, parquet {warm_parquet:.2f} s; {rows:,} rows each")

        usages: list[CpuUsage] = []
        for repeat in range(args.repeats):
            with measure_cpu(node.server.pid) as meter:
                seconds = timed_noop(connector())
            assert meter.usage is not None
            usages.append(meter.usage)
            results["raftlog"].append({"repeat": repeat, "seconds": seconds,
                                       "rows_per_s": args.records / seconds,
                                       "broker_cpu_pct": meter.usage.broker_pct,
                                       "box_busy_pct": meter.usage.box_busy_pct})
            seconds = timed_noop(spark.read.parquet(str(parquet_dir)))
            results["parquet"].append({"repeat": repeat, "seconds": seconds,
                                       "rows_per_s": args.records / seconds})
            print(f"repeat {repeat + 1}: raftlog {results['raftlog'][-1]['rows_per_s']:,.0f}"
                  f" rows/s, parquet {results['parquet'][-1]['rows_per_s']:,.0f} rows/s")
    finally:
        if spark is not None:
            spark.stop()
        node.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    payload_mb = args.records * args.record_bytes / 1_000_000
    summary: dict[str, Any] = {}
    print(f"\n{args.records:,} rows of {args.record_bytes} B, {args.partitions} partitions,"
          f" local[2], {args.repeats} interleaved repeats (median, range):")
    for system in ("raftlog", "parquet"):
        spread = Spread.of([r["rows_per_s"] for r in results[system]])
        mb = Spread.of([payload_mb / r["seconds"] for r in results[system]])
        summary[system] = {"rows_per_s": spread.median, "low": spread.low, "high": spread.high,
                           "payload_mb_per_s": mb.median}
        print(f"  {system:<8} {spread.median:>10,.0f} rows/s ({spread.low:,.0f}-{spread.high:,.0f})"
              f"  {mb.median:6.1f} MB/s payload")
    broker = Spread.of([u.broker_pct for u in usages])
    box = Spread.of([u.box_busy_pct for u in usages])
    print(f"  during raftlog reads: broker CPU {broker.median:.0f}% of one core, whole box"
          f" {box.median:.0f}% (200% = both cores)")
    ratio = summary["raftlog"]["rows_per_s"] / summary["parquet"]["rows_per_s"]
    verdict = "PASS" if summary["raftlog"]["rows_per_s"] >= TARGET_ROWS_PER_S else "MISS"
    print(f"  raftlog/parquet = {ratio:.2f}; target >= {TARGET_ROWS_PER_S:,.0f} rows/s: {verdict}")
    if args.json:
        results.update(summary=summary, ratio=ratio, verdict=verdict,
                       python=sys.version.split()[0], machine=platform.platform(),
                       cpus=os.cpu_count())
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
