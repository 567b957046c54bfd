"""TxnOffsetCommit verified with a transaction coordinator on another node (KIP-890 part 1).

On a real 3-node cluster, the transactional id and the consumer group are chosen so that the
transaction coordinator and the group coordinator are different nodes. The group coordinator
must ask the transaction coordinator (AddPartitionsToTxn v4 ``verify_only`` for the group's
``__consumer_offsets`` partition) before it writes transactional offsets:

* confluent-kafka ``send_offsets_to_transaction`` + ``commit_transaction`` works, and the
  group's committed offsets move;
* a raw TxnOffsetCommit from a producer whose ongoing transaction never added the group's
  offsets (no AddOffsetsToTxn) is refused with INVALID_TXN_STATE, one from a fenced epoch
  with INVALID_PRODUCER_EPOCH, and neither writes anything to ``__consumer_offsets`` nor
  changes the committed offsets.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from raftlog.client.connection import KafkaConnection
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.internal_topics import (
    OFFSETS_TOPIC,
    OFFSETS_TOPIC_PARTITIONS,
    coordinator_partition,
)
from raftlog.protocol.schemas import FIND_COORDINATOR, INIT_PRODUCER_ID, LIST_OFFSETS
from raftlog.protocol.schemas_group import OFFSET_FETCH
from raftlog.protocol.schemas_txn import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    END_TXN,
    TXN_OFFSET_COMMIT,
)
from tests.integration.cluster_harness import Cluster, cluster3
from tests.integration.helpers import unique_topic
from tests.integration.test_cluster_failover import create_topic

__all__ = ["cluster3"]

pytest.importorskip("confluent_kafka")

RETRY_S = 30.0
RECORDS = 10
KEY_GROUP, KEY_TXN = 0, 1


async def _retry(call: Callable[[], Awaitable[Any]], ok: Callable[[Any], bool]) -> Any:
    """Repeat a request while the cluster settles (coordinators loading, aborts finishing)."""
    with trio.fail_after(RETRY_S):
        while True:
            response = await call()
            if ok(response):
                return response
            await trio.sleep(0.1)


async def _coordinator(conn: KafkaConnection, key: str, key_type: int) -> int:
    found = await _retry(lambda: conn.request(FIND_COORDINATOR, {
        "key": key, "key_type": key_type}), lambda r: r.error_code == 0)
    return int(found.node_id)


def _split_coordinators(cluster: Cluster, prefix: str
                        ) -> tuple[str, int, list[tuple[str, int]]]:
    """A group id, its coordinator, and two transactional ids whose transaction coordinator
    is another node (each with that node)."""

    async def pick() -> tuple[str, int, list[tuple[str, int]]]:
        async with await KafkaConnection.connect(*cluster.nodes[1].address) as conn:
            group = f"{prefix}-group"
            group_node = await _coordinator(conn, group, KEY_GROUP)
            txns: list[tuple[str, int]] = []
            for i in range(200):
                txn = f"{prefix}-txn-{i}"
                node = await _coordinator(conn, txn, KEY_TXN)
                if node != group_node:
                    txns.append((txn, node))
                if len(txns) == 2:
                    return group, group_node, txns
        raise AssertionError("no transactional id with a coordinator apart from the group's")

    return trio.run(pick)


def _consume_and_commit_in_transaction(cluster: Cluster, topic: str, out_topic: str,
                                       group: str, txn_id: str) -> dict[int, int]:
    """A consume-transform-produce step with confluent-kafka; the offsets it sent."""
    from confluent_kafka import Consumer, Producer

    bootstrap = cluster.live_bootstrap()
    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 2})
    for i in range(RECORDS):
        producer.produce(topic, b"v%d" % i, partition=i % 3)
    assert producer.flush(RETRY_S) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 2,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id,
                    "log_level": 2, "transaction.timeout.ms": 60_000})
    try:
        consumer.subscribe([topic])
        seen = 0
        for _ in range(int(RETRY_S / 0.2)):  # bounded: RETRY_S of polling at most
            for message in consumer.consume(RECORDS, timeout=0.2):
                assert message.error() is None, message.error()
                seen += 1
            if seen >= RECORDS:
                break
        assert seen == RECORDS, f"consumed {seen} of {RECORDS}"
        txn.init_transactions(RETRY_S)
        txn.begin_transaction()
        txn.produce(out_topic, b"result")
        positions = consumer.position(consumer.assignment())
        txn.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), RETRY_S)
        txn.commit_transaction(RETRY_S)
        return {tp.partition: tp.offset for tp in positions}
    finally:
        consumer.close()


def test_txn_offset_commit_is_verified_with_a_remote_transaction_coordinator(
        cluster3: Cluster) -> None:
    topic, out_topic = unique_topic("txoff-in"), unique_topic("txoff-out")
    create_topic(cluster3, topic, 3)
    create_topic(cluster3, out_topic, 1)
    group, group_node, [(txn_ok, ok_node), (txn_raw, txn_node)] = \
        _split_coordinators(cluster3, topic)
    assert group_node not in (ok_node, txn_node)

    sent = _consume_and_commit_in_transaction(cluster3, topic, out_topic, group, txn_ok)
    assert sum(sent.values()) == RECORDS, sent

    async def refused() -> dict[str, Any]:
        gc = await KafkaConnection.connect(*cluster3.nodes[group_node].address)
        tc = await KafkaConnection.connect(*cluster3.nodes[txn_node].address)
        index = coordinator_partition(group, OFFSETS_TOPIC_PARTITIONS)
        try:
            async def committed(wait_stable: bool = False) -> dict[int, int]:
                """Stable committed offsets; a partition with a pending transactional commit
                (UNSTABLE_OFFSET_COMMIT) shows as its error code, negated."""
                response = await _retry(lambda: gc.request(OFFSET_FETCH, {
                    "group_id": group, "topics": [{"name": topic, "partition_indexes": [0, 1, 2]}],
                    "require_stable": True}, version=7),
                    lambda r: r.error_code == 0 and not (wait_stable and any(
                        p.error_code for t in r.topics for p in t.partitions)))
                return {p.partition_index: -p.error_code if p.error_code else p.committed_offset
                        for p in response.topics[0].partitions}

            async def offsets_end() -> int:
                response = await gc.request(LIST_OFFSETS, {
                    "replica_id": -1, "isolation_level": 0, "topics": [{
                        "name": OFFSETS_TOPIC,
                        "partitions": [{"partition_index": index, "timestamp": -1}]}]})
                return int(response.topics[0].partitions[0].offset)

            async def init() -> Any:
                return await _retry(lambda: tc.request(INIT_PRODUCER_ID, {
                    "transactional_id": txn_raw, "transaction_timeout_ms": 60_000,
                    "producer_id": -1, "producer_epoch": -1}), lambda r: r.error_code == 0)

            async def commit_offsets(pid: int, epoch: int) -> int:
                response = await gc.request(TXN_OFFSET_COMMIT, {
                    "transactional_id": txn_raw, "group_id": group, "producer_id": pid,
                    "producer_epoch": epoch, "generation_id": -1, "member_id": "",
                    "group_instance_id": None, "topics": [{"name": topic, "partitions": [
                        {"partition_index": 0, "committed_offset": 0,
                         "committed_leader_epoch": -1, "committed_metadata": ""}]}]},
                    version=3, timeout_s=RETRY_S)
                return int(response.topics[0].partitions[0].error_code)

            out: dict[str, Any] = {"before": await committed(wait_stable=True),
                                   "end_before": await offsets_end()}
            first = await init()
            pid, old = first.producer_id, first.producer_epoch
            # An ongoing transaction (a data partition added), but no AddOffsetsToTxn.
            await _retry(lambda: tc.request(ADD_PARTITIONS_TO_TXN, {
                "v3_and_below_transactional_id": txn_raw, "v3_and_below_producer_id": pid,
                "v3_and_below_producer_epoch": old,
                "v3_and_below_topics": [{"name": out_topic, "partitions": [0]}]}, version=3),
                lambda r: r.results_by_topic_v3_and_below[0].results_by_partition[0]
                .partition_error_code == 0)
            out["not_added"] = await commit_offsets(pid, old)
            # A new incarnation fences the old epoch; it adds the group's offsets.
            second = await init()
            new = second.producer_epoch
            await _retry(lambda: tc.request(ADD_OFFSETS_TO_TXN, {
                "transactional_id": txn_raw, "producer_id": pid, "producer_epoch": new,
                "group_id": group}), lambda r: r.error_code == 0)
            out["fenced"] = await commit_offsets(pid, old)
            out["after"] = await committed()
            out["end_after"] = await offsets_end()
            # The current epoch may commit offsets (verified remotely); its abort drops them.
            out["current"] = await commit_offsets(pid, new)
            end = await _retry(lambda: tc.request(END_TXN, {
                "transactional_id": txn_raw, "producer_id": pid, "producer_epoch": new,
                "committed": False}, version=1), lambda r: r.error_code == 0)
            out["end"] = end.error_code
            out["after_abort"] = await committed(wait_stable=True)
            return out
        finally:
            await gc.aclose()
            await tc.aclose()

    out = trio.run(refused)
    assert out["before"] == sent, out
    assert out["not_added"] == ErrorCode.INVALID_TXN_STATE, out
    assert out["fenced"] == ErrorCode.INVALID_PRODUCER_EPOCH, out
    assert out["after"] == sent and out["end_after"] == out["end_before"], out
    assert out["current"] == ErrorCode.NONE and out["end"] == ErrorCode.NONE, out
    assert out["after_abort"] == sent, out
    cluster3.check_logs()
