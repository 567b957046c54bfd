"""Jepsen's Kafka transactional workload through confluent-kafka.

Each operation is a ``txn``: one to four micro-operations, ``["send", key, value]`` and
``["poll"]``, across the partitions of the topic, run inside one producer transaction
(``begin_transaction`` ... ``commit_transaction``) by a transactional producer whose
``transactional.id`` is unique per client process; polls go through a ``read_committed``
consumer that assigned every key from the beginning. Outcomes:

* the commit succeeds: ``ok`` with the offsets of the sends and the records polled;
* the transaction is aborted (an abortable error, then ``abort_transaction`` succeeds):
  ``fail`` (its sends must never be read: a read of them is ``G1a``), and the consumer is
  rewound to where the transaction began, so an aborted transaction's polls are undone as
  in Kafka's consume-transform-produce loop;
* anything else (timeouts, fatal errors, the abort failing): ``info``, and the process is
  replaced with fresh clients (a new transactional id would leave a hanging transaction to
  the transaction timeout; reusing it fences the old producer, so the id is reused).

Before the final reads every transactional id is initialised once more (see
:meth:`TxnWorkload.final_reads`), which ends what the last client of each id left open.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from jepsen.checker import CheckerOptions, check
from jepsen.history import History
from jepsen.workloads import ClusterView, Outcome, Recorder
from jepsen.workloads.queue import (
    POLL_MESSAGES_MAX,
    TOPIC,
    Deliveries,
    _close_quietly,
    consumer_config,
    create_topic,
    final_reads,
    key_of,
    partition_of,
    poll_value,
    producer_config,
)

PARTITIONS: Final = 4
TXN_TIMEOUT_S: Final = 8.0
TXN_POLL_TIMEOUT_S: Final = 0.2
INIT_TIMEOUT_S: Final = 10.0


def transactional_config(view: ClusterView, transactional_id: str) -> dict[str, Any]:
    return producer_config(view, {
        "transactional.id": transactional_id,
        "transaction.timeout.ms": int(TXN_TIMEOUT_S * 2000),
        "acks": "all", "enable.idempotence": True,
    })


@dataclass
class TxnClient:
    view: ClusterView
    keys: list[str]
    transactional_id: str
    producer: Any = None
    consumer: Any = None
    next_offsets: dict[str, int] = field(default_factory=dict)

    def open(self, recorder: Recorder, process: int) -> None:
        from confluent_kafka import Consumer, Producer, TopicPartition

        self.producer = Producer(transactional_config(self.view, self.transactional_id))
        self.producer.init_transactions(INIT_TIMEOUT_S)
        self.consumer = Consumer(consumer_config(
            self.view, f"jepsen-{self.view.run_id}-txn-p{process}"))
        recorder.invoke(process, "assign", self.keys, seek_to_beginning=True)
        self.consumer.assign([TopicPartition(TOPIC, partition_of(k), -2) for k in self.keys])
        recorder.complete("ok", process, "assign", self.keys, seek_to_beginning=True)

    def invoke(self, f: str, value: Any) -> Outcome:
        from confluent_kafka import KafkaException

        if f != "txn":
            raise ValueError(f"txn client cannot {f}")
        deliveries = Deliveries()
        done: list[list[Any]] = []
        before = dict(self.next_offsets)
        try:
            self.producer.begin_transaction()
            for i, mop in enumerate(value):
                if mop[0] == "send":
                    _, k, v = mop
                    self.producer.produce(TOPIC, value=str(v).encode(),
                                          partition=partition_of(k),
                                          on_delivery=deliveries.callback(i))
                    done.append(mop)
                else:
                    messages = self.consumer.consume(num_messages=POLL_MESSAGES_MAX,
                                                     timeout=TXN_POLL_TIMEOUT_S)
                    reads, error = poll_value(messages, TOPIC)
                    if error is not None:
                        raise RuntimeError(f"poll: {error}")
                    for k, pairs in reads.items():
                        self.next_offsets[k] = max(self.next_offsets.get(k, 0), pairs[-1][0] + 1)
                    done.append(["poll", reads])
            self.producer.commit_transaction(TXN_TIMEOUT_S)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            completed = self._completed(value, done, deliveries)
            if err is not None and err.txn_requires_abort():
                try:
                    self.producer.abort_transaction(TXN_TIMEOUT_S)
                except KafkaException as abort_exc:
                    return Outcome("info", completed, error=f"abort failed: {abort_exc}")
                self._rewind(before)
                return Outcome("fail", completed, error=f"aborted: {err.name()}")
            name = err.name() if err is not None else str(exc)
            return Outcome("info", completed, error=name)
        except RuntimeError as exc:
            return Outcome("info", self._completed(value, done, deliveries), error=str(exc))
        return Outcome("ok", self._completed(value, done, deliveries))

    def _rewind(self, before: dict[str, int]) -> None:
        """Undo an aborted transaction's polls, as a consume-transform-produce loop does:
        the consumer goes back to where the transaction began (the offset after the last
        record this process read, or the beginning), so the next transaction reads those
        records again. (librdkafka's ``position()`` is no help here: it is invalid for a
        partition nothing was consumed from since the last assign.)"""
        from confluent_kafka import TopicPartition

        self.next_offsets = dict(before)
        self.consumer.assign([TopicPartition(TOPIC, partition_of(k), before.get(k, -2))
                              for k in self.keys])

    @staticmethod
    def _completed(value: list[list[Any]], done: list[list[Any]],
                   deliveries: Deliveries) -> list[list[Any]]:
        """The micro-ops with offsets and reads filled in as far as they are known."""
        out: list[list[Any]] = []
        for i, mop in enumerate(value):
            if mop[0] == "send":
                offset, _ = deliveries.results.get(i, (None, None))
                out.append(["send", mop[1], [offset, mop[2]]])
            elif i < len(done):
                out.append(done[i])
            else:
                out.append(["poll"])
        return out

    def close(self) -> None:
        _close_quietly([lambda: self.consumer.close() if self.consumer is not None else None,
                        lambda: self.producer.flush(0) if self.producer is not None else None])


@dataclass
class TxnWorkload:
    partitions: int = PARTITIONS
    name: str = "txn"
    transactional_ids: set[str] = field(default_factory=set)  # handed out to clients

    def keys(self) -> list[str]:
        return [key_of(p) for p in range(self.partitions)]

    def setup(self, view: ClusterView) -> None:
        create_topic(view, TOPIC, self.partitions)

    def new_client(self, view: ClusterView, process: int, rng: random.Random,
                   worker: int) -> TxnClient:
        # One transactional id per worker: a replacement process fences its crashed
        # predecessor's producer instead of leaving its transaction hanging.
        transactional_id = f"jepsen-{view.run_id}-txn-{worker}"
        self.transactional_ids.add(transactional_id)
        return TxnClient(view, self.keys(), transactional_id)

    def next_op(self, rng: random.Random, next_value: Callable[[], int]) -> tuple[str, Any]:
        mops: list[list[Any]] = []
        for _ in range(rng.randint(1, 4)):
            if rng.random() < 0.6:
                mops.append(["send", rng.choice(self.keys()), next_value()])
            else:
                mops.append(["poll"])
        return "txn", mops

    def final_reads(self, view: ClusterView, recorder: Recorder, deadline_s: float
                    ) -> str | None:
        """Restart every transactional id first, as a restarted application would: its
        InitProducerId fences the last producer and ends any transaction it left open (commit
        finished if it was preparing one, else aborted). Without that, a transaction whose
        client gave up holds the partitions' LSO until ``transaction.timeout.ms``, which a
        clock step on its coordinator can push far past the final reads' deadline."""
        notes: list[str] = []
        failed = fence_transactional_ids(view, sorted(self.transactional_ids), deadline_s)
        if failed:
            notes.append(f"could not fence transactional ids before the final reads: {failed}")
        note = final_reads(view, recorder, self.keys(), TOPIC, deadline_s)
        if note is not None:
            notes.append(note)
        return "; ".join(notes) or None

    def check(self, history: History) -> dict[str, Any]:
        return check(history, CheckerOptions())


def fence_transactional_ids(view: ClusterView, transactional_ids: Iterable[str],
                            deadline_s: float) -> dict[str, str]:
    """``init_transactions`` once for each id (bounded by the deadline); the ids that could not
    be initialised, with why."""
    from confluent_kafka import Producer

    failed: dict[str, str] = {}
    for transactional_id in transactional_ids:
        timeout_s = min(INIT_TIMEOUT_S, deadline_s - time.monotonic())
        if timeout_s <= 0:
            failed[transactional_id] = "no time left"
            continue
        producer = None
        try:
            producer = Producer(transactional_config(view, transactional_id))
            producer.init_transactions(timeout_s)
        except Exception as exc:  # KafkaException, a timeout: the reads go on regardless
            failed[transactional_id] = str(exc)
        finally:
            if producer is not None:
                _close_quietly([functools.partial(producer.flush, 0)])
    return failed
