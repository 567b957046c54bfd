"""`raftlog top`: rendering is a pure function of two parsed samples; scraping is urllib."""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from raftlog.cli import main
from raftlog.tools.top import (
    Sample,
    TopError,
    metrics_urls,
    parse_sample,
    quantile,
    render,
    run_top,
    scrape,
)

BOUNDS = ("1.0", "5.0", "10.0", "+Inf")


def node_text(node_id: int, *, role: str, controller: bool, produce: int, fetch: int,
              bytes_in: int, produce_buckets: tuple[int, ...], lags: dict[str, int],
              urp: int = 0) -> str:
    """A node's /metrics as the collectors expose it (the names of docs/metrics.md)."""
    lines = [
        f'raftlog_node_info{{node_id="{node_id}",cluster_id="c",roles="broker,controller"}} 1',
        *(f'kafka_server_raft_metrics_current_state{{state="{s}"}} {int(s == role)}'
          for s in ("leader", "follower", "candidate", "observer")),
        f"kafka_controller_kafkacontroller_activecontrollercount {int(controller)}",
        f"kafka_controller_kafkacontroller_offlinepartitionscount {1 if controller else 0}",
        f"kafka_controller_kafkacontroller_activebrokercount {3 if controller else 0}",
        f"kafka_controller_kafkacontroller_fencedbrokercount {1 if controller else 0}",
        "kafka_server_replicamanager_partitioncount 12",
        f"kafka_server_replicamanager_leadercount {4 + node_id}",
        f"kafka_server_replicamanager_underreplicatedpartitions {urp}",
        "kafka_server_replicamanager_underminisrpartitioncount 0",
        f'kafka_network_requestmetrics_requests_total{{request="Produce"}} {produce}',
        f'kafka_network_requestmetrics_requests_total{{request="FetchConsumer"}} {fetch}',
        f'kafka_network_requestmetrics_requests_total{{request="FetchFollower"}} {10 * fetch}',
        f'kafka_server_brokertopicmetrics_bytesin_total{{topic="t"}} {bytes_in}',
        f'kafka_server_brokertopicmetrics_bytesout_total{{topic="t"}} {bytes_in // 2}',
        *(f'kafka_network_requestmetrics_totaltimems_bucket{{request="Produce",le="{le}"}} {n}'
          for le, n in zip(BOUNDS, produce_buckets, strict=True)),
        f'kafka_network_requestmetrics_totaltimems_count{{request="Produce"}} '
        f"{produce_buckets[-1]}",
        'kafka_coordinator_group_groupmetadatamanager_numgroups{state="Stable"} '
        f"{len(lags)}",
        'kafka_coordinator_group_groupmetadatamanager_numgroups{state="Empty"} 0',
        "raftlog_txn_ongoing 1",
        *(f'kafka_consumergroup_lag_sum{{group="{g}"}} {v}' for g, v in lags.items()),
        *(f'kafka_consumergroup_lag_max{{group="{g}"}} {v // 2}' for g, v in lags.items()),
    ]
    return "\n".join(lines) + "\n"


def two_frames() -> tuple[list[Sample], list[Sample]]:
    previous = [
        parse_sample("http://n1/metrics", 10.0, node_text(
            1, role="leader", controller=True, produce=100, fetch=10, bytes_in=0,
            produce_buckets=(0, 0, 0, 0), lags={"orders": 40})),
        parse_sample("http://n2/metrics", 10.0, node_text(
            2, role="follower", controller=False, produce=50, fetch=0, bytes_in=1000,
            produce_buckets=(5, 5, 5, 5), lags={"audit": 7})),
        Sample("http://n3/metrics", 10.0, error="connection refused"),
    ]
    current = [
        parse_sample("http://n1/metrics", 12.0, node_text(
            1, role="leader", controller=True, produce=300, fetch=30, bytes_in=4096,
            produce_buckets=(50, 90, 100, 100), lags={"orders": 60})),
        parse_sample("http://n2/metrics", 12.0, node_text(
            2, role="follower", controller=False, produce=40, fetch=0, bytes_in=1000,
            produce_buckets=(5, 5, 5, 5), lags={"audit": 7}, urp=2)),
        Sample("http://n3/metrics", 12.0, error="connection refused"),
    ]
    return previous, current


def test_render_shows_health_rates_latency_and_group_lag() -> None:
    previous, current = two_frames()
    frame = render(previous, current)
    lines = frame.splitlines()
    assert lines[0].startswith("raftlog top: 2/3 nodes up   active controller: 1")
    assert "offline partitions: 1" in lines[1]
    assert "under-replicated: 2" in lines[1]
    assert "brokers active/fenced: 3/1" in lines[1]
    assert "(rates over 2.0 s)" in lines[1]
    header = next(line for line in lines if line.startswith("NODE"))
    node1 = next(line for line in lines if line.startswith("1 "))
    node2 = next(line for line in lines if line.startswith("2 "))
    assert header.split() == ["NODE", "STATE", "RAFT", "CTRL", "PARTS", "LEADERS", "URP",
                              "PRODUCE/s", "FETCH/s", "IN/s", "OUT/s", "P99", "PRODUCE"]
    # 200 produce requests and 20 consumer fetches in 2 s; 4 KiB in, 2 KiB out; of the 100
    # produces in the window, the 99th falls in (5, 10] ms: 5 + 5 * (99 - 90) / 10 = 9.5.
    assert node1.split() == ["1", "up", "leader", "*", "12", "5", "0", "100.0", "10.0",
                             "2.0", "KiB", "1.0", "KiB", "9.5", "ms"]
    # A counter that went down (a restart) has no rate; no produce in the window: no p99.
    assert node2.split() == ["2", "up", "follower", "12", "6", "2", "-", "0.0", "0", "B",
                             "0", "B", "-"]
    assert any(line.startswith("#3") and "DOWN" in line for line in lines)
    assert "  node #3: http://n3/metrics: connection refused" in lines
    groups = lines.index(next(line for line in lines if line.startswith("groups: ")))
    assert lines[groups] == "groups: Stable 2   open transactions: 2"
    assert lines[groups + 1].split() == ["GROUP", "LAG", "MAX", "LAG", "Δ/s"]
    assert lines[groups + 2].split() == ["orders", "60", "30", "+10.0"]  # growing
    assert lines[groups + 3].split() == ["audit", "7", "3", "+0.0"]


def test_first_frame_has_no_rates_and_a_dead_cluster_renders() -> None:
    _, current = two_frames()
    frame = render(None, current)
    assert "(rates: next frame)" in frame
    node1 = next(line for line in frame.splitlines() if line.startswith("1 "))
    assert node1.split()[7:9] == ["-", "-"]
    dead = render(None, [Sample("http://x/metrics", 0.0, error="timed out")])
    assert dead.startswith("raftlog top: 0/1 nodes up   active controller: none")
    assert "(no committed offsets)" in dead


def test_quantile_matches_promql_histogram_quantile() -> None:
    buckets = {1.0: 50.0, 5.0: 90.0, 10.0: 100.0, float("inf"): 100.0}
    assert quantile(0.5, buckets) == 1.0
    assert quantile(0.99, buckets) == pytest.approx(9.5)
    assert quantile(0.25, buckets) == pytest.approx(0.5)
    assert quantile(0.99, {1.0: 0.0, float("inf"): 4.0}) == 1.0  # in +Inf: the top bound
    assert quantile(0.99, {1.0: 0.0, float("inf"): 0.0}) is None
    assert quantile(0.99, {}) is None


def test_metrics_urls_from_flags_and_from_a_cluster_layout(tmp_path: Path) -> None:
    assert metrics_urls("127.0.0.1:9404, http://h:1/custom", None) == [
        "http://127.0.0.1:9404/metrics", "http://h:1/custom"]
    with pytest.raises(TopError, match="not found"):
        metrics_urls(None, tmp_path)
    layout = {"nodes": 2, "kafka_ports": [9092, 9093], "controller_ports": [9192, 9193],
              "cluster_id": "x"}
    (tmp_path / "cluster.json").write_text(json.dumps(layout))
    with pytest.raises(TopError, match="metrics_ports"):
        metrics_urls(None, tmp_path)
    (tmp_path / "cluster.json").write_text(json.dumps({**layout,
                                                      "metrics_ports": [9404, 9405]}))
    assert metrics_urls(None, tmp_path) == ["http://127.0.0.1:9404/metrics",
                                            "http://127.0.0.1:9405/metrics"]
    with pytest.raises(TopError, match="http"):
        metrics_urls("file:///etc/passwd", None)


class _Counting:
    """A collector whose Produce counter moves on every scrape."""

    def __init__(self) -> None:
        self.produced = 0

    def collect(self) -> Iterator[Metric]:
        self.produced += 10
        requests = CounterMetricFamily("kafka_network_requestmetrics_requests", "",
                                       labels=["request"])
        requests.add_metric(["Produce"], self.produced)
        yield requests
        yield GaugeMetricFamily("kafka_controller_kafkacontroller_activecontrollercount", "",
                                value=1)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def metrics_server() -> Iterator[str]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Counting())
    port = _free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_scrape_and_one_frame_against_a_live_endpoint(metrics_server: str) -> None:
    sample = scrape(f"http://{metrics_server}/metrics")
    assert sample.up and sample.total("kafka_network_requestmetrics_requests_total") == 10
    dead_port = _free_port()
    down = scrape(f"http://127.0.0.1:{dead_port}/metrics", timeout_s=2)
    assert not down.up and down.error
    out = io.StringIO()
    code = run_top([f"http://{metrics_server}/metrics", f"http://127.0.0.1:{dead_port}/metrics"],
                   interval_s=0.2, once=True, out=out)
    assert code == 0
    frame = out.getvalue()
    assert frame.startswith("raftlog top: 1/2 nodes up   active controller: #1")
    node = next(line for line in frame.splitlines() if line.startswith("#1 "))
    produce_rate = float(node.split()[7])  # after NODE STATE RAFT CTRL PARTS LEADERS URP
    assert produce_rate > 0


def test_cli_top_once(metrics_server: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", "--metrics", metrics_server, "--once", "--interval", "0.1"]) == 0
    assert "1/1 nodes up" in capsys.readouterr().out
    assert main(["top", "--data-dir", "/nonexistent-raftlog-cluster", "--once"]) == 2
