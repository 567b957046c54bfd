"""The raftlog half of the multi-node benchmark: `raftlog cluster up --nodes 3` as a child
process, its node processes found through /proc, confluent-kafka as the client.

`cluster up` starts each node in its own session, so the nodes survive their supervisor if it
dies. `RaftlogCluster.stop()` therefore stops the supervisor with SIGTERM (it stops its nodes one
by one, the controller last), then SIGKILLs by PID any node process that still names this
cluster's data directory on its command line, and every node this module restarted itself.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _raftlog_side import PRODUCER_CONFIG, REPO_ROOT
from _support import (
    CpuUsage,
    PhaseResult,
    box_cpu_ticks,
    process_cpu_seconds,
)
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0  # the supervisor stops 3 nodes one by one, each within 15 s
NODE_STOP_TIMEOUT_S = 20.0
PRODUCE_TIMEOUT_S = 180.0
CLIENT_LOG_LEVEL = 2  # librdkafka: critical only (a killed broker makes it log connect errors)

# Throughput: the single-node benchmark's producer (acks=all, linger.ms=5, 1 MB batches),
# with librdkafka's defaults for the rest: enable.idempotence=false and
# max.in.flight.requests.per.connection=1000000, so several produce requests per partition
# are in flight. The NATS side matches: publish_async without Nats-Msg-Id (no dedupe window).
THROUGHPUT_PRODUCER_CONFIG: dict[str, Any] = dict(PRODUCER_CONFIG)
assert THROUGHPUT_PRODUCER_CONFIG["acks"] == "all"
assert "max.in.flight.requests.per.connection" not in THROUGHPUT_PRODUCER_CONFIG

# The same with idempotence on, reported next to it. librdkafka's idempotent producer has
# at most ONE produce request in flight per partition, whatever max.in.flight says: it caps
# requests at 5 - rktp_msgs_inflight, and that counter is in messages, not requests
# (rdkafka_broker.c, rd_kafka_toppar_producer_serve; librdkafka PR #4989 is open to change
# it). One partition then moves one batch (<= batch.size) per produce round trip, and the
# broker thread spins in poll() while it waits (it burns most of a core on this 2-core box).
IDEMPOTENT_THROUGHPUT_PRODUCER_CONFIG: dict[str, Any] = {
    **PRODUCER_CONFIG,
    "enable.idempotence": True,
    "max.in.flight.requests.per.connection": 5,
}

# Failover: one record at a time. The retry/reconnect/metadata back-offs are shortened from
# librdkafka's defaults (100 ms .. 1-10 s) so that the client does not add seconds of its own
# back-off to the broker's failover. A periodic metadata refresh (default 5 min) matters most:
# until the controller fences the dead broker, Metadata still names it as the leader, so
# librdkafka's fast leader query stops and the client only learns of the new leader at the
# next refresh (one pass here: 0.2-0.8 s of client lag without it, 0.1-0.4 s with it). The
# report gives "new leader in Metadata" and the client's lag after it separately.
FAILOVER_PRODUCER_CONFIG: dict[str, Any] = {
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 0,
    "message.timeout.ms": 30_000,
    "request.timeout.ms": 10_000,
    "retry.backoff.ms": 50,
    "retry.backoff.max.ms": 250,
    "reconnect.backoff.ms": 50,
    "reconnect.backoff.max.ms": 250,
    "topic.metadata.refresh.fast.interval.ms": 50,
    "topic.metadata.refresh.interval.ms": 250,
    "log_level": CLIENT_LOG_LEVEL,
}


# -- /proc helpers -----------------------------------------------------------------------------


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def pids_whose_cmdline_contains(needle: str) -> list[int]:
    """Live (not zombie: a zombie's cmdline is empty) processes with `needle` in an argument."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and any(needle in arg for arg in cmdline(int(entry))):
            out.append(int(entry))
    return out


def rss_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of `pid` in KiB, from /proc/<pid>/status."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0])
    return out


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            raw = stat.read()
    except OSError:
        return False
    return raw[raw.rindex(b")") + 2:][:1] != b"Z"


@dataclass
class MultiCpuMeter:
    """CPU during a block: each broker process, the client (this process) and the whole box,
    in % of one core (200% = this 2-vCPU box)."""

    by_name: dict[str, float] = field(default_factory=dict)
    client_pct: float = float("nan")
    box_busy_pct: float = float("nan")
    wall_s: float = 0.0

    @property
    def brokers_pct(self) -> float:
        return sum(self.by_name.values())

    def usage(self, broker: str | None = None) -> CpuUsage:
        """A single-node style `CpuUsage`: `broker` alone, or the sum of every broker."""
        value = self.by_name.get(broker, float("nan")) if broker else self.brokers_pct
        return CpuUsage(broker_pct=value, client_pct=self.client_pct,
                        box_busy_pct=self.box_busy_pct)


@contextmanager
def measure_cpu_pids(pids: Mapping[str, int]) -> Iterator[MultiCpuMeter]:
    """Like `_support.measure_cpu`, for several server processes at once."""
    meter = MultiCpuMeter()
    ncpu = os.cpu_count() or 1

    def cpu(pid: int) -> float:
        try:
            return process_cpu_seconds(pid)
        except OSError:
            return float("nan")

    start = {name: cpu(pid) for name, pid in pids.items()}
    client0 = time.process_time()
    busy0, total0 = box_cpu_ticks()
    wall0 = time.perf_counter()
    try:
        yield meter
    finally:
        wall = max(time.perf_counter() - wall0, 1e-9)
        busy1, total1 = box_cpu_ticks()
        meter.by_name = {name: 100.0 * (cpu(pid) - start[name]) / wall
                         for name, pid in pids.items()}
        meter.client_pct = 100.0 * (time.process_time() - client0) / wall
        meter.box_busy_pct = 100.0 * ncpu * (busy1 - busy0) / max(total1 - total0, 1)
        meter.wall_s = wall


# -- the cluster ------------------------------------------------------------------------------


class RaftlogCluster:
    """`raftlog cluster up --nodes N --data-dir DIR --port-base 0` run as a child process;
    `cluster_args` are appended to its command line (`--override K=V`, `--ready-timeout S`)."""

    def __init__(self, data_dir: Path, nodes: int = 3, log_level: str = "WARNING",
                 cluster_args: Sequence[str] = ()) -> None:
        self.data_dir = data_dir
        self.nodes = nodes
        self.log_level = log_level
        self.cluster_args = list(cluster_args)
        self.supervisor: subprocess.Popen[bytes] | None = None
        self.bootstrap = ""
        self.restarted: dict[int, subprocess.Popen[bytes]] = {}  # nodes we started ourselves
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.supervisor_log = data_dir.parent / f"{data_dir.name}-supervisor.log"

    # launching and stopping

    def up(self, timeout_s: float = READY_TIMEOUT_S) -> float:
        """Launch `cluster up` and wait for its `bootstrap.servers=` line; returns seconds from
        the launch to that line."""
        assert self.supervisor is None or self.supervisor.poll() is not None, "already up"
        argv = [sys.executable, "-m", "raftlog", "--log-level", self.log_level, "cluster", "up",
                "--nodes", str(self.nodes), "--data-dir", str(self.data_dir), "--port-base", "0",
                *self.cluster_args]
        with self.supervisor_log.open("ab") as err:
            started = time.perf_counter()
            self.supervisor = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err,
                                               stdin=subprocess.DEVNULL, cwd=REPO_ROOT)
        assert self.supervisor.stdout is not None
        line = b""
        with selectors.DefaultSelector() as sel:
            sel.register(self.supervisor.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + timeout_s
            while not line.endswith(b"\n"):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"cluster up printed nothing in {timeout_s} s:\n"
                                       f"{self.log_tail()}")
                if not sel.select(0.5):
                    continue
                chunk = os.read(self.supervisor.stdout.fileno(), 4096)
                if not chunk:
                    code = self.supervisor.wait()
                    raise RuntimeError(f"cluster up exited with {code} before it was ready:\n"
                                       f"{self.log_tail()}")
                line += chunk
        seconds = time.perf_counter() - started
        text = line.decode().strip()
        if not text.startswith("bootstrap.servers="):
            self.stop()
            raise RuntimeError(f"unexpected first line from cluster up: {text!r}")
        self.bootstrap = text.split("=", 1)[1]
        return seconds

    def stop(self) -> float:
        """Stop our restarted nodes, then the supervisor (SIGTERM, SIGKILL after a minute),
        then SIGKILL any node process of this data dir that is left. Returns the seconds the
        supervisor took. Idempotent."""
        for node_id, process in list(self.restarted.items()):
            _terminate(process, NODE_STOP_TIMEOUT_S)
            del self.restarted[node_id]
        seconds = 0.0
        if self.supervisor is not None and self.supervisor.poll() is None:
            started = time.perf_counter()
            self.supervisor.send_signal(signal.SIGTERM)
            try:
                self.supervisor.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.supervisor.kill()
                self.supervisor.wait()
            seconds = time.perf_counter() - started
        if self.supervisor is not None and self.supervisor.stdout is not None:
            self.supervisor.stdout.close()
        for pid in self.node_pids().values():  # stragglers of a supervisor that was killed
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        return seconds

    def log_tail(self, chars: int = 3000) -> str:
        parts = []
        for path in [self.supervisor_log, *sorted(self.data_dir.glob("node-*/server.log"))]:
            with suppress(OSError):
                parts.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    # the node processes

    def config_path(self, node_id: int) -> Path:
        return self.data_dir / f"node-{node_id}" / "server.properties"

    def node_pids(self) -> dict[int, int]:
        """node id -> PID of every live `raftlog server` process of this cluster (the
        supervisor's children and the nodes we restarted), from /proc/*/cmdline."""
        out: dict[int, int] = {}
        for node_id in range(1, self.nodes + 1):
            config = str(self.config_path(node_id))
            for pid in pids_whose_cmdline_contains(config):
                args = cmdline(pid)
                if "server" in args and config in args and pid_alive(pid):
                    out[node_id] = pid
        return out

    def node_pid(self, node_id: int) -> int:
        pid = self.node_pids().get(node_id)
        if pid is None:
            raise RuntimeError(f"no live process for node {node_id}")
        return pid

    def kill_node(self, node_id: int) -> float:
        """SIGKILL node `node_id`; returns time.monotonic() right after the signal."""
        pid = self.node_pid(node_id)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        process = self.restarted.pop(node_id, None)
        if process is not None:
            process.wait()
        return killed_at

    def restart_node(self, node_id: int) -> None:
        """Start a killed node again exactly as `cluster up` does (same argv, cwd, own session);
        this module owns that process from now on."""
        node_dir = self.config_path(node_id).parent
        with (node_dir / "server.log").open("ab") as out:
            self.restarted[node_id] = subprocess.Popen(
                [sys.executable, "-m", "raftlog", "--log-level", self.log_level, "server",
                 "--config", str(self.config_path(node_id))],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=node_dir,
                start_new_session=True)

    def data_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.data_dir.rglob("*") if p.is_file())

    # metadata through confluent-kafka

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap, "log_level": CLIENT_LOG_LEVEL})

    def create_topic(self, topic: str, partitions: int, replication_factor: int = 3,
                     timeout_s: float = 30.0, replicas: list[int] | None = None) -> None:
        """Create `topic` and wait until every partition has a leader and a full ISR.
        `replicas` pins a 1-partition topic's replica list (its first is the preferred
        leader)."""
        admin = self.admin()
        new = NewTopic(topic, partitions, replication_factor) if replicas is None \
            else NewTopic(topic, 1, replica_assignment=[replicas])
        admin.create_topics([new], request_timeout=15)[topic].result(timeout=timeout_s)
        wait_until(lambda: partitions_ready(admin, topic, partitions, replication_factor),
                   timeout_s, f"{topic} to get leaders and full ISRs")


def _terminate(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_until(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.05) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if predicate():
            return time.monotonic() - started
        time.sleep(interval_s)
    raise RuntimeError(f"timed out after {timeout_s} s waiting for {what}")


def partition_state(admin: AdminClient, topic: str, partition: int = 0,
                    timeout_s: float = 2.0) -> Any | None:
    """confluent-kafka's PartitionMetadata (leader, replicas, isrs), or None if unknown."""
    try:
        described = admin.list_topics(topic, timeout=timeout_s).topics.get(topic)
    except Exception:
        return None
    if described is None or described.error is not None:
        return None
    return described.partitions.get(partition)


def partitions_ready(admin: AdminClient, topic: str, partitions: int,
                     replication_factor: int) -> bool:
    try:
        described = admin.list_topics(topic, timeout=2).topics.get(topic)
    except Exception:
        return False
    if described is None or described.error is not None:
        return False
    parts = described.partitions
    return len(parts) == partitions and all(
        p.leader >= 0 and len(p.isrs) == replication_factor for p in parts.values())


def controller_id(admin: AdminClient) -> int:
    try:
        return int(admin.list_topics(timeout=2).controller_id)
    except Exception:
        return -1


# -- throughput ------------------------------------------------------------------------------


def produce(cluster: RaftlogCluster, topic: str, partitions: int, repeat: int, records: int,
            payload: bytes, idempotent: bool = False) -> PhaseResult:
    """Produce `records` x `payload` with acks=all (and idempotence if asked); round-robin
    over the partitions. Timed from the first produce() until flush() returns. CPU is the
    sum of the three nodes (per node in `extra`). The phase is `produce-<p>p[-idem]`."""
    errors: list[str] = []

    def on_error(error: Any, _message: Any) -> None:
        if error is not None:
            errors.append(str(error))

    config = IDEMPOTENT_THROUGHPUT_PRODUCER_CONFIG if idempotent else THROUGHPUT_PRODUCER_CONFIG
    producer = Producer({"bootstrap.servers": cluster.bootstrap, **config,
                         "on_delivery": on_error})
    metadata = producer.list_topics(topic, timeout=10)  # connect, learn the leaders
    leaders = {p: m.leader for p, m in metadata.topics[topic].partitions.items()}
    producer.produce(topic, b"warm-up", partition=0)  # InitProducerId before the clock
    producer.flush(30)
    pids = {f"node{n}": pid for n, pid in cluster.node_pids().items()}
    send = producer.produce
    poll = producer.poll
    buffer_full = 0
    with measure_cpu_pids(pids) as meter:
        started = time.perf_counter()
        for i in range(records):
            while True:
                try:
                    send(topic, payload, partition=i % partitions)
                    break
                except BufferError:
                    buffer_full += 1
                    poll(0.01)
            if i & 4095 == 0:
                poll(0)
        enqueued = time.perf_counter() - started
        left = producer.flush(PRODUCE_TIMEOUT_S)
        seconds = time.perf_counter() - started
    delivered = records - left - len(errors)
    ok = left == 0 and not errors
    note = "" if ok else f"{left} undelivered, {len(errors)} errors (first: " \
        f"{errors[0] if errors else '-'})"
    leader_names = sorted({f"node{n}" for n in leaders.values()})
    leader_cpu = sum(meter.by_name.get(name, 0.0) for name in leader_names)
    return PhaseResult(
        "raftlog", phase_name(partitions, idempotent), repeat, delivered, delivered * len(payload),
        seconds, meter.usage(), ok=ok, note=note,
        extra={"partitions": partitions, "topic": topic, "idempotent": idempotent,
               "leaders": {str(p): n for p, n in leaders.items()},
               "leader_cpu_pct": leader_cpu, "cpu_pct_by_node": meter.by_name,
               "enqueue_seconds": enqueued, "buffer_full_retries": buffer_full})


def phase_name(partitions: int, idempotent: bool) -> str:
    return f"produce-{partitions}p" + ("-idem" if idempotent else "")


def end_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    """High watermarks of every partition (after a restart: did the data survive?)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks",
                         "log_level": CLIENT_LOG_LEVEL})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(partitions)]
    finally:
        consumer.close()


# -- failover ---------------------------------------------------------------------------------


@dataclass
class FailoverTrial:
    trial: int
    topic: str
    killed_node: int
    killed_was_controller: bool
    failover_s: float  # SIGKILL -> the next acknowledged produce
    new_leader_visible_s: float  # SIGKILL -> Metadata names another leader (polled 50 ms)
    new_leader: int
    rejoin_isr_s: float  # restart of the killed node -> it is in the ISR again
    records_before_kill: int
    ack_latency_ms_p50: float  # one-at-a-time acks=all produce before the kill
    ack_latency_ms_p99: float
    failed_deliveries: int
    ok: bool = True
    note: str = ""


class LeaderWatcher:
    """Polls Metadata every `interval_s` in a thread; records when the leader changes."""

    def __init__(self, bootstrap: str, topic: str, old_leader: int,
                 interval_s: float = 0.05) -> None:
        self.admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": CLIENT_LOG_LEVEL})
        self.topic = topic
        self.old_leader = old_leader
        self.interval_s = interval_s
        self.seen_at: float | None = None
        self.new_leader = -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            state = partition_state(self.admin, self.topic, timeout_s=1.0)
            if state is not None and state.leader not in (-1, self.old_leader):
                self.seen_at = time.monotonic()
                self.new_leader = int(state.leader)
                return
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _send_one(producer: Producer, topic: str, value: bytes,
              timeout_s: float) -> tuple[Any, float]:
    """produce() one record and poll until its delivery report: (error or None, ack time)."""
    result: list[tuple[Any, float]] = []
    producer.produce(topic, value, partition=0,
                     on_delivery=lambda err, _msg: result.append((err, time.monotonic())))
    deadline = time.monotonic() + timeout_s
    while not result and time.monotonic() < deadline:
        producer.poll(0.01)
    return result[0] if result else (RuntimeError("no delivery report"), time.monotonic())


def failover_trial(cluster: RaftlogCluster, trial: int, warmup_records: int = 300,
                   timeout_s: float = 30.0, rejoin_timeout_s: float = 60.0) -> FailoverTrial:
    """A fresh RF=3 topic; one-at-a-time produces; SIGKILL the partition leader's process
    between two produces; time to the next ack; restart the node; wait until it is in the ISR
    again."""
    topic = f"failover-{trial}"
    # Rotate the preferred leader over the nodes, so that the controller's node is killed too
    # in some trials (the placement would otherwise pick the same node every time).
    first = trial % cluster.nodes + 1
    cluster.create_topic(topic, 1, replicas=[first, *(n for n in range(1, cluster.nodes + 1)
                                                      if n != first)])
    admin = cluster.admin()
    producer = Producer({"bootstrap.servers": cluster.bootstrap, **FAILOVER_PRODUCER_CONFIG})
    failed = 0
    latencies: list[float] = []
    for i in range(warmup_records):
        sent = time.monotonic()
        error, acked = _send_one(producer, topic, b"before-%06d" % i, timeout_s)
        if error is not None:
            failed += 1
        else:
            latencies.append(acked - sent)
    state = partition_state(admin, topic)
    if state is None or state.leader < 0:
        raise RuntimeError(f"{topic} has no leader before the kill")
    old_leader = int(state.leader)
    was_controller = controller_id(admin) == old_leader
    watcher = LeaderWatcher(cluster.bootstrap, topic, old_leader)
    killed_at = cluster.kill_node(old_leader)
    watcher.start()
    failover_s = float("nan")
    note = ""
    i = 0
    while time.monotonic() - killed_at < timeout_s:
        error, acked = _send_one(producer, topic, b"after-%06d" % i, timeout_s)
        i += 1
        if error is None:
            failover_s = acked - killed_at
            break
        failed += 1
        note = f"delivery failed after the kill: {error}"
    watcher.stop()
    if watcher.seen_at is None:  # the watcher gave up or was stopped first: look once more
        state = partition_state(admin, topic)
        new_leader = int(state.leader) if state is not None else -1
        visible_s = float("nan")
    else:
        new_leader, visible_s = watcher.new_leader, watcher.seen_at - killed_at
    producer.flush(10)
    cluster.restart_node(old_leader)
    restarted_at = time.monotonic()
    rejoin_s = float("nan")
    try:
        wait_until(lambda: (s := partition_state(admin, topic)) is not None
                   and old_leader in s.isrs, rejoin_timeout_s,
                   f"node {old_leader} to rejoin the ISR of {topic}", interval_s=0.1)
        rejoin_s = time.monotonic() - restarted_at
    except RuntimeError as exc:
        note = f"{note} {exc}".strip()
    lat_ms = sorted(x * 1000 for x in latencies)
    return FailoverTrial(
        trial, topic, old_leader, was_controller, failover_s, visible_s, new_leader, rejoin_s,
        len(latencies), _pct(lat_ms, 50), _pct(lat_ms, 99), failed,
        ok=failover_s == failover_s and rejoin_s == rejoin_s, note=note)


def _pct(sorted_values: list[float], pct: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, round(pct / 100 * (len(sorted_values) - 1)))
    return sorted_values[index]
