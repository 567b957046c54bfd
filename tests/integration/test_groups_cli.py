"""`raftlog groups` against a real broker and a real confluent-kafka consumer group:
list/describe (members, assignments, committed offsets, lag), reset-offsets refused while
the group is active, dry run and execute once it is empty, then delete."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import create_topic, unique_topic, wait_until

PARTITIONS = 3
RECORDS = 90  # 30 per partition (keys spread round-robin below)
CONSUMED = 60


def _raftlog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raftlog", "groups", *args],
                          capture_output=True, text=True, timeout=60)


def _produce(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(RECORDS):
        producer.produce(topic, value=b"v%d" % i, partition=i % PARTITIONS)
    assert producer.flush(15) == 0


def _rows(stdout: str, first: str) -> list[list[str]]:
    """The rows of the table whose header starts with ``first``."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [first])
    rows = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


def _offsets(stdout: str, column: int) -> dict[int, int]:
    return {int(row[2]): int(row[column]) for row in _rows(stdout, "GROUP")}


def test_groups_cli(broker: BrokerProcess) -> None:
    from confluent_kafka import Consumer, TopicPartition

    topic = unique_topic("groups-cli")
    group = unique_topic("g-cli")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    _produce(broker.bootstrap, topic)
    bootstrap = ["--bootstrap-server", broker.bootstrap]

    consumers: list[Any] = [
        Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                  "client.id": f"cli-test-{i}", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                  "heartbeat.interval.ms": 300})
        for i in range(2)]
    try:
        for c in consumers:
            c.subscribe([topic])
        consumed = 0
        deadline = time.monotonic() + 30
        # Read and commit 20 records of each partition; keep both members in the group.
        positions = dict.fromkeys(range(PARTITIONS), 0)
        while consumed < CONSUMED or not all(c.assignment() for c in consumers):
            assert time.monotonic() < deadline, f"consumed {consumed}, {positions}"
            for c in consumers:
                message = c.poll(0.05)
                if message is None or message.error():
                    continue
                p = message.partition()
                if positions[p] < CONSUMED // PARTITIONS and message.offset() == positions[p]:
                    positions[p] += 1
                    consumed += 1
                    c.commit(offsets=[TopicPartition(topic, p, positions[p])],
                             asynchronous=False)
        assert positions == dict.fromkeys(range(PARTITIONS), CONSUMED // PARTITIONS)

        listed = _raftlog("list", *bootstrap)
        assert listed.returncode == 0, listed.stderr
        assert group in listed.stdout.split()

        # Heartbeats keep both members; the group is Stable once both own partitions.
        def stable() -> bool:
            for c in consumers:
                c.poll(0.05)
            described = _raftlog("describe", *bootstrap, "--group", group)
            return described.returncode == 0 and "STATE Stable" in described.stdout
        wait_until(stable, 20, "a Stable group")
        for c in consumers:
            c.poll(0.05)
        described = _raftlog("describe", *bootstrap, "--group", group)
        assert described.returncode == 0, described.stderr
        assert "MEMBERS 2" in described.stdout and "PROTOCOL-TYPE consumer" in described.stdout
        members = _rows(described.stdout, "CONSUMER-ID")
        assert sorted(row[3] for row in members) == ["cli-test-0", "cli-test-1"]
        # The assignments decoded from the opaque bytes cover every partition once.
        assigned = sorted(int(p) for row in members
                          for p in row[5].removeprefix(f"{topic}(").rstrip(")").split(","))
        assert assigned == list(range(PARTITIONS))
        table = _rows(described.stdout, "GROUP")
        assert len(table) == PARTITIONS
        for row in table:
            assert row[:2] == [group, topic]
            assert row[3:6] == ["20", "30", "10"], row  # current, log end, lag
            assert row[6].startswith("cli-test-")  # consumer id: client.id-uuid

        # Active group: reset-offsets is refused, nothing is committed.
        refused = _raftlog("reset-offsets", *bootstrap, "--group", group, "--topic", topic,
                           "--to-earliest", "--execute")
        assert refused.returncode == 1
        assert "inactive" in refused.stderr and "Stable" in refused.stderr
        not_deleted = _raftlog("delete", *bootstrap, "--group", group)
        assert not_deleted.returncode == 1 and "NON_EMPTY_GROUP" in not_deleted.stderr
    finally:
        for c in consumers:
            c.close()  # LeaveGroup: the group becomes Empty

    wait_until(lambda: "STATE Empty" in _raftlog("describe", *bootstrap, "--group",
                                                 group).stdout, 15, "an Empty group")
    dry = _raftlog("reset-offsets", *bootstrap, "--group", group, "--topic", topic,
                   "--to-earliest")
    assert dry.returncode == 0, dry.stderr
    assert _offsets(dry.stdout, 3) == dict.fromkeys(range(PARTITIONS), 20)
    assert _offsets(dry.stdout, 4) == dict.fromkeys(range(PARTITIONS), 0)
    assert "Dry run" in dry.stdout
    still = _raftlog("describe", *bootstrap, "--group", group)
    assert _offsets(still.stdout, 3) == dict.fromkeys(range(PARTITIONS), 20)

    executed = _raftlog("reset-offsets", *bootstrap, "--group", group, "--topic",
                        f"{topic}:0,1", "--to-offset", "5", "--execute")
    assert executed.returncode == 0, executed.stderr
    after = _raftlog("describe", *bootstrap, "--group", group)
    assert _offsets(after.stdout, 3) == {0: 5, 1: 5, 2: 20}
    assert _offsets(after.stdout, 5) == {0: 25, 1: 25, 2: 10}  # lag

    latest = _raftlog("reset-offsets", *bootstrap, "--group", group, "--all-topics",
                      "--to-latest", "--execute")
    assert latest.returncode == 0, latest.stderr
    # Every record has a timestamp before now: --to-datetime now is the log end as well,
    # and a time long ago is the beginning.
    past = _raftlog("reset-offsets", *bootstrap, "--group", group, "--topic", topic,
                    "--to-datetime", "2000-01-01T00:00:00Z")
    assert _offsets(past.stdout, 3) == dict.fromkeys(range(PARTITIONS), 30)
    assert _offsets(past.stdout, 4) == dict.fromkeys(range(PARTITIONS), 0)

    deleted = _raftlog("delete", *bootstrap, "--group", group)
    assert deleted.returncode == 0, deleted.stderr
    assert "successful" in deleted.stdout
    assert group not in _raftlog("list", *bootstrap).stdout.split()
    missing = _raftlog("delete", *bootstrap, "--group", group)
    assert missing.returncode == 1 and "GROUP_ID_NOT_FOUND" in missing.stderr
    gone = _raftlog("describe", *bootstrap, "--group", group)
    assert gone.returncode == 1 and "does not exist" in gone.stderr
