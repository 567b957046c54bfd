"""The cluster benchmark's ``metrics`` section: what serving metrics costs in throughput.

The same produce phases as the throughput section (``_raftlog_cluster.produce``: acks=all,
RF3, 1 and 3 partitions, then 1 partition idempotent) on one fresh 3-node cluster per mode and
repeat (``--metrics-modes``, default ``on,off``):

* **on**: every node has ``metrics.listener``, and a scraper *process* (as Prometheus is one)
  GETs every node's ``/metrics`` every second during the phases (a new connection per scrape,
  ``Accept-Encoding: gzip``, as Prometheus asks);
* **listener**: ``metrics.listener`` set, nobody scrapes (the fixed cost of the listener and
  the loop monitor);
* **off**: no ``metrics.listener`` (no HTTP listener, no loop monitor) and no scraper. The
  recorders the parts own count in every mode: they are not switched off.

``raftlog cluster up`` always gives its nodes a metrics listener, so every cluster here is made
by :func:`raftlog.tools.cluster.prepare` (the configuration ``cluster up`` writes) with the
``metrics.*`` lines set or removed, and its nodes started the way ``cluster up`` starts them
(``RaftlogCluster.restart_node``); readiness is ``cluster up``'s own probe. The order of the
modes rotates between repeats.

Reported: each phase's msgs/s per mode (median over repeats), the cost ``1 - mode/off`` of the
medians, per repeat and pooled (the geometric mean of every on/off pair, with a rough 95%
interval: on a shared 2-core box repeats vary far more than the few percent looked for), the
brokers' CPU, the scrapes (count, failures, time), and the direct measure: the CPU one scrape
costs a node of the idle "on" cluster (its CPU time over 20 back-to-back scrapes, less its idle
rate), which at one scrape a second is that many ms per s of a core.
"""

from __future__ import annotations

import http.client
import json
import math
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from _cluster_results import Options, Run, failed_phase, throughput_phases
from _support import PhaseResult, Spread, free_port, process_cpu_seconds

TARGET_COST = 0.03
SCRAPE_INTERVAL_S = 1.0
SCRAPE_TIMEOUT_S = 5.0
READY_TIMEOUT_S = 60.0


def system(mode: str) -> str:
    return f"raftlog-metrics-{mode}"


# -- the scraper process ------------------------------------------------------------------------


def _scrape(host: str, port: int) -> int:
    connection = http.client.HTTPConnection(host, port, timeout=SCRAPE_TIMEOUT_S)
    try:
        connection.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}")
        return len(body)
    finally:
        connection.close()


def scraper_main(addresses: Sequence[str]) -> int:
    """The scraper process: scrape every ``host:port`` every second until SIGTERM, then print
    the statistics as one JSON line."""
    targets = [(a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])) for a in addresses]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    times_ms: list[float] = []
    failures: list[str] = []
    sent = 0
    next_at = time.monotonic()
    while not stop.is_set():
        for host, port in targets:
            started = time.perf_counter()
            try:
                sent += _scrape(host, port)
                times_ms.append((time.perf_counter() - started) * 1000)
            except Exception as exc:
                failures.append(f"{host}:{port}: {exc!r}")
        next_at += SCRAPE_INTERVAL_S
        stop.wait(max(0.0, next_at - time.monotonic()))
    ordered = sorted(times_ms)

    def pct(q: float) -> float | None:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None

    print(json.dumps({"scrapes": len(ordered), "failures": len(failures),
                      "first_failure": failures[0] if failures else None,
                      "scrape_ms_p50": pct(0.5), "scrape_ms_p99": pct(0.99),
                      "scrape_ms_max": ordered[-1] if ordered else None,
                      "bytes_per_scrape": sent / len(ordered) if ordered else 0}), flush=True)
    return 0


class Scraper:
    """The scraper process for the duration of a ``with`` block; ``stats`` afterwards."""

    def __init__(self, addresses: Sequence[tuple[str, int]]) -> None:
        self.addresses = [f"{h}:{p}" for h, p in addresses]
        self.process: subprocess.Popen[str] | None = None
        self.stats: dict[str, Any] = {}

    def __enter__(self) -> Scraper:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "scrape", *self.addresses], stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            out, _ = self.process.communicate(timeout=SCRAPE_TIMEOUT_S * len(self.addresses) + 5)
            self.stats = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()
            self.stats = {"error": "the scraper did not stop"}


# -- one cluster per mode -----------------------------------------------------------------------


def launch(cluster: Any, listener: bool) -> list[tuple[str, int]]:
    """Write the cluster's configuration with or without ``metrics.listener``, start its
    nodes as ``cluster up`` does, wait until ``cluster up``'s probe passes; returns the metrics
    addresses (empty without listener)."""
    import trio

    from raftlog.config.properties import load_properties
    from raftlog.tools.cluster import prepare, probe

    layout = prepare(cluster.data_dir, cluster.nodes, 0)
    addresses: list[tuple[str, int]] = []
    for node_id in layout.node_ids:
        path = cluster.config_path(node_id)
        url = load_properties(path).get("metrics.listener") or f"http://127.0.0.1:{free_port()}"
        lines = [line for line in path.read_text().splitlines()
                 if not line.startswith("metrics.")]
        if listener:
            lines.append(f"metrics.listener={url}")
            netloc = urlsplit(url)
            addresses.append((netloc.hostname or "127.0.0.1", int(netloc.port or 0)))
        path.write_text("\n".join(lines) + "\n")
        cluster.restart_node(node_id)
    cluster.bootstrap = layout.bootstrap
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            trio.run(probe, layout.bootstrap, layout.nodes)
            break
        except Exception:
            exited = [n for n, proc in cluster.restarted.items() if proc.poll() is not None]
            if time.monotonic() > deadline or exited:
                raise RuntimeError(f"cluster not ready:\n{cluster.log_tail(1500)}") from None
            time.sleep(0.2)
    for host, port in addresses:  # every listener answers before the clock starts
        _scrape(host, port)
    return addresses


def scrape_cpu_ms(cluster: Any, addresses: Sequence[tuple[str, int]], scrapes: int = 20
                  ) -> float:
    """The median over nodes of the node CPU (ms) one scrape costs on the idle cluster."""
    pids = [pid for _, pid in sorted(cluster.node_pids().items())]
    idle_s = 2.0
    before = [process_cpu_seconds(pid) for pid in pids]
    time.sleep(idle_s)
    idle_rate = [(process_cpu_seconds(pid) - b) / idle_s for pid, b in zip(pids, before,
                                                                             strict=True)]
    costs = []
    for pid, rate, (host, port) in zip(pids, idle_rate, addresses, strict=True):
        cpu0, wall0 = process_cpu_seconds(pid), time.monotonic()
        for _ in range(scrapes):
            _scrape(host, port)
        wall = time.monotonic() - wall0
        costs.append((process_cpu_seconds(pid) - cpu0 - rate * wall) / scrapes * 1000)
    return sorted(costs)[len(costs) // 2]


def run_mode(options: Options, workdir: Path, repeat: int, mode: str, payload: bytes,
             run: Run) -> None:
    import _raftlog_cluster as side

    cluster = side.RaftlogCluster(workdir / "cluster")
    done: set[str] = set()
    try:
        addresses = launch(cluster, mode != "off")
        for p, idempotent in throughput_phases(options):
            cluster.create_topic(side.phase_name(p, idempotent).replace("produce", "bench"), p)
        cpu_ms = scrape_cpu_ms(cluster, addresses) if mode == "on" else None
        for p, idempotent in throughput_phases(options):
            topic = side.phase_name(p, idempotent).replace("produce", "bench")
            if mode == "on":
                with Scraper(addresses) as scraper:
                    result = side.produce(cluster, topic, p, repeat, options.records, payload,
                                          idempotent)
                result.extra["scrapes"] = {**scraper.stats, "idle_scrape_cpu_ms": cpu_ms}
            else:
                result = side.produce(cluster, topic, p, repeat, options.records, payload,
                                      idempotent)
            result.system = system(mode)
            done.add(result.phase)
            run.phases.append(result)
            _print(result, mode)
        if len(cluster.node_pids()) != cluster.nodes:
            raise RuntimeError(f"a node died during the produce phases:\n{cluster.log_tail()}")
    except Exception as exc:
        traceback.print_exc()
        run.errors.append(f"metrics {mode} r{repeat}: {exc!r}")
        for p, idempotent in throughput_phases(options):
            if side.phase_name(p, idempotent) not in done:
                run.phases.append(failed_phase(system(mode), side.phase_name(p, idempotent),
                                               repeat, f"{exc!r}\n{cluster.log_tail(1500)}"))
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _print(result: PhaseResult, mode: str) -> None:
    scrapes = result.extra.get("scrapes") or {}
    scraped = "" if not scrapes.get("scrapes") else (
        f"  scrapes {scrapes['scrapes']} (failed {scrapes['failures']}) p50 "
        f"{scrapes['scrape_ms_p50']:.1f} ms max {scrapes['scrape_ms_max']:.1f} ms")
    print(f"  r{result.repeat} metrics {mode:<8} {result.phase:<15} "
          f"{result.seconds:6.2f} s {result.mb_per_s:7.1f} MB/s {result.msgs_per_s:9,.0f} "
          f"msgs/s  cpu brokers {result.cpu.broker_pct:4.0f}% box "
          f"{result.cpu.box_busy_pct:4.0f}%{scraped}"
          f"{'' if result.ok else '  FAILED: ' + result.note.strip()[:200]}", flush=True)


def run_section(options: Options, root: Path, payload: bytes, run: Run) -> None:
    modes = list(options.metrics_modes)
    print(f"metrics {' vs '.join(modes)} (order rotating between repeats):", flush=True)
    for repeat in range(options.repeats):
        shift = repeat % len(modes)
        for mode in modes[shift:] + modes[:shift]:
            run_mode(options, root / f"metrics-{mode}-r{repeat}", repeat, mode, payload, run)


# -- the report ---------------------------------------------------------------------------------


def report(options: Options, run: Run) -> dict[str, Any]:
    """Prints each mode against off, and the target lines; returns them for the JSON."""
    import _raftlog_cluster as side

    rows: list[dict[str, Any]] = []
    modes = list(options.metrics_modes)
    print(f"\n=== metrics {' / '.join(modes)} (on: listener + a scrape of every node every "
          f"{SCRAPE_INTERVAL_S:.0f} s): {options.records:,} x {options.record_bytes} B, "
          f"{options.repeats} repeats; median (min-max) ===")
    for p, idempotent in throughput_phases(options):
        phase = side.phase_name(p, idempotent)
        results = {m: [r for r in run.phases if (r.system, r.phase) == (system(m), phase)]
                   for m in modes}
        msgs = {m: Spread.of([r.msgs_per_s if r.ok else float("nan") for r in results[m]])
                for m in modes}
        cpu = {m: Spread.of([r.cpu.broker_pct for r in results[m] if r.ok]) for m in modes}
        print(f"  {phase:<16} " + "  ".join(
            f"{m} {_cell(msgs[m])} msgs/s (brokers CPU {cpu[m].median:.0f}%)" for m in modes))
        for mode in (m for m in modes if m != "off"):
            per_repeat = []
            for repeat in range(options.repeats):
                a = [r for r in results[mode] if r.repeat == repeat and r.ok]
                b = [r for r in results["off"] if r.repeat == repeat and r.ok]
                if a and b and b[0].msgs_per_s > 0:
                    per_repeat.append(1 - a[0].msgs_per_s / b[0].msgs_per_s)
            off = msgs["off"].median
            cost = 1 - msgs[mode].median / off if off > 0 else float("nan")
            scrapes = [r.extra["scrapes"] for r in results[mode] if r.extra.get("scrapes")]
            rows.append({"phase": phase, "mode": mode, "msgs_per_s": vars(msgs[mode]),
                         "msgs_per_s_off": vars(msgs["off"]), "cost": cost,
                         "cost_per_repeat": per_repeat, "brokers_cpu_pct": vars(cpu[mode]),
                         "brokers_cpu_pct_off": vars(cpu["off"]), "scrapes": scrapes})
            spread = (f" (per repeat {min(per_repeat):+.1%}..{max(per_repeat):+.1%})"
                      if len(per_repeat) > 1 else "")
            scraped = "" if not scrapes else (
                f"; {sum(s.get('scrapes', 0) for s in scrapes)} scrapes, "
                f"{sum(s.get('failures', 0) for s in scrapes)} failed, p50 "
                f"{Spread.of([s.get('scrape_ms_p50') or float('nan') for s in scrapes]).median:.1f}"
                " ms")
            print(f"    {mode} vs off: cost {cost:+.1%}{spread}{scraped}")
    for mode in (m for m in modes if m != "off"):
        pooled = _pooled([1 - r for row in rows if row["mode"] == mode
                          for r in row["cost_per_repeat"]])
        cpu_ms = [s["idle_scrape_cpu_ms"] for row in rows if row["mode"] == mode
                  for s in row["scrapes"] if s.get("idle_scrape_cpu_ms") is not None]
        summary: dict[str, Any] = {"mode": mode, "pooled_cost": pooled}
        line = f"  {mode} vs off, every phase and repeat: " + (
            f"cost {pooled[0]:+.1%} (95% interval {pooled[1]:+.1%}..{pooled[2]:+.1%}, "
            f"{pooled[3]} pairs)" if pooled else "no pairs")
        if cpu_ms:
            ms = Spread.of(cpu_ms).median
            summary["idle_scrape_cpu_ms"] = ms
            line += (f"; one scrape costs a node {ms:.1f} ms CPU (idle), i.e. "
                     f"{ms / 10:.2f}% of a core at one scrape a second")
        print(line)
        rows.append(summary)
    print("targets (medians):")
    for row in rows:
        if row["mode"] == "on" and "phase" in row:
            row["pass"] = row["cost"] < TARGET_COST
            print(f"  {'PASS' if row['pass'] else 'MISS'}  metrics on costs < {TARGET_COST:.0%} "
                  f"of msgs/s ({row['phase']}): {row['cost']:+.1%}")
    return {"metrics_cost": rows, "metrics_cost_target": TARGET_COST}


def _pooled(ratios: Sequence[float]) -> tuple[float, float, float, int] | None:
    """``(cost, low, high, n)`` from per-pair ``mode/off`` msgs/s ratios: the geometric mean
    and a rough 95% interval (two standard errors of the mean log ratio)."""
    logs = [math.log(r) for r in ratios if r > 0]
    if len(logs) < 2:
        return None
    mean = statistics.mean(logs)
    se = statistics.stdev(logs) / math.sqrt(len(logs))
    return 1 - math.exp(mean), 1 - math.exp(mean + 2 * se), 1 - math.exp(mean - 2 * se), len(logs)


def _cell(spread: Spread) -> str:
    values = [v for v in spread.values if v == v]
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{spread.median:,.0f}"
    return f"{spread.median:,.0f} ({spread.low:,.0f}-{spread.high:,.0f})"


if __name__ == "__main__":  # the scraper process: _metrics_cost.py scrape HOST:PORT ...
    raise SystemExit(scraper_main(sys.argv[2:]) if sys.argv[1:2] == ["scrape"] else 2)
