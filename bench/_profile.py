"""Sampling the raftlog broker with py-spy during one extra (untimed) produce phase.

py-spy attaches to the running server by PID, so the server code needs no change. It records
"raw" collapsed stacks (`frame;frame;... count`, line numbers off); this module summarises them
as self time (leaf frame) and inclusive time (frame anywhere on the stack) per function and
self time per file. Idle samples (threads blocked in epoll/fsync) are not recorded by py-spy
unless --idle is given, so percentages are of the samples where a thread was on the CPU.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PY_SPY_RATE_HZ = 250
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*)\)$")


def py_spy_binary() -> str | None:
    local = Path(sys.executable).with_name("py-spy")
    if local.exists():
        return str(local)
    return shutil.which("py-spy")


class PySpy:
    """`py-spy record` attached to `pid`; stop() makes it write its output and exit."""

    def __init__(self, pid: int, output: Path, log_path: Path) -> None:
        self.started = time.monotonic()
        self.seconds = 0.0
        binary = py_spy_binary()
        if binary is None:
            raise RuntimeError("py-spy not found: pip install py-spy")
        self.output = output
        self.log_path = log_path
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [binary, "record", "--pid", str(pid), "--rate", str(PY_SPY_RATE_HZ),
                 "--format", "raw", "--nolineno", "--output", str(output)],
                stdout=log, stderr=subprocess.STDOUT,
            )
        time.sleep(1.0)  # let it attach before the measured work starts
        if self.process.poll() is not None:
            raise RuntimeError(f"py-spy exited: {log_path.read_text(errors='replace')[-2000:]}")

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.process.poll() is None:
            self.seconds = time.monotonic() - self.started
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _short(frame: str) -> str:
    """'func (/abs/path/raftlog/x.py)' -> 'raftlog/x.py:func'; site-packages trimmed."""
    match = _FRAME.match(frame)
    if match is None:
        return frame
    path = match["file"]
    for marker in ("/site-packages/", "/lib/python3.11/", "/work/main/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{match['func']}"


@dataclass
class ProfileSummary:
    samples: int
    seconds: float  # how long py-spy was recording
    rate_hz: int
    samples_by_thread: list[tuple[str, int]] = field(default_factory=list)
    self_by_function: list[tuple[str, int]] = field(default_factory=list)
    inclusive_raftlog: list[tuple[str, int]] = field(default_factory=list)
    self_by_file: list[tuple[str, int]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"samples": self.samples, "seconds": self.seconds, "rate_hz": self.rate_hz,
                "samples_by_thread": self.samples_by_thread,
                "self_by_function": self.self_by_function,
                "inclusive_raftlog_by_function": self.inclusive_raftlog,
                "self_by_file": self.self_by_file}


def summarise(raw: Path, seconds: float, top: int = 30) -> ProfileSummary:
    """Self time per function and file, and inclusive time of raftlog's own functions."""
    by_thread: Counter[str] = Counter()
    self_fn: Counter[str] = Counter()
    incl_fn: Counter[str] = Counter()
    self_file: Counter[str] = Counter()
    samples = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_short(f) for f in stack.split(";") if f]
        if not frames:
            continue
        samples += count
        worker = frames[0].endswith("Thread._bootstrap")
        by_thread["worker threads (trio.to_thread)" if worker else "main trio thread"] += count
        leaf = frames[-1]
        self_fn[leaf] += count
        self_file[leaf.rsplit(":", 1)[0]] += count
        for name in set(frames):
            if name.startswith("raftlog/") and not name.startswith(
                    ("raftlog/__main__.py", "raftlog/cli.py")):
                incl_fn[name] += count
    return ProfileSummary(samples, seconds, PY_SPY_RATE_HZ, by_thread.most_common(),
                          self_fn.most_common(top), incl_fn.most_common(top),
                          self_file.most_common(top))


def render(summary: ProfileSummary, top: int = 15) -> str:
    total = max(summary.samples, 1)
    lines = [f"py-spy: {summary.samples} on-CPU samples at {summary.rate_hz} Hz over "
             f"{summary.seconds:.2f} s of recording; % below are of all on-CPU samples"]
    for title, rows in (("samples by thread", summary.samples_by_thread),
                        ("self time by function", summary.self_by_function),
                        ("inclusive time of raftlog functions", summary.inclusive_raftlog),
                        ("self time by file", summary.self_by_file)):
        lines.append(f"  {title}:")
        lines.extend(f"    {100.0 * n / total:5.1f}%  {name}" for name, n in rows[:top])
    return "\n".join(lines)
