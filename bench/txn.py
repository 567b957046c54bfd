"""Transactions: transactions per second with 10 records each, and what transactions cost
against plain idempotent produce, measured in the same run on the same nodes.

    python bench/txn.py [--transactions 300] [--records-per-txn 10] [--partitions 1]
                        [--record-bytes 100] [--nodes 1,3] [--repeats 3] [--json out.json]

For each cluster size in --nodes (1: one `raftlog server`, 3: `raftlog cluster up --nodes 3`
with replication factor 3) a fresh cluster is started, and each repeat runs three phases,
interleaved, with confluent-kafka (librdkafka), acks=all (fsynced on every ISR member):

* ``txn``: a transactional producer runs T transactions one after the other: begin, R
  records (round-robin over the partitions), commit_transaction. Reported as txn/s and
  records/s.
* ``idem-sync``: an idempotent producer sends the same T x R records, flushing after every R,
  so it waits for the brokers as often as the transactional producer does (the like-for-like
  peer: the difference is the transaction protocol: AddPartitionsToTxn, EndTxn, the
  COMMIT markers and their replication).
* ``idem-stream``: the same records sent as fast as the producer can, one flush at the end
  (what a producer that does not need transactions would do).

It prints medians and ranges of each phase and the ratios txn / idem-sync and txn /
idem-stream. It is a benchmark, not a test: the exit status is 0 whatever the figures (2 when
a prerequisite is missing).
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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _raftlog_cluster import RaftlogCluster
from _raftlog_side import RaftlogNode
from _support import Spread
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

PHASES = ("txn", "idem-sync", "idem-stream")
CALL_TIMEOUT_S = 60.0
CLIENT_LOG_LEVEL = 2
COMMON_PRODUCER_CONFIG: dict[str, Any] = {
    "acks": "all", "linger.ms": 1, "compression.type": "none", "log_level": CLIENT_LOG_LEVEL,
}
NOISE_NOTE = ("This VM's 2 vCPUs are shared by the client, the broker process(es) and anything "
              "else running: quote the medians of interleaved repeats, never one pass.")


@dataclass
class Options:
    transactions: int
    records_per_txn: int
    partitions: int
    record_bytes: int
    nodes: list[int]
    repeats: int
    json_path: Path | None


@dataclass
class PhaseRun:
    nodes: int
    phase: str
    repeat: int
    records: int
    transactions: int
    seconds: float
    errors: int = 0

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else float("nan")

    @property
    def txn_per_s(self) -> float:
        return self.transactions / self.seconds if self.transactions and self.seconds > 0 \
            else float("nan")


@dataclass
class Report:
    options: Options
    runs: list[PhaseRun] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=300)
    parser.add_argument("--records-per-txn", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--nodes", default="1,3", help="cluster sizes, e.g. 1 or 1,3")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    return Options(args.transactions, args.records_per_txn, args.partitions,
                   args.record_bytes, [int(n) for n in args.nodes.split(",")], args.repeats,
                   args.json)


# -- clusters ----------------------------------------------------------------------------------


@contextmanager
def running_cluster(nodes: int, workdir: Path) -> Iterator[str]:
    """A fresh cluster of ``nodes`` nodes; yields its bootstrap servers."""
    if nodes == 1:
        (workdir / "single").mkdir(parents=True, exist_ok=True)
        node = RaftlogNode(workdir / "single")
        node.start()
        try:
            yield node.bootstrap
        finally:
            node.stop()
        return
    cluster = RaftlogCluster(workdir / f"cluster{nodes}", nodes=nodes)
    cluster.up()
    try:
        yield cluster.bootstrap
    finally:
        cluster.stop()


def create_topic(bootstrap: str, topic: str, partitions: int, replication_factor: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": CLIENT_LOG_LEVEL})
    admin.create_topics([NewTopic(topic, partitions, replication_factor)],
                        request_timeout=15)[topic].result(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        described = admin.list_topics(topic, timeout=5).topics.get(topic)
        if described is not None and described.error is None and \
                len(described.partitions) == partitions and \
                all(p.leader >= 0 and len(p.isrs) == replication_factor
                    for p in described.partitions.values()):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{topic} has no leaders or full ISRs after 30 s")


# -- phases ------------------------------------------------------------------------------------


class ErrorCount:
    def __init__(self) -> None:
        self.errors = 0
        self.first = ""

    def __call__(self, error: Any, _message: Any) -> None:
        if error is not None:
            self.errors += 1
            self.first = self.first or str(error)


def run_txn(bootstrap: str, topic: str, opts: Options, txn_id: str) -> tuple[float, int]:
    errors = ErrorCount()
    producer = Producer({"bootstrap.servers": bootstrap, **COMMON_PRODUCER_CONFIG,
                         "transactional.id": txn_id, "on_delivery": errors})
    producer.init_transactions(CALL_TIMEOUT_S)
    payload = b"x" * opts.record_bytes
    # One warm-up transaction: finds the coordinator and the leaders before the clock starts.
    producer.begin_transaction()
    producer.produce(topic, payload, partition=0)
    producer.commit_transaction(CALL_TIMEOUT_S)
    started = time.perf_counter()
    for txn in range(opts.transactions):
        producer.begin_transaction()
        for i in range(opts.records_per_txn):
            producer.produce(topic, payload, partition=(txn + i) % opts.partitions)
        producer.commit_transaction(CALL_TIMEOUT_S)
    seconds = time.perf_counter() - started
    producer.flush(CALL_TIMEOUT_S)
    return seconds, errors.errors


def run_idempotent(bootstrap: str, topic: str, opts: Options, flush_every: int
                   ) -> tuple[float, int]:
    errors = ErrorCount()
    producer = Producer({"bootstrap.servers": bootstrap, **COMMON_PRODUCER_CONFIG,
                         "enable.idempotence": True, "on_delivery": errors})
    payload = b"x" * opts.record_bytes
    producer.produce(topic, payload, partition=0)  # warm-up: producer id, leaders
    producer.flush(CALL_TIMEOUT_S)
    total = opts.transactions * opts.records_per_txn
    started = time.perf_counter()
    for n in range(total):
        txn, i = divmod(n, opts.records_per_txn)
        while True:
            try:
                producer.produce(topic, payload, partition=(txn + i) % opts.partitions)
                break
            except BufferError:
                producer.poll(0.01)
        if (n + 1) % flush_every == 0:
            producer.flush(CALL_TIMEOUT_S)
    producer.flush(CALL_TIMEOUT_S)
    return time.perf_counter() - started, errors.errors


def run_phase(phase: str, bootstrap: str, topic: str, opts: Options, nodes: int,
              repeat: int) -> PhaseRun:
    records = opts.transactions * opts.records_per_txn
    if phase == "txn":
        seconds, errors = run_txn(bootstrap, topic, opts, f"bench-txn-{nodes}-{repeat}")
        return PhaseRun(nodes, phase, repeat, records, opts.transactions, seconds, errors)
    flush_every = opts.records_per_txn if phase == "idem-sync" else records
    seconds, errors = run_idempotent(bootstrap, topic, opts, flush_every)
    return PhaseRun(nodes, phase, repeat, records, 0, seconds, errors)


# -- report ------------------------------------------------------------------------------------


def spread(report: Report, nodes: int, phase: str, metric: str) -> Spread:
    return Spread.of([getattr(r, metric) for r in report.runs
                      if r.nodes == nodes and r.phase == phase and not r.errors])


def print_report(report: Report) -> None:
    opts = report.options
    print(f"\nraftlog transactions: {opts.transactions} transactions x {opts.records_per_txn} "
          f"records of {opts.record_bytes} B over {opts.partitions} partition(s), acks=all, "
          f"{opts.repeats} interleaved repeats (median [low-high])")
    print(f"{'nodes':>5}  {'phase':<12} {'txn/s':>22} {'records/s':>26} {'txn/phase':>10}")
    for nodes in opts.nodes:
        txn_rate = spread(report, nodes, "txn", "records_per_s").median
        for phase in PHASES:
            records = spread(report, nodes, phase, "records_per_s")
            txns = spread(report, nodes, phase, "txn_per_s")
            txn_text = "-" if phase != "txn" else \
                f"{txns.median:8.1f} [{txns.low:.1f}-{txns.high:.1f}]"
            ratio = txn_rate / records.median if records.median == records.median and \
                records.median else float("nan")
            print(f"{nodes:>5}  {phase:<12} {txn_text:>22} "
                  f"{records.median:10.0f} [{records.low:.0f}-{records.high:.0f}]"
                  f" {ratio:10.3f}")
    print("\nRatios (records/s of transactions over the idempotent peer, same run):")
    for nodes in opts.nodes:
        txn_rate = spread(report, nodes, "txn", "records_per_s").median
        for phase in ("idem-sync", "idem-stream"):
            peer = spread(report, nodes, phase, "records_per_s").median
            print(f"  {nodes} node(s): txn / {phase:<11} = {txn_rate / peer:.4f}"
                  if peer == peer and peer else f"  {nodes} node(s): {phase}: no figure")
    for failure in report.failures:
        print(f"FAILED: {failure}")
    print(f"\n{NOISE_NOTE}\nhost: {platform.platform()}, {os.cpu_count()} CPUs")


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    report = Report(opts)
    workdir = Path(tempfile.mkdtemp(prefix="raftlog-bench-txn-"))
    try:
        for nodes in opts.nodes:
            with running_cluster(nodes, workdir) as bootstrap:
                rf = min(3, nodes)
                for repeat in range(opts.repeats):
                    for phase in PHASES:
                        topic = f"bench-{phase}-{repeat}"
                        try:
                            create_topic(bootstrap, topic, opts.partitions, rf)
                            run = run_phase(phase, bootstrap, topic, opts, nodes, repeat)
                        except Exception as exc:  # reported, the run goes on
                            report.failures.append(f"{nodes} nodes, {phase} #{repeat}: {exc}")
                            continue
                        report.runs.append(run)
                        print(f"{nodes} node(s) {phase:<12} #{repeat}: "
                              f"{run.records_per_s:9.0f} records/s"
                              + (f", {run.txn_per_s:7.1f} txn/s" if run.transactions else "")
                              + (f", {run.errors} errors" if run.errors else ""), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_report(report)
    if opts.json_path is not None:
        opts.json_path.write_text(json.dumps({
            "options": {**opts.__dict__, "json_path": None},
            "runs": [{**r.__dict__, "records_per_s": r.records_per_s,
                      "txn_per_s": r.txn_per_s} for r in report.runs],
            "failures": report.failures}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
