"""Smoke runs of the harness against a real 3-node cluster: they must be valid.

* queue (assign and subscribe consumers) under kill and partition faults, through the CLI
  (``python -m jepsen test``; exit status 0 only when valid);
* txn under kill faults.

Where network namespaces cannot be made (not root) the harness falls back to loopback and
drops the partition faults; the results say so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jepsen import runner

pytest.importorskip("confluent_kafka")
ROOT = Path(__file__).resolve().parents[2]


def _check_run_directory(results: dict[str, Any]) -> Path:
    directory = Path(results["test"]["store_dir"])
    for name in ("history.jsonl", "results.json", "index.html", "n1.log", "n2.log", "n3.log"):
        assert (directory / name).is_file(), name
    assert results["plots"] == ["latency-raw.png", "rate.png", "metrics.png"]
    assert "latency-raw.png" in (directory / "index.html").read_text()
    assert "metrics.png" in (directory / "index.html").read_text()
    # The nodes' metrics were scraped through the run (a killed node's scrapes are missing).
    scraped = results["stats"]["metrics"]
    assert scraped["scrapes"] > scraped["missed"], scraped
    assert scraped["under_replicated_max"] is not None, scraped
    assert scraped["produce_p99_ms_max"] is not None, scraped
    history = (directory / "history.jsonl").read_text().splitlines()
    assert any('"process": "nemesis"' in line for line in history)
    return directory


def _explain(results: dict[str, Any]) -> str:
    return json.dumps({k: results.get(k) for k in ("valid", "anomaly_counts", "bad_anomaly_types",
                                                   "unknown_reasons", "anomalies", "test")},
                      indent=1)[:6000]


def test_queue_under_kill_and_partition_is_valid(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "jepsen", "test", "--workload", "queue",
         "--nemesis", "kill,partition", "--time-limit", "15", "--interval", "3",
         "--rate", "40", "--concurrency", "4", "--seed", "11", "--store", str(tmp_path),
         "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=240, env={**os.environ},
    )  # fmt: skip
    results = json.loads((tmp_path / "latest" / "results.json").read_text())
    assert proc.returncode == 0, _explain(results) + proc.stderr[-3000:]
    assert results["valid"] is True
    _check_run_directory(results)
    stats = results["stats"]
    assert stats["queue"]["acknowledged"] > 20
    assert stats["by_f"]["subscribe"]["ok"] >= 1 and stats["by_f"]["assign"]["ok"] >= 1
    kinds = {f["kind"] for f in stats["run"]["faults"]}
    assert "kill" in kinds or "partition" in kinds
    if results["test"]["net"]["mode"] == "namespaces":
        assert results["test"]["nemesis_kinds"] == ["kill", "partition"]
    else:
        assert results["test"]["nemesis_kinds"] == ["kill"]


def test_txn_under_kill_is_valid(tmp_path: Path) -> None:
    results = runner.run_test(runner.TestOptions(
        workload="txn", nemesis="kill", time_limit_s=15, interval_s=3, rate=40,
        concurrency=4, seed=12, store=tmp_path, progress=False))
    assert results["valid"] is True, _explain(results)
    _check_run_directory(results)
    assert results["stats"]["by_f"]["txn"]["ok"] > 10
    assert [f["kind"] for f in results["stats"]["run"]["faults"]][:1] == ["kill"]
