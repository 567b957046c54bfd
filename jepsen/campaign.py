"""``python -m jepsen campaign``: many seeded runs, one table of anomalies per workload and
fault, accumulated across as many invocations as it takes.

Every workload x nemesis combination gets ``--runs`` runs (seeds ``--seed`` ..
``--seed + runs - 1``), each an ordinary ``test`` run with its own store directory. The order
is round-robin (every combination with seed s before any with seed s + 1), so a campaign cut
short has still spread its runs over every combination. ``campaign.json`` (settings, planned
seeds, one row per run) and ``campaign.md`` (the table) are rewritten atomically after every
run.

Pointing ``--out`` at a directory that already holds a ``campaign.json`` resumes it: only the
(workload, nemesis, seed) triples without a row are run, plus those whose run hit a harness
error (unless ``--no-retry-errors``). The cluster settings must match the recorded ones, or
the rows would not be comparable; a mismatch is refused with exit status 2. ``--until`` and
``--deadline-s`` stop starting runs that would not end in time, so a campaign can be fitted
into the time left. Exit status: 0 when no recorded run is invalid, 1 otherwise, 2 for a
refused resume or bad arguments, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from jepsen.nemesis import parse_kinds
from jepsen.runner import WORKLOADS, TestOptions, on_sigterm, run_test

OptionsFactory = Callable[[argparse.Namespace, str, str, int], TestOptions]
Clock = Callable[[], float]
Triple = tuple[str, str, int]

# The settings that make runs comparable: resuming with different ones is refused.
SETTINGS_KEYS: Final = ("nodes", "time_limit", "rate", "concurrency", "interval", "unsafe",
                        "netns", "sub_via", "secure", "load", "unsafe_fsync")
# Settings newer than some recorded campaigns, with the value those campaigns ran with.
SETTINGS_ADDED_LATER: Final[dict[str, Any]] = {"secure": False, "load": "paced",
                                               "unsafe_fsync": False}
# What a pruned (valid) run keeps: enough to see what was checked and to re-check it.
PRUNE_KEEP: Final = ("results.json", "history.jsonl.gz")
EXIT_REFUSED: Final = 2


class CampaignError(Exception):
    """A campaign that cannot start or resume (bad arguments, mismatching settings)."""


# -- pure parts ------------------------------------------------------------------------------

def combo_key(workload: str, nemesis: str) -> str:
    return f"{workload} {nemesis}"


def plan_triples(workloads: Sequence[str], nemeses: Sequence[str], first_seed: int,
                 runs: int) -> list[Triple]:
    """Round-robin order: all combinations for one seed before the next seed."""
    return [(w, n, s) for s in range(first_seed, first_seed + runs)
            for w in workloads for n in nemeses]


def pending(plan: Sequence[Triple], rows: Iterable[dict[str, Any]],
            retry_errors: bool = True) -> list[Triple]:
    """The planned triples without a recorded run (or with only a harness error)."""
    done = {(r["workload"], r["nemesis"], r["seed"]) for r in rows
            if not (retry_errors and r.get("valid") == "error")}
    return [t for t in plan if t not in done]


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k) for k in SETTINGS_KEYS}


def settings_mismatch(recorded: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """``name: recorded -> wanted`` for every differing setting."""
    recorded = {**SETTINGS_ADDED_LATER, **recorded}
    return [f"{k}: {recorded.get(k)!r} -> {wanted[k]!r}" for k in SETTINGS_KEYS
            if recorded.get(k) != wanted[k]]


def parse_until(text: str, now_s: float) -> float:
    """``HH:MM`` (UTC, today) or an ISO date-time (UTC unless it says otherwise) -> epoch s.

    ``HH:MM`` is today's, even when already past (then no run starts): guessing "tomorrow"
    would turn a late command into a day-long campaign.
    """
    try:
        if len(text) <= 5 and ":" in text:
            hours, minutes = (int(p) for p in text.split(":"))
            today = datetime.fromtimestamp(now_s, UTC)
            return today.replace(hour=hours, minute=minutes, second=0,
                                 microsecond=0).timestamp()
        when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise CampaignError(f"--until {text!r}: expected HH:MM (UTC) or an ISO date-time "
                            f"({exc})") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def deadline_of(args: argparse.Namespace, start_s: float) -> float | None:
    """The earlier of ``--until`` and start + ``--deadline-s``; None when neither is given."""
    limits: list[float] = []
    if getattr(args, "until", None):
        limits.append(parse_until(args.until, start_s))
    if getattr(args, "deadline_s", None) is not None:
        limits.append(start_s + args.deadline_s)
    return min(limits) if limits else None


def expected_run_s(rows: Sequence[dict[str, Any]], time_limit_s: float) -> float:
    """Mean wall time of the recorded runs (same settings by construction), else the limit."""
    times = [r["elapsed_s"] for r in rows if isinstance(r.get("elapsed_s"), int | float)]
    return sum(times) / len(times) if times else time_limit_s


def _verdict(row: dict[str, Any]) -> str:
    v = row.get("valid")
    return "valid" if v is True else "invalid" if v is False else (
        "error" if v == "error" else "unknown")


def summarize(rows: Sequence[dict[str, Any]],
              planned: dict[str, list[int]] | None = None) -> list[dict[str, Any]]:
    """One line per (workload, nemesis): runs done of the target, verdict counts, per anomaly
    how many runs had it, and wall time. ``planned`` (combination -> seeds) gives the targets
    and lists combinations that have no run yet."""
    planned = planned or {}
    table: dict[str, dict[str, Any]] = {}

    def cell(workload: str, nemesis: str) -> dict[str, Any]:
        return table.setdefault(combo_key(workload, nemesis), {
            "workload": workload, "nemesis": nemesis, "runs": 0, "done": 0, "target": 0,
            "valid": 0, "invalid": 0, "unknown": 0, "error": 0, "bad": {}, "allowed": {},
            "ok_ops": 0, "wall_s": 0.0, "mean_s": None})

    for key in planned:
        cell(*key.split(" ", 1))
    for row in rows:
        c = cell(row["workload"], row["nemesis"])
        c["runs"] += 1
        verdict = _verdict(row)
        c[verdict] += 1
        c["done"] += verdict != "error"
        c["ok_ops"] += row.get("ok_ops", 0)
        c["wall_s"] += row.get("elapsed_s") or 0.0
        for name in row.get("bad", []):
            c["bad"][name] = c["bad"].get(name, 0) + 1
        for name in row.get("allowed", []):
            c["allowed"][name] = c["allowed"].get(name, 0) + 1
    for key, c in table.items():
        c["target"] = len(planned[key]) if key in planned else c["done"]
        c["wall_s"] = round(c["wall_s"], 1)
        c["mean_s"] = round(c["wall_s"] / c["runs"], 1) if c["runs"] else None
    return list(table.values())


def _names(d: dict[str, int]) -> str:
    return ", ".join(f"{k} ({v})" for k, v in sorted(d.items())) or "none"


def markdown(summary: Sequence[dict[str, Any]], header: str) -> str:
    lines = [header, "",
             "| workload | nemesis | runs done / target | valid | invalid | unknown | error "
             "| anomalies (runs) | allowed by design (runs) | ok ops | wall s | mean s/run |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in summary:
        mean = "-" if c["mean_s"] is None else f"{c['mean_s']:.1f}"
        lines.append(f"| {c['workload']} | {c['nemesis']} | {c['done']} / {c['target']} | "
                     f"{c['valid']} | {c['invalid']} | {c['unknown']} | {c['error']} | "
                     f"{_names(c['bad'])} | {_names(c['allowed'])} | {c['ok_ops']} | "
                     f"{c['wall_s']:.0f} | {mean} |")
    return "\n".join(lines) + "\n"


def header_line(name: str, settings: dict[str, Any], rows: Sequence[dict[str, Any]],
                summary: Sequence[dict[str, Any]]) -> str:
    done = sum(c["done"] for c in summary)
    target = sum(c["target"] for c in summary)
    wall_s = sum(c["wall_s"] for c in summary)
    mean = f"{wall_s / len(rows):.1f}" if rows else "-"
    started = sorted(r["started_at"] for r in rows if r.get("started_at"))
    finished = sorted(r["finished_at"] for r in rows if r.get("finished_at"))
    dates = (f"runs from {started[0][:16].replace('T', ' ')} to "
             f"{finished[-1][:16].replace('T', ' ')} UTC" if started and finished
             else "no dated runs")
    return (f"Campaign {name}: {done} of {target} runs done, {settings['nodes']} nodes, "
            f"{settings['time_limit']:.0f} s each, "
            + ("saturating load (idempotent producers), " if settings.get("load") == "saturate"
               else f"rate {settings['rate']:.0f}/s, ")
            + f"concurrency {settings['concurrency']}, fault interval "
            f"{settings['interval']:.0f} s"
            + (", UNSAFE cluster" if settings["unsafe"] else "")
            + (", secured (SASL_SSL + SCRAM, node-to-node TLS)" if settings.get("secure")
               else "")
            + ("" if settings.get("netns", True) else ", no namespaces")
            + f"; {dates}; run time {_duration(wall_s)} summed over runs, mean {mean} s a "
            + f"run; runs at a time: {_workers(rows)}; code under test: {_codes(rows)}.")


def _workers(rows: Sequence[dict[str, Any]]) -> str:
    """How many runs went at once (``--workers``), with run counts (older rows: 1)."""
    counts: dict[int, int] = {}
    for row in rows:
        counts[row.get("workers", 1)] = counts.get(row.get("workers", 1), 0) + 1
    return ", ".join(f"{n} ({c})" for n, c in sorted(counts.items())) or "-"


def _codes(rows: Sequence[dict[str, Any]]) -> str:
    """Which raftlog commits the runs exercised, with run counts (older rows: "unrecorded")."""
    counts: dict[str, int] = {}
    for row in rows:
        code = row.get("code", "unrecorded")
        counts[code] = counts.get(code, 0) + 1
    return ", ".join(f"{code} ({n})" for code, n in counts.items()) or "-"


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def _row(opts: TestOptions, results: dict[str, Any] | None, error: str | None,
         started_s: float, finished_s: float) -> dict[str, Any]:
    row: dict[str, Any] = {
        "workload": opts.workload, "nemesis": opts.nemesis, "seed": opts.seed,
        "elapsed_s": round(finished_s - started_s, 1),
        "started_at": datetime.fromtimestamp(started_s, UTC).isoformat(timespec="seconds"),
        "finished_at": datetime.fromtimestamp(finished_s, UTC).isoformat(timespec="seconds"),
        "store_dir": str(opts.store / opts.name) if opts.name else None,
        "store_pruned": False}
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
    })
    row["store_dir"] = results.get("test", {}).get("store_dir") or row["store_dir"]
    return row


# -- I/O ---------------------------------------------------------------------------------------

def prune_store(directory: Path) -> list[str]:
    """Shrink a valid run's store dir to ``PRUNE_KEEP``: results plus the gzipped history
    (measured: 30 s runs at 40 ops/s, 445 kB on average down to 79 kB); returns what is
    left."""
    history = directory / "history.jsonl"
    if history.exists():
        with history.open("rb") as src, gzip.open(directory / "history.jsonl.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
    for path in directory.iterdir():
        if path.name in PRUNE_KEEP:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return sorted(p.name for p in directory.iterdir())


def load(out: Path) -> dict[str, Any] | None:
    """The recorded campaign in ``out``, or None when there is none."""
    path = out / "campaign.json"
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CampaignError(f"cannot resume {path}: {exc}") from None
    if not isinstance(state, dict) or "settings" not in state:
        raise CampaignError(f"cannot resume {path}: it records no settings (written before "
                            "campaigns were resumable); use a new --out")
    state.setdefault("runs", [])
    state.setdefault("planned", {})
    return state


def _atomic_write(path: Path, text: str) -> None:
    # An interrupt mid-write must not destroy the record a resume depends on.
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write(out: Path, state: dict[str, Any]) -> None:
    summary = summarize(state["runs"], state["planned"])
    state["summary"] = summary
    _atomic_write(out / "campaign.json", json.dumps(state, indent=2) + "\n")
    header = header_line(out.name, state["settings"], state["runs"], summary)
    _atomic_write(out / "campaign.md", markdown(summary, header))


def _validate(workloads: Sequence[str], nemeses: Sequence[str], runs: int) -> None:
    if not workloads or not nemeses:
        raise CampaignError("--workloads and --nemeses must name at least one each")
    for w in workloads:
        if w not in WORKLOADS:
            raise CampaignError(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    for n in nemeses:
        try:
            parse_kinds(n, True)
        except ValueError as exc:
            raise CampaignError(str(exc)) from None
    if runs < 0:
        raise CampaignError("--runs must be >= 0")


def _validate_workers(workers: int, netns: bool) -> None:
    if workers < 1:
        raise CampaignError("--workers must be >= 1")
    if workers > 1 and (not netns or os.geteuid() != 0):
        # Without namespaces every run's nodes share 127.0.0.1 and pick free ports
        # unguarded: a node restarted by one run could land on a port another run took.
        raise CampaignError("--workers > 1 needs network namespaces (root, without --no-netns)")


def _open_state(out: Path, args: argparse.Namespace, plan: Sequence[Triple]) -> dict[str, Any]:
    wanted = settings_of(args)
    state = load(out)
    if state is None:
        state = {"settings": wanted, "planned": {}, "runs": []}
    else:
        diff = settings_mismatch(state["settings"], wanted)
        if diff:
            raise CampaignError(f"{out} holds a campaign with other settings ("
                                + "; ".join(diff) + "); use the recorded settings to resume "
                                "it or a new --out for a new campaign")
    for workload, nemesis, seed in plan:
        seeds = state["planned"].setdefault(combo_key(workload, nemesis), [])
        if seed not in seeds:
            seeds.append(seed)
    for seeds in state["planned"].values():
        seeds.sort()
    return state


def _record(state: dict[str, Any], row: dict[str, Any]) -> None:
    """Add a run's row, replacing an earlier error row for the same triple."""
    triple = (row["workload"], row["nemesis"], row["seed"])
    earlier = [r for r in state["runs"] if (r["workload"], r["nemesis"], r["seed"]) == triple]
    row["attempts"] = sum(r.get("attempts", 1) for r in earlier) + 1
    state["runs"] = [r for r in state["runs"] if r not in earlier] + [row]


def code_under_test() -> str:
    """The git commit of the raftlog package the nodes run (``+dirty`` when its tree has
    uncommitted changes), so every row says which code it is evidence for."""
    import raftlog

    package = Path(raftlog.__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(package), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=10, check=True)
        dirty = subprocess.run(["git", "-C", str(package), "status", "--porcelain", "--",
                                str(package)], capture_output=True, text=True, timeout=10,
                               check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _run_one(opts: TestOptions, keep_store: str, now: Clock) -> dict[str, Any]:
    started_s = now()
    try:
        results: dict[str, Any] | None = run_test(opts)
        error = None
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # one broken run must not end the campaign
        results, error = None, f"{type(exc).__name__}: {exc}"
    row = _row(opts, results, error, started_s, now())
    if keep_store == "invalid" and row["valid"] is True and row["store_dir"]:
        directory = Path(row["store_dir"])
        if directory.is_dir():
            prune_store(directory)
            row["store_pruned"] = True
    return row


def _campaign_options(args: argparse.Namespace, make_options: OptionsFactory, triple: Triple,
                      now: Clock) -> TestOptions:
    workload, nemesis, seed = triple
    opts = make_options(args, workload, nemesis, seed)
    opts.progress = False
    opts.name = (f"{workload}-{nemesis.replace(',', '+')}-s{seed}-"
                 f"{datetime.fromtimestamp(now(), UTC).strftime('%Y%m%dT%H%M%S')}")
    return opts


def _wait_some(futures: list[Future[dict[str, Any]]]) -> set[Future[dict[str, Any]]]:
    """The finished ones among ``futures``, waiting in short slices so that SIGINT (which
    Python delivers between bytecodes of the main thread) is seen within a second."""
    while True:
        done, _ = wait(futures, timeout=1.0, return_when=FIRST_COMPLETED)
        if done:
            return done


def _label(triple: Triple) -> str:
    workload, nemesis, seed = triple
    return f"{workload} {nemesis} seed {seed}"


def _run_parallel(todo: Sequence[Triple], workers: int,
                  next_run: Callable[[int], TestOptions | None], keep_store: str, now: Clock,
                  record: Callable[[Triple, dict[str, Any]], None]) -> bool:
    """Runs ``todo`` on ``workers`` threads. Each run has its own nodes (processes in their
    own namespaces, subnet and nftables tables); the runs share the CPU and this process's
    GIL (clients, recorder and checker run here), which can slow a run but not change what
    its checker decides from its own history. Returns True when stopped by SIGINT/SIGTERM:
    Python cannot interrupt a worker thread, so a signal starts nothing more and lets the
    runs in flight finish (one run's length) and be recorded."""
    in_flight: dict[Future[dict[str, Any]], Triple] = {}
    index, stopping, interrupted = 0, False, False
    # run_test sets these only on the main thread; here the main thread waits and must see
    # them (SIGINT is inherited as ignored by jobs started in the background).
    previous_term = signal.signal(signal.SIGTERM, on_sigterm)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="campaign")
    try:
        while True:
            try:
                while not stopping and index < len(todo) and len(in_flight) < workers:
                    opts = next_run(index)
                    if opts is None:
                        stopping = True
                        break
                    in_flight[pool.submit(_run_one, opts, keep_store, now)] = todo[index]
                    index += 1
                if not in_flight:
                    return interrupted
                for future in _wait_some(list(in_flight)):
                    record(in_flight[future], future.result())
                    del in_flight[future]  # only once recorded: see the finally below
            except KeyboardInterrupt:
                if not interrupted:
                    print(f"interrupted; finishing the {len(in_flight)} runs in flight "
                          "(about one run's length), then stopping", file=sys.stderr,
                          flush=True)
                stopping = interrupted = True
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # nothing may cut the recording short
        pool.shutdown(wait=True, cancel_futures=True)
        for future, triple in in_flight.items():
            if future.done() and not future.cancelled() and future.exception() is None:
                record(triple, future.result())
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)


def run_campaign(args: argparse.Namespace, make_options: OptionsFactory,
                 now: Clock = time.time) -> int:
    workloads = list(dict.fromkeys(w for w in args.workloads.split(",") if w))
    nemeses = list(dict.fromkeys(n for n in args.nemeses.split(",") if n))
    start_s = now()
    stamp = datetime.fromtimestamp(start_s, UTC).strftime("%Y%m%dT%H%M%S")
    out: Path = args.out or args.store / f"campaign-{stamp}"
    plan = plan_triples(workloads, nemeses, args.seed, args.runs)
    workers = int(getattr(args, "workers", 1) or 1)
    try:
        _validate(workloads, nemeses, args.runs)
        _validate_workers(workers, getattr(args, "netns", True))
        deadline_s = deadline_of(args, start_s)
        out.mkdir(parents=True, exist_ok=True)
        state = _open_state(out, args, plan)
    except CampaignError as exc:
        print(f"python -m jepsen campaign: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    todo = pending(plan, state["runs"], getattr(args, "retry_errors", True))
    todo_set = set(todo)
    retried = sum(1 for r in state["runs"] if r.get("valid") == "error"
                  and (r["workload"], r["nemesis"], r["seed"]) in todo_set)
    print(f"campaign {out}: {len(plan) - len(todo)} of {len(plan)} planned runs recorded, "
          f"{len(todo)} to run" + (f" ({retried} retried after a harness error)"
                                   if retried else ""), file=sys.stderr, flush=True)
    write(out, state)
    keep_store = getattr(args, "keep_store", "invalid")
    code = code_under_test()

    def record(triple: Triple, row: dict[str, Any]) -> None:
        row["code"] = code
        row["workers"] = workers
        if workers > 1 and row["valid"] != "error" and row.get("net") != "namespaces":
            # Loopback runs pick free ports on one address: two at once can cross-talk.
            row.update({"valid": "error", "error": f"network set-up fell back to {row.get('net')} "
                        f"with --workers {workers}; not counted (rerun on resume)"})
        _record(state, row)
        print(f"    {_label(triple)} -> {row['valid']} {row.get('counts', row.get('error'))} "
              f"{row['elapsed_s']:.0f} s", file=sys.stderr, flush=True)
        write(out, state)

    def next_run(index: int) -> TestOptions | None:
        """The options of run ``index`` of ``todo``, or None when it would pass the
        deadline."""
        expected_s = expected_run_s(state["runs"], args.time_limit)
        if deadline_s is not None and now() + expected_s > deadline_s:
            print(f"deadline: not starting the {len(todo) - index} remaining runs (a run "
                  f"takes about {expected_s:.0f} s)", file=sys.stderr, flush=True)
            return None
        print(f"[{index + 1}/{len(todo)}] {_label(todo[index])}", file=sys.stderr, flush=True)
        return _campaign_options(args, make_options, todo[index], now)

    try:
        if workers == 1:
            # On this thread, so that SIGINT interrupts the run itself (it cleans up).
            for index in range(len(todo)):
                opts = next_run(index)
                if opts is None:
                    break
                record(todo[index], _run_one(opts, keep_store, now))
        elif _run_parallel(todo, workers, next_run, keep_store, now, record):
            return 130
    except KeyboardInterrupt:
        print("interrupted; the table has every finished run, rerun the same command "
              "to resume", file=sys.stderr)
        return 130
    return 1 if any(r["valid"] is False for r in state["runs"]) else 0
