"""KIP-890 part 1 on a real 3-node cluster, where the transaction coordinator and the partition
leader are different nodes: the leader asks the coordinator (AddPartitionsToTxn v4
``verify_only``) before it appends the first transactional batch of a transaction, so a batch
for a partition that was never added, from a fenced epoch, or after the transaction ended is
refused and nothing is written. Driven with raw requests through the project's client, so
every case is exact; real clients commit through the same path in
``test_transactions_cluster.py`` and ``test_transactions_faults.py``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from raftlog.client.connection import KafkaConnection
from raftlog.partition.batch import build_batch
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import (
    API_VERSIONS,
    FIND_COORDINATOR,
    INIT_PRODUCER_ID,
    LIST_OFFSETS,
    PRODUCE,
)
from raftlog.protocol.schemas_txn import ADD_PARTITIONS_TO_TXN, END_TXN
from tests.integration.cluster_harness import Cluster, cluster3
from tests.integration.helpers import unique_topic
from tests.integration.test_cluster_failover import create_topic

__all__ = ["cluster3"]

pytest.importorskip("confluent_kafka")  # create_topic uses its AdminClient

TXN_ID = "kip890-remote"
RETRY_S = 30.0
TRANSACTIONAL = 0x10


async def _retry(call: Callable[[], Awaitable[Any]], ok: Callable[[Any], bool],
                 what: str) -> Any:
    """Repeat a request while the cluster settles (coordinator loading, concurrent txns)."""
    with trio.fail_after(RETRY_S):
        while True:
            response = await call()
            if ok(response):
                return response
            await trio.sleep(0.1)
    raise AssertionError(what)  # unreachable: fail_after raises


def test_partition_leader_verifies_with_a_remote_coordinator(cluster3: Cluster) -> None:
    topic = unique_topic("kip890")
    create_topic(cluster3, topic, 3)
    leaders = {p.partition_index: p.leader_id for p in cluster3.metadata(topic).topics[0]
               .partitions}

    async def scenario() -> dict[str, int]:
        any_node = await KafkaConnection.connect(*cluster3.nodes[1].address)
        found = await _retry(lambda: any_node.request(FIND_COORDINATOR, {
            "key": TXN_ID, "key_type": 1}), lambda r: r.error_code == 0, "a coordinator")
        await any_node.aclose()
        coordinator = found.node_id
        remote = sorted(p for p, leader in leaders.items() if leader != coordinator)
        assert len(remote) >= 2, (coordinator, leaders)  # one replica each: 3 leaders
        added, not_added = remote[0], remote[1]
        conns = {n: await KafkaConnection.connect(*node.address)
                 for n, node in cluster3.nodes.items()}
        coord = conns[coordinator]
        try:
            versions = await coord.request(API_VERSIONS, {}, version=0)
            advertised = {k.api_key: k.max_version for k in versions.api_keys}
            codes: dict[str, int] = {"advertised": advertised[ADD_PARTITIONS_TO_TXN.key]}

            async def init() -> Any:
                return await _retry(lambda: coord.request(INIT_PRODUCER_ID, {
                    "transactional_id": TXN_ID, "transaction_timeout_ms": 60_000,
                    "producer_id": -1, "producer_epoch": -1}), lambda r: r.error_code == 0,
                    "InitProducerId")

            async def add(pid: int, epoch: int, partition: int) -> None:
                await _retry(lambda: coord.request(ADD_PARTITIONS_TO_TXN, {
                    "v3_and_below_transactional_id": TXN_ID, "v3_and_below_producer_id": pid,
                    "v3_and_below_producer_epoch": epoch,
                    "v3_and_below_topics": [{"name": topic, "partitions": [partition]}]},
                    version=3), lambda r: r.results_by_topic_v3_and_below[0]
                    .results_by_partition[0].partition_error_code == 0, "AddPartitionsToTxn")

            async def produce(partition: int, pid: int, epoch: int, sequence: int) -> int:
                batch = build_batch([(b"k", b"v%d" % sequence, ())], producer_id=pid,
                                    producer_epoch=epoch, base_sequence=sequence,
                                    attributes=TRANSACTIONAL)
                response = await conns[leaders[partition]].request(PRODUCE, {
                    "transactional_id": TXN_ID, "acks": -1, "timeout_ms": 10_000,
                    "topic_data": [{"name": topic, "partition_data": [
                        {"index": partition, "records": batch}]}]})
                return int(response.responses[0].partition_responses[0].error_code)

            first = await init()
            pid, epoch = first.producer_id, first.producer_epoch
            await add(pid, epoch, added)
            codes["added"] = await produce(added, pid, epoch, 0)
            codes["added_again"] = await produce(added, pid, epoch, 1)  # cached: no question
            codes["not_added"] = await produce(not_added, pid, epoch, 0)
            # A new incarnation fences the epoch (and aborts the open transaction).
            second = await init()
            assert second.producer_id == pid and second.producer_epoch > epoch, second
            new = second.producer_epoch  # the abort bumped once, the retried init again
            codes["fenced"] = await produce(not_added, pid, epoch, 0)
            # The new epoch commits; a batch after the commit belongs to no transaction.
            await add(pid, new, added)
            codes["new_epoch"] = await produce(added, pid, new, 0)
            end = await coord.request(END_TXN, {
                "transactional_id": TXN_ID, "producer_id": pid, "producer_epoch": new,
                "committed": True}, version=1)
            codes["end"] = end.error_code

            async def stable() -> bool:  # the COMMIT marker is in: LSO == HW
                lso = await _list_latest(conns[leaders[added]], topic, added, 1)
                return lso == await _list_latest(conns[leaders[added]], topic, added, 0)

            for _ in range(int(RETRY_S / 0.1)):  # polling another process's state
                if await stable():
                    break
                await trio.sleep(0.1)
            else:
                raise AssertionError("the COMMIT marker did not arrive")
            # NOT_ENOUGH_REPLICAS (retriable) while the coordinator still completes the commit
            # (CONCURRENT_TRANSACTIONS at the coordinator); a client retries, and so do we.
            for _ in range(int(RETRY_S / 0.1)):
                codes["after_commit"] = await produce(added, pid, new, 1)
                if codes["after_commit"] != ErrorCode.NOT_ENOUGH_REPLICAS:
                    break
                await trio.sleep(0.1)
            codes["not_added_end"] = await _list_latest(conns[leaders[not_added]], topic,
                                                        not_added, 0)
            return codes
        finally:
            for connection in conns.values():
                await connection.aclose()

    codes = trio.run(scenario)
    assert codes == {
        "advertised": 3,  # v4 (verify_only) is broker-to-broker: never advertised
        "added": 0, "added_again": 0,
        "not_added": ErrorCode.INVALID_TXN_STATE,
        "fenced": ErrorCode.INVALID_PRODUCER_EPOCH,
        "new_epoch": 0, "end": 0,
        "after_commit": ErrorCode.INVALID_TXN_STATE,
        "not_added_end": 0,  # nothing refused was written
    }, codes
    cluster3.check_logs()


async def _list_latest(connection: KafkaConnection, topic: str, partition: int,
                       isolation: int) -> int:
    response = await connection.request(LIST_OFFSETS, {
        "replica_id": -1, "isolation_level": isolation, "topics": [{
            "name": topic, "partitions": [{"partition_index": partition, "timestamp": -1}]}]})
    offset: int = response.topics[0].partitions[0].offset
    return offset
