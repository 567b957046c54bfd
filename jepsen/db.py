"""The database under test: one ``raftlog server`` process per node (the I/O shell).

Node configurations come from :func:`raftlog.tools.cluster.prepare` (what ``raftlog cluster up``
generates: combined broker+controller nodes, a shared Raft secret, 1.5 s broker sessions);
the harness then points each node's listeners, advertised listener and the voter list at the
node's own address from :class:`jepsen.net.Net` (its namespace address, or 127.0.0.1), so
clients in the root namespace reach the nodes at the addresses the nodes advertise.

Each node gets a clock-offset file (``RAFTLOG_CLOCK_OFFSET_FILE``, see :mod:`raftlog.clock`)
that the clock nemesis writes, and a metrics listener (``metrics.listener``) on its own address,
which :mod:`jepsen.scrape` reads during the run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import trio

from jepsen.lazyfs import LazyFsSet
from jepsen.net import Net
from jepsen.scrape import fetch
from raftlog.client.connection import PLAINTEXT, KafkaClientError, KafkaConnection, Security
from raftlog.clock import ENV_OFFSET_FILE
from raftlog.config.client_properties import parse_client_properties
from raftlog.config.properties import load_properties
from raftlog.controller.rpcs import describe_quorum_request
from raftlog.protocol.schemas import DESCRIBE_QUORUM, METADATA
from raftlog.tools.cluster import ClusterLayout, node_directory, node_properties, prepare, probe
from raftlog.tools.command_config import security_of
from raftlog.tools.secure_cluster import make_secure_material, secure_node_properties

REQUEST_TIMEOUT_S: Final = 2.0
STOP_TIMEOUT_S: Final = 10.0
READY_TIMEOUT_S: Final = 90.0

#: Harness-only (``--unsafe-fsync``): acknowledge without fsync, nothing else unsafe; only a
#: power loss (:mod:`jepsen.faults_power`) can then lose acknowledged writes.
UNSAFE_FSYNC_PROPERTIES: Final = {"log.flush.interval.messages": "1000000000"}

#: The harness-only unsafe mode (``--unsafe``): elect out-of-sync replicas, never fsync.
UNSAFE_PROPERTIES: Final = {
    "unclean.leader.election.enable": "true",
    "log.flush.interval.messages": "1000000000",
}


def run_trio(coroutine: Any, timeout_s: float) -> Any:
    """Run one coroutine under trio with a deadline (each harness thread has its own run)."""

    async def bounded() -> Any:
        with trio.fail_after(timeout_s):
            return await coroutine

    return trio.run(bounded)


@dataclass
class NodeProcess:
    """One node: its process, address and files."""

    node_id: int
    directory: Path
    host: str
    kafka_port: int
    exec_prefix: list[str]
    metrics_port: int = 0
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    starts: int = 0

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    @property
    def clock_file(self) -> Path:
        return self.directory / "clock-offset"

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.kafka_port

    def start(self) -> None:
        if self.alive():
            return
        self.paused = False
        env = {**os.environ, ENV_OFFSET_FILE: str(self.clock_file)}
        command = [*self.exec_prefix, sys.executable, "-m", "raftlog", "server", "--config",
                   str(self.directory / "server.properties")]
        with self.log_path.open("ab") as out:
            out.write(f"--- jepsen: start #{self.starts + 1} at {time.time():.3f}\n".encode())
            out.flush()
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, cwd=self.directory,
                                            env=env, start_new_session=True)
        self.starts += 1

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(OSError):
            self.process.send_signal(signal.SIGKILL)
        # SIGKILL is asynchronous: reap before a restart reuses the ports.
        self.process.wait(STOP_TIMEOUT_S)
        self.paused = False

    def pause(self) -> None:
        if self.alive() and not self.paused:
            assert self.process is not None
            self.process.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.alive() and self.paused:
            assert self.process is not None
            self.process.send_signal(signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        """SIGTERM (controlled shutdown), SIGKILL after ``STOP_TIMEOUT_S``."""
        if not self.alive():
            return
        assert self.process is not None
        self.resume()
        with contextlib.suppress(OSError):
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()

    def set_clock_offset_s(self, offset_s: float) -> None:
        tmp = self.clock_file.with_suffix(".tmp")
        tmp.write_text(f"{offset_s}\n", encoding="utf-8")
        tmp.replace(self.clock_file)


@dataclass
class Cluster:
    """The nodes of one test run."""

    directory: Path
    layout: ClusterLayout
    net: Net
    nodes: dict[int, NodeProcess] = field(default_factory=dict)
    # ``--secure``: the librdkafka properties every client adds (SASL_SSL, SCRAM-SHA-512,
    # the local CA) and the same for the project's own client; empty and PLAINTEXT otherwise.
    client_config: dict[str, str] = field(default_factory=dict)
    security: Security = PLAINTEXT
    # ``--nemesis power-loss``: every node's data directory on its own LazyFS mount, unmounted
    # by stop_all (see jepsen.lazyfs).
    lazyfs: LazyFsSet | None = None
    harness_notes: list[str] = field(default_factory=list)

    @classmethod
    def create(cls, directory: Path, size: int, net: Net,
               extra_properties: Mapping[str, str] | None = None,
               secure: bool = False) -> Cluster:
        """``secure``: every node's one Kafka listener is SASL_SSL, between nodes too (TLS
        with a local CA, SCRAM), as ``raftlog cluster up --secure`` makes it, with each
        node's certificate naming its namespace address."""
        layout = prepare(directory, size, 0)
        cluster = cls(directory, layout, net)
        hosts = {i: net.host(i) for i in layout.node_ids}
        if secure:
            cluster._make_secure(hosts)
        voters = ",".join(f"{i}@{hosts[i]}:{layout.controller_ports[i - 1]}"
                          for i in layout.node_ids)
        metrics_ports = layout.metrics_ports  # free ports, picked by prepare()
        for i in layout.node_ids:
            node_dir = node_directory(directory, i)
            props = node_properties(layout, i, directory)
            kafka, controller = layout.kafka_ports[i - 1], layout.controller_ports[i - 1]
            props["listeners"] = f"PLAINTEXT://{hosts[i]}:{kafka},CONTROLLER://{hosts[i]}:{controller}"
            props["advertised.listeners"] = f"PLAINTEXT://{hosts[i]}:{kafka}"
            props["controller.quorum.voters"] = voters
            props["metrics.listener"] = f"http://{hosts[i]}:{metrics_ports[i - 1]}"
            if secure:
                props.update(secure_node_properties(directory, i, hosts[i], kafka, controller))
            props.update(extra_properties or {})
            (node_dir / "server.properties").write_text(
                "".join(f"{k}={v}\n" for k, v in props.items()), encoding="utf-8")
            cluster.nodes[i] = NodeProcess(i, node_dir, hosts[i], kafka, net.exec_prefix(i),
                                           metrics_ports[i - 1])
        return cluster

    def _make_secure(self, hosts: Mapping[int, str]) -> None:
        bootstrap = ",".join(f"{hosts[i]}:{self.layout.kafka_ports[i - 1]}"
                             for i in self.layout.node_ids)
        path = make_secure_material(
            self.directory, self.layout.node_ids, bootstrap,
            [node_directory(self.directory, i) / "data" for i in self.layout.node_ids],
            node_hosts=hosts)
        properties = load_properties(str(path))
        self.client_config = {k: v for k, v in properties.items() if k != "bootstrap.servers"}
        self.security = security_of(parse_client_properties(properties, str(path)))

    @property
    def node_ids(self) -> list[int]:
        return sorted(self.nodes)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{n.host}:{n.kafka_port}" for n in self.nodes.values())

    def metrics_targets(self) -> dict[int, tuple[str, int]]:
        """node id -> (host, port) of its metrics listener."""
        return {i: (n.host, n.metrics_port) for i, n in self.nodes.items() if n.metrics_port}

    def start_all(self) -> None:
        for node in self.nodes.values():
            node.start()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until every node answers ``/health/ready`` with 200 (registered, caught up,
        unfenced) and a topic replicated on every node can be created and produced to
        (acks=all)."""
        deadline = time.monotonic() + timeout_s
        last: BaseException | None = None
        while time.monotonic() < deadline:
            dead = [n.node_id for n in self.nodes.values() if not n.alive()]
            if dead:
                raise RuntimeError(f"node(s) {dead} exited during start-up; see their logs")
            try:
                for node in self.nodes.values():
                    fetch(node.host, node.metrics_port, 2.0, path="/health/ready")
                run_trio(probe(self.bootstrap, len(self.nodes), self.security), 15.0)
                return
            except Exception as exc:  # any failure: not ready yet
                last = exc
            time.sleep(0.25)
        raise RuntimeError(f"cluster not ready after {timeout_s:.0f} s: {last}")

    def stop_all(self) -> None:
        for node in self.nodes.values():
            node.resume()
        for node in self.nodes.values():
            node.kill()
        if self.lazyfs is not None:
            self.harness_notes += self.lazyfs.unmount_all()

    def mount_lazyfs(self, binary: Path, work: Path) -> None:
        """Put every node's data directory on its own LazyFS mount (before the nodes start).
        """
        self.lazyfs = LazyFsSet.mount(
            binary, {i: n.directory / "data" for i, n in self.nodes.items()}, work)

    # -- observations through the project's client (for targeted faults) -------------------

    def _reachable(self) -> list[NodeProcess]:
        return [n for n in self.nodes.values() if n.alive() and not n.paused]

    def quorum_leader(self) -> int | None:
        """The node answering DescribeQuorum as the ready controller, if any."""
        for node in self._reachable():
            try:
                partition = run_trio(_describe_quorum(node.address, self.security),
                                     REQUEST_TIMEOUT_S * 2)
            except (KafkaClientError, trio.TooSlowError, OSError):
                continue
            if partition.error_code == 0 and partition.leader_id >= 0:
                return int(partition.leader_id)
        return None

    def partition_leaders(self, topic: str) -> dict[int, int]:
        """partition -> leader node id, as the first answering node sees it."""
        for node in self._reachable():
            try:
                md = run_trio(_metadata(node.address, topic, self.security), REQUEST_TIMEOUT_S * 2)
            except (KafkaClientError, trio.TooSlowError, OSError):
                continue
            topics = [t for t in md.topics if t.name == topic and t.error_code == 0]
            if topics:
                return {p.partition_index: p.leader_id for p in topics[0].partitions}
        return {}


async def _metadata(address: tuple[str, int], topic: str, security: Security) -> Any:
    async with await KafkaConnection.connect(*address, timeout_s=REQUEST_TIMEOUT_S,
                                             security=security) as conn:
        body = {"topics": [{"name": topic}], "allow_auto_topic_creation": False}
        return await conn.request(METADATA, body, timeout_s=REQUEST_TIMEOUT_S)


async def _describe_quorum(address: tuple[str, int], security: Security) -> Any:
    async with await KafkaConnection.connect(*address, timeout_s=REQUEST_TIMEOUT_S,
                                             security=security) as conn:
        response = await conn.request(DESCRIBE_QUORUM, describe_quorum_request(), version=1,
                                      timeout_s=REQUEST_TIMEOUT_S)
        return response.topics[0].partitions[0]
