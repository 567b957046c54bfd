"""Exactly-once consume-transform-produce with confluent-kafka: a loop process reads an input
topic in a consumer group, writes one output per input and commits its consumer offsets in
the same transaction (``send_offsets_to_transaction`` with the consumer's group metadata). Over
50,000 records the loop is SIGKILLed and restarted three times at random points, and the broker
itself is SIGKILLed and restarted once under the running loop; afterwards a read_committed
consumer must see each input's result exactly once.

The loop handles errors as confluent-kafka documents: an abortable error aborts the
transaction and rewinds the consumer to its committed offsets, a retriable commit error retries
the commit, a fatal one ends the process. After the broker SIGKILL the test restarts a loop
that ended on a fatal error, as a supervisor would (at most twice). The consumer is a dynamic
group member: as a static one (group.instance.id) it was fenced (FENCED_INSTANCE_ID, fatal)
when it rejoined the restarted broker after an earlier restart of the loop had replaced its
member id (reported to the consumer-group owner)."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import create_topic, unique_topic

confluent_kafka = pytest.importorskip("confluent_kafka")

RECORDS = 50_000
PARTITIONS = 3
KILLS = 3

FATAL_EXIT = 3
# A loop that ended on a fatal client error after the broker SIGKILL is restarted, as its
# supervisor would; at most this many times (see the module docstring).
FATAL_RESTARTS_MAX = 2

LOOP = r'''
import sys
import time
import confluent_kafka

bootstrap, source, sink, group = sys.argv[1:5]
# librdkafka >= 2.10 "re-bootstraps" when every known broker is down (here: the only one,
# SIGKILLed); in 2.16.1 that left send_offsets_to_transaction hung past its timeout, with
# the broker handle stuck "terminating". Kafka clusters have more than one broker; this
# test's single broker needs the pre-2.10 behaviour.
NO_REBOOTSTRAP = {"metadata.recovery.strategy": "none"}
FATAL_EXIT = 3
consumer = confluent_kafka.Consumer({
    "bootstrap.servers": bootstrap, "group.id": group, "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 1000, "enable.auto.commit": False,
    "auto.offset.reset": "earliest", "isolation.level": "read_committed", **NO_REBOOTSTRAP})
producer = confluent_kafka.Producer({
    "bootstrap.servers": bootstrap, "transactional.id": "eos-loop-" + group,
    "transaction.timeout.ms": 30000, "linger.ms": 5, **NO_REBOOTSTRAP})


def retrying(call, *args):
    # init/abort: repeat while the broker is away (retriable errors and timeouts).
    for _ in range(120):
        try:
            return call(*args)
        except confluent_kafka.KafkaException as exc:
            if exc.args[0].fatal():
                raise
            print("retrying", call.__name__, exc.args[0].name(), flush=True)
            time.sleep(0.5)
    raise SystemExit("gave up")


def rewind():
    # After an abort the consumer's positions are past records whose output was dropped.
    for _ in range(120):
        try:
            committed = consumer.committed(consumer.assignment(), timeout=10)
            break
        except confluent_kafka.KafkaException as exc:  # e.g. UNSTABLE_OFFSET_COMMIT
            print("retrying committed", exc.args[0].name(), flush=True)
            time.sleep(0.5)
    else:
        raise SystemExit("gave up")
    for tp in committed:
        if tp.offset < 0:
            tp.offset = confluent_kafka.OFFSET_BEGINNING
        consumer.seek(tp)


retrying(producer.init_transactions, 30)
consumer.subscribe([source])
print("started", flush=True)
while True:
    messages = consumer.consume(num_messages=200, timeout=0.5)
    for m in messages:
        if m.error() is not None and m.error().fatal():
            # Documented: a fatal error ends this client; its supervisor starts a new one.
            print("fatal consumer error:", m.error(), flush=True)
            sys.exit(FATAL_EXIT)
    messages = [m for m in messages if m.error() is None]
    if not messages:
        continue
    try:
        producer.begin_transaction()
        for m in messages:
            producer.produce(sink, key=m.key(), value=b"out-" + m.value(),
                             partition=m.partition())
        positions = consumer.position(consumer.assignment())
        producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 30)
        while True:
            try:
                producer.commit_transaction(30)
                break
            except confluent_kafka.KafkaException as exc:
                error = exc.args[0]
                if not error.retriable() or error.txn_requires_abort() or error.fatal():
                    raise
                print("retrying commit", error.name(), flush=True)
    except confluent_kafka.KafkaException as exc:
        error = exc.args[0]
        if error.fatal() or not error.txn_requires_abort():
            print("fatal producer error:", error, flush=True)
            sys.exit(FATAL_EXIT)
        print("aborting", error.name(), flush=True)
        retrying(producer.abort_transaction, 30)
        rewind()
'''


def _read_committed(bootstrap: str, topic: str) -> list[bytes]:
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": "eos-check", "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "isolation.level": "read_committed",
        "enable.partition.eof": True})
    out: list[bytes] = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0)
                         for p in range(PARTITIONS)])
        eof: set[int] = set()
        deadline = time.monotonic() + 60
        while len(eof) < PARTITIONS and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=2000, timeout=0.5):
                error = message.error()
                if error is not None:
                    if error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                        eof.add(message.partition())
                        continue
                    raise AssertionError(f"consumer error: {error}")
                eof.discard(message.partition())
                out.append(message.value())
    finally:
        consumer.close()
    return out


def _committed(bootstrap: str, group: str, topic: str) -> int:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                         "isolation.level": "read_committed"})
    try:
        parts = consumer.committed([confluent_kafka.TopicPartition(topic, p)
                                    for p in range(PARTITIONS)], timeout=30)
        return sum(max(p.offset, 0) for p in parts)
    except confluent_kafka.KafkaException:
        return -1  # e.g. UNSTABLE_OFFSET_COMMIT until a transaction ends
    finally:
        consumer.close()


def test_exactly_once_pipeline_survives_sigkill(broker: BrokerProcess, tmp_path: Path) -> None:
    source = unique_topic("eos-in")
    sink = unique_topic("eos-out")
    group = unique_topic("eos-group")
    create_topic(broker.bootstrap, source, partitions=PARTITIONS)
    create_topic(broker.bootstrap, sink, partitions=PARTITIONS)
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap,
                                         "enable.idempotence": True, "linger.ms": 20})
    for i in range(RECORDS):
        producer.produce(source, key=b"%d" % i, value=b"%d" % i, partition=i % PARTITIONS)
    assert producer.flush(60) == 0
    script = tmp_path / "eos_loop.py"
    script.write_text(LOOP)
    log_path = tmp_path / "eos_loop.log"
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)

    def start() -> subprocess.Popen[bytes]:
        with log_path.open("ab") as log:
            return subprocess.Popen([sys.executable, str(script), broker.bootstrap, source,
                                     sink, group], stdout=log, stderr=subprocess.STDOUT)

    loop = start()
    kills: list[int] = []
    broker_killed_at = -1
    fatal_restarts: list[int] = []

    def restart_if_fatal(loop: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        code = loop.poll()
        if code is None:
            return loop
        assert code == FATAL_EXIT and broker_killed_at >= 0 and \
            len(fatal_restarts) < FATAL_RESTARTS_MAX, \
            f"loop exited with {code}:\n{log_path.read_text()[-3000:]}"
        fatal_restarts.append(code)
        return start()

    try:
        # Kill at random progress points (and a random delay after them), so that the
        # loop dies between or inside transactions, after it committed some offsets. One
        # more point, between two of them, SIGKILLs the broker under the running loop.
        kill_points = sorted(rng.uniform(0.1, 0.8) * RECORDS for _ in range(KILLS))
        broker_point = rng.uniform(kill_points[0], kill_points[1])
        for point in sorted([*kill_points, broker_point]):
            deadline = time.monotonic() + 60
            while (done := _committed(broker.bootstrap, group, source)) < point:
                loop = restart_if_fatal(loop)
                assert time.monotonic() < deadline, \
                    f"seed {seed}: stuck at {done}\n{log_path.read_text()[-3000:]}"
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 0.2))
            loop = restart_if_fatal(loop)
            if point == broker_point:
                broker.kill()  # SIGKILL: the loop keeps running and must ride it out
                broker.start()
                broker_killed_at = done
                continue
            loop.kill()  # SIGKILL
            loop.wait()
            kills.append(done)
            loop = start()
        deadline = time.monotonic() + 150
        while _committed(broker.bootstrap, group, source) != RECORDS:
            loop = restart_if_fatal(loop)
            assert time.monotonic() < deadline, f"seed {seed}: the loop did not finish"
            time.sleep(0.5)
    finally:
        loop.kill()
        loop.wait()
    values = _read_committed(broker.bootstrap, sink)
    print(f"seed {seed}: loop killed at {kills}, broker killed at {broker_killed_at}, "
          f"{len(fatal_restarts)} restarts after a fatal client error")
    expected = [b"out-%d" % i for i in range(RECORDS)]
    duplicates = len(values) - len(set(values))
    missing = set(expected) - set(values)
    assert len(kills) == KILLS and all(0 < k < RECORDS for k in kills), kills
    assert 0 < broker_killed_at < RECORDS, broker_killed_at
    assert duplicates == 0 and not missing and len(values) == RECORDS, \
        f"seed {seed}: {duplicates} duplicates, {len(missing)} missing, {len(values)} read"
    # Close kill points can kill a restarted loop before it printed "started" (its
    # init_transactions is still running); at least one restart must have run for real.
    assert log_path.read_text().count("started") >= 2
