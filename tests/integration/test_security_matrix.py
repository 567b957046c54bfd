"""Acceptance matrix: every client on every kind of secured listener, against ONE node process
serving three at once:

* SASL_SSL with SCRAM-SHA-512 (a user made with ``raftlog format --add-scram``),
* SASL_PLAINTEXT with PLAIN (a JAAS user on that listener),
* SSL with ``ssl.client.auth=required`` (a client certificate signed by the node's CA).

For confluent-kafka, kafka-python and aiokafka: create and describe a topic with the client's
admin API, produce, commit a transaction, and consume the lot in a group (read_committed). For
kcat (Debian's, librdkafka 2.0.2; the only kcat on the test machines): produce, consume in a
group and list metadata (kcat has no admin or transactional mode). Debian's kcat logs in with
PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 (its SCRAM nonce quirk is accepted, see docs/security.md)
and speaks TLS with client certificates. Each case is named ``<client>-<listener>``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import BrokerProcess, free_port
from tests.integration.tls_certs import Certs, make_certs

PLAIN_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required'
              ' user_bob="bob-secret";')
LISTENERS = ("SASL_SSL", "SASL_PLAINTEXT", "SSL")
TIMEOUT_S = 30
KCAT = shutil.which("kcat")


@dataclass
class Node:
    process: BrokerProcess
    ports: dict[str, int]
    certs: Certs

    def bootstrap(self, listener: str) -> str:
        return f"127.0.0.1:{self.ports[listener]}"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    workdir = tmp_path_factory.mktemp("matrix")
    certs = make_certs(workdir / "certs")
    process = BrokerProcess(workdir)
    ports = {"SASL_SSL": process.port, "SASL_PLAINTEXT": free_port(), "SSL": free_port()}
    process.extra_properties = {
        "listeners": ",".join(f"{name}://127.0.0.1:{port}" for name, port in ports.items())
                     + f",CONTROLLER://127.0.0.1:{process.controller_port}",
        "listener.security.protocol.map": "SASL_SSL:SASL_SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,"
                                          "SSL:SSL,CONTROLLER:PLAINTEXT",
        "ssl.keystore.location": str(certs.server),
        "ssl.truststore.location": str(certs.ca),
        "listener.name.ssl.ssl.client.auth": "required",
        "listener.name.sasl_ssl.sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true",
    }
    formatted = subprocess.run(
        [sys.executable, "-m", "raftlog", "format", "--config", str(process.write_config()),
         "--add-scram", "SCRAM-SHA-512=[name=alice,password=alice-secret]"],
        capture_output=True, text=True, timeout=60, check=False, cwd=workdir)
    assert formatted.returncode == 0, formatted.stderr
    process.start()
    try:
        yield Node(process, ports, certs)
    finally:
        process.stop()


def _confluent(node: Node, listener: str) -> dict[str, Any]:
    config: dict[str, Any] = {"bootstrap.servers": node.bootstrap(listener),
                              "security.protocol": listener}
    if listener == "SASL_SSL":
        config.update({"sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "alice",
                       "sasl.password": "alice-secret"})
    if listener == "SASL_PLAINTEXT":
        config.update({"sasl.mechanisms": "PLAIN", "sasl.username": "bob",
                       "sasl.password": "bob-secret"})
    if listener != "SASL_PLAINTEXT":
        config["ssl.ca.location"] = str(node.certs.ca)
    if listener == "SSL":
        config.update({"ssl.certificate.location": str(node.certs.client_cert),
                       "ssl.key.location": str(node.certs.client_key)})
    return config


def _python_kwargs(node: Node, listener: str, ssl_context: bool = False) -> dict[str, Any]:
    """kafka-python's (``ssl_context=False``) or aiokafka's keyword arguments."""
    kwargs: dict[str, Any] = {"bootstrap_servers": node.bootstrap(listener),
                              "security_protocol": listener}
    if listener == "SASL_SSL":
        kwargs.update(sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="alice",
                      sasl_plain_password="alice-secret")
    if listener == "SASL_PLAINTEXT":
        kwargs.update(sasl_mechanism="PLAIN", sasl_plain_username="bob",
                      sasl_plain_password="bob-secret")
    if listener != "SASL_PLAINTEXT":
        cert = ((str(node.certs.client_cert), str(node.certs.client_key))
                if listener == "SSL" else (None, None))
        if ssl_context:
            from aiokafka.helpers import create_ssl_context

            kwargs["ssl_context"] = create_ssl_context(
                cafile=str(node.certs.ca), certfile=cert[0], keyfile=cert[1])
        else:
            kwargs.update(ssl_cafile=str(node.certs.ca), ssl_certfile=cert[0],
                          ssl_keyfile=cert[1], ssl_check_hostname=True)
    return kwargs


def _topic(client: str, listener: str) -> str:
    return f"m-{client}-{listener.lower()}-{uuid.uuid4().hex[:6]}"


PLAIN_VALUES = [b"p0", b"p1", b"p2"]
TXN_VALUES = [b"t0", b"t1"]


def run_confluent(node: Node, listener: str) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    config = _confluent(node, listener)
    topic = _topic("confluent", listener)
    admin = AdminClient(config)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(TIMEOUT_S)
    described = admin.list_topics(topic, timeout=TIMEOUT_S).topics[topic]
    assert described.error is None and list(described.partitions) == [0]
    producer = Producer(config)
    for value in PLAIN_VALUES:
        producer.produce(topic, value=value)
    assert producer.flush(TIMEOUT_S) == 0
    transactional = Producer({**config, "transactional.id": f"txn-{topic}"})
    transactional.init_transactions(TIMEOUT_S)
    transactional.begin_transaction()
    for value in TXN_VALUES:
        transactional.produce(topic, value=value)
    transactional.commit_transaction(TIMEOUT_S)
    consumer = Consumer({**config, "group.id": f"g-{topic}", "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    consumer.subscribe([topic])
    seen: list[bytes] = []
    try:
        for _ in range(4 * TIMEOUT_S):
            message = consumer.poll(0.25)
            if message is not None and message.error() is None:
                seen.append(message.value())
            if len(seen) >= len(PLAIN_VALUES) + len(TXN_VALUES):
                break
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    assert seen == PLAIN_VALUES + TXN_VALUES


def run_kafka_python(node: Node, listener: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    kwargs = _python_kwargs(node, listener)
    topic = _topic("kafka-python", listener)
    admin = KafkaAdminClient(**kwargs)
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
        described = admin.describe_topics([topic])
        assert described[0]["error_code"] == 0 and len(described[0]["partitions"]) == 1
    finally:
        admin.close()
    producer = KafkaProducer(**kwargs)
    for value in PLAIN_VALUES:
        producer.send(topic, value)
    producer.flush(TIMEOUT_S)
    producer.close()
    transactional = KafkaProducer(**kwargs, transactional_id=f"txn-{topic}")
    transactional.init_transactions()
    transactional.begin_transaction()
    for value in TXN_VALUES:
        transactional.send(topic, value)
    transactional.commit_transaction()
    transactional.close()
    consumer = KafkaConsumer(topic, **kwargs, group_id=f"g-{topic}",
                             auto_offset_reset="earliest", isolation_level="read_committed",
                             consumer_timeout_ms=TIMEOUT_S * 1000)
    seen = []
    try:
        for message in consumer:
            seen.append(message.value)
            if len(seen) >= len(PLAIN_VALUES) + len(TXN_VALUES):
                break
        consumer.commit()
    finally:
        consumer.close()
    assert seen == PLAIN_VALUES + TXN_VALUES


def run_aiokafka(node: Node, listener: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    topic = _topic("aiokafka", listener)

    async def scenario() -> list[bytes]:
        kwargs = _python_kwargs(node, listener, ssl_context=True)
        admin = AIOKafkaAdminClient(**kwargs)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, 1, 1)])
            described = await admin.describe_topics([topic])
            assert described[0]["error_code"] == 0
        finally:
            await admin.close()
        producer = AIOKafkaProducer(**kwargs)
        await producer.start()
        try:
            for value in PLAIN_VALUES:
                await producer.send_and_wait(topic, value)
        finally:
            await producer.stop()
        transactional = AIOKafkaProducer(**kwargs, transactional_id=f"txn-{topic}")
        await transactional.start()
        try:
            async with transactional.transaction():
                for value in TXN_VALUES:
                    await transactional.send(topic, value)
        finally:
            await transactional.stop()
        consumer = AIOKafkaConsumer(topic, **kwargs, group_id=f"g-{topic}",
                                    auto_offset_reset="earliest",
                                    isolation_level="read_committed")
        await consumer.start()
        seen: list[bytes] = []
        try:
            while len(seen) < len(PLAIN_VALUES) + len(TXN_VALUES):
                message = await asyncio.wait_for(consumer.getone(), TIMEOUT_S)
                seen.append(message.value)
            await consumer.commit()
        finally:
            await consumer.stop()
        return seen

    assert asyncio.run(scenario()) == PLAIN_VALUES + TXN_VALUES


def run_kcat(node: Node, listener: str) -> None:
    """Debian's kcat: produce, consume in a group (-G), metadata (-L)."""
    if KCAT is None:
        pytest.skip("kcat is not installed")
    settings = [arg for key, value in _confluent(node, listener).items()
                if key != "bootstrap.servers" for arg in ("-X", f"{key}={value}")]
    topic = _topic("kcat", listener)

    def kcat(*args: str, stdin: str | None = None) -> str:
        assert KCAT is not None
        result = subprocess.run([KCAT, "-b", node.bootstrap(listener), *settings, *args],
                                input=stdin, capture_output=True, text=True,
                                timeout=TIMEOUT_S * 2, check=False)
        assert result.returncode == 0, result.stderr
        return result.stdout

    kcat("-P", "-t", topic, stdin="".join(v.decode() + "\n" for v in PLAIN_VALUES))
    consumed = kcat("-G", f"g-{topic}", "-o", "beginning", "-c", str(len(PLAIN_VALUES)),
                    "-q", "-f", "%s\n", topic)
    assert consumed.split() == [v.decode() for v in PLAIN_VALUES]
    listing = json.loads(kcat("-L", "-J", "-t", topic))
    assert listing["brokers"] == [{"id": 1, "name": node.bootstrap(listener)}]
    assert [t["topic"] for t in listing["topics"]] == [topic]


CLIENTS: dict[str, Callable[[Node, str], None]] = {
    "confluent": run_confluent, "kafka-python": run_kafka_python, "aiokafka": run_aiokafka,
    "kcat": run_kcat}


@pytest.mark.parametrize("listener", LISTENERS)
@pytest.mark.parametrize("client", list(CLIENTS))
def test_client_on_listener(node: Node, client: str, listener: str) -> None:
    CLIENTS[client](node, listener)


def test_listeners_answer_with_their_own_addresses(node: Node, tmp_path: Path) -> None:
    """Metadata on each listener names the broker at that listener's port (the node
    registered all three)."""
    from confluent_kafka.admin import AdminClient

    for listener in LISTENERS:
        brokers = AdminClient(_confluent(node, listener)).list_topics(
            timeout=TIMEOUT_S).brokers
        assert {b.id: f"{b.host}:{b.port}" for b in brokers.values()} == {
            1: node.bootstrap(listener)}
