"""What security costs: SASL_SSL (TLS + SCRAM-SHA-512) vs PLAINTEXT on the same node, same run.

    python bench/security.py [--records 200000] [--record-bytes 1024] [--repeats 3]
                             [--latency-rate 1000] [--latency-seconds 5] [--json out.json]

One raftlog node serves both listeners: a PLAINTEXT one and a SASL_SSL one (a throwaway CA and
server certificate made with ``cryptography``; a SCRAM-SHA-512 user bootstrapped the way
``raftlog format --add-scram`` does). Every repeat runs, alternately on each listener with a
fresh topic: a produce phase (N records, acks=all, linger.ms=5, confluent-kafka), a consume
phase (all N back from offset 0), and a latency phase (records sent one at a time at a fixed
rate, linger.ms=0, acks=all; each record's time from produce() to its delivery report). It
prints medians and ranges per listener and the SASL_SSL/PLAINTEXT ratios of throughput and of
p50/p99 latency, computed per repeat from measurements taken minutes apart on one process.
A benchmark, not a test: the exit status is 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _raftlog_side as side
from _support import (
    PhaseResult,
    ServerProcess,
    Spread,
    environment,
    free_port,
    run_header,
    write_json,
)
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

REPO_ROOT = Path(__file__).resolve().parent.parent
LISTENERS = ("PLAINTEXT", "SASL_SSL")
USER, PASSWORD = "bench", "bench-password-0123456789"


@dataclass
class Options:
    records: int
    record_bytes: int
    repeats: int
    latency_rate: float
    latency_seconds: float
    json_path: Path | None


@dataclass
class Node:
    """One raftlog node with a PLAINTEXT and a SASL_SSL listener."""

    workdir: Path
    server: ServerProcess
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.server.pid


def start_node(workdir: Path) -> Node:
    sys.path.insert(0, str(REPO_ROOT))
    from raftlog.controller.scram_bootstrap import parse_add_scram, write_bootstrap
    from tests.integration.tls_certs import make_certs

    certs = make_certs(workdir / "certs")
    data = workdir / "data"
    data.mkdir(parents=True)
    write_bootstrap(data, [parse_add_scram(f"SCRAM-SHA-512=[name={USER},password={PASSWORD}]")])
    port, secure_port, controller_port = free_port(), free_port(), free_port()
    properties = {
        "node.id": "1",
        "process.roles": "broker,controller",
        # SASL_SSL first: the start-up waits for the PLAINTEXT port, bound after it.
        "listeners": f"SASL_SSL://127.0.0.1:{secure_port},PLAINTEXT://127.0.0.1:{port},"
                     f"CONTROLLER://127.0.0.1:{controller_port}",
        "listener.security.protocol.map":
            "SASL_SSL:SASL_SSL,PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "controller.listener.names": "CONTROLLER",
        "log.dirs": str(data),
        "num.partitions": "1",
        "raft.secret": "bench-secret",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(certs.server),
    }
    config = workdir / "server.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
    server = ServerProcess(
        "raftlog", [sys.executable, "-m", "raftlog", "--log-level", "WARNING", "server",
                    "--config", str(config)],
        port, workdir / "server.log", cwd=REPO_ROOT)
    node = Node(workdir, server, {
        "PLAINTEXT": {"bootstrap.servers": f"127.0.0.1:{port}"},
        "SASL_SSL": {"bootstrap.servers": f"127.0.0.1:{secure_port}",
                     "security.protocol": "SASL_SSL", "ssl.ca.location": str(certs.ca),
                     "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": USER,
                     "sasl.password": PASSWORD},
    })
    server.start()
    return node


class _Target:
    """What ``_raftlog_side`` needs of a node: its pid, client config and topic."""

    def __init__(self, node: Node, listener: str) -> None:
        self.server = node.server
        self.client_config = node.configs[listener]
        self.system = listener


def create_topic(config: dict[str, Any], topic: str, timeout_s: float = 30.0) -> None:
    admin = AdminClient(config)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = admin.list_topics(topic, timeout=5).topics.get(topic)
        if found is not None and found.error is None and found.partitions.get(0) is not None \
                and found.partitions[0].leader >= 0:
            return
        time.sleep(0.05)
    raise RuntimeError(f"topic {topic!r} has no leader after {timeout_s} s")


def latency(config: dict[str, Any], topic: str, rate: float, seconds: float,
            payload: bytes) -> list[float]:
    """Milliseconds from produce() to each record's delivery report, at ``rate`` records/s."""
    latencies: list[float] = []
    errors: list[str] = []

    def delivered(error: Any, _message: Any, sent: float) -> None:
        if error is not None:
            errors.append(str(error))
        else:
            latencies.append((time.perf_counter() - sent) * 1000)

    producer = Producer({**config, "acks": "all", "linger.ms": 0, "enable.idempotence": False})
    producer.list_topics(topic, timeout=10)
    interval = 1.0 / rate
    started = time.perf_counter()
    for i in range(int(rate * seconds)):
        due = started + i * interval
        while (now := time.perf_counter()) < due:
            producer.poll(min(due - now, 0.001))
        producer.produce(topic, payload,
                         on_delivery=functools.partial(_report, delivered, time.perf_counter()))
        producer.poll(0)
    if producer.flush(60) or errors:
        raise RuntimeError(f"latency phase: {len(errors)} errors (first: "
                           f"{errors[0] if errors else '-'})")
    return latencies


def _report(delivered: Any, sent: float, error: Any, message: Any) -> None:
    delivered(error, message, sent)


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else \
        float("nan")


def run_repeat(node: Node, options: Options, repeat: int, payload: bytes
               ) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for listener in LISTENERS if repeat % 2 == 0 else reversed(LISTENERS):
        target = _Target(node, listener)
        topic = f"bench-{listener.lower()}-{repeat}"
        create_topic(target.client_config, topic)
        side.TOPIC = topic  # the phases below read the module's topic name
        produced: PhaseResult = side.produce(target, repeat, options.records, payload)  # type: ignore[arg-type]
        consumed: PhaseResult = side.consume(target, repeat, options.records,  # type: ignore[arg-type]
                                             options.record_bytes)
        if not (produced.ok and consumed.ok):
            raise RuntimeError(f"{listener}: {produced.note} {consumed.note}")
        late = latency(target.client_config, topic, options.latency_rate,
                       options.latency_seconds, payload)
        out[listener] = {
            "produce_mb_s": produced.mb_per_s, "consume_mb_s": consumed.mb_per_s,
            "produce_broker_cpu_pct": produced.cpu.broker_pct,
            "consume_broker_cpu_pct": consumed.cpu.broker_pct,
            "latency_p50_ms": percentile(late, 0.50), "latency_p99_ms": percentile(late, 0.99),
        }
        row = out[listener]
        print(f"  r{repeat} {listener:<9} produce {row['produce_mb_s']:7.1f} MB/s (broker "
              f"{row['produce_broker_cpu_pct']:3.0f}%)  consume {row['consume_mb_s']:7.1f} MB/s"
              f"  latency p50 {row['latency_p50_ms']:6.2f} ms p99 {row['latency_p99_ms']:6.2f}"
              f" ms", flush=True)
    return out


METRICS = ("produce_mb_s", "consume_mb_s", "latency_p50_ms", "latency_p99_ms")


def report(rows: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    summary: dict[str, dict[str, Any]] = {}
    print(f"\n=== median (min-max) over {len(rows)} repeats ===")
    for listener in LISTENERS:
        summary[listener] = {m: vars(Spread.of([r[listener][m] for r in rows])) for m in METRICS}
        cells = "  ".join(f"{m} {summary[listener][m]['median']:.2f}" for m in METRICS)
        print(f"{listener:<9} {cells}")
    ratios: dict[str, dict[str, float]] = {}
    print("\nSASL_SSL / PLAINTEXT, per repeat (median, min-max):")
    for metric in METRICS:
        per = [r["SASL_SSL"][metric] / r["PLAINTEXT"][metric] for r in rows
               if r["PLAINTEXT"][metric] > 0]
        ratios[metric] = {"median": statistics.median(per), "min": min(per), "max": max(per)}
        print(f"  {metric:<15} {ratios[metric]['median']:.2f}x "
              f"({ratios[metric]['min']:.2f}-{ratios[metric]['max']:.2f})")
    print("\nnote: throughput ratios < 1 mean SASL_SSL is slower; latency ratios > 1 mean it"
          " takes longer. This 2-vCPU VM is shared: compare ratios from one run, not across"
          " runs.")
    return {"summary": summary, "ratios_sasl_ssl_over_plaintext": ratios}


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency-rate", type=float, default=1000.0,
                        help="records a second in the latency phase")
    parser.add_argument("--latency-seconds", type=float, default=5.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    return Options(args.records, args.record_bytes, args.repeats, args.latency_rate,
                   args.latency_seconds, args.json)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    env = environment()
    print(run_header("raftlog: SASL_SSL (TLS + SCRAM-SHA-512) vs PLAINTEXT, one node",
                     options, env))
    payload = os.urandom(options.record_bytes)
    rows: list[dict[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="raftlog-bench-security-") as tmp:
        node = start_node(Path(tmp))
        try:
            for repeat in range(options.repeats):
                rows.append(run_repeat(node, options, repeat, payload))
        finally:
            node.server.stop()
    document = {"environment": env, "options": vars(options) | {"json_path": None},
                "rows": rows, **report(rows)}
    write_json(options.json_path, document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
