"""Produce latency at fixed rates (issue 18): a 3-node raftlog cluster vs NATS JetStream R3.

    python bench/latency.py [--duration 20] [--repeats 1] [--json out.json] [--skip-nats]
                            [--scenarios 1mb-linger1,1mb-linger0,10mb-linger5,one-at-a-time]

What is measured, per repeat (raftlog first, then NATS, each on fresh servers):

- raftlog: `raftlog cluster up --nodes 3`, one topic with 1 partition, replication factor 3 and
  min.insync.replicas=2; confluent-kafka with acks=all (no idempotence) sends 1 KiB records
  - at 1 MB/s (1,000 records/s) with linger.ms=1 (1mb-linger1) and linger.ms=0 (1mb-linger0),
  - at 10 MB/s with linger.ms=5 (10mb-linger5),
  each on an absolute schedule (record i at start + i / rate) for --duration seconds after a
  2 s warm-up whose records are not counted; a record's latency is from its produce() call
  to its delivery report; and
  - one at a time (one-at-a-time): produce() one record, wait for its delivery report, then
    the next; --one-at-a-time-records of them after 50 uncounted ones.
- NATS: three clustered nats-servers with JetStream and one R3 file stream; nats-py publishes
  1 KiB messages to the stream leader at the same rates with js.publish_async() (latency: the
  call to its PubAck), and one at a time with `await js.publish()`. NATS has no linger, so one
  1 MB/s run is compared with both raftlog linger settings.

It prints one line per run, then a table of medians over the repeats (p50/p90/p99/max in ms,
records acknowledged and failed, the achieved rate: acknowledged records over the time from
the first counted send to the last acknowledgement), the raftlog/NATS ratios, and PASS/MISS
against the issue's targets: at 1 MB/s raftlog p99 <= 2 x NATS R3 p99; one at a time raftlog
p50 <= 2 ms. A benchmark, not a test: the exit status is 0 whatever the figures (2 when a
prerequisite is missing).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

from _cluster_results import DURABILITY_NOTE, NOISE_NOTE
from _latency import (
    NATS_LABELS,
    RECORD_BYTES,
    SCENARIOS,
    TARGET_ONE_AT_A_TIME_P50_MS,
    TARGET_P99_VS_NATS,
    LatencyRun,
    Options,
    Recorder,
    Scenario,
    diagnostic,
    nats_runs,
    report,
)
from _support import check_prerequisites, write_json
from _support import environment as common_environment

WARMUP_S = 2.0


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=20.0,
                        help="seconds each rate scenario is measured, after the warm-up")
    parser.add_argument("--warmup", type=float, default=WARMUP_S,
                        help="seconds sent before the measurement starts, not counted")
    parser.add_argument("--repeats", type=int, default=1,
                        help="repeats, each on fresh servers: raftlog, NATS, raftlog, ...")
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    parser.add_argument("--skip-nats", action="store_true", help="raftlog only")
    parser.add_argument("--scenarios", default=",".join(s.name for s in SCENARIOS),
                        help="comma-separated, of " + ", ".join(s.name for s in SCENARIOS))
    parser.add_argument("--one-at-a-time-records", type=int, default=1000,
                        help="counted records of the one-at-a-time scenario (at least 500)")
    parser.add_argument("--topic-config", action="append", default=[], metavar="K=V",
                        help="a topic config of the raftlog topic, over the bench's own (a "
                             "diagnostic: e.g. flush.messages=1000000000 and flush.ms="
                             "1000000000 ack without fsync, to split fsync from CPU; the "
                             "targets are then not judged)")
    parser.add_argument("--trace", action="store_true",
                        help="raftlog nodes time each replication stage (trace.produce.enable)"
                             " and the stage percentiles of each scenario are printed")
    args = parser.parse_args(argv)
    by_name = {s.name: s for s in SCENARIOS}
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    if not names or not set(names) <= set(by_name):
        parser.error(f"--scenarios: choose from {', '.join(by_name)}")
    if args.duration <= 0 or args.warmup < 0 or args.repeats < 1:
        parser.error("--duration and --repeats must be positive, --warmup not negative")
    if args.one_at_a_time_records < 500:
        parser.error("--one-at-a-time-records must be at least 500")
    topic_config: dict[str, str] = {}
    for item in args.topic_config:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--topic-config: K=V expected, got {item!r}")
        topic_config[key] = value
    chosen = [s for s in SCENARIOS if s.name in names]  # in the table's order
    return Options(args.duration, args.warmup, args.repeats, args.json, args.skip_nats, chosen,
                   args.one_at_a_time_records, args.trace, topic_config)


# -- one run --------------------------------------------------------------------------------------


def measure(system: str, name: str, label: str, repeat: int, rate_records_s: float,
            pids: Mapping[str, int], send: Callable[[], Recorder]) -> LatencyRun:
    """Run `send` with the servers' CPU measured; a failure becomes a run with its error."""
    from _raftlog_cluster import measure_cpu_pids

    try:
        with measure_cpu_pids(pids) as meter:
            recorder = send()
        run = LatencyRun.of(recorder, system, name, label, repeat, rate_records_s)
        run.cpu_pct = {"brokers": meter.brokers_pct, "client": meter.client_pct,
                       "box": meter.box_busy_pct}
    except Exception as exc:
        traceback.print_exc()
        run = LatencyRun.failure(system, name, label, repeat, rate_records_s, repr(exc))
    print(run.line(), flush=True)
    return run


def raftlog_send(options: Options, bootstrap: str, scenario: Scenario,
                 payload: bytes) -> Callable[[], Recorder]:
    import _latency_clients as clients

    if scenario.rate_records_s == 0:
        return lambda: clients.produce_one_at_a_time(bootstrap, options.one_at_a_time_records,
                                                     payload)
    return lambda: clients.produce_at_rate(bootstrap, scenario.rate_records_s,
                                           scenario.linger_ms, options.warmup_s,
                                           options.duration_s, payload)


def nats_send(options: Options, url: str, rate_records_s: float,
              payload: bytes) -> Callable[[], Recorder]:
    import _latency_clients as clients

    if rate_records_s == 0:
        return lambda: clients.publish_one_at_a_time(url, options.one_at_a_time_records, payload)
    return lambda: clients.publish_at_rate(url, rate_records_s, options.warmup_s,
                                           options.duration_s, payload)


@contextmanager
def uninterrupted() -> Iterator[None]:
    """SIGINT and SIGTERM wait while servers are being stopped (a second Ctrl-C would
    otherwise leave them running); a signal that came meanwhile is raised afterwards."""
    pending: list[int] = []
    previous = {s: signal.signal(s, lambda n, _f: pending.append(n))
                for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if pending:
            raise KeyboardInterrupt(f"signal {pending[0]}")


def run_raftlog(options: Options, workdir: Path, repeat: int, payload: bytes,
                runs: list[LatencyRun], errors: list[str]) -> None:
    import _latency_clients as clients
    from _raftlog_cluster import RaftlogCluster

    cluster = RaftlogCluster(workdir / "cluster", **TRACE_CLUSTER if options.trace else {})
    try:
        cluster.up()
        clients.create_topic(cluster, config=options.topic_config)
        pids = {f"node{n}": pid for n, pid in cluster.node_pids().items()}
        for scenario in options.scenarios:
            send = raftlog_send(options, cluster.bootstrap, scenario, payload)
            runs.append(measure("raftlog", scenario.name, scenario.label, repeat,
                                scenario.rate_records_s, pids, send))
            if options.trace:
                runs[-1].trace = trace_lines(cluster.data_dir)
                for line in trace_summary(runs[-1].trace):
                    print(f"    trace {line}", flush=True)
    except Exception as exc:
        traceback.print_exc()
        errors.append(f"raftlog r{repeat}: {exc!r}\n{cluster.log_tail(1500)}")
    finally:
        with uninterrupted():
            cluster.stop()
            shutil.rmtree(workdir, ignore_errors=True)


# --trace: every node logs its stage percentiles each second (raftlog.partition.append_trace);
# a scenario's lines are those logged until one interval after it ended.
TRACE_INTERVAL_MS = 1000
TRACE_CLUSTER: dict[str, Any] = {"log_level": "INFO", "cluster_args": [
    "--override", "trace.produce.enable=true",
    "--override", f"trace.produce.summary.interval.ms={TRACE_INTERVAL_MS}"]}


def trace_summary(lines: Sequence[str]) -> list[str]:
    """Per node and stage: the median over the 1 s windows of the window's p50 and p99 (the
    windows' own percentiles, not a percentile of all samples), in ms."""
    by_node: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for line in lines:
        node, _, rest = line.partition(": ")
        stages = by_node.setdefault(node, {})
        for stage, p50, p99 in re.findall(r"(\w+) p50 ([\d.]+) p99 ([\d.]+)", rest):
            stages.setdefault(stage, []).append((float(p50), float(p99)))
    out = []
    for node, stages in sorted(by_node.items()):
        cells = [f"{stage} {statistics.median(a for a, _ in v):.2f}/"
                 f"{statistics.median(b for _, b in v):.2f}" for stage, v in stages.items()]
        out.append(f"{node} (p50/p99 ms, median of {max(len(v) for v in stages.values())} "
                   f"windows): " + ", ".join(cells))
    return out


def trace_lines(data_dir: Path) -> list[str]:
    """The stage summaries the nodes logged since the last call (after one more interval, so
    that the scenario's last appends are in), each prefixed with its node."""
    time.sleep(TRACE_INTERVAL_MS / 1000 * 1.5)
    lines = []
    for log_path in sorted(data_dir.glob("node-*/server.log")):
        node = log_path.parent.name
        seen = _TRACE_SEEN.get(node, 0)
        found = [line.split("produce trace: ", 1)[1].rstrip()
                 for line in log_path.read_text(errors="replace").splitlines()
                 if "produce trace: " in line]
        _TRACE_SEEN[node] = len(found)
        lines += [f"{node}: {line}" for line in found[seen:]]
    return lines


_TRACE_SEEN: dict[str, int] = {}


def run_nats(options: Options, workdir: Path, repeat: int, payload: bytes,
             runs: list[LatencyRun], errors: list[str]) -> None:
    from _nats_cluster import NatsCluster

    nats = NatsCluster(workdir)
    try:
        nats.start()
        leader = nats.create_stream()
        for name, rate_records_s in nats_runs(options.scenarios):
            send = nats_send(options, nats.urls[leader], rate_records_s, payload)
            runs.append(measure("nats", name, NATS_LABELS[name], repeat, rate_records_s,
                                nats.pids, send))
    except Exception as exc:
        traceback.print_exc()
        errors.append(f"nats r{repeat}: {exc!r}\n{nats.log_tail()}")
    finally:
        with uninterrupted():
            nats.stop()
            shutil.rmtree(workdir, ignore_errors=True)


# -- the whole benchmark ----------------------------------------------------------------------


def environment(options: Options) -> dict[str, Any]:
    import _latency_clients as clients

    return {**common_environment(), "producer_config": clients.PRODUCER_CONFIG,
            "topic_config": {**clients.TOPIC_CONFIG, **options.topic_config},
            "record_bytes": RECORD_BYTES}


def header(options: Options, env: dict[str, Any]) -> str:
    return (f"produce latency, raftlog 3 nodes (RF 3, min.insync.replicas=2, acks=all) vs NATS "
            f"JetStream R3 on 127.0.0.1: {RECORD_BYTES} B records, {options.duration_s:g} s "
            f"per rate after {options.warmup_s:g} s of warm-up, "
            f"{options.one_at_a_time_records} one at a time, {options.repeats} repeat(s), "
            f"scenarios {','.join(s.name for s in options.scenarios)}"
            f"{' (NATS skipped)' if options.skip_nats else ''}"
            f"{f' (DIAGNOSTIC: {diagnostic(options)})' if options.topic_config else ''}"
            f"; {env['cpus']} CPUs, load avg "
            f"{env['loadavg_at_start'][0]:.2f}; confluent-kafka {env['confluent_kafka']} "
            f"(librdkafka {env['librdkafka']}), nats-py {env['nats_py']}, {env['nats_server']}")


def _raise_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # so that every finally block stops its servers


def run_all(options: Options, runs: list[LatencyRun], errors: list[str]) -> None:
    payload = os.urandom(RECORD_BYTES)
    with tempfile.TemporaryDirectory(prefix="raftlog-latency-bench-") as tmp:
        root = Path(tmp)
        for repeat in range(options.repeats):
            run_raftlog(options, root / f"raftlog-r{repeat}", repeat, payload, runs, errors)
            if not options.skip_nats:
                run_nats(options, root / f"nats-r{repeat}", repeat, payload, runs, errors)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    problem = check_prerequisites()
    if problem is not None:
        print(f"cannot run the benchmark: {problem}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    env = environment(options)
    print(header(options, env), flush=True)
    runs: list[LatencyRun] = []
    errors: list[str] = []
    started = time.monotonic()
    try:
        run_all(options, runs, errors)
    except KeyboardInterrupt:
        print("interrupted: every server this run started has been stopped", file=sys.stderr)
        return 130
    out = report(options, runs)
    for error in errors:
        print(f"error: {error.splitlines()[0]}")
    env["loadavg_at_end"] = os.getloadavg()
    print(f"total run time {time.monotonic() - started:.0f} s")
    write_json(options.json_path, {
        "options": {**vars(options), "scenarios": [asdict(s) for s in options.scenarios]},
        "environment": env,
        "targets_config": {"p99_at_1mb_vs_nats": TARGET_P99_VS_NATS,
                           "one_at_a_time_p50_ms": TARGET_ONE_AT_A_TIME_P50_MS},
        "notes": [DURABILITY_NOTE, NOISE_NOTE],
        "runs": [asdict(r) for r in runs],
        "errors": errors,
        **out,
        "total_seconds": time.monotonic() - started,
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
