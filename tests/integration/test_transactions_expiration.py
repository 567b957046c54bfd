"""``producer.id.expiration.ms`` on a real node: an idle idempotent producer's state is
forgotten once the expiration passed (DescribeProducers no longer lists it), while a producer
with an open transaction is kept however long it idles (its transaction holds the LSO)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio

from raftlog.client.connection import KafkaConnection
from raftlog.partition.batch import build_batch
from raftlog.protocol.schemas import INIT_PRODUCER_ID
from raftlog.protocol.schemas_txn import DESCRIBE_PRODUCERS
from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import create_topic, produce_raw, unique_topic

confluent_kafka = pytest.importorskip("confluent_kafka")

EXPIRATION_MS = 1500


def _producers(bootstrap: str, topic: str) -> dict[int, Any]:
    async def run() -> dict[int, Any]:
        host, port = bootstrap.split(":")
        async with await KafkaConnection.connect(host, int(port)) as connection:
            response = await connection.request(DESCRIBE_PRODUCERS, {
                "topics": [{"name": topic, "partition_indexes": [0]}]})
        partition = response.topics[0].partitions[0]
        assert partition.error_code == 0, partition
        return {p.producer_id: p for p in partition.active_producers}

    return trio.run(run)


def _init_producer_id(bootstrap: str) -> int:
    async def run() -> int:
        host, port = bootstrap.split(":")
        async with await KafkaConnection.connect(host, int(port)) as connection:
            response = await connection.request(INIT_PRODUCER_ID, {
                "transactional_id": None, "transaction_timeout_ms": 60_000})
        assert response.error_code == 0, response
        producer_id: int = response.producer_id
        return producer_id

    return trio.run(run)


def test_idle_producers_expire_but_open_transactions_do_not(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path, extra_properties={
        "producer.id.expiration.ms": str(EXPIRATION_MS),
        "producer.id.expiration.check.interval.ms": "200"})
    broker.start()
    try:
        idle_topic = unique_topic("expire-idle")
        open_topic = unique_topic("expire-open")
        create_topic(broker.bootstrap, idle_topic)
        create_topic(broker.bootstrap, open_topic)
        idle = _init_producer_id(broker.bootstrap)
        produce_raw(broker.bootstrap, idle_topic, 0, build_batch(
            [(None, b"v", ())], producer_id=idle, producer_epoch=0, base_sequence=0))
        assert idle in _producers(broker.bootstrap, idle_topic)

        transactional: Any = confluent_kafka.Producer({
            "bootstrap.servers": broker.bootstrap, "transactional.id": "expire-open",
            "transaction.timeout.ms": 60_000})
        transactional.init_transactions(30)
        transactional.begin_transaction()
        transactional.produce(open_topic, value=b"pending", partition=0)
        assert transactional.flush(30) == 0
        (holder,) = _producers(broker.bootstrap, open_topic).values()
        assert holder.current_txn_start_offset == 0

        deadline = time.monotonic() + 20
        while idle in _producers(broker.bootstrap, idle_topic):
            assert time.monotonic() < deadline, "the idle producer was not expired"
            time.sleep(0.2)
        time.sleep(EXPIRATION_MS / 1000 + 0.5)  # well past the expiration for the open one too
        kept = _producers(broker.bootstrap, open_topic)
        assert holder.producer_id in kept and \
            kept[holder.producer_id].current_txn_start_offset == 0, kept
        transactional.abort_transaction(30)
    finally:
        broker.stop()
