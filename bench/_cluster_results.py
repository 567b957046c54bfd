"""The cluster benchmark's options, what one run collects, and its report: the table of
medians (min-max) over repeats and the PASS/MISS lines against the targets. The
measurements themselves are in ``cluster.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _support import MB, CpuUsage, PhaseResult, Spread

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
    metrics_modes: tuple[str, ...] = ("on", "off")


SECTIONS = ("throughput", "failover", "startup", "memory", "metrics")


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


def throughput_phases(options: Options) -> list[tuple[int, bool]]:
    """(partitions, idempotent) of every raftlog produce phase: each topic size with
    librdkafka's defaults, then 1 partition again with enable.idempotence=true."""
    phases = [(p, False) for p in options.partitions]
    return [*phases, (1, True)] if 1 in options.partitions else phases


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
