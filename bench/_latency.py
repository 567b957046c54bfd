"""The latency benchmark's scenarios, what one run records, and the report: the table of
percentiles, the raftlog/NATS ratios and PASS/MISS against issue 18's targets. The clients
that produce and publish are in ``_latency_clients.py``; the CLI is ``latency.py``.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RECORD_BYTES = 1024
TARGET_P99_VS_NATS = 2.0  # at 1 MB/s: raftlog p99 <= 2 x NATS R3 p99
TARGET_ONE_AT_A_TIME_P50_MS = 2.0


@dataclass(frozen=True)
class Scenario:
    """One raftlog producer setting. `rate_records_s` 0 means one record at a time (the next
    produce() after the previous delivery report). `nats` names the NATS run it is compared
    with: NATS has no linger, so both 1 MB/s settings share one."""

    name: str
    rate_label: str
    rate_records_s: float
    linger_ms: int
    nats: str

    @property
    def label(self) -> str:
        return f"{self.rate_label} linger.ms={self.linger_ms}" if self.rate_records_s \
            else self.rate_label

    @property
    def where(self) -> str:
        """As the ratio lines name it: "at 1 MB/s (linger.ms=1)", "one-at-a-time"."""
        return f"at {self.rate_label} (linger.ms={self.linger_ms})" if self.rate_records_s \
            else "one-at-a-time"


SCENARIOS = (
    Scenario("1mb-linger1", "1 MB/s", 1000.0, 1, "1mb"),
    Scenario("1mb-linger0", "1 MB/s", 1000.0, 0, "1mb"),
    Scenario("10mb-linger5", "10 MB/s", 10_000.0, 5, "10mb"),
    Scenario("one-at-a-time", "one at a time", 0.0, 0, "one-at-a-time"),
)
NATS_LABELS = {"1mb": "1 MB/s", "10mb": "10 MB/s", "one-at-a-time": "one at a time"}


def nats_runs(scenarios: Sequence[Scenario]) -> list[tuple[str, float]]:
    """(name, rate_records_s) of every NATS run the chosen raftlog scenarios need, once each."""
    seen: dict[str, float] = {}
    for scenario in scenarios:
        seen.setdefault(scenario.nats, scenario.rate_records_s)
    return list(seen.items())


@dataclass
class Options:
    duration_s: float
    warmup_s: float
    repeats: int
    json_path: Path | None
    skip_nats: bool
    scenarios: list[Scenario]
    one_at_a_time_records: int
    trace: bool = False  # trace.produce.enable on the raftlog nodes; stage lines per scenario
    # --topic-config: over the bench's topic config (a diagnostic run: targets not judged)
    topic_config: dict[str, str] = field(default_factory=dict)


def diagnostic(options: Options) -> str:
    """What makes this a diagnostic run ("" for a normal one)."""
    if not options.topic_config:
        return ""
    given = ", ".join(f"{k}={v}" for k, v in options.topic_config.items())
    return f"a diagnostic run, topic config {given}"


# -- what one run records --------------------------------------------------------------------


class Recorder:
    """Send and acknowledgement times of one run. Records with an index below `warmup` (the
    warm-up) are sent and acknowledged like the others but not counted."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.latencies_s: list[float] = []
        self.lags_s: list[float] = []  # how late each produce() was against its schedule
        self.sent = 0
        self.failed = 0
        self.completed = 0  # warm-up included: the one-at-a-time loops wait on it
        self.first_error = ""
        self.first_sent_at = math.nan
        self.last_ack_at = math.nan

    def sending(self, index: int, sent_at: float, due_at: float | None = None) -> None:
        if index < self.warmup:
            return
        if self.sent == 0:
            self.first_sent_at = sent_at
        self.sent += 1
        if due_at is not None:
            self.lags_s.append(max(0.0, sent_at - due_at))

    def finished(self, index: int, sent_at: float, error: Any) -> None:
        now = time.perf_counter()
        self.completed += 1
        if index < self.warmup:
            return
        if error is not None:
            self.failed += 1
            self.first_error = self.first_error or str(error)
        else:
            self.latencies_s.append(now - sent_at)
            self.last_ack_at = now

    def kafka_report(self, index: int, sent_at: float, error: Any, _message: Any) -> None:
        """confluent-kafka's on_delivery(err, msg), with the index and send time bound."""
        self.finished(index, sent_at, error)

    def nats_ack(self, index: int, sent_at: float, future: Any) -> None:
        """A done-callback of js.publish_async's future, with the index and send time bound."""
        error = "cancelled" if future.cancelled() else future.exception()
        self.finished(index, sent_at, error)


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of an ascending sequence (NaN when empty)."""
    if not sorted_values:
        return math.nan
    rank = math.ceil(pct / 100 * len(sorted_values))
    return sorted_values[min(len(sorted_values), max(rank, 1)) - 1]


@dataclass
class LatencyRun:
    """One scenario of one system in one repeat; latencies in ms from the send call to the
    delivery report / PubAck."""

    system: str
    scenario: str
    label: str
    repeat: int
    target_rate_records_s: float
    sent: int = 0
    acked: int = 0
    failed: int = 0
    p50_ms: float = math.nan
    p90_ms: float = math.nan
    p99_ms: float = math.nan
    p999_ms: float = math.nan
    max_ms: float = math.nan
    mean_ms: float = math.nan
    achieved_rate_records_s: float = math.nan
    send_lag_p99_ms: float = math.nan
    send_lag_max_ms: float = math.nan
    cpu_pct: dict[str, float] = field(default_factory=dict)
    note: str = ""
    trace: list[str] = field(default_factory=list)  # --trace: the nodes' stage summaries

    @classmethod
    def of(cls, recorder: Recorder, system: str, scenario: str, label: str, repeat: int,
           rate_records_s: float) -> LatencyRun:
        lat_ms = sorted(x * 1000 for x in recorder.latencies_s)
        lag_ms = sorted(x * 1000 for x in recorder.lags_s)
        missing = recorder.sent - len(lat_ms) - recorder.failed  # never acked nor failed
        run = cls(system, scenario, label, repeat, rate_records_s, recorder.sent, len(lat_ms),
                  recorder.failed + max(missing, 0))
        run.p50_ms, run.p90_ms, run.p99_ms, run.p999_ms = (
            percentile(lat_ms, p) for p in (50, 90, 99, 99.9))
        run.max_ms = lat_ms[-1] if lat_ms else math.nan
        run.mean_ms = statistics.fmean(lat_ms) if lat_ms else math.nan
        window_s = recorder.last_ack_at - recorder.first_sent_at
        run.achieved_rate_records_s = len(lat_ms) / window_s if window_s > 0 else math.nan
        run.send_lag_p99_ms = percentile(lag_ms, 99)
        run.send_lag_max_ms = lag_ms[-1] if lag_ms else math.nan
        if run.failed:
            run.note = f"{recorder.failed} failed, {max(missing, 0)} never acknowledged " \
                f"(first error: {recorder.first_error or '-'})"
        return run

    @classmethod
    def failure(cls, system: str, scenario: str, label: str, repeat: int,
                rate_records_s: float, error: str) -> LatencyRun:
        return cls(system, scenario, label, repeat, rate_records_s, note=error)

    def line(self) -> str:
        cpu = "  cpu brokers {brokers:.0f}% client {client:.0f}% box {box:.0f}%".format(
            **self.cpu_pct) if self.cpu_pct else ""
        lag = f"  send lag p99 {self.send_lag_p99_ms:.2f} ms" if self.target_rate_records_s \
            else ""
        note = f"  ! {self.note.splitlines()[0][:200]}" if self.note else ""
        return (f"  r{self.repeat} {self.system:<7} {self.label:<20} p50 {self.p50_ms:7.2f} "
                f"p90 {self.p90_ms:7.2f} p99 {self.p99_ms:7.2f} max {self.max_ms:8.2f} ms  "
                f"{self.acked:,} acked, {self.failed:,} failed, "
                f"{self.achieved_rate_records_s:,.0f}/s{lag}{cpu}{note}")


# -- the report ---------------------------------------------------------------------------------


def _median(values: Sequence[float]) -> float:
    finite = [v for v in values if v == v]
    return statistics.median(finite) if finite else math.nan


def summarise(runs: Sequence[LatencyRun], system: str, scenario: str) -> dict[str, Any]:
    """Medians over the repeats of one (system, scenario); acked and failed are summed."""
    mine = [r for r in runs if (r.system, r.scenario) == (system, scenario)]
    out: dict[str, Any] = {"repeats": len(mine), "acked": sum(r.acked for r in mine),
                           "failed": sum(r.failed for r in mine)}
    for key in ("p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms", "achieved_rate_records_s",
                "send_lag_p99_ms"):
        out[key] = _median([getattr(r, key) for r in mine])
    return out


def _row(scenario: str, system: str, s: dict[str, Any]) -> str:
    return (f"{scenario:<20} {system:<8} {s['p50_ms']:8.2f} {s['p90_ms']:8.2f} "
            f"{s['p99_ms']:8.2f} {s['max_ms']:8.2f} {s['acked']:>9,} {s['failed']:>7,} "
            f"{s['achieved_rate_records_s']:>10,.0f}")


def _verdict(ok: bool | None) -> str:
    return "n/a " if ok is None else ("PASS" if ok else "MISS")


def report(options: Options, runs: Sequence[LatencyRun]) -> dict[str, Any]:
    """Print the table, the ratios and the targets; return them for the JSON file."""
    table: dict[str, dict[str, Any]] = {}
    print(f"\n=== produce latency, median of {options.repeats} repeat(s) per cell "
          f"(acked/failed summed) ===")
    print(f"{'scenario':<20} {'system':<8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} "
          f"{'max ms':>8} {'acked':>9} {'failed':>7} {'achieved/s':>10}")
    for nats_name, _rate in nats_runs(options.scenarios):
        for scenario in (s for s in options.scenarios if s.nats == nats_name):
            table[f"raftlog {scenario.name}"] = row = summarise(runs, "raftlog", scenario.name)
            print(_row(scenario.label, "raftlog", row))
        if not options.skip_nats:
            table[f"nats {nats_name}"] = row = summarise(runs, "nats", nats_name)
            print(_row(NATS_LABELS[nats_name], "nats R3", row))
    ratios: dict[str, float] = {}
    targets: dict[str, str] = {}
    if not options.skip_nats:
        print()
        for scenario in options.scenarios:
            ours, theirs = table[f"raftlog {scenario.name}"], table[f"nats {scenario.nats}"]
            metrics = ("p50_ms", "p99_ms") if scenario.rate_records_s == 0 else ("p99_ms",)
            for metric in metrics:
                key = f"raftlog/NATS {metric[:-3]} {scenario.where}"
                ratios[key] = ours[metric] / theirs[metric] if theirs[metric] > 0 else math.nan
                print(f"{key}: {ratios[key]:.2f}")
    print()
    if options.topic_config:
        print(f"targets not judged: {diagnostic(options)}")
        return {"table": table, "ratios": ratios, "targets": targets}
    for scenario in options.scenarios:
        if scenario.nats == "1mb":
            ratio = ratios.get(f"raftlog/NATS p99 {scenario.where}", math.nan)
            ok = None if ratio != ratio else ratio <= TARGET_P99_VS_NATS
            targets[f"p99 {scenario.label} <= {TARGET_P99_VS_NATS:g}x NATS"] = _verdict(ok)
            print(f"{_verdict(ok)}  raftlog p99 at {scenario.label} <= "
                  f"{TARGET_P99_VS_NATS:g} x NATS R3 p99 (ratio {ratio:.2f})")
        elif scenario.rate_records_s == 0:
            p50 = table[f"raftlog {scenario.name}"]["p50_ms"]
            ok = None if p50 != p50 else p50 <= TARGET_ONE_AT_A_TIME_P50_MS
            targets[f"one-at-a-time p50 <= {TARGET_ONE_AT_A_TIME_P50_MS:g} ms"] = _verdict(ok)
            print(f"{_verdict(ok)}  raftlog one-at-a-time p50 <= "
                  f"{TARGET_ONE_AT_A_TIME_P50_MS:g} ms ({p50:.2f} ms)")
    return {"table": table, "ratios": ratios, "targets": targets}
