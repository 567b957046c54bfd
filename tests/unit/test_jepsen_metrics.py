"""The harness's view of the nodes' metrics: what it keeps of a scrape, the series it plots
(under-replicated partitions summed over the nodes, Produce latency quantiles from the nodes'
histogram buckets), the plot itself, and the scraper against a real HTTP server and a dead
port."""

from __future__ import annotations

import http.server
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from jepsen.history import History, HistoryBuilder
from jepsen.metrics import (
    Sample,
    histogram_quantile,
    latency_series,
    missing,
    read_samples,
    select,
    summary,
    under_replicated_series,
)
from jepsen.scrape import Scraper

BOUNDS = (1.0, 5.0, 10.0, 50.0, 100.0)


def _body(urp: float, produce_ms: list[float], fetch_ms: list[float] = ()) -> str:  # type: ignore[assignment]
    """A /metrics body in prometheus_client's own exposition format."""
    registry = CollectorRegistry()
    Gauge("kafka_server_replicamanager_underreplicatedpartitions", "urp",
          registry=registry).set(urp)
    Gauge("kafka_controller_kafkacontroller_activecontrollercount", "active",
          registry=registry).set(1)
    total = Histogram("kafka_network_requestmetrics_totaltimems", "total", ["request"],
                      buckets=BOUNDS, registry=registry)
    for ms in produce_ms:
        total.labels("Produce").observe(ms)
    for ms in fetch_ms:
        total.labels("FetchConsumer").observe(ms)
    return generate_latest(registry).decode()


def test_select_keeps_the_gauges_and_the_produce_histogram_only() -> None:
    values = select(_body(3, [0.5, 2, 2, 70], fetch_ms=[900.0]))
    assert values["urp"] == 3 and values["controller"] == 1
    assert values["produce_count"] == 4 and values["produce_sum"] == pytest.approx(74.5)
    assert values["produce_buckets"] == [[1.0, 1], [5.0, 3], [10.0, 3], [50.0, 3], [100.0, 4],
                                         ["+Inf", 4]]
    assert select("# HELP x y\ngarbage line\n") == {}


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    buckets = [(1.0, 10.0), (5.0, 90.0), (10.0, 100.0), (math.inf, 100.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(1 + 4 * (50 - 10) / 80)
    assert histogram_quantile(0.99, buckets) == pytest.approx(5 + 5 * (99 - 90) / 10)
    assert histogram_quantile(0.05, buckets) == pytest.approx(0.5)
    # The rank in +Inf: the highest finite bound, as Prometheus answers.
    assert histogram_quantile(0.99, [(1.0, 1.0), (math.inf, 10.0)]) == 1.0
    assert histogram_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]) is None


def _sample(t: float, node: int, urp: float, produce_ms: list[float]) -> Sample:
    return Sample(t, node, True, select(_body(urp, produce_ms)))


def test_series_sum_live_nodes_and_rate_the_buckets_per_interval() -> None:
    samples = [
        _sample(0.1, 1, 0, [2.0] * 10), _sample(0.2, 2, 0, [2.0] * 5),
        # second 1: node 1 answered 90 fast produces, node 2 ten slow ones
        _sample(1.1, 1, 2, [2.0] * 100), _sample(1.2, 2, 1, [2.0] * 5 + [70.0] * 10),
        # second 2: node 2 is down; node 1 reports 4 under-replicated partitions
        _sample(2.1, 1, 4, [2.0] * 100 + [7.0] * 10), Sample(2.2, 2, False, error="refused"),
        # second 3: node 2 restarted (its counters start again): that interval is skipped
        _sample(3.1, 1, 0, [2.0] * 100 + [7.0] * 10), _sample(3.2, 2, 0, [2.0]),
    ]
    assert under_replicated_series(samples) == [(0.0, 0.0, 2), (1.0, 3.0, 2), (2.0, 4.0, 1),
                                                (3.0, 0.0, 2)]
    series = latency_series(samples)
    assert [t for t, _, _ in series] == [1.0, 2.0]
    _, q1, n1 = series[0]
    assert n1 == 100 and q1[0.5] <= 5.0 and 50.0 < q1[0.99] <= 100.0
    _, q2, n2 = series[1]
    assert n2 == 10 and 5.0 < q2[0.5] <= 10.0
    assert missing(samples) == [(2.2, 2)]
    stats = summary(samples)
    assert stats["scrapes"] == 8 and stats["missed"] == 1
    assert stats["under_replicated_max"] == 4.0 and stats["under_replicated_at_end"] == 0.0


def test_samples_round_trip_through_the_file(tmp_path: Path) -> None:
    samples = [_sample(0.5, 1, 1, [3.0]), Sample(1.5, 2, False, error="timed out")]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(s.to_json() + "\n" for s in samples) + '{"t": 2, "no')
    back = read_samples(path)
    assert [(s.t, s.node, s.ok, s.error) for s in back] == [(0.5, 1, True, None),
                                                            (1.5, 2, False, "timed out")]
    assert back[0].buckets()[-1] == (math.inf, 1.0)
    assert read_samples(tmp_path / "absent.jsonl") == []


def _history() -> History:
    b = HistoryBuilder()
    for i in range(20):
        b.invoke(i, "send", [["send", "k", i]], time=i * 200_000_000)
        b.ok(i, "send", [["send", "k", [i, i]]], time=i * 200_000_000 + 5_000_000)
    b.invoke("nemesis", "start-kill", None, time=1_000_000_000)
    b.info("nemesis", "start-kill", None, time=1_000_000_000)
    b.invoke("nemesis", "stop-kill", None, time=2_500_000_000)
    b.info("nemesis", "stop-kill", None, time=2_500_000_000)
    return History(b.ops)


def test_metrics_plot_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from jepsen.plots import write_metrics_plot

    samples = [_sample(t / 2, node, t % 3, [2.0] * (t * 10 + node) + [60.0] * t)
               for t in range(8) for node in (1, 2, 3)]
    samples.append(Sample(1.7, 2, False, error="refused"))
    assert write_metrics_plot(_history(), samples, tmp_path) == ["metrics.png"]
    assert (tmp_path / "metrics.png").stat().st_size > 1000
    assert write_metrics_plot(_history(), [], tmp_path / "none") == []


class _Handler(http.server.BaseHTTPRequestHandler):
    body = _body(2, [1.5, 3.0]).encode()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_scraper_records_answers_and_missing_nodes(tmp_path: Path, server: int) -> None:
    import socket

    with socket.socket() as sock:  # a port nobody listens on: a killed node
        sock.bind(("127.0.0.1", 0))
        dead = int(sock.getsockname()[1])
    path = tmp_path / "metrics.jsonl"
    start_ns = time.monotonic_ns()
    scraper = Scraper({1: ("127.0.0.1", server), 2: ("127.0.0.1", dead)}, path, start_ns,
                      interval_s=0.1, timeout_s=0.1).start()
    deadline = time.monotonic() + 30
    while scraper.counts["ok"] < 3 or scraper.counts["missed"] < 3:
        assert time.monotonic() < deadline, scraper.counts
        time.sleep(0.05)
    scraper.stop()
    samples = read_samples(path)
    assert {s.node for s in samples if s.ok} == {1}
    assert {s.node for s in samples if not s.ok} == {2}
    assert all(s.values["urp"] == 2 and s.values["produce_count"] == 2 for s in samples if s.ok)
    assert all(s.t >= 0 for s in samples)
    written = len(samples)
    time.sleep(0.3)
    assert len(read_samples(path)) == written, "the scraper wrote after stop()"
