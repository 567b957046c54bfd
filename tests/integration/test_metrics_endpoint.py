"""The metrics and health endpoint of a real node process (``metrics.listener``), scraped
after confluent-kafka produced and consumed through it."""

from __future__ import annotations

import re
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import confluent_consume, create_topic, unique_topic, wait_until

DEADLINE_S = 60.0
RECORDS = 2000
SCRAPES = 20


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def scrape(base: str) -> tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    status, text = get(base + "/metrics")
    assert status == 200, text
    samples = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in text_string_to_metric_families(text) for sample in family.samples}
    return text, samples


@pytest.fixture
def metrics_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    # Port 0: the node binds a free port and logs the URL.
    process = BrokerProcess(tmp_path, extra_properties={"metrics.listener": "http://127.0.0.1:0"})
    process.start()
    try:
        yield process
    finally:
        process.stop()


def metrics_base(broker: BrokerProcess) -> str:
    found: list[str] = []

    def logged() -> bool:
        match = re.search(r"metrics on (http://127\.0\.0\.1:\d+)/metrics",
                          broker.log_path.read_text())
        if match:
            found.append(match.group(1))
        return bool(match)

    wait_until(logged, DEADLINE_S, "the metrics URL in the server log")
    return found[0]


def test_a_node_exports_request_metrics_and_health(metrics_broker: BrokerProcess) -> None:
    from confluent_kafka import Producer

    base = metrics_base(metrics_broker)
    assert get(base + "/health/live")[0] == 200
    wait_until(lambda: get(base + "/health/ready")[0] == 200, DEADLINE_S, "/health/ready 200")
    _, before = scrape(base)
    produce_key = ("kafka_network_requestmetrics_requests_total", (("request", "Produce"),))
    produced_before = before.get(produce_key, 0.0)

    topic = unique_topic("metrics")
    create_topic(metrics_broker.bootstrap, topic, partitions=2)
    producer = Producer({"bootstrap.servers": metrics_broker.bootstrap, "acks": "all",
                         "linger.ms": 5, "log_level": 2})
    for i in range(RECORDS):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i)
        producer.poll(0)
    assert producer.flush(DEADLINE_S) == 0
    consumed = confluent_consume(metrics_broker.bootstrap, topic, [0, 1])
    assert len(consumed) == RECORDS

    # The loop monitor records once per 100 ms: wait for its first record, so the scrape
    # below sees every family with a value whatever the machine's speed.
    wait_until(lambda: scrape(base)[1].get(("raftlog_event_loop_lag_ms_count", ()), 0) > 0,
               DEADLINE_S, "an event-loop lag observation")
    text, samples = scrape(base)
    assert samples[produce_key] > produced_before
    prefix = "kafka_network_requestmetrics_"
    for request in ("Produce", "FetchConsumer", "Metadata", "ApiVersions"):
        assert samples[(prefix + "requests_total", (("request", request),))] > 0, request
    for stage in ("requestqueuetimems", "localtimems", "remotetimems", "responsequeuetimems",
                  "responsesendtimems", "totaltimems"):
        count = samples[(prefix + stage + "_count", (("request", "Produce"),))]
        assert count == samples[produce_key], stage
        assert samples[(prefix + stage + "_bucket", (("le", "+Inf"), ("request", "Produce")))] \
            == count
        assert f"# HELP {prefix}{stage} " in text
        assert f"# TYPE {prefix}{stage} histogram" in text
    assert_positive(samples, (prefix + "errors_total", (("error", "NONE"), ("request", "Produce"))))
    # acks=all waits for the fsync: the produce's remote part is not always zero.
    assert_positive(samples, (prefix + "remotetimems_sum", (("request", "Produce"),)))
    creations = ("kafka_server_socketservermetrics_connection_creation_total",
                 (("listener", "PLAINTEXT"),))
    assert_positive(samples, creations)
    assert ("kafka_server_socketservermetrics_connection_count",
            (("listener", "PLAINTEXT"),)) in samples
    assert samples[("raftlog_node_info", (("cluster_id", ""), ("node_id", "1"),
                                          ("roles", "broker,controller")))] == 1
    assert_positive(samples, ("raftlog_event_loop_lag_ms_count", ()))
    assert_positive(samples, ("process_cpu_seconds_total", ()))
    assert_positive(samples, ("process_open_fds", ()))
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            family = re.sub(r"_(bucket|count|sum|total|created)$", "", name)
            assert f"# HELP {family} " in text or f"# HELP {name} " in text, name

    assert get(base + "/health/live")[0] == 200
    assert get(base + "/health/ready")[0] == 200
    assert get(base + "/nothing")[0] == 404

    durations = []
    for _ in range(SCRAPES):
        started = time.perf_counter()
        assert get(base + "/metrics")[0] == 200
        durations.append(time.perf_counter() - started)
    print(f"scrape of {len(text)} bytes: median {statistics.median(durations) * 1000:.1f} ms, "
          f"max {max(durations) * 1000:.1f} ms over {SCRAPES} scrapes")


def assert_positive(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float],
                    key: tuple[str, tuple[tuple[str, str], ...]]) -> None:
    assert samples.get(key, 0.0) > 0, f"{key} is {samples.get(key)}"
