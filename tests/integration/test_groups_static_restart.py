"""A static consumer (confluent-kafka ``group.instance.id``) survives a SIGKILL of the group
coordinator's broker after it was itself restarted once.

The consumer restart replaces the static member by a new member id for the same instance id
(KIP-345); the coordinator must have persisted that replacement in ``__consumer_offsets`` so
that, reloaded after the broker is SIGKILLed and restarted (or by the node that takes over),
it still knows the new id. If it reloaded the old id instead, the running consumer's next
Heartbeat/JoinGroup would be answered FENCED_INSTANCE_ID, which is fatal for the consumer.

* Single node: consumer restarted, broker SIGKILLed and restarted.
* Three nodes: the consumer restarts while the group's ``__consumer_offsets`` partition cannot
  take writes (``min.insync.replicas`` = 3 with a follower down), so the record naming the new
  member id cannot be written. The coordinator must not hand that id out (it answers
  COORDINATOR_NOT_AVAILABLE until the write succeeds); then the coordinator's node is
  SIGKILLed and another node reloads the group.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from raftlog.client.connection import KafkaConnection
from raftlog.protocol.internal_topics import (
    OFFSETS_TOPIC,
    OFFSETS_TOPIC_PARTITIONS,
    coordinator_partition,
)
from raftlog.protocol.schemas import FIND_COORDINATOR
from tests.integration import test_cluster_failover
from tests.integration.cluster_harness import Cluster, wait_until
from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import create_topic, start_broker, unique_topic

PARTITIONS = 2
BATCH = 20
TIMEOUT_S = 60.0


def _produce(bootstrap: str, topic: str, start: int, acks: str = "all") -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": acks,
                         "enable.idempotence": False, "log_level": 2,
                         "message.timeout.ms": int(TIMEOUT_S * 1000)})
    for i in range(start, start + BATCH):
        producer.produce(topic, f"{i:04d}".encode(), key=b"%d" % i,
                         partition=i % PARTITIONS)
    assert producer.flush(TIMEOUT_S) == 0


class _StaticConsumer:
    """A confluent-kafka consumer with a group instance id that records every error."""

    def __init__(self, bootstrap: str, group: str, topic: str, instance: str) -> None:
        from confluent_kafka import Consumer

        self.errors: list[Any] = []
        self.values: set[str] = set()
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "log_level": 2,
            "group.instance.id": instance, "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 300, "auto.offset.reset": "earliest",
            "enable.auto.commit": True, "auto.commit.interval.ms": 200,
            "error_cb": self.errors.append})
        self.consumer.subscribe([topic])

    def poll_until(self, wanted: set[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not wanted <= self.values:
            assert not self.fenced(), f"fenced: {self.errors}"
            assert time.monotonic() < deadline, (
                f"missing {sorted(wanted - self.values)}; errors {self.errors}")
            message = self.consumer.poll(0.1)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                self.errors.append(error)
                assert not error.fatal(), f"fatal consumer error: {error}"
                continue
            self.values.add(message.value().decode())

    def poll_for(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            message = self.consumer.poll(0.1)
            if message is None:
                continue
            if message.error() is not None:
                self.errors.append(message.error())
            else:
                self.values.add(message.value().decode())

    def fenced(self) -> bool:
        from confluent_kafka import KafkaError

        return any(e.code() == KafkaError.FENCED_INSTANCE_ID or e.fatal()
                   for e in self.errors)

    def close(self) -> None:
        self.consumer.close()


def _member_ids(bootstrap: str, group: str) -> dict[str | None, str]:
    from raftlog.tools.consumer_groups import GroupAdmin

    async def run() -> dict[str | None, str]:
        with trio.fail_after(TIMEOUT_S):
            while True:
                try:
                    admin = await GroupAdmin.connect(bootstrap)
                    try:
                        described = await admin.describe(group)
                    finally:
                        await admin.aclose()
                    if described.group_state == "Stable":
                        return {m.group_instance_id: m.member_id for m in described.members}
                except Exception:
                    pass
                await trio.sleep(0.2)

    return trio.run(run)


def _values(start: int) -> set[str]:
    return {f"{i:04d}" for i in range(start, start + BATCH)}


def test_restarted_static_consumer_is_not_fenced_after_broker_sigkill(
        broker: BrokerProcess, tmp_path: Path) -> None:
    bootstrap = broker.bootstrap
    topic = unique_topic("static-restart")
    group = f"g-{topic}"
    create_topic(bootstrap, topic, partitions=PARTITIONS)
    _produce(bootstrap, topic, 0)

    first = _StaticConsumer(bootstrap, group, topic, "app-1")
    try:
        first.poll_until(_values(0), TIMEOUT_S)
        first_id = _member_ids(bootstrap, group)["app-1"]
    finally:
        first.close()  # a static member closes without LeaveGroup
    # The app restarts: the same instance id replaces the member under a new member id.
    second = _StaticConsumer(bootstrap, group, topic, "app-1")
    try:
        _produce(bootstrap, topic, BATCH)
        second.poll_until(_values(BATCH), TIMEOUT_S)
        second_id = _member_ids(bootstrap, group)["app-1"]
        assert second_id != first_id

        broker.kill()
        start_broker(broker)
        _produce(bootstrap, topic, 2 * BATCH)
        # The running consumer reconnects, heartbeats with its member id and keeps going.
        second.poll_until(_values(2 * BATCH), TIMEOUT_S)
        # A few more heartbeats against the reloaded coordinator.
        until = time.monotonic() + 2.0
        while time.monotonic() < until:
            second.consumer.poll(0.1)
        assert not second.fenced(), second.errors
        assert _member_ids(bootstrap, group) == {"app-1": second_id}
    finally:
        second.close()


# -- three nodes: the replacement record cannot be written, then the coordinator dies ----------


@pytest.fixture
def strict_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Three nodes where every write needs all three replicas (min.insync.replicas=3) and a
    dead follower leaves the ISR quickly."""
    cluster = Cluster.create(tmp_path / "cluster", extra_properties={
        "min.insync.replicas": "3", "replica.lag.time.max.ms": "1500"})
    try:
        cluster.start_all()
        cluster.wait_ready()
        yield cluster
    finally:
        try:
            cluster.stop_all()
        finally:
            cluster.kill_all()


def _group_coordinator(cluster: Cluster, group: str) -> int:
    async def find() -> int:
        with trio.fail_after(TIMEOUT_S):
            while True:
                for node in cluster.nodes.values():
                    if not node.alive():
                        continue
                    try:
                        async with await KafkaConnection.connect(*node.address) as conn:
                            found = await conn.request(FIND_COORDINATOR,
                                                       {"key": group, "key_type": 0})
                        if found.error_code == 0:
                            return int(found.node_id)
                    except Exception:
                        pass
                await trio.sleep(0.2)

    return trio.run(find)


def _offsets_isr(cluster: Cluster, group: str) -> list[int]:
    index = coordinator_partition(group, OFFSETS_TOPIC_PARTITIONS)
    partition = cluster.partition(OFFSETS_TOPIC, index)
    return sorted(partition.isr_nodes)


def test_static_replacement_not_persisted_is_not_handed_out(strict_cluster: Cluster) -> None:
    cluster = strict_cluster
    topic = unique_topic("static-isr")
    group = f"g-{topic}"
    test_cluster_failover.create_topic(cluster, topic, PARTITIONS)
    _produce(cluster.bootstrap, topic, 0)
    first = _StaticConsumer(cluster.bootstrap, group, topic, "app-1")
    try:
        first.poll_until(_values(0), TIMEOUT_S)
    finally:
        first.close()
    coordinator = _group_coordinator(cluster, group)
    follower = next(n for n in cluster.nodes if n != coordinator)
    # The group's offsets partition loses a follower: group metadata cannot be written.
    cluster.nodes[follower].kill()
    wait_until(lambda: follower not in _offsets_isr(cluster, group), TIMEOUT_S,
               "the dead follower to leave the offsets partition's ISR")
    second = _StaticConsumer(cluster.bootstrap, group, topic, "app-1")
    try:
        second.poll_for(3.0)
        # The new member id was not handed out: the consumer has no assignment yet.
        assert not second.consumer.assignment(), "joined without its member id in the log"
        cluster.nodes[follower].start()
        cluster.nodes[follower].wait_listening()
        wait_until(lambda: follower in _offsets_isr(cluster, group), TIMEOUT_S,
                   "the follower to rejoin the offsets partition's ISR")
        _produce(cluster.bootstrap, topic, BATCH)
        second.poll_until(_values(BATCH), TIMEOUT_S)
        member_id = second.consumer.memberid()
        # The coordinator's node dies; another node reloads the group from its replica.
        cluster.nodes[coordinator].kill()
        wait_until(lambda: _group_coordinator(cluster, group) != coordinator, TIMEOUT_S,
                   "another node to coordinate the group")
        second.poll_for(3.0)  # heartbeats against the new coordinator
        assert not second.fenced(), second.errors
        assert second.consumer.memberid() == member_id
        cluster.nodes[coordinator].start()
        cluster.nodes[coordinator].wait_listening()
        _produce(cluster.bootstrap, topic, 2 * BATCH)
        second.poll_until(_values(2 * BATCH), TIMEOUT_S)
        assert not second.fenced(), second.errors
    finally:
        second.close()
