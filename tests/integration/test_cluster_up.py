"""``raftlog cluster up``: bootstrap line, confluent-kafka with replication factor 3, each node's
metrics and health endpoint, clean stop, and the same cluster back from the same data
directory; ``raftlog quorum status``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cluster_harness import wait_until
from tests.integration.helpers import unique_topic

UP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
RECORDS = 3000
PARTITIONS = 3


class Supervisor:
    """One ``raftlog cluster up`` process."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.stderr_path = data_dir.parent / f"supervisor-{time.monotonic_ns()}.err"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        """Start it and return the bootstrap servers from its one stdout line."""
        with self.stderr_path.open("wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "raftlog", "cluster", "up", "--nodes", "3",
                 "--data-dir", str(self.data_dir), "--port-base", "0"],
                stdout=subprocess.PIPE, stderr=err,
            )
        assert self.process.stdout is not None
        os.set_blocking(self.process.stdout.fileno(), False)
        deadline = time.monotonic() + UP_TIMEOUT_S
        buffer = b""
        while b"\n" not in buffer:
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise AssertionError(f"no bootstrap line:\n{self.stderr()}")
            chunk = self.process.stdout.read()
            if chunk:
                buffer += chunk
            else:
                time.sleep(0.05)
        line, _, rest = buffer.partition(b"\n")
        assert rest == b"", f"more than one line on stdout: {buffer!r}"
        text = line.decode()
        assert text.startswith("bootstrap.servers="), text
        return text.removeprefix("bootstrap.servers=")

    def stop(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(STOP_TIMEOUT_S)
        assert self.process.stdout is not None
        extra = self.process.stdout.read() or b""
        assert extra == b"", f"unexpected stdout after the bootstrap line: {extra!r}"
        return code

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-6000:]

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def http_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return str(response.read().decode())


def node_pids(data_dir: Path) -> list[int]:
    """Pids of live processes whose command line names this cluster's configs."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(data_dir).encode() in cmdline and b"server.properties" in cmdline:
            state = (entry / "stat").read_text().split()[2] if (entry / "stat").exists() else ""
            if state != "Z":
                pids.append(int(entry.name))
    return pids


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Supervisor]:
    data_dir = tmp_path / "cluster"
    process = Supervisor(data_dir)
    try:
        yield process
    finally:
        process.kill()
        for pid in node_pids(data_dir):
            os.kill(pid, signal.SIGKILL)


def produce(bootstrap: str, topic: str, count: int, start: int = 0) -> dict[bytes, tuple[int, int]]:
    from confluent_kafka import KafkaError, Message, Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "log_level": 2,
                         "linger.ms": 5, "enable.idempotence": False})
    acknowledged: dict[bytes, tuple[int, int]] = {}
    failures: list[KafkaError] = []

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            failures.append(error)
            return
        value, partition, offset = message.value(), message.partition(), message.offset()
        assert value is not None and partition is not None and offset is not None
        acknowledged[value] = (partition, offset)

    for i in range(start, start + count):
        producer.produce(topic, key=b"k%d" % (i % 97), value=b"v%06d" % i,
                         on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert not failures, failures[:3]
    return acknowledged


def consume_all(bootstrap: str, topic: str, expected: int) -> list[tuple[int, int, bytes]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "raftlog-assign-only",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "log_level": 2})
    out: list[tuple[int, int, bytes]] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 30
        while len(out) < expected and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=1000, timeout=0.5):
                assert message.error() is None, message.error()
                partition, offset, value = message.partition(), message.offset(), message.value()
                assert partition is not None and offset is not None and value is not None
                out.append((partition, offset, value))
    finally:
        consumer.close()
    return out


def test_cluster_up_serves_replicated_topics_and_restarts_as_the_same_cluster(
    supervisor: Supervisor,
) -> None:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    bootstrap = supervisor.start()
    assert len(bootstrap.split(",")) == 3
    layout = json.loads((supervisor.data_dir / "cluster.json").read_text())
    assert (supervisor.data_dir / "raft.secret").stat().st_mode & 0o077 == 0

    topic = unique_topic("cluster-up")
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
    admin.create_topics([NewTopic(topic, PARTITIONS, 3)], request_timeout=15)[topic].result(30)
    metadata = admin.list_topics(topic, timeout=10)
    for partition in metadata.topics[topic].partitions.values():
        assert sorted(partition.replicas) == [1, 2, 3]
    # Leaders are spread over the nodes, not all on one.
    assert len({p.leader for p in metadata.topics[topic].partitions.values()}) > 1

    acknowledged = produce(bootstrap, topic, RECORDS)
    consumed = consume_all(bootstrap, topic, RECORDS)
    assert sorted(v for _, _, v in consumed) == sorted(acknowledged)

    # Every node serves metrics and health; the supervisor printed the URLs on stderr.
    metrics_ports = layout["metrics_ports"]
    assert len(metrics_ports) == 3
    for node_id, port in enumerate(metrics_ports, start=1):
        assert f"node {node_id} metrics: http://127.0.0.1:{port}/metrics" in supervisor.stderr()
        assert http_status(f"http://127.0.0.1:{port}/health/ready") == 200
    scraped = http_text(f"http://127.0.0.1:{metrics_ports[0]}/metrics")
    assert 'kafka_network_requestmetrics_requests_total{request="Metadata"}' in scraped
    cluster_id = layout["cluster_id"]
    assert f'raftlog_node_info{{cluster_id="{cluster_id}",node_id="1"' in scraped

    status = subprocess.run(
        [sys.executable, "-m", "raftlog", "quorum", "status", "--bootstrap-server", bootstrap],
        capture_output=True, text=True, timeout=30, check=True,
    )
    assert "CurrentVoters:    [1,2,3]" in status.stdout, status.stdout
    assert f"ClusterId:        {layout['cluster_id']}" in status.stdout

    pids = node_pids(supervisor.data_dir)
    assert len(pids) == 3
    started = time.monotonic()
    assert supervisor.stop() == 0
    stop_s = time.monotonic() - started
    wait_until(lambda: not node_pids(supervisor.data_dir), 5, "every node to exit")
    logs = [(supervisor.data_dir / f"node-{i}" / "server.log").read_text() for i in (1, 2, 3)]
    assert all("stopped" in text for text in logs)

    # Same directory: same ports, same cluster id, same data.
    again = Supervisor(supervisor.data_dir)
    supervisor.process = None
    try:
        assert again.start() == bootstrap
        assert json.loads((supervisor.data_dir / "cluster.json").read_text()) == layout
        consumed = consume_all(bootstrap, topic, RECORDS)
        assert sorted(v for _, _, v in consumed) == sorted(acknowledged)
        more = produce(bootstrap, topic, 100, start=RECORDS)
        assert len(more) == 100
        assert again.stop() == 0
    finally:
        again.kill()
    print(f"clean stop of 3 nodes took {stop_s:.2f} s")


def test_cluster_up_refuses_a_different_node_count(tmp_path: Path) -> None:
    data_dir = tmp_path / "cluster"
    data_dir.mkdir()
    (data_dir / "cluster.json").write_text(json.dumps(
        {"nodes": 3, "kafka_ports": [1, 2, 3], "controller_ports": [4, 5, 6],
         "cluster_id": "abc"}))
    result = subprocess.run(
        [sys.executable, "-m", "raftlog", "cluster", "up", "--nodes", "5", "--data-dir",
         str(data_dir)], capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 2
    assert "3-node cluster" in result.stderr
    assert result.stdout == ""


def test_cluster_up_fails_fast_when_a_node_cannot_start(tmp_path: Path) -> None:
    from raftlog.tools.cluster import prepare

    data_dir = tmp_path / "cluster"
    prepare(data_dir, 3, 0)
    (data_dir / "node-2" / "data").write_text("not a directory")
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "raftlog", "cluster", "up", "--data-dir", str(data_dir),
         "--ready-timeout", "60"], capture_output=True, text=True, timeout=90,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert "node 2 exited" in result.stderr
    assert time.monotonic() - started < 30
    assert not node_pids(data_dir)
