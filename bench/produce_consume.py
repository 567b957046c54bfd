"""Single-node throughput: raftlog (confluent-kafka, acks=all, fsynced) vs NATS JetStream R1.

    python bench/produce_consume.py [--records N] [--record-bytes 1024] [--repeats 3]
                                    [--json out.json] [--profile-dir DIR]
                                    [--security plaintext|ssl|both] [--no-nats]

Each repeat starts a fresh raftlog node and a fresh nats-server (interleaved: raftlog, nats,
raftlog, nats, ...), produces N records of --record-bytes to a 1-partition topic / R1 file
stream, reads them all back, and stops the server. ``--security ssl`` has the clients use an
SSL listener (a throwaway CA and server certificate made with ``cryptography``); ``both`` runs
raftlog over PLAINTEXT and over SSL in every repeat and reports the SSL/PLAINTEXT ratios;
``--no-nats`` leaves NATS out. It prints medians and ranges, the
raftlog/NATS ratios and PASS/MISS against the targets. It is a benchmark, not a test: the exit
status is 0 whatever the figures (2 only when a prerequisite is missing). See bench/README.md.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _support import (
    CpuUsage,
    PhaseResult,
    Spread,
    check_prerequisites,
    environment,
    run_header,
    write_json,
)

TARGET_PRODUCE_MB_S = 200.0
TARGET_PRODUCE_VS_NATS = 3.0
TARGET_CONSUME_MB_S = 300.0
SYSTEMS = ("raftlog", "raftlog-ssl", "nats")  # the report's order; a run has some of them
PHASES = ("produce", "consume")
DURABILITY_NOTE = (
    "Durability differs: raftlog acks acks=all produce only after fsync; NATS 2.9 acks a "
    "JetStream publish without fsync (it syncs every 2 min; 2.9.10 has no sync_interval). "
    "See /work/shared/reference/peer-baselines.md."
)
NOISE_NOTE = (
    "This 2-vCPU VM is shared: the same test varies up to ~2x between passes. Medians of "
    "interleaved repeats are the figures to quote; 'box busy' shows the load of every process."
)


@dataclass
class Options:
    records: int
    record_bytes: int
    repeats: int
    json_path: Path | None
    nats_window: int
    nats_fetch_batch: int
    profile_dir: Path | None
    profile_records: int
    keep_logs: Path | None
    security: str = "plaintext"
    nats: bool = True


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000, help="records per phase")
    parser.add_argument("--record-bytes", type=int, default=1024, help="payload size")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved A/B repeats")
    parser.add_argument("--json", type=Path, default=None, help="write every raw number here")
    parser.add_argument("--nats-window", type=int, default=1000,
                        help="max unacknowledged NATS async publishes")
    parser.add_argument("--nats-fetch-batch", type=int, default=1000,
                        help="messages per NATS pull fetch()")
    parser.add_argument("--profile-dir", type=Path, default=None,
                        help="after the repeats, run one extra raftlog produce phase under "
                             "py-spy and write the raw stacks and a summary here")
    parser.add_argument("--profile-records", type=int, default=1_000_000,
                        help="records in the profiled produce phase (long enough to sample)")
    parser.add_argument("--keep-logs", type=Path, default=None,
                        help="copy each server's log into this directory")
    parser.add_argument("--security", choices=("plaintext", "ssl", "both"),
                        default="plaintext", help="how the clients reach raftlog")
    parser.add_argument("--no-nats", action="store_true", help="leave NATS out")
    args = parser.parse_args(argv)
    if args.records < 1 or args.record_bytes < 1 or args.repeats < 1:
        parser.error("--records, --record-bytes and --repeats must be positive")
    return Options(args.records, args.record_bytes, args.repeats, args.json, args.nats_window,
                   args.nats_fetch_batch, args.profile_dir, args.profile_records,
                   args.keep_logs, args.security, not args.no_nats)


def failed_phase(system: str, phase: str, repeat: int, error: str) -> PhaseResult:
    nan = float("nan")
    return PhaseResult(system, phase, repeat, 0, 0, 0.0, CpuUsage(nan, nan, nan), ok=False,
                       note=error)


def _save_log(options: Options, source: Path, name: str) -> None:
    if options.keep_logs is not None and source.exists():
        options.keep_logs.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, options.keep_logs / name)


def run_raftlog(options: Options, workdir: Path, repeat: int, payload: bytes,
                ssl: bool = False) -> list[PhaseResult]:
    import _raftlog_side as side

    workdir.mkdir()
    node = side.RaftlogNode(workdir, ssl=ssl)
    results: list[PhaseResult] = []
    try:
        node.start()
        node.create_topic()
        results.append(side.produce(node, repeat, options.records, payload))
        results.append(side.consume(node, repeat, options.records, options.record_bytes))
        if not node.server.alive():
            results[-1].ok = False
            results[-1].note += " broker died"
    except Exception as exc:
        traceback.print_exc()
        tail = node.server.log_tail(1500)
        done = {r.phase for r in results}
        results += [failed_phase(node.system, p, repeat, f"{exc!r}\n{tail}")
                    for p in PHASES if p not in done]
    finally:
        code = node.stop()
        _save_log(options, node.server.log_path, f"{node.system}-r{repeat}.log")
        shutil.rmtree(workdir, ignore_errors=True)
    for result in results:
        result.extra["broker_exit_code"] = code
    return results


def run_nats(options: Options, workdir: Path, repeat: int, payload: bytes) -> list[PhaseResult]:
    import _nats_side as side

    workdir.mkdir()
    node = side.NatsNode(workdir)
    results: list[PhaseResult] = []
    try:
        node.start()
        node.create_stream()
        results.append(side.publish(node, repeat, options.records, payload,
                                    options.nats_window))
        results.append(side.consume(node, repeat, options.records, options.record_bytes,
                                    options.nats_fetch_batch))
    except Exception as exc:
        traceback.print_exc()
        done = {r.phase for r in results}
        results += [failed_phase("nats", p, repeat, f"{exc!r}\n{node.server.log_tail(1500)}")
                    for p in PHASES if p not in done]
    finally:
        node.stop()
        _save_log(options, node.server.log_path, f"nats-r{repeat}.log")
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def run_profiled_produce(options: Options, workdir: Path, payload: bytes) -> dict[str, Any]:
    """One extra raftlog produce phase with py-spy attached to the broker (not in the table)."""
    import _profile
    import _raftlog_side as side

    assert options.profile_dir is not None
    options.profile_dir.mkdir(parents=True, exist_ok=True)
    raw = options.profile_dir / "raftlog-produce.pyspy.txt"
    workdir.mkdir()
    node = side.RaftlogNode(workdir)
    spy: _profile.PySpy | None = None
    try:
        node.start()
        node.create_topic()
        spy = _profile.PySpy(node.server.pid, raw, options.profile_dir / "py-spy.log")
        result = side.produce(node, -1, options.profile_records, payload)
        spy.stop()
    finally:
        if spy is not None:
            spy.stop()
        node.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    summary = _profile.summarise(raw, spy.seconds)
    text = _profile.render(summary)
    (options.profile_dir / "summary.txt").write_text(
        f"raftlog produce under py-spy: {result.msgs_per_s:,.0f} msgs/s, "
        f"{result.mb_per_s:.1f} MB/s (perturbed by sampling)\n{text}\n")
    print(f"\nprofiled raftlog produce (py-spy attached, not counted above): "
          f"{result.msgs_per_s:,.0f} msgs/s, {result.mb_per_s:.1f} MB/s, broker CPU "
          f"{result.cpu.broker_pct:.0f}%")
    print(text)
    print(f"raw stacks: {raw}")
    return {"phase": result.as_json(), "summary": summary.as_json(), "raw_stacks": str(raw)}


def _fmt(spread: Spread, digits: int = 1, scale: float = 1.0) -> str:
    if spread.median != spread.median:
        return "n/a"
    m, lo, hi = spread.median / scale, spread.low / scale, spread.high / scale
    return f"{m:,.{digits}f} ({lo:,.{digits}f}-{hi:,.{digits}f})"


def summarise(results: list[PhaseResult]) -> dict[str, dict[str, dict[str, Spread]]]:
    metrics: dict[str, Callable[[PhaseResult], float]] = {
        "mb_per_s": lambda r: r.mb_per_s if r.ok else float("nan"),
        "msgs_per_s": lambda r: r.msgs_per_s if r.ok else float("nan"),
        "broker_cpu_pct": lambda r: r.cpu.broker_pct,
        "client_cpu_pct": lambda r: r.cpu.client_pct,
        "box_busy_pct": lambda r: r.cpu.box_busy_pct,
        "seconds": lambda r: r.seconds if r.ok else float("nan"),
    }
    out: dict[str, dict[str, dict[str, Spread]]] = {}
    for system in [s for s in SYSTEMS if any(r.system == s for r in results)]:
        for phase in PHASES:
            rows = [r for r in results if r.system == system and r.phase == phase]
            out.setdefault(system, {})[phase] = {
                name: Spread.of([get(r) for r in rows]) for name, get in metrics.items()
            }
    return out


def pair_ratios(results: list[PhaseResult], phase: str, over: str = "raftlog",
                under: str = "nats") -> list[float]:
    """over/under msgs/s (raftlog/NATS by default) for each repeat where both succeeded."""
    ratios = []
    for repeat in sorted({r.repeat for r in results}):
        a = [r for r in results if (r.system, r.phase, r.repeat) == (over, phase, repeat)]
        b = [r for r in results if (r.system, r.phase, r.repeat) == (under, phase, repeat)]
        if a and b and a[0].ok and b[0].ok and b[0].msgs_per_s > 0:
            ratios.append(a[0].msgs_per_s / b[0].msgs_per_s)
    return ratios


def report(options: Options, results: list[PhaseResult]) -> dict[str, Any]:
    summary = summarise(results)
    print(f"\n=== {options.records:,} records x {options.record_bytes} B, {options.repeats} "
          "interleaved repeats: median (min-max) ===")
    header = (f"{'system':<11} {'phase':<8} {'MB/s':>24} {'msgs/s':>28} {'broker CPU%':>13} "
              f"{'client CPU%':>13} {'box busy%':>11}")
    print(header)
    print("-" * len(header))
    for phase in PHASES:
        for system in summary:
            s = summary[system][phase]
            print(f"{system:<11} {phase:<8} {_fmt(s['mb_per_s']):>24} "
                  f"{_fmt(s['msgs_per_s'], 0):>28} {s['broker_cpu_pct'].median:>13.0f} "
                  f"{s['client_cpu_pct'].median:>13.0f} {s['box_busy_pct'].median:>11.0f}")
    print("(MB = 10^6 payload bytes; CPU in % of one core, 200% = the whole box; client = this "
          "process incl. librdkafka/asyncio threads)")

    ratios: dict[str, dict[str, float | list[float]]] = {}
    nan_spread = Spread.of([])
    print()
    tls = ssl_ratios(results, summary)
    for phase in PHASES:
        a = summary.get("raftlog", {}).get(phase, {}).get("msgs_per_s", nan_spread).median
        b = summary.get("nats", {}).get(phase, {}).get("msgs_per_s", nan_spread).median
        median_ratio = a / b if b == b and b > 0 else float("nan")
        per_repeat = pair_ratios(results, phase)
        ratios[phase] = {"of_medians": median_ratio, "per_repeat": per_repeat}
        spread = f" (per repeat {min(per_repeat):.2f}-{max(per_repeat):.2f})" if per_repeat \
            else ""
        print(f"ratio raftlog/NATS {phase} msgs/s: {median_ratio:.2f}x{spread}")

    plain = summary.get("raftlog", summary.get("raftlog-ssl", {}))
    produce_mb = plain.get("produce", {}).get("mb_per_s", nan_spread).median
    consume_mb = plain.get("consume", {}).get("mb_per_s", nan_spread).median
    produce_ratio = float(ratios["produce"]["of_medians"])  # type: ignore[arg-type]
    targets = [
        ("raftlog produce >= 200 MB/s", f"{produce_mb:.1f} MB/s",
         produce_mb >= TARGET_PRODUCE_MB_S),
        ("raftlog produce >= 3x NATS msgs/s", f"{produce_ratio:.2f}x",
         produce_ratio >= TARGET_PRODUCE_VS_NATS),
        ("raftlog consume >= 300 MB/s", f"{consume_mb:.1f} MB/s",
         consume_mb >= TARGET_CONSUME_MB_S),
    ]
    print("\ntargets (medians):")
    for name, value, passed in targets:
        print(f"  {'PASS' if passed else 'MISS'}  {name:<36} {value}")
    failures = [r for r in results if not r.ok]
    for r in failures:
        print(f"  ! {r.system} {r.phase} repeat {r.repeat} failed: {r.note.strip()[:600]}")
    print(f"\nnote: {DURABILITY_NOTE}\nnote: {NOISE_NOTE}")
    return {
        "summary": {system: {phase: {k: vars(v) for k, v in metrics.items()}
                             for phase, metrics in phases.items()}
                    for system, phases in summary.items()},
        "ratios_raftlog_over_nats_msgs_per_s": ratios,
        "ratios_ssl_over_plaintext_msgs_per_s": tls,
        "targets": [{"target": n, "value": v, "pass": p} for n, v, p in targets],
        "failed_phases": len(failures),
    }


def ssl_ratios(results: list[PhaseResult], summary: dict[str, dict[str, dict[str, Spread]]]
               ) -> dict[str, dict[str, float | list[float]]]:
    """raftlog over SSL / over PLAINTEXT, per phase, when the run measured both."""
    if "raftlog" not in summary or "raftlog-ssl" not in summary:
        return {}
    out: dict[str, dict[str, float | list[float]]] = {}
    for phase in PHASES:
        a = summary["raftlog-ssl"][phase]["msgs_per_s"].median
        b = summary["raftlog"][phase]["msgs_per_s"].median
        per_repeat = pair_ratios(results, phase, "raftlog-ssl", "raftlog")
        out[phase] = {"of_medians": a / b if b == b and b > 0 else float("nan"),
                      "per_repeat": per_repeat}
        spread = f" (per repeat {min(per_repeat):.2f}-{max(per_repeat):.2f})" if per_repeat \
            else ""
        print(f"ratio raftlog SSL/PLAINTEXT {phase} msgs/s: {out[phase]['of_medians']:.2f}x"
              f"{spread}")
    return out


def print_phase(result: PhaseResult) -> None:
    status = "" if result.ok else f"  FAILED: {result.note.strip().splitlines()[0][:200]}"
    if "enqueue_seconds" in result.extra:
        status += f"  (produce() loop done at {result.extra['enqueue_seconds']:.2f} s)"
    print(f"  r{result.repeat} {result.system:<11} {result.phase:<7} {result.seconds:7.2f} s "
          f"{result.mb_per_s:8.1f} MB/s {result.msgs_per_s:10,.0f} msgs/s  "
          f"cpu broker {result.cpu.broker_pct:4.0f}% client {result.cpu.client_pct:4.0f}% "
          f"box {result.cpu.box_busy_pct:4.0f}%{status}", flush=True)


Runner = Callable[[Options, Path, int, bytes], list[PhaseResult]]


def runners(options: Options) -> list[tuple[str, Runner]]:
    """The systems of one repeat, interleaved in this order."""
    out: list[tuple[str, Runner]] = []
    if options.security in ("plaintext", "both"):
        out.append(("raftlog", run_raftlog))
    if options.security in ("ssl", "both"):
        out.append(("raftlog-ssl", functools.partial(run_raftlog, ssl=True)))
    if options.nats:
        out.append(("nats", run_nats))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    problem = check_prerequisites() if options.nats else None
    if problem is not None:
        print(f"cannot run the benchmark: {problem}", file=sys.stderr)
        return 2
    env = environment()
    print(run_header("raftlog vs NATS JetStream R1, single node on 127.0.0.1", options, env))
    payload = os.urandom(options.record_bytes)
    results: list[PhaseResult] = []
    profile: dict[str, Any] | None = None
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="raftlog-bench-") as tmp:
        for repeat in range(options.repeats):
            for system, run in runners(options):
                for result in run(options, Path(tmp) / f"{system}-r{repeat}", repeat, payload):
                    results.append(result)
                    print_phase(result)
        if options.profile_dir is not None:
            try:
                profile = run_profiled_produce(options, Path(tmp) / "profile", payload)
            except Exception:
                traceback.print_exc()
                print("profiling failed; the figures above are unaffected")
    out = report(options, results)
    env["loadavg_at_end"] = os.getloadavg()
    print(f"total run time {time.monotonic() - started:.0f} s")
    write_json(options.json_path, {
        "options": vars(options),
        "environment": env,
        "targets": {"produce_mb_per_s": TARGET_PRODUCE_MB_S,
                    "produce_vs_nats_msgs_per_s": TARGET_PRODUCE_VS_NATS,
                    "consume_mb_per_s": TARGET_CONSUME_MB_S},
        "notes": [DURABILITY_NOTE, NOISE_NOTE],
        "phases": [r.as_json() for r in results],
        **out,
        "profile": profile,
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
