"""Static membership, fencing, offset expiry and bad commits against a real broker process.

* A static member (confluent-kafka ``group.instance.id``) that restarts within
  ``session.timeout.ms`` rejoins without a rebalance and keeps its partitions.
* A second JoinGroup/Heartbeat/OffsetCommit with a known instance id and another member id
  gets FENCED_INSTANCE_ID and changes nothing.
* ``offsets.retention.ms`` (KIP-211): offsets of a group with members never expire; those of
  an Empty group expire once it has been empty that long; a commit-only group's expire by
  commit time. Tombstones reach ``__consumer_offsets`` (nothing comes back after a restart).
* Commits from past generations and from evicted members get Kafka's error codes and change
  nothing.

The broker of this module runs with a short retention and a low minimum session timeout so
these take seconds instead of days.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from raftlog.client.connection import KafkaConnection
from raftlog.group.records import GroupKey, OffsetKey, decode_key
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.internal_topics import (
    OFFSETS_TOPIC,
    OFFSETS_TOPIC_PARTITIONS,
    coordinator_partition,
)
from raftlog.protocol.schemas import FIND_COORDINATOR
from raftlog.protocol.schemas_group import (
    HEARTBEAT,
    JOIN_GROUP,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    SYNC_GROUP,
)
from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import create_topic, fetch_records, start_broker, unique_topic

RETENTION_MS = 2_000
INITIAL_DELAY_MS = 1_000
METADATA_MAX_BYTES = 64
TIMEOUT_S = 40.0
PARTITIONS = 4


@pytest.fixture(scope="module")
def group_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(Path(tmp_path_factory.mktemp("group-broker")), extra_properties={
        "offsets.retention.ms": str(RETENTION_MS),
        "offsets.retention.check.interval.ms": "200",
        "group.min.session.timeout.ms": "500",
        "group.initial.rebalance.delay.ms": str(INITIAL_DELAY_MS),
        "offset.metadata.max.bytes": str(METADATA_MAX_BYTES),
    })
    process.start()
    try:
        yield process
    finally:
        process.stop()


# -- raw protocol helpers ------------------------------------------------------------------------


async def _coordinator(bootstrap: str, group: str) -> KafkaConnection:
    """A connection to ``group``'s coordinator, once it has loaded the group's partition."""
    host, port = bootstrap.rsplit(":", 1)
    with trio.fail_after(TIMEOUT_S):
        while True:
            async with await KafkaConnection.connect(host, int(port)) as conn:
                found = await conn.request(FIND_COORDINATOR, {"key": group, "key_type": 0})
            if found.error_code == 0:
                coordinator = await KafkaConnection.connect(found.host, found.port)
                loaded = await coordinator.request(OFFSET_FETCH, {
                    "group_id": group, "topics": [], "require_stable": False}, version=7)
                if loaded.error_code == 0:
                    return coordinator
                await coordinator.aclose()
            await trio.sleep(0.1)


async def _join(conn: KafkaConnection, group: str, member: str = "",
                instance: str | None = None, session_ms: int = 6000) -> Any:
    body = {"group_id": group, "session_timeout_ms": session_ms,
            "rebalance_timeout_ms": session_ms, "member_id": member,
            "group_instance_id": instance, "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}]}
    response = await conn.request(JOIN_GROUP, body, version=5, timeout_s=TIMEOUT_S)
    if response.error_code == ErrorCode.MEMBER_ID_REQUIRED:
        body["member_id"] = response.member_id
        response = await conn.request(JOIN_GROUP, body, version=5, timeout_s=TIMEOUT_S)
    return response


async def _sync(conn: KafkaConnection, group: str, generation: int, member: str,
                instance: str | None = None, assignments: dict[str, bytes] | None = None
                ) -> int:
    response = await conn.request(SYNC_GROUP, {
        "group_id": group, "generation_id": generation, "member_id": member,
        "group_instance_id": instance,
        "assignments": [{"member_id": m, "assignment": a}
                        for m, a in (assignments or {}).items()]}, version=3,
        timeout_s=TIMEOUT_S)
    return int(response.error_code)


async def _heartbeat(conn: KafkaConnection, group: str, generation: int, member: str,
                     instance: str | None = None) -> int:
    response = await conn.request(HEARTBEAT, {
        "group_id": group, "generation_id": generation, "member_id": member,
        "group_instance_id": instance}, version=3)
    return int(response.error_code)


async def _commit(conn: KafkaConnection, group: str, topic: str, offset: int, *,
                  generation: int = -1, member: str = "", instance: str | None = None,
                  partition: int = 0, metadata: str = "") -> int:
    body = {"group_id": group, "generation_id_or_member_epoch": generation,
            "member_id": member, "group_instance_id": instance,
            "topics": [{"name": topic, "partitions": [
                {"partition_index": partition, "committed_offset": offset,
                 "committed_leader_epoch": -1, "committed_metadata": metadata}]}]}
    response = await conn.request(OFFSET_COMMIT, body, version=7)
    return int(response.topics[0].partitions[0].error_code)


async def _fetched(conn: KafkaConnection, group: str, topic: str, partition: int = 0) -> int:
    response = await conn.request(OFFSET_FETCH, {
        "group_id": group, "topics": [{"name": topic, "partition_indexes": [partition]}],
        "require_stable": False}, version=7)
    assert response.error_code == 0
    return int(response.topics[0].partitions[0].committed_offset)


# -- static membership ---------------------------------------------------------------------------


def _static_consumer(bootstrap: str, group: str, instance: str) -> Any:
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                     "group.instance.id": instance, "session.timeout.ms": 10_000,
                     "heartbeat.interval.ms": 300, "auto.offset.reset": "earliest"})


def _partitions(consumer: Any) -> list[int]:
    return sorted(tp.partition for tp in consumer.assignment())


def _describe(bootstrap: str, group: str) -> Any:
    from raftlog.tools.consumer_groups import GroupAdmin

    async def run() -> Any:
        admin = await GroupAdmin.connect(bootstrap)
        try:
            return await admin.describe(group)
        finally:
            await admin.aclose()

    return trio.run(run)


def test_static_member_restart_keeps_its_assignment_without_rebalance(
        group_broker: BrokerProcess) -> None:
    bootstrap = group_broker.bootstrap
    topic = unique_topic("static")
    group = f"g-{topic}"
    create_topic(bootstrap, topic, partitions=PARTITIONS)
    rebalances = {"s1": 0, "s2": 0}

    def subscribe(consumer: Any, name: str) -> None:
        def on_assign(_: Any, __: Any) -> None:
            rebalances[name] += 1

        consumer.subscribe([topic], on_assign=on_assign)

    consumers = {name: _static_consumer(bootstrap, group, name) for name in ("s1", "s2")}
    for name, consumer in consumers.items():
        subscribe(consumer, name)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not all(len(_partitions(c)) == 2 for c in consumers.values()):
            assert time.monotonic() < deadline, {n: _partitions(c) for n, c in consumers.items()}
            for consumer in consumers.values():
                consumer.poll(0.05)
        before = {name: _partitions(c) for name, c in consumers.items()}
        assert sorted(before["s1"] + before["s2"]) == list(range(PARTITIONS))
        described = _describe(bootstrap, group)
        assert described.group_state == "Stable"
        old_ids = {m.group_instance_id: m.member_id for m in described.members}

        def poll_all(seconds: float) -> None:
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                for consumer in consumers.values():
                    consumer.poll(0.05)

        def restart(name: str, other: str) -> None:
            """``name`` restarts: closed without LeaveGroup (static members do not leave),
            back at once. It gets its partitions back; ``other`` sees no rebalance."""
            ids_before = {m.group_instance_id: m.member_id
                          for m in _describe(bootstrap, group).members}
            other_assigned = rebalances[other]
            consumers.pop(name).close()
            consumers[name] = _static_consumer(bootstrap, group, name)
            subscribe(consumers[name], name)
            deadline = time.monotonic() + TIMEOUT_S
            while _partitions(consumers[name]) != before[name]:
                assert time.monotonic() < deadline, _partitions(consumers[name])
                poll_all(0.05)
            poll_all(2.0)  # a few heartbeats: a rebalance would revoke the other's partitions
            assert {n: _partitions(c) for n, c in consumers.items()} == before
            assert rebalances[other] == other_assigned, f"{other} went through a rebalance"
            described = _describe(bootstrap, group)
            assert described.group_state == "Stable"
            ids = {m.group_instance_id: m.member_id for m in described.members}
            assert ids[other] == ids_before[other] and ids[name] != ids_before[name]

        # Both restart in turn, so the group leader is among them.
        restart("s2", "s1")
        restart("s1", "s2")

        # The fenced old id of s2 is refused everywhere; nothing changes.
        async def impostor() -> None:
            conn = await _coordinator(bootstrap, group)
            async with conn:
                fenced = await _join(conn, group, member=old_ids["s2"], instance="s2")
                assert fenced.error_code == ErrorCode.FENCED_INSTANCE_ID
                assert await _heartbeat(conn, group, 1, old_ids["s2"], "s2") == \
                    ErrorCode.FENCED_INSTANCE_ID
                assert await _commit(conn, group, topic, 99, generation=1,
                                     member=old_ids["s2"], instance="s2") == \
                    ErrorCode.FENCED_INSTANCE_ID
                assert await _fetched(conn, group, topic) != 99

        assigned_before = dict(rebalances)
        trio.run(impostor)
        poll_all(1.0)
        assert {name: _partitions(c) for name, c in consumers.items()} == before
        assert rebalances == assigned_before
    finally:
        for consumer in consumers.values():
            consumer.close()


# -- group.initial.rebalance.delay.ms --------------------------------------------------------


def test_initial_rebalance_delay_gathers_consumers_into_one_generation(
        group_broker: BrokerProcess) -> None:
    """Three consumers subscribing 200 ms apart: with the delay, the group's first generation
    holds all three, so each is assigned exactly once (without it, the first would get every
    partition alone and then go through two more rebalances)."""
    from confluent_kafka import Consumer

    bootstrap = group_broker.bootstrap
    topic = unique_topic("initial-delay")
    create_topic(bootstrap, topic, partitions=6)

    async def coordinator_ready() -> None:
        # The first FindCoordinator creates __consumer_offsets; a consumer that asks then
        # backs off and would join late, whatever the delay. Not what this test is about.
        conn = await _coordinator(bootstrap, f"g-{topic}")
        await conn.aclose()

    trio.run(coordinator_ready)
    assigned: list[int] = [0, 0, 0]
    consumers: list[Any] = []
    try:
        for i in range(3):
            consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                                 "session.timeout.ms": 6000, "heartbeat.interval.ms": 300})

            def on_assign(_: Any, __: Any, i: int = i) -> None:
                assigned[i] += 1

            consumer.subscribe([topic], on_assign=on_assign)
            consumers.append(consumer)
            pause = time.monotonic() + 0.2
            while time.monotonic() < pause:
                for c in consumers:
                    c.poll(0.02)
        deadline = time.monotonic() + TIMEOUT_S
        while [len(_partitions(c)) for c in consumers] != [2, 2, 2]:
            assert time.monotonic() < deadline, [_partitions(c) for c in consumers]
            for c in consumers:
                c.poll(0.05)
        settle = time.monotonic() + 1.0
        while time.monotonic() < settle:
            for c in consumers:
                c.poll(0.05)
        assert assigned == [1, 1, 1], f"assignments per consumer: {assigned}"
    finally:
        for c in consumers:
            c.close()


# -- offsets.retention.ms --------------------------------------------------------------------


def _offsets_log_tombstones(bootstrap: str, group: str) -> set[Any]:
    index = coordinator_partition(group, OFFSETS_TOPIC_PARTITIONS)
    records = fetch_records(bootstrap, OFFSETS_TOPIC, index)
    keys = set()
    for record in records:
        if record.key is None or record.value is not None:
            continue
        key = decode_key(record.key)
        if key.group == group:
            keys.add(key)
    return keys


def test_offsets_expire_after_retention(group_broker: BrokerProcess) -> None:
    from confluent_kafka import Consumer

    bootstrap = group_broker.bootstrap
    topic = unique_topic("expiry")
    create_topic(bootstrap, topic, partitions=1)
    simple, members = f"simple-{topic}", f"members-{topic}"

    # A consumer group with a member: its committed offset outlives the retention.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": members,
                         "session.timeout.ms": 6000, "heartbeat.interval.ms": 300,
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not consumer.assignment():
            assert time.monotonic() < deadline
            consumer.poll(0.05)
        from confluent_kafka import TopicPartition

        consumer.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)

        async def commit_simple() -> None:
            conn = await _coordinator(bootstrap, simple)
            async with conn:
                assert await _commit(conn, simple, topic, 7) == ErrorCode.NONE
                assert await _fetched(conn, simple, topic) == 7

        trio.run(commit_simple)
        stay = time.monotonic() + 2 * RETENTION_MS / 1000
        while time.monotonic() < stay:
            consumer.poll(0.05)
        committed = consumer.committed([TopicPartition(topic, 0)], timeout=10)
        assert committed[0].offset == 5, "a group with members lost its offsets"
    finally:
        consumer.close()  # the group is Empty from here: retention starts now
    emptied_at = time.monotonic()

    async def not_yet_expired() -> int:
        conn = await _coordinator(bootstrap, members)
        async with conn:
            return await _fetched(conn, members, topic)

    # Expiry counts from when the group became Empty, not from the (older) commit.
    offset_now = trio.run(not_yet_expired)
    if time.monotonic() - emptied_at < RETENTION_MS / 2000:  # only meaningful if quick
        assert offset_now == 5, "offsets expired by commit time, not by time since Empty"

    async def wait_expired(group: str) -> None:
        conn = await _coordinator(bootstrap, group)
        async with conn:
            with trio.fail_after(TIMEOUT_S):
                while await _fetched(conn, group, topic) != -1:  # noqa: ASYNC110
                    await trio.sleep(0.2)

    trio.run(wait_expired, simple)
    trio.run(wait_expired, members)
    for group in (simple, members):
        tombstones = _offsets_log_tombstones(bootstrap, group)
        assert OffsetKey(group, topic, 0) in tombstones and GroupKey(group) in tombstones

    # The tombstones are in the log: a restarted coordinator does not bring them back.
    group_broker.stop()
    start_broker(group_broker)

    async def still_gone() -> None:
        for group in (simple, members):
            conn = await _coordinator(bootstrap, group)
            async with conn:
                with trio.fail_after(TIMEOUT_S):
                    while True:
                        response = await conn.request(OFFSET_FETCH, {
                            "group_id": group,
                            "topics": [{"name": topic, "partition_indexes": [0]}],
                            "require_stable": False}, version=7)
                        if response.error_code == 0:
                            break
                        await trio.sleep(0.2)
                assert response.topics[0].partitions[0].committed_offset == -1

    trio.run(still_gone)


# -- bad commits -----------------------------------------------------------------------------


def test_commits_from_past_generations_and_evicted_members_change_nothing(
        group_broker: BrokerProcess) -> None:
    bootstrap = group_broker.bootstrap
    topic = unique_topic("bad-gen")
    group = f"g-{topic}"
    create_topic(bootstrap, topic, partitions=1)

    async def run() -> None:
        a_conn = await _coordinator(bootstrap, group)
        b_conn = await _coordinator(bootstrap, group)
        async with a_conn, b_conn:
            a = await _join(a_conn, group, session_ms=1_000)
            assert a.error_code == 0 and a.generation_id == 1
            assert await _sync(a_conn, group, 1, a.member_id,
                               assignments={a.member_id: b""}) == 0
            assert await _commit(a_conn, group, topic, 10, generation=1, member=a.member_id,
                                 metadata="m" * METADATA_MAX_BYTES) == ErrorCode.NONE
            # offset.metadata.max.bytes is this broker's (64), not Kafka's default 4096.
            assert await _commit(a_conn, group, topic, 9, generation=1, member=a.member_id,
                                 metadata="m" * (METADATA_MAX_BYTES + 1)) == \
                ErrorCode.OFFSET_METADATA_TOO_LARGE
            assert await _commit(a_conn, group, topic, 11, generation=0,
                                 member=a.member_id) == ErrorCode.ILLEGAL_GENERATION
            assert await _fetched(a_conn, group, topic) == 10

            # b joins; a rejoins: generation 2. Generation 1 is now the past.
            async with trio.open_nursery() as nursery:
                results: dict[str, Any] = {}

                async def join_b() -> None:
                    results["b"] = await _join(b_conn, group, session_ms=6_000)

                nursery.start_soon(join_b)
                with trio.fail_after(TIMEOUT_S):
                    while await _heartbeat(  # noqa: ASYNC110
                            a_conn, group, 1, a.member_id) != ErrorCode.REBALANCE_IN_PROGRESS:
                        await trio.sleep(0.05)
                results["a"] = await _join(a_conn, group, member=a.member_id, session_ms=1_000)
            b = results["b"]
            assert results["a"].generation_id == b.generation_id == 2
            assignments = {a.member_id: b"", b.member_id: b""}
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_sync, b_conn, group, 2, b.member_id)
                assert await _sync(a_conn, group, 2, a.member_id,
                                   assignments=assignments) == 0
            assert await _commit(a_conn, group, topic, 12, generation=1,
                                 member=a.member_id) == ErrorCode.ILLEGAL_GENERATION
            assert await _commit(a_conn, group, topic, 13, generation=2,
                                 member="never-joined") == ErrorCode.UNKNOWN_MEMBER_ID
            assert await _commit(a_conn, group, topic, 14, generation=-1) == \
                ErrorCode.UNKNOWN_MEMBER_ID  # a simple commit into a group with members
            assert await _commit(a_conn, group, topic, 15, generation=2,
                                 member=a.member_id, partition=7) == \
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            assert await _fetched(a_conn, group, topic) == 10

            # a stops heartbeating: evicted after its 1 s session; b stays (heartbeats).
            with trio.fail_after(TIMEOUT_S):
                while await _heartbeat(  # noqa: ASYNC110
                        b_conn, group, 2, b.member_id) == ErrorCode.NONE:
                    await trio.sleep(0.2)
            assert await _heartbeat(a_conn, group, 2, a.member_id) == \
                ErrorCode.UNKNOWN_MEMBER_ID
            assert await _commit(a_conn, group, topic, 16, generation=2,
                                 member=a.member_id) == ErrorCode.UNKNOWN_MEMBER_ID
            assert await _fetched(a_conn, group, topic) == 10

    trio.run(run)
