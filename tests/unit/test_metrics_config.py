"""The ``metrics.*`` properties, the node's readiness reasons, and ``raftlog cluster up``'s
metrics ports (new layouts and layouts written before the metrics endpoint existed)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from raftlog.config import ConfigError, ServerConfig
from raftlog.node import not_ready_reasons
from raftlog.observe.parts import MetricsSettings
from raftlog.observe.registry import metrics_settings
from raftlog.tools.cluster import ClusterLayout, node_properties, prepare


def config(**props: str) -> ServerConfig:
    merged = {"node.id": "1", "listeners": "PLAINTEXT://127.0.0.1:9092,"
              "CONTROLLER://127.0.0.1:9093"}
    merged.update({key.replace("_", "."): value for key, value in props.items()})
    return ServerConfig.from_properties(merged)


def test_metrics_are_off_and_low_cardinality_by_default() -> None:
    cfg = config()
    assert cfg.metrics_listener is None
    assert metrics_settings(cfg) == MetricsSettings(partition_detail=False,
                                                    group_lag_per_partition=False)


@pytest.mark.parametrize(("text", "address"), [
    ("http://127.0.0.1:9404", ("127.0.0.1", 9404)),
    ("http://127.0.0.1:0", ("127.0.0.1", 0)),
    ("HTTP://localhost:9404/", ("localhost", 9404)),
    ("http://:9404", ("0.0.0.0", 9404)),
    ("http://[::1]:9404", ("::1", 9404)),
])
def test_metrics_listener_parses_http_urls(text: str, address: tuple[str, int]) -> None:
    assert config(metrics_listener=text).metrics_listener == address


@pytest.mark.parametrize(("text", "problem"), [
    ("https://127.0.0.1:9404", "only plain http://"),
    ("127.0.0.1:9404", "expected http://HOST:PORT"),
    ("http://127.0.0.1", "expected http://HOST:PORT"),
    ("http://127.0.0.1:9404/metrics", "expected http://HOST:PORT"),
    ("http://127.0.0.1:70000", "metrics.listener"),
    ("http://127.0.0.1:9092", "PLAINTEXT listener's"),
])
def test_metrics_listener_rejects_what_it_cannot_serve(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=r"metrics\.listener") as caught:
        config(metrics_listener=text)
    assert problem in str(caught.value)


def test_cardinality_opt_ins() -> None:
    cfg = ServerConfig.from_properties({
        "node.id": "1", "metrics.partition.detail.enable": "true",
        "metrics.consumer.group.lag.partition.enable": "TRUE"})
    assert metrics_settings(cfg) == MetricsSettings(partition_detail=True,
                                                    group_lag_per_partition=True)
    with pytest.raises(ConfigError, match=r"metrics\.partition\.detail\.enable"):
        ServerConfig.from_properties({"node.id": "1", "metrics.partition.detail.enable": "yes"})


def _readiness(roles: str, brokers: dict[int, Any], leader: int | None = 1) -> list[str]:
    quorum = SimpleNamespace(image=SimpleNamespace(brokers=brokers), leader_node_id=leader)
    lifecycle = SimpleNamespace(node_id=1, incarnation_id="me")
    cfg = ServerConfig.from_properties({
        "node.id": "1", "process.roles": roles, "controller.quorum.voters": "1@127.0.0.1:9093",
        "listeners": "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
        if "broker" in roles else "CONTROLLER://127.0.0.1:9093"})
    return not_ready_reasons(cast(Any, quorum), cast(Any, lifecycle), cfg)


def test_readiness_reasons() -> None:
    def broker(incarnation: str, fenced: bool) -> Any:
        return SimpleNamespace(incarnation_id=incarnation, fenced=fenced)

    assert _readiness("broker,controller", {}) == ["not registered"]
    assert _readiness("broker,controller", {1: broker("old", False)}) == [
        "metadata not caught up to this incarnation's registration"]
    assert _readiness("broker,controller", {1: broker("me", True)}) == ["fenced"]
    assert _readiness("broker,controller", {1: broker("me", False)}) == []
    assert _readiness("controller", {}, leader=None) == ["no metadata quorum leader known"]
    assert _readiness("controller", {}, leader=2) == []


def test_cluster_layouts_get_a_metrics_port_per_node(tmp_path: Path) -> None:
    layout = prepare(tmp_path / "fixed", 3, 20000)
    assert layout.metrics_ports == (20200, 20201, 20202)
    assert node_properties(layout, 2, tmp_path)["metrics.listener"] == "http://127.0.0.1:20201"
    free = prepare(tmp_path / "free", 3, 0)
    ports = {*free.kafka_ports, *free.controller_ports, *free.metrics_ports}
    assert len(free.metrics_ports) == 3 and len(ports) == 9
    assert ClusterLayout.from_json(free.to_json()) == free


def test_a_layout_from_before_the_metrics_endpoint_gets_ports_added(tmp_path: Path) -> None:
    old = {"nodes": 2, "kafka_ports": [21000, 21001], "controller_ports": [21100, 21101],
           "cluster_id": "abc"}
    (tmp_path / "cluster.json").write_text(json.dumps(old))
    (tmp_path / "raft.secret").write_text("s\n")
    layout = prepare(tmp_path, None, None)
    assert len(layout.metrics_ports) == 2
    assert not {*layout.metrics_ports} & {21000, 21001, 21100, 21101}
    stored = json.loads((tmp_path / "cluster.json").read_text())
    assert stored == {**old, "metrics_ports": list(layout.metrics_ports)}
    assert prepare(tmp_path, None, None) == layout  # stable from then on
    text = (tmp_path / "node-1" / "server.properties").read_text()
    assert f"metrics.listener=http://127.0.0.1:{layout.metrics_ports[0]}" in text
