"""Jepsen's Kafka queue workload through confluent-kafka (librdkafka).

Keys are the partitions of one topic (``jepsen-<p>``). Operations:

* ``send``: one to three ``["send", key, value]`` micro-ops with unique integer values,
  produced with an idempotent producer and ``acks=all`` (``acks=1`` without idempotence in the
  harness's ``--unsafe`` mode), then flushed; ``ok`` with the offsets the broker assigned,
  ``info`` when any delivery failed or timed out (the effect is unknown; the process is then
  replaced by a fresh one with fresh clients, as in Jepsen).
* ``poll``: ``["poll"]``; one ``consume`` call; ``ok`` with ``{key: [[offset, value], ...]}``.
* ``assign`` / ``subscribe``: each process starts by assigning itself a random subset of the
  keys (a fresh group id, no committed offsets, so it reads from the beginning:
  ``seek_to_beginning``) or by subscribing to the topic in a shared consumer group (offsets
  auto-committed; partitions assigned and revoked during a poll go to ``rebalance_log``).

Consumers read ``read_committed``. The final reads use a fresh process that assigns every key
from the beginning and polls until each key's position reaches its (``read_uncommitted``) high
watermark: past any transaction left open, once the coordinator has aborted it.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from jepsen.checker import CheckerOptions, check
from jepsen.history import History
from jepsen.workloads import ClusterView, Outcome, Recorder

TOPIC: Final = "jepsen"
PARTITIONS: Final = 4
SEND_TIMEOUT_S: Final = 5.0
POLL_TIMEOUT_S: Final = 0.3
POLL_MESSAGES_MAX: Final = 200
FINAL_REFRESH_S: Final = 2.0
WATERMARK_TIMEOUT_S: Final = 5.0
UNKNOWN_END: Final = 1 << 62  # beyond any offset
ADMIN_TIMEOUT_S: Final = 30.0


def key_of(partition: int) -> str:
    return f"{TOPIC}-{partition}"


def partition_of(key: str) -> int:
    return int(key.rsplit("-", 1)[1])


def producer_config(view: ClusterView, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {
        **view.client_config,
        "bootstrap.servers": view.bootstrap,
        "linger.ms": 0,
        "message.timeout.ms": int(SEND_TIMEOUT_S * 1000),
        "request.timeout.ms": int(SEND_TIMEOUT_S * 1000) - 500,
        "socket.timeout.ms": 3000,
        "topic.metadata.refresh.interval.ms": 1000,
        "reconnect.backoff.max.ms": 500,
        "retry.backoff.ms": 100,
        "log_level": 2,
    }
    if view.client_log is not None:
        # Why: an idempotent duplicate or loss is decided by the client's epoch bumps and
        # implicit acks, which only librdkafka's own debug lines show.
        conf.update({"debug": "eos,msg", "log_level": 7,
                     "logger": client_logger(view.client_log)})
    if view.unsafe:
        conf.update({"acks": "1", "enable.idempotence": False, "retries": 0})
    else:
        conf.update({"acks": "all", "enable.idempotence": True})
    conf.update(extra or {})
    return conf


def client_logger(path: Path) -> logging.Logger:
    """One logger per run's ``clients.log`` (librdkafka calls it from its own threads)."""
    logger = logging.getLogger(f"jepsen.clients.{path}")
    if not logger.handlers:
        handler = logging.FileHandler(path, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
    return logger


def consumer_config(view: ClusterView, group: str, extra: dict[str, Any] | None = None
                    ) -> dict[str, Any]:
    conf: dict[str, Any] = {
        **view.client_config,
        "bootstrap.servers": view.bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "socket.timeout.ms": 3000,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 1000,
        "topic.metadata.refresh.interval.ms": 1000,
        "reconnect.backoff.max.ms": 500,
        "fetch.wait.max.ms": 100,
        "log_level": 2,
    }
    conf.update(extra or {})
    return conf


def create_topic(view: ClusterView, topic: str, partitions: int) -> None:
    """Create the workload topic (retrying until the cluster answers)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({**view.client_config, "bootstrap.servers": view.bootstrap,
                         "log_level": 2})
    config = {"min.insync.replicas": "1" if view.unsafe else str(min(2, view.replication_factor))}
    if view.unsafe:
        config.update({"unclean.leader.election.enable": "true", "flush.messages": "1000000000"})
    deadline = time.monotonic() + ADMIN_TIMEOUT_S
    while True:
        futures = admin.create_topics([NewTopic(topic, partitions, view.replication_factor,
                                                config=config)], operation_timeout=10)
        try:
            futures[topic].result(15)
            break
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" in str(exc):
                break
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    _wait_leaders(admin, topic, partitions, deadline)


def _wait_leaders(admin: Any, topic: str, partitions: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            md = admin.list_topics(topic, timeout=5)
            t = md.topics.get(topic)
            if t is not None and t.error is None and len(t.partitions) == partitions and all(
                    p.leader >= 0 for p in t.partitions.values()):
                return
        except Exception:  # librdkafka raises KafkaException on timeouts; retry
            pass
        time.sleep(0.2)
    raise RuntimeError(f"topic {topic} has no leaders after {ADMIN_TIMEOUT_S} s")


def decode_value(raw: bytes | None) -> int | str | None:
    if raw is None:
        return None
    text = raw.decode("utf-8", "replace")
    return int(text) if text.lstrip("-").isdigit() else text


class Deliveries:
    """Collects delivery reports of one operation's sends."""

    def __init__(self) -> None:
        self.results: dict[int, tuple[int | None, str | None]] = {}

    def callback(self, index: int) -> Callable[[Any, Any], None]:
        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                self.results[index] = (None, str(err.name() if hasattr(err, "name") else err))
            else:
                offset = msg.offset()
                self.results[index] = (offset if offset is not None and offset >= 0 else None,
                                       None)

        return on_delivery


def send_outcome(sends: Sequence[list[Any]], deliveries: Deliveries, remaining: int
                 ) -> Outcome:
    """``ok`` when every send was delivered, else ``info`` (the effect is unknown)."""
    value = []
    errors = []
    for i, (_, k, v) in enumerate(sends):
        offset, err = deliveries.results.get(i, (None, "not delivered"))
        value.append(["send", k, [offset, v]])
        if err is not None:
            errors.append(err)
    if remaining or errors:
        return Outcome("info", value, error=errors[0] if errors else "timeout")
    return Outcome("ok", value)


def poll_value(messages: Sequence[Any], topic: str) -> tuple[dict[str, list[list[Any]]],
                                                               str | None]:
    reads: dict[str, list[list[Any]]] = {}
    error = None
    for msg in messages:
        err = msg.error()
        if err is not None:
            if err.fatal():
                error = str(err.name())
            continue
        if msg.topic() != topic:
            continue
        reads.setdefault(key_of(msg.partition()), []).append(
            [msg.offset(), decode_value(msg.value())])
    return reads, error


@dataclass
class QueueClient:
    """A producer and a consumer for one client process."""

    view: ClusterView
    mode: str  # "assign" | "subscribe"
    rng: random.Random
    keys: list[str]
    producer: Any = None
    consumer: Any = None
    rebalances: list[dict[str, Any]] = field(default_factory=list)

    def open(self, recorder: Recorder, process: int) -> None:
        from confluent_kafka import Consumer, Producer, TopicPartition

        self.producer = Producer(producer_config(self.view))
        if self.mode == "subscribe":
            self.consumer = Consumer(consumer_config(
                self.view, f"jepsen-{self.view.run_id}-queue",
                {"enable.auto.commit": True, "auto.commit.interval.ms": 500}))
            recorder.invoke(process, "subscribe", [TOPIC])
            self.consumer.subscribe([TOPIC], on_assign=self._on_assign,
                                    on_revoke=self._on_revoke)
            recorder.complete("ok", process, "subscribe", [TOPIC])
        else:
            keys = sorted(self.rng.sample(self.keys, self.rng.randint(1, len(self.keys))))
            self.consumer = Consumer(consumer_config(
                self.view, f"jepsen-{self.view.run_id}-p{process}"))
            recorder.invoke(process, "assign", keys, seek_to_beginning=True)
            self.consumer.assign([TopicPartition(TOPIC, partition_of(k), -2) for k in keys])
            recorder.complete("ok", process, "assign", keys, seek_to_beginning=True)

    def _on_assign(self, consumer: Any, partitions: Sequence[Any]) -> None:
        self.rebalances.append({"assigned": True,
                                "keys": [key_of(p.partition) for p in partitions]})

    def _on_revoke(self, consumer: Any, partitions: Sequence[Any]) -> None:
        self.rebalances.append({"revoked": True,
                                "keys": [key_of(p.partition) for p in partitions]})

    def invoke(self, f: str, value: Any) -> Outcome:
        if f == "send":
            return self._send(value)
        if f == "poll":
            return self._poll()
        raise ValueError(f"queue client cannot {f}")

    def _send(self, value: list[list[Any]]) -> Outcome:
        deliveries = Deliveries()
        enqueued = 0
        try:
            for i, (_, k, v) in enumerate(value):
                self.producer.produce(TOPIC, value=str(v).encode(), partition=partition_of(k),
                                      on_delivery=deliveries.callback(i))
                enqueued += 1
        except Exception as exc:  # BufferError, KafkaException: this message was not queued
            if enqueued == 0:
                return Outcome("fail", value, error=f"produce: {exc}")
            self.producer.flush(SEND_TIMEOUT_S + 1)
            return send_outcome(value, deliveries, 1)
        remaining = self.producer.flush(SEND_TIMEOUT_S + 1)
        return send_outcome(value, deliveries, remaining)

    def _poll(self) -> Outcome:
        self.rebalances = []
        messages = self.consumer.consume(num_messages=POLL_MESSAGES_MAX, timeout=POLL_TIMEOUT_S)
        reads, error = poll_value(messages, TOPIC)
        extra = {"rebalance_log": self.rebalances} if self.rebalances else {}
        if error is not None:
            return Outcome("info", [["poll", reads]], error=error, extra=extra)
        return Outcome("ok", [["poll", reads]], extra=extra)

    def close(self) -> None:
        closers = [lambda: self.consumer.close() if self.consumer is not None else None,
                   lambda: self.producer.flush(0) if self.producer is not None else None]
        _close_quietly(closers)


def _close_quietly(closers: Sequence[Callable[[], Any]], timeout_s: float = 5.0) -> None:
    """Close librdkafka handles in a daemon thread: a close can block on a dead broker."""

    def run() -> None:
        for close in closers:
            with contextlib.suppress(Exception):  # a broken client: nothing more to do
                close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)


def final_reads(view: ClusterView, recorder: Recorder, keys: Sequence[str], topic: str,
                deadline_s: float) -> str | None:
    """Fresh process: assign every key from the beginning and poll (``read_committed``) until
    each key's position reaches its high watermark, or the deadline passes.

    The target is the ``read_uncommitted`` high watermark, not the last stable offset a
    ``read_committed`` consumer sees: a transaction left open by a client that died (or whose
    abort failed) holds the LSO until the coordinator aborts it at ``transaction.timeout.ms``,
    and stopping at that LSO would leave every committed message after it unread (``unseen``,
    uncovered). So the reads wait for that abort instead, up to the deadline. Returns a note
    when they could not finish, else ``None``."""
    from confluent_kafka import Consumer, TopicPartition

    process = recorder.new_process()
    group = f"jepsen-{view.run_id}-final-{process}"
    handles: list[Any] = []
    try:
        consumer = Consumer(consumer_config(view, group))
        handles.append(consumer)
        # Asks for the log end (high watermark) without joining a group or reading a record.
        probe = Consumer(consumer_config(view, f"{group}-probe",
                                         {"isolation.level": "read_uncommitted"}))
        handles.append(probe)
        recorder.invoke(process, "assign", list(keys), seek_to_beginning=True)
        consumer.assign([TopicPartition(topic, partition_of(k), -2) for k in keys])
        recorder.complete("ok", process, "assign", list(keys), seek_to_beginning=True)
        return _poll_to_ends(consumer, probe, recorder, process, keys, topic, deadline_s)
    finally:
        for handle in reversed(handles):  # each on its own: one stuck close must not skip another
            _close_quietly([handle.close])


def _poll_to_ends(consumer: Any, probe: Any, recorder: Recorder, process: int,
                  keys: Sequence[str], topic: str, deadline_s: float) -> str | None:
    known_ends: dict[str, int] = {}  # the last end read for each key, for the note

    def read_ends() -> dict[str, int]:
        fresh = _high_watermarks(probe, topic, keys, deadline_s)
        known_ends.update(fresh)
        # A key whose end could not be read now is never caught up: no early stop on it.
        return {k: fresh.get(k, UNKNOWN_END) for k in keys}

    ends, ends_at = read_ends(), time.monotonic()
    positions: dict[str, int] = {}
    while time.monotonic() < deadline_s:
        recorder.invoke(process, "poll", [["poll"]])
        messages = consumer.consume(num_messages=POLL_MESSAGES_MAX, timeout=0.5)
        reads, error = poll_value(messages, topic)
        if error is not None:
            recorder.complete("info", process, "poll", [["poll", reads]], error=error)
            return f"final reads stopped on a poll error: {error}"
        recorder.complete("ok", process, "poll", [["poll", reads]])
        for k, pairs in reads.items():
            positions[k] = max(positions.get(k, 0), pairs[-1][0] + 1)
        if messages:
            continue
        positions.update(_positions(consumer, topic, keys))
        if _behind(positions, ends):
            # Ask again now and then: an end that could not be read (or a log truncated on a
            # leader change since) must not keep the reads waiting for the deadline.
            if time.monotonic() - ends_at > FINAL_REFRESH_S:
                ends, ends_at = read_ends(), time.monotonic()
            continue
        # Caught up with the ends read earlier: confirm against fresh ones before stopping.
        ends, ends_at = read_ends(), time.monotonic()
        if not _behind(positions, ends):
            return None
    behind = {k: (positions.get(k, 0), known_ends.get(k, "unknown"))
              for k in _behind(positions, ends)}
    return ("final reads did not reach the high watermark before the deadline "
            f"(key: (position, last high watermark read)): {behind}")


def _behind(positions: dict[str, int], ends: dict[str, int]) -> list[str]:
    return sorted(k for k, end in ends.items() if positions.get(k, 0) < end)


def _high_watermarks(consumer: Any, topic: str, keys: Sequence[str],
                     deadline_s: float) -> dict[str, int]:
    """The high watermark of each key that ``consumer`` (read_uncommitted) could read before
    the deadline; keys it could not read are left out."""
    from confluent_kafka import TopicPartition

    ends: dict[str, int] = {}
    for k in keys:
        timeout_s = min(WATERMARK_TIMEOUT_S, deadline_s - time.monotonic())
        if timeout_s <= 0:
            break
        try:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition_of(k)),
                                                     timeout=timeout_s, cached=False)
            ends[k] = int(high)
        except Exception:  # not now (no leader, a timeout): asked again at the next refresh
            pass
    return ends


def _positions(consumer: Any, topic: str, keys: Sequence[str]) -> dict[str, int]:
    from confluent_kafka import TopicPartition

    out: dict[str, int] = {}
    try:
        for tp in consumer.position([TopicPartition(topic, partition_of(k)) for k in keys]):
            if tp.offset >= 0:
                out[key_of(tp.partition)] = tp.offset
    except Exception:  # positions are only a hint for when to stop
        pass
    return out


@dataclass
class QueueWorkload:
    """``--workload queue``; ``sub_via`` is ``assign``, ``subscribe`` or both (per process)."""

    sub_via: tuple[str, ...] = ("assign", "subscribe")
    partitions: int = PARTITIONS
    name: str = "queue"

    def keys(self) -> list[str]:
        return [key_of(p) for p in range(self.partitions)]

    def setup(self, view: ClusterView) -> None:
        create_topic(view, TOPIC, self.partitions)

    def new_client(self, view: ClusterView, process: int, rng: random.Random,
                   worker: int) -> QueueClient:
        mode = self.sub_via[process % len(self.sub_via)]
        return QueueClient(view, mode, rng, self.keys())

    def next_op(self, rng: random.Random, next_value: Callable[[], int]) -> tuple[str, Any]:
        if rng.random() < 0.5:
            n = rng.choice((1, 1, 2, 3))
            return "send", [["send", rng.choice(self.keys()), next_value()] for _ in range(n)]
        return "poll", [["poll"]]

    def final_reads(self, view: ClusterView, recorder: Recorder, deadline_s: float
                    ) -> str | None:
        return final_reads(view, recorder, self.keys(), TOPIC, deadline_s)

    def check(self, history: History) -> dict[str, Any]:
        return check(history, CheckerOptions())
