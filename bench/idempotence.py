"""Issue 19's idempotence check: one idempotent producer at full speed, nodes killed under it.

Each run starts `raftlog cluster up --nodes 3` in its own directory and creates topic `idem`
(3 partitions, RF 3, min.insync.replicas=2). One confluent-kafka producer
(enable.idempotence=true, acks=all, linger.ms=5, librdkafka's default timeouts) writes
numbered records round-robin as fast as the cluster takes them for `--seconds`. Every 5-10 s
one node is SIGKILLed (30% of the time a second one too) and restarted 2-5 s later, the
issue's schedule. Then every node runs again, the producer flushes, and every partition is
read back from offset 0.

Per run it counts, per partition: values stored twice (duplicates), values stored after one
sent later (reorderings), acknowledged values not stored (lost), and values acknowledged
without an offset (librdkafka's implicit acks, docs/jepsen.md). librdkafka's eos/msg debug
lines go to `<out>/run-<n>/client.log`; the nodes' logs stay in `<out>/run-<n>/cluster/`.
Exit status 1 if any run found a duplicate, a reordering or a loss.

Not a CI test: `make idempotence-check` runs 10 x 180 s (about 35 minutes).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _raftlog_cluster import RaftlogCluster, partitions_ready, wait_until
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

TOPIC = "idem"
PARTITIONS = 3
FLUSH_TIMEOUT_S = 180.0
READY_TIMEOUT_S = 120.0
# Answers while leadership moves after the last restarts (asked again, not failed).
_SETTLING = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
             KafkaError._TRANSPORT, KafkaError._TIMED_OUT)


@dataclass
class RunResult:
    seed: int
    seconds: float
    sent: int = 0
    acknowledged: int = 0
    failed: int = 0
    kills: int = 0
    double_kills: int = 0
    duplicates: int = 0
    reorderings: int = 0
    lost: int = 0
    acknowledged_without_offset: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.duplicates == self.reorderings == self.lost == 0


class _Feed:
    """The producer thread: numbered values, round-robin over the partitions."""

    def __init__(self, bootstrap: str, log_path: Path) -> None:
        logger = logging.getLogger(f"idempotence.{log_path}")
        handler = logging.FileHandler(log_path, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                  "acks": "all", "linger.ms": 5, "debug": "eos,msg",
                                  "logger": logger, "log_level": 7})
        self.sent: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, error: Any, message: Any) -> None:
        if error is not None:
            self.failed.append(f"{message.value()!r}: {error}")
        else:
            offset = message.offset()  # None or < 0: delivered without an offset (implicit ack)
            self.acked[message.value()] = (message.partition(), -1 if offset is None else offset)

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            value = b"%09d" % i
            try:
                self.producer.produce(TOPIC, value=value, partition=i % PARTITIONS,
                                      on_delivery=self._delivered)
            except BufferError:
                self.producer.poll(0.05)
                continue
            self.sent[i % PARTITIONS].append(value)
            i += 1
            self.producer.poll(0)


def _churn(cluster: RaftlogCluster, rng: random.Random, seconds: float, result: RunResult
           ) -> None:
    started = time.monotonic()
    nodes = list(range(1, cluster.nodes + 1))
    while time.monotonic() - started < seconds:
        time.sleep(rng.uniform(5, 10))
        victims = [rng.choice(nodes)]
        if rng.random() < 0.3:
            victims.append(rng.choice([n for n in nodes if n != victims[0]]))
            result.double_kills += 1
        live = cluster.node_pids()
        for node in victims:
            if node in live:
                cluster.kill_node(node)
                result.kills += 1
        time.sleep(rng.uniform(2, 5))
        live = cluster.node_pids()
        for node in victims:
            if node not in live:
                cluster.restart_node(node)


def _high_watermark(consumer: Consumer, partition: int, timeout_s: float = 120.0) -> int:
    """The partition's high watermark, asked again while leadership is still settling."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, partition),
                                                     timeout=10)
            return int(high)
        except KafkaException as exc:
            if (not exc.args[0].retriable() and exc.args[0].code() not in _SETTLING) \
                    or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _read_back(bootstrap: str) -> dict[int, list[tuple[int, bytes]]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "idempotence-check",
                         "enable.auto.commit": False, "log_level": 2})
    stored: dict[int, list[tuple[int, bytes]]] = {}
    try:
        for partition in range(PARTITIONS):
            high = _high_watermark(consumer, partition)
            consumer.assign([TopicPartition(TOPIC, partition, 0)])
            rows: list[tuple[int, bytes]] = []
            deadline = time.monotonic() + 120
            while (not rows or rows[-1][0] < high - 1) and high > 0:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{TOPIC}-{partition}: read {len(rows)} of {high}")
                for message in consumer.consume(1000, timeout=1):
                    offset, value = message.offset(), message.value()
                    if message.error() is None and offset is not None and value is not None:
                        rows.append((offset, value))
            stored[partition] = rows
    finally:
        consumer.close()
    return stored


def _check(feed: _Feed, stored: dict[int, list[tuple[int, bytes]]], result: RunResult) -> None:
    for partition, rows in stored.items():
        first_at: dict[bytes, int] = {}
        for offset, value in rows:
            if value in first_at:
                result.duplicates += 1
                if len(result.examples) < 10:
                    result.examples.append(f"duplicate {value!r} in {partition} at offsets "
                                           f"{first_at[value]} and {offset}")
            else:
                first_at[value] = offset
        sent_index = {v: i for i, v in enumerate(feed.sent[partition])}
        latest = -1
        for _, value in rows:
            index = sent_index.get(value, -1)
            if index < latest:
                result.reorderings += 1
            latest = max(latest, index)
    values = {p: {v for _, v in rows} for p, rows in stored.items()}
    for value, (partition, offset) in feed.acked.items():
        if offset < 0:
            result.acknowledged_without_offset += 1
        if value not in values.get(partition, set()):
            result.lost += 1
            if len(result.examples) < 10:
                result.examples.append(f"lost {value!r} (partition {partition}, acknowledged "
                                       f"at {offset})")


def run_once(out: Path, seed: int, seconds: float) -> RunResult:
    result = RunResult(seed, seconds)
    cluster = RaftlogCluster(out / "cluster", nodes=3, log_level="INFO")
    cluster.up()
    try:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 2})
        new = NewTopic(TOPIC, PARTITIONS, 3, config={"min.insync.replicas": "2"})
        admin.create_topics([new], request_timeout=15)[TOPIC].result(timeout=30)
        wait_until(lambda: partitions_ready(admin, TOPIC, PARTITIONS, 3), 30, "full ISRs")
        feed = _Feed(cluster.bootstrap, out / "client.log")
        feed.thread.start()
        _churn(cluster, random.Random(seed), seconds, result)
        feed.stop.set()
        feed.thread.join(30)
        live = cluster.node_pids()
        for node in range(1, cluster.nodes + 1):
            if node not in live:
                cluster.restart_node(node)
        wait_until(lambda: partitions_ready(admin, TOPIC, PARTITIONS, 3), READY_TIMEOUT_S,
                   "every partition back with a full ISR")
        unflushed = feed.producer.flush(FLUSH_TIMEOUT_S)
        if unflushed:
            result.examples.append(f"{unflushed} records never delivered nor failed")
        _check(feed, _read_back(cluster.bootstrap), result)
        result.sent = sum(len(v) for v in feed.sent.values())
        result.acknowledged = len(feed.acked)
        result.failed = len(feed.failed)
        result.examples += feed.failed[:3]
    finally:
        cluster.stop()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("store/idempotence"))
    parser.add_argument("--keep", action="store_true", help="keep clean runs' directories")
    args = parser.parse_args(argv)
    results: list[RunResult] = []
    for n in range(args.runs):
        out = args.out / f"run-{n + 1}"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        result = run_once(out, args.seed + n, args.seconds)
        results.append(result)
        print(f"run {n + 1}/{args.runs} seed {result.seed}: {result.acknowledged:,} acknowledged"
              f" of {result.sent:,} sent, {result.kills} kills ({result.double_kills} double),"
              f" duplicates {result.duplicates}, reorderings {result.reorderings}, lost"
              f" {result.lost}, acknowledged without offset"
              f" {result.acknowledged_without_offset}", flush=True)
        for example in result.examples:
            print(f"  {example}")
        if result.clean and not args.keep:
            shutil.rmtree(out / "cluster", ignore_errors=True)
    summary = {"runs": [asdict(r) | {"clean": r.clean} for r in results],
               "clean_runs": sum(r.clean for r in results)}
    (args.out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{summary['clean_runs']} of {len(results)} runs clean; {args.out / 'results.json'}")
    return 0 if all(r.clean for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
