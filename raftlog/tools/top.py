"""`raftlog top`: a live terminal view of a cluster for someone without Prometheus.

    raftlog top [--metrics URL[,URL...] | --data-dir DIR] [--interval S] [--once]

Every ``--interval`` seconds it scrapes each node's ``/metrics`` (docs/metrics.md; in
parallel, each with a timeout) and redraws one frame: the cluster's health (nodes up, the
active controller, offline and under-min-ISR partitions, fenced brokers), a row per node (up or
down, Raft role, partitions and leaderships, under-replicated partitions, produce and fetch
request rates, bytes in and out, p99 produce latency) and the consumer groups with the most
lag. Rates and the latency percentile come from two consecutive samples, so the first frame
waits one interval; ``--once`` prints that one frame and exits.

``--data-dir`` reads the layout of a ``raftlog cluster up`` directory (``cluster.json``, its
``metrics_ports``) and never writes to it. Rendering is a pure function of two parsed samples
(:func:`render`), scraping the only I/O.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TextIO

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Sample", "metrics_urls", "parse_sample", "render", "run_top", "scrape"]

DEFAULT_INTERVAL_S: Final = 2.0
DEFAULT_TIMEOUT_S: Final = 2.0
LAYOUT_FILE: Final = "cluster.json"  # raftlog.tools.cluster's layout (read only)
LAYOUT_METRICS_KEY: Final = "metrics_ports"
LAYOUT_HOST: Final = "127.0.0.1"
GROUPS_SHOWN: Final = 15
CLEAR: Final = "\x1b[H\x1b[2J"

Labels = tuple[tuple[str, str], ...]


class TopError(Exception):
    """No metrics to read (bad arguments, a layout without metrics ports)."""


@dataclass(frozen=True)
class Sample:
    """One scrape of one node: its samples by name (``..._total``, ``..._bucket`` as exposed),
    each a list of (labels, value); ``error`` says why there are none."""

    source: str
    at: float  # monotonic seconds
    values: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)
    error: str | None = None

    @property
    def up(self) -> bool:
        return self.error is None

    def series(self, name: str, **match: str) -> list[float]:
        return [value for labels, value in self.values.get(name, ())
                if all(labels.get(k) == v for k, v in match.items())]

    def total(self, name: str, **match: str) -> float | None:
        """The sum of the matching series (None when the node exports none)."""
        found = self.series(name, **match)
        return sum(found) if found else None

    def labelled(self, name: str, label: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for labels, value in self.values.get(name, ()):
            key = labels.get(label)
            if key is not None:
                out[key] = out.get(key, 0.0) + value
        return out


def parse_sample(source: str, at: float, text: str) -> Sample:
    """The Prometheus text ``text`` of one node, parsed with prometheus_client's parser."""
    values: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    except ValueError as exc:
        return Sample(source, at, error=f"unparsable metrics: {exc}")
    return Sample(source, at, values)


def scrape(url: str, timeout_s: float = DEFAULT_TIMEOUT_S,
           clock: Callable[[], float] = time.monotonic) -> Sample:
    """GET ``url`` (a node's /metrics) within ``timeout_s``: a Sample, or one with the error."""
    at = clock()
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            text = response.read().decode("utf-8", "replace")
    except (OSError, ValueError, http.client.HTTPException) as exc:  # refused, timed out..
        reason = getattr(exc, "reason", None) or exc
        return Sample(url, at, error=str(reason))
    return parse_sample(url, at, text)


def metrics_urls(metrics: str | None, data_dir: Path | None) -> list[str]:
    """The /metrics URLs to read: ``--metrics`` (comma-separated; ``host:port`` is enough)
    or the ``metrics_ports`` of a ``raftlog cluster up`` layout in ``data_dir``."""
    if metrics:
        return [_metrics_url(item.strip()) for item in metrics.split(",") if item.strip()]
    if data_dir is None:
        raise TopError("give --metrics URL[,URL...] or --data-dir of a `raftlog cluster up`")
    path = data_dir / LAYOUT_FILE
    try:
        layout = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise TopError(f"{path} not found: is {data_dir} a `raftlog cluster up` "
                       "directory? (or give --metrics)") from exc
    except (OSError, ValueError) as exc:
        raise TopError(f"cannot read {path}: {exc}") from exc
    ports = layout.get(LAYOUT_METRICS_KEY) if isinstance(layout, dict) else None
    if not isinstance(ports, list) or not ports:
        raise TopError(f"{path} has no {LAYOUT_METRICS_KEY} (a cluster made before metrics "
                       "existed): give --metrics URL[,URL...]")
    host = layout.get("host", LAYOUT_HOST)
    return [f"http://{host}:{int(port)}/metrics" for port in ports]


def _metrics_url(item: str) -> str:
    url = item if "://" in item else f"http://{item}"
    scheme, _, rest = url.partition("://")
    if scheme not in ("http", "https"):
        raise TopError(f"{item!r}: metrics URLs are http:// or https://")
    if "/" not in rest:
        url = f"{scheme}://{rest}/metrics"
    return url


# -- reading two samples ---------------------------------------------------------------------


def _rate(previous: Sample | None, current: Sample, name: str, **match: str) -> float | None:
    """Per second between two samples of one node (None: unknown, or a counter reset)."""
    if previous is None or not previous.up or not current.up:
        return None
    before, now = previous.total(name, **match), current.total(name, **match)
    elapsed = current.at - previous.at
    if before is None or now is None or elapsed <= 0 or now < before:
        return None
    return (now - before) / elapsed


def _buckets(sample: Sample, name: str, **match: str) -> dict[float, float]:
    out: dict[float, float] = {}
    for labels, value in sample.values.get(name, ()):
        if all(labels.get(k) == v for k, v in match.items()) and "le" in labels:
            bound = float(labels["le"])
            out[bound] = out.get(bound, 0.0) + value
    return out


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """PromQL's histogram_quantile over cumulative ``buckets`` (upper bound → count)."""
    bounds = sorted(buckets)
    if not bounds or not math.isinf(bounds[-1]):
        return None
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower  # in the +Inf bucket: the highest finite bound
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return None


def _window_quantile(q: float, previous: Sample | None, current: Sample, name: str,
                     **match: str) -> float | None:
    """The q-quantile of the observations between two samples (of all, without a previous)."""
    now = _buckets(current, name, **match)
    if previous is not None and previous.up:
        before = _buckets(previous, name, **match)
        if before and all(now.get(b, 0.0) >= v for b, v in before.items()):
            now = {b: v - before.get(b, 0.0) for b, v in now.items()}
    return quantile(q, now)


# -- rendering -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _NodeRow:
    name: str
    cells: tuple[str, ...]
    note: str = ""


COLUMNS: Final = ("NODE", "STATE", "RAFT", "CTRL", "PARTS", "LEADERS", "URP", "PRODUCE/s",
                  "FETCH/s", "IN/s", "OUT/s", "P99 PRODUCE")


def _number(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if digits else f"{round(value):d}"


def _bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError


def _millis(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f} ms" if value < 1000 else f"{value / 1000:.2f} s"


def _node_name(sample: Sample, index: int) -> str:
    for labels, _ in sample.values.get("raftlog_node_info", ()):
        if labels.get("node_id"):
            return labels["node_id"]
    return f"#{index + 1}"


def _raft_role(sample: Sample) -> str:
    for labels, value in sample.values.get("kafka_server_raft_metrics_current_state", ()):
        if value == 1 and "state" in labels:
            return labels["state"]
    return "-"


def _node_row(index: int, previous: Sample | None, current: Sample) -> _NodeRow:
    name = _node_name(current, index) if current.up else \
        (_node_name(previous, index) if previous is not None else f"#{index + 1}")
    if not current.up:
        return _NodeRow(name, (name, "DOWN"), f"{current.source}: {current.error}")
    active = current.total("kafka_controller_kafkacontroller_activecontrollercount")
    produce = _rate(previous, current, "kafka_network_requestmetrics_requests_total",
                    request="Produce")
    fetch = _rate(previous, current, "kafka_network_requestmetrics_requests_total",
                  request="FetchConsumer")
    p99 = _window_quantile(0.99, previous, current,
                           "kafka_network_requestmetrics_totaltimems_bucket", request="Produce")
    cells = (
        name, "up", _raft_role(current), "*" if active else "",
        _number(current.total("kafka_server_replicamanager_partitioncount")),
        _number(current.total("kafka_server_replicamanager_leadercount")),
        _number(current.total("kafka_server_replicamanager_underreplicatedpartitions")),
        _number(produce, 1), _number(fetch, 1),
        _bytes(_rate(previous, current, "kafka_server_brokertopicmetrics_bytesin_total")),
        _bytes(_rate(previous, current, "kafka_server_brokertopicmetrics_bytesout_total")),
        _millis(p99),
    )
    return _NodeRow(name, cells)


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows if i < len(row))
              for i in range(max(len(row) for row in rows))]
    return ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
            for row in rows]


def _cluster_sum(samples: Iterable[Sample], name: str) -> float | None:
    found = [v for s in samples if s.up and (v := s.total(name)) is not None]
    return sum(found) if found else None


def _group_lags(samples: Iterable[Sample]) -> dict[str, tuple[float, float]]:
    """group → (lag sum, lag max); a group reported by two nodes (a coordinator moving)
    counts once, with the larger values."""
    out: dict[str, tuple[float, float]] = {}
    for sample in samples:
        if not sample.up:
            continue
        sums = sample.labelled("kafka_consumergroup_lag_sum", "group")
        maxes = sample.labelled("kafka_consumergroup_lag_max", "group")
        for group, total in sums.items():
            old = out.get(group, (0.0, 0.0))
            out[group] = (max(old[0], total), max(old[1], maxes.get(group, 0.0)))
    return out


def render(previous: Sequence[Sample] | None, current: Sequence[Sample]) -> str:
    """One frame from the current samples (and the previous ones, same order, for rates)."""
    before: Sequence[Sample | None] = previous if previous is not None and \
        len(previous) == len(current) else [None] * len(current)
    up = [s for s in current if s.up]
    controllers = [_node_name(s, i) for i, s in enumerate(current)
                   if s.up and s.total("kafka_controller_kafkacontroller_activecontrollercount")]
    elapsed = [c.at - p.at for p, c in zip(before, current, strict=True) if p is not None]

    def figure(name: str) -> str:
        return _number(_cluster_sum(up, name))

    lines = [
        f"raftlog top: {len(up)}/{len(current)} nodes up"
        f"   active controller: {','.join(controllers) or 'none'}"
        + (f" (expected exactly 1: {len(controllers)})" if len(controllers) > 1 else ""),
        f"offline partitions: {figure('kafka_controller_kafkacontroller_offlinepartitionscount')}"
        f"   under-replicated: "
        f"{figure('kafka_server_replicamanager_underreplicatedpartitions')}"
        f"   under-min-ISR: "
        f"{figure('kafka_server_replicamanager_underminisrpartitioncount')}"
        f"   brokers active/fenced: "
        f"{figure('kafka_controller_kafkacontroller_activebrokercount')}/"
        f"{figure('kafka_controller_kafkacontroller_fencedbrokercount')}"
        + (f"   (rates over {max(elapsed):.1f} s)" if elapsed else "   (rates: next frame)"),
        "",
    ]
    rows = [_node_row(i, p, c) for i, (p, c) in enumerate(zip(before, current, strict=True))]
    lines.extend(_table([COLUMNS, *(row.cells for row in rows)]))
    lines.extend(f"  node {row.name}: {row.note}" for row in rows if row.note)
    lines.append("")
    lines.extend(_groups_section(before, current))
    return "\n".join(lines) + "\n"


def _groups_section(before: Sequence[Sample | None], current: Sequence[Sample]) -> list[str]:
    states: dict[str, float] = {}
    for sample in current:
        if sample.up:
            for state, count in sample.labelled(
                    "kafka_coordinator_group_groupmetadatamanager_numgroups", "state").items():
                states[state] = states.get(state, 0.0) + count
    counted = ", ".join(f"{state} {count:.0f}" for state, count in sorted(states.items())
                        if count)
    ongoing = _cluster_sum(current, "raftlog_txn_ongoing")
    head = f"groups: {counted or 'none'}" + \
        ("" if ongoing is None else f"   open transactions: {ongoing:.0f}")
    lags = _group_lags(current)
    if not lags:
        return [head, "  (no committed offsets)"]
    earlier = _group_lags(s for s in before if s is not None)
    elapsed = max((c.at - p.at for p, c in zip(before, current, strict=True)
                   if p is not None), default=0.0)
    rows: list[tuple[str, ...]] = [("GROUP", "LAG", "MAX", "LAG Δ/s")]
    ranked = sorted(lags.items(), key=lambda item: (-item[1][0], item[0]))
    for group, (total, largest) in ranked[:GROUPS_SHOWN]:
        trend = "-"
        if group in earlier and elapsed > 0:
            trend = f"{(total - earlier[group][0]) / elapsed:+.1f}"
        rows.append((group, _number(total), _number(largest), trend))
    lines = [head, *_table(rows)]
    if len(ranked) > GROUPS_SHOWN:
        lines.append(f"  ... and {len(ranked) - GROUPS_SHOWN} more groups")
    return lines


# -- the command -----------------------------------------------------------------------------


def sample_all(urls: Sequence[str], timeout_s: float) -> list[Sample]:
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(urls)))) as pool:
        return list(pool.map(lambda url: scrape(url, timeout_s), urls))


def run_top(urls: Sequence[str], *, interval_s: float = DEFAULT_INTERVAL_S, once: bool = False,
            timeout_s: float = DEFAULT_TIMEOUT_S, out: TextIO | None = None,
            frames: int | None = None) -> int:
    """Redraw every ``interval_s`` until interrupted (``once``: one frame, from two samples
    ``interval_s`` apart). Returns 1 when no node answered the last scrape."""
    stream = out or sys.stdout
    if once:
        first = sample_all(urls, timeout_s)
        time.sleep(interval_s)
        current = sample_all(urls, timeout_s)
        stream.write(render(first, current))
        stream.flush()
        return 0 if any(s.up for s in current) else 1
    clear = stream.isatty()
    previous: list[Sample] | None = None
    drawn = 0
    while True:
        current = sample_all(urls, timeout_s)
        stream.write((CLEAR if clear else "") + render(previous, current))
        stream.flush()
        drawn += 1
        if frames is not None and drawn >= frames:
            return 0 if any(s.up for s in current) else 1
        previous = current
        time.sleep(interval_s)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser],
               default_data_dir: str) -> None:
    top = commands.add_parser("top", help="live view of brokers, leaders, ISR health, "
                                          "throughput and group lag (from /metrics)")
    top.add_argument("--metrics", default=None, metavar="URL[,URL...]",
                     help="each node's metrics URL (host:port is enough)")
    top.add_argument("--data-dir", default=default_data_dir,
                     help="a `raftlog cluster up` directory, read for its metrics ports "
                          f"(default ./{default_data_dir}; ignored with --metrics)")
    top.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S,
                     help=f"seconds between frames (default {DEFAULT_INTERVAL_S:g})")
    top.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                     help=f"seconds to wait for each node (default {DEFAULT_TIMEOUT_S:g})")
    top.add_argument("--once", action="store_true",
                     help="print one frame (two samples --interval apart) and exit")


def run(args: argparse.Namespace) -> int:
    try:
        urls = metrics_urls(args.metrics, None if args.metrics else Path(args.data_dir))
    except TopError as exc:
        print(f"raftlog top: {exc}", file=sys.stderr)
        return 2
    if args.interval <= 0 or args.timeout <= 0:
        print("raftlog top: --interval and --timeout must be positive", file=sys.stderr)
        return 2
    try:
        return run_top(urls, interval_s=args.interval, once=args.once, timeout_s=args.timeout)
    except KeyboardInterrupt:
        return 0
