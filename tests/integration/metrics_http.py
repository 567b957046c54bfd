"""Reading a node's metrics endpoint (``metrics.listener``) from tests: plain HTTP GETs with a
timeout, and the Prometheus text format parsed by ``prometheus_client``'s own parser."""

from __future__ import annotations

import http.client
import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
# A row of a family table: | `name` | C/G/H | labels | meaning |
_ROW = re.compile(r"^\|\s*`([a-z_][a-z0-9_]*)`\s*\|\s*([CGH])\s*\|([^|]*)\|")


def metrics_property(host: str, port: int) -> dict[str, str]:
    return {"metrics.listener": f"http://{host}:{port}"}


def get(host: str, port: int, path: str, timeout_s: float = 5.0) -> tuple[int, str]:
    """``(status, body)`` of ``GET path``; raises OSError when the node does not answer."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode("utf-8", errors="replace")
    finally:
        connection.close()


def scrape(host: str, port: int, timeout_s: float = 5.0) -> dict[str, Any]:
    """``/metrics`` parsed: family name (counters without ``_total``) -> prometheus_client
    ``Metric`` (``.type``, ``.documentation``, ``.samples``)."""
    status, body = get(host, port, "/metrics", timeout_s)
    assert status == 200, (status, body[:500])
    return {family.name: family for family in text_string_to_metric_families(body)}


def documented_families(path: Path = DOCS) -> dict[str, tuple[str, list[str]]]:
    """Every family in docs/metrics.md's tables: name -> (``C``, ``G`` or ``H``, its label
    names)."""
    out: dict[str, tuple[str, list[str]]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if match := _ROW.match(line):
            labels = [re.sub(r"\(.*", "", part).strip()
                      for part in re.sub(r"\([^)]*\)", "", match.group(3)).split(",")]
            out[match.group(1)] = (match.group(2), [label for label in labels if label])
    return out


PROMETHEUS_TYPE = {"C": "counter", "G": "gauge", "H": "histogram"}


def exported_sample_names(name: str, kind: str) -> set[str]:
    """The sample names Prometheus sees for a documented family."""
    if kind == "C":
        return {f"{name}_total"}
    if kind == "H":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return {name}


def sample_value(families: dict[str, Any], name: str, **labels: str) -> float | None:
    """The value of the first sample ``name`` (a sample name, e.g. ``x_total``) whose labels
    include ``labels``, or None."""
    family_name = name[:-6] if name.endswith("_total") else name
    family_name = re.sub(r"_(bucket|sum|count)$", "", family_name) \
        if family_name not in families else family_name
    family = families.get(family_name)
    if family is None:
        return None
    for sample in family.samples:
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
            return float(sample.value)
    return None
