"""Operator tools for transactions: ListTransactions, DescribeTransactions, DescribeProducers
and ``raftlog transactions list|describe|abort`` ending a hanging transaction — a producer
that began a transaction, wrote, and was SIGKILLed holds the partition's LSO until the abort."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.integration.conftest import BROKER_SECRET, BrokerProcess
from tests.integration.helpers import create_topic, unique_topic
from tests.integration.test_transactions import _list_latest

confluent_kafka = pytest.importorskip("confluent_kafka")

HANGING = r'''
import sys, time
import confluent_kafka

bootstrap, topic, txn_id = sys.argv[1:4]
producer = confluent_kafka.Producer({
    "bootstrap.servers": bootstrap, "transactional.id": txn_id,
    "transaction.timeout.ms": 600000, "linger.ms": 0})
producer.init_transactions(30)
producer.begin_transaction()
for i in range(3):
    producer.produce(topic, value=b"hanging-%d" % i, partition=0)
producer.flush(30)
print("written", flush=True)
time.sleep(3600)
'''


def _cli(bootstrap: str, *args: str, secret: str | None = BROKER_SECRET
         ) -> subprocess.CompletedProcess[str]:
    """``raftlog transactions``, authenticated as the cluster admin unless ``secret`` is None."""
    options = ["--bootstrap-server", bootstrap]
    if secret is not None:
        config = Path(tempfile.mkdtemp()) / "admin.properties"
        config.write_text(f"raft.secret={secret}\n")
        options += ["--command-config", str(config)]
    return subprocess.run([sys.executable, "-m", "raftlog", "transactions", *args, *options],
                          capture_output=True, text=True, timeout=60)


def _hanging_producer(tmp_path: Path, bootstrap: str, topic: str, txn_id: str) -> None:
    script = tmp_path / "hanging.py"
    script.write_text(HANGING)
    process = subprocess.Popen([sys.executable, str(script), bootstrap, topic, txn_id],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "written"
    finally:
        process.kill()  # SIGKILL, the transaction open
        process.wait()


@pytest.mark.parametrize("by", ["partition", "transactional-id"])
def test_abort_ends_a_hanging_transaction(broker: BrokerProcess, tmp_path: Path,
                                          by: str) -> None:
    topic = unique_topic("txn-hang")
    txn_id = f"hanging-{by}"
    create_topic(broker.bootstrap, topic)
    _hanging_producer(tmp_path, broker.bootstrap, topic, txn_id)
    time.sleep(1.0)
    assert _list_latest(broker.bootstrap, topic) == (0, 3)  # the LSO is stuck at 0

    listed = _cli(broker.bootstrap, "list")
    assert listed.returncode == 0, listed.stderr
    row = next(line.split() for line in listed.stdout.splitlines() if txn_id in line)
    assert row[0] == txn_id and row[3] == "Ongoing"
    producers = _cli(broker.bootstrap, "describe", "--topic", topic, "--partition", "0")
    assert producers.returncode == 0, producers.stderr
    lines = producers.stdout.splitlines()
    assert len(lines) == 2 and lines[1].split()[0] == row[2] and lines[1].split()[-1] == "0"
    described = _cli(broker.bootstrap, "describe", "--transactional-id", txn_id)
    assert described.returncode == 0, described.stderr
    assert "State: Ongoing" in described.stdout and f"{topic}-0" in described.stdout

    how = ["--topic", topic, "--partition", "0", "--start-offset", "0"] \
        if by == "partition" else ["--transactional-id", txn_id]
    # A stranger cannot: no secret, or the wrong one, changes nothing.
    refused = _cli(broker.bootstrap, "abort", *how, secret=None)
    assert refused.returncode == 2 and "secret" in refused.stderr, refused.stderr
    wrong = _cli(broker.bootstrap, "abort", *how, secret="not-the-secret")
    assert wrong.returncode == 1 and "SASL_AUTHENTICATION_FAILED" in wrong.stderr, wrong.stderr
    assert _list_latest(broker.bootstrap, topic) == (0, 3)
    aborted = _cli(broker.bootstrap, "abort", *how)
    assert aborted.returncode == 0, aborted.stdout + aborted.stderr
    assert _list_latest(broker.bootstrap, topic) == (4, 4)  # ABORT marker: the LSO moved
    described = _cli(broker.bootstrap, "describe", "--transactional-id", txn_id)
    assert "State: CompleteAbort" in described.stdout or "State: Empty" in described.stdout
    # Nothing of the aborted transaction is visible to read_committed.
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": broker.bootstrap, "group.id": "hang-check",
        "isolation.level": "read_committed", "enable.partition.eof": True})
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        seen = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                assert message.error().code() == confluent_kafka.KafkaError._PARTITION_EOF
                break
            seen.append(message.value())
        assert seen == []
    finally:
        consumer.close()


def test_cli_reports_unknown_ids_and_empty_partitions(broker: BrokerProcess) -> None:
    topic = unique_topic("txn-none")
    create_topic(broker.bootstrap, topic)
    described = _cli(broker.bootstrap, "describe", "--transactional-id", "no-such-txn")
    assert described.returncode == 1 and "TRANSACTIONAL_ID_NOT_FOUND" in described.stderr
    aborted = _cli(broker.bootstrap, "abort", "--topic", topic, "--partition", "0")
    assert aborted.returncode == 0 and "no open transaction" in aborted.stdout
