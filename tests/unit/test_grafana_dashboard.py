"""docs/grafana-dashboard.json cannot drift from docs/metrics.md: it is a valid Grafana
dashboard, and every series its PromQL (and docs/operations.md's alert rules) reads is a family
of the contract, under the name the exposition gives it (counters with ``_total``, histograms
as ``_bucket``/``_count``/``_sum``)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"
METRICS_DOC = ROOT / "docs" / "metrics.md"
OPERATIONS_DOC = ROOT / "docs" / "operations.md"
# Series Prometheus itself makes for every scrape target.
PROMETHEUS_SERIES = {"up"}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
                "or", "unless", "offset", "inf", "nan"}
_ROW = re.compile(r"^\| `([a-z_:][a-z0-9_:]*)` \| ([CGH]) \|", re.MULTILINE)


def exported_names() -> set[str]:
    """Every series name the families of docs/metrics.md expose."""
    names: set[str] = set()
    for family, kind in _ROW.findall(METRICS_DOC.read_text()):
        if kind == "C":
            names.add(f"{family}_total")
        elif kind == "H":
            names.update(f"{family}_{suffix}" for suffix in ("bucket", "count", "sum"))
        else:
            names.add(family)
    return names


def series_in(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, label names and
    strings removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w:.])[A-Za-z_:][\w:]*", text):  # not "5m" or "1e3"
        following = text[match.end():].lstrip()
        word = match.group()
        if following.startswith("(") or word.lower() in PROMQL_WORDS:
            continue  # a function or aggregation, or a keyword
        names.add(word)
    return names


def _targets(panels: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in panels:
        yield from ((panel, target) for target in panel.get("targets", []))
        yield from _targets(panel.get("panels", []))


def _balanced(expr: str) -> bool:
    stack: list[str] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    for char in re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr):
        if char in "([{":
            stack.append(char)
        elif char in pairs and (not stack or stack.pop() != pairs[char]):
            return False
    return not stack


def test_the_contract_parses() -> None:
    names = exported_names()
    assert "kafka_consumergroup_lag_sum" in names
    assert "raftlog_txn_completed_total" in names
    assert "kafka_network_requestmetrics_totaltimems_bucket" in names
    assert len(names) > 80


def test_dashboard_is_a_grafana_dashboard_with_a_prometheus_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 36 and dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], panel["title"]
    rows = {panel["title"] for panel in dashboard["panels"] if panel["type"] == "row"}
    assert rows >= {"Cluster health", "Requests", "Throughput", "Storage", "Replication",
                    "Metadata quorum", "Consumer groups", "Transactions", "Process"}


def test_every_dashboard_expression_reads_only_documented_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    known = exported_names() | PROMETHEUS_SERIES
    used: set[str] = set()
    for panel, target in _targets(dashboard["panels"]):
        expr = target["expr"]
        assert _balanced(expr), (panel["title"], expr)
        names = series_in(expr)
        assert names, (panel["title"], expr)
        assert names <= known, (panel["title"], sorted(names - known))
        used |= names
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":  # label_values(SELECTOR, LABEL)
            selector = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["definition"])
            assert selector is not None, variable
            assert series_in(selector.group(1)) == {"raftlog_node_info"}
    # Every section of the contract is on the dashboard.
    for family in ("kafka_consumergroup_lag_sum", "raftlog_txn_ongoing",
                   "kafka_log_logflushstats_logflushrateandtimems_bucket",
                   "kafka_server_raft_metrics_current_state", "raftlog_event_loop_lag_ms_bucket",
                   "kafka_server_replicafetchermanager_maxlag",
                   "kafka_server_brokertopicmetrics_bytesin_total"):
        assert family in used, family


def test_every_alert_in_operations_md_reads_only_documented_metrics() -> None:
    text = OPERATIONS_DOC.read_text()
    exprs = re.findall(r"^\s*expr: (.+)$", text, re.MULTILINE)
    assert len(exprs) >= 11
    known = exported_names() | PROMETHEUS_SERIES
    for expr in exprs:
        assert _balanced(expr), expr
        assert series_in(expr) and series_in(expr) <= known, (expr, series_in(expr) - known)


def test_series_in_reads_promql() -> None:
    expr = ('histogram_quantile(0.99, sum by (le, request) (rate(a_bucket{request="Produce",'
            'job=~"$job"}[$__rate_interval]))) > on (instance) group_left b or c offset 5m > 1e3')
    assert series_in(expr) == {"a_bucket", "b", "c"}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Prometheus) not installed")
def test_promtool_accepts_the_alert_rules_and_every_dashboard_query(tmp_path: Path) -> None:
    rules = re.search(r"```yaml\n(# raftlog-alerts\.yml.*?)```", OPERATIONS_DOC.read_text(),
                      re.DOTALL)
    assert rules is not None
    (tmp_path / "alerts.yml").write_text(rules.group(1))
    dashboard = json.loads(DASHBOARD.read_text())
    recorded = [
        {"record": f"dashboard:panel{panel['id']}:{target['refId']}",
         "expr": target["expr"].replace("$__rate_interval", "1m").replace("$job", "raftlog")
         .replace("$instance", ".*")}
        for panel, target in _targets(dashboard["panels"])]
    (tmp_path / "dashboard.yml").write_text(json.dumps(
        {"groups": [{"name": "dashboard", "rules": recorded}]}))  # JSON is YAML
    result = subprocess.run(
        ["promtool", "check", "rules", str(tmp_path / "alerts.yml"),
         str(tmp_path / "dashboard.yml")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
