"""At-least-once consumption of 100,000 records by a group of three consumer processes
(examples/at_least_once.py: process a batch, then commit it), one of them SIGKILLed midway.

Every record must be processed, and the only records processed twice must be ones the killed
member processed after its partitions' last committed offsets (its uncommitted tail): the
survivors take those partitions over from the committed offsets once the coordinator has
evicted the dead member (session.timeout.ms), and nothing else is repeated.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import trio

from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import create_topic, unique_topic

RECORDS = 100_000
PARTITIONS = 6
MEMBERS = 3
KILL_AT_RECORDS = RECORDS // 2
BATCH = 500
# About 0.1 ms of work per record (a batch takes tens of ms to process, its commit a few):
# the kill then lands while member 0 is processing a batch it has not committed yet.
RECORD_WORK_S = 0.0001
VALUE_WIDTH = 6  # values are f"{i:06d}": one line of the output is VALUE_WIDTH + 1 bytes
TIMEOUT_S = 120.0
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "at_least_once.py"


def _group_ready(bootstrap: str, group: str) -> bool:
    """Stable, MEMBERS members, PARTITIONS / MEMBERS partitions each (coordinator's view)."""
    from raftlog.tools.consumer_groups import GroupAdmin, decode_assignment

    async def run() -> bool:
        admin = await GroupAdmin.connect(bootstrap)
        try:
            described = await admin.describe(group)
        except Exception:
            return False
        finally:
            await admin.aclose()
        sizes = [sum(len(p) for p in decode_assignment(m.member_assignment).values())
                 for m in described.members]
        return bool(described.group_state == "Stable"
                    and sizes == [PARTITIONS // MEMBERS] * MEMBERS)

    return trio.run(run)


def _produce(bootstrap: str, topic: str) -> dict[str, tuple[int, int]]:
    """Produces RECORDS values round-robin over the partitions; value → (partition, offset)."""
    from confluent_kafka import Producer

    placed: dict[str, tuple[int, int]] = {}

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        placed[message.value().decode()] = (message.partition(), message.offset())

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "batch.size": 1 << 20, "enable.idempotence": True})
    for i in range(RECORDS):
        producer.produce(topic, f"{i:0{VALUE_WIDTH}d}".encode(), partition=i % PARTITIONS,
                         on_delivery=delivered)
        if i % 5000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert len(placed) == RECORDS
    return placed


def _committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        result = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)],
                                    timeout=20)
        return {tp.partition: tp.offset for tp in result}
    finally:
        consumer.close()


def _values(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line]


def test_at_least_once_100k_with_a_member_sigkilled(broker: BrokerProcess,
                                                     tmp_path: Path) -> None:
    topic = unique_topic("alo-100k")
    group = f"g-{topic}"
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    outputs = [tmp_path / f"member-{i}.txt" for i in range(MEMBERS)]
    logs = [tmp_path / f"member-{i}.log" for i in range(MEMBERS)]
    workers: list[subprocess.Popen[bytes]] = []

    def diagnostics() -> str:
        return "\n".join(f"--- member {i}\n{log.read_text()[-2000:]}"
                         for i, log in enumerate(logs) if log.exists())

    try:
        for output, log in zip(outputs, logs, strict=True):
            with log.open("wb") as out:
                workers.append(subprocess.Popen(
                    [sys.executable, str(EXAMPLE), "--bootstrap-server", broker.bootstrap,
                     "--topic", topic, "--group", group, "--output", str(output),
                     "--batch", str(BATCH), "--delay", str(RECORD_WORK_S),
                     "--idle-exit", str(TIMEOUT_S)],
                    stdout=out, stderr=subprocess.STDOUT))
        # One stable generation of three members before any record exists.
        deadline = time.monotonic() + TIMEOUT_S
        while not _group_ready(broker.bootstrap, group):
            assert time.monotonic() < deadline, f"group never settled\n{diagnostics()}"
            assert all(w.poll() is None for w in workers), diagnostics()
            time.sleep(0.2)
        placed = _produce(broker.bootstrap, topic)

        def processed_lines() -> int:
            return sum(p.stat().st_size if p.exists() else 0
                       for p in outputs) // (VALUE_WIDTH + 1)

        # SIGKILL member 0 midway (half the records processed) while it is in the middle of
        # processing a batch: its output grew between two looks 2 ms apart.
        deadline = time.monotonic() + TIMEOUT_S
        previous_bytes = -1
        while True:
            assert time.monotonic() < deadline, f"stuck at {processed_lines()}\n{diagnostics()}"
            assert all(w.poll() is None for w in workers), diagnostics()
            size = outputs[0].stat().st_size if outputs[0].exists() else 0
            if processed_lines() >= KILL_AT_RECORDS and 0 <= previous_bytes < size:
                break
            previous_bytes = size
            time.sleep(0.002)
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait(10)
        total_at_kill = processed_lines()
        time.sleep(0.5)  # a commit the killed member had already sent is applied by now
        committed_at_kill = _committed(broker.bootstrap, group, topic)
        killed = _values(outputs[0])

        # The survivors take over the dead member's partitions after its session timeout.
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            counts = Counter(v for output in outputs for v in _values(output))
            if len(counts) == RECORDS:
                break
            assert time.monotonic() < deadline, \
                f"only {len(counts)} of {RECORDS} records processed\n{diagnostics()}"
            assert all(w.poll() is None for w in workers[1:]), diagnostics()
            time.sleep(0.2)
        time.sleep(1.0)  # anything still to come would be a duplicate
        counts = Counter(v for output in outputs for v in _values(output))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()

    assert set(counts) == set(placed), "a record was never processed"
    duplicates = {v for v, n in counts.items() if n > 1}
    tail = {v for v in killed if placed[v][1] >= committed_at_kill[placed[v][0]]}
    print(f"processed {sum(counts.values())} for {RECORDS} records; member 0 killed after "
          f"{len(killed)} (all members: {total_at_kill}); its uncommitted tail: {len(tail)}; "
          f"processed twice: {len(duplicates)}")
    assert killed and total_at_kill < RECORDS, "the kill did not come midway"
    assert tail, "the kill did not land in an uncommitted batch: nothing to check"
    assert max(counts.values()) <= 2, "a record was processed three times or more"
    assert duplicates <= tail, (
        f"{len(duplicates - tail)} records processed twice outside the killed member's "
        f"uncommitted tail, e.g. {sorted(duplicates - tail)[:5]}\n{diagnostics()}")
    # The survivors resumed exactly at the committed offsets: the tail came back in full.
    assert tail <= duplicates, f"{len(tail - duplicates)} records of the tail not redone"
