"""Run plots from campaign worker threads: every render must succeed (matplotlib's mathtext
parser, used for the log axis's tick labels, is shared and not thread-safe)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from jepsen.history import History, HistoryBuilder
from jepsen.plots import write_plots

pytest.importorskip("matplotlib")

THREADS = 6
RENDERS_PER_THREAD = 3


def _history() -> History:
    b = HistoryBuilder()
    t = 0
    for i in range(60):  # latencies over four decades, so the log axis labels 10^-1 .. 10^3
        latency_ns = int(10 ** (5 + (i % 5))) // 10
        b.invoke(i, "send", [["send", "k", i]], time=t)  # a process per op: some end in info
        b.add("ok" if i % 7 else "info", i, "send", [["send", "k", [i, i]]],
              time=t + latency_ns)
        t += 50_000_000
    b.invoke("nemesis", "start-kill", None, time=1_000_000_000)
    b.info("nemesis", "start-kill", None, time=1_000_000_000)
    b.invoke("nemesis", "stop-kill", None, time=2_000_000_000)
    b.info("nemesis", "stop-kill", None, time=2_000_000_000)
    return History(b.ops)


def test_concurrent_renders_all_succeed(tmp_path: Path) -> None:
    history = _history()
    errors: list[BaseException] = []

    def render(worker: int) -> None:
        for n in range(RENDERS_PER_THREAD):
            directory = tmp_path / f"w{worker}-{n}"
            directory.mkdir()
            try:
                assert write_plots(history, directory) == ["latency-raw.png", "rate.png"]
                assert (directory / "latency-raw.png").stat().st_size > 0
                assert (directory / "rate.png").stat().st_size > 0
            except BaseException as exc:  # collected: a thread's exception is otherwise lost
                errors.append(exc)

    threads = [threading.Thread(target=render, args=(w,)) for w in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
