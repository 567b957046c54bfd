"""Shared plumbing for the benchmarks: child processes, ports, CPU accounting, statistics.

Nothing here knows about Kafka or NATS. A `ServerProcess` is any listening child process
(a raftlog node, a nats-server) that we start, wait for, and always stop by its own PID.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _nats_server import nats_server_path, nats_server_version

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
MB = 1_000_000  # MB/s figures use decimal megabytes of payload, as peer-baselines.md does


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServerProcess:
    """A child server process listening on 127.0.0.1:`port`, with its output in `log_path`."""

    def __init__(self, name: str, argv: Sequence[str], port: int, log_path: Path,
                 cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.port = port
        self.log_path = log_path
        self.cwd = cwd
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} is not started"
        return self.process.pid

    def start(self, timeout_s: float = 30.0) -> float:
        """Start the process and wait until its port accepts connections; returns seconds."""
        started = time.monotonic()
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                            cwd=self.cwd, env=self.env)
        while time.monotonic() - started < timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited early (code {self.process.returncode}):"
                                   f"\n{self.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return time.monotonic() - started
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"{self.name} did not listen within {timeout_s} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout_s`; always reaps the child. Idempotent."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of `pid` so far, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        raw = stat.read()
    # The command name (field 2) may contain spaces; the fields after the last ')' are fixed.
    fields = raw[raw.rindex(b")") + 2:].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / CLOCK_TICKS_PER_S


def box_cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs, from the first line of /proc/stat."""
    with open("/proc/stat", "rb") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user/nice
    return total - idle, total


@dataclass
class CpuUsage:
    """CPU use during one phase, in % of one core (200% is this whole 2-core box)."""

    broker_pct: float
    client_pct: float
    box_busy_pct: float  # all processes on the machine, other engineers' jobs included


@dataclass
class CpuMeter:
    """Filled in when the `measure_cpu` block exits."""

    usage: CpuUsage | None = None
    wall_s: float = 0.0


@contextmanager
def measure_cpu(broker_pid: int) -> Iterator[CpuMeter]:
    """CPU of the broker process, of this (client) process and of the whole box during a block.

    The client is this Python process, including librdkafka's or asyncio's threads.
    """
    meter = CpuMeter()
    ncpu = os.cpu_count() or 1
    broker0 = process_cpu_seconds(broker_pid)
    client0 = time.process_time()
    busy0, total0 = box_cpu_ticks()
    wall0 = time.perf_counter()
    try:
        yield meter
    finally:
        wall = max(time.perf_counter() - wall0, 1e-9)
        busy1, total1 = box_cpu_ticks()
        try:
            broker_s = process_cpu_seconds(broker_pid) - broker0
        except OSError:
            broker_s = float("nan")
        client_s = time.process_time() - client0
        box = 100.0 * ncpu * (busy1 - busy0) / max(total1 - total0, 1)
        meter.wall_s = wall
        meter.usage = CpuUsage(broker_pct=100.0 * broker_s / wall,
                               client_pct=100.0 * client_s / wall, box_busy_pct=box)


@dataclass
class PhaseResult:
    """One timed phase (produce or consume) of one system in one repeat."""

    system: str
    phase: str
    repeat: int
    records: int
    payload_bytes: int
    seconds: float
    cpu: CpuUsage
    ok: bool = True
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def msgs_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / MB / self.seconds if self.seconds > 0 else 0.0

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["msgs_per_s"] = self.msgs_per_s
        out["mb_per_s"] = self.mb_per_s
        return out


@dataclass
class Spread:
    """Median and range of one metric over the repeats."""

    median: float
    low: float
    high: float
    values: list[float]

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        finite = [v for v in values if v == v]  # drop NaN
        if not finite:
            return cls(float("nan"), float("nan"), float("nan"), list(values))
        return cls(statistics.median(finite), min(finite), max(finite), list(values))


def _first_if_tuple(value: object) -> object:
    return value[0] if isinstance(value, tuple) else value


def environment() -> dict[str, Any]:
    """What a benchmark result depends on: interpreter, box, load, client and peer versions."""
    import confluent_kafka

    try:
        from importlib.metadata import version
        nats_py = version("nats-py")
    except Exception:
        nats_py = "?"
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": os.getloadavg(),
        # version() is a str in confluent-kafka 2.x (it was a tuple): [0] was its first letter.
        "confluent_kafka": _first_if_tuple(confluent_kafka.version()),
        "librdkafka": confluent_kafka.libversion()[0],
        "nats_py": nats_py,
        "nats_server": nats_server_version(),
    }


def json_safe(value: Any) -> Any:
    """NaN (a failed phase) becomes null so the file is strict JSON."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def check_prerequisites() -> str | None:
    """Why the peer comparison cannot run (a missing client or nats-server), or None."""
    try:
        import confluent_kafka  # noqa: F401
        import nats  # noqa: F401
    except ImportError as exc:
        return f"{exc}: pip install -e '.[bench]' (confluent-kafka and nats-py)"
    if nats_server_path() is None:
        return "nats-server is missing: apt-get install -y nats-server (Debian ships 2.9.10)"
    return None


def run_header(title: str, options: Any, env: dict[str, Any], detail: str = "") -> str:
    """The first line of a run: what is compared, the sizes, the box and the versions."""
    return (f"{title}: {options.records:,} x {options.record_bytes} B, {options.repeats} "
            f"repeats{detail}; {env['cpus']} CPUs, load avg {env['loadavg_at_start'][0]:.2f}; "
            f"confluent-kafka {env['confluent_kafka']} (librdkafka {env['librdkafka']}), "
            f"nats-py {env['nats_py']}, {env['nats_server']}")


def write_json(path: Path | None, document: dict[str, Any]) -> None:
    """Every raw number of a run as strict JSON (NaN -> null), if --json was given."""
    if path is None:
        return
    path.write_text(json.dumps(json_safe(document), indent=2) + "\n")
    print(f"raw numbers written to {path}")
