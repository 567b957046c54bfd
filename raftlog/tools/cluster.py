"""``raftlog cluster up``: a local cluster of combined nodes as child processes on 127.0.0.1.

The data directory holds everything the cluster is::

    DIR/cluster.json          node count, ports and cluster id (fixed at creation)
    DIR/raft.secret           the shared Raft secret (random, mode 0600)
    DIR/node-<i>/server.properties, node-<i>/data/, node-<i>/server.log

Running ``cluster up`` again on the same directory brings the same cluster back: same node ids,
ports and cluster id, same data. Node ``i`` (1-based) listens for Kafka clients on
``port_base + i - 1``, for Raft on ``port_base + 100 + i - 1`` and serves its metrics and health
endpoint (``metrics.listener``, docs/metrics.md) on ``port_base + 200 + i - 1``; ``--port-base 0``
picks free ports (stored, so a restart reuses them; a directory made before the metrics
endpoint existed gets free metrics ports added to its ``cluster.json``).

The supervisor prints exactly one line on stdout, ``bootstrap.servers=127.0.0.1:p1,...``, once
every node answers ``/health/ready`` with 200 and a topic replicated on every node can be
created and produced to with ``acks=all`` (the probe topic is deleted again). Everything else
goes to stderr, including each node's metrics URL. With ``--secure`` (``secure_cluster.py``:
SASL_SSL listeners, a local CA, an admin SCRAM user) a second line follows,
``client.config=PATH``, the librdkafka client properties to connect with. On SIGINT/SIGTERM
it stops the nodes one at a time, the controller last, each with SIGTERM (a controlled
shutdown) and SIGKILL after ``NODE_STOP_TIMEOUT_S``. Children run in their own session, so a
terminal's Ctrl-C reaches only the supervisor, which then stops them in that order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import h11
import trio

from raftlog.client.connection import (
    PLAINTEXT,
    KafkaClientError,
    KafkaConnection,
    Security,
    parse_bootstrap,
)
from raftlog.controller.rpcs import describe_quorum_request
from raftlog.observe.http import endpoint_url, http_get
from raftlog.partition.batch import build_batch
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import (
    CREATE_TOPICS,
    DELETE_TOPICS,
    DESCRIBE_QUORUM,
    METADATA,
    PRODUCE,
)
from raftlog.tools.command_config import load_security
from raftlog.tools.secure_cluster import (
    CLIENT_PROPERTIES,
    make_secure_material,
    secure_directory,
    secure_node_properties,
)

log = logging.getLogger(__name__)

LAYOUT_FILE: Final = "cluster.json"
SECRET_FILE: Final = "raft.secret"
HOST: Final = "127.0.0.1"
DEFAULT_PORT_BASE: Final = 9092
CONTROLLER_PORT_OFFSET: Final = 100
METRICS_PORT_OFFSET: Final = 200
SESSION_TIMEOUT_MS: Final = 1500
HEARTBEAT_INTERVAL_MS: Final = 250
READY_TIMEOUT_S: Final = 60.0
NODE_STOP_TIMEOUT_S: Final = 15.0
PROBE_TOPIC: Final = "__raftlog_probe"
PROBE_INTERVAL_S: Final = 0.05  # loopback probes are cheap; every 50 ms counts towards startup
REQUEST_TIMEOUT_S: Final = 5.0


class ClusterError(Exception):
    """The cluster cannot be set up or started (bad arguments, ports in use, not ready)."""


@dataclass(frozen=True)
class ClusterLayout:
    """What makes a cluster the same cluster across restarts."""

    nodes: int
    kafka_ports: tuple[int, ...]
    controller_ports: tuple[int, ...]
    cluster_id: str
    # Empty only in a layout read from a cluster.json older than the metrics endpoint.
    metrics_ports: tuple[int, ...] = ()
    # ``--secure``: SASL_SSL listeners, a local CA, an admin SCRAM user (secure_cluster.py).
    secure: bool = False

    @property
    def node_ids(self) -> range:
        return range(1, self.nodes + 1)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{HOST}:{port}" for port in self.kafka_ports)

    def metrics_url(self, node_id: int) -> str:
        return endpoint_url(HOST, self.metrics_ports[node_id - 1])

    @property
    def voters(self) -> str:
        return ",".join(
            f"{node_id}@{HOST}:{port}"
            for node_id, port in zip(self.node_ids, self.controller_ports, strict=True)
        )

    def to_json(self) -> str:
        data = asdict(self)
        if not self.secure:  # a plain cluster's file is as it always was
            del data["secure"]
        return json.dumps(data, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ClusterLayout:
        data = json.loads(text)
        layout = cls(
            nodes=int(data["nodes"]),
            kafka_ports=tuple(int(p) for p in data["kafka_ports"]),
            controller_ports=tuple(int(p) for p in data["controller_ports"]),
            cluster_id=str(data["cluster_id"]),
            metrics_ports=tuple(int(p) for p in data.get("metrics_ports", ())),
            secure=bool(data.get("secure", False)),
        )
        if not (len(layout.kafka_ports) == len(layout.controller_ports) == layout.nodes >= 1
                and len(layout.metrics_ports) in (0, layout.nodes)):
            raise ClusterError(f"{LAYOUT_FILE}: {layout.nodes} nodes but ports for "
                               f"{len(layout.kafka_ports)}/{len(layout.controller_ports)}"
                               f"/{len(layout.metrics_ports)}")
        return layout


def prepare(data_dir: Path, nodes: int | None, port_base: int | None,
            secure: bool | None = None, overrides: Mapping[str, str] | None = None
            ) -> ClusterLayout:
    """Create the cluster directory, or check the arguments against the existing one, and
    (re)write every node's ``server.properties`` (``secure``: see ``secure_cluster``; None
    keeps what the directory was made with; ``overrides``: properties for every node, this
    start only, over the generated ones).

    Raises:
        ClusterError: the arguments contradict the existing cluster, or are invalid.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    layout_path = data_dir / LAYOUT_FILE
    if layout_path.exists():
        layout = ClusterLayout.from_json(layout_path.read_text(encoding="utf-8"))
        if nodes is not None and nodes != layout.nodes:
            raise ClusterError(f"{data_dir} holds a {layout.nodes}-node cluster, not {nodes}")
        if port_base not in (None, 0, layout.kafka_ports[0]):
            raise ClusterError(f"{data_dir} uses port base {layout.kafka_ports[0]}")
        if secure is not None and secure != layout.secure:
            made = "with" if layout.secure else "without"
            raise ClusterError(f"{data_dir} holds a cluster made {made} --secure")
        if not layout.metrics_ports:  # made before the metrics endpoint: add its ports
            taken = {*layout.kafka_ports, *layout.controller_ports}
            layout = dataclasses.replace(layout, metrics_ports=tuple(
                _free_ports(layout.nodes, avoid=taken)))
            layout_path.write_text(layout.to_json(), encoding="utf-8")
    else:
        layout = dataclasses.replace(
            _new_layout(3 if nodes is None else nodes,
                        DEFAULT_PORT_BASE if port_base is None else port_base),
            secure=bool(secure))
        _write_private(data_dir / SECRET_FILE, secrets.token_hex(32))
        layout_path.write_text(layout.to_json(), encoding="utf-8")
    secret_path = data_dir / SECRET_FILE
    if not secret_path.exists():
        raise ClusterError(f"{secret_path} is missing")
    if layout.secure:
        make_secure_material(data_dir, layout.node_ids, layout.bootstrap, [
            node_directory(data_dir, node_id) / "data" for node_id in layout.node_ids])
    for node_id in layout.node_ids:
        node_dir = node_directory(data_dir, node_id)
        node_dir.mkdir(exist_ok=True)
        properties = {**node_properties(layout, node_id, data_dir), **(overrides or {})}
        (node_dir / "server.properties").write_text(
            "".join(f"{key}={value}\n" for key, value in properties.items()), encoding="utf-8"
        )
    return layout


def _new_layout(nodes: int, port_base: int) -> ClusterLayout:
    if not 1 <= nodes <= 99:
        raise ClusterError(f"--nodes must be between 1 and 99, got {nodes}")
    if port_base == 0:
        ports = _free_ports(3 * nodes)
        kafka, controller = tuple(ports[:nodes]), tuple(ports[nodes:2 * nodes])
        metrics = tuple(ports[2 * nodes:])
    else:
        if not 1024 <= port_base <= 65535 - METRICS_PORT_OFFSET - nodes:
            raise ClusterError(f"--port-base {port_base} leaves no room for {nodes} nodes")
        kafka = tuple(port_base + i for i in range(nodes))
        controller = tuple(port_base + CONTROLLER_PORT_OFFSET + i for i in range(nodes))
        metrics = tuple(port_base + METRICS_PORT_OFFSET + i for i in range(nodes))
    # Kafka's cluster ids are 22-character base64url UUIDs; any [A-Za-z0-9_-] works here.
    cluster_id = uuid.uuid4().hex[:22]
    return ClusterLayout(nodes, kafka, controller, cluster_id, metrics)


def _free_ports(count: int, avoid: set[int] | None = None) -> list[int]:
    sockets: list[socket.socket] = []
    try:
        while len(sockets) < count:
            sock = socket.socket()
            sock.bind((HOST, 0))
            if avoid and sock.getsockname()[1] in avoid:
                sock.close()
                continue
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text + "\n")


def node_directory(data_dir: Path, node_id: int) -> Path:
    return data_dir / f"node-{node_id}"


def node_properties(layout: ClusterLayout, node_id: int, data_dir: Path) -> dict[str, str]:
    """The generated ``server.properties`` of one node."""
    index = node_id - 1
    kafka, controller = layout.kafka_ports[index], layout.controller_ports[index]
    return {
        "node.id": str(node_id),
        "process.roles": "broker,controller",
        "listeners": f"PLAINTEXT://{HOST}:{kafka},CONTROLLER://{HOST}:{controller}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{kafka}",
        "controller.listener.names": "CONTROLLER",
        "controller.quorum.voters": layout.voters,
        "log.dirs": str((node_directory(data_dir, node_id) / "data").resolve()),
        "cluster.id": layout.cluster_id,
        "raft.secret.file": str((data_dir / SECRET_FILE).resolve()),
        "default.replication.factor": str(min(3, layout.nodes)),
        "num.partitions": "1",
        # Fast failover on a laptop: a stopped broker is fenced within ~1.5 s.
        "broker.session.timeout.ms": str(SESSION_TIMEOUT_MS),
        "broker.heartbeat.interval.ms": str(HEARTBEAT_INTERVAL_MS),
        "metrics.listener": f"http://{HOST}:{layout.metrics_ports[index]}",
        **(secure_node_properties(data_dir, node_id, HOST, kafka, controller)
           if layout.secure else {}),
    }


def check_ports_free(layout: ClusterLayout) -> None:
    """Raises ClusterError naming the first port something else already listens on."""
    for port in (*layout.kafka_ports, *layout.controller_ports, *layout.metrics_ports):
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((HOST, port))
            except OSError as exc:
                raise ClusterError(f"port {port} is in use ({exc.strerror})") from exc


# -- the supervisor -----------------------------------------------------------------------------


@dataclass
class _Child:
    node_id: int
    process: trio.Process
    stopping: bool = False


async def cluster_up(
    data_dir: Path,
    nodes: int | None,
    port_base: int | None,
    *,
    log_level: str = "INFO",
    ready_timeout_s: float = READY_TIMEOUT_S,
    secure: bool | None = None,
    overrides: Mapping[str, str] | None = None,
) -> int:
    """Run the cluster until SIGINT/SIGTERM; 0 after a clean stop, 1 if it never got ready."""
    layout = prepare(data_dir, nodes, port_base, secure, overrides)
    client_config = secure_directory(data_dir) / CLIENT_PROPERTIES
    security = load_security(str(client_config)) if layout.secure else PLAINTEXT
    check_ports_free(layout)
    children: list[_Child] = []
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        try:
            async with trio.open_nursery() as nursery:
                for node_id in layout.node_ids:
                    child = await _start_node(data_dir, node_id, log_level)
                    children.append(child)
                    nursery.start_soon(_watch, child)
                problem = None
                with trio.move_on_after(ready_timeout_s) as waited:
                    problem = await _wait_ready(layout, children, security)
                if waited.cancelled_caught or problem is not None:
                    log.error("cluster not ready: %s; see %s/node-*/server.log",
                              problem or f"timed out after {ready_timeout_s:.0f} s", data_dir)
                    await _stop_all(children, layout, security)
                    nursery.cancel_scope.cancel()
                    return 1
                print(f"bootstrap.servers={layout.bootstrap}", flush=True)
                if layout.secure:  # librdkafka's names: confluent-kafka, kcat -F, --command-config
                    print(f"client.config={client_config.resolve()}", flush=True)
                for node_id in layout.node_ids:  # stdout keeps its one line
                    print(f"node {node_id} metrics: {layout.metrics_url(node_id)}/metrics",
                          file=sys.stderr, flush=True)
                log.info("cluster %s up: %d nodes, data in %s", layout.cluster_id,
                         layout.nodes, data_dir)
                async for signum in signals:
                    log.info("received %s: stopping the cluster", signal.Signals(signum).name)
                    break
                await _stop_all(children, layout, security)
                nursery.cancel_scope.cancel()
        finally:
            for child in children:  # only stragglers: a clean stop has reaped them all
                _kill(child)
    return 0


async def _start_node(data_dir: Path, node_id: int, log_level: str) -> _Child:
    node_dir = node_directory(data_dir, node_id)
    command = [sys.executable, "-m", "raftlog", "--log-level", log_level, "server",
               "--config", str(node_dir / "server.properties")]
    with (node_dir / "server.log").open("ab") as out:
        process = await trio.lowlevel.open_process(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=node_dir, start_new_session=True,
        )  # fmt: skip
    log.info("node %d started (pid %d)", node_id, process.pid)
    return _Child(node_id, process)


async def _watch(child: _Child) -> None:
    code = await child.process.wait()
    if not child.stopping:
        log.warning("node %d exited unexpectedly with %s; see its server.log", child.node_id,
                    code)


def _kill(child: _Child) -> None:
    if child.process.returncode is None:
        with contextlib.suppress(OSError):
            child.process.kill()


async def _stop_all(children: Sequence[_Child], layout: ClusterLayout,
                    security: Security) -> None:
    """Stop the nodes one by one, the controller last, so every controlled shutdown can
    still reach a controller and a Raft majority."""
    controller = await _controller_id(layout, security)
    ordered = sorted(children, key=lambda c: (c.node_id == controller, c.node_id))
    for child in ordered:
        await _stop(child)


async def _stop(child: _Child) -> None:
    child.stopping = True
    if child.process.returncode is not None:
        return
    with contextlib.suppress(OSError):
        child.process.send_signal(signal.SIGTERM)
    with trio.move_on_after(NODE_STOP_TIMEOUT_S):
        await child.process.wait()
        log.info("node %d stopped", child.node_id)
        return
    log.warning("node %d did not stop within %.0f s; killing it", child.node_id,
                NODE_STOP_TIMEOUT_S)
    _kill(child)
    await child.process.wait()


async def _controller_id(layout: ClusterLayout, security: Security) -> int | None:
    with trio.move_on_after(REQUEST_TIMEOUT_S):
        for host, port in parse_bootstrap(layout.bootstrap):
            try:
                async with await KafkaConnection.connect(host, port, timeout_s=1.0,
                                                         security=security) as conn:
                    response = await conn.request(METADATA, {"topics": []}, timeout_s=1.0)
            except KafkaClientError:
                continue
            if response.controller_id >= 0:
                return int(response.controller_id)
    return None


# -- readiness ------------------------------------------------------------------------------------


async def _wait_ready(layout: ClusterLayout, children: Sequence[_Child],
                      security: Security) -> str | None:
    """Until every node answers /health/ready with 200 and a topic replicated on every node
    can be created and produced to (acks=all); returns why not if a node exits first."""
    problem = ""
    while True:
        exited = [c for c in children if c.process.returncode is not None]
        if exited:
            return f"node {exited[0].node_id} exited with {exited[0].process.returncode}"
        try:
            with trio.fail_after(REQUEST_TIMEOUT_S * 3):
                await check_health(layout)
                await probe(layout.bootstrap, layout.nodes, security)
            return None
        except (KafkaClientError, trio.TooSlowError, ClusterError) as exc:
            if str(exc) != problem:
                problem = str(exc)
                log.info("cluster not ready yet: %s", problem or type(exc).__name__)
        await trio.sleep(PROBE_INTERVAL_S)


async def check_health(layout: ClusterLayout) -> None:
    """Raises ClusterError naming the first node whose /health/ready is not 200."""
    for node_id, port in zip(layout.node_ids, layout.metrics_ports, strict=True):
        try:
            status, _, body = await http_get(HOST, port, "/health/ready",
                                             timeout_s=REQUEST_TIMEOUT_S)
        except (OSError, trio.BrokenResourceError, h11.ProtocolError) as exc:
            raise ClusterError(f"node {node_id}: no health endpoint yet ({exc})") from exc
        if status != 200:
            reasons = body.decode(errors="replace").strip()
            raise ClusterError(f"node {node_id} not ready ({status}: {reasons})")


async def probe(bootstrap: str, replication_factor: int,
                security: Security = PLAINTEXT) -> None:
    """Create ``PROBE_TOPIC`` with ``replication_factor`` replicas, produce one record to it
    with acks=all, and delete it.

    Raises:
        ClusterError, KafkaClientError: some step failed (the caller retries).
    """
    connections: dict[tuple[str, int], KafkaConnection] = {}

    async def connection(address: tuple[str, int]) -> KafkaConnection:
        if address not in connections:
            connections[address] = await KafkaConnection.connect(
                *address, client_id="raftlog-cluster", timeout_s=REQUEST_TIMEOUT_S,
                security=security)
        return connections[address]

    try:
        addresses = parse_bootstrap(bootstrap)
        metadata = await _metadata(await connection(addresses[0]), [PROBE_TOPIC])
        brokers = {b.node_id: (b.host, b.port) for b in metadata.brokers}
        controller = brokers.get(metadata.controller_id)
        if controller is None:
            raise ClusterError("no controller yet")
        admin = await connection(controller)
        if metadata.topics[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            await _create_probe(admin, replication_factor)
        metadata = await _wait_for_leader(await connection(addresses[0]))
        leader = brokers.get(metadata.topics[0].partitions[0].leader_id)
        if leader is None:
            raise ClusterError("probe topic has no leader yet")
        await _produce_probe(await connection(leader))
        response = await admin.request(DELETE_TOPICS, {"topic_names": [PROBE_TOPIC],
                                                       "timeout_ms": 10_000})
        code = response.responses[0].error_code
        if code not in (ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION):
            raise ClusterError(f"deleting the probe topic: {ErrorCode(code).name}")
    finally:
        for conn in connections.values():
            with contextlib.suppress(Exception):
                await conn.aclose()


async def _metadata(connection: KafkaConnection, topics: Sequence[str]) -> Any:
    body = {"topics": [{"name": t} for t in topics], "allow_auto_topic_creation": False}
    return await connection.request(METADATA, body, timeout_s=REQUEST_TIMEOUT_S)


async def _create_probe(admin: KafkaConnection, replication_factor: int) -> None:
    body = {"topics": [{"name": PROBE_TOPIC, "num_partitions": 1,
                        "replication_factor": replication_factor, "assignments": [],
                        "configs": []}], "timeout_ms": 10_000}
    response = await admin.request(CREATE_TOPICS, body, timeout_s=REQUEST_TIMEOUT_S)
    code = response.topics[0].error_code
    if code not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
        raise ClusterError(f"creating the probe topic: {ErrorCode(code).name}")


async def _wait_for_leader(connection: KafkaConnection) -> Any:
    with trio.move_on_after(REQUEST_TIMEOUT_S):
        while True:
            metadata = await _metadata(connection, [PROBE_TOPIC])
            topic = metadata.topics[0]
            if topic.error_code == 0 and topic.partitions and topic.partitions[0].leader_id >= 0:
                return metadata
            await trio.sleep(0.05)
    raise ClusterError("the probe topic did not get a leader")


async def _produce_probe(leader: KafkaConnection) -> None:
    batch = build_batch([(None, b"probe", ())], timestamp_ms=0)
    body = {"transactional_id": None, "acks": -1, "timeout_ms": 10_000,
            "topic_data": [{"name": PROBE_TOPIC,
                            "partition_data": [{"index": 0, "records": batch}]}]}
    response = await leader.request(PRODUCE, body, timeout_s=REQUEST_TIMEOUT_S * 2)
    code = response.responses[0].partition_responses[0].error_code
    if code:
        raise ClusterError(f"producing to the probe topic: {ErrorCode(code).name}")


# -- raftlog quorum status ------------------------------------------------------------------------

DESCRIBE_QUORUM_VERSION: Final = 1


async def quorum_status(bootstrap: str, security: Security = PLAINTEXT) -> int:
    """Print the metadata quorum as the controller sees it (DescribeQuorum), like Kafka's
    ``kafka-metadata-quorum.sh describe --status --replication``."""
    addresses = parse_bootstrap(bootstrap)
    metadata: Any = None
    for address in addresses:
        try:
            async with await KafkaConnection.connect(*address, timeout_s=REQUEST_TIMEOUT_S,
                                                     security=security) as c:
                metadata = await c.request(METADATA, {"topics": []}, timeout_s=REQUEST_TIMEOUT_S)
                break
        except KafkaClientError as exc:
            log.debug("%s:%d: %s", *address, exc)
    if metadata is None:
        raise KafkaClientError(f"no broker of {bootstrap} answered")
    brokers = {b.node_id: (b.host, b.port) for b in metadata.brokers}
    order = sorted(brokers, key=lambda n: (n != metadata.controller_id, n))
    fallback: tuple[int, Any] | None = None
    for node_id in order:
        try:
            async with await KafkaConnection.connect(*brokers[node_id], security=security,
                                                     timeout_s=REQUEST_TIMEOUT_S) as conn:
                response = await conn.request(DESCRIBE_QUORUM, describe_quorum_request(),
                                              version=DESCRIBE_QUORUM_VERSION,
                                              timeout_s=REQUEST_TIMEOUT_S)
        except KafkaClientError as exc:
            log.debug("node %d: %s", node_id, exc)
            continue
        partition = response.topics[0].partitions[0]
        if partition.error_code == 0:
            _print_quorum(metadata.cluster_id, node_id, partition, authoritative=True)
            return 0
        if fallback is None:
            fallback = (node_id, partition)
    if fallback is None:
        raise KafkaClientError("no broker answered DescribeQuorum")
    _print_quorum(metadata.cluster_id, fallback[0], fallback[1], authoritative=False)
    return 1


def _print_quorum(cluster_id: str | None, source: int, partition: Any,
                  *, authoritative: bool) -> None:
    voters = list(partition.current_voters)
    ends = [v.log_end_offset for v in voters if v.log_end_offset >= 0]
    head = max(ends, default=-1)
    now_ms = int(time.time() * 1000)
    print(f"ClusterId:        {cluster_id}")
    print(f"LeaderId:         {partition.leader_id}")
    print(f"Term:             {partition.leader_epoch}")
    print(f"CommitIndex:      {partition.high_watermark}")
    print(f"CurrentVoters:    [{','.join(str(v.replica_id) for v in voters)}]")
    print(f"CurrentObservers: [{','.join(str(o.replica_id) for o in partition.observers)}]")
    if not authoritative:
        print(f"(no ready controller answered; this is node {source}'s partial view)")
    print(f"{'NodeId':<8}{'Role':<10}{'LogEndOffset':>14}{'Lag':>8}{'LastContactMsAgo':>18}")
    rows = [(v, "Leader" if v.replica_id == partition.leader_id else "Follower")
            for v in voters] + [(o, "Observer") for o in partition.observers]
    for replica, role in rows:
        end = replica.log_end_offset
        lag = "-" if end < 0 or head < 0 else str(head - end)
        seen = replica.last_fetch_timestamp
        ago = "-" if seen < 0 else str(max(now_ms - seen, 0))
        print(f"{replica.replica_id:<8}{role:<10}{end if end >= 0 else '-':>14}{lag:>8}"
              f"{ago:>18}")
