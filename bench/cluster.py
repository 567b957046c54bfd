"""Multi-node benchmarks: a 3-node raftlog cluster (`raftlog cluster up`) vs NATS JetStream R3.

    python bench/cluster.py [--records N] [--repeats 3] [--json out.json]
                            [--partitions 1,3] [--failover-trials 5] [--profile-dir DIR]

One run measures four things (see bench/README.md):

1. Throughput: N x 1 KiB records produced with confluent-kafka (acks=all, linger.ms=5,
   batch.size=1 MB, librdkafka's defaults otherwise: idempotence off, many requests in
   flight) to a replication-factor-3 topic (1 partition, and 3 partitions) of a fresh 3-node
   cluster, then 1 partition again with enable.idempotence=true (reported, no target: the
   idempotent librdkafka keeps one request in flight per partition), next to nats-py
   publishing to an R3 file stream of three clustered nats-servers (at most 1000 acks in
   flight, no Nats-Msg-Id dedupe). Repeats are interleaved: raftlog, NATS, raftlog, NATS, ...
2. Failover: one-record-at-a-time acks=all idempotent produces; SIGKILL of the partition
   leader's process between two produces; time from the kill to the next acknowledged produce.
   The node is restarted and back in the ISR before the next trial.
3. Startup: launch of `raftlog cluster up --nodes 3` on a fresh data dir until its
   `bootstrap.servers=` line; the same on the existing data dir after each throughput repeat.
4. Memory: VmRSS of each node process ~5 s after startup with one topic created.
5. Metrics: the throughput section's raftlog produce phases with metrics on (every node's
   metrics.listener, scraped every second as Prometheus would) vs off, interleaved, and the
   cost in msgs/s (target: under 3%); see _metrics_cost.py.

It prints one table and PASS/MISS lines. It is a benchmark, not a test: the exit status is 0
whatever the figures (2 when a prerequisite is missing).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

from _cluster_results import (
    DURABILITY_NOTE,
    NOISE_NOTE,
    SECTIONS,
    TARGET_FAILOVER_MEDIAN_S,
    TARGET_PRODUCE_MB_S,
    TARGET_PRODUCE_VS_NATS,
    TARGET_RSS_MB,
    TARGET_STARTUP_S,
    Launch,
    Memory,
    Options,
    Run,
    failed_phase,
    report,
    throughput_phases,
)
from _support import MB, PhaseResult, check_prerequisites, run_header, write_json
from _support import environment as common_environment


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000, help="records per produce phase")
    parser.add_argument("--record-bytes", type=int, default=1024, help="payload size")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved A/B repeats")
    parser.add_argument("--json", type=Path, default=None, help="write every raw number here")
    parser.add_argument("--partitions", default="1,3",
                        help="raftlog topic sizes to produce to, comma-separated (default 1,3)")
    parser.add_argument("--nats-window", type=int, default=1000,
                        help="max unacknowledged NATS async publishes")
    parser.add_argument("--failover-trials", type=int, default=5)
    parser.add_argument("--startup-repeats", type=int, default=3,
                        help="at least this many fresh `cluster up` launches are timed")
    parser.add_argument("--memory-wait", type=float, default=5.0,
                        help="seconds after the topic is created before VmRSS is read")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"which measurements to run (default {','.join(SECTIONS)})")
    parser.add_argument("--profile-dir", type=Path, default=None,
                        help="after everything, one extra 1-partition produce phase with py-spy "
                             "on the partition leader and a follower; output goes here")
    parser.add_argument("--profile-records", type=int, default=500_000)
    parser.add_argument("--keep-logs", type=Path, default=None,
                        help="copy every server and supervisor log into this directory")
    parser.add_argument("--metrics-modes", default="on,off",
                        help="the metrics section's clusters, compared with off: on (listener + "
                             "a scraper process), listener (listener, never scraped), off")
    args = parser.parse_args(argv)
    try:
        partitions = sorted({int(p) for p in args.partitions.split(",") if p.strip()})
    except ValueError:
        parser.error("--partitions takes comma-separated integers")
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if unknown := set(sections) - set(SECTIONS):
        parser.error(f"unknown --sections {sorted(unknown)}")
    modes = tuple(m.strip() for m in args.metrics_modes.split(",") if m.strip())
    if not set(modes) <= {"on", "listener", "off"} or "off" not in modes or len(modes) < 2:
        parser.error("--metrics-modes: off and at least one of on, listener")
    if args.records < 1 or args.record_bytes < 1 or args.repeats < 1 or not partitions \
            or min(partitions) < 1:
        parser.error("--records, --record-bytes, --repeats and --partitions must be positive")
    return Options(args.records, args.record_bytes, args.repeats, args.json, partitions,
                   args.nats_window, args.failover_trials, args.startup_repeats,
                   args.memory_wait, sections, args.profile_dir, args.profile_records,
                   args.keep_logs, modes)


def _save_logs(options: Options, sources: Sequence[Path], prefix: str) -> None:
    if options.keep_logs is None:
        return
    options.keep_logs.mkdir(parents=True, exist_ok=True)
    for source in sources:
        if source.exists():
            name = f"{prefix}-{source.parent.name}-{source.name}"
            shutil.copyfile(source, options.keep_logs / name)


def _cluster_logs(cluster: Any) -> list[Path]:
    return [cluster.supervisor_log, *sorted(cluster.data_dir.glob("node-*/server.log"))]


def print_phase(result: PhaseResult) -> None:
    status = "" if result.ok else f"  FAILED: {result.note.strip().splitlines()[0][:200]}"
    extra = result.extra
    by_node = "/".join(f"{v:.0f}" for v in extra.get("cpu_pct_by_node", {}).values())
    print(f"  r{result.repeat} {result.system:<7} {result.phase:<11} {result.seconds:7.2f} s "
          f"{result.mb_per_s:7.1f} MB/s {result.msgs_per_s:9,.0f} msgs/s  cpu brokers "
          f"{result.cpu.broker_pct:4.0f}% ({by_node}) client {result.cpu.client_pct:4.0f}% "
          f"box {result.cpu.box_busy_pct:4.0f}%{status}", flush=True)


# -- the measurements ---------------------------------------------------------------------------


def run_raftlog_throughput(options: Options, workdir: Path, repeat: int, payload: bytes,
                           run: Run) -> None:
    """Fresh cluster (timed launch), produce to each topic size, stop (timed), launch again
    on the same data (timed restart) and check the end offsets survived, stop."""
    import _raftlog_cluster as side

    cluster = side.RaftlogCluster(workdir / "cluster")
    done: list[PhaseResult] = []
    try:
        run.launches.append(Launch("fresh", cluster.up(), f"throughput r{repeat}"))
        for p, idempotent in throughput_phases(options):
            cluster.create_topic(side.phase_name(p, idempotent).replace("produce", "bench"), p)
        for p, idempotent in throughput_phases(options):
            topic = side.phase_name(p, idempotent).replace("produce", "bench")
            result = side.produce(cluster, topic, p, repeat, options.records, payload,
                                  idempotent)
            done.append(result)
            run.phases.append(result)
            print_phase(result)
        if len(cluster.node_pids()) != 3:
            raise RuntimeError(f"a node died during the produce phases:\n{cluster.log_tail()}")
        run.launches.append(Launch("stop", cluster.stop(), f"throughput r{repeat}"))
        data = cluster.data_bytes()
        seconds = cluster.up()
        expected = {r.extra["topic"]: r.records + 1 for r in done if r.ok}
        sizes = {r.extra["topic"]: r.extra["partitions"] for r in done if r.ok}
        found = {topic: sum(side.end_offsets(cluster.bootstrap, topic, sizes[topic]))
                 for topic in expected}  # +1: the untimed warm-up record
        note = "" if found == expected else f"end offsets after restart {found}, " \
            f"expected {expected}"
        run.launches.append(Launch("restart", seconds, f"throughput r{repeat}", data, note))
        print(f"  r{repeat} raftlog restart on {data / MB:,.0f} MB of data: {seconds:.2f} s"
              f"{'  ! ' + note if note else ''}", flush=True)
    except Exception as exc:
        traceback.print_exc()
        run.errors.append(f"raftlog throughput r{repeat}: {exc!r}")
        names = {r.phase for r in done}
        for p, idempotent in throughput_phases(options):
            if side.phase_name(p, idempotent) not in names:
                run.phases.append(failed_phase("raftlog", side.phase_name(p, idempotent),
                                               repeat, f"{exc!r}\n{cluster.log_tail(1500)}"))
    finally:
        cluster.stop()
        _save_logs(options, _cluster_logs(cluster), f"throughput-r{repeat}")
        shutil.rmtree(workdir, ignore_errors=True)


def run_nats_throughput(options: Options, workdir: Path, repeat: int, payload: bytes,
                        run: Run) -> None:
    import _nats_cluster

    nats = _nats_cluster.NatsCluster(workdir)
    try:
        nats.start()
        nats.create_stream()
        result = nats.publish(repeat, options.records, payload, options.nats_window)
        run.phases.append(result)
        print_phase(result)
    except Exception as exc:
        traceback.print_exc()
        run.errors.append(f"nats r{repeat}: {exc!r}")
        run.phases.append(failed_phase("nats", "produce-1p", repeat,
                                       f"{exc!r}\n{nats.log_tail()}"))
    finally:
        nats.stop()
        _save_logs(options, [s.log_path for s in nats.servers.values()], f"nats-r{repeat}")
        shutil.rmtree(workdir, ignore_errors=True)


def run_startup_only(options: Options, workdir: Path, index: int, run: Run) -> None:
    """A fresh launch, a stop, a restart on the (nearly empty) data dir, a stop."""
    import _raftlog_cluster as side

    cluster = side.RaftlogCluster(workdir / "cluster")
    try:
        run.launches.append(Launch("fresh", cluster.up(), f"startup {index}"))
        run.launches.append(Launch("stop", cluster.stop(), f"startup {index}"))
        data = cluster.data_bytes()
        run.launches.append(Launch("restart", cluster.up(), f"startup {index}", data))
    except Exception as exc:
        traceback.print_exc()
        run.errors.append(f"startup {index}: {exc!r}")
    finally:
        cluster.stop()
        _save_logs(options, _cluster_logs(cluster), f"startup-{index}")
        shutil.rmtree(workdir, ignore_errors=True)


def run_memory_and_failover(options: Options, workdir: Path, run: Run) -> None:
    """Fresh cluster (a timed launch); one topic; VmRSS of every node `memory_wait_s` later;
    then the failover trials on the same cluster."""
    import _raftlog_cluster as side

    cluster = side.RaftlogCluster(workdir / "cluster")
    try:
        seconds = cluster.up()
        ready_at = time.monotonic()
        run.launches.append(Launch("fresh", seconds, "memory+failover"))
        if "memory" in options.sections:
            cluster.create_topic("idle", 1)
            time.sleep(max(0.0, options.memory_wait_s - (time.monotonic() - ready_at)))
            for node_id, pid in sorted(cluster.node_pids().items()):
                status = side.rss_kib(pid)
                run.memory.append(Memory(node_id, pid, status["VmRSS"], status["VmHWM"],
                                         status.get("RssAnon", 0), status.get("RssFile", 0),
                                         time.monotonic() - ready_at))
            assert cluster.supervisor is not None
            run.supervisor_rss_kib = side.rss_kib(cluster.supervisor.pid)["VmRSS"]
            print("  idle RSS: " + ", ".join(
                f"node {m.node} {m.rss_kib / 1000 * 1.024:.1f} MB" for m in run.memory)
                + f"; supervisor {run.supervisor_rss_kib * 1.024 / 1000:.1f} MB", flush=True)
        if "failover" in options.sections:
            for trial in range(options.failover_trials):
                _ensure_all_nodes(cluster)
                try:
                    result = side.failover_trial(cluster, trial)
                except Exception as exc:
                    traceback.print_exc()
                    run.errors.append(f"failover trial {trial}: {exc!r}")
                    continue
                run.trials.append(result)
                print(f"  failover {trial}: killed node {result.killed_node}"
                      f"{' (controller)' if result.killed_was_controller else ''} -> next ack "
                      f"{result.failover_s:.2f} s, new leader {result.new_leader} visible "
                      f"{result.new_leader_visible_s:.2f} s; back in ISR "
                      f"{result.rejoin_isr_s:.2f} s after restart; acks before kill p50 "
                      f"{result.ack_latency_ms_p50:.2f} ms p99 {result.ack_latency_ms_p99:.2f}"
                      f" ms{'  ! ' + result.note if result.note else ''}", flush=True)
    except Exception as exc:
        traceback.print_exc()
        run.errors.append(f"memory/failover: {exc!r}\n{cluster.log_tail(1500)}")
    finally:
        cluster.stop()
        _save_logs(options, _cluster_logs(cluster), "failover")
        shutil.rmtree(workdir, ignore_errors=True)


def _ensure_all_nodes(cluster: Any) -> None:
    """After a failed trial: restart any node that is not running, wait for full ISRs."""
    import _raftlog_cluster as side

    missing = [n for n in range(1, cluster.nodes + 1) if n not in cluster.node_pids()]
    for node_id in missing:
        cluster.restart_node(node_id)
    if missing:
        side.wait_until(lambda: len(cluster.node_pids()) == cluster.nodes, 30, "nodes to start")
        time.sleep(3.0)


def run_profiled_produce(options: Options, workdir: Path, payload: bytes) -> dict[str, Any]:
    """One extra 1-partition produce with py-spy on the leader and one follower (untimed)."""
    import _profile
    import _raftlog_cluster as side

    assert options.profile_dir is not None
    options.profile_dir.mkdir(parents=True, exist_ok=True)
    cluster = side.RaftlogCluster(workdir / "cluster")
    spies: dict[str, _profile.PySpy] = {}
    out: dict[str, Any] = {}
    try:
        cluster.up()
        cluster.create_topic("bench-1p", 1)
        state = side.partition_state(cluster.admin(), "bench-1p")
        assert state is not None
        leader = int(state.leader)
        follower = next(n for n in state.replicas if n != leader)
        for role, node_id in (("leader", leader), ("follower", follower)):
            raw = options.profile_dir / f"raftlog-{role}-node{node_id}.pyspy.txt"
            spies[role] = _profile.PySpy(cluster.node_pid(node_id), raw,
                                         options.profile_dir / f"py-spy-{role}.log")
        result = side.produce(cluster, "bench-1p", 1, -1, options.profile_records, payload)
        for spy in spies.values():
            spy.stop()
        out["phase"] = result.as_json()
        text = [f"raftlog RF3 1-partition produce under py-spy (leader node {leader}, follower "
                f"node {follower}): {result.msgs_per_s:,.0f} msgs/s, {result.mb_per_s:.1f} MB/s"
                f", CPU by node {result.extra['cpu_pct_by_node']} (perturbed by sampling)"]
        for role, spy in spies.items():
            summary = _profile.summarise(spy.output, spy.seconds)
            out[role] = {"summary": summary.as_json(), "raw_stacks": str(spy.output)}
            text.append(f"--- {role} ---\n{_profile.render(summary)}")
        (options.profile_dir / "summary.txt").write_text("\n".join(text) + "\n")
        print("\n" + "\n".join(text))
    finally:
        for spy in spies.values():
            spy.stop()
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def environment() -> dict[str, Any]:
    import _raftlog_cluster

    return {
        **common_environment(),
        "throughput_producer_config": _raftlog_cluster.THROUGHPUT_PRODUCER_CONFIG,
        "failover_producer_config": _raftlog_cluster.FAILOVER_PRODUCER_CONFIG,
    }


def _raise_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # so that every finally block stops its servers


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    problem = check_prerequisites()
    if problem is not None:
        print(f"cannot run the benchmark: {problem}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    env = environment()
    print(run_header("raftlog 3-node cluster vs NATS JetStream R3 on 127.0.0.1", options, env,
                     f", partitions {options.partitions}"), flush=True)
    payload = os.urandom(options.record_bytes)
    run = Run()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="raftlog-cluster-bench-") as tmp:
        root = Path(tmp)
        if "throughput" in options.sections:
            print("throughput (interleaved):", flush=True)
            for repeat in range(options.repeats):
                run_raftlog_throughput(options, root / f"raftlog-r{repeat}", repeat, payload, run)
                run_nats_throughput(options, root / f"nats-r{repeat}", repeat, payload, run)
        if {"memory", "failover"} & set(options.sections):
            print("memory and failover:", flush=True)
            run_memory_and_failover(options, root / "failover", run)
        if "startup" in options.sections:
            fresh = sum(1 for x in run.launches if x.kind == "fresh")
            restarts = sum(1 for x in run.launches if x.kind == "restart")
            extra = max(options.startup_repeats - fresh, 1 if restarts == 0 else 0)
            for index in range(extra):
                run_startup_only(options, root / f"startup-{index}", index, run)
            print("startup: " + ", ".join(f"{x.kind} {x.seconds:.2f} s" for x in run.launches),
                  flush=True)
        if "metrics" in options.sections:
            import _metrics_cost

            _metrics_cost.run_section(options, root, payload, run)
        if options.profile_dir is not None:
            try:
                run.profile = run_profiled_produce(options, root / "profile", payload)
            except Exception:
                traceback.print_exc()
                print("profiling failed; the figures above are unaffected")
    out = report(options, run)
    if "metrics" in options.sections:
        import _metrics_cost

        out.update(_metrics_cost.report(options, run))
    env["loadavg_at_end"] = os.getloadavg()
    print(f"total run time {time.monotonic() - started:.0f} s")
    write_json(options.json_path, {
        "options": vars(options),
        "environment": env,
        "targets_config": {"produce_mb_per_s": TARGET_PRODUCE_MB_S,
                           "produce_vs_nats_msgs_per_s": TARGET_PRODUCE_VS_NATS,
                           "failover_median_s": TARGET_FAILOVER_MEDIAN_S,
                           "startup_s": TARGET_STARTUP_S, "rss_mb": TARGET_RSS_MB},
        "notes": [DURABILITY_NOTE, NOISE_NOTE],
        "phases": [r.as_json() for r in run.phases],
        "launches": [asdict(x) for x in run.launches],
        "memory": [asdict(m) for m in run.memory],
        "supervisor_rss_kib": run.supervisor_rss_kib,
        "failover_trials": [asdict(t) for t in run.trials],
        "errors": run.errors,
        **out,
        "profile": run.profile,
        "total_seconds": time.monotonic() - started,
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

