"""Every metric family docs/metrics.md lists is on a live node's ``/metrics``, with HELP text,
the documented type and labels, after the traffic that creates the lazy ones: produce, a
consumer group that consumes and commits, a committed and an aborted transaction.

One real single combined node (``metrics.listener`` and both opt-in properties on), so the
per-partition and per-partition-lag families appear too; the controller families appear with
their values as this node is the active controller.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import BrokerProcess, free_port
from tests.integration.helpers import create_topic, unique_topic, wait_until
from tests.integration.metrics_http import (
    PROMETHEUS_TYPE,
    documented_families,
    exported_sample_names,
    get,
    sample_value,
    scrape,
)

confluent_kafka = pytest.importorskip("confluent_kafka")

READY_TIMEOUT_S = 60.0
# Labelled families that have no sample on a healthy single node: no followers to lag (the
# per-replica families), no quorum failures.
NO_SAMPLES_ALLOWED = {"raftlog_replica_lag_messages", "raftlog_replica_lag_seconds",
                      "raftlog_quorum_errors",
                      # No SASL listener and no authorizer here: test_acls.py checks these.
                      "kafka_server_socketservermetrics_successful_authentication",
                      "kafka_server_socketservermetrics_failed_authentication",
                      "kafka_server_authorizermetrics_authorization_denied"}


@pytest.fixture
def metrics_node(tmp_path: Path) -> Iterator[BrokerProcess]:
    port = free_port()
    node = BrokerProcess(tmp_path, extra_properties={
        "metrics.listener": f"http://127.0.0.1:{port}",
        "metrics.partition.detail.enable": "true",
        "metrics.consumer.group.lag.partition.enable": "true",
    })
    node.metrics_port = port  # type: ignore[attr-defined]
    node.start()
    try:
        wait_until(lambda: _status(port, "/health/ready") == 200, READY_TIMEOUT_S,
                   "/health/ready to answer 200")
        yield node
    finally:
        node.stop()


def _status(port: int, path: str) -> int | None:
    try:
        return get("127.0.0.1", port, path, timeout_s=2.0)[0]
    except OSError:
        return None


def _traffic(bootstrap: str, topic: str, group: str) -> None:
    """Produce, consume and commit in a group, one committed and one aborted transaction."""
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(100):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i)
    assert producer.flush(30) == 0
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "session.timeout.ms": 6000})
    try:
        consumer.subscribe([topic])
        seen = 0
        deadline = time.monotonic() + 60
        while seen < 60:  # part of the topic only: the group has lag
            assert time.monotonic() < deadline, f"consumed {seen} records"
            for message in consumer.consume(10, 0.5):
                if message.error() is None:
                    seen += 1
            if seen:
                consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    txn = confluent_kafka.Producer({"bootstrap.servers": bootstrap,
                                    "transactional.id": unique_topic("families-txn")})
    txn.init_transactions(30)
    txn.begin_transaction()
    txn.produce(topic, value=b"committed")
    txn.commit_transaction(30)
    txn.begin_transaction()
    txn.produce(topic, value=b"aborted")
    assert txn.flush(30) == 0  # written, so the abort has a partition to write markers to
    txn.abort_transaction(30)


def _problems(families: dict[str, Any], topic: str, group: str) -> list[str]:
    problems = []
    for name, (kind, labels) in documented_families().items():
        family = families.get(name)
        if family is None:
            problems.append(f"{name}: missing")
            continue
        if family.type != PROMETHEUS_TYPE[kind]:
            problems.append(f"{name}: type {family.type}, documented {PROMETHEUS_TYPE[kind]}")
        if not family.documentation.strip():
            problems.append(f"{name}: no HELP text")
        samples = family.samples
        names = {s.name for s in samples}
        if not samples:
            if name not in NO_SAMPLES_ALLOWED:
                problems.append(f"{name}: no samples")
            continue
        if not labels and not exported_sample_names(name, kind) <= names:
            problems.append(f"{name}: samples {sorted(names)}")
        for sample in samples:
            extra = set(sample.labels) - set(labels) - {"le"}
            if extra or set(labels) - set(sample.labels):
                problems.append(f"{name}: labels {sorted(sample.labels)}, documented {labels}")
                break
    expected = [
        ("kafka_network_requestmetrics_requests_total", {"request": "Produce"}),
        ("kafka_network_requestmetrics_requests_total", {"request": "FetchConsumer"}),
        ("kafka_network_requestmetrics_requests_total", {"request": "OffsetCommit"}),
        ("kafka_network_requestmetrics_errors_total", {"request": "Produce", "error": "NONE"}),
        ("kafka_network_requestmetrics_totaltimems_count", {"request": "Produce"}),
        ("kafka_server_brokertopicmetrics_messagesin_total", {"topic": topic}),
        ("kafka_server_brokertopicmetrics_bytesin_total", {"topic": topic}),
        ("kafka_server_brokertopicmetrics_bytesout_total", {"topic": topic}),
        ("kafka_log_log_logendoffset", {"topic": topic, "partition": "0"}),
        ("kafka_cluster_partition_highwatermark", {"topic": topic, "partition": "0"}),
        ("kafka_consumergroup_lag_sum", {"group": group}),
        ("kafka_consumergroup_lag_max", {"group": group}),
        ("kafka_consumergroup_lag", {"group": group, "topic": topic, "partition": "0"}),
        ("raftlog_txn_completed_total", {"result": "commit"}),
        ("raftlog_txn_completed_total", {"result": "abort"}),
        ("raftlog_node_info", {"node_id": "1"}),
    ]
    for sample_name, labels in expected:
        value = sample_value(families, sample_name, **labels)
        if value is None or (value <= 0 and sample_name.endswith(("_total", "_count"))):
            problems.append(f"{sample_name}{labels}: {value}")
    positive = ["kafka_controller_kafkacontroller_activecontrollercount",
                "kafka_controller_kafkacontroller_globaltopiccount",
                "kafka_controller_kafkacontroller_activebrokercount",
                "kafka_server_replicamanager_leadercount"]
    problems.extend(f"{name}: {sample_value(families, name)}" for name in positive
                    if not (sample_value(families, name) or 0) > 0)
    return problems


def test_every_documented_family_is_exported_with_help(metrics_node: BrokerProcess) -> None:
    port: int = metrics_node.metrics_port  # type: ignore[attr-defined]
    topic, group = unique_topic("families"), unique_topic("families-group")
    create_topic(metrics_node.bootstrap, topic, 2)
    _traffic(metrics_node.bootstrap, topic, group)
    assert len(documented_families()) > 60
    last: list[str] = []

    def complete() -> bool:
        nonlocal last
        last = _problems(scrape("127.0.0.1", port), topic, group)
        return not last

    try:
        wait_until(complete, 30, "every documented family")
    except AssertionError:
        raise AssertionError("\n".join(last)) from None
    assert _status(port, "/health/live") == 200
