"""``raftlog.metrics.recorders`` as ``prometheus_client`` metric families."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from raftlog.metrics.recorders import Counter, CounterMap, Histogram, HistogramMap


def counter(name: str, documentation: str, value: Counter | int) -> CounterMetricFamily:
    """``name`` without ``_total`` (prometheus_client appends it)."""
    family = CounterMetricFamily(name, documentation)
    family.add_metric([], value.value if isinstance(value, Counter) else value)
    return family


def counter_map(name: str, documentation: str, labels: Sequence[str],
                values: CounterMap) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=labels)
    for key, value in values.items():
        family.add_metric(_label_values(key), value)
    return family


def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def gauge_rows(name: str, documentation: str, labels: Sequence[str],
               rows: Iterable[tuple[Sequence[str], float]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=labels)
    for label_values, value in rows:
        family.add_metric(list(label_values), value)
    return family


def histogram(name: str, documentation: str, value: Histogram) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation)
    family.add_metric([], value.cumulative(), value.sum)
    return family


def histogram_map(name: str, documentation: str, labels: Sequence[str],
                  values: HistogramMap) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=labels)
    for key, value in values.items():
        family.add_metric(_label_values(key), value.cumulative(), value.sum)
    return family


def _label_values(key: object) -> list[str]:
    if isinstance(key, tuple):
        return [str(part) for part in key]
    return [str(key)]
