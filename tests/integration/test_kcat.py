"""Acceptance: kcat (librdkafka's command-line client, installed from apt) against the broker.

Skipped, with the reason, only when the kcat binary is missing (``apt-get install -y kcat``
or ``make apt-test`` installs it).
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from raftlog.partition.batch import check_batch
from raftlog.tools.console import partition_for_key
from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import (
    CODECS,
    create_topic,
    end_offsets,
    fetch_raw,
    fetch_records,
    unique_topic,
)

KCAT = shutil.which("kcat") or shutil.which("kafkacat")
pytestmark = pytest.mark.skipif(
    KCAT is None, reason="kcat is not installed (apt-get install -y kcat, or make apt-test)")
KCAT_TIMEOUT_S = 30.0
PARTITIONS = 3
# librdkafka's name for Kafka's default (murmur2) partitioner.
MURMUR2 = ("-X", "partitioner=murmur2_random")


def kcat(broker: BrokerProcess, *args: str, stdin: bytes | None = None) -> str:
    assert KCAT is not None
    result = subprocess.run([KCAT, "-b", broker.bootstrap, *args], input=stdin,
                            capture_output=True, timeout=KCAT_TIMEOUT_S, check=False)
    assert result.returncode == 0, (
        f"kcat {' '.join(args)} exited {result.returncode}:\n{result.stderr.decode()}")
    return result.stdout.decode()


def consume_all(broker: BrokerProcess, topic: str, *extra: str) -> list[tuple[int, int, str, str]]:
    """``kcat -C -e`` from the beginning: (partition, offset, key, value) per line."""
    out = kcat(broker, "-C", "-t", topic, "-e", "-q", "-o", "beginning",
               "-f", "%p\t%o\t%k\t%s\n", *extra)
    rows = []
    for line in out.splitlines():
        partition, offset, key, value = line.split("\t")
        rows.append((int(partition), int(offset), key, value))
    return rows


def test_kcat_produce_then_consume(broker: BrokerProcess) -> None:
    topic = unique_topic("kcat")
    create_topic(broker.bootstrap, topic, PARTITIONS)
    lines = [(f"key-{i % 11}", f"value-{i:04d}") for i in range(1_000)]
    kcat(broker, "-P", "-t", topic, "-K", ":", *MURMUR2,
         stdin="".join(f"{k}:{v}\n" for k, v in lines).encode())

    rows = consume_all(broker, topic)
    assert sorted(v for _, _, _, v in rows) == sorted(v for _, v in lines)
    expected: dict[int, list[tuple[str, str]]] = {p: [] for p in range(PARTITIONS)}
    for key, value in lines:
        expected[partition_for_key(key.encode(), PARTITIONS)].append((key, value))
    for partition in range(PARTITIONS):
        mine = [(o, k, v) for p, o, k, v in rows if p == partition]
        assert [o for o, _, _ in mine] == list(range(len(mine)))
        assert [(k, v) for _, k, v in mine] == expected[partition], (
            f"partition {partition}: order or placement differs from kcat's input")
    assert end_offsets(broker.bootstrap, topic, range(PARTITIONS)) == {
        p: len(expected[p]) for p in range(PARTITIONS)}


def test_kcat_single_partition_headers_and_offsets(broker: BrokerProcess) -> None:
    """-p / -o / -c and record headers (-H), null keys; the raw log agrees with kcat."""
    topic = unique_topic("kcat-headers")
    create_topic(broker.bootstrap, topic, PARTITIONS)
    values = [f"line {i}" for i in range(50)]
    kcat(broker, "-P", "-t", topic, "-p", "1", "-H", "origin=kcat",
         stdin="".join(v + "\n" for v in values).encode())

    out = kcat(broker, "-C", "-t", topic, "-p", "1", "-o", "10", "-c", "5", "-e", "-q",
               "-f", "%o|%h|%s\n")
    assert out.splitlines() == [f"{o}|origin=kcat|line {o}" for o in range(10, 15)]
    raw = fetch_records(broker.bootstrap, topic, 1)
    assert [r.value for r in raw] == [v.encode() for v in values]
    assert all(r.key is None and r.headers == (("origin", b"kcat"),) for r in raw)
    assert end_offsets(broker.bootstrap, topic, range(PARTITIONS)) == {0: 0, 1: 50, 2: 0}


def test_kcat_consume_empty_topic_exits(broker: BrokerProcess) -> None:
    topic = unique_topic("kcat-empty")
    create_topic(broker.bootstrap, topic, PARTITIONS)
    assert consume_all(broker, topic) == []


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_kcat_compressed_produce(broker: BrokerProcess, codec: str) -> None:
    topic = unique_topic(f"kcat-{codec}")
    create_topic(broker.bootstrap, topic, 1)
    values = [f"{codec} compressible payload {i % 5} " * 8 + str(i) for i in range(300)]
    kcat(broker, "-P", "-t", topic, "-p", "0", "-z", codec, "-X", "linger.ms=50",
         stdin="".join(v + "\n" for v in values).encode())
    batches = fetch_raw(broker.bootstrap, topic, 0)
    assert batches
    for batch in batches:
        header = check_batch(batch.raw)
        # librdkafka sends uncompressed batches, silently, for a codec it believes the broker
        # lacks (it infers lz4 support from FindCoordinator being advertised).
        assert header.compression_codec == CODECS[codec], (
            f"batch at offset {header.base_offset} stored with codec "
            f"{header.compression_codec}, kcat -z {codec} ({CODECS[codec]})")
    assert [r[3] for r in consume_all(broker, topic)] == values


def test_kcat_metadata_listing(broker: BrokerProcess) -> None:
    topics = [unique_topic("kcat-meta-a"), unique_topic("kcat-meta-b")]
    create_topic(broker.bootstrap, topics[0], 3)
    create_topic(broker.bootstrap, topics[1], 1)

    listing = json.loads(kcat(broker, "-L", "-J"))
    assert listing["brokers"] == [{"id": 1, "name": broker.bootstrap}]
    assert listing["controllerid"] == 1
    described = {t["topic"]: t for t in listing["topics"]}
    assert set(topics) <= set(described)
    for name, count in zip(topics, (3, 1), strict=True):
        assert "error" not in described[name], described[name]
        partitions = described[name]["partitions"]
        assert [p["partition"] for p in partitions] == list(range(count))
        for p in partitions:
            assert p["leader"] == 1
            assert p["replicas"] == [{"id": 1}] and p["isrs"] == [{"id": 1}]

    text = kcat(broker, "-L", "-t", topics[0])
    assert f'topic "{topics[0]}" with 3 partitions:' in text
    assert f"broker 1 at {broker.bootstrap}" in text
