"""Real broker processes for integration tests: started on 127.0.0.1, killed at teardown."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

BROKER_SECRET = "integration-test-secret"  # raft.secret of every BrokerProcess

# Generous: it is a deadline, not a wait. Under a load of ~20 on 2 cores (a fault campaign
# beside the suite) a node took more than 20 s from exec to listening: Python's imports.
START_TIMEOUT_S = 120.0


# Ports come from below Linux's ephemeral range (32768-60999): a broker restarted on the same
# port must not find it taken by some client's outgoing connection meanwhile.
_PORT_LOW, _PORT_HIGH = 20000, 32000


def free_port() -> int:
    for _ in range(200):
        port = random.randrange(_PORT_LOW, _PORT_HIGH)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


@dataclass
class BrokerProcess:
    """One `raftlog server` process with its own data directory and log file."""

    workdir: Path
    port: int = field(default_factory=free_port)
    controller_port: int = field(default_factory=free_port)
    extra_properties: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        # Two independent draws from 12,000 ports collide about once in 12,000 brokers, a
        # few times a year of CI ("each listener needs its own port"): draw again.
        while self.controller_port == self.port:
            self.controller_port = free_port()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def log_path(self) -> Path:
        return self.workdir / "server.log"

    def write_config(self) -> Path:
        properties = {
            "node.id": "1",
            "process.roles": "broker,controller",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},"
                         f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "raft.secret": BROKER_SECRET,
            **self.extra_properties,
        }
        path = self.workdir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
        return path

    def start(self) -> None:
        assert self.process is None or self.process.poll() is not None
        config = self.write_config()
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "raftlog", "server", "--config", str(config)],
                stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir,
            )
        self._wait_listening()

    def _wait_listening(self) -> None:
        try:
            self._poll_listening()
        except BaseException:
            # A node that did not come up in time must not outlive the fixture that failed
            # (no teardown runs for it): it kept running, with its ports, to the session end.
            if self.process is not None and self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            raise

    def _poll_listening(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"broker exited early:\n{self.log_path.read_text()[-4000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"broker did not listen in time:\n{self.log_path.read_text()[-4000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self) -> None:
        self.stop()
        self.start()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path)
    process.start()
    try:
        yield process
    finally:
        process.stop()
        if os.environ.get("RAFTLOG_SHOW_BROKER_LOG"):
            print(process.log_path.read_text())


@pytest.fixture
def fast_retention_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker whose retention pass runs every 200 ms (log.retention.check.interval.ms)."""
    process = BrokerProcess(tmp_path, extra_properties={"log.retention.check.interval.ms": "200"})
    process.start()
    try:
        yield process
    finally:
        process.stop()
