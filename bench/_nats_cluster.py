"""NATS JetStream R3 for the multi-node benchmark: three Debian `nats-server` 2.9.10 processes
clustered on 127.0.0.1 (routes between them, JetStream with file storage in temp dirs), one R3
file stream, published to by `_nats_side._publish` (nats-py, at most W acks in flight) connected
to the stream leader.

JetStream R3 acks after a Raft quorum (2 of 3) has the message, without fsync (2.9 syncs every
2 minutes); raftlog acks acks=all after every ISR member (3 of 3) has it, fsynced on the leader.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import _nats_side
import nats
from _nats_server import nats_server_binary
from _nats_side import STREAM, SUBJECT
from _raftlog_cluster import measure_cpu_pids
from _support import PhaseResult, ServerProcess, free_port
from nats.js.api import StorageType, StreamConfig

STREAM_READY_TIMEOUT_S = 30.0


class _Endpoint:
    """What `_nats_side._publish` needs of a node: its URL and its server's PID."""

    def __init__(self, url: str, server: ServerProcess) -> None:
        self.url = url
        self.server = server


class NatsCluster:
    """Three clustered nats-servers (`n1`..`n3`) with JetStream, each in `workdir/<name>`."""

    def __init__(self, workdir: Path, size: int = 3) -> None:
        self.workdir = workdir
        self.names = [f"n{i}" for i in range(1, size + 1)]
        client_ports = {name: free_port() for name in self.names}
        route_ports = {name: free_port() for name in self.names}
        self.urls = {name: f"nats://127.0.0.1:{client_ports[name]}" for name in self.names}
        self.servers: dict[str, ServerProcess] = {}
        for name in self.names:
            node_dir = workdir / name
            node_dir.mkdir(parents=True)
            routes = ", ".join(f"nats-route://127.0.0.1:{route_ports[other]}"
                               for other in self.names if other != name)
            config = node_dir / "nats.conf"
            config.write_text(
                f"server_name: {name}\n"
                f"listen: 127.0.0.1:{client_ports[name]}\n"
                f"jetstream {{\n  store_dir: \"{node_dir / 'jetstream'}\"\n}}\n"
                f"cluster {{\n  name: bench\n  listen: 127.0.0.1:{route_ports[name]}\n"
                f"  routes: [{routes}]\n}}\n")
            self.servers[name] = ServerProcess(name, [nats_server_binary(), "-c", str(config)],
                                               client_ports[name], node_dir / "nats-server.log")
        self.leader = ""

    @property
    def pids(self) -> dict[str, int]:
        return {name: server.pid for name, server in self.servers.items()}

    def start(self) -> float:
        started = time.monotonic()
        for server in self.servers.values():
            server.start()
        return time.monotonic() - started

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()

    def log_tail(self, chars: int = 1500) -> str:
        return "\n".join(f"--- {name} ---\n{s.log_tail(chars)}" for name, s in
                         self.servers.items())

    def create_stream(self) -> str:
        """Create the R3 file stream (retrying until the JetStream meta group has a leader)
        and wait until all three replicas are current; returns the stream leader's name."""
        self.leader = asyncio.run(self._create_stream())
        return self.leader

    async def _create_stream(self) -> str:
        nc = await nats.connect(servers=list(self.urls.values()))
        try:
            js = nc.jetstream(timeout=5)
            deadline = time.monotonic() + STREAM_READY_TIMEOUT_S
            last: Exception | None = None
            while time.monotonic() < deadline:
                try:
                    await js.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECT],
                                                     storage=StorageType.FILE, num_replicas=3))
                    break
                except Exception as exc:  # "JetStream system temporarily unavailable", ...
                    last = exc
                    await asyncio.sleep(0.2)
            else:
                raise RuntimeError(f"could not create the R3 stream: {last!r}")
            while time.monotonic() < deadline:
                info = await js.stream_info(STREAM)
                cluster = info.cluster
                if cluster is not None and cluster.leader and cluster.replicas and \
                        len(cluster.replicas) == 2 and all(r.current for r in cluster.replicas):
                    return str(cluster.leader)
                await asyncio.sleep(0.1)
            raise RuntimeError("the R3 stream's replicas did not become current")
        finally:
            await nc.close()

    def publish(self, repeat: int, records: int, payload: bytes, window: int) -> PhaseResult:
        """`_nats_side._publish` against the stream leader. `cpu.broker_pct` is the sum of the
        three servers (measured around the whole call, which adds a connect and two
        stream_info round trips to the ~10+ s phase); the leader's own CPU% is in `extra`."""
        endpoint: Any = _Endpoint(self.urls[self.leader], self.servers[self.leader])
        with measure_cpu_pids(self.pids) as meter:
            result = asyncio.run(_nats_side._publish(endpoint, repeat, records, payload, window))
        result.phase = "produce-1p"
        result.extra.update({
            "stream_leader": self.leader,
            "leader_cpu_pct": result.cpu.broker_pct,
            "cpu_pct_by_node": meter.by_name,
            "replicas": 3,
        })
        result.cpu.broker_pct = meter.brokers_pct
        return result
