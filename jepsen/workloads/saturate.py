"""``--workload queue --load saturate``: idempotent producers writing as fast as the cluster
takes.

Each client process is one idempotent confluent-kafka producer (``enable.idempotence=true``,
``acks=all``, up to 5 requests in flight per broker, ``linger.ms`` 2, small batches of
``BATCH_MESSAGES`` records so that several batches of one partition are in flight at once).
An operation is one ``send`` of ``SEND_VALUES`` unique values spread over the partitions,
produced without waiting and then flushed, so a history has one operation per
``SEND_VALUES`` records (about 60 a second at 6,000 records a second) and stays small enough
to write and check. There are no polls during the run: the final reads read every partition
back from the beginning.

The check is :mod:`jepsen.stream_check` (linear: duplicates, reorderings within a producer,
lost acknowledged writes, per partition); Jepsen's full checker also runs when the history
holds at most ``FULL_CHECK_MAX_VALUES`` sent values (3.2 s on 150,000 values of a clean
synthetic history, 1.2 s on a real 51,400-value run; beyond, its cycle search may not scale).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from jepsen import stream_check
from jepsen.checker import CheckerOptions, check
from jepsen.history import History
from jepsen.workloads import ClusterView, Outcome, Recorder
from jepsen.workloads.queue import (
    SEND_TIMEOUT_S,
    TOPIC,
    Deliveries,
    QueueClient,
    QueueWorkload,
    partition_of,
    producer_config,
    send_outcome,
)

SEND_VALUES: Final = 100
BATCH_MESSAGES: Final = 10
FULL_CHECK_MAX_VALUES: Final = 500_000

SATURATE_PRODUCER: Final[dict[str, Any]] = {
    "enable.idempotence": True,
    "acks": "all",
    "max.in.flight.requests.per.connection": 5,
    "linger.ms": 2,
    "batch.num.messages": BATCH_MESSAGES,
    "queue.buffering.max.messages": 100_000,
}


@dataclass
class SaturateClient(QueueClient):
    """A producer only (no consumer: nothing polls during a saturating run)."""

    def open(self, recorder: Recorder, process: int) -> None:
        from confluent_kafka import Producer

        self.producer = Producer(producer_config(self.view, dict(SATURATE_PRODUCER)))

    def invoke(self, f: str, value: Any) -> Outcome:
        if f != "send":
            raise ValueError(f"saturating client cannot {f}")
        deliveries = Deliveries()
        for i, (_, k, v) in enumerate(value):
            try:
                self.producer.produce(TOPIC, value=str(v).encode(), partition=partition_of(k),
                                      on_delivery=deliveries.callback(i))
            except BufferError:
                self.producer.poll(0.05)
                self.producer.produce(TOPIC, value=str(v).encode(), partition=partition_of(k),
                                      on_delivery=deliveries.callback(i))
        remaining = self.producer.flush(SEND_TIMEOUT_S + 1)
        return send_outcome(value, deliveries, remaining)

    def close(self) -> None:
        from jepsen.workloads.queue import _close_quietly

        _close_quietly([lambda: self.producer.flush(0) if self.producer is not None else None])


def next_send(rng: random.Random, keys: list[str], next_value: Callable[[], int],
              count: int = SEND_VALUES) -> tuple[str, Any]:
    """One send of ``count`` fresh values, each to a random key (pure but for the counter)."""
    return "send", [["send", rng.choice(keys), next_value()] for _ in range(count)]


def check_saturated(history: History, full_max_values: int = FULL_CHECK_MAX_VALUES
                    ) -> dict[str, Any]:
    """The stream check, plus Jepsen's checker on histories small enough for it."""
    result = stream_check.analyze(history)
    sent = sum(len(vs) for op in history if op.is_invoke and op.f == "send"
               for vs in op.writes().values())
    result["stats"]["sent_values"] = sent
    result["stats"]["operations"] = {"ok": sum(1 for op in history if op.is_ok and
                                               op.f in ("send", "poll"))}
    if sent <= full_max_values:
        full = check(history, CheckerOptions())
        result["full_check"] = {k: full.get(k) for k in ("valid", "anomaly_counts",
                                                         "bad_anomaly_types")}
        if full["valid"] is False:
            result["valid"] = False
        elif full["valid"] == "unknown" and result["valid"] is True:
            result["valid"] = "unknown"
    else:
        result["full_check"] = f"skipped: {sent} values > {full_max_values}"
    return result


@dataclass
class SaturateWorkload(QueueWorkload):
    name: str = "queue"

    def new_client(self, view: ClusterView, process: int, rng: random.Random,
                   worker: int) -> SaturateClient:
        return SaturateClient(view, "assign", rng, self.keys())

    def next_op(self, rng: random.Random, next_value: Callable[[], int]) -> tuple[str, Any]:
        return next_send(rng, self.keys(), next_value)

    def check(self, history: History) -> dict[str, Any]:
        return check_saturated(history)
