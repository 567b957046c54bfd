"""The runner's history recorder and log scan (no cluster)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from jepsen import runner
from jepsen.history import read_jsonl


def test_recorder_is_thread_safe_and_pairs_operations(tmp_path: Path) -> None:
    rec = runner.Recorder(tmp_path / "history.jsonl")

    def client() -> None:
        p = rec.new_process()
        for _ in range(50):
            v = rec.next_value()
            rec.invoke(p, "send", [["send", "k", v]])
            rec.complete("ok", p, "send", [["send", "k", [None, v]]])

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rec.invoke("nemesis", "start-kill", {"kind": "kill"})
    rec.complete("info", "nemesis", "start-kill", {"nodes": [1]})
    rec.close()
    late = rec.complete("ok", 0, "send", [])  # a straggler after close: not recorded
    assert late.index == -1
    history = read_jsonl(tmp_path / "history.jsonl")  # strict: well-formed per process
    assert len(history) == 4 * 100 + 2
    assert rec.counts == {"ok": 200, "fail": 0, "info": 0}
    values = [op.value[0][2] for op in history if op.f == "send" and op.is_invoke]
    assert sorted(values) == list(range(1, 201))


def test_log_problems(tmp_path: Path) -> None:
    (tmp_path / "n1.log").write_text("2026 INFO fine\n2026 ERROR bad thing\nTraceback (x)\n")
    (tmp_path / "n2.log").write_text("2026 WARNING meh\n")
    assert runner._log_problems(tmp_path) == {"n1.log": ["2026 ERROR bad thing",
                                                         "Traceback (x)"]}


def test_unknown_workload() -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        runner.make_workload(runner.TestOptions(workload="bank"))
