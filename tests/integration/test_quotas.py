"""Client quotas against a real node process with real clients: quotas set with ``raftlog
quotas`` (DescribeClientQuotas/AlterClientQuotas), a confluent-kafka producer over its
byte-rate quota throttled to it over 30 s without losing a record while an unthrottled one
beside it runs at full speed, a quota on a SASL user, and a consumer byte-rate quota.

One node for the module; every test uses its own client ids, users and topics.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import confluent_consume, create_topic

PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
JAAS = f'{PLAIN_MODULE} required user_bob="bob-secret" user_carol="carol-secret";'
RECORD_BYTES = 1000
PRODUCE_QUOTA = 256_000  # bytes/s
MEASURE_S = 30.0


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("quotas"), extra_properties={
        "sasl.jaas.config": JAAS, "sasl.enabled.mechanisms": "PLAIN"})
    process.start()
    try:
        yield process
    finally:
        process.stop()


def _quotas(node: BrokerProcess, *args: str, check: bool = True
            ) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "raftlog", "quotas", *args, "--bootstrap-server",
         node.bootstrap], capture_output=True, text=True, timeout=60, check=False)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_quotas_tool_alters_and_describes(node: BrokerProcess) -> None:
    user, client = _name("u"), _name("c")
    _quotas(node, "alter", "--user", user, "--client-id", client, "--add-config",
            "producer_byte_rate=1024,request_percentage=12.5")
    _quotas(node, "alter", "--user-default", "--add-config", "consumer_byte_rate=4096")
    shown = _quotas(node, "describe", "--user", user, "--client-id", client).stdout
    assert shown.strip() == (f"user={user},client-id={client}: producer_byte_rate=1024,"
                             " request_percentage=12.5")
    assert "user=<default>: consumer_byte_rate=4096" in _quotas(node, "describe").stdout
    # Only the named entity: /users/U alone has no quotas.
    assert _quotas(node, "describe", "--user", user).stdout == ""
    refused = _quotas(node, "alter", "--client-id", client, "--add-config",
                      "producer_byte_rate=1.5,bogus=1", check=False)
    assert refused.returncode == 1 and "INVALID_REQUEST" in refused.stderr
    assert "validated" in _quotas(node, "alter", "--client-id", client, "--add-config",
                                  "consumer_byte_rate=10", "--validate-only").stdout
    assert _quotas(node, "describe", "--client-id", client).stdout == ""
    _quotas(node, "alter", "--user", user, "--client-id", client, "--delete-config",
            "producer_byte_rate,request_percentage")
    _quotas(node, "alter", "--user-default", "--delete-config", "consumer_byte_rate")
    assert _quotas(node, "describe", "--user", user, "--client-id", client).stdout == ""


class _Producer:
    """A confluent-kafka producer in its own thread, producing RECORD_BYTES records for
    ``duration_s``: as fast as the client takes them, or at ``rate`` bytes/s."""

    def __init__(self, node: BrokerProcess, topic: str, client_id: str,
                 rate: float | None = None, extra: dict[str, Any] | None = None) -> None:
        from confluent_kafka import Producer

        self.topic, self.rate = topic, rate
        self.acked: list[tuple[float, bytes]] = []  # (when, value)
        self.errors: list[str] = []
        self.throttles: list[int] = []
        self.producer = Producer({
            "bootstrap.servers": node.bootstrap, "client.id": client_id, "acks": "all",
            "linger.ms": 5, "batch.size": 16384, "queue.buffering.max.kbytes": 512,
            "throttle_cb": lambda event: self.throttles.append(event.throttle_time),
            **(extra or {})})
        self.start = 0.0

    def _delivered(self, error: Any, message: Any) -> None:
        if error is not None:
            self.errors.append(str(error))
        else:
            self.acked.append((time.monotonic(), message.value()))

    def run(self, duration_s: float) -> None:
        self.start = time.monotonic()
        end, sent, seq = self.start + duration_s, 0, 0
        while (now := time.monotonic()) < end:
            if self.rate is not None and sent >= (now - self.start) * self.rate:
                self.producer.poll(0.005)
                continue
            value = f"{seq:010d}".encode().ljust(RECORD_BYTES, b"x")
            try:
                self.producer.produce(self.topic, value=value, on_delivery=self._delivered)
            except BufferError:
                self.producer.poll(0.05)
                continue
            seq += 1
            sent += RECORD_BYTES
            self.producer.poll(0)

    def rate_over(self, seconds: float) -> float:
        """Acknowledged bytes per second in the first ``seconds`` of the run."""
        done = [v for t, v in self.acked if t - self.start <= seconds]
        return len(done) * RECORD_BYTES / seconds

    def finish(self) -> None:
        assert self.producer.flush(60) == 0
        assert not self.errors, self.errors[:3]


def _readable(node: BrokerProcess, topic: str) -> set[bytes]:
    return {r.value for r in confluent_consume(node.bootstrap, topic, [0], timeout_s=60)
            if r.value is not None}


def test_producer_over_its_quota_is_throttled_to_it_and_loses_nothing(
        node: BrokerProcess) -> None:
    throttled_id, free_id = _name("throttled"), _name("free")
    topic_a, topic_b = _name("quota-a"), _name("quota-b")
    create_topic(node.bootstrap, topic_a)
    create_topic(node.bootstrap, topic_b)
    _quotas(node, "alter", "--client-id", throttled_id, "--add-config",
            f"producer_byte_rate={PRODUCE_QUOTA}")
    throttled = _Producer(node, topic_a, throttled_id)
    free = _Producer(node, topic_b, free_id, rate=8 * PRODUCE_QUOTA)
    beside = threading.Thread(target=free.run, args=(MEASURE_S,))
    beside.start()
    try:
        throttled.run(MEASURE_S)
    finally:
        beside.join()
    throttled.finish()
    free.finish()
    achieved = throttled.rate_over(MEASURE_S)
    unthrottled = free.rate_over(MEASURE_S)
    print(f"throttled producer: {achieved / 1000:.1f} kB/s on a {PRODUCE_QUOTA / 1000:.0f}"
          f" kB/s quota ({achieved / PRODUCE_QUOTA:.3f}); unthrottled beside it:"
          f" {unthrottled / 1000:.1f} kB/s; throttle events {len(throttled.throttles)}")
    assert 0.8 * PRODUCE_QUOTA <= achieved <= 1.2 * PRODUCE_QUOTA
    assert throttled.throttles and max(throttled.throttles) > 0
    # The unthrottled producer got what it offered (8x the quota) and was never throttled.
    assert unthrottled >= 0.8 * 8 * PRODUCE_QUOTA
    assert not [t for t in free.throttles if t > 0]
    # Every acknowledged record is readable.
    for producer, topic in ((throttled, topic_a), (free, topic_b)):
        acked = {value for _, value in producer.acked}
        assert acked <= _readable(node, topic)
    _quotas(node, "alter", "--client-id", throttled_id, "--delete-config", "producer_byte_rate")


def test_a_users_quota_throttles_that_user_only(node: BrokerProcess) -> None:
    topic = _name("quota-user")
    create_topic(node.bootstrap, topic)
    quota = 50_000
    _quotas(node, "alter", "--user", "bob", "--add-config", f"producer_byte_rate={quota}")
    sasl = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN"}
    bob = _Producer(node, topic, "app", extra={
        **sasl, "sasl.username": "bob", "sasl.password": "bob-secret"})
    carol = _Producer(node, topic, "app", rate=20 * quota, extra={
        **sasl, "sasl.username": "carol", "sasl.password": "carol-secret"})
    seconds = 6.0
    beside = threading.Thread(target=carol.run, args=(seconds,))
    beside.start()
    try:
        bob.run(seconds)
    finally:
        beside.join()
    bob.finish()
    carol.finish()
    print(f"user bob: {bob.rate_over(seconds) * seconds / 1000:.0f} kB in {seconds:g} s on a"
          f" {quota / 1000:.0f} kB/s quota; carol: {carol.rate_over(seconds) / 1000:.0f} kB/s")
    # Kafka's rate starts as if 10 windows had passed, so a new client may send 10 s of its
    # quota at once; after that it is held to the quota.
    assert bob.rate_over(seconds) * seconds <= quota * (seconds + 11) * 1.2
    assert bob.throttles and max(bob.throttles) > 0
    assert carol.rate_over(seconds) >= 0.8 * 20 * quota
    assert not [t for t in carol.throttles if t > 0]
    acked = {value for _, value in bob.acked} | {value for _, value in carol.acked}
    assert acked <= _readable(node, topic)
    _quotas(node, "alter", "--user", "bob", "--delete-config", "producer_byte_rate")


def test_consumer_over_its_quota_is_throttled_and_misses_nothing(node: BrokerProcess) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic, consumer_id = _name("quota-fetch"), _name("slow")
    create_topic(node.bootstrap, topic)
    # Small batches: a fetch returns at least one whole batch, whatever its max bytes.
    filler = Producer({"bootstrap.servers": node.bootstrap, "linger.ms": 5,
                       "batch.size": 16384})
    count = 3000
    for seq in range(count):
        filler.produce(topic, value=f"{seq:010d}".encode().ljust(RECORD_BYTES, b"x"))
        filler.poll(0)
    assert filler.flush(60) == 0
    quota = 100_000
    _quotas(node, "alter", "--client-id", consumer_id, "--add-config",
            f"consumer_byte_rate={quota}")
    throttles: list[int] = []
    consumer = Consumer({
        "bootstrap.servers": node.bootstrap, "group.id": consumer_id,
        "client.id": consumer_id, "enable.auto.commit": False,
        "max.partition.fetch.bytes": 65536, "fetch.max.bytes": 65536,
        "message.max.bytes": 65536,
        "throttle_cb": lambda event: throttles.append(event.throttle_time)})
    values: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        seconds = 6.0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            values += [m.value() for m in consumer.consume(500, timeout=0.2) if not m.error()]
        within = len(values) * RECORD_BYTES
        print(f"throttled consumer: {within / 1000:.0f} kB in {seconds:g} s on a"
              f" {quota / 1000:.0f} kB/s quota; throttle events {len(throttles)}")
        # At most 10 s of quota at once (Kafka's first window) and the rest at the quota.
        assert within <= quota * (seconds + 11) * 1.2 + 65536
        assert within < count * RECORD_BYTES * 0.7
        assert throttles and max(throttles) > 0
        # Without the quota the consumer reads on: every record, in order, none skipped.
        _quotas(node, "alter", "--client-id", consumer_id, "--delete-config",
                "consumer_byte_rate")
        deadline = time.monotonic() + 60
        while len(values) < count and time.monotonic() < deadline:
            values += [m.value() for m in consumer.consume(500, timeout=0.5) if not m.error()]
    finally:
        consumer.close()
    assert [int(v[:10]) for v in values] == list(range(count))
