"""The harness's final reads on a real node: they read every committed message back, past a
transaction that a dead client left open (it holds the last stable offset until the
coordinator aborts it at ``transaction.timeout.ms``), and past a partition that holds nothing
but an aborted transaction; the txn workload's final reads end such a transaction at once by
initialising its transactional id again, however long its timeout.

Found by the txn campaign: the final reads used to stop at the read_committed consumer's
watermark, which is that LSO, so the committed messages after a hanging transaction were
never read (``unseen``, uncovered: the run came out ``unknown``)."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from jepsen.history import read_jsonl
from jepsen.runner import Recorder
from jepsen.workloads import ClusterView
from jepsen.workloads.queue import TOPIC, final_reads, key_of
from jepsen.workloads.txn import TxnWorkload
from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import create_topic

confluent_kafka = pytest.importorskip("confluent_kafka")

HANGING_TIMEOUT_MS = 4000
FINAL_TIME_S = 40.0
SHORT_FINAL_TIME_S = 20.0


def _transactional_producer(bootstrap: str, transactional_id: str,
                            timeout_ms: int = 10_000) -> Any:
    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "transactional.id": transactional_id,
        "transaction.timeout.ms": timeout_ms, "linger.ms": 0})
    producer.init_transactions(10)
    return producer


def _send_in_transaction(producer: Any, partition: int, value: int) -> None:
    producer.begin_transaction()
    producer.produce(TOPIC, value=str(value).encode(), partition=partition)
    assert producer.flush(10) == 0


def _values_read(path: Path) -> dict[str, list[Any]]:
    reads: dict[str, list[Any]] = {}
    for op in read_jsonl(path):
        if op.type == "ok":
            for key, values in op.reads().items():
                reads.setdefault(str(key), []).extend(values)
    return reads


@contextmanager
def _node(tmp_path: Path) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path, extra_properties={
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200"})
    broker.start()
    try:
        create_topic(broker.bootstrap, TOPIC, partitions=3)
        yield broker
    finally:
        broker.stop()


def test_final_reads_wait_out_a_hanging_transaction(tmp_path: Path) -> None:
    with _node(tmp_path) as broker:
        # Partition 0: an open transaction (offset 0), then a committed one (offset 1).
        hanging = _transactional_producer(broker.bootstrap, "hanging", HANGING_TIMEOUT_MS)
        _send_in_transaction(hanging, 0, 100)
        committer = _transactional_producer(broker.bootstrap, "committer")
        _send_in_transaction(committer, 0, 101)
        committer.commit_transaction(10)
        # Partition 1: nothing but an aborted transaction.
        _send_in_transaction(committer, 1, 102)
        committer.abort_transaction(10)
        # Partition 2: a plain idempotent write.
        plain = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap,
                                          "enable.idempotence": True})
        plain.produce(TOPIC, value=b"103", partition=2)
        assert plain.flush(10) == 0

        path = tmp_path / "history.jsonl"
        recorder = Recorder(path)
        view = ClusterView(broker.bootstrap, {}, 1, False, "final-reads")
        note = final_reads(view, recorder, [key_of(p) for p in range(3)], TOPIC,
                           time.monotonic() + FINAL_TIME_S)
        recorder.close()

        assert note is None, note  # caught up with every high watermark before the deadline
        reads = _values_read(path)
        assert reads.get(key_of(0)) == [101]  # past the hanging transaction, once aborted
        assert not reads.get(key_of(1))  # the aborted write is never read
        assert reads.get(key_of(2)) == [103]


def test_txn_final_reads_end_a_transaction_left_open_without_its_timeout(
        tmp_path: Path) -> None:
    with _node(tmp_path) as broker:
        view = ClusterView(broker.bootstrap, {}, 1, False, "fence")
        workload = TxnWorkload(partitions=3)
        client = workload.new_client(view, 0, random.Random(0), worker=0)
        # The workload's client for worker 0 leaves a transaction open, with a timeout far
        # beyond the final reads' deadline; another producer commits after it.
        hanging = _transactional_producer(broker.bootstrap, client.transactional_id,
                                          timeout_ms=120_000)
        _send_in_transaction(hanging, 0, 200)
        committer = _transactional_producer(broker.bootstrap, "committer")
        _send_in_transaction(committer, 0, 201)
        committer.commit_transaction(10)

        path = tmp_path / "history.jsonl"
        recorder = Recorder(path)
        note = workload.final_reads(view, recorder, time.monotonic() + SHORT_FINAL_TIME_S)
        recorder.close()

        assert note is None, note
        assert _values_read(path).get(key_of(0)) == [201]
        with pytest.raises(confluent_kafka.KafkaException):  # the old producer is fenced
            hanging.commit_transaction(10)
