"""The checker must be able to fail: the harness-only unsafe cluster (acks=1 producers,
unclean leader election, no fsync before acknowledging) loses acknowledged writes under
kill and partition faults, and the harness must catch it within a few seeded runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jepsen import runner

pytest.importorskip("confluent_kafka")
RUNS_MAX = 4
LOSS_ANOMALIES = {"lost-write", "inconsistent-offsets", "unseen"}


def test_unsafe_mode_loses_writes_and_the_harness_sees_it(tmp_path: Path) -> None:
    seen: list[object] = []
    for seed in range(1, RUNS_MAX + 1):
        results = runner.run_test(runner.TestOptions(
            workload="queue", nemesis="kill,partition", sub_via="assign", unsafe=True,
            time_limit_s=15, interval_s=3, rate=50, concurrency=4, seed=seed,
            store=tmp_path, progress=False))
        seen.append({k: results.get(k) for k in ("valid", "anomaly_counts")})
        if results["valid"] is False and LOSS_ANOMALIES & set(results["bad_anomaly_types"]):
            # The examples name the lost message and the operations around it.
            name = next(n for n in ("lost-write", "inconsistent-offsets", "unseen")
                        if n in results["anomalies"])
            example = results["anomalies"][name][0]
            assert "key" in example
            assert results["test"]["unsafe"] is True
            return
    pytest.fail(f"unsafe mode lost no writes in {RUNS_MAX} runs: {json.dumps(seen)}")
