"""Request and connection families (docs/metrics.md, "Requests"), read at scrape time from the
listener's ``RequestStats`` (``raftlog.server.request_stats``).

The brokertopicmetrics and purgatory rows of that table are another collector's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

from raftlog.metrics.recorders import Histogram
from raftlog.observe.families import gauge_rows
from raftlog.protocol.errors import ErrorCode
from raftlog.server.request_stats import ApiStats, RequestStats

_PREFIX = "kafka_network_requestmetrics_"
# (family suffix, help text, which histogram of ApiStats)
_STAGES: tuple[tuple[str, str, Callable[[ApiStats], Histogram]], ...] = (
    ("requestqueuetimems", "Milliseconds from a request's frame being read to its handler "
     "starting.", lambda s: s.request_queue),
    ("localtimems", "Milliseconds in the handler's synchronous part.", lambda s: s.local),
    ("remotetimems", "Milliseconds waiting on others: replication (acks=all), a long-poll "
     "fetch, a quorum commit.", lambda s: s.remote),
    ("responsequeuetimems", "Milliseconds from the response being ready to the writer taking it "
     "(behind earlier responses on the connection).", lambda s: s.response_queue),
    ("responsesendtimems", "Milliseconds encoding and sending the response.",
     lambda s: s.response_send),
    ("totaltimems", "Milliseconds from the request's frame being read to its response being "
     "sent.", lambda s: s.total),
)


def error_name(code: int) -> str:
    """Kafka's error name for ``code`` (``NONE`` for 0); an unknown code as its number."""
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


class RequestCollector:
    def __init__(self, stats: RequestStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        apis = sorted(self._stats.apis())
        requests = CounterMetricFamily(_PREFIX + "requests", "Requests handled, by request.",
                                       labels=["request"])
        errors = CounterMetricFamily(
            _PREFIX + "errors", "Error codes in responses (NONE included), by request and "
            "Kafka error name.", labels=["request", "error"])
        for name, api in apis:
            requests.add_metric([name], api.requests)
            for code, count in sorted(api.errors.items()):
                errors.add_metric([name, error_name(code)], count)
        yield requests
        yield errors
        for suffix, documentation, stage in _STAGES:
            family = HistogramMetricFamily(_PREFIX + suffix, documentation, labels=["request"])
            for name, api in apis:
                histogram = stage(api)
                family.add_metric([name], histogram.cumulative(), histogram.sum)
            yield family
        connections = CounterMetricFamily(
            "kafka_server_socketservermetrics_connection_creation",
            "Client connections accepted, by listener.", labels=["listener"])
        for listener, count in sorted(self._stats.connections_created.items()):
            connections.add_metric([listener], count)
        yield gauge_rows("kafka_server_socketservermetrics_connection_count",
                         "Open client connections, by listener.", ["listener"],
                         (([key], value) for key, value in sorted(self._stats.connections.items())))
        yield connections
