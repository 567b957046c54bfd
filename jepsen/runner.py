"""One test run: set up, drive, break, heal, read back, check, report.

The scheduling decisions are pure and seeded (:meth:`Workload.next_op`,
:func:`jepsen.nemesis.plan`); this module is the I/O shell that carries them out with real
processes, real namespaces and real client threads (one per ``--concurrency``), and records
what happened in ``history.jsonl`` as it happens.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any, Final

from jepsen import client_log, faults_harsh, plots, report
from jepsen.db import UNSAFE_FSYNC_PROPERTIES, UNSAFE_PROPERTIES, Cluster
from jepsen.faults_power import wants_power_loss
from jepsen.history import NEMESIS, HistoryWriter, Op, OpType, read_jsonl
from jepsen.lazyfs import check_available, sweep_stale_mounts
from jepsen.metrics import read_samples
from jepsen.metrics import summary as metrics_summary
from jepsen.nemesis import Nemesis, parse_kinds, plan
from jepsen.net import LoopbackNet, Net, NetError, choose_net
from jepsen.scrape import Scraper
from jepsen.workloads import ClusterView, Outcome, Workload
from jepsen.workloads.metadata import MetadataWorkload
from jepsen.workloads.queue import TOPIC, QueueWorkload
from jepsen.workloads.txn import TxnWorkload

WORKLOADS: Final = ("queue", "txn", "metadata")
JOIN_TIMEOUT_S: Final = 30.0
METRICS_FILE: Final = "metrics.jsonl"
RECOVERY_TIMEOUT_S: Final = 60.0


@dataclass
class TestOptions:
    workload: str = "queue"
    nemesis: str = "none"
    nodes: int = 3
    time_limit_s: float = 30.0
    rate: float = 20.0
    concurrency: int = 4
    seed: int = 0
    store: Path = Path("store")
    unsafe: bool = False
    unsafe_fsync: bool = False  # harness-only: acknowledge without fsync (power-loss check)
    secure: bool = False  # SASL_SSL with SCRAM everywhere, between nodes too
    interval_s: float = 5.0
    netns: bool = True
    sub_via: str = "both"
    final_time_s: float = 30.0
    keep_data: bool = False
    progress: bool = True
    name: str | None = None
    load: str = "paced"  # "saturate": idempotent producers as fast as the cluster takes
    client_debug: bool = False  # librdkafka eos/msg debug of every producer to clients.log

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["store"] = str(self.store)
        return d


def make_workload(opts: TestOptions) -> Workload:
    # saturate: the queue gets idempotent producers sending as fast as the cluster takes; txn
    # and metadata keep their operations but every worker starts the next one as soon as the
    # last completes (no pacing gap, see _worker), which is their saturating rate.
    if opts.load == "saturate" and opts.workload == "queue":
        from jepsen.workloads.saturate import SaturateWorkload

        return SaturateWorkload()
    if opts.load not in ("paced", "saturate"):
        raise ValueError(f"unknown load {opts.load!r}; choose from paced, saturate")
    if opts.workload == "queue":
        via = {"both": ("assign", "subscribe"), "assign": ("assign",),
               "subscribe": ("subscribe",)}[opts.sub_via]
        return QueueWorkload(sub_via=via)
    if opts.workload == "txn":
        return TxnWorkload()
    if opts.workload == "metadata":
        return MetadataWorkload()
    raise ValueError(f"unknown workload {opts.workload!r}; choose from {', '.join(WORKLOADS)}")


class Recorder:
    """A thread-safe history writer that also counts completions for the progress line."""

    def __init__(self, path: Path) -> None:
        self._writer = HistoryWriter(path)
        self._lock = threading.Lock()
        self._processes = itertools.count()
        self._values = itertools.count(1)
        self.counts: dict[str, int] = {"ok": 0, "fail": 0, "info": 0}
        self._closed = False

    def invoke(self, process: int | str, f: str, value: Any, **extra: Any) -> Op:
        return self._append("invoke", process, f, value, None, extra)

    def complete(self, type: OpType, process: int | str, f: str, value: Any,
                 error: Any = None, **extra: Any) -> Op:
        return self._append(type, process, f, value, error, extra)

    def _append(self, type: OpType, process: int | str, f: str, value: Any, error: Any,
                extra: dict[str, Any]) -> Op:
        with self._lock:
            if self._closed:
                # A straggling client thread after the history was closed: not recorded, so
                # its invocation stays open (indeterminate), which is what it is.
                return Op(type=type, f=f, process=process, value=value, error=error)
            if type != "invoke" and process != NEMESIS:
                self.counts[type] += 1
            return self._writer.append(type, process, f, value, error=error, **extra)

    @property
    def start_ns(self) -> int:
        return self._writer.start_ns

    def new_process(self) -> int:
        with self._lock:
            return next(self._processes)

    def next_value(self) -> int:
        with self._lock:
            return next(self._values)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._writer.close()


def store_directory(opts: TestOptions) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%f")[:-3]
    name = opts.name or f"{opts.workload}-{stamp}"
    # Absolute: node processes start in their own working directories and read their config
    # from under this path (a relative --store made every node exit at start-up).
    path = opts.store.resolve() / name
    path.mkdir(parents=True, exist_ok=False)
    latest = opts.store / "latest"
    with contextlib.suppress(OSError):
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        latest.symlink_to(path.name)
    return path


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Unwind like Ctrl-C: every ``finally`` on the way stops the nodes and the namespaces.
    raise KeyboardInterrupt(f"signal {signum}")


def run_test(opts: TestOptions) -> dict[str, Any]:
    """Run one test; returns ``results.json``'s contents (also written to the store)."""
    workload = make_workload(opts)
    parse_kinds(opts.nemesis, True)  # bad --nemesis: fail before starting anything
    lazyfs_binary, lazyfs_reason = (check_available(os.environ)
                                    if wants_power_loss(opts.nemesis) else (None, None))
    if wants_power_loss(opts.nemesis) and lazyfs_binary is None:
        raise ValueError(f"--nemesis power-loss cannot run here: {lazyfs_reason}")
    directory = store_directory(opts)
    run_id = f"{opts.seed}-{directory.name[-6:].replace('.', '')}"
    installed = threading.current_thread() is threading.main_thread()
    if installed:
        previous = signal.signal(signal.SIGTERM, on_sigterm)
        # Also when started in the background (where SIGINT is inherited as ignored).
        previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    net: Net = choose_net(opts.netns)
    cluster: Cluster | None = None
    started = time.monotonic()
    try:
        try:
            net.setup(list(range(1, opts.nodes + 1)))
        except NetError as exc:
            net.teardown()
            net = LoopbackNet(reason=f"namespace set-up failed: {exc}")
        extra = dict(UNSAFE_PROPERTIES) if opts.unsafe else {}
        if opts.unsafe_fsync:
            extra.update(UNSAFE_FSYNC_PROPERTIES)
        cluster = Cluster.create(directory / "cluster", opts.nodes, net, extra,
                                 secure=opts.secure)
        if lazyfs_binary is not None:
            sweep_stale_mounts()
            cluster.mount_lazyfs(lazyfs_binary, directory / "lazyfs")
        cluster.start_all()
        cluster.wait_ready()
        view = ClusterView(cluster.bootstrap,
                           {i: n.address for i, n in cluster.nodes.items()},
                           min(3, opts.nodes), opts.unsafe, run_id,
                           client_config=cluster.client_config, security=cluster.security,
                           client_log=directory / "clients.log" if opts.client_debug else None)
        workload.setup(view)
        drive = _drive(opts, workload, view, cluster, net, directory)
        results = _finish(opts, workload, directory, net, drive, time.monotonic() - started)
    finally:
        if cluster is not None:
            cluster.stop_all()
        net.teardown()
        if cluster is not None:
            _collect_logs(cluster, directory, opts.keep_data)
        if installed:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
            signal.signal(signal.SIGINT,
                          previous_int if previous_int is not None else signal.SIG_DFL)
    # What the nodes' and clients' logs add once the cluster is down (not part of validity).
    extra = results["test"]
    if "wipe-disk" in opts.nemesis:  # what each wiped node said when it came back
        wipes = faults_harsh.wipe_report(directory, read_jsonl(directory / "history.jsonl"))
        if wipes:
            extra["wipe_disk"] = wipes
    implicit = client_log.implicit_acks_in(directory / "clients.log")
    if implicit is not None:  # records delivered without an offset: librdkafka's inference
        extra["client_implicit_acks"] = implicit
    if cluster is not None and cluster.harness_notes:
        extra["notes"] += cluster.harness_notes
    problems = _log_problems(directory)
    if problems:  # a traceback in a node's log is a bug worth a look
        extra["node_log_problems"] = problems
    (directory / "results.json").write_text(json.dumps(results, indent=2) + "\n",
                                            encoding="utf-8")
    report.write_index(directory, results)
    return results


def _log_problems(directory: Path, per_node_max: int = 5) -> dict[str, list[str]]:
    """ERROR/CRITICAL lines and tracebacks in the nodes' logs."""
    out: dict[str, list[str]] = {}
    for path in sorted(directory.glob("n*.log")):
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        bad = [line for line in lines
               if " ERROR " in line or " CRITICAL " in line or line.startswith("Traceback")]
        if bad:
            out[path.name] = bad[:per_node_max] + ([f"... {len(bad)} in all"]
                                                   if len(bad) > per_node_max else [])
    return out


@dataclass
class _Drive:
    wall_start: float
    nemesis_kinds: tuple[str, ...]
    recovered: bool
    notes: list[str] = field(default_factory=list)


def _drive(opts: TestOptions, workload: Workload, view: ClusterView, cluster: Cluster,
           net: Net, directory: Path) -> _Drive:
    recorder = Recorder(directory / "history.jsonl")
    # The nodes' own metrics, every second from start to the end of the final reads; for the
    # report's plots only (the checkers never read them).
    scraper = Scraper(cluster.metrics_targets(), directory / METRICS_FILE,
                      recorder.start_ns).start()
    try:
        return _drive_recorded(opts, workload, view, cluster, net, recorder)
    finally:
        scraper.stop()


def _drive_recorded(opts: TestOptions, workload: Workload, view: ClusterView, cluster: Cluster,
                    net: Net, recorder: Recorder) -> _Drive:
    rng = random.Random(opts.seed)
    kinds = parse_kinds(opts.nemesis, net.namespaces)
    topic = TOPIC if opts.workload in ("queue", "txn") else None
    nemesis = Nemesis(cluster, net, recorder, random.Random(opts.seed + 1), topic)
    steps = plan(kinds, rng, opts.time_limit_s, opts.interval_s,
                 together_max=2 if opts.nemesis == "all" else 1)
    stop = threading.Event()
    notes: list[str] = []
    workers = [threading.Thread(target=_worker, name=f"worker-{i}", daemon=True,
                                args=(i, opts, workload, view, recorder, stop, notes))
               for i in range(opts.concurrency)]
    start = time.monotonic()
    wall_start = time.time()
    for w in workers:
        w.start()
    try:
        for step in steps:
            _sleep_until(start + step.at_s, opts, recorder, nemesis, start)
            for fault in step.faults:
                (nemesis.start if step.action == "start" else nemesis.stop)(fault)
        _sleep_until(start + opts.time_limit_s, opts, recorder, nemesis, start)
    except BaseException:
        stop.set()  # interrupted: the caller stops the nodes at once
        recorder.close()
        raise
    stop.set()
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for w in workers:
        w.join(max(0.1, deadline - time.monotonic()))
    if any(w.is_alive() for w in workers):
        notes.append("some client threads did not finish within "
                     f"{JOIN_TIMEOUT_S:.0f} s; their last operations stay open")
    nemesis.heal_all()
    if opts.progress:
        print(file=sys.stderr)
    recovered = True
    try:
        cluster.wait_ready(RECOVERY_TIMEOUT_S)
    except RuntimeError as exc:
        recovered = False
        notes.append(f"cluster did not recover after healing: {exc}")
    try:
        note = workload.final_reads(view, recorder, time.monotonic() + opts.final_time_s)
        if note is not None:
            notes.append(note)
    except Exception as exc:  # the checker still runs on what was recorded
        notes.append(f"final reads failed: {exc!r}")
    recorder.close()
    return _Drive(wall_start, kinds, recovered, notes)


def _sleep_until(t: float, opts: TestOptions, recorder: Recorder, nemesis: Nemesis,
                 start: float) -> None:
    while True:
        now = time.monotonic()
        if now >= t:
            return
        if opts.progress:
            c = recorder.counts
            line = (f"\r[{now - start:5.1f}/{opts.time_limit_s:.0f}s] ops {sum(c.values())} "
                    f"(ok {c['ok']} fail {c['fail']} info {c['info']}) faults: "
                    f"{nemesis.active_summary()}")
            print(f"{line:<100}", end="", file=sys.stderr, flush=True)
        time.sleep(min(1.0, t - now))


def _worker(index: int, opts: TestOptions, workload: Workload, view: ClusterView,
            recorder: Recorder, stop: threading.Event, notes: list[str]) -> None:
    rng = random.Random(opts.seed * 1000 + index)
    mean_gap_s = 0.0 if opts.load == "saturate" else opts.concurrency / max(opts.rate, 0.001)
    process = recorder.new_process()
    client = None
    while not stop.is_set():
        if client is None:
            client = workload.new_client(view, process, rng, index)
            try:
                client.open(recorder, process)
            except Exception as exc:  # e.g. init_transactions timed out: try again
                client.close()
                client = None
                if len(notes) < 20:
                    notes.append(f"worker {index}: opening a client failed: {exc}")
                stop.wait(1.0)
                continue
        if stop.wait(rng.uniform(0, 2 * mean_gap_s)):
            break
        f, value = workload.next_op(rng, recorder.next_value)
        recorder.invoke(process, f, value)
        try:
            out = client.invoke(f, value)
        except Exception as exc:  # a client bug or library error: the outcome is unknown
            out = Outcome("info", value, error=f"{type(exc).__name__}: {exc}")
            if len(notes) < 20:
                notes.append(f"worker {index}: {traceback.format_exc(limit=3)}")
        recorder.complete(out.type, process, f, out.value, error=out.error, **out.extra)
        if out.type == "info":
            client.close()
            client = None
            process = recorder.new_process()
    if client is not None:
        client.close()


def _finish(opts: TestOptions, workload: Workload, directory: Path, net: Net, drive: _Drive,
            elapsed_s: float) -> dict[str, Any]:
    history = read_jsonl(directory / "history.jsonl")
    checked = workload.check(history)
    valid = checked["valid"]
    if valid is True and not drive.recovered:
        valid = "unknown"
    results: dict[str, Any] = {
        "valid": valid,
        "anomalies": checked.get("anomalies", {}),
        "stats": {**checked.get("stats", {}), "run": plots.run_stats(history)},
        **{k: v for k, v in checked.items() if k not in ("valid", "anomalies", "stats")},
        "test": {
            **opts.to_json(),
            "nemesis_kinds": list(drive.nemesis_kinds),
            "net": {"mode": "namespaces" if net.namespaces else "loopback",
                    "description": net.description,
                    "reason": getattr(net, "reason", None)},
            "elapsed_s": round(elapsed_s, 1),
            "started_at": datetime.fromtimestamp(drive.wall_start, UTC).isoformat(),
            "recovered": drive.recovered,
            "store_dir": str(directory),
            "notes": drive.notes,
        },
    }
    if not net.namespaces and ("partition" in opts.nemesis or opts.nemesis == "all"):
        results["test"]["notes"].append(
            "network partitions skipped: no network namespaces (" + str(getattr(
                net, "reason", "")) + ")")
    (directory / "results.json").write_text(json.dumps(results, indent=2) + "\n",
                                            encoding="utf-8")
    samples = read_samples(directory / METRICS_FILE)
    results["stats"]["metrics"] = metrics_summary(samples)
    try:
        results["plots"] = plots.write_plots(history, directory)
        results["plots"] += plots.write_metrics_plot(history, samples, directory)
    except Exception as exc:  # plots are a convenience; never fail a run over them
        results["plots"] = results.get("plots", [])
        results["test"]["notes"].append(f"plots failed: {exc!r}")
    (directory / "results.json").write_text(json.dumps(results, indent=2) + "\n",
                                            encoding="utf-8")
    return results


def _collect_logs(cluster: Cluster, directory: Path, keep_data: bool) -> None:
    for node_id, node in cluster.nodes.items():
        if node.log_path.exists():
            shutil.copyfile(node.log_path, directory / f"n{node_id}.log")
    if not keep_data:
        shutil.rmtree(directory / "cluster", ignore_errors=True)
