"""A real 3-node cluster for integration tests: one ``raftlog server`` process per node.

The node configs come from ``raftlog.tools.cluster.prepare`` (exactly what ``raftlog cluster up``
generates: combined nodes, free ports, a shared Raft secret, 1.5 s broker sessions), but the
processes are started here, one by one, so a test can SIGKILL, SIGSTOP or restart any of them.
Every wait has a deadline.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio

from raftlog.client.connection import PLAINTEXT, KafkaClientError, KafkaConnection, Security
from raftlog.controller.rpcs import describe_quorum_request
from raftlog.protocol.schemas import DESCRIBE_QUORUM, METADATA
from raftlog.tools.cluster import ClusterLayout, node_directory, prepare, probe
from raftlog.tools.command_config import load_security
from raftlog.tools.secure_cluster import CLIENT_PROPERTIES, secure_directory
from tests.integration.helpers import broker_log_problems

# Deadlines, not waits: generous, so that a busy machine slows the suite down instead of
# failing it (a load of ~20 on 2 cores made single nodes take over 20 s to listen).
START_TIMEOUT_S = 120.0
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
REQUEST_TIMEOUT_S = 3.0
T = TypeVar("T")


@dataclass
class ClusterNode:
    """One node's process, with its ports and log file."""

    node_id: int
    directory: Path
    kafka_port: int
    controller_port: int
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False

    @staticmethod
    def free_port() -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
            return port

    @property
    def address(self) -> tuple[str, int]:
        return "127.0.0.1", self.kafka_port

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    def start(self) -> None:
        assert not self.alive()
        self.paused = False
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "raftlog", "server", "--config",
                 str(self.directory / "server.properties")],
                stdout=out, stderr=subprocess.STDOUT, cwd=self.directory,
            )

    def wait_listening(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"node {self.node_id} exited early:\n{self.tail()}")
            try:
                with socket.create_connection(self.address, timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"node {self.node_id} did not listen in time:\n{self.tail()}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """Signal the process and wait for it; SIGKILL after ``timeout_s``."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        if self.paused:
            self.resume()
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"node {self.node_id} ignored {sig} for {timeout_s} s") from None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)
        self.paused = False

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() \
            else ""


@dataclass
class Cluster:
    """Three (or more) combined nodes generated like ``raftlog cluster up`` does."""

    directory: Path
    layout: ClusterLayout
    nodes: dict[int, ClusterNode] = field(default_factory=dict)
    # ``secure``: how the harness's own connections are made (cluster up --secure's client
    # config); plain TCP otherwise.
    security: Security = PLAINTEXT

    @classmethod
    def create(cls, directory: Path, size: int = 3,
               extra_properties: dict[str, str] | None = None, *,
               secure: bool = False) -> Cluster:
        layout = prepare(directory, size, 0, secure)
        cluster = cls(directory, layout)
        if secure:
            cluster.security = load_security(str(cluster.client_config))
        for node_id in layout.node_ids:
            node_dir = node_directory(directory, node_id)
            if extra_properties:
                with (node_dir / "server.properties").open("a") as out:
                    out.writelines(f"{k}={v}\n" for k, v in extra_properties.items())
            cluster.nodes[node_id] = ClusterNode(
                node_id, node_dir, layout.kafka_ports[node_id - 1],
                layout.controller_ports[node_id - 1],
            )
        return cluster

    @property
    def bootstrap(self) -> str:
        return self.layout.bootstrap

    @property
    def client_config(self) -> Path:
        """The librdkafka client properties ``cluster up --secure`` wrote."""
        return secure_directory(self.directory) / CLIENT_PROPERTIES

    def live_bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes.values() if n.alive() and not n.paused)

    def start_all(self) -> None:
        for node in self.nodes.values():
            if not node.alive():
                node.start()
        for node in self.nodes.values():
            node.wait_listening()

    def stop_all(self) -> None:
        """SIGTERM every node, the controller last (as ``cluster up`` does)."""
        controller = self.quorum_leader(timeout_s=2.0)
        # Broker-only nodes first: once voters stop, the quorum may lose its majority.
        for node in sorted(self.nodes.values(), key=lambda n: (n.controller_port != 0,
                                                               n.node_id == controller,
                                                               n.node_id)):
            node.stop()

    def kill_all(self) -> None:
        for node in self.nodes.values():
            if node.alive():
                node.process.kill()  # type: ignore[union-attr]
                node.process.wait()  # type: ignore[union-attr]

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until a topic replicated on every live node can be created and produced to."""
        live = [n for n in self.nodes.values() if n.alive() and not n.paused]

        def ready() -> bool:
            try:
                run(probe(",".join(n.bootstrap for n in live), len(live), self.security),
                    timeout_s=15)
            except Exception:
                return False
            return True

        wait_until(ready, timeout_s, "the cluster to serve produce requests", interval_s=0.25)

    # -- observations through the project's client ---------------------------------------------

    def metadata(self, topic: str | None = None, node: ClusterNode | None = None) -> Any:
        """Metadata from ``node`` (default: the first live node that answers)."""
        candidates = [node] if node is not None else [
            n for n in self.nodes.values() if n.alive() and not n.paused]
        last: Exception | None = None
        for candidate in candidates:
            try:
                return run(_metadata(candidate.address, topic, self.security))
            except (KafkaClientError, trio.TooSlowError) as exc:
                last = exc
        raise AssertionError(f"no node answered Metadata: {last}")

    def partition(self, topic: str, index: int = 0) -> Any:
        described = self.metadata(topic).topics[0]
        assert described.error_code in (0, 5), described
        return next(p for p in described.partitions if p.partition_index == index)

    def quorum_leader(self, timeout_s: float = REQUEST_TIMEOUT_S) -> int | None:
        """The node that answers DescribeQuorum as the ready controller, if any."""
        for node in self.nodes.values():
            if not node.alive() or node.paused:
                continue
            try:
                partition = run(_describe_quorum(node.address, self.security),
                                timeout_s=timeout_s)
            except (KafkaClientError, trio.TooSlowError):
                continue
            if partition.error_code == 0:
                return int(partition.leader_id)
        return None

    def check_logs(self) -> None:
        """No node logged a traceback or an ERROR line."""
        problems = {node_id: broker_log_problems(node.log_path.read_text(errors="replace"))
                    for node_id, node in self.nodes.items() if node.log_path.exists()}
        assert not any(problems.values()), problems


async def _metadata(address: tuple[str, int], topic: str | None,
                    security: Security = PLAINTEXT) -> Any:
    async with await KafkaConnection.connect(*address, timeout_s=REQUEST_TIMEOUT_S,
                                             security=security) as conn:
        body = {"topics": [] if topic is None else [{"name": topic}],
                "allow_auto_topic_creation": False}
        return await conn.request(METADATA, body, timeout_s=REQUEST_TIMEOUT_S)


async def _describe_quorum(address: tuple[str, int], security: Security = PLAINTEXT) -> Any:
    async with await KafkaConnection.connect(*address, timeout_s=REQUEST_TIMEOUT_S,
                                             security=security) as conn:
        response = await conn.request(DESCRIBE_QUORUM, describe_quorum_request(), version=1,
                                      timeout_s=REQUEST_TIMEOUT_S)
        return response.topics[0].partitions[0]


def run(coroutine: Any, timeout_s: float = 10.0) -> Any:
    """Run a coroutine under trio with a deadline."""

    async def bounded() -> Any:
        with trio.fail_after(timeout_s):
            return await coroutine

    return trio.run(bounded)


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str,
               interval_s: float = 0.05) -> float:
    """Poll ``predicate`` until true; returns the seconds it took; fails after ``timeout_s``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if predicate():
            return time.monotonic() - start
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def wait_for(probe_fn: Callable[[], T | None], timeout_s: float, what: str,
             interval_s: float = 0.05) -> T:
    """Poll ``probe_fn`` until it returns something other than None, and return that."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe_fn()
        if value is not None:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@contextmanager
def running_cluster(directory: Path, **create: Any) -> Iterator[Cluster]:
    """A 3-node cluster made by ``Cluster.create(directory, **create)``, started and ready;
    stopped (and its logs printed on request) afterwards."""
    cluster = Cluster.create(directory, **create)
    try:
        cluster.start_all()
        cluster.wait_ready()
        yield cluster
    finally:
        stop_cluster(cluster)


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[Cluster]:
    """A running, ready 3-node cluster."""
    with running_cluster(tmp_path / "cluster") as cluster:
        yield cluster


def stop_cluster(cluster: Cluster) -> None:
    """Resumes paused nodes, stops every node (killing what does not stop) and prints their
    logs when ``RAFTLOG_SHOW_BROKER_LOG`` is set."""
    for node in cluster.nodes.values():
        if node.paused:
            node.resume()
    try:
        cluster.stop_all()
    finally:
        cluster.kill_all()
        if os.environ.get("RAFTLOG_SHOW_BROKER_LOG"):
            for node in cluster.nodes.values():
                print(f"----- node {node.node_id} -----\n{node.tail(20000)}")
