"""The cluster benchmark's ``metrics`` section: what serving metrics costs in throughput.

The same produce phases as the throughput section (``_raftlog_cluster.produce``: acks=all,
RF3, 1 and 3 partitions, then 1 partition idempotent) on two fresh 3-node clusters per repeat:

* **on**: every node has ``metrics.listener`` and a scraper in this process GETs every node's
  ``/metrics`` every second during the phases, as Prometheus would (a new connection per scrape,
  ``Accept-Encoding: gzip``);
* **off**: no ``metrics.listener`` (the HTTP listener is not started) and no scraper.

``raftlog cluster up`` always gives its nodes a metrics listener, so both clusters here are
made by :func:`raftlog.tools.cluster.prepare` (the configuration ``cluster up`` writes) with the
``metrics.*`` lines set or removed, and their nodes started the way ``cluster up`` starts them
(``RaftlogCluster.restart_node``); readiness is ``cluster up``'s own probe. The two orders
alternate between repeats (on first in even repeats).

Reported: each phase's msgs/s on and off (median over repeats), the cost ``1 - on/off`` of the
medians and per repeat, the brokers' CPU, and the scrapes (count, failures, time).
"""

from __future__ import annotations

import http.client
import shutil
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import trio
from _cluster_results import Options, Run, failed_phase, throughput_phases
from _support import PhaseResult, Spread, free_port

MODES = ("on", "off")
SYSTEM = {"on": "raftlog-metrics-on", "off": "raftlog-metrics-off"}
TARGET_COST = 0.03
SCRAPE_INTERVAL_S = 1.0
SCRAPE_TIMEOUT_S = 5.0
READY_TIMEOUT_S = 60.0


class Scraper:
    """GETs every URL's ``/metrics`` every ``interval_s`` in one thread until stopped."""

    def __init__(self, addresses: Sequence[tuple[str, int]],
                 interval_s: float = SCRAPE_INTERVAL_S) -> None:
        self.addresses = list(addresses)
        self.interval_s = interval_s
        self.times_ms: list[float] = []
        self.failures: list[str] = []
        self.bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-scraper", daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(SCRAPE_TIMEOUT_S * len(self.addresses) + 5)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            for host, port in self.addresses:
                started = time.perf_counter()
                try:
                    self.bytes += _scrape(host, port)
                    self.times_ms.append((time.perf_counter() - started) * 1000)
                except Exception as exc:
                    self.failures.append(f"{host}:{port}: {exc!r}")
            next_at += self.interval_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stats(self) -> dict[str, Any]:
        ordered = sorted(self.times_ms)

        def pct(q: float) -> float:
            return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered \
                else float("nan")

        return {"scrapes": len(ordered), "failures": len(self.failures),
                "first_failure": self.failures[0] if self.failures else None,
                "scrape_ms_p50": pct(0.5), "scrape_ms_p99": pct(0.99),
                "scrape_ms_max": ordered[-1] if ordered else float("nan"),
                "bytes_per_scrape": self.bytes / len(ordered) if ordered else 0}


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


def launch(cluster: Any, metrics: bool) -> list[tuple[str, int]]:
    """Write the cluster's configuration with or without ``metrics.listener``, start its
    nodes as ``cluster up`` does, wait until ``cluster up``'s probe passes; returns the metrics
    addresses (empty when off)."""
    from raftlog.config.properties import load_properties
    from raftlog.tools.cluster import prepare, probe

    layout = prepare(cluster.data_dir, cluster.nodes, 0)
    addresses: list[tuple[str, int]] = []
    for node_id in layout.node_ids:
        path = cluster.config_path(node_id)
        listener = load_properties(path).get("metrics.listener") \
            or f"http://127.0.0.1:{free_port()}"
        lines = [line for line in path.read_text().splitlines()
                 if not line.startswith("metrics.")]
        if metrics:
            lines.append(f"metrics.listener={listener}")
            netloc = urlsplit(listener)
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
            if time.monotonic() > deadline or len(cluster.node_pids()) < layout.nodes:
                raise RuntimeError(f"cluster not ready:\n{cluster.log_tail(1500)}") from None
            time.sleep(0.2)
    if metrics:  # every listener answers before the clock starts
        for host, port in addresses:
            _scrape(host, port)
    return addresses


def run_mode(options: Options, workdir: Path, repeat: int, mode: str, payload: bytes,
             run: Run) -> None:
    import _raftlog_cluster as side

    cluster = side.RaftlogCluster(workdir / "cluster")
    done: set[str] = set()
    system = SYSTEM[mode]
    try:
        addresses = launch(cluster, mode == "on")
        for p, idempotent in throughput_phases(options):
            cluster.create_topic(side.phase_name(p, idempotent).replace("produce", "bench"), p)
        for p, idempotent in throughput_phases(options):
            topic = side.phase_name(p, idempotent).replace("produce", "bench")
            scraper = Scraper(addresses)
            if addresses:
                with scraper:
                    result = side.produce(cluster, topic, p, repeat, options.records, payload,
                                          idempotent)
                result.extra["scrapes"] = scraper.stats()
            else:
                result = side.produce(cluster, topic, p, repeat, options.records, payload,
                                      idempotent)
            result.system = system
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
                run.phases.append(failed_phase(system, side.phase_name(p, idempotent), repeat,
                                               f"{exc!r}\n{cluster.log_tail(1500)}"))
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _print(result: PhaseResult, mode: str) -> None:
    scrapes = result.extra.get("scrapes")
    scraped = "" if not scrapes else (
        f"  scrapes {scrapes['scrapes']} (failed {scrapes['failures']}) p50 "
        f"{scrapes['scrape_ms_p50']:.1f} ms max {scrapes['scrape_ms_max']:.1f} ms")
    print(f"  r{result.repeat} metrics {mode:<3} {result.phase:<15} "
          f"{result.seconds:6.2f} s {result.mb_per_s:7.1f} MB/s {result.msgs_per_s:9,.0f} "
          f"msgs/s  cpu brokers {result.cpu.broker_pct:4.0f}% box "
          f"{result.cpu.box_busy_pct:4.0f}%{scraped}"
          f"{'' if result.ok else '  FAILED: ' + result.note.strip()[:200]}", flush=True)


def run_section(options: Options, root: Path, payload: bytes, run: Run) -> None:
    print("metrics on vs off (interleaved):", flush=True)
    for repeat in range(options.repeats):
        order = MODES if repeat % 2 == 0 else tuple(reversed(MODES))
        for mode in order:
            run_mode(options, root / f"metrics-{mode}-r{repeat}", repeat, mode, payload, run)


def report(options: Options, run: Run) -> dict[str, Any]:
    """Prints the on/off table and the target lines; returns them for the JSON."""
    import _raftlog_cluster as side

    rows: list[dict[str, Any]] = []
    print(f"\n=== metrics on (listener + a scrape of every node every {SCRAPE_INTERVAL_S:.0f} s)"
          f" vs off: {options.records:,} x {options.record_bytes} B, {options.repeats} "
          "repeats; median (min-max) ===")
    for p, idempotent in throughput_phases(options):
        phase = side.phase_name(p, idempotent)
        by_mode = {mode: [r for r in run.phases if (r.system, r.phase) == (SYSTEM[mode], phase)]
                   for mode in MODES}
        msgs = {mode: Spread.of([r.msgs_per_s if r.ok else float("nan")
                                 for r in by_mode[mode]]) for mode in MODES}
        cpu = {mode: Spread.of([r.cpu.broker_pct for r in by_mode[mode] if r.ok])
               for mode in MODES}
        per_repeat = []
        for repeat in range(options.repeats):
            on = [r for r in by_mode["on"] if r.repeat == repeat and r.ok]
            off = [r for r in by_mode["off"] if r.repeat == repeat and r.ok]
            if on and off and off[0].msgs_per_s > 0:
                per_repeat.append(1 - on[0].msgs_per_s / off[0].msgs_per_s)
        cost = 1 - msgs["on"].median / msgs["off"].median if msgs["off"].median > 0 \
            else float("nan")
        scrapes = [r.extra["scrapes"] for r in by_mode["on"] if "scrapes" in r.extra]
        row: dict[str, Any] = {
            "phase": phase, "msgs_per_s_on": vars(msgs["on"]),
            "msgs_per_s_off": vars(msgs["off"]), "cost": cost, "cost_per_repeat": per_repeat,
            "brokers_cpu_pct_on": vars(cpu["on"]), "brokers_cpu_pct_off": vars(cpu["off"]),
            "scrapes": scrapes}
        rows.append(row)
        spread = (f" (per repeat {min(per_repeat):+.1%}..{max(per_repeat):+.1%})"
                  if len(per_repeat) > 1 else "")
        print(f"  {phase:<16} on {_cell(msgs['on'])} msgs/s  off {_cell(msgs['off'])} msgs/s  "
              f"cost {cost:+.1%}{spread}  brokers CPU on {cpu['on'].median:.0f}% off "
              f"{cpu['off'].median:.0f}%  scrapes {sum(s['scrapes'] for s in scrapes)} "
              f"(failed {sum(s['failures'] for s in scrapes)})")
    print("targets (medians):")
    for row in rows:
        passed = row["cost"] < TARGET_COST
        print(f"  {'PASS' if passed else 'MISS'}  metrics cost < {TARGET_COST:.0%} of msgs/s "
              f"({row['phase']}): {row['cost']:+.1%}")
        row["pass"] = passed
    return {"metrics_cost": rows, "metrics_cost_target": TARGET_COST}


def _cell(spread: Spread) -> str:
    values = [v for v in spread.values if v == v]
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{spread.median:,.0f}"
    return f"{spread.median:,.0f} ({spread.low:,.0f}-{spread.high:,.0f})"
