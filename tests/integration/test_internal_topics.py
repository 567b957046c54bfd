"""A client cannot corrupt the internal topics, and a coordinator loads past a record it cannot
decode (one real node; confluent-kafka as the transactional producer and the group member).

The failure this closes: a garbage record produced into every partition of
``__transaction_state`` and ``__consumer_offsets`` was accepted, and from then on, even after
restarts, every transactional producer got COORDINATOR_LOAD_IN_PROGRESS forever (the replay
raised UnicodeDecodeError on each attempt, thousands of tracebacks in the log).

* a client's Produce to an internal topic is refused (INVALID_TOPIC_EXCEPTION, as Kafka's
  ReplicaManager does) and nothing is appended;
* DeleteTopics and CreatePartitions on them are refused (INVALID_TOPIC_EXCEPTION), as are config
  changes that stop compacting them or creating them uncompacted (INVALID_CONFIG) and
  DeleteRecords;
* undecodable records already in the logs (written to the partition files while the node is
  down: no client can put them there any more) are skipped at load with one log line per
  partition, and transactions and group offsets work after the restart.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Any

import crc32c
import pytest
import trio

from raftlog.client.connection import KafkaClientError, KafkaConnection
from raftlog.partition.batch import build_batch
from raftlog.partition.log import LogConfig, PartitionLog
from raftlog.protocol.codec import Api, Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import (
    CREATE_PARTITIONS,
    CREATE_TOPICS,
    DELETE_RECORDS,
    DELETE_TOPICS,
    INCREMENTAL_ALTER_CONFIGS,
    METADATA,
)
from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import (
    create_topic,
    end_offsets,
    produce_raw,
    start_broker,
    unique_topic,
    wait_until,
)

confluent_kafka = pytest.importorskip("confluent_kafka")

OFFSETS = "__consumer_offsets"
TXN_STATE = "__transaction_state"
INTERNAL = (OFFSETS, TXN_STATE)
TIMEOUT_S = 30.0
RESOURCE_TOPIC = 2
OP_SET = 0


def _request(bootstrap: str, api: Api, body: dict[str, Any]) -> Struct:
    host, port = bootstrap.rsplit(":", 1)

    async def send() -> Struct:
        connection = await KafkaConnection.connect(host, int(port), timeout_s=TIMEOUT_S)
        try:
            return await connection.request(api, body, timeout_s=TIMEOUT_S)
        finally:
            await connection.aclose()

    result: Struct = trio.run(send)
    return result


def _partition_counts(bootstrap: str) -> dict[str, int]:
    response = _request(bootstrap, METADATA, {
        "topics": [{"name": name} for name in INTERNAL], "allow_auto_topic_creation": False})
    return {t.name: len(t.partitions) for t in response.topics if not t.error_code}


def _use_coordinators(bootstrap: str, tag: str, topic: str, committed: int) -> None:
    """One committed transaction (transactional.id ``tag``) and one offset commit and fetch
    (group ``tag``): both coordinators load and answer; creates the internal topics."""
    producer = confluent_kafka.Producer({
        "bootstrap.servers": bootstrap, "transactional.id": tag,
        "transaction.timeout.ms": 60_000, "linger.ms": 5})
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(topic, value=tag.encode(), partition=0)
    producer.commit_transaction(TIMEOUT_S)
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": tag, "enable.auto.commit": False})
    try:
        offset = confluent_kafka.TopicPartition(topic, 0, committed)
        consumer.commit(offsets=[offset], asynchronous=False)
        [fetched] = consumer.committed([confluent_kafka.TopicPartition(topic, 0)],
                                       timeout=TIMEOUT_S)
        assert fetched.error is None and fetched.offset == committed, fetched
    finally:
        consumer.close()


@pytest.fixture
def ready(broker: BrokerProcess) -> tuple[BrokerProcess, str]:
    """A node whose internal topics exist and whose coordinators have answered once."""
    topic = unique_topic("internal")
    create_topic(broker.bootstrap, topic)
    _use_coordinators(broker.bootstrap, "before", topic, committed=5)
    wait_until(lambda: len(_partition_counts(broker.bootstrap)) == 2, TIMEOUT_S,
               "both internal topics")
    return broker, topic


# -- Produce --------------------------------------------------------------------------------


def _garbage_batch() -> bytes:
    # Keys and values of neither layout; the key is not UTF-8 (what broke the old replay).
    return build_batch([(b"\xff\xfe\x00garbage", b"\x80\x81\x82", ()),
                        (b"\x00\x01\xff", b"{not json", ())])


def test_client_produce_to_internal_topics_is_refused(ready: tuple[BrokerProcess, str]
                                                      ) -> None:
    broker, topic = ready
    counts = _partition_counts(broker.bootstrap)
    before = {name: end_offsets(broker.bootstrap, name, range(counts[name])) for name in INTERNAL}
    for name in INTERNAL:
        for index in range(counts[name]):
            for acks in (-1, 1):
                with pytest.raises(KafkaClientError, match="INVALID_TOPIC_EXCEPTION"):
                    produce_raw(broker.bootstrap, name, index, _garbage_batch(), acks=acks)
    after = {name: end_offsets(broker.bootstrap, name, range(counts[name])) for name in INTERNAL}
    assert after == before, "a refused produce appended something"
    _use_coordinators(broker.bootstrap, "after-refusals", topic, committed=7)


# -- admin requests -------------------------------------------------------------------------


def test_internal_topics_cannot_be_deleted_or_reshaped(ready: tuple[BrokerProcess, str]
                                                       ) -> None:
    broker, topic = ready
    counts = _partition_counts(broker.bootstrap)

    deleted = _request(broker.bootstrap, DELETE_TOPICS,
                       {"topic_names": list(INTERNAL), "timeout_ms": 10_000})
    assert {r.name: r.error_code for r in deleted.responses} == \
        dict.fromkeys(INTERNAL, ErrorCode.INVALID_TOPIC_EXCEPTION)

    grown = _request(broker.bootstrap, CREATE_PARTITIONS, {
        "topics": [{"name": name, "count": counts[name] + 5, "assignments": None}
                   for name in INTERNAL], "timeout_ms": 10_000, "validate_only": False})
    assert {r.name: r.error_code for r in grown.results} == \
        dict.fromkeys(INTERNAL, ErrorCode.INVALID_TOPIC_EXCEPTION)

    altered = _request(broker.bootstrap, INCREMENTAL_ALTER_CONFIGS, {"resources": [
        {"resource_type": RESOURCE_TOPIC, "resource_name": name, "configs": [
            {"name": "cleanup.policy", "config_operation": OP_SET, "value": "delete"}]}
        for name in INTERNAL], "validate_only": False})
    assert {r.resource_name: r.error_code for r in altered.responses} == \
        dict.fromkeys(INTERNAL, ErrorCode.INVALID_CONFIG)

    trimmed = _request(broker.bootstrap, DELETE_RECORDS, {"topics": [
        {"name": name, "partitions": [{"partition_index": 0, "offset": -1}]}
        for name in INTERNAL], "timeout_ms": 10_000})
    assert {t.name: t.partitions[0].error_code for t in trimmed.topics} == \
        dict.fromkeys(INTERNAL, ErrorCode.INVALID_TOPIC_EXCEPTION)

    metadata = _request(broker.bootstrap, METADATA, {
        "topics": [{"name": name} for name in (*INTERNAL, topic)],
        "allow_auto_topic_creation": False})
    assert {t.name: (len(t.partitions), t.is_internal) for t in metadata.topics} == {
        OFFSETS: (counts[OFFSETS], True), TXN_STATE: (counts[TXN_STATE], True),
        topic: (1, False)}
    _use_coordinators(broker.bootstrap, "after-admin", topic, committed=9)


def test_internal_topics_cannot_be_created_uncompacted(broker: BrokerProcess) -> None:
    """Before the coordinators create them, a client's CreateTopics of an internal topic that
    would not be compacted (retention would delete offsets and transaction states) is refused;
    the coordinators then create theirs as usual."""
    created = _request(broker.bootstrap, CREATE_TOPICS, {"topics": [
        {"name": name, "num_partitions": 1, "replication_factor": 1, "assignments": [],
         "configs": [{"name": "cleanup.policy", "value": "delete"}]} for name in INTERNAL],
        "timeout_ms": 10_000, "validate_only": False})
    assert {t.name: t.error_code for t in created.topics} == \
        dict.fromkeys(INTERNAL, ErrorCode.INVALID_CONFIG)
    assert _partition_counts(broker.bootstrap) == {}
    topic = unique_topic("internal")
    create_topic(broker.bootstrap, topic)
    _use_coordinators(broker.bootstrap, "first", topic, committed=3)


# -- replay of undecodable records ------------------------------------------------------------


def _unreadable_batch() -> bytes:
    """A batch that is whole on disk (CRC fine) but whose records cannot be read: the gzip
    codec bit over uncompressed records."""
    out = bytearray(build_batch([(b"zipped", b"\x00\x01", ())]))
    struct.pack_into(">h", out, 21, struct.unpack_from(">h", out, 21)[0] | 1)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def _undecodable_batches() -> list[bytes]:
    non_utf8_group = struct.pack(">hh", 1, 2) + b"\xff\xfe" + struct.pack(">h", 1) + b"t" + \
        struct.pack(">i", 0)
    return [
        _garbage_batch(),
        build_batch([(non_utf8_group, b"\x00\x03" + b"\xff" * 8, ())]),  # offset key, bad UTF-8
        build_batch([(struct.pack(">h", 99) + b"future", b"\x00", ())]),  # unknown key version
        build_batch([(b"txn-id", b'{"producer_id": "not a number"}', ())]),
        _unreadable_batch(),
    ]


def _write_behind_the_coordinators(data_dir: Path, counts: dict[str, int]) -> None:
    """Append undecodable records to every internal partition's files (node stopped)."""
    now = int(time.time() * 1000)
    for name in INTERNAL:
        for index in range(counts[name]):
            log = PartitionLog.open(data_dir / f"{name}-{index}",
                                    LogConfig(cleanup_policy="compact"), now)
            try:
                for batch in _undecodable_batches():
                    log.append(batch, leader_epoch=max(log.latest_epoch, 0), now_ms=now)
                ticket = log.begin_flush()
                if ticket is not None:
                    ticket.run()
                    log.complete_flush(ticket)
            finally:
                log.close()


def test_coordinators_load_past_undecodable_records(ready: tuple[BrokerProcess, str]) -> None:
    broker, topic = ready
    counts = _partition_counts(broker.bootstrap)
    broker.stop()
    _write_behind_the_coordinators(broker.data_dir, counts)
    start_broker(broker)

    # The group written before the restart is still there, and both coordinators work.
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": broker.bootstrap, "group.id": "before",
        "enable.auto.commit": False})
    try:
        [fetched] = consumer.committed([confluent_kafka.TopicPartition(topic, 0)],
                                       timeout=TIMEOUT_S)
        assert fetched.error is None and fetched.offset == 5, fetched
    finally:
        consumer.close()
    _use_coordinators(broker.bootstrap, "before", topic, committed=11)  # same txn id, fenced on
    _use_coordinators(broker.bootstrap, "after-restart", topic, committed=13)

    # One line per loaded partition, no load failures.
    log_text = broker.log_path.read_text()
    for name in INTERNAL:
        loaded = [line for line in log_text.splitlines()
                  if "undecodable record(s) of " + name in line]
        assert loaded, f"no skip summary for {name}"
        assert all("skipped 6 undecodable" in line for line in loaded), loaded
    assert "loading __consumer_offsets" not in log_text
    assert "loading __transaction_state" not in log_text
