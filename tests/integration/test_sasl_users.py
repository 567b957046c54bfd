"""SASL for users against a real node process: SCRAM users created with ``raftlog users`` and
with confluent-kafka's AdminClient (AlterUserScramCredentials), PLAIN users from a JAAS line,
and the clients that log in with them (confluent-kafka, kafka-python, aiokafka, kcat); the
failures: wrong password and unknown user alike, a mechanism not enabled, SaslHandshake v0.
"""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raftlog.protocol import codec
from raftlog.protocol.codec import Api, Struct
from raftlog.protocol.schemas import API_VERSIONS, METADATA
from raftlog.protocol.schemas_security import SASL_AUTHENTICATE, SASL_HANDSHAKE
from raftlog.security.scram import ScramClient
from tests.fuzz_frames import request_payload
from tests.integration.conftest import BROKER_SECRET, BrokerProcess
from tests.integration.helpers import wait_until

PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
JAAS = f'{PLAIN_MODULE} required user_bob="bob-secret" user_carol="carol-secret";'
_SIZE = struct.Struct(">i")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("sasl"), extra_properties={
        "sasl.jaas.config": JAAS, "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "auto.create.topics.enable": "true"})
    process.start()
    try:
        _users(process, "add", "alice", "--mechanism", "SCRAM-SHA-512", "--password",
               "alice-secret", "--iterations", "4096")
        yield process
    finally:
        process.stop()


def _users(node: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "raftlog", "users", *args, "--bootstrap-server", node.bootstrap],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return result


def _topic() -> str:
    return f"sasl-{uuid.uuid4().hex[:8]}"


def _confluent_sasl(mechanism: str, user: str, password: str) -> dict[str, Any]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": mechanism,
            "sasl.username": user, "sasl.password": password}


def test_users_tool_lists_and_adds(node: BrokerProcess) -> None:
    listed = _users(node, "list").stdout
    assert "alice: SCRAM-SHA-512 (iterations 4096)" in listed
    _users(node, "add", "temp", "--mechanism", "SCRAM-SHA-256", "--password", "x1")
    assert "temp: SCRAM-SHA-256 (iterations 8192)" in _users(node, "list", "temp").stdout
    _users(node, "delete", "temp")
    gone = subprocess.run(
        [sys.executable, "-m", "raftlog", "users", "list", "temp", "--bootstrap-server",
         node.bootstrap], capture_output=True, text=True, timeout=60, check=False)
    assert gone.returncode == 1 and "RESOURCE_NOT_FOUND" in gone.stderr


@pytest.mark.parametrize(("mechanism", "user", "password"), [
    ("SCRAM-SHA-512", "alice", "alice-secret"), ("PLAIN", "bob", "bob-secret")])
def test_confluent_produce_consume(node: BrokerProcess, mechanism: str, user: str,
                                   password: str) -> None:
    from confluent_kafka import Consumer, Producer

    topic = _topic()
    auth = _confluent_sasl(mechanism, user, password)
    producer = Producer({"bootstrap.servers": node.bootstrap, **auth})
    for i in range(5):
        producer.produce(topic, value=f"v{i}".encode())
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": f"g-{topic}",
                         "auto.offset.reset": "earliest", **auth})
    consumer.subscribe([topic])
    values: list[bytes] = []
    try:
        for _ in range(60):
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
            if len(values) == 5:
                break
    finally:
        consumer.close()
    assert values == [f"v{i}".encode() for i in range(5)]


def test_confluent_admin_alters_and_describes_scram_users(node: BrokerProcess) -> None:
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": node.bootstrap,
                         **_confluent_sasl("SCRAM-SHA-512", "alice", "alice-secret")})
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096)
    futures = admin.alter_user_scram_credentials([
        UserScramCredentialUpsertion("dave", info, b"dave-secret", b"some-salt"),
        UserScramCredentialUpsertion("erin", ScramCredentialInfo(
            ScramMechanism.SCRAM_SHA_256, 100), b"x", b"salt")])
    futures["dave"].result(30)
    with pytest.raises(Exception, match=r"UNACCEPTABLE_CREDENTIAL|iterations"):
        futures["erin"].result(30)
    described = admin.describe_user_scram_credentials(["dave"])["dave"].result(30)
    assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == [
        (ScramMechanism.SCRAM_SHA_256, 4096)]
    # dave logs in with the credential the AdminClient salted.
    _produce_one_confluent(node, _confluent_sasl("SCRAM-SHA-256", "dave", "dave-secret"))
    deletion = admin.alter_user_scram_credentials([
        UserScramCredentialDeletion("nobody", ScramMechanism.SCRAM_SHA_256)])
    with pytest.raises(Exception, match=r"RESOURCE_NOT_FOUND|does not exist"):
        deletion["nobody"].result(30)


def _produce_one_confluent(node: BrokerProcess, auth: dict[str, Any]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": node.bootstrap, **auth})
    producer.produce(_topic(), value=b"x")
    assert producer.flush(30) == 0


@pytest.mark.parametrize(("mechanism", "user", "password"), [
    ("SCRAM-SHA-512", "alice", "alice-secret"), ("SCRAM-SHA-256", "frank", "frank-secret"),
    ("PLAIN", "carol", "carol-secret")])
def test_kafka_python(node: BrokerProcess, mechanism: str, user: str, password: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    if user == "frank":
        _users(node, "add", "frank", "--mechanism", mechanism, "--password", password)
    auth = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
            "sasl_plain_username": user, "sasl_plain_password": password}
    topic = _topic()
    producer = KafkaProducer(bootstrap_servers=node.bootstrap, **auth)
    producer.send(topic, b"kp").get(30)
    producer.close()
    consumer = KafkaConsumer(topic, bootstrap_servers=node.bootstrap,
                             auto_offset_reset="earliest", consumer_timeout_ms=10_000, **auth)
    values = []
    for message in consumer:  # consumer_timeout_ms bounds a wait for a record that never comes
        values.append(message.value)
        break
    consumer.close()
    assert values == [b"kp"]


@pytest.mark.parametrize(("mechanism", "user", "password"), [
    ("SCRAM-SHA-512", "alice", "alice-secret"), ("PLAIN", "bob", "bob-secret")])
def test_aiokafka(node: BrokerProcess, mechanism: str, user: str, password: str) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    auth = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
            "sasl_plain_username": user, "sasl_plain_password": password}
    topic = _topic()

    async def round_trip() -> list[bytes]:
        producer = AIOKafkaProducer(bootstrap_servers=node.bootstrap, **auth)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"aio")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=node.bootstrap,
                                    auto_offset_reset="earliest", **auth)
        await consumer.start()
        try:
            message = await asyncio.wait_for(consumer.getone(), 20)
        finally:
            await consumer.stop()
        return [message.value]

    assert asyncio.run(round_trip()) == [b"aio"]


# -- Failures, on the wire ------------------------------------------------------------------------


class _Raw:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.correlation = 0

    def call(self, api: Api, version: int, body: dict[str, Any]) -> Struct | None:
        self.correlation += 1
        payload = request_payload(api, version, body, self.correlation, "raw")
        self.sock.sendall(_SIZE.pack(len(payload)) + payload)
        head = self._exactly(4)
        if head is None:
            return None
        frame = self._exactly(_SIZE.unpack(head)[0])
        assert frame is not None
        view = memoryview(frame)
        flexible_header = api.is_flexible(version) and api is not API_VERSIONS
        _, pos = codec.decode_response_header(view, flexible_header)
        return codec.decode(api, version, view[pos:], is_request=False)

    def _exactly(self, size: int) -> bytes | None:
        data = b""
        while len(data) < size:
            try:
                chunk = self.sock.recv(size - len(data))
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            data += chunk
        return data

    def scram(self, mechanism: str, user: str, password: str) -> tuple[int, str | None]:
        shake = self.call(SASL_HANDSHAKE, 1, {"mechanism": mechanism})
        assert shake is not None and shake.error_code == 0
        client = ScramClient(mechanism, user, password.encode())
        first = self.call(SASL_AUTHENTICATE, 1, {"auth_bytes": client.first()})
        assert first is not None and first.error_code == 0
        final_token = client.final(bytes(first.auth_bytes))
        final = self.call(SASL_AUTHENTICATE, 1, {"auth_bytes": final_token})
        assert final is not None
        return final.error_code, final.error_message


def test_wrong_password_and_unknown_user_get_the_same_answer(node: BrokerProcess) -> None:
    wrong = _Raw(node.port).scram("SCRAM-SHA-512", "alice", "not-it")
    unknown = _Raw(node.port).scram("SCRAM-SHA-512", "nosuchuser", "whatever")
    assert wrong == unknown == (58, "Authentication failed during SCRAM-SHA-512 authentication")
    right = _Raw(node.port).scram("SCRAM-SHA-512", "alice", "alice-secret")
    assert right == (0, None)


def test_plain_wrong_password_is_refused_and_the_connection_closed(node: BrokerProcess) -> None:
    raw = _Raw(node.port)
    shake = raw.call(SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
    assert shake is not None and shake.error_code == 0
    answer = raw.call(SASL_AUTHENTICATE, 1, {"auth_bytes": b"\0bob\0nope"})
    assert answer is not None and answer.error_code == 58
    assert raw.call(SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}) is None  # closed


def test_unsupported_mechanism_lists_the_enabled_ones(node: BrokerProcess) -> None:
    shake = _Raw(node.port).call(SASL_HANDSHAKE, 1, {"mechanism": "GSSAPI"})
    assert shake is not None and shake.error_code == 33  # UNSUPPORTED_SASL_MECHANISM
    assert list(shake.mechanisms) == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


def test_saslhandshake_v0_is_refused(node: BrokerProcess) -> None:
    raw = _Raw(node.port)
    shake = raw.call(SASL_HANDSHAKE, 0, {"mechanism": "PLAIN"})
    assert shake is not None and shake.error_code == 34  # ILLEGAL_SASL_STATE
    assert raw.call(SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}) is None


# -- A SASL_PLAINTEXT listener -------------------------------------------------------------------


@pytest.fixture(scope="module")
def sasl_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    workdir = tmp_path_factory.mktemp("sasl-listener")
    process = BrokerProcess(workdir)
    process.extra_properties = {
        "listeners": f"SASL_PLAINTEXT://127.0.0.1:{process.port},"
                     f"CONTROLLER://127.0.0.1:{process.controller_port}",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "auto.create.topics.enable": "true"}
    process.start()
    admin_config = workdir / "admin.properties"
    admin_config.write_text(f"raft.secret={BROKER_SECRET}\n")
    try:
        _users(process, "add", "alice", "--password", "alice-secret", "--command-config",
               str(admin_config))
        _users(process, "add", "old", "--mechanism", "SCRAM-SHA-256", "--password", "old-pw",
               "--command-config", str(admin_config))
        yield process
    finally:
        process.stop()


def test_sasl_listener_serves_only_apiversions_and_sasl_before_login(
        sasl_node: BrokerProcess) -> None:
    raw = _Raw(sasl_node.port)
    versions = raw.call(API_VERSIONS, 3, {"client_software_name": "raw",
                                          "client_software_version": "1"})
    assert versions is not None and versions.error_code == 0
    advertised = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
    assert advertised[17] == (0, 1) and advertised[36] == (0, 2)
    assert raw.call(METADATA, 9, {"topics": None, "allow_auto_topic_creation": False,
                                  "include_topic_authorized_operations": False}) is None
    assert "Metadata not allowed before authentication on a SASL listener" in (
        sasl_node.log_path.read_text())
    # Frames before authentication are capped at 512 KiB.
    big = _Raw(sasl_node.port)
    big.sock.sendall(_SIZE.pack(600 * 1024) + b"\0" * 1024)
    assert big._exactly(4) is None
    # After logging in, the same connection is served.
    logged = _Raw(sasl_node.port)
    assert logged.scram("SCRAM-SHA-512", "alice", "alice-secret") == (0, None)
    metadata = logged.call(METADATA, 9, {"topics": None, "allow_auto_topic_creation": False,
                                         "include_topic_authorized_operations": False})
    assert metadata is not None and metadata.brokers


@pytest.mark.parametrize(("mechanism", "user", "password"), [
    ("SCRAM-SHA-512", "alice", "alice-secret"), ("PLAIN", "bob", "bob-secret")])
def test_confluent_on_the_sasl_listener(sasl_node: BrokerProcess, mechanism: str, user: str,
                                        password: str) -> None:
    _produce_one_confluent(sasl_node, _confluent_sasl(mechanism, user, password))


def test_anonymous_client_cannot_use_the_sasl_listener(sasl_node: BrokerProcess) -> None:
    from confluent_kafka import Producer

    outcomes: list[Any] = []
    producer = Producer({"bootstrap.servers": sasl_node.bootstrap, "message.timeout.ms": 3000})
    producer.produce(_topic(), value=b"x", on_delivery=lambda err, msg: outcomes.append(err))
    producer.flush(15)
    assert len(outcomes) == 1 and outcomes[0] is not None  # never delivered


def _kcat(node: BrokerProcess, mechanism: str, user: str, password: str
          ) -> subprocess.CompletedProcess[str]:
    auth = ["-X", "security.protocol=SASL_PLAINTEXT", "-X", f"sasl.mechanisms={mechanism}",
            "-X", f"sasl.username={user}", "-X", f"sasl.password={password}"]
    return subprocess.run(["kcat", "-b", node.bootstrap, *auth, "-P", "-t", _topic(),
                           "-m", "15"], input="hello\n", capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
@pytest.mark.parametrize(("mechanism", "user", "password"), [
    ("PLAIN", "bob", "bob-secret"), ("SCRAM-SHA-512", "alice", "alice-secret"),
    ("SCRAM-SHA-256", "old", "old-pw")])
def test_debian_kcat(sasl_node: BrokerProcess, mechanism: str, user: str,
                     password: str) -> None:
    """Debian's kcat links librdkafka 2.0.2, whose SCRAM client-final repeats its nonce
    (librdkafka#4895): raftlog accepts exactly that form (see raftlog.security.scram)."""
    result = _kcat(sasl_node, mechanism, user, password)
    assert result.returncode == 0, result.stderr
    wrong = _kcat(sasl_node, mechanism, user, "not-the-password")
    assert wrong.returncode != 0


def test_format_add_scram_users_exist_at_first_start(tmp_path: Path) -> None:
    """``raftlog format --add-scram`` (KIP-900): the first controller commits the users."""
    process = BrokerProcess(tmp_path)
    config = process.write_config()
    formatted = subprocess.run(
        [sys.executable, "-m", "raftlog", "format", "--config", str(config), "--add-scram",
         "SCRAM-SHA-512=[name=admin,password=admin-secret,iterations=8192]"],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path)
    assert formatted.returncode == 0, formatted.stderr
    process.start()
    try:
        def described() -> bool:
            listed = subprocess.run(
                [sys.executable, "-m", "raftlog", "users", "list", "admin",
                 "--bootstrap-server", process.bootstrap],
                capture_output=True, text=True, timeout=60, check=False)
            return "admin: SCRAM-SHA-512 (iterations 8192)" in listed.stdout

        wait_until(described, 15, "the bootstrap user")
        assert _Raw(process.port).scram("SCRAM-SHA-512", "admin", "admin-secret") == (0, None)
        # Deleted, it stays deleted across a restart (the file is only for a fresh log).
        _users(process, "delete", "admin")
        process.restart()
        _users(process, "add", "probe", "--password", "probe-pw")  # the controller is back
        time.sleep(2 * 1.0)  # the bootstrap task's retry interval, twice
        assert "admin" not in _users(process, "list").stdout
        assert _Raw(process.port).scram("SCRAM-SHA-512", "admin", "admin-secret")[0] == 58
        assert _Raw(process.port).scram("SCRAM-SHA-512", "probe", "probe-pw") == (0, None)
    finally:
        process.stop()
