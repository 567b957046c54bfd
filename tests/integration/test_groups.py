"""Consumer groups against a real broker process with the three PyPI clients.

Rebalances with confluent-kafka, kafka-python and aiokafka each (3 consumers → 2 partitions
each; a fourth joins, the second leaves → after each rebalance every partition has exactly one
owner, as the clients see it and as the coordinator stores it), two groups each reading
everything, committed offsets across a restart, and Kafka's error codes for bad commits
(nothing written).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import trio

from raftlog.client.connection import KafkaConnection
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import FIND_COORDINATOR
from raftlog.protocol.schemas_group import OFFSET_COMMIT, OFFSET_FETCH
from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import create_topic, end_offsets, unique_topic

PARTITIONS = 6
RECORDS = 600
TIMEOUT_S = 90.0  # kafka-python rebalances take 7-40 s on a loaded 2-core box


def _produce(bootstrap: str, topic: str, count: int = RECORDS) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(count):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i)
    assert producer.flush(15) == 0


def _confluent(bootstrap: str, group: str, **extra: Any) -> Any:
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                     "session.timeout.ms": 6000, "heartbeat.interval.ms": 300,
                     "auto.offset.reset": "earliest", **extra})


def _poll_until(consumers: list[Any], done: Any, what: str) -> dict[int, list[Any]]:
    """Polls every consumer round-robin until ``done(assignments, records)``."""
    records: dict[int, list[Any]] = {i: [] for i in range(len(consumers))}
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        for i, consumer in enumerate(consumers):
            # Batches: one record per poll would cost each drained member its poll timeout.
            records[i].extend(m for m in consumer.consume(200, 0.02) if m.error() is None)
        assignments = [sorted(tp.partition for tp in c.assignment()) for c in consumers]
        if done(assignments, records):
            return records
    raise AssertionError(f"timed out waiting for {what}: "
                         f"{[sorted(tp.partition for tp in c.assignment()) for c in consumers]}")


def _exactly_one_owner(assignments: list[list[int]]) -> bool:
    owned = sorted(p for a in assignments for p in a)
    return owned == list(range(PARTITIONS))


# -- one rebalance scenario, three clients ---------------------------------------------------


class _Members:
    """A group of consumers of one client library, driven from this thread."""

    def add(self) -> None:
        raise NotImplementedError

    def remove(self, index: int) -> None:
        """Closes member ``index`` cleanly (LeaveGroup)."""
        raise NotImplementedError

    def poll(self) -> list[tuple[int, int]]:
        """One poll of every member: the (partition, offset) of the records it returned."""
        raise NotImplementedError

    def assignments(self) -> list[list[int]]:
        raise NotImplementedError

    def describe(self) -> str:
        """Each member's own idea of its membership (diagnostics for a failure)."""
        return ""

    def close(self) -> None:
        raise NotImplementedError


class _ConfluentMembers(_Members):
    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.args = (bootstrap, topic, group)
        self.consumers: list[Any] = []

    def add(self) -> None:
        bootstrap, topic, group = self.args
        consumer = _confluent(bootstrap, group)
        consumer.subscribe([topic])
        self.consumers.append(consumer)

    def remove(self, index: int) -> None:
        self.consumers.pop(index).close()

    def poll(self) -> list[tuple[int, int]]:
        out = []
        for consumer in self.consumers:
            for m in consumer.consume(100, 0.02):
                if m.error() is None:
                    out.append((m.partition(), m.offset()))
        return out

    def assignments(self) -> list[list[int]]:
        return [sorted(tp.partition for tp in c.assignment()) for c in self.consumers]

    def close(self) -> None:
        while self.consumers:
            self.remove(0)


class _KafkaPythonMember:
    """One kafka-python consumer polled continuously by its own thread, as applications run
    it; the thread publishes each poll's records and the assignment it then held."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.lock = threading.Lock()
        self.records: list[tuple[int, int]] = []
        self.assignment: list[int] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                batch = self.consumer.poll(timeout_ms=100)
                assignment = sorted(tp.partition for tp in self.consumer.assignment())
                with self.lock:
                    for tp, messages in batch.items():
                        self.records.extend((tp.partition, m.offset) for m in messages)
                    self.assignment = assignment
        except BaseException as exc:  # reported by the test thread
            self.error = exc
        finally:
            self.consumer.close()  # from its own thread: kafka-python is not thread-safe

    def take(self) -> tuple[list[tuple[int, int]], list[int]]:
        if self.error is not None:
            raise AssertionError(f"kafka-python consumer failed: {self.error!r}")
        with self.lock:
            records, self.records = self.records, []
            return records, self.assignment

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "a kafka-python consumer did not close in 60 s"


class _KafkaPythonMembers(_Members):
    """kafka-python consumers, one thread each, each knowing the topic's partitions before it
    subscribes. Two kafka-python 3.0.12 bugs, both about a join that outlives its poll():
    * One thread polling all of them in turn (20 ms each) livelocks: a JoinGroup that
      completes while its consumer is outside poll() is thrown away
      (``ensure_active_group_async`` starts a new join when the old task is done), so the next
      poll() joins again; from the group leader that starts a new rebalance (as Kafka does for
      a leader's JoinGroup), over and over.
    * A leader that assigned before it had the topic's metadata rejoins when the metadata
      arrives (its assignment snapshot differs). If that poll() returns before the join ends,
      the leader's own assignment step then makes the snapshots equal again, so
      ``need_rejoin()`` is False, no later poll() awaits the join, heartbeats stay disabled
      and the coordinator evicts the member 6 s later; it never notices (about 1 run in 30)."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.args = (bootstrap, topic, group)
        self.members: list[_KafkaPythonMember] = []
        self.views: list[list[int]] = []

    def add(self) -> None:
        from kafka import KafkaConsumer

        bootstrap, topic, group = self.args
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                 auto_offset_reset="earliest", session_timeout_ms=6000,
                                 heartbeat_interval_ms=300)
        # The topic's metadata first: a leader that assigns before it has it rejoins once it
        # arrives, and kafka-python 3.0.12 can lose that rejoin (see the class docstring).
        assert consumer.partitions_for_topic(topic) == set(range(PARTITIONS))
        consumer.subscribe([topic])
        self.members.append(_KafkaPythonMember(consumer))

    def remove(self, index: int) -> None:
        self.members.pop(index).close()

    def poll(self) -> list[tuple[int, int]]:
        time.sleep(0.02)
        out: list[tuple[int, int]] = []
        self.views = []
        for member in self.members:
            records, assignment = member.take()
            out.extend(records)
            self.views.append(assignment)
        return out

    def assignments(self) -> list[list[int]]:
        return [list(view) for view in self.views]

    def describe(self) -> str:
        # kafka-python internals, read only for a failure message.
        return "; ".join(f"{getattr(m.consumer._coordinator, '_generation', '?')} "
                         f"state={getattr(m.consumer._coordinator, 'state', '?')} "
                         f"alive={m.thread.is_alive()}" for m in self.members)

    def close(self) -> None:
        while self.members:
            self.remove(0)


class _AiokafkaMembers(_Members):
    """aiokafka on one event loop of this thread: it runs (heartbeats included) during each
    ``poll``, which the scenario calls continuously."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.args = (bootstrap, topic, group)
        self.loop = asyncio.new_event_loop()
        self.consumers: list[Any] = []

    def add(self) -> None:
        from aiokafka import AIOKafkaConsumer

        bootstrap, topic, group = self.args

        async def start() -> Any:
            consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                        auto_offset_reset="earliest", session_timeout_ms=6000,
                                        heartbeat_interval_ms=300)
            await consumer.start()
            return consumer

        self.consumers.append(self.loop.run_until_complete(start()))

    def remove(self, index: int) -> None:
        self.loop.run_until_complete(self.consumers.pop(index).stop())

    def poll(self) -> list[tuple[int, int]]:
        async def poll_all() -> list[Any]:
            return list(await asyncio.gather(*(c.getmany(timeout_ms=20)
                                               for c in self.consumers)))

        out: list[tuple[int, int]] = []
        for batch in self.loop.run_until_complete(poll_all()):
            for tp, messages in batch.items():
                out.extend((tp.partition, m.offset) for m in messages)
        return out

    def assignments(self) -> list[list[int]]:
        return [sorted(tp.partition for tp in c.assignment()) for c in self.consumers]

    def close(self) -> None:
        while self.consumers:
            self.remove(0)
        self.loop.close()


SETTLE_S = 1.5


def _broker_assignments(bootstrap: str, group: str) -> tuple[str, list[list[int]]]:
    """The group's state and its members' assignments as the coordinator stores them (the
    consumer protocol's assignment bytes, decoded here)."""
    from raftlog.tools.consumer_groups import GroupAdmin, decode_assignment

    async def run() -> tuple[str, list[list[int]]]:
        admin = await GroupAdmin.connect(bootstrap)
        try:
            described = await admin.describe(group)
        finally:
            await admin.aclose()
        owned = [sorted(p for parts in decode_assignment(m.member_assignment).values()
                        for p in parts) for m in described.members]
        return str(described.group_state), sorted(owned)

    return trio.run(run)


def _group_log(broker: BrokerProcess, group: str, lines: int = 30) -> str:
    """The broker log's last lines about ``group`` (diagnostics for a failure)."""
    about = [line for line in broker.log_path.read_text().splitlines() if group in line]
    return "\n".join(about[-lines:])


def _rebalances_logged(broker: BrokerProcess, group: str) -> int:
    """How many rebalances of ``group`` the coordinator has logged so far."""
    return broker.log_path.read_text().count(f"preparing to rebalance group {group} ")


def _rebalanced(members: _Members, broker: BrokerProcess, group: str, sizes: list[int],
                seen: list[tuple[int, int]], what: str) -> None:
    """Polls until the rebalance ends: every member holds a share of the given sizes, every
    partition has exactly one owner, and the coordinator's stored assignment says the same;
    then keeps polling for SETTLE_S and requires that to stay true on every poll, with no
    further rebalance started meanwhile (one that ends in the same assignment included)."""
    bootstrap = broker.bootstrap
    deadline = time.monotonic() + TIMEOUT_S
    broker_view: tuple[str, list[list[int]]] | None = None
    while True:
        seen.extend(members.poll())
        client_view = members.assignments()
        if sorted(map(len, client_view)) == sorted(sizes) and _exactly_one_owner(client_view):
            broker_view = _broker_assignments(bootstrap, group)
            if broker_view == ("Stable", sorted(client_view)):
                break
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}: clients {client_view} "
                                 f"({members.describe()}), "
                                 f"coordinator {_broker_assignments(bootstrap, group)}; "
                                 f"the coordinator's log of it:\n{_group_log(broker, group)}")
    rebalances = _rebalances_logged(broker, group)
    assert rebalances > 0, "the coordinator logs its rebalances (the check below needs them)"
    settled_until = time.monotonic() + SETTLE_S
    while time.monotonic() < settled_until:
        seen.extend(members.poll())
        now = members.assignments()
        assert now == client_view, f"{what}: the assignment changed after settling: {now}"
    state, stored = _broker_assignments(bootstrap, group)
    assert state == "Stable" and stored == sorted(client_view), (what, state, stored)
    assert _rebalances_logged(broker, group) == rebalances, f"{what}: rebalanced again"


CLIENTS = {"confluent-kafka": _ConfluentMembers, "kafka-python": _KafkaPythonMembers,
           "aiokafka": _AiokafkaMembers}


@pytest.mark.parametrize("client", list(CLIENTS))
def test_group_rebalances_keep_one_owner_per_partition(broker: BrokerProcess,
                                                       client: str) -> None:
    """3 members on 6 partitions get 2 each and read every record; a fourth joins (2,2,1,1);
    the second leaves (2,2,2). After each rebalance every partition has exactly one owner,
    in the clients' view and in the coordinator's."""
    topic = unique_topic(f"rebalance-{client}")
    group = f"g-{topic}"
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    _produce(broker.bootstrap, topic)
    members = CLIENTS[client](broker.bootstrap, topic, group)
    try:
        for _ in range(3):
            members.add()
        seen: list[tuple[int, int]] = []
        _rebalanced(members, broker, group, [2, 2, 2], seen, "three members")
        deadline = time.monotonic() + TIMEOUT_S
        while len(set(seen)) < RECORDS:
            assert time.monotonic() < deadline, f"read {len(set(seen))} of {RECORDS}"
            seen.extend(members.poll())
        ends = end_offsets(broker.bootstrap, topic, range(PARTITIONS))
        assert sum(ends.values()) == RECORDS
        assert set(seen) == {(p, o) for p, end in ends.items() for o in range(end)}
        members.add()
        _rebalanced(members, broker, group, [2, 2, 1, 1], seen, "a fourth joined")
        members.remove(1)
        _rebalanced(members, broker, group, [2, 2, 2], seen, "the second left")
    finally:
        members.close()


def test_two_groups_each_get_every_record(broker: BrokerProcess) -> None:
    topic = unique_topic("two-groups")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    _produce(broker.bootstrap, topic)
    a = [_confluent(broker.bootstrap, "g-a") for _ in range(2)]
    b = [_confluent(broker.bootstrap, "g-b")]
    try:
        for c in a + b:
            c.subscribe([topic])
        records = _poll_until(
            a + b, lambda _, r: len(r[0]) + len(r[1]) >= RECORDS and len(r[2]) >= RECORDS,
            "both groups to read everything")
        group_a = {(m.partition(), m.offset()) for m in records[0] + records[1]}
        group_b = {(m.partition(), m.offset()) for m in records[2]}
        assert len(group_a) == len(group_b) == RECORDS
    finally:
        for c in a + b:
            c.close()


def test_committed_offsets_survive_restart(broker: BrokerProcess) -> None:
    from confluent_kafka import TopicPartition

    topic = unique_topic("commit")
    create_topic(broker.bootstrap, topic, partitions=2)
    consumer = _confluent(broker.bootstrap, "g-commit", **{"enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        consumer.commit(offsets=[TopicPartition(topic, 0, 42), TopicPartition(topic, 1, 7)],
                        asynchronous=False)
    finally:
        consumer.close()
    broker.restart()
    consumer = _confluent(broker.bootstrap, "g-commit")
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                committed = consumer.committed(
                    [TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=5)
                break
            except Exception:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert [tp.offset for tp in committed] == [42, 7]
    finally:
        consumer.close()


def test_bad_commits_get_kafka_errors_and_change_nothing(broker: BrokerProcess) -> None:
    topic = unique_topic("bad-commit")
    create_topic(broker.bootstrap, topic, partitions=1)

    async def run() -> None:
        async with await KafkaConnection.connect("127.0.0.1", broker.port) as conn:
            with trio.fail_after(20):
                while True:
                    found = await conn.request(FIND_COORDINATOR, {"key": "g-bad", "key_type": 0})
                    if found.error_code == 0:
                        break
                    await trio.sleep(0.1)

            async def commit(generation: int, member: str, offset: int,
                             metadata: str = "") -> int:
                body = {"group_id": "g-bad", "generation_id_or_member_epoch": generation,
                        "member_id": member, "group_instance_id": None,
                        "topics": [{"name": topic, "partitions": [
                            {"partition_index": 0, "committed_offset": offset,
                             "committed_leader_epoch": -1, "committed_metadata": metadata}]}]}
                response = await conn.request(OFFSET_COMMIT, body, version=7)
                return int(response.topics[0].partitions[0].error_code)

            async def fetched() -> int:
                response = await conn.request(OFFSET_FETCH, {
                    "group_id": "g-bad", "topics": [{"name": topic, "partition_indexes": [0]}],
                    "require_stable": False}, version=7)
                return int(response.topics[0].partitions[0].committed_offset)

            # Unknown group with a generation: a commit from a generation that is gone.
            assert await commit(3, "ghost", 5) == ErrorCode.ILLEGAL_GENERATION
            assert await fetched() == -1
            # A simple (generation -1) commit creates the group...
            assert await commit(-1, "", 10) == ErrorCode.NONE
            assert await fetched() == 10
            # ...which is empty: a member id and generation are unknown there.
            assert await commit(1, "ghost", 11) == ErrorCode.UNKNOWN_MEMBER_ID
            assert await commit(-1, "", 12, "x" * 5000) == ErrorCode.OFFSET_METADATA_TOO_LARGE
            assert await fetched() == 10

    trio.run(run)


def test_compacted_topic_refuses_records_without_key(broker: BrokerProcess) -> None:
    import pytest

    from raftlog.client.connection import KafkaClientError
    from raftlog.partition.batch import build_batch
    from tests.integration.helpers import produce_raw

    topic = unique_topic("compacted")
    create_topic(broker.bootstrap, topic, configs={"cleanup.policy": "compact"})
    assert produce_raw(broker.bootstrap, topic, 0, build_batch([(b"k", b"v", ())])) == 0
    with pytest.raises(KafkaClientError, match="INVALID_RECORD"):
        produce_raw(broker.bootstrap, topic, 0, build_batch([(b"k", b"v", ()), (None, b"x", ())]))
    assert produce_raw(broker.bootstrap, topic, 0, build_batch([(b"k", None, ())])) == 1
