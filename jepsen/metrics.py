"""The nodes' own metrics during a run: what the harness keeps of each scrape of ``/metrics``
(:func:`select`), the samples file (``metrics.jsonl``), and the series the report plots next to
the faults (:func:`under_replicated_series`, :func:`latency_series`). Pure: no I/O but reading
the samples file.

One line of ``metrics.jsonl`` per scrape of one node::

    {"t": 12.004, "node": 2, "ok": true, "values": {"urp": 3, "controller": 0, "leaders": 2,
     "offline": 0, "produce_requests": 812, "produce_count": 812, "produce_sum": 5312.4,
     "produce_buckets": [[0.1, 0], [0.25, 3], ..., ["+Inf", 812]]}}
    {"t": 13.001, "node": 3, "ok": false, "error": "timed out"}

``t`` is seconds since the history's start (the clock of ``history.jsonl``'s ``time``). A node
that is down, paused or cut off is a line with ``ok: false``: missing, never waited for.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

UNDER_REPLICATED: Final = "kafka_server_replicamanager_underreplicatedpartitions"
ACTIVE_CONTROLLER: Final = "kafka_controller_kafkacontroller_activecontrollercount"
LEADERS: Final = "kafka_server_replicamanager_leadercount"
OFFLINE: Final = "kafka_controller_kafkacontroller_offlinepartitionscount"
REQUESTS: Final = "kafka_network_requestmetrics_requests_total"
TOTAL_TIME: Final = "kafka_network_requestmetrics_totaltimems"
GAUGES: Final = {UNDER_REPLICATED: "urp", ACTIVE_CONTROLLER: "controller", LEADERS: "leaders",
                 OFFLINE: "offline"}
_PREFIXES: Final = (*GAUGES, REQUESTS, TOTAL_TIME)
_SAMPLE: Final = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL: Final = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
PRODUCE: Final = 'request="Produce"'


def _bound(le: str) -> float:
    return math.inf if le == "+Inf" else float(le)


def select(text: str) -> dict[str, Any]:
    """The values the harness keeps from one ``/metrics`` body (Prometheus text format)."""
    values: dict[str, Any] = {}
    buckets: list[tuple[float, float]] = []
    for line in text.splitlines():
        if not line.startswith(_PREFIXES):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, raw = match.groups()
        try:
            value = float(raw)
        except ValueError:
            continue
        if name in GAUGES:
            values[GAUGES[name]] = values.get(GAUGES[name], 0.0) + value
            continue
        if labels is None or PRODUCE not in labels:
            continue
        if name == REQUESTS:
            values["produce_requests"] = value
        elif name == f"{TOTAL_TIME}_count":
            values["produce_count"] = value
        elif name == f"{TOTAL_TIME}_sum":
            values["produce_sum"] = value
        elif name == f"{TOTAL_TIME}_bucket":
            le = dict(_LABEL.findall(labels)).get("le")
            if le is not None:
                buckets.append((_bound(le), value))
    if buckets:
        buckets.sort()
        values["produce_buckets"] = [["+Inf" if math.isinf(b) else b, c] for b, c in buckets]
    return values


@dataclass(frozen=True)
class Sample:
    """One scrape of one node."""

    t: float
    node: int
    ok: bool
    values: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def to_json(self) -> str:
        line: dict[str, Any] = {"t": round(self.t, 3), "node": self.node, "ok": self.ok}
        if self.ok:
            line["values"] = self.values
        else:
            line["error"] = self.error
        return json.dumps(line, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> Sample:
        d = json.loads(line)
        return cls(float(d["t"]), int(d["node"]), bool(d["ok"]), d.get("values") or {},
                   d.get("error"))

    def buckets(self) -> list[tuple[float, float]]:
        return [(_bound(str(b)) if isinstance(b, str) else float(b), float(c))
                for b, c in self.values.get("produce_buckets", [])]


def read_samples(path: Path) -> list[Sample]:
    """The samples file, skipping a torn last line; empty when there is none."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(Sample.from_json(line))
        except (ValueError, KeyError):
            continue
    return sorted(out, key=lambda s: s.t)


def _step(t: float, step_s: float) -> float:
    return math.floor(t / step_s) * step_s


def under_replicated_series(samples: Iterable[Sample], step_s: float = 1.0
                            ) -> list[tuple[float, float, int]]:
    """``(t, under-replicated partitions summed over the nodes, nodes that answered)`` per
    ``step_s`` window: each node's last successful scrape in the window. A node that did not
    answer counts for nothing (as Prometheus's staleness drops a down target's series)."""
    last: dict[float, dict[int, float]] = defaultdict(dict)
    for s in samples:
        if s.ok and "urp" in s.values:
            last[_step(s.t, step_s)][s.node] = float(s.values["urp"])
    return [(t, sum(by_node.values()), len(by_node)) for t, by_node in sorted(last.items())]


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus's ``histogram_quantile`` on cumulative ``(upper bound, count)`` buckets:
    linear interpolation inside the bucket holding the rank; the highest finite bound when
    the rank falls in ``+Inf``; None without observations."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return ordered[-1][0]


def latency_series(samples: Iterable[Sample], quantiles: Sequence[float] = (0.5, 0.99),
                   step_s: float = 1.0) -> list[tuple[float, dict[float, float], float]]:
    """``(t, {q: Produce total time in ms}, requests)`` per ``step_s`` window, over the
    requests every node completed between its previous successful scrape and one in the window
    (the per-interval increase of the cumulative buckets, summed over nodes, as
    ``histogram_quantile(q, sum(rate(..._bucket[...])))`` would). A node whose count went down
    restarted: that interval is skipped. Windows without requests are left out."""
    previous: dict[int, Sample] = {}
    window: dict[float, dict[float, float]] = defaultdict(lambda: defaultdict(float))
    for s in sorted(samples, key=lambda x: x.t):
        if not s.ok or "produce_buckets" not in s.values:
            continue
        before = previous.get(s.node)
        previous[s.node] = s
        if before is None:
            continue
        now, then = dict(s.buckets()), dict(before.buckets())
        if any(now.get(b, 0.0) < c for b, c in then.items()):
            continue  # a restart reset the counters
        into = window[_step(s.t, step_s)]
        for bound, count in now.items():
            into[bound] += count - then.get(bound, 0.0)
    out = []
    for t, increase in sorted(window.items()):
        buckets = sorted(increase.items())
        total = buckets[-1][1] if buckets else 0.0
        if total <= 0:
            continue
        values = {q: v for q in quantiles
                  if (v := histogram_quantile(q, buckets)) is not None}
        out.append((t, values, total))
    return out


def missing(samples: Iterable[Sample]) -> list[tuple[float, int]]:
    """``(t, node)`` of every scrape that got no answer."""
    return [(s.t, s.node) for s in samples if not s.ok]


def summary(samples: Sequence[Sample]) -> dict[str, Any]:
    """For results.json: how many scrapes, how many missed, the peaks of the plotted series."""
    urp = under_replicated_series(samples)
    p99 = [v[0.99] for _, v, _ in latency_series(samples) if 0.99 in v]
    return {
        "scrapes": len(samples),
        "missed": sum(1 for s in samples if not s.ok),
        "under_replicated_max": max((u for _, u, _ in urp), default=None),
        "under_replicated_at_end": urp[-1][1] if urp else None,
        "produce_p99_ms_max": round(max(p99), 1) if p99 else None,
        "produce_p99_ms_median": round(sorted(p99)[len(p99) // 2], 1) if p99 else None,
    }
