"""Client quota families (docs/metrics.md, "Requests"): the throttle times the listener gave,
by quota type as Kafka names its sensors (``kafka.server:type=Produce|Fetch|Request,
name=throttle-time``), and how many rates the node keeps (``raftlog.server.quotas``)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from raftlog.metadata.quota_apply import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
)
from raftlog.observe.families import gauge, histogram
from raftlog.observe.parts import NodeParts

_FAMILIES = (
    (PRODUCER_BYTE_RATE, "kafka_server_produce_throttle_time",
     "Milliseconds Produce responses were throttled for (producer_byte_rate); the count is "
     "the throttled responses."),
    (CONSUMER_BYTE_RATE, "kafka_server_fetch_throttle_time",
     "Milliseconds consumer Fetch responses were throttled for (consumer_byte_rate); the "
     "count is the throttled responses."),
    (REQUEST_PERCENTAGE, "kafka_server_request_throttle_time",
     "Milliseconds responses were throttled for (request_percentage); the count is the "
     "throttled responses."),
)


class QuotaCollector:
    def __init__(self, parts: NodeParts) -> None:
        self._parts = parts

    def collect(self) -> Iterator[Metric]:
        quotas = self._parts.quotas
        if quotas is None:
            return
        for key, name, documentation in _FAMILIES:
            yield histogram(name, documentation, quotas.stats.throttle_ms[key])
        yield gauge("raftlog_quota_sensors", "Client quota rates kept (one per quota key and"
                    " user and/or client id measured; idle ones expire after an hour).",
                    quotas.core.sensor_count)
