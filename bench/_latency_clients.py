"""The clients of the latency benchmark: confluent-kafka producing to a raftlog cluster and
nats-py publishing to a JetStream R3 stream, either on an absolute schedule or one record at
a time. Each returns the `Recorder` of its run.

On a schedule, record i is sent at start + i / rate, however late the previous ones were, so
the schedule never drifts: a client that fell behind sends at once until it has caught up (how
late each send was is recorded as its send lag). Between sends the client waits inside
`producer.poll()` (librdkafka wakes it for a delivery report) or `asyncio.sleep()` (the event
loop handles PubAcks meanwhile), so an acknowledgement is timed when it arrives, not at the
next send. Both wait in whole milliseconds, so a send can be up to ~1 ms late at 1,000/s and
sends come in bursts of ~10 at 10,000/s.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import suppress
from functools import partial
from typing import Any

import nats
from _latency import Recorder
from _nats_side import STREAM, SUBJECT
from _raftlog_cluster import CLIENT_LOG_LEVEL, RaftlogCluster, partitions_ready, wait_until
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

TOPIC = "latency"
TOPIC_CONFIG = {"min.insync.replicas": "2"}
DRAIN_TIMEOUT_S = 30.0  # after the last send, for the outstanding acknowledgements
ONE_RECORD_TIMEOUT_S = 35.0  # one-at-a-time: a record's report arrives by message.timeout.ms
ONE_AT_A_TIME_WARMUP_RECORDS = 50
NATS_MAX_PENDING = 1_000_000  # publish_async never waits for a slot: the schedule decides

# acks=all, no idempotence (the NATS side publishes without Nats-Msg-Id dedupe), librdkafka's
# defaults otherwise (batch.size 1 MB, many requests in flight); linger.ms per scenario.
PRODUCER_CONFIG: dict[str, Any] = {
    "acks": "all",
    "enable.idempotence": False,
    "compression.type": "none",
    "message.timeout.ms": 30_000,
    "log_level": CLIENT_LOG_LEVEL,
}


def create_topic(cluster: RaftlogCluster, timeout_s: float = 30.0,
                 config: dict[str, str] | None = None) -> None:
    """1 partition, replication factor 3, min.insync.replicas=2 (``config`` over that);
    waits for a full ISR."""
    admin = cluster.admin()
    new = NewTopic(TOPIC, 1, 3, config={**TOPIC_CONFIG, **(config or {})})
    admin.create_topics([new], request_timeout=15)[TOPIC].result(timeout=timeout_s)
    wait_until(lambda: partitions_ready(admin, TOPIC, 1, 3), timeout_s,
               f"{TOPIC} to get a leader and a full ISR")


def _producer(bootstrap: str, linger_ms: int) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG,
                         "linger.ms": linger_ms})
    producer.list_topics(TOPIC, timeout=10)  # connect and learn the leader before the clock
    return producer


def _produce(producer: Producer, payload: bytes, on_delivery: Any) -> None:
    while True:
        try:
            producer.produce(TOPIC, payload, partition=0, on_delivery=on_delivery)
            return
        except BufferError:  # librdkafka's queue is full: serve reports, then try again
            producer.poll(0.01)


def produce_at_rate(bootstrap: str, rate_records_s: float, linger_ms: int, warmup_s: float,
                    duration_s: float, payload: bytes) -> Recorder:
    """Send on the schedule for warmup_s + duration_s; the warm-up's records are not counted.
    A record's latency is from its produce() call to its delivery report."""
    producer = _producer(bootstrap, linger_ms)
    warmup = round(rate_records_s * warmup_s)
    recorder = Recorder(warmup)
    interval_s = 1.0 / rate_records_s
    poll = producer.poll
    start = time.perf_counter()
    for i in range(warmup + round(rate_records_s * duration_s)):
        due = start + i * interval_s
        while (now := time.perf_counter()) < due:
            poll(max(due - now, 0.001))  # whole ms (librdkafka); returns early on a report
        sent = time.perf_counter()
        _produce(producer, payload, partial(recorder.kafka_report, i, sent))
        recorder.sending(i, sent, due)
        poll(0)
    producer.flush(DRAIN_TIMEOUT_S)
    return recorder


def produce_one_at_a_time(bootstrap: str, records: int, payload: bytes,
                          warmup: int = ONE_AT_A_TIME_WARMUP_RECORDS) -> Recorder:
    """produce() one record, poll until its delivery report, then the next (linger.ms=0)."""
    producer = _producer(bootstrap, 0)
    recorder = Recorder(warmup)
    for i in range(warmup + records):
        sent = time.perf_counter()
        _produce(producer, payload, partial(recorder.kafka_report, i, sent))
        recorder.sending(i, sent)
        while recorder.completed <= i and time.perf_counter() - sent < ONE_RECORD_TIMEOUT_S:
            producer.poll(0.05)  # returns as soon as the report has been served
        if recorder.completed <= i:
            break  # no report: LatencyRun counts the record as failed, the run stops here
    producer.flush(DRAIN_TIMEOUT_S)
    return recorder


# -- NATS --------------------------------------------------------------------------------------


def publish_at_rate(url: str, rate_records_s: float, warmup_s: float, duration_s: float,
                    payload: bytes) -> Recorder:
    return asyncio.run(_publish_at_rate(url, rate_records_s, warmup_s, duration_s, payload))


async def _publish_at_rate(url: str, rate_records_s: float, warmup_s: float,
                           duration_s: float, payload: bytes) -> Recorder:
    """js.publish_async() on the schedule; a message's latency is from that call to the
    done-callback of its PubAck future."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(publish_async_max_pending=NATS_MAX_PENDING)
        await js.stream_info(STREAM)
        await (await js.publish_async(SUBJECT, payload))  # the reply subscription, unclocked
        warmup = round(rate_records_s * warmup_s)
        recorder = Recorder(warmup)
        interval_s = 1.0 / rate_records_s
        start = time.perf_counter()
        for i in range(warmup + round(rate_records_s * duration_s)):
            due = start + i * interval_s
            # Always yield, so that PubAcks are handled even while catching up.
            await asyncio.sleep(max(due - time.perf_counter(), 0.0))
            sent = time.perf_counter()
            future = await js.publish_async(SUBJECT, payload)
            future.add_done_callback(partial(recorder.nats_ack, i, sent))
            recorder.sending(i, sent, due)
        with suppress(asyncio.TimeoutError):  # what is still pending counts as failed
            await asyncio.wait_for(js.publish_async_completed(), DRAIN_TIMEOUT_S)
        return recorder
    finally:
        await nc.close()


def publish_one_at_a_time(url: str, records: int, payload: bytes,
                          warmup: int = ONE_AT_A_TIME_WARMUP_RECORDS) -> Recorder:
    return asyncio.run(_publish_one_at_a_time(url, records, payload, warmup))


async def _publish_one_at_a_time(url: str, records: int, payload: bytes,
                                 warmup: int) -> Recorder:
    """`await js.publish(...)` in a loop: from the call to its return with the PubAck."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=ONE_RECORD_TIMEOUT_S)
        await js.stream_info(STREAM)
        recorder = Recorder(warmup)
        for i in range(warmup + records):
            sent = time.perf_counter()
            recorder.sending(i, sent)
            error: Exception | None = None
            try:
                await js.publish(SUBJECT, payload)
            except Exception as exc:  # a timeout or an API error: counted as failed
                error = exc
            recorder.finished(i, sent, error)
        return recorder
    finally:
        await nc.close()
