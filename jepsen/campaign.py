"""``python -m jepsen campaign``: many seeded runs, one table of anomalies per workload and
fault.

Runs every workload x nemesis combination ``--runs`` times (seeds ``--seed``,
``--seed + 1``, ...), one after the other, each an ordinary ``test`` run with its own store
directory, and keeps ``campaign.json`` (one row per run) and ``campaign.md`` (the table)
up to date after every run, so an interrupted campaign still has its table. Exit status 0
when no run was invalid.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jepsen.runner import TestOptions, run_test

OptionsFactory = Callable[[argparse.Namespace, str, str, int], TestOptions]


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per (workload, nemesis): run counts and, per anomaly, how many runs had it."""
    table: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        cell = table.setdefault((row["workload"], row["nemesis"]), {
            "workload": row["workload"], "nemesis": row["nemesis"], "runs": 0, "valid": 0,
            "invalid": 0, "unknown": 0, "error": 0, "bad": {}, "allowed": {}, "ok_ops": 0})
        cell["runs"] += 1
        v = row["valid"]
        key = "valid" if v is True else "invalid" if v is False else (
            "error" if v == "error" else "unknown")
        cell[key] += 1
        cell["ok_ops"] += row.get("ok_ops", 0)
        for name in row.get("bad", []):
            cell["bad"][name] = cell["bad"].get(name, 0) + 1
        for name in row.get("allowed", []):
            cell["allowed"][name] = cell["allowed"].get(name, 0) + 1
    return list(table.values())


def markdown(summary: Sequence[dict[str, Any]], header: str) -> str:
    lines = [header, "",
             "| workload | nemesis | runs | valid | invalid | unknown | error | ok ops "
             "| anomalies (runs) | allowed by design (runs) |",
             "|---|---|---|---|---|---|---|---|---|---|"]

    def names(d: dict[str, int]) -> str:
        return ", ".join(f"{k} ({v})" for k, v in sorted(d.items())) or "none"

    for c in summary:
        lines.append(f"| {c['workload']} | {c['nemesis']} | {c['runs']} | {c['valid']} | "
                     f"{c['invalid']} | {c['unknown']} | {c['error']} | {c['ok_ops']} | "
                     f"{names(c['bad'])} | {names(c['allowed'])} |")
    return "\n".join(lines) + "\n"


def _row(opts: TestOptions, results: dict[str, Any] | None, error: str | None,
         elapsed_s: float) -> dict[str, Any]:
    row: dict[str, Any] = {"workload": opts.workload, "nemesis": opts.nemesis,
                           "seed": opts.seed, "elapsed_s": round(elapsed_s, 1)}
    if results is None:
        row.update({"valid": "error", "error": error})
        return row
    by_f = results.get("stats", {}).get("by_f", {})
    ops = results.get("stats", {}).get("operations", {})
    row.update({
        "valid": results["valid"],
        "bad": results.get("bad_anomaly_types", results.get("anomaly_types", [])),
        "allowed": results.get("allowed_anomaly_types", []),
        "counts": results.get("anomaly_counts", {}),
        "unknown_reasons": [r.get("type") for r in results.get("unknown_reasons", [])],
        "ok_ops": sum(v.get("ok", 0) for f, v in by_f.items() if f in ("send", "poll", "txn"))
        or ops.get("ok", 0),
        "net": results.get("test", {}).get("net", {}).get("mode"),
        "store_dir": results.get("test", {}).get("store_dir"),
    })
    return row


def run_campaign(args: argparse.Namespace, make_options: OptionsFactory) -> int:
    workloads = [w for w in args.workloads.split(",") if w]
    nemeses = [n for n in args.nemeses.split(",") if n]
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    out: Path = args.out or args.store / f"campaign-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    total = len(workloads) * len(nemeses) * args.runs
    for r in range(args.runs):
        for workload in workloads:
            for nemesis in nemeses:
                opts = make_options(args, workload, nemesis, args.seed + r)
                opts.progress = False
                print(f"[{len(rows) + 1}/{total}] {workload} {nemesis} seed {opts.seed}",
                      file=sys.stderr, flush=True)
                started = time.monotonic()
                try:
                    results: dict[str, Any] | None = run_test(opts)
                    error = None
                except KeyboardInterrupt:
                    print("interrupted", file=sys.stderr)
                    return 130
                except Exception as exc:  # one broken run must not end the campaign
                    results, error = None, f"{type(exc).__name__}: {exc}"
                rows.append(_row(opts, results, error, time.monotonic() - started))
                print(f"    -> {rows[-1]['valid']} {rows[-1].get('counts', error)}",
                      file=sys.stderr, flush=True)
                _write(out, rows, args)
    return 1 if any(r["valid"] is False for r in rows) else 0


def _write(out: Path, rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    summary = summarize(rows)
    header = (f"Campaign {out.name}: {len(rows)} runs, {args.nodes} nodes, "
              f"{args.time_limit:.0f} s each, rate {args.rate:.0f}/s, "
              f"concurrency {args.concurrency}, fault interval {args.interval:.0f} s"
              + (", UNSAFE cluster" if args.unsafe else ""))
    (out / "campaign.json").write_text(json.dumps({"summary": summary, "runs": rows},
                                                  indent=2) + "\n", encoding="utf-8")
    (out / "campaign.md").write_text(markdown(summary, header), encoding="utf-8")
