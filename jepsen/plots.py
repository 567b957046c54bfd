"""Latency and throughput over time, with fault intervals shaded (matplotlib PNGs), and the
run statistics behind them; and the nodes' own metrics scraped during the run (under-replicated
partitions, Produce latency from the nodes' histograms) on the same time axis. Pure apart from
writing the files; matplotlib is optional (no plots, and a note in the results, when it is not
installed)."""

from __future__ import annotations

import threading
from collections import defaultdict
from pathlib import Path
from typing import Any, Final

from jepsen.history import History, Op
from jepsen.metrics import Sample, latency_series, missing, under_replicated_series

COLORS: Final = {"ok": "#2a9d8f", "info": "#e9c46a", "fail": "#e76f51"}
FAULT_COLORS: Final = {"kill": "#e63946", "pause": "#457b9d", "partition": "#8d6cab",
                       "clock": "#f4a261"}


def latencies(history: History) -> list[tuple[Op, Op, float]]:
    """``(invocation, completion, latency in ms)`` for every completed client operation."""
    out = []
    for inv, comp in history.pairs():
        if inv.is_client and comp is not None:
            out.append((inv, comp, (comp.time - inv.time) / 1e6))
    return out


def fault_intervals(history: History) -> list[tuple[str, float, float]]:
    """``(kind, start s, end s)`` for every fault, from the nemesis operations."""
    end_s = max((op.time for op in history), default=0) / 1e9
    open_: dict[str, list[float]] = defaultdict(list)
    out: list[tuple[str, float, float]] = []
    for op in history.nemesis_ops():
        if op.is_invoke:
            continue
        if op.f.startswith("start-") and op.error is None:
            open_[op.f[6:]].append(op.time / 1e9)
        elif op.f.startswith("stop-") and open_[op.f[5:]]:
            out.append((op.f[5:], open_[op.f[5:]].pop(0), op.time / 1e9))
        elif op.f == "heal":
            for kind, starts in open_.items():
                out.extend((kind, s, op.time / 1e9) for s in starts)
            open_.clear()
    for kind, starts in open_.items():
        out.extend((kind, s, end_s) for s in starts)
    return out


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 1)


def run_stats(history: History) -> dict[str, Any]:
    lat = latencies(history)
    by_f: dict[str, list[float]] = defaultdict(list)
    for inv, comp, ms in lat:
        if comp.is_ok:
            by_f[inv.f].append(ms)
    duration_s = max((op.time for op in history), default=0) / 1e9
    return {
        "duration_s": round(duration_s, 1),
        "completed": len(lat),
        "ok_per_s": round(sum(1 for _, c, _ in lat if c.is_ok) / duration_s, 1)
        if duration_s else 0.0,
        "latency_ms": {f: {"p50": _percentile(v, 0.5), "p95": _percentile(v, 0.95),
                           "p99": _percentile(v, 0.99), "max": round(max(v), 1)}
                       for f, v in sorted(by_f.items())},
        "faults": [{"kind": k, "start_s": round(s, 2), "end_s": round(e, 2)}
                   for k, s, e in fault_intervals(history)],
    }


# Figure objects, not pyplot (pyplot's global figure registry is not thread-safe), and one
# render at a time: campaign workers plot from threads, and matplotlib's mathtext parser (the
# log axis's tick labels) is shared and not thread-safe either; concurrent renders failed with
# ParseException in about 1 run in 20 of a 3-worker campaign.
_RENDER_LOCK: Final = threading.Lock()


def write_plots(history: History, directory: Path) -> list[str]:
    """Write ``latency-raw.png`` and ``rate.png``; returns their file names."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return []
    lat = latencies(history)
    faults = fault_intervals(history)
    with _RENDER_LOCK:
        _latency_figure(Figure(figsize=(10, 4.5)), lat, faults, directory.name).savefig(
            directory / "latency-raw.png", dpi=100)
        _rate_figure(Figure(figsize=(10, 4.5)), lat, faults, directory.name).savefig(
            directory / "rate.png", dpi=100)
    return ["latency-raw.png", "rate.png"]


def _shade(ax: Any, faults: list[tuple[str, float, float]]) -> None:
    seen: set[str] = set()
    for kind, s, e in faults:
        ax.axvspan(s, e, color=FAULT_COLORS.get(kind, "#999999"), alpha=0.22,
                   label=None if kind in seen else kind)
        seen.add(kind)


def _latency_figure(fig: Any, lat: list[tuple[Op, Op, float]],
                    faults: list[tuple[str, float, float]], name: str) -> Any:
    ax = fig.subplots()
    _shade(ax, faults)
    markers = {"send": "o", "poll": "s", "txn": "D"}
    for f in sorted({inv.f for inv, _, _ in lat}):
        for t in ("ok", "info", "fail"):
            pts = [(c.time / 1e9, ms) for inv, c, ms in lat if inv.f == f and c.type == t]
            if pts:
                ax.scatter([p[0] for p in pts], [max(p[1], 0.01) for p in pts], s=6,
                           marker=markers.get(f, "^"), color=COLORS[t], alpha=0.6,
                           label=f"{f} {t}")
    ax.set_yscale("log")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"latency ({name})")
    ax.legend(fontsize=7, loc="upper left", ncol=3)
    fig.tight_layout()
    return fig


def _rate_figure(fig: Any, lat: list[tuple[Op, Op, float]],
                 faults: list[tuple[str, float, float]], name: str) -> Any:
    ax = fig.subplots()
    _shade(ax, faults)
    end = int(max((c.time for _, c, _ in lat), default=0) / 1e9) + 1
    for t in ("ok", "info", "fail"):
        buckets = [0] * end
        for _, c, _ in lat:
            if c.type == t:
                buckets[min(int(c.time / 1e9), end - 1)] += 1
        if any(buckets):
            ax.plot(range(end), buckets, color=COLORS[t], label=t, drawstyle="steps-post")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("completions / s")
    ax.set_title(f"throughput ({name})")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def write_metrics_plot(history: History, samples: list[Sample], directory: Path) -> list[str]:
    """Write ``metrics.png`` from the scraped samples; returns its name (nothing without
    samples or matplotlib)."""
    if not samples:
        return []
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return []
    faults = fault_intervals(history)
    with _RENDER_LOCK:
        _metrics_figure(Figure(figsize=(10, 6.5)), samples, faults, directory.name).savefig(
            directory / "metrics.png", dpi=100)
    return ["metrics.png"]


def _metrics_figure(fig: Any, samples: list[Sample], faults: list[tuple[str, float, float]],
                    name: str) -> Any:
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(1, 1.3))
    _shade(top, faults)
    urp = under_replicated_series(samples)
    if urp:
        top.plot([t for t, _, _ in urp], [u for _, u, _ in urp], color="#1d3557",
                 drawstyle="steps-post", label="under-replicated partitions (sum over nodes)")
    nodes = sorted({s.node for s in samples})
    gaps = missing(samples)
    labelled = False
    for i, node in enumerate(nodes):  # one row of marks per node below 0: n1 on top
        pts = [t for t, n in gaps if n == node]
        if pts:
            top.scatter(pts, [-0.4 - 0.4 * i] * len(pts), marker="|", s=30, color="#6c757d",
                        label=None if labelled else "scrape not answered (rows: n1, n2, ...)")
            labelled = True
    top.set_ylim(bottom=-0.4 - 0.4 * len(nodes),
                 top=max(1.0, max((u for _, u, _ in urp), default=0.0)) * 1.15)
    top.set_ylabel("partitions")
    top.set_title(f"node metrics ({name})")
    top.legend(fontsize=7, loc="upper left")
    _shade(bottom, faults)
    lat = latency_series(samples)
    styles = {0.5: ("p50", "#2a9d8f"), 0.99: ("p99", "#e76f51")}
    for q, (label, color) in styles.items():
        points = _break_gaps([(t, v[q]) for t, v, _ in lat if q in v])
        if points:
            bottom.plot([p[0] for p in points], [max(p[1], 0.01) for p in points], marker=".",
                        color=color, label=f"Produce total time {label} (nodes' histograms)")
    bottom.set_yscale("log")
    bottom.set_xlabel("time (s)")
    bottom.set_ylabel("latency (ms)")
    bottom.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def _break_gaps(points: list[tuple[float, float]], step_s: float = 1.0
                ) -> list[tuple[float, float]]:
    """A NaN point between two points more than a step apart: no line across a window
    without Produce requests."""
    out: list[tuple[float, float]] = []
    for t, v in points:
        if out and t - out[-1][0] > step_s * 1.5:
            out.append((t - step_s, float("nan")))
        out.append((t, v))
    return out
