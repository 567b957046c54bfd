"""The campaign driver: table aggregation, resume, settings check, deadline, store pruning.

``run_test`` is replaced by a fake that returns canned results instantly: these are unit
tests of the campaign bookkeeping, the real runs are covered by the smoke and unsafe tests.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import jepsen.campaign as campaign
from jepsen.campaign import markdown, parse_until, pending, plan_triples, summarize
from jepsen.cli import _options, parser

if TYPE_CHECKING:  # not at run time: pytest would try to collect a class named Test*
    from jepsen.runner import TestOptions

Verdict = Callable[["TestOptions"], Any]


class FakeRuns:
    """Stands in for ``run_test``: records what was run, advances a fake clock by
    ``run_s``, writes a small store dir, and returns the verdict ``verdict(opts)`` (an
    exception instance is raised, as a harness failure)."""

    def __init__(self, verdict: Verdict | None = None, run_s: float = 10.0) -> None:
        self.verdict = verdict or (lambda opts: True)
        self.run_s = run_s
        self.t = 1_800_000_000.0
        self.ran: list[tuple[str, str, int]] = []

    def now(self) -> float:
        return self.t

    def __call__(self, opts: TestOptions) -> dict[str, Any]:
        self.ran.append((opts.workload, opts.nemesis, opts.seed))
        self.t += self.run_s
        assert opts.name is not None
        directory = opts.store / opts.name
        directory.mkdir(parents=True)
        (directory / "history.jsonl").write_text('{"type": "invoke"}\n' * 50)
        (directory / "n1.log").write_text("log\n")
        (directory / "cluster").mkdir()
        (directory / "cluster" / "segment").write_bytes(b"x" * 100)
        verdict = self.verdict(opts)
        if isinstance(verdict, Exception):
            raise verdict
        bad = ["lost-write"] if verdict is False else []
        results = {"valid": verdict, "bad_anomaly_types": bad,
                   "anomaly_counts": {"lost-write": 1} if bad else {},
                   "stats": {"by_f": {"send": {"ok": 3}, "poll": {"ok": 2}}},
                   "test": {"store_dir": str(directory), "net": {"mode": "namespaces"}}}
        (directory / "results.json").write_text(json.dumps(results))
        return results


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRuns]:
    runs = FakeRuns()
    monkeypatch.setattr(campaign, "run_test", runs)
    yield runs


def _campaign(fake: FakeRuns, tmp_path: Path, *extra: str) -> int:
    args = parser().parse_args(["campaign", "--out", str(tmp_path / "camp"),
                                "--store", str(tmp_path / "store"), "--time-limit", "5",
                                *extra])
    return campaign.run_campaign(args, _options, now=fake.now)


def _recorded(tmp_path: Path) -> dict[str, Any]:
    state: dict[str, Any] = json.loads((tmp_path / "camp" / "campaign.json").read_text())
    return state


def test_plan_is_round_robin_and_pending_skips_done_but_not_error_rows() -> None:
    plan = plan_triples(["queue", "txn"], ["none", "kill"], 3, 2)
    assert plan[:4] == [("queue", "none", 3), ("queue", "kill", 3), ("txn", "none", 3),
                        ("txn", "kill", 3)]
    assert plan[4] == ("queue", "none", 4) and len(plan) == 8
    rows = [{"workload": "queue", "nemesis": "none", "seed": 3, "valid": True},
            {"workload": "queue", "nemesis": "kill", "seed": 3, "valid": "unknown"},
            {"workload": "txn", "nemesis": "none", "seed": 3, "valid": "error"}]
    assert pending(plan, rows) == plan[2:]
    assert pending(plan, rows, retry_errors=False) == plan[3:]


def test_resume_runs_only_missing_triples_and_retries_harness_errors(
        fake: FakeRuns, tmp_path: Path) -> None:
    def verdict(o: TestOptions) -> Any:
        if (o.nemesis, o.seed) == ("kill", 1):
            return RuntimeError("boom")
        return "unknown" if (o.nemesis, o.seed) == ("none", 2) else True

    fake.verdict = verdict
    common = ("--workloads", "queue", "--nemeses", "none,kill")
    assert _campaign(fake, tmp_path, "--runs", "2", *common) == 0
    assert fake.ran == [("queue", "none", 1), ("queue", "kill", 1), ("queue", "none", 2),
                        ("queue", "kill", 2)]
    first = _recorded(tmp_path)
    assert [r["valid"] for r in first["runs"]] == [True, "error", "unknown", True]
    assert "RuntimeError: boom" in first["runs"][1]["error"]

    # Same command again: only the error row is retried (and now succeeds).
    fake.ran.clear()
    fake.verdict = lambda o: True
    assert _campaign(fake, tmp_path, "--runs", "2", *common) == 0
    assert fake.ran == [("queue", "kill", 1)]
    again = _recorded(tmp_path)
    assert len(again["runs"]) == 4
    retried = next(r for r in again["runs"] if (r["nemesis"], r["seed"]) == ("kill", 1))
    assert retried["valid"] is True and retried["attempts"] == 2
    # ... and the unknown row was kept, not rerun.
    assert any(r["valid"] == "unknown" for r in again["runs"])

    # Nothing left: nothing runs.
    fake.ran.clear()
    assert _campaign(fake, tmp_path, "--runs", "2", *common) == 0
    assert fake.ran == []

    # More runs: exactly the new seeds, round-robin.
    assert _campaign(fake, tmp_path, "--runs", "3", *common) == 0
    assert fake.ran == [("queue", "none", 3), ("queue", "kill", 3)]
    summary = {c["nemesis"]: c for c in _recorded(tmp_path)["summary"]}
    assert (summary["none"]["done"], summary["none"]["target"]) == (3, 3)
    assert (summary["none"]["valid"], summary["none"]["unknown"]) == (2, 1)
    table = (tmp_path / "camp" / "campaign.md").read_text()
    assert "| queue | kill | 3 / 3 | 3 | 0 | 0 | 0 |" in table


def test_workers_run_every_triple_once_and_record_each(
        fake: FakeRuns, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--workers 2: runs overlap on two threads; each planned triple runs exactly once, its
    row (with its own verdict and error) is recorded, and a resume finds nothing left."""
    monkeypatch.setattr(campaign.os, "geteuid", lambda: 0)
    overlap: list[int] = []
    active = [0]
    lock = threading.Lock()

    def verdict(o: TestOptions) -> Any:
        with lock:
            active[0] += 1
            overlap.append(active[0])
        time.sleep(0.05)  # long enough for the other worker to start its run
        with lock:
            active[0] -= 1
        return RuntimeError("boom") if (o.nemesis, o.seed) == ("kill", 2) else True

    fake.verdict = verdict
    common = ("--runs", "3", "--workloads", "queue,txn", "--nemeses", "none,kill")
    assert _campaign(fake, tmp_path, "--workers", "2", *common) == 0
    assert sorted(fake.ran) == sorted(campaign.plan_triples(["queue", "txn"], ["none", "kill"],
                                                            1, 3))
    assert len(fake.ran) == len(set(fake.ran)) == 12
    assert max(overlap) == 2
    rows = _recorded(tmp_path)["runs"]
    assert len(rows) == 12
    errors = {(r["workload"], r["nemesis"], r["seed"]) for r in rows if r["valid"] == "error"}
    assert errors == {("queue", "kill", 2), ("txn", "kill", 2)}
    fake.ran.clear()
    fake.verdict = lambda o: True
    assert _campaign(fake, tmp_path, "--workers", "2", *common) == 0
    assert sorted(fake.ran) == sorted(errors)  # only the error rows are retried
    table = (tmp_path / "camp" / "campaign.md").read_text()
    assert "runs at a time: 2 (12)" in table


def test_workers_need_namespaces_and_loopback_rows_do_not_count(
        fake: FakeRuns, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loopback runs share 127.0.0.1 and pick ports unguarded: --workers 2 is refused with
    --no-netns or without root, and a run that fell back to loopback is an error row."""
    common = ("--runs", "1", "--workloads", "queue", "--nemeses", "none,kill")
    monkeypatch.setattr(campaign.os, "geteuid", lambda: 0)
    assert _campaign(fake, tmp_path, "--workers", "2", "--no-netns", *common) == 2
    monkeypatch.setattr(campaign.os, "geteuid", lambda: 1000)
    assert _campaign(fake, tmp_path, "--workers", "2", *common) == 2
    assert fake.ran == []
    monkeypatch.setattr(campaign.os, "geteuid", lambda: 0)
    real = fake.__call__

    def loopback(opts: TestOptions) -> dict[str, Any]:
        results = real(opts)
        if opts.nemesis == "kill":
            results["test"]["net"]["mode"] = "loopback"
        return results

    monkeypatch.setattr(campaign, "run_test", loopback)
    assert _campaign(fake, tmp_path, "--workers", "2", *common) == 0
    rows = {r["nemesis"]: r for r in _recorded(tmp_path)["runs"]}
    assert rows["none"]["valid"] is True and rows["none"]["workers"] == 2
    assert rows["kill"]["valid"] == "error" and "loopback" in rows["kill"]["error"]


def test_no_retry_errors_keeps_error_rows(fake: FakeRuns, tmp_path: Path) -> None:
    fake.verdict = lambda o: RuntimeError("boom")
    common = ("--runs", "1", "--workloads", "queue", "--nemeses", "none")
    _campaign(fake, tmp_path, *common)
    fake.ran.clear()
    assert _campaign(fake, tmp_path, *common, "--no-retry-errors") == 0
    assert fake.ran == []


def test_resume_with_other_settings_is_refused(
        fake: FakeRuns, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ("--runs", "1", "--workloads", "queue", "--nemeses", "none")
    assert _campaign(fake, tmp_path, *common) == 0
    before = (tmp_path / "camp" / "campaign.json").read_text()
    fake.ran.clear()
    assert _campaign(fake, tmp_path, *common, "--runs", "2", "--rate", "50") == 2
    assert fake.ran == []
    assert "rate: 20.0 -> 50.0" in capsys.readouterr().err
    assert (tmp_path / "camp" / "campaign.json").read_text() == before


def test_campaign_json_without_settings_is_refused(fake: FakeRuns, tmp_path: Path) -> None:
    (tmp_path / "camp").mkdir()
    (tmp_path / "camp" / "campaign.json").write_text('{"summary": [], "runs": []}')
    assert _campaign(fake, tmp_path, "--runs", "1") == 2
    assert fake.ran == []


def test_bad_workload_is_refused_before_any_run(fake: FakeRuns, tmp_path: Path) -> None:
    assert _campaign(fake, tmp_path, "--workloads", "queue,nope") == 2
    assert _campaign(fake, tmp_path, "--nemeses", "kill,frobnicate") == 2
    assert fake.ran == []


def test_deadline_stops_starting_runs_that_would_not_end_in_time(
        fake: FakeRuns, tmp_path: Path) -> None:
    # Runs take 10 s (fake clock). With 25 s: the first is judged by --time-limit (5 s), the
    # second by the mean so far (10 s): 10 + 10 <= 25 starts, 20 + 10 > 25 does not.
    common = ("--runs", "5", "--workloads", "queue", "--nemeses", "none")
    assert _campaign(fake, tmp_path, *common, "--deadline-s", "25") == 0
    assert len(fake.ran) == 2
    state = _recorded(tmp_path)
    assert len(state["runs"]) == 2
    assert state["summary"][0]["target"] == 5
    assert "| queue | none | 2 / 5 |" in (tmp_path / "camp" / "campaign.md").read_text()


def test_until_in_the_past_starts_nothing_but_writes_the_table(
        fake: FakeRuns, tmp_path: Path) -> None:
    past = datetime.fromtimestamp(fake.now() - 120, UTC).strftime("%H:%M")
    assert _campaign(fake, tmp_path, "--runs", "1", "--until", past) == 0
    assert fake.ran == []
    assert "0 / 1" in (tmp_path / "camp" / "campaign.md").read_text()


def test_parse_until() -> None:
    now_s = datetime(2026, 11, 21, 12, 30, tzinfo=UTC).timestamp()
    assert parse_until("13:10", now_s) == datetime(2026, 11, 21, 13, 10,
                                                   tzinfo=UTC).timestamp()
    assert parse_until("2026-11-22T01:00", now_s) == datetime(2026, 11, 22, 1,
                                                              tzinfo=UTC).timestamp()
    with pytest.raises(campaign.CampaignError):
        parse_until("soon", now_s)


def test_valid_runs_are_pruned_and_others_kept(fake: FakeRuns, tmp_path: Path) -> None:
    fake.verdict = lambda o: o.nemesis != "kill"
    assert _campaign(fake, tmp_path, "--runs", "1", "--workloads", "queue",
                     "--nemeses", "none,kill") == 1  # an invalid run: exit 1
    rows = {r["nemesis"]: r for r in _recorded(tmp_path)["runs"]}
    valid, invalid = Path(rows["none"]["store_dir"]), Path(rows["kill"]["store_dir"])
    assert rows["none"]["store_pruned"] and not rows["kill"]["store_pruned"]
    assert sorted(p.name for p in valid.iterdir()) == ["history.jsonl.gz", "results.json"]
    assert {"history.jsonl", "n1.log", "cluster"} <= {p.name for p in invalid.iterdir()}
    assert invalid.name.startswith("queue-kill-s1-")


def test_keep_store_all_prunes_nothing(fake: FakeRuns, tmp_path: Path) -> None:
    _campaign(fake, tmp_path, "--runs", "1", "--workloads", "queue", "--nemeses", "none",
              "--keep-store", "all")
    row = _recorded(tmp_path)["runs"][0]
    assert not row["store_pruned"]
    assert (Path(row["store_dir"]) / "n1.log").exists()


def test_summary_counts_runs_and_anomalies_per_combination() -> None:
    rows = [
        {"workload": "queue", "nemesis": "kill", "valid": True, "bad": [], "allowed": ["G0"],
         "ok_ops": 10, "elapsed_s": 20.0},
        {"workload": "queue", "nemesis": "kill", "valid": False, "bad": ["lost-write"],
         "allowed": [], "ok_ops": 5, "elapsed_s": 30.0},
        {"workload": "queue", "nemesis": "kill", "valid": "unknown", "bad": [], "allowed": [],
         "elapsed_s": 25.0},
        {"workload": "txn", "nemesis": "none", "valid": "error", "error": "boom",
         "elapsed_s": 3.0},
    ]
    planned = {"queue kill": [1, 2, 3, 4], "txn none": [1, 2, 3, 4],
               "metadata none": [1, 2, 3, 4]}
    summary = summarize(rows, planned)
    queue = next(c for c in summary if c["workload"] == "queue")
    assert (queue["runs"], queue["valid"], queue["invalid"], queue["unknown"]) == (3, 1, 1, 1)
    assert (queue["done"], queue["target"]) == (3, 4)
    assert queue["bad"] == {"lost-write": 1} and queue["allowed"] == {"G0": 1}
    assert queue["ok_ops"] == 15 and queue["wall_s"] == 75.0 and queue["mean_s"] == 25.0
    txn = next(c for c in summary if c["workload"] == "txn")
    assert (txn["error"], txn["done"]) == (1, 0)
    table = markdown(summary, "header")
    assert ("| queue | kill | 3 / 4 | 1 | 1 | 1 | 0 | lost-write (1) | G0 (1) | 15 | 75 | 25.0 |"
            in table)
    assert "| txn | none | 0 / 4 | 0 | 0 | 0 | 1 | none | none | 0 | 3 | 3.0 |" in table
    # A planned combination without any run yet still has its line.
    assert "| metadata | none | 0 / 4 | 0 | 0 | 0 | 0 | none | none | 0 | 0 | - |" in table


def test_header_has_settings_and_date_range(fake: FakeRuns, tmp_path: Path) -> None:
    _campaign(fake, tmp_path, "--runs", "2", "--workloads", "queue", "--nemeses", "none")
    header = (tmp_path / "camp" / "campaign.md").read_text().splitlines()[0]
    first = datetime.fromtimestamp(1_800_000_000, UTC).strftime("%Y-%m-%d %H:%M")
    assert header.startswith("Campaign camp: 2 of 2 runs done, 3 nodes, 5 s each, rate 20/s")
    assert f"runs from {first} to " in header and "mean 10.0 s a run" in header
    # Every row names the raftlog commit it is evidence for; the header sums them up.
    runs = json.loads((tmp_path / "camp" / "campaign.json").read_text())["runs"]
    codes = {r["code"] for r in runs}
    assert len(codes) == 1 and codes != {""}
    assert f"code under test: {codes.pop()} (2)" in header


def test_a_relative_store_becomes_an_absolute_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nodes start in their own working directories and read their config from the run
    directory: a relative --store (the default, "store") made every node exit at start-up."""
    from jepsen import runner

    monkeypatch.chdir(tmp_path)
    path = runner.store_directory(runner.TestOptions(store=Path("store"), name="queue-relative"))
    assert path.is_absolute()
    assert path == tmp_path / "store" / "queue-relative"
