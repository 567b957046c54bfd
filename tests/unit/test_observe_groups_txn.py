"""The group and transaction collectors against a real node's parts: one combined node (its
own single voter) runs in this trio process; a client drives it over its Kafka port with the
project's own connection, and the collectors read ``node.parts`` as a scrape would.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from raftlog.client.connection import KafkaConnection
from raftlog.config import ServerConfig
from raftlog.node import Node
from raftlog.observe.groups import GroupCollector, group_lags
from raftlog.observe.parts import MetricsSettings, NodeParts
from raftlog.observe.txn import TxnCollector
from raftlog.partition.batch import build_batch
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import CREATE_TOPICS, FIND_COORDINATOR, INIT_PRODUCER_ID, PRODUCE
from raftlog.protocol.schemas_group import JOIN_GROUP, OFFSET_COMMIT, SYNC_GROUP
from raftlog.protocol.schemas_txn import ADD_PARTITIONS_TO_TXN, END_TXN

DEADLINE_S = 60.0
TOPIC = "events"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@asynccontextmanager
async def running_node(tmp_path: Path, **extra: str) -> AsyncIterator[tuple[Node, int]]:
    kafka, controller = _free_port(), _free_port()
    config = ServerConfig.from_properties({
        "node.id": "1", "process.roles": "broker,controller",
        "listeners": f"PLAINTEXT://127.0.0.1:{kafka},CONTROLLER://127.0.0.1:{controller}",
        "controller.quorum.voters": f"1@127.0.0.1:{controller}",
        "controller.listener.names": "CONTROLLER", "log.dirs": str(tmp_path / "data"),
        "raft.secret": "observe-test-secret",
        **extra})
    node = Node(config)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(node.run)
        with trio.fail_after(DEADLINE_S):
            while node.parts is None or not node.parts.ready():  # noqa: ASYNC110
                await trio.sleep(0.05)
        yield node, port
        nursery.cancel_scope.cancel()


def scrape(*collectors: Any) -> Samples:
    """Render the collectors as Prometheus would get them, and parse that text back."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    text = generate_latest(registry).decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def parts_of(node: Node) -> NodeParts:
    assert node.parts is not None
    return node.parts


async def eventually(check: Callable[[], bool]) -> None:
    with trio.fail_after(DEADLINE_S):
        while not check():  # noqa: ASYNC110
            await trio.sleep(0.05)


async def retry(request: Callable[[], Any], ok: Callable[[Any], bool]) -> Any:
    """A request retried while the coordinator is being created or loaded."""
    with trio.fail_after(DEADLINE_S):
        while True:
            response = await request()
            if ok(response):
                return response
            await trio.sleep(0.1)


async def create_topic(conn: KafkaConnection, partitions: int) -> None:
    response = await conn.request(CREATE_TOPICS, {"topics": [{
        "name": TOPIC, "num_partitions": partitions, "replication_factor": 1,
        "assignments": [], "configs": []}], "timeout_ms": 10_000})
    assert response.topics[0].error_code == 0


async def produce(conn: KafkaConnection, partition: int, count: int) -> None:
    records = build_batch([(None, b"v%d" % i, ()) for i in range(count)])

    async def send() -> Any:
        return await conn.request(PRODUCE, {
            "transactional_id": None, "acks": -1, "timeout_ms": 10_000,
            "topic_data": [{"name": TOPIC, "partition_data": [
                {"index": partition, "records": records}]}]})

    await retry(send, lambda r: r.responses[0].partition_responses[0].error_code == 0)


async def commit(conn: KafkaConnection, group: str, offsets: dict[int, int]) -> None:
    await coordinator_ready(conn, group, 0)
    body = {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
            "group_instance_id": None, "topics": [{"name": TOPIC, "partitions": [
                {"partition_index": p, "committed_offset": o, "committed_leader_epoch": -1,
                 "committed_metadata": ""} for p, o in offsets.items()]}]}

    async def send() -> Any:
        return await conn.request(OFFSET_COMMIT, body, version=7)

    await retry(send, lambda r: all(p.error_code == 0 for p in r.topics[0].partitions))


async def coordinator_ready(conn: KafkaConnection, key: str, key_type: int) -> None:
    """FindCoordinator until it answers (the first call creates the internal topic)."""

    async def find() -> Any:
        return await conn.request(FIND_COORDINATOR, {"key": key, "key_type": key_type},
                                  version=1)

    await retry(find, lambda r: r.error_code == 0)


def lag(samples: Samples, family: str, group: str) -> float | None:
    return samples.get((family, (("group", group),)))


async def test_lag_grows_without_commits_and_is_zero_when_committed_up_to_the_hw(
        tmp_path: Path) -> None:
    async with running_node(tmp_path) as (node, port), \
            await KafkaConnection.connect("127.0.0.1", port) as conn:
        parts = parts_of(node)
        per_partition = GroupCollector(parts, MetricsSettings(group_lag_per_partition=True))
        default = GroupCollector(parts, MetricsSettings())
        await create_topic(conn, 2)
        await produce(conn, 0, 10)
        await produce(conn, 1, 4)
        await commit(conn, "readers", {0: 3, 1: 4})

        samples = scrape(per_partition)
        assert lag(samples, "kafka_consumergroup_lag_sum", "readers") == 7
        assert lag(samples, "kafka_consumergroup_lag_max", "readers") == 7
        key = ("kafka_consumergroup_lag", (("group", "readers"), ("partition", "0"),
                                           ("topic", TOPIC)))
        assert samples[key] == 7
        assert samples[key[0], (("group", "readers"), ("partition", "1"), ("topic", TOPIC))] == 0
        # Off by default: only the sum and the max per group.
        assert not any(name == "kafka_consumergroup_lag" for name, _ in scrape(default))

        await produce(conn, 0, 5)  # nothing committed: the lag grows
        samples = scrape(default)
        assert lag(samples, "kafka_consumergroup_lag_sum", "readers") == 12
        assert lag(samples, "kafka_consumergroup_lag_max", "readers") == 12

        await commit(conn, "readers", {0: 15})  # up to the high watermark
        samples = scrape(default)
        assert lag(samples, "kafka_consumergroup_lag_sum", "readers") == 0
        assert lag(samples, "kafka_consumergroup_lag_max", "readers") == 0
        # The committing group is Empty (no members); the coordinator counts it.
        assert samples[("kafka_coordinator_group_groupmetadatamanager_numgroups",
                        (("state", "Empty"),))] == 1


async def _join_and_sync(conn: KafkaConnection, group: str) -> None:
    await coordinator_ready(conn, group, 0)
    body = {"group_id": group, "session_timeout_ms": 10_000, "rebalance_timeout_ms": 10_000,
            "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}]}

    async def join() -> Any:
        return await conn.request(JOIN_GROUP, body, version=5, timeout_s=30)

    response = await retry(join, lambda r: r.error_code in (0, ErrorCode.MEMBER_ID_REQUIRED))
    if response.error_code == ErrorCode.MEMBER_ID_REQUIRED:
        body["member_id"] = response.member_id
        response = await conn.request(JOIN_GROUP, body, version=5, timeout_s=30)
    assert response.error_code == 0, response
    synced = await conn.request(SYNC_GROUP, {
        "group_id": group, "generation_id": response.generation_id,
        "member_id": response.member_id, "group_instance_id": None,
        "assignments": [{"member_id": response.member_id, "assignment": b"a"}]}, version=3,
        timeout_s=30)
    assert synced.error_code == 0, synced


async def test_groups_by_state_and_rebalances(tmp_path: Path) -> None:
    async with running_node(tmp_path) as (node, port), \
            await KafkaConnection.connect("127.0.0.1", port) as conn:
        collector = GroupCollector(parts_of(node), MetricsSettings())
        before = scrape(collector)
        assert before[("raftlog_group_rebalances_total", ())] == 0
        states = {labels[0][1]: value for (name, labels), value in before.items()
                  if name == "kafka_coordinator_group_groupmetadatamanager_numgroups"}
        assert states == {"Empty": 0, "PreparingRebalance": 0, "CompletingRebalance": 0,
                          "Stable": 0, "Dead": 0}
        await create_topic(conn, 1)
        await _join_and_sync(conn, "stable-1")
        await _join_and_sync(conn, "stable-2")
        await commit(conn, "simple", {0: 0})
        samples = scrape(collector)
        numgroups = "kafka_coordinator_group_groupmetadatamanager_numgroups"
        assert samples[(numgroups, (("state", "Stable"),))] == 2
        assert samples[(numgroups, (("state", "Empty"),))] == 1
        assert samples[(numgroups, (("state", "PreparingRebalance"),))] == 0
        assert samples[("raftlog_group_rebalances_total", ())] == 2


async def _begin(conn: KafkaConnection, transactional_id: str, timeout_ms: int = 60_000
                 ) -> tuple[int, int]:
    await coordinator_ready(conn, transactional_id, 1)

    async def init() -> Any:
        return await conn.request(INIT_PRODUCER_ID, {
            "transactional_id": transactional_id, "transaction_timeout_ms": timeout_ms})

    response = await retry(init, lambda r: r.error_code == 0)
    producer = (response.producer_id, response.producer_epoch)
    added = await conn.request(ADD_PARTITIONS_TO_TXN, {
        "v3_and_below_transactional_id": transactional_id,
        "v3_and_below_producer_id": producer[0], "v3_and_below_producer_epoch": producer[1],
        "v3_and_below_topics": [{"name": TOPIC, "partitions": [0]}]}, version=3)
    assert added.results_by_topic_v3_and_below[0].results_by_partition[0] \
        .partition_error_code == 0
    return producer


async def _end(conn: KafkaConnection, transactional_id: str, producer: tuple[int, int],
               commit: bool) -> None:
    response = await conn.request(END_TXN, {
        "transactional_id": transactional_id, "producer_id": producer[0],
        "producer_epoch": producer[1], "committed": commit})
    assert response.error_code == 0


async def test_txn_gauges_and_counters_move_on_commit_abort_and_timeout(
        tmp_path: Path) -> None:
    interval = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "100"}
    async with running_node(tmp_path, **interval) as (node, port), \
            await KafkaConnection.connect("127.0.0.1", port) as conn:
        collector = TxnCollector(parts_of(node))

        def value(name: str, **labels: str) -> float:
            return scrape(collector).get((name, tuple(sorted(labels.items()))), -1)

        assert value("raftlog_txn_completed_total", result="commit") == 0
        assert value("raftlog_txn_completed_total", result="abort") == 0
        assert value("raftlog_txn_timeouts_total") == 0
        await create_topic(conn, 1)

        committing = await _begin(conn, "t-commit")
        assert value("raftlog_txn_ongoing") == 1
        assert value("raftlog_txn_transactional_ids") == 1
        await _end(conn, "t-commit", committing, commit=True)
        await eventually(lambda: value("raftlog_txn_completed_total", result="commit") == 1)
        assert value("raftlog_txn_ongoing") == 0

        aborting = await _begin(conn, "t-abort")
        await _end(conn, "t-abort", aborting, commit=False)
        await eventually(lambda: value("raftlog_txn_completed_total", result="abort") == 1)

        await _begin(conn, "t-stuck", timeout_ms=500)  # never ended: the coordinator aborts it
        await eventually(lambda: value("raftlog_txn_timeouts_total") == 1)
        await eventually(lambda: value("raftlog_txn_completed_total", result="abort") == 2)
        assert value("raftlog_txn_ongoing") == 0
        assert value("raftlog_txn_transactional_ids") == 3
        assert value("raftlog_txn_completed_total", result="commit") == 1


def test_group_lags_skip_partitions_without_a_known_high_watermark() -> None:
    from raftlog.group.model import Group
    from raftlog.group.records import OffsetValue

    group = Group("g", offsets={("a", 0): OffsetValue(5), ("a", 1): OffsetValue(9),
                                ("b", 0): OffsetValue(3)})
    known = {("a", 0): 8, ("a", 1): 7}  # a-1 committed past the HW a follower knows: 0
    (result,) = group_lags([group], lambda t, p: known.get((t, p)))
    assert result.partitions == (("a", 0, 3), ("a", 1, 0))
    assert (result.total, result.largest) == (3, 3)
    assert group_lags([Group("empty")], lambda t, p: 0) == []


async def test_remote_end_offsets_ask_the_leader_and_go_stale(tmp_path: Path) -> None:
    """A node that hosts no replica of the partitions (an empty manager, node id 2) learns
    their high watermarks from their leader with ListOffsets; old answers are not used."""
    from raftlog.group.end_offsets import RemoteEndOffsets
    from raftlog.partition.manager import PartitionManager

    now = [0.0]
    async with running_node(tmp_path) as (node, port), \
            await KafkaConnection.connect("127.0.0.1", port) as conn:
        await create_topic(conn, 2)
        await produce(conn, 0, 6)
        elsewhere = PartitionManager(tmp_path / "elsewhere", 2)
        try:
            remote = RemoteEndOffsets(2, parts_of(node).quorum, elsewhere,
                                      lambda: [(TOPIC, 0), (TOPIC, 1), ("gone", 0)],
                                      interval_s=1.0, clock=lambda: now[0])
            assert remote.remote_partitions() == [(TOPIC, 0), (TOPIC, 1), ("gone", 0)]
            assert remote.get(TOPIC, 0) is None
            await remote.refresh()
            assert (remote.get(TOPIC, 0), remote.get(TOPIC, 1), remote.get("gone", 0)) == \
                (6, 0, None)
            now[0] += remote.stale_after_s + 1  # the leader stopped answering: no value
            assert remote.get(TOPIC, 0) is None
            await remote.aclose()
            # The node's own manager hosts them: nothing to ask.
            hosted = RemoteEndOffsets(1, parts_of(node).quorum, parts_of(node).manager,
                                      lambda: [(TOPIC, 0)])
            assert hosted.remote_partitions() == []
        finally:
            elsewhere.close()
