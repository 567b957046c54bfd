"""Topic creation, deletion and partition changes under faults, checked for linearizability.

Operations on a small pool of topic names (``meta-<run>-<i>``), each sent as one Kafka admin
request (CreateTopics, DeleteTopics, CreatePartitions) to the node that reports itself as the
controller, through raftlog's own protocol client, which never retries behind the harness's
back (librdkafka's admin client may, which would turn a successful create into a spurious
``TOPIC_ALREADY_EXISTS``). Results:

* error code NONE / TOPIC_ALREADY_EXISTS / UNKNOWN_TOPIC_OR_PARTITION / INVALID_PARTITIONS:
  ``ok`` with result ``ok`` / ``exists`` / ``unknown`` / ``invalid``;
* NOT_CONTROLLER, INVALID_REPLICATION_FACTOR, or no connection: ``fail`` (not applied);
* timeouts, lost connections, any other error: ``info``.

The checker (:mod:`jepsen.linear`) searches each topic's sub-history for a linearization
against :func:`jepsen.linear.topic_model`. Metadata *reads* are not part of the model: in
Kafka any broker answers Metadata from its own, possibly stale, copy of the metadata log, so
reads are only eventually consistent by design.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import trio

from jepsen.history import History
from jepsen.linear import Call, check_linearizable, topic_model
from jepsen.workloads import ClusterView, Outcome, Recorder
from raftlog.client.connection import KafkaClientError, KafkaConnection
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import CREATE_PARTITIONS, CREATE_TOPICS, DELETE_TOPICS, METADATA

TOPICS: Final = 4
REQUEST_TIMEOUT_S: Final = 6.0
CONNECT_TIMEOUT_S: Final = 2.0
REPLICATION_FACTOR: Final = 2
MAX_EXAMPLES: Final = 8

_RESULTS: Final = {
    ErrorCode.NONE: "ok",
    ErrorCode.TOPIC_ALREADY_EXISTS: "exists",
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: "unknown",
    ErrorCode.INVALID_PARTITIONS: "invalid",
}
_NOT_APPLIED: Final = {ErrorCode.NOT_CONTROLLER, ErrorCode.INVALID_REPLICATION_FACTOR}


class _NotSent(Exception):
    pass


@dataclass
class MetadataClient:
    view: ClusterView
    rng: random.Random
    controller: tuple[str, int] | None = None

    def open(self, recorder: Recorder, process: int) -> None:
        return None

    def invoke(self, f: str, value: Any) -> Outcome:
        topic, n = value
        try:
            code = trio.run(self._request, f, topic, n)
        except _NotSent as exc:
            self.controller = None
            return Outcome("fail", value, error=f"not sent: {exc}")
        except (KafkaClientError, trio.TooSlowError, OSError) as exc:
            self.controller = None
            return Outcome("info", value, error=str(exc))
        result = _RESULTS.get(ErrorCode(code)) if code in ErrorCode._value2member_map_ else None
        if result is not None:
            return Outcome("ok", [topic, n, result])
        name = ErrorCode(code).name if code in ErrorCode._value2member_map_ else str(code)
        if code in _NOT_APPLIED:
            self.controller = None
            return Outcome("fail", value, error=name)
        return Outcome("info", value, error=name)

    async def _request(self, f: str, topic: str, n: int) -> int:
        address = self.controller or await self._find_controller()
        try:
            conn = await KafkaConnection.connect(*address, client_id="jepsen-metadata",
                                                 timeout_s=CONNECT_TIMEOUT_S,
                                                 security=self.view.security)
        except KafkaClientError as exc:
            raise _NotSent(str(exc)) from exc
        async with conn:
            if f == "create":
                body = {"topics": [{"name": topic, "num_partitions": n,
                                    "replication_factor": REPLICATION_FACTOR,
                                    "assignments": [], "configs": []}],
                        "timeout_ms": int(REQUEST_TIMEOUT_S * 1000) - 1000}
                r = await conn.request(CREATE_TOPICS, body, timeout_s=REQUEST_TIMEOUT_S)
                return int(r.topics[0].error_code)
            if f == "delete":
                body = {"topic_names": [topic],
                        "timeout_ms": int(REQUEST_TIMEOUT_S * 1000) - 1000}
                r = await conn.request(DELETE_TOPICS, body, timeout_s=REQUEST_TIMEOUT_S)
                return int(r.responses[0].error_code)
            body = {"topics": [{"name": topic, "count": n, "assignments": None}],
                    "timeout_ms": int(REQUEST_TIMEOUT_S * 1000) - 1000, "validate_only": False}
            r = await conn.request(CREATE_PARTITIONS, body, timeout_s=REQUEST_TIMEOUT_S)
            return int(r.results[0].error_code)

    async def _find_controller(self) -> tuple[str, int]:
        addresses = list(self.view.node_addresses.values())
        self.rng.shuffle(addresses)
        for address in addresses:
            try:
                async with await KafkaConnection.connect(
                        *address, timeout_s=CONNECT_TIMEOUT_S,
                        security=self.view.security) as conn:
                    md = await conn.request(METADATA, {"topics": []}, timeout_s=CONNECT_TIMEOUT_S)
            except (KafkaClientError, trio.TooSlowError, OSError):
                continue
            brokers = {b.node_id: (b.host, b.port) for b in md.brokers}
            if md.controller_id in brokers:
                self.controller = brokers[md.controller_id]
                return self.controller
        raise _NotSent("no node named a controller")

    def close(self) -> None:
        return None


@dataclass
class MetadataWorkload:
    topics: int = TOPICS
    name: str = "metadata"
    run_id: str = "x"
    _names: list[str] = field(default_factory=list)

    def keys(self) -> list[str]:
        return self._names or [f"meta-{self.run_id}-{i}" for i in range(self.topics)]

    def setup(self, view: ClusterView) -> None:
        self.run_id = view.run_id
        self._names = [f"meta-{view.run_id}-{i}" for i in range(self.topics)]

    def new_client(self, view: ClusterView, process: int, rng: random.Random,
                   worker: int) -> MetadataClient:
        return MetadataClient(view, rng)

    def next_op(self, rng: random.Random, next_value: Callable[[], int]) -> tuple[str, Any]:
        topic = rng.choice(self.keys())
        r = rng.random()
        if r < 0.4:
            return "create", [topic, rng.randint(1, 2)]
        if r < 0.7:
            return "delete", [topic, 0]
        return "add-partitions", [topic, rng.randint(2, 6)]

    def final_reads(self, view: ClusterView, recorder: Recorder, deadline_s: float
                    ) -> str | None:
        return None

    def check(self, history: History) -> dict[str, Any]:
        return check_metadata(history)


def check_metadata(history: History) -> dict[str, Any]:
    """Per-topic linearizability of the admin operations (see the module docstring)."""
    calls: dict[str, list[Call]] = {}
    ops_by_id: dict[int, Any] = {}
    stats = {"ok": 0, "fail": 0, "info": 0, "open": 0}
    for inv, comp in history.pairs():
        if not inv.is_client or inv.f not in ("create", "delete", "add-partitions"):
            continue
        kind = "open" if comp is None else comp.type
        stats[kind] += 1
        if comp is not None and comp.is_fail:
            continue
        topic, n = inv.value[0], inv.value[1]
        definite = comp is not None and comp.is_ok
        call = Call(inv.index, float(inv.time),
                    float(comp.time) if definite and comp is not None else float("inf"),
                    inv.f, n, comp.value[2] if definite and comp is not None else None)
        calls.setdefault(topic, []).append(call)
        ops_by_id[inv.index] = (inv, comp)
    anomalies: list[dict[str, Any]] = []
    unknown: list[dict[str, Any]] = []
    for topic in sorted(calls):
        verdict = check_linearizable(calls[topic], topic_model, None)
        if verdict.valid is None:
            unknown.append({"type": "search-budget", "key": topic})
        elif not verdict.valid:
            anomalies.append({
                "key": topic,
                "linearizable_prefix": [_describe(ops_by_id[i]) for i in verdict.linearization],
                "cannot_place": [_describe(ops_by_id[i]) for i in verdict.stuck],
            })
    valid: bool | str = False if anomalies else ("unknown" if unknown or not stats["ok"]
                                                 else True)
    return {
        "valid": valid,
        "anomaly_types": ["nonlinearizable"] if anomalies else [],
        "anomalies": {"nonlinearizable": anomalies[:MAX_EXAMPLES]} if anomalies else {},
        "anomaly_counts": {"nonlinearizable": len(anomalies)} if anomalies else {},
        "unknown_reasons": unknown + ([] if stats["ok"] else [{"type": "no-ok-operations"}]),
        "stats": {"operations": stats, "topics": len(calls)},
    }


def _describe(pair: tuple[Any, Any]) -> dict[str, Any]:
    inv, comp = pair
    return {"index": inv.index, "process": inv.process, "f": inv.f, "value": inv.value,
            "invoke_time": inv.time,
            "complete": None if comp is None else {"type": comp.type, "value": comp.value,
                                                  "time": comp.time, "error": comp.error}}
