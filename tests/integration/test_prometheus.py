"""Debian's Prometheus server scraping a real 3-node cluster through a SIGKILL under load.

The test runs its own ``prometheus`` process (``make apt-test`` installs the Debian package, as
it does kcat) on 127.0.0.1 with a 1 s scrape interval, pointed at every node's
``metrics.listener``, and asks Prometheus's HTTP API (``/api/v1/query``) what it saw:

* the active-controller count summed over the nodes is 1 before and after the fault;
* with a producer (acks=all) writing to an RF=3 topic, SIGKILL of a node: its ``up`` goes to
  0, the under-replicated partitions summed over the live nodes go above 0, and back to 0
  once the node is restarted and has caught up; Produce requests keep being counted;
* a consumer group that stops consuming while the producer goes on shows a growing
  ``kafka_consumergroup_lag_sum``; once it resumes and commits up to the end, the lag is 0.

Every wait is on a condition with a deadline; Prometheus's view trails the cluster by up to
a scrape interval plus the query's evaluation.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from raftlog.config.properties import load_properties
from tests.integration.cluster_harness import (
    Cluster,
    ClusterNode,
    stop_cluster,
    wait_for,
    wait_until,
)
from tests.integration.helpers import unique_topic
from tests.integration.test_cluster_failover import BackgroundProducer, create_topic

confluent_kafka = pytest.importorskip("confluent_kafka")

PARTITIONS = 6
DEADLINE_S = 120.0  # generous: a 2-core box shared with other test processes
SCRAPE_INTERVAL = "1s"
PROMETHEUS_START_TIMEOUT_S = 60.0


def _prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    if binary is None:
        message = ("the prometheus binary is missing: `make apt-test` installs Debian's "
                   "prometheus package")
        if os.geteuid() == 0:  # CI: the set-up installs it, so its absence is a failure
            pytest.fail(message)
        pytest.skip(message)
    return binary


@dataclass
class Prometheus:
    """One ``prometheus`` server process of this test, on 127.0.0.1."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @classmethod
    def start(cls, directory: Path, targets: dict[int, str]) -> Prometheus:
        directory.mkdir(parents=True)
        config = {
            "global": {"scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": "900ms",
                       "evaluation_interval": SCRAPE_INTERVAL},
            "scrape_configs": [{
                "job_name": "raftlog",
                "static_configs": [{"targets": [target], "labels": {"node": str(node_id)}}
                                   for node_id, target in sorted(targets.items())],
            }],
        }
        (directory / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        port = ClusterNode.free_port()
        log_path = directory / "prometheus.log"
        with log_path.open("ab") as out:
            process = subprocess.Popen(
                [_prometheus_binary(), f"--config.file={directory / 'prometheus.yml'}",
                 f"--storage.tsdb.path={directory / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle",
                 "--storage.tsdb.retention.time=1h", "--log.level=warn"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=directory,
            )  # fmt: skip
        prometheus = cls(process, port, log_path)
        try:
            wait_until(prometheus.ready, PROMETHEUS_START_TIMEOUT_S, "prometheus to be ready",
                       interval_s=0.2)
        except BaseException:
            prometheus.stop()
            raise
        return prometheus

    def _get(self, path: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}",
                                        timeout=timeout_s) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited:\n{self.log()}")
        try:
            return self._get("/-/ready", 2.0)[0] == 200
        except OSError:
            return False

    def query(self, promql: str) -> list[tuple[dict[str, str], float]]:
        """An instant query: ``(labels, value)`` per series of the result vector."""
        status, body = self._get("/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        answer = json.loads(body)
        assert status == 200 and answer["status"] == "success", (promql, answer)
        result = answer["data"]
        if result["resultType"] == "scalar":
            return [({}, float(result["result"][1]))]
        return [(series["metric"], float(series["value"][1])) for series in result["result"]]

    def value(self, promql: str) -> float | None:
        """The single value of an aggregated query, or None while it has no series."""
        series = self.query(promql)
        assert len(series) <= 1, (promql, series)
        return series[0][1] if series else None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _metrics_target(node: ClusterNode) -> str:
    """``host:port`` of ``node``'s metrics listener (``prepare`` gives every node one)."""
    listener = load_properties(node.directory / "server.properties")["metrics.listener"]
    return urllib.parse.urlsplit(listener).netloc


@pytest.fixture
def monitored(tmp_path: Path) -> Iterator[tuple[Cluster, Prometheus, dict[int, str]]]:
    _prometheus_binary()
    cluster = Cluster.create(tmp_path / "cluster")
    targets = {node_id: _metrics_target(node) for node_id, node in cluster.nodes.items()}
    prometheus: Prometheus | None = None
    try:
        # Prometheus first: it scrapes its first targets ~5 s after it starts (its discovery
        # manager batches target updates), which overlaps with the cluster's start-up.
        prometheus = Prometheus.start(tmp_path / "prometheus", targets)
        cluster.start_all()
        cluster.wait_ready()
        yield cluster, prometheus, targets
    finally:
        if prometheus is not None:
            prometheus.stop()
            if os.environ.get("RAFTLOG_SHOW_BROKER_LOG"):
                print(f"----- prometheus -----\n{prometheus.log()}")
        stop_cluster(cluster)


def _await(prometheus: Prometheus, promql: str, accept: Callable[[float | None], bool],
           what: str, timeout_s: float = DEADLINE_S) -> float | None:
    """Polls the query until ``accept(value)``; returns that value."""
    seen: list[float | None] = []

    def check() -> bool:
        seen.append(prometheus.value(promql))
        return accept(seen[-1])

    try:
        wait_until(check, timeout_s, what, interval_s=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; `{promql}` was {seen[-10:]}") from None
    return seen[-1]


class GroupConsumer:
    """A confluent-kafka member of one group with manual commits, driven from the test."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.consumer: Any = confluent_kafka.Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "session.timeout.ms": 30_000,
            "max.poll.interval.ms": 600_000, "log_level": 2})
        self.consumer.subscribe([topic])
        self.topic = topic
        self.consumed = 0

    def consume_and_commit(self, until: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not until():
            assert time.monotonic() < deadline, f"timed out consuming until {what}"
            messages = [m for m in self.consumer.consume(500, 0.3) if m.error() is None]
            self.consumed += len(messages)
            if messages:
                self.consumer.commit(asynchronous=False)

    def caught_up(self, ends: dict[int, int]) -> bool:
        """Every partition's committed offset is at its end offset."""
        committed = self.consumer.committed(
            [confluent_kafka.TopicPartition(self.topic, p) for p in ends], timeout=10)
        return all(tp.offset == ends[tp.partition] for tp in committed)

    def close(self) -> None:
        self.consumer.close()


def _end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition's high watermark. A leader elected a moment ago answers
    OFFSET_NOT_AVAILABLE until its high watermark has caught up (as Kafka's does, KIP-207),
    which a busy machine stretches out after the restart: asked again, as clients do."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap,
                                         "group.id": "prometheus-test-offsets", "log_level": 2})

    def high(partition: int) -> int | None:
        try:
            _, end = consumer.get_watermark_offsets(
                confluent_kafka.TopicPartition(topic, partition), timeout=10)
        except confluent_kafka.KafkaException as exc:
            if exc.args[0].retriable() or exc.args[0].code() in (
                    confluent_kafka.KafkaError.OFFSET_NOT_AVAILABLE,
                    confluent_kafka.KafkaError.NOT_LEADER_FOR_PARTITION):
                return None
            raise
        return int(end)

    try:
        return {p: wait_for(functools.partial(high, p), DEADLINE_S, f"{topic}-{p}'s end offset")
                for p in range(PARTITIONS)}
    finally:
        consumer.close()


def test_prometheus_sees_a_sigkill_and_consumer_lag(
    monitored: tuple[Cluster, Prometheus, dict[int, str]],
) -> None:
    cluster, prometheus, targets = monitored
    topic, group = unique_topic("prom"), unique_topic("prom-group")
    urp = "sum(kafka_server_replicamanager_underreplicatedpartitions)"
    active = "sum(kafka_controller_kafkacontroller_activecontrollercount)"
    produce_requests = 'sum(kafka_network_requestmetrics_requests_total{request="Produce"})'
    lag = f'sum(kafka_consumergroup_lag_sum{{group="{group}"}})'
    all_up = 'sum(up{job="raftlog"})'

    _await(prometheus, all_up, lambda v: v == 3, "Prometheus to scrape all three nodes")
    _await(prometheus, active, lambda v: v == 1, "one active controller")
    create_topic(cluster, topic, PARTITIONS)
    _await(prometheus, urp, lambda v: v == 0, "no under-replicated partitions")
    produced_before = prometheus.value(produce_requests) or 0.0

    consumer = GroupConsumer(cluster.bootstrap, group, topic)
    try:
        with BackgroundProducer(cluster.bootstrap, topic, interval_s=0.004) as producer:
            wait_until(lambda: len(producer.acknowledged) > 300, 60, "records acknowledged")
            # The group consumes and commits, then stops consuming; the producer goes on.
            consumer.consume_and_commit(lambda: consumer.consumed >= 200, "200 records")
            first = _await(prometheus, lag, lambda v: v is not None and v > 0,
                           "the stopped group to show lag")
            second = _await(prometheus, lag, lambda v: v is not None and v > (first or 0),
                            "the lag to grow")
            third = _await(prometheus, lag, lambda v: v is not None and v > (second or 0),
                           "the lag to grow again")
            _await(prometheus, produce_requests, lambda v: (v or 0) > produced_before,
                   "Produce requests to be counted")

            # SIGKILL of a broker that is not the active controller, under load.
            controller = cluster.quorum_leader()
            assert controller is not None
            victim = next(n for n in sorted(cluster.nodes) if n != controller)
            cluster.nodes[victim].kill()
            killed_up = f'up{{job="raftlog",instance="{targets[victim]}"}}'
            _await(prometheus, killed_up, lambda v: v == 0, "the killed node's up to be 0")
            under = _await(prometheus, urp, lambda v: v is not None and v > 0,
                           "under-replicated partitions after the kill")
            _await(prometheus, active, lambda v: v == 1, "one active controller during the fault")
            acked = len(producer.acknowledged)
            wait_until(lambda: len(producer.acknowledged) > acked + 100, DEADLINE_S,
                       "producing to continue without the killed node")
            _await(prometheus,
                   'sum(increase(kafka_network_requestmetrics_requests_total'
                   '{request="Produce"}[15s]))',
                   lambda v: v is not None and v > 0, "Produce requests to increase")

            cluster.nodes[victim].start()
            cluster.nodes[victim].wait_listening()
            _await(prometheus, killed_up, lambda v: v == 1, "the restarted node's up to be 1")
            _await(prometheus, urp, lambda v: v == 0,
                   "no under-replicated partitions after the restart")
            _await(prometheus, all_up, lambda v: v == 3, "all three nodes scraped")
            _await(prometheus, active, lambda v: v == 1, "one active controller after")
        assert not producer.failures, producer.failures[:3]

        # The producer has stopped: the group resumes, commits to the end, and its lag is 0.
        ends = _end_offsets(cluster.bootstrap, topic)
        assert sum(ends.values()) >= len(producer.acknowledged)
        consumer.consume_and_commit(lambda: consumer.caught_up(ends), "the end offsets")
        _await(prometheus, lag, lambda v: v == 0, "the resumed group's lag to return to 0")
    finally:
        consumer.close()
    cluster.check_logs()
    print(f"killed node {victim}: {under:.0f} under-replicated partitions, back to 0 after the "
          f"restart; stopped group's lag {first:.0f} -> {second:.0f} -> {third:.0f}, then 0")
