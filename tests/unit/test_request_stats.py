"""Request metrics: the listener's ``RequestStats`` (names, error codes, stage times,
connections) and their Prometheus families (``raftlog.observe.requests``)."""

from __future__ import annotations

from typing import Any

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from raftlog.observe.requests import RequestCollector, error_name
from raftlog.protocol.codec import Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import API_VERSIONS, FETCH, PRODUCE
from raftlog.server.listener import Body, HandlerResult, RequestContext, serve_listener
from raftlog.server.request_stats import (
    FETCH_CONSUMER,
    FETCH_FOLLOWER,
    RequestStats,
    count_error_codes,
    request_name,
)
from tests.unit.test_server import FETCH_BODY, LIMITS, Client, frame, with_api_versions


class Region:
    """Stands for a file region in a fetch response: the walk must never look into it."""

    size_bytes = 10

    def items(self) -> Any:
        raise AssertionError("records were walked")


def test_request_name_splits_fetch_by_replica_id() -> None:
    assert request_name("Produce", Struct({"acks": -1})) == "Produce"
    assert request_name("Fetch", Struct({"replica_id": -1})) == FETCH_CONSUMER
    assert request_name("Fetch", Struct({"replica_id": 0})) == FETCH_FOLLOWER
    assert request_name("Fetch", Struct({"replica_id": 3})) == FETCH_FOLLOWER
    # v15+: the id moved into replica_state.
    assert request_name("Fetch", Struct({"replica_state": Struct({"replica_id": 2})})) \
        == FETCH_FOLLOWER
    assert request_name("Fetch", Struct({"replica_state": Struct({"replica_id": -1})})) \
        == FETCH_CONSUMER


def test_error_codes_are_counted_through_nested_bodies_but_not_records() -> None:
    body = {
        "throttle_time_ms": 0,
        "error_code": 0,
        "responses": [
            {"topic": "a", "partitions": [
                {"partition_index": 0, "error_code": 0, "records": Region()},
                {"partition_index": 1, "error_code": 6, "records": memoryview(b"xx")},
            ]},
            Struct({"topic": "b", "partitions": (
                Struct({"partition_index": 0, "error_code": 6, "records": None}),
            )}),
        ],
        "replicas": [1, 2, 3],
        "nested": {"error_code": 999},
    }
    counts: dict[int, int] = {}
    count_error_codes(body, counts)
    assert counts == {0: 2, 6: 2, 999: 1}
    assert error_name(0) == "NONE"
    assert error_name(6) == ErrorCode(6).name == "NOT_LEADER_OR_FOLLOWER"
    assert error_name(999) == "999"


def test_collector_exports_every_request_family() -> None:
    stats = RequestStats()
    ms = 1_000_000
    stats.record("Produce", {"error_code": 0}, 0, 1 * ms, 3 * ms, 10 * ms, 11 * ms, 12 * ms)
    stats.record("Produce", None, 0, 0, 0, 0, 0, 0)  # acks=0: counted, no error codes
    stats.connection_opened("PLAINTEXT")
    stats.connection_opened("PLAINTEXT")
    stats.connection_closed("PLAINTEXT")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RequestCollector(stats))
    text = generate_latest(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in families.values() for s in family.samples}
    prefix = "kafka_network_requestmetrics_"
    assert samples[(prefix + "requests_total", (("request", "Produce"),))] == 2
    assert samples[(prefix + "errors_total", (("error", "NONE"), ("request", "Produce")))] == 1
    for stage, expected_ms in (("requestqueuetimems", 1), ("localtimems", 2),
                               ("remotetimems", 7), ("responsequeuetimems", 1),
                               ("responsesendtimems", 1), ("totaltimems", 12)):
        assert families[prefix + stage].type == "histogram"
        assert samples[(prefix + stage + "_count", (("request", "Produce"),))] == 2
        assert samples[(prefix + stage + "_sum", (("request", "Produce"),))] == expected_ms
    assert samples[("kafka_server_socketservermetrics_connection_count",
                    (("listener", "PLAINTEXT"),))] == 1
    assert samples[("kafka_server_socketservermetrics_connection_creation_total",
                    (("listener", "PLAINTEXT"),))] == 2
    assert f"# HELP {prefix}totaltimems" in text


async def test_the_listener_records_requests_stages_and_connections() -> None:
    def fetch(request: RequestContext) -> HandlerResult:
        async def long_poll() -> Body:
            await trio.sleep(0.05)  # the remote part
            return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": [
                {"topic": "t", "partitions": [
                    {"partition_index": 0, "error_code": int(ErrorCode.NOT_LEADER_OR_FOLLOWER),
                     "high_watermark": 0, "records": None}]}]}

        return long_poll

    def produce(request: RequestContext) -> HandlerResult:
        return None  # acks=0

    stats = RequestStats()
    handlers = with_api_versions({FETCH.key: fetch, PRODUCE.key: produce})
    async with trio.open_nursery() as nursery:
        port: int = await nursery.start(serve_listener, "127.0.0.1", 0, handlers, LIMITS, stats)
        client = await Client.connect(port)
        await client.send(frame(FETCH, 11, FETCH_BODY, 1)
                          + frame(FETCH, 11, {**FETCH_BODY, "replica_id": 2}, 2)
                          + frame(PRODUCE, 8, {"acks": 0, "timeout_ms": 0, "topic_data": []}, 3)
                          + frame(API_VERSIONS, 0, {}, 4))
        await client.response(FETCH, 11, 1)
        await client.response(FETCH, 11, 2)
        await client.response(API_VERSIONS, 0, 4)
        assert stats.connections == {"PLAINTEXT": 1}
        await client.aclose()
        with trio.fail_after(60):
            while stats.connections["PLAINTEXT"]:  # noqa: ASYNC110 (a plain recorder: no event)
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    apis = dict(stats.apis())
    assert {name: api.requests for name, api in apis.items()} == {
        "FetchConsumer": 1, "FetchFollower": 1, "Produce": 1, "ApiVersions": 1}
    consumer = apis["FetchConsumer"]
    assert consumer.errors == {0: 1, int(ErrorCode.NOT_LEADER_OR_FOLLOWER): 1}
    assert consumer.remote.sum >= 50  # ms: the deferred part slept 50 ms
    assert consumer.total.sum >= consumer.remote.sum
    assert apis["ApiVersions"].remote.sum == 0  # answered synchronously
    assert apis["Produce"].errors == {}  # no response, no error codes
    assert stats.connections_created == {"PLAINTEXT": 1}
