"""Acceptance: SSL listeners with real certificates and real clients against a node process.

One node serves an SSL listener (mutual TLS: ``ssl.client.auth=required``, its key encrypted
with ``ssl.key.password``) next to its PLAINTEXT one. confluent-kafka, kafka-python, aiokafka
and kcat produce and consume over TLS; a client whose certificate the node does not trust and
a client sending plaintext to the TLS port are refused with a log line naming them, and the
node stays healthy.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import BrokerProcess, free_port
from tests.integration.helpers import (
    broker_log_problems,
    create_topic,
    unique_topic,
    wait_until,
)
from tests.integration.tls_certs import Certs, make_certs

KEY_PASSWORD = "server-key-secret"
TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"), KEY_PASSWORD.encode())


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[BrokerProcess]:
    ssl_port = free_port()
    process = BrokerProcess(tmp_path_factory.mktemp("tls-node"))
    process.extra_properties = {
        # SSL first: the listeners start in this order, so once PLAINTEXT accepts (what the
        # fixture waits for) the SSL one does too.
        "listeners": f"SSL://127.0.0.1:{ssl_port},PLAINTEXT://127.0.0.1:{process.port},"
                     f"CONTROLLER://127.0.0.1:{process.controller_port}",
        "listener.security.protocol.map": "SSL:SSL,PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(certs.server),
        "ssl.key.password": KEY_PASSWORD,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(certs.ca),
        "listener.name.ssl.ssl.client.auth": "required",
    }
    process.ssl_port = ssl_port  # type: ignore[attr-defined]
    process.start()
    try:
        yield process
    finally:
        process.stop()


def ssl_bootstrap(node: BrokerProcess) -> str:
    return f"localhost:{node.ssl_port}"  # type: ignore[attr-defined]


def librdkafka_ssl(certs: Certs, node: BrokerProcess) -> dict[str, Any]:
    return {"bootstrap.servers": ssl_bootstrap(node), "security.protocol": "SSL",
            "ssl.ca.location": str(certs.ca), "ssl.certificate.location": str(certs.client_cert),
            "ssl.key.location": str(certs.client_key)}


def client_context(certs: Certs, cert: Path | None = None, key: Path | None = None
                   ) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca))
    context.load_cert_chain(str(cert or certs.client_cert), str(key or certs.client_key))
    return context


def assert_healthy(node: BrokerProcess) -> None:
    assert node.alive()
    with socket.create_connection(("127.0.0.1", node.port), timeout=2):
        pass
    assert broker_log_problems(node.log_path.read_text()) == []


def test_confluent_produce_consume_group_and_transaction(node: BrokerProcess,
                                                         certs: Certs) -> None:
    from confluent_kafka import Consumer, KafkaException, Producer
    from confluent_kafka.admin import AdminClient

    conf = librdkafka_ssl(certs, node)
    topic = unique_topic("tls")
    create_topic(node.bootstrap, topic, 2)
    # Metadata over TLS names the SSL listener's port, not the registered PLAINTEXT one.
    metadata = AdminClient(conf).list_topics(timeout=TIMEOUT_S)
    assert [(b.host, b.port) for b in metadata.brokers.values()] == [
        ("127.0.0.1", node.ssl_port)]  # type: ignore[attr-defined]
    producer = Producer({**conf, "enable.idempotence": True})
    for i in range(500):
        producer.produce(topic, key=f"k{i % 7}".encode(), value=b"v" * 300 + str(i).encode())
    assert producer.flush(TIMEOUT_S) == 0
    txn = Producer({**conf, "transactional.id": f"{topic}-txn"})
    txn.init_transactions(TIMEOUT_S)
    txn.begin_transaction()
    for i in range(50):
        txn.produce(topic, value=f"txn-{i}".encode())
    txn.commit_transaction(TIMEOUT_S)
    consumer = Consumer({**conf, "group.id": f"{topic}-group", "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    values: list[bytes] = []
    try:
        consumer.subscribe([topic])
        wait_until(lambda: _poll_into(consumer, values) >= 550, TIMEOUT_S, "550 records")
        consumer.commit(asynchronous=False)
        committed = consumer.committed(consumer.assignment(), timeout=TIMEOUT_S)
    except KafkaException as exc:
        raise AssertionError(f"consumer failed: {exc}") from exc
    finally:
        consumer.close()
    assert len(values) == 550
    assert {f"txn-{i}".encode() for i in range(50)} <= set(values)
    assert sum(tp.offset for tp in committed) >= 550  # + the transaction's commit markers
    assert_healthy(node)


def _poll_into(consumer: Any, values: list[bytes]) -> int:
    for message in consumer.consume(num_messages=500, timeout=0.5):
        if message.error() is not None:
            raise AssertionError(f"consumer error: {message.error()}")
        values.append(message.value())
    return len(values)


def test_kafka_python_over_ssl(node: BrokerProcess, certs: Certs) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    topic = unique_topic("tls-kp")
    create_topic(node.bootstrap, topic, 1)
    context = client_context(certs)
    producer = KafkaProducer(bootstrap_servers=ssl_bootstrap(node), security_protocol="SSL",
                             ssl_context=context)
    for i in range(200):
        producer.send(topic, f"kp-{i}".encode())
    producer.flush(TIMEOUT_S)
    producer.close()
    consumer = KafkaConsumer(topic, bootstrap_servers=ssl_bootstrap(node),
                             security_protocol="SSL", ssl_context=context,
                             auto_offset_reset="earliest", consumer_timeout_ms=10_000)
    values = []
    for message in consumer:  # consumer_timeout_ms bounds a wait for records that never come
        values.append(message.value)
        if len(values) == 200:
            break
    consumer.close()
    assert values == [f"kp-{i}".encode() for i in range(200)]


def test_aiokafka_over_ssl(node: BrokerProcess, certs: Certs) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic = unique_topic("tls-aio")
    create_topic(node.bootstrap, topic, 1)
    context = client_context(certs)

    async def run() -> list[bytes]:
        producer = AIOKafkaProducer(bootstrap_servers=ssl_bootstrap(node),
                                    security_protocol="SSL", ssl_context=context)
        await producer.start()
        try:
            for i in range(200):
                await producer.send(topic, f"aio-{i}".encode())
            await producer.flush()
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=ssl_bootstrap(node),
                                    security_protocol="SSL", ssl_context=context,
                                    auto_offset_reset="earliest")
        await consumer.start()
        values: list[bytes] = []
        try:
            async with asyncio.timeout(TIMEOUT_S):
                while len(values) < 200:
                    batches = await consumer.getmany(timeout_ms=500)
                    values.extend(m.value for ms in batches.values() for m in ms)
        finally:
            await consumer.stop()
        return values

    assert asyncio.run(run()) == [f"aio-{i}".encode() for i in range(200)]


KCAT = shutil.which("kcat") or shutil.which("kafkacat")


@pytest.mark.skipif(KCAT is None, reason="kcat is not installed (apt-get install -y kcat)")
def test_kcat_over_ssl(node: BrokerProcess, certs: Certs) -> None:
    assert KCAT is not None
    topic = unique_topic("tls-kcat")
    create_topic(node.bootstrap, topic, 1)
    tls = ["-b", ssl_bootstrap(node), "-X", "security.protocol=SSL",
           "-X", f"ssl.ca.location={certs.ca}",
           "-X", f"ssl.certificate.location={certs.client_cert}",
           "-X", f"ssl.key.location={certs.client_key}"]

    def kcat(*args: str, stdin: bytes | None = None) -> str:
        result = subprocess.run([KCAT, *tls, *args], input=stdin, capture_output=True,
                                timeout=TIMEOUT_S, check=False)
        assert result.returncode == 0, result.stderr.decode()
        return result.stdout.decode()

    kcat("-P", "-t", topic, stdin="".join(f"kc-{i}\n" for i in range(300)).encode())
    out = kcat("-C", "-t", topic, "-e", "-q", "-o", "beginning")
    assert out.splitlines() == [f"kc-{i}" for i in range(300)]


def test_untrusted_client_certificate_is_refused(node: BrokerProcess, certs: Certs) -> None:
    context = client_context(certs, certs.untrusted_cert, certs.untrusted_key)
    refused = _tls_exchange(node, context)
    assert refused is not None, "a certificate from an untrusted CA was accepted"
    wait_until(lambda: "TLS handshake with 127.0.0.1:" in node.log_path.read_text(), 10,
               "the refusal's log line")
    line = next(line for line in node.log_path.read_text().splitlines()
                if "TLS handshake with 127.0.0.1:" in line)
    assert "on SSL failed" in line and "CERTIFICATE" in line.upper()
    # A client without any certificate is refused too (ssl.client.auth=required).
    bare = ssl.create_default_context(cafile=str(certs.ca))
    assert _tls_exchange(node, bare) is not None
    assert_healthy(node)


def _tls_exchange(node: BrokerProcess, context: ssl.SSLContext) -> str | None:
    """None when an ApiVersions request got its answer over TLS, else why not."""
    header = b"\x00\x12\x00\x00\x00\x00\x00\x01\x00\x04test"  # ApiVersions v0, correlation 1
    try:
        with socket.create_connection(("127.0.0.1", node.ssl_port),  # type: ignore[attr-defined]
                                      timeout=5) as raw, \
                context.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(len(header).to_bytes(4, "big") + header)
            answer = tls.recv(4)
            return None if len(answer) == 4 else "closed without an answer"
    except (ssl.SSLError, OSError) as exc:
        return str(exc)


def test_trusted_client_gets_an_answer(node: BrokerProcess, certs: Certs) -> None:
    # The control for the refusal tests: the same exchange with a trusted certificate works.
    assert _tls_exchange(node, client_context(certs)) is None


def test_plaintext_to_the_tls_port_is_closed(node: BrokerProcess) -> None:
    port = node.ssl_port  # type: ignore[attr-defined]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(b"\x00\x00\x00\x12\x00\x12\x00\x00\x00\x00\x00\x01\x00\x04test" * 4)
        raw.settimeout(15)
        received = b""
        while chunk := raw.recv(4096):
            received += chunk
    assert not received.startswith(b"\x00\x00\x00"), "a Kafka answer on the TLS port"
    wait_until(lambda: "on SSL failed: WRONG_VERSION_NUMBER" in node.log_path.read_text(),
               10, "the plaintext refusal's log line")
    assert_healthy(node)


def test_a_node_with_only_an_ssl_listener(tmp_path: Path, certs: Certs) -> None:
    """No PLAINTEXT listener at all: the registered (inter-broker) endpoint is the SSL one, and
    a transaction (markers, offsets) completes on a single node."""
    from confluent_kafka import Consumer, Producer

    process = BrokerProcess(tmp_path)
    process.extra_properties = {
        "listeners": f"SSL://127.0.0.1:{process.port},"
                     f"CONTROLLER://127.0.0.1:{process.controller_port}",
        "listener.security.protocol.map": "SSL:SSL,CONTROLLER:PLAINTEXT",
        "ssl.keystore.location": str(certs.server),
        "ssl.key.password": KEY_PASSWORD,
    }
    process.start()
    try:
        conf = {"bootstrap.servers": f"127.0.0.1:{process.port}", "security.protocol": "SSL",
                "ssl.ca.location": str(certs.ca)}
        topic = unique_topic("tls-only")
        txn = Producer({**conf, "transactional.id": f"{topic}-txn"})
        txn.init_transactions(TIMEOUT_S)
        txn.begin_transaction()
        for i in range(100):
            txn.produce(topic, value=f"only-{i}".encode())
        txn.commit_transaction(TIMEOUT_S)
        consumer = Consumer({**conf, "group.id": f"{topic}-g", "auto.offset.reset": "earliest",
                             "isolation.level": "read_committed"})
        values: list[bytes] = []
        try:
            consumer.subscribe([topic])
            wait_until(lambda: _poll_into(consumer, values) >= 100, TIMEOUT_S, "100 records")
        finally:
            consumer.close()
        assert values == [f"only-{i}".encode() for i in range(100)]
        assert broker_log_problems(process.log_path.read_text()) == []
    finally:
        process.stop()
