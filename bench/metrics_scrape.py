"""How long one node takes to answer a Prometheus scrape of ``/metrics`` with 1,000 partitions.

    python bench/metrics_scrape.py [--topics 100] [--partitions 10] [--scrapes 200]
                                   [--json out.json]

One node (broker+controller, ``metrics.listener`` on) with ``--topics`` x ``--partitions``
partitions (default 100 x 10 = 1,000), all led by it, otherwise idle. Each case times
``--scrapes`` sequential ``GET /metrics`` (a new connection each, from sending the request to
the last byte of the body) and prints p50/p99/max, the body size and the sample count:

* default settings;
* the same node restarted with ``metrics.partition.detail.enable=true`` (per-partition
  families: 5 gauges x 1,000 partitions more);

each both plain and with ``Accept-Encoding: gzip`` (what Prometheus sends). The target
(issue 17) is an answer within 50 ms on an idle node with 1,000 partitions. It is a benchmark,
not a test: the exit status is 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _raftlog_side import REPO_ROOT
from _support import ServerProcess, free_port, write_json
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

TARGET_MS = 50.0
READY_TIMEOUT_S = 180.0


class MetricsNode:
    """One raftlog node with a metrics listener; restartable with other properties."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.controller_port = free_port()
        self.metrics_port = free_port()
        self.server: ServerProcess | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, extra: dict[str, str]) -> None:
        properties = {
            "node.id": "1",
            "process.roles": "broker,controller",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},"
                         f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(self.workdir / "data"),
            "raft.secret": "bench-secret",
            "metrics.listener": f"http://127.0.0.1:{self.metrics_port}",
            **extra,
        }
        config = self.workdir / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
        self.server = ServerProcess(
            "raftlog", [sys.executable, "-m", "raftlog", "--log-level", "WARNING", "server",
                        "--config", str(config)],
            self.port, self.workdir / "server.log", cwd=REPO_ROOT)
        self.server.start(60.0)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    def scrape(self, gzip_ok: bool = False) -> tuple[float, bytes, int]:
        """(seconds, body as sent, uncompressed size) of one ``GET /metrics``."""
        connection = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=10)
        try:
            headers = {"Accept-Encoding": "gzip"} if gzip_ok else {}
            started = time.perf_counter()
            connection.request("GET", "/metrics", headers=headers)
            response = connection.getresponse()
            body = response.read()
            seconds = time.perf_counter() - started
            if response.status != 200:
                raise RuntimeError(f"/metrics answered {response.status}: {body[:300]!r}")
            plain = gzip.decompress(body) if response.getheader("Content-Encoding") == "gzip" \
                else body
            return seconds, body, len(plain)
        finally:
            connection.close()


def create_topics(node: MetricsNode, topics: int, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": node.bootstrap, "log_level": 2})
    names = [f"scrape-{i:03d}" for i in range(topics)]
    for start in range(0, topics, 20):
        futures = admin.create_topics([NewTopic(n, partitions, 1) for n in names[start:start + 20]],
                                      request_timeout=60)
        for future in futures.values():
            future.result(timeout=120)


def wait_led(node: MetricsNode, expected: int) -> float:
    """Until every partition has a leader in the node's Metadata; returns the seconds waited."""
    admin = AdminClient({"bootstrap.servers": node.bootstrap, "log_level": 2})
    started = time.monotonic()
    led = 0
    while time.monotonic() - started < READY_TIMEOUT_S:
        try:
            topics = admin.list_topics(timeout=10).topics
            led = sum(1 for name, t in topics.items() if name.startswith("scrape-")
                      for p in t.partitions.values() if p.leader >= 0)
        except Exception:
            led = 0
        if led >= expected:
            return time.monotonic() - started
        time.sleep(0.5)
    raise RuntimeError(f"{led} partitions led after {READY_TIMEOUT_S} s, expected {expected}")


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(node: MetricsNode, case: str, scrapes: int, gzip_ok: bool) -> dict[str, Any]:
    node.scrape(gzip_ok)  # warm-up, untimed
    times: list[float] = []
    sent = plain = 0
    for _ in range(scrapes):
        seconds, body, plain = node.scrape(gzip_ok)
        sent = len(body)
        times.append(seconds * 1000)
    samples = sum(1 for line in node.scrape()[1].decode().splitlines()
                  if line and not line.startswith("#"))
    result: dict[str, Any] = {"case": case, "gzip": gzip_ok, "scrapes": scrapes,
              "p50_ms": percentile(times, 0.5), "p99_ms": percentile(times, 0.99),
              "max_ms": max(times), "mean_ms": sum(times) / len(times),
              "body_bytes": plain, "sent_bytes": sent, "samples": samples}
    print(f"  {case:<26} {'gzip' if gzip_ok else 'plain':<5} p50 {result['p50_ms']:6.2f} ms  "
          f"p99 {result['p99_ms']:6.2f} ms  max {result['max_ms']:6.2f} ms  body "
          f"{plain / 1000:7.1f} kB (sent {sent / 1000:6.1f} kB)  {samples:,} samples  "
          f"{'PASS' if result['p99_ms'] < TARGET_MS else 'MISS'} (p99 < {TARGET_MS:.0f} ms)",
          flush=True)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=10, help="partitions per topic")
    parser.add_argument("--scrapes", type=int, default=200, help="timed scrapes per case")
    parser.add_argument("--idle", type=float, default=3.0,
                        help="seconds to wait after the partitions are led, before timing")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    total = args.topics * args.partitions
    workdir = Path(tempfile.mkdtemp(prefix="raftlog-metrics-bench-"))
    node = MetricsNode(workdir)
    results: list[dict[str, Any]] = []
    try:
        print(f"one node, {args.topics} topics x {args.partitions} partitions = {total:,}; "
              f"{args.scrapes} scrapes per case", flush=True)
        node.start({})
        started = time.monotonic()
        create_topics(node, args.topics, args.partitions)
        led = wait_led(node, total)
        print(f"  {total:,} partitions created and led in {time.monotonic() - started:.1f} s "
              f"(led {led:.1f} s after the last CreateTopics)", flush=True)
        for case, extra in (("default", {}),
                            ("partition detail on", {"metrics.partition.detail.enable": "true"})):
            if extra:
                node.stop()
                node.start(extra)
                wait_led(node, total)
            time.sleep(args.idle)
            for gzip_ok in (False, True):
                results.append(measure(node, case, args.scrapes, gzip_ok))
    finally:
        node.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    write_json(args.json, {"partitions": total, "target_ms": TARGET_MS, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
