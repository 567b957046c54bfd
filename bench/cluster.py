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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from _support import MB, CpuUsage, PhaseResult, Spread, check_prerequisites, run_header, write_json
from _support import environment as common_environment

TARGET_PRODUCE_MB_S = 100.0
TARGET_PRODUCE_VS_NATS = 5.0
TARGET_FAILOVER_MEDIAN_S = 2.0
TARGET_STARTUP_S = 2.0
TARGET_RSS_MB = 80.0
DURABILITY_NOTE = (
    "Durability differs: raftlog acks an acks=all produce once all 3 ISR members have it (the "
    "leader fsyncs first); NATS R3 acks once 2 of 3 have it, without fsync (2.9 syncs every "
    "2 min). See /work/shared/reference/peer-baselines.md."
)
NOISE_NOTE = (
    "This 2-vCPU VM is shared: 3 brokers + the client run on 2 cores, other engineers' tests "
    "run too, and the same test varies up to ~2x between passes. Quote medians of interleaved "
    "repeats; 'box busy' is the load of every process on the machine."
)


@dataclass
class Options:
    records: int
    record_bytes: int
    repeats: int
    json_path: Path | None
    partitions: list[int]
    nats_window: int
    failover_trials: int
    startup_repeats: int
    memory_wait_s: float
    sections: list[str]
    profile_dir: Path | None
    profile_records: int
    keep_logs: Path | None


SECTIONS = ("throughput", "failover", "startup", "memory")


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
    args = parser.parse_args(argv)
    try:
        partitions = sorted({int(p) for p in args.partitions.split(",") if p.strip()})
    except ValueError:
        parser.error("--partitions takes comma-separated integers")
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if unknown := set(sections) - set(SECTIONS):
        parser.error(f"unknown --sections {sorted(unknown)}")
    if args.records < 1 or args.record_bytes < 1 or args.repeats < 1 or not partitions \
            or min(partitions) < 1:
        parser.error("--records, --record-bytes, --repeats and --partitions must be positive")
    return Options(args.records, args.record_bytes, args.repeats, args.json, partitions,
                   args.nats_window, args.failover_trials, args.startup_repeats,
                   args.memory_wait, sections, args.profile_dir, args.profile_records,
                   args.keep_logs)


# -- what one run collects -------------------------------------------------------------------


@dataclass
class Launch:
    """One timed `cluster up` launch (fresh or restart) or supervisor stop."""

    kind: str  # "fresh", "restart" or "stop"
    seconds: float
    context: str
    data_bytes: int = 0
    note: str = ""


@dataclass
class Memory:
    node: int
    pid: int
    rss_kib: int
    hwm_kib: int
    anon_kib: int
    file_kib: int
    seconds_after_ready: float


@dataclass
class Run:
    phases: list[PhaseResult] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    memory: list[Memory] = field(default_factory=list)
    supervisor_rss_kib: int = 0
    trials: list[Any] = field(default_factory=list)  # _raftlog_cluster.FailoverTrial
    errors: list[str] = field(default_factory=list)
    profile: dict[str, Any] | None = None


def failed_phase(system: str, phase: str, repeat: int, error: str) -> PhaseResult:
    nan = float("nan")
    return PhaseResult(system, phase, repeat, 0, 0, 0.0, CpuUsage(nan, nan, nan), ok=False,
                       note=error)


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


def throughput_phases(options: Options) -> list[tuple[int, bool]]:
    """(partitions, idempotent) of every raftlog produce phase: each topic size with
    librdkafka's defaults, then 1 partition again with enable.idempotence=true."""
    phases = [(p, False) for p in options.partitions]
    return [*phases, (1, True)] if 1 in options.partitions else phases


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


# -- the report ---------------------------------------------------------------------------------


def _spread(values: Sequence[float]) -> Spread:
    return Spread.of(list(values))


def _cell(spread: Spread, digits: int = 1) -> str:
    if spread.median != spread.median:
        return "n/a"
    if len([v for v in spread.values if v == v]) == 1:
        return f"{spread.median:,.{digits}f}"
    return f"{spread.median:,.{digits}f} ({spread.low:,.{digits}f}-{spread.high:,.{digits}f})"


def _ratios(run: Run, repeats: int, raftlog_phase: str) -> list[float]:
    """raftlog `raftlog_phase` msgs/s over NATS R3 msgs/s, per interleaved repeat."""
    ratios = []
    for repeat in range(repeats):
        a = [r for r in run.phases if (r.system, r.phase, r.repeat)
             == ("raftlog", raftlog_phase, repeat) and r.ok]
        b = [r for r in run.phases if (r.system, r.phase, r.repeat)
             == ("nats", "produce-1p", repeat) and r.ok]
        if a and b and b[0].msgs_per_s > 0:
            ratios.append(a[0].msgs_per_s / b[0].msgs_per_s)
    return ratios


def report(options: Options, run: Run) -> dict[str, Any]:
    rows: list[tuple[str, str, str, str]] = []  # section, measurement, value, n
    summary: dict[str, Any] = {}

    def add(section: str, name: str, values: Sequence[float], digits: int = 1,
            key: str | None = None) -> Spread:
        spread = _spread(values)
        n = len([v for v in values if v == v])
        rows.append((section, name, _cell(spread, digits), f"{n}/{len(values)}"))
        summary[key or f"{section}: {name}"] = vars(spread)
        return spread

    def ok_values(rows_: list[PhaseResult], get: Callable[[PhaseResult], float]) -> list[float]:
        return [get(r) if r.ok else float("nan") for r in rows_]

    raftlog_1p = nats_1p = Spread.of([])
    ratio_per_repeat: list[float] = []
    throughput_by_p: dict[int, Spread] = {}
    if "throughput" in options.sections:
        kinds = [("raftlog", p, idem) for p, idem in throughput_phases(options)] + \
                [("nats", 1, False)]
        for system, p, idem in kinds:
            phase = f"produce-{p}p" + ("-idem" if idem else "")
            results = [r for r in run.phases if (r.system, r.phase) == (system, phase)]
            label = f"raftlog RF3 {p}-partition" + (" idempotent" if idem else "") \
                if system == "raftlog" else "NATS JetStream R3"
            mb = add("throughput", f"{label} MB/s", ok_values(results, lambda r: r.mb_per_s),
                     key=f"{system} {phase} mb_per_s")
            msgs = add("throughput", f"{label} msgs/s",
                       ok_values(results, lambda r: r.msgs_per_s), 0,
                       key=f"{system} {phase} msgs_per_s")
            add("throughput", f"{label} CPU% brokers (sum of 3)",
                [r.cpu.broker_pct for r in results], 0, key=f"{system} {phase} brokers_cpu_pct")
            add("throughput", f"{label} CPU% leader(s)",
                [r.extra.get("leader_cpu_pct", float("nan")) for r in results], 0,
                key=f"{system} {phase} leader_cpu_pct")
            add("throughput", f"{label} CPU% client / box busy",
                [r.cpu.client_pct for r in results], 0, key=f"{system} {phase} client_cpu_pct")
            box = _spread([r.cpu.box_busy_pct for r in results])
            rows[-1] = (*rows[-1][:2], f"{rows[-1][2]} / {_cell(box, 0)}", rows[-1][3])
            summary[f"{system} {phase} box_busy_pct"] = vars(box)
            if system == "raftlog" and not idem:
                throughput_by_p[p] = mb
                if p == 1:
                    raftlog_1p = msgs
            else:
                nats_1p = msgs
        ratio_per_repeat = _ratios(run, options.repeats, "produce-1p")
        add("throughput", "raftlog 1-partition / NATS R3 msgs/s (per repeat)",
            ratio_per_repeat, 2, key="ratio per repeat")
        idem_ratios = _ratios(run, options.repeats, "produce-1p-idem")
        if idem_ratios:
            add("throughput", "raftlog 1-partition idempotent / NATS R3 (per repeat)",
                idem_ratios, 2, key="idempotent ratio per repeat")

    failover = Spread.of([])
    if "failover" in options.sections:
        trials = run.trials
        values = [t.failover_s for t in trials] + [float("nan")] * (
            options.failover_trials - len(trials))
        failover = add("failover", "SIGKILL leader -> next ack, s", values, 2,
                       key="failover_s")
        add("failover", "  ... when the leader was not the controller, s",
            [t.failover_s for t in trials if not t.killed_was_controller], 2,
            key="failover_s_non_controller")
        add("failover", "  ... when the leader was also the controller, s",
            [t.failover_s for t in trials if t.killed_was_controller], 2,
            key="failover_s_controller")
        add("failover", "SIGKILL leader -> new leader in Metadata, s",
            [t.new_leader_visible_s for t in trials], 2, key="new_leader_visible_s")
        add("failover", "new leader in Metadata -> next ack (client lag), s",
            [max(0.0, t.failover_s - t.new_leader_visible_s) for t in trials], 2,
            key="client_lag_s")  # < 0 only when the 50 ms Metadata poll saw it late
        add("failover", "restarted node back in ISR, s", [t.rejoin_isr_s for t in trials], 2,
            key="rejoin_isr_s")
        add("failover", "one-at-a-time acks=all produce p50, ms",
            [t.ack_latency_ms_p50 for t in trials], 2, key="sequential_ack_p50_ms")
        add("failover", "one-at-a-time acks=all produce p99, ms",
            [t.ack_latency_ms_p99 for t in trials], 2, key="sequential_ack_p99_ms")
        killed = ", ".join(f"{t.killed_node}{'*' if t.killed_was_controller else ''}"
                           for t in trials)
        rows.append(("failover", "killed nodes (* = was also the controller)", killed or "-",
                     str(len(trials))))

    fresh = restart = Spread.of([])
    if "startup" in options.sections:
        launches = run.launches
        fresh = add("startup", "cluster up, fresh data dir -> bootstrap line, s",
                    [x.seconds for x in launches if x.kind == "fresh"], 2, key="startup_fresh_s")
        restarts = [x for x in launches if x.kind == "restart"]
        restart = add("startup", "cluster up, existing data dir, s",
                      [x.seconds for x in restarts], 2, key="startup_restart_s")
        if restarts:
            rows[-1] = (rows[-1][0], rows[-1][1] + " (data: " + ", ".join(
                f"{x.data_bytes / MB:,.0f}" for x in restarts) + " MB)", *rows[-1][2:])
        add("startup", "supervisor stop (SIGTERM -> exit), s",
            [x.seconds for x in launches if x.kind == "stop"], 2, key="stop_s")

    rss_max = float("nan")
    if "memory" in options.sections and run.memory:
        for m in run.memory:
            rows.append(("memory", f"node {m.node} VmRSS idle (peak VmHWM), MB",
                         f"{m.rss_kib * 1.024 / 1000:.1f} ({m.hwm_kib * 1.024 / 1000:.1f})",
                         "1"))
        rows.append(("memory", "supervisor (cluster up) VmRSS, MB",
                     f"{run.supervisor_rss_kib * 1.024 / 1000:.1f}", "1"))
        rss_max = max(m.rss_kib for m in run.memory) * 1.024 / 1000

    print(f"\n=== raftlog 3-node cluster vs NATS JetStream R3 on 127.0.0.1: {options.records:,}"
          f" x {options.record_bytes} B, {options.repeats} interleaved repeats; median "
          "(min-max) ===")
    width = max(len(r[1]) for r in rows) if rows else 40
    header = f"{'section':<11} {'measurement':<{width}} {'value':>30} {'n':>5}"
    print(header)
    print("-" * len(header))
    last = ""
    for section, name, value, n in rows:
        print(f"{section if section != last else '':<11} {name:<{width}} {value:>30} {n:>5}")
        last = section
    print("(MB = 10^6 bytes; CPU in % of one core, 200% = the whole box; client = this process "
          "incl. librdkafka/asyncio threads)")

    targets: list[tuple[str, str, bool]] = []
    if "throughput" in options.sections:
        mb1 = throughput_by_p.get(1, Spread.of([])).median
        targets.append(("raftlog RF3 acks=all >= 100 MB/s (1 partition)", f"{mb1:.1f} MB/s",
                        mb1 >= TARGET_PRODUCE_MB_S))
        for p, spread in throughput_by_p.items():
            if p != 1:
                targets.append((f"raftlog RF3 produce >= 100 MB/s ({p} partitions)",
                                f"{spread.median:.1f} MB/s",
                                spread.median >= TARGET_PRODUCE_MB_S))
        ratio = raftlog_1p.median / nats_1p.median if nats_1p.median > 0 else float("nan")
        summary["ratio of medians"] = ratio
        per_repeat = f" (per repeat {min(ratio_per_repeat):.2f}-{max(ratio_per_repeat):.2f})" \
            if ratio_per_repeat else ""
        targets.append(("raftlog msgs/s >= 5x NATS R3 msgs/s", f"{ratio:.2f}x{per_repeat}",
                        ratio >= TARGET_PRODUCE_VS_NATS))
    if "failover" in options.sections:
        worst = max((t.failover_s for t in run.trials), default=float("nan"))
        targets.append(("failover median < 2 s", f"median {failover.median:.2f} s, max "
                        f"{worst:.2f} s", failover.median < TARGET_FAILOVER_MEDIAN_S))
    if "startup" in options.sections:
        targets.append(("startup (fresh data dir) < 2 s", f"median {fresh.median:.2f} s, max "
                        f"{fresh.high:.2f} s", fresh.median < TARGET_STARTUP_S))
        targets.append(("(info) restart on existing data < 2 s", f"median "
                        f"{restart.median:.2f} s", restart.median < TARGET_STARTUP_S))
    if "memory" in options.sections:
        targets.append(("idle RSS < 80 MB per node", f"max {rss_max:.1f} MB",
                        rss_max < TARGET_RSS_MB))
    print("\ntargets (medians):")
    for name, value, passed in targets:
        print(f"  {'PASS' if passed else 'MISS'}  {name:<46} {value}")
    for r in run.phases:
        if not r.ok:
            print(f"  ! {r.system} {r.phase} repeat {r.repeat} failed: {r.note.strip()[:600]}")
    for t in run.trials:
        if not t.ok:
            print(f"  ! failover trial {t.trial}: {t.note}")
    for x in run.launches:
        if x.note:
            print(f"  ! {x.kind} ({x.context}): {x.note}")
    for error in run.errors:
        print(f"  ! {error.strip()[:600]}")
    print(f"\nnote: {DURABILITY_NOTE}\nnote: {NOISE_NOTE}")
    return {"summary": summary,
            "table": [dict(zip(("section", "measurement", "value", "n"), r, strict=True))
                      for r in rows],
            "targets": [{"target": n, "value": v, "pass": p} for n, v, p in targets]}


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
        if options.profile_dir is not None:
            try:
                run.profile = run_profiled_produce(options, root / "profile", payload)
            except Exception:
                traceback.print_exc()
                print("profiling failed; the figures above are unaffected")
    out = report(options, run)
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

