"""The campaign table (pure aggregation of run rows)."""

from __future__ import annotations

from jepsen.campaign import markdown, summarize


def test_summary_counts_runs_and_anomalies_per_combination() -> None:
    rows = [
        {"workload": "queue", "nemesis": "kill", "valid": True, "bad": [], "allowed": ["G0"],
         "ok_ops": 10},
        {"workload": "queue", "nemesis": "kill", "valid": False, "bad": ["lost-write"],
         "allowed": [], "ok_ops": 5},
        {"workload": "queue", "nemesis": "kill", "valid": "unknown", "bad": [], "allowed": []},
        {"workload": "txn", "nemesis": "none", "valid": "error", "error": "boom"},
    ]
    summary = summarize(rows)
    queue = next(c for c in summary if c["workload"] == "queue")
    assert (queue["runs"], queue["valid"], queue["invalid"], queue["unknown"]) == (3, 1, 1, 1)
    assert queue["bad"] == {"lost-write": 1} and queue["allowed"] == {"G0": 1}
    assert queue["ok_ops"] == 15
    txn = next(c for c in summary if c["workload"] == "txn")
    assert txn["error"] == 1
    table = markdown(summary, "header")
    assert "| queue | kill | 3 | 1 | 1 | 1 | 0 | 15 | lost-write (1) | G0 (1) |" in table
    assert "| txn | none | 1 | 0 | 0 | 0 | 1 | 0 | none | none |" in table
