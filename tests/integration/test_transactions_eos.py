"""Exactly-once consume-transform-produce with confluent-kafka: a loop process reads an input
topic in a consumer group, writes one output per input and commits its consumer offsets in
the same transaction (``send_offsets_to_transaction`` with the consumer's group metadata). The
loop is SIGKILLed and restarted at random points; afterwards a read_committed consumer must
see each input's result exactly once."""

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

RECORDS = 20_000
PARTITIONS = 3
KILLS = 3

LOOP = r'''
import sys
import confluent_kafka

bootstrap, source, sink, group = sys.argv[1:5]
consumer = confluent_kafka.Consumer({
    "bootstrap.servers": bootstrap, "group.id": group, "group.instance.id": "eos-loop",
    "session.timeout.ms": 6000, "enable.auto.commit": False,
    "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
producer = confluent_kafka.Producer({
    "bootstrap.servers": bootstrap, "transactional.id": "eos-loop-" + group,
    "transaction.timeout.ms": 30000, "linger.ms": 5})
producer.init_transactions(30)
consumer.subscribe([source])
print("started", flush=True)
while True:
    messages = consumer.consume(num_messages=200, timeout=0.5)
    messages = [m for m in messages if m.error() is None]
    if not messages:
        continue
    producer.begin_transaction()
    for m in messages:
        producer.produce(sink, key=m.key(), value=b"out-" + m.value(), partition=m.partition())
    positions = consumer.position(consumer.assignment())
    producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 30)
    producer.commit_transaction(30)
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
    try:
        # Kill at random progress points (and a random delay after them), so that the
        # loop dies between or inside transactions, after it committed some offsets.
        kill_points = sorted(rng.uniform(0.1, 0.8) * RECORDS for _ in range(KILLS))
        for point in kill_points:
            deadline = time.monotonic() + 60
            while (done := _committed(broker.bootstrap, group, source)) < point:
                assert loop.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, f"seed {seed}: stuck at {done}"
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 0.2))
            assert loop.poll() is None, log_path.read_text()[-3000:]
            loop.kill()  # SIGKILL
            loop.wait()
            kills.append(done)
            loop = start()
        deadline = time.monotonic() + 90
        while _committed(broker.bootstrap, group, source) != RECORDS:
            assert loop.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, f"seed {seed}: the loop did not finish"
            time.sleep(0.5)
    finally:
        loop.kill()
        loop.wait()
    values = _read_committed(broker.bootstrap, sink)
    expected = [b"out-%d" % i for i in range(RECORDS)]
    duplicates = len(values) - len(set(values))
    missing = set(expected) - set(values)
    assert len(kills) == KILLS and all(0 < k < RECORDS for k in kills), kills
    assert duplicates == 0 and not missing and len(values) == RECORDS, \
        f"seed {seed}: {duplicates} duplicates, {len(missing)} missing, {len(values)} read"
    # Close kill points can kill a restarted loop before it printed "started" (its
    # init_transactions is still running); at least one restart must have run for real.
    assert log_path.read_text().count("started") >= 2
