"""Committed offsets on a 3-node cluster: they survive SIGKILL of the group coordinator
(another replica of the offsets partition takes over and reloads the group from the log)
and a full cluster restart."""

from __future__ import annotations

import time
from typing import Any

import trio

from raftlog.client.connection import KafkaConnection
from raftlog.protocol.schemas import FIND_COORDINATOR
from tests.integration.cluster_harness import Cluster, cluster3
from tests.integration.helpers import unique_topic

__all__ = ["cluster3"]  # the fixture, imported for pytest

GROUP = "g-failover"
TIMEOUT_S = 60.0


def _coordinator(bootstrap: str) -> int:
    async def ask() -> int:
        for address in bootstrap.split(","):
            host, port = address.rsplit(":", 1)
            try:
                async with await KafkaConnection.connect(host, int(port), timeout_s=2) as conn:
                    response = await conn.request(FIND_COORDINATOR,
                                                  {"key": GROUP, "key_type": 0}, timeout_s=3)
                    if response.error_code == 0:
                        return int(response.node_id)
            except Exception:
                continue
        return -1

    return trio.run(ask)


def _committed(bootstrap: str, topic: str) -> list[int] | None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP})
    try:
        result = consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)],
                                    timeout=5)
        return [tp.offset for tp in result]
    except Exception:
        return None
    finally:
        consumer.close()


def _wait_committed(bootstrap_fn: Any, topic: str, expected: list[int]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    last = None
    while time.monotonic() < deadline:
        last = _committed(bootstrap_fn(), topic)
        if last == expected:
            return
        time.sleep(0.3)
    raise AssertionError(f"committed offsets {last}, expected {expected}")


def test_offsets_survive_coordinator_kill_and_full_restart(cluster3: Cluster) -> None:
    from confluent_kafka import Consumer, TopicPartition

    topic = unique_topic("failover")
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": cluster3.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 3)])[topic].result(timeout=30)
    consumer = Consumer({"bootstrap.servers": cluster3.bootstrap, "group.id": GROUP,
                         "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 100), TopicPartition(topic, 1, 200)],
                        asynchronous=False)
    finally:
        consumer.close()
    coordinator = _coordinator(cluster3.bootstrap)
    assert coordinator in cluster3.nodes
    cluster3.nodes[coordinator].kill()
    _wait_committed(cluster3.live_bootstrap, topic, [100, 200])
    new_coordinator = _coordinator(cluster3.live_bootstrap())
    assert new_coordinator not in (-1, coordinator)

    cluster3.kill_all()
    cluster3.start_all()
    cluster3.wait_ready()
    _wait_committed(cluster3.live_bootstrap, topic, [100, 200])
