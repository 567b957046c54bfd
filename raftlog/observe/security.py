"""Authentication and authorization families (docs/metrics.md, "Security"), read at scrape
time from the SASL handlers' ``authentications`` and the authorizer's ``Refusals``."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from raftlog.observe.parts import NodeParts

_SOCKET = "kafka_server_socketservermetrics_"


class SecurityCollector:
    def __init__(self, parts: NodeParts) -> None:
        self._parts = parts

    def collect(self) -> Iterator[Metric]:
        successful = CounterMetricFamily(
            _SOCKET + "successful_authentication", "Completed SASL authentications, by "
            "listener.", labels=["listener"])
        failed = CounterMetricFamily(
            _SOCKET + "failed_authentication", "Failed SASL handshakes and authentications "
            "(unknown mechanism, wrong password, unknown user, bad proof), by listener.",
            labels=["listener"])
        sasl = self._parts.sasl
        if sasl is not None:
            for key, count in sorted(sasl.authentications.items(), key=str):
                assert isinstance(key, tuple)
                listener, outcome = str(key[0]), key[1]
                (successful if outcome == "successful" else failed).add_metric(
                    [listener], count)
        yield successful
        yield failed
        denied = CounterMetricFamily(
            "kafka_server_authorizermetrics_authorization_denied", "Requests (or resources "
            "within them) refused by the authorizer: ACLs, and ClusterAction for node-to-node "
            "requests; by request.", labels=["request"])
        refusals = self._parts.refusals
        if refusals is not None:
            for request, count in sorted(refusals.by_api.items()):
                denied.add_metric([request], count)
        yield denied
