"""ACLs (Kafka's StandardAuthorizer) against a real node process with a SASL_PLAINTEXT listener:
for each resource type a denied principal gets Kafka's error and an allowed one succeeds, DENY
overrides ALLOW, prefixed ACLs match, super users pass, Metadata hides denied topics; ACLs
made with confluent-kafka's AdminClient and with ``raftlog acls``; kafka-python as a second
client.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import BROKER_SECRET, BrokerProcess, free_port
from tests.integration.metrics_http import metrics_property, sample_value, scrape

PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
USERS = {"admin": "admin-pw", "alice": "alice-pw", "bob": "bob-pw", "dave": "dave-pw"}
JAAS = PLAIN_MODULE + " required " + " ".join(
    f'user_{name}="{password}"' for name, password in USERS.items()) + ";"
STANDARD = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    workdir = tmp_path_factory.mktemp("acls")
    process = BrokerProcess(workdir)
    process.metrics_port = free_port()  # type: ignore[attr-defined]
    process.extra_properties = {
        **metrics_property("127.0.0.1", process.metrics_port),  # type: ignore[attr-defined]
        "listeners": f"SASL_PLAINTEXT://127.0.0.1:{process.port},"
                     f"CONTROLLER://127.0.0.1:{process.controller_port}",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "sasl.jaas.config": JAAS,
        "authorizer.class.name": STANDARD,
        "super.users": "User:admin",
        "auto.create.topics.enable": "true"}
    process.start()
    (workdir / "admin.properties").write_text(f"raft.secret={BROKER_SECRET}\n")
    try:
        yield process
    finally:
        process.stop()


def _auth(user: str) -> dict[str, Any]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
            "sasl.username": user, "sasl.password": USERS[user]}


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def acls(node: BrokerProcess, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    config = Path(node.workdir) / "admin.properties"
    result = subprocess.run(
        [sys.executable, "-m", "raftlog", "acls", *args, "--bootstrap-server", node.bootstrap,
         "--command-config", str(config)], capture_output=True, text=True, timeout=60,
        check=False)
    assert (result.returncode == 0) == ok, result.stdout + result.stderr
    return result


def _admin(node: BrokerProcess, user: str = "admin") -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": node.bootstrap, **_auth(user)})


def _create_topic(node: BrokerProcess, topic: str) -> None:
    from confluent_kafka.admin import NewTopic

    admin = _admin(node)  # kept alive until the future is done
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)


def _produce(node: BrokerProcess, user: str, topic: str, **extra: Any) -> str | None:
    """None when the record was written, else the error's name."""
    from confluent_kafka import Producer

    errors: list[str] = []
    producer = Producer({"bootstrap.servers": node.bootstrap, "message.timeout.ms": 10000,
                         **_auth(user), **extra})
    producer.produce(topic, b"v", on_delivery=lambda err, _: errors.append(
        "" if err is None else err.name()))
    producer.flush(30)
    assert errors, "no delivery report"
    return errors[0] or None


def _consume(node: BrokerProcess, user: str, topic: str, group: str) -> str | None:
    """None once a record arrives, else the first error's name."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", **_auth(user)})
    consumer.subscribe([topic])
    try:
        for _ in range(120):
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                return str(message.error().name())
            return None
    finally:
        consumer.close()
    raise AssertionError("neither a record nor an error in 60 s")


def test_topic_prefixed_allow_and_deny_overrides(node: BrokerProcess) -> None:
    prefix = _name("alice")
    topic, other = f"{prefix}-t", _name("other")
    _create_topic(node, topic)
    _create_topic(node, other)
    assert _produce(node, "alice", topic) == "TOPIC_AUTHORIZATION_FAILED"
    acls(node, "add", "--allow-principal", "User:alice", "--operation", "Write",
         "--topic", prefix, "--resource-pattern-type", "prefixed")
    assert _produce(node, "alice", topic) is None
    assert _produce(node, "alice", other) == "TOPIC_AUTHORIZATION_FAILED"
    # DENY wins over ALLOW (here a wildcard principal's ALLOW on the literal name).
    acls(node, "add", "--allow-principal", "User:*", "--operation", "Write", "--topic", other)
    assert _produce(node, "bob", other) is None
    acls(node, "add", "--deny-principal", "User:bob", "--operation", "All", "--topic", other)
    assert _produce(node, "bob", other) == "TOPIC_AUTHORIZATION_FAILED"
    assert _produce(node, "alice", other) is None
    listed = acls(node, "list", "--topic", prefix, "--resource-pattern-type", "prefixed").stdout
    assert "principal=User:alice, host=*, operation=WRITE, permissionType=ALLOW" in listed
    removed = acls(node, "remove", "--topic", other).stdout
    assert removed.count("Removed") == 2
    assert _produce(node, "bob", other) == "TOPIC_AUTHORIZATION_FAILED"


def test_group_read_needed_to_consume(node: BrokerProcess) -> None:
    topic, group = _name("gt"), _name("group")
    _create_topic(node, topic)
    assert _produce(node, "admin", topic) is None  # a super user
    acls(node, "add", "--allow-principal", "User:alice", "--operation", "Read", "--topic", topic)
    assert _consume(node, "alice", topic, group) == "GROUP_AUTHORIZATION_FAILED"
    acls(node, "add", "--allow-principal", "User:alice", "--operation", "Read", "--group", group)
    assert _consume(node, "alice", topic, group) is None
    assert _consume(node, "bob", topic, _name("bob-group")) in (
        "GROUP_AUTHORIZATION_FAILED", "TOPIC_AUTHORIZATION_FAILED")


def test_transactional_id_write_needed(node: BrokerProcess) -> None:
    from confluent_kafka import KafkaException, Producer

    topic, txn_id = _name("tt"), _name("txn")
    _create_topic(node, topic)
    acls(node, "add", "--allow-principal", "User:bob", "--operation", "Write", "--topic", topic)

    def init() -> str | None:
        producer = Producer({"bootstrap.servers": node.bootstrap, "transactional.id": txn_id,
                             **_auth("bob")})
        try:
            producer.init_transactions(20)
        except KafkaException as exc:
            return str(exc.args[0].name())
        producer.begin_transaction()
        producer.produce(topic, b"in-txn")
        producer.commit_transaction(20)
        return None

    assert init() == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
    acls(node, "add", "--allow-principal", "User:bob", "--operation", "Write",
         "--transactional-id", txn_id)
    assert init() is None


def test_cluster_operations_and_admin_client_acls(node: BrokerProcess) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        NewTopic,
        ResourcePatternType,
        ResourceType,
    )

    alice = _admin(node, "alice")
    _describe_acls_denied(node)
    topic = _name("ct")
    with pytest.raises(KafkaException) as refused:
        alice.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    assert refused.value.args[0].name() == "TOPIC_AUTHORIZATION_FAILED"
    # The super user grants Create and Describe on the cluster with the AdminClient.
    admin = _admin(node)
    bindings = [AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL,
                           "User:alice", "*", op, AclPermissionType.ALLOW)
                for op in (AclOperation.CREATE, AclOperation.DESCRIBE)]
    for future in admin.create_acls(bindings).values():
        future.result(30)
    alice.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    described = alice.describe_acls(AclBindingFilter(
        ResourceType.BROKER, None, ResourcePatternType.ANY, "User:alice", None,
        AclOperation.ANY, AclPermissionType.ANY)).result(30)
    assert {b.operation for b in described} == {AclOperation.CREATE, AclOperation.DESCRIBE}
    deleted = admin.delete_acls([AclBindingFilter(
        ResourceType.BROKER, "kafka-cluster", ResourcePatternType.MATCH, "User:alice", None,
        AclOperation.ANY, AclPermissionType.ANY)])
    assert len(next(iter(deleted.values())).result(30)) == 2
    _describe_acls_denied(node)


def _describe_acls_denied(node: BrokerProcess) -> None:
    """kafka-python's admin raises the error (confluent-kafka's describe_acls answers an
    empty list for a DescribeAcls refused as a whole)."""
    from kafka.admin import (
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePatternFilter,
        ResourceType,
    )
    from kafka.errors import ClusterAuthorizationFailedError

    admin = KafkaAdminClient(bootstrap_servers=node.bootstrap, **_kafka_python_auth("alice"))
    try:
        with pytest.raises(ClusterAuthorizationFailedError):
            admin.describe_acls(ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                                          ResourcePatternFilter(ResourceType.ANY, None,
                                                                ACLResourcePatternType.ANY)))
    finally:
        admin.close()


def _kafka_python_auth(user: str) -> dict[str, Any]:
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
            "sasl_plain_username": user, "sasl_plain_password": USERS[user]}


def test_metadata_hides_denied_topics(node: BrokerProcess) -> None:
    from kafka import KafkaConsumer

    seen, hidden = _name("seen"), _name("hidden")
    _create_topic(node, seen)
    _create_topic(node, hidden)
    acls(node, "add", "--allow-principal", "User:alice", "--operation", "Describe",
         "--topic", seen)
    consumer = KafkaConsumer(bootstrap_servers=node.bootstrap, **_kafka_python_auth("alice"))
    try:
        topics = consumer.topics()
        assert seen in topics and hidden not in topics
    finally:
        consumer.close()
    admin_topics = _admin(node).list_topics(timeout=30).topics
    assert seen in admin_topics and hidden in admin_topics
    asked = _admin(node, "alice").list_topics(topic=hidden, timeout=30).topics[hidden]
    assert asked.error is not None and asked.error.name() == "TOPIC_AUTHORIZATION_FAILED"
    assert hidden not in _admin(node, "alice").list_topics(timeout=30).topics


def test_kafka_python_denied_produce(node: BrokerProcess) -> None:
    from kafka import KafkaProducer
    from kafka.errors import KafkaError, TopicAuthorizationFailedError

    topic = _name("kp")
    _create_topic(node, topic)
    acls(node, "add", "--allow-principal", "User:dave", "--operation", "Describe",
         "--topic", topic)

    def producer(**extra: Any) -> KafkaProducer:
        return KafkaProducer(bootstrap_servers=node.bootstrap, max_block_ms=20000,
                             **_kafka_python_auth("dave"), **extra)

    # Idempotent by default, kafka-python asks InitProducerId first: without Write on any
    # topic nor IdempotentWrite on the cluster that is refused, as Kafka refuses it.
    idempotent = producer()
    try:
        with pytest.raises(KafkaError, match="ClusterAuthorizationFailed"):
            idempotent.send(topic, b"x").get(timeout=30)
    finally:
        idempotent.close()
    denied = producer(enable_idempotence=False)  # a refused topic is fatal for the producer
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            denied.send(topic, b"x").get(timeout=30)
    finally:
        denied.close()
    acls(node, "add", "--allow-principal", "User:dave", "--operation", "Write",
         "--topic", topic)
    allowed = producer()
    try:
        assert allowed.send(topic, b"y").get(timeout=30).offset >= 0
    finally:
        allowed.close()
    assert "refused Produce from 127.0.0.1:" in node.log_path.read_text()


def _counter(node: BrokerProcess, name: str, **labels: str) -> float:
    families = scrape("127.0.0.1", node.metrics_port)  # type: ignore[attr-defined]
    return sample_value(families, name, **labels) or 0.0


def test_authentication_and_authorization_outcomes_are_counted(node: BrokerProcess) -> None:
    """The security families: a wrong password counts as a failed authentication on its
    listener, a login as a successful one, and an ACL refusal under its request."""
    from confluent_kafka import Producer

    listener = {"listener": "SASL_PLAINTEXT"}
    failed = _counter(node, "kafka_server_socketservermetrics_failed_authentication_total",
                      **listener)
    ok = _counter(node, "kafka_server_socketservermetrics_successful_authentication_total",
                  **listener)
    denied = _denied(node)
    errors: list[str] = []
    producer = Producer({"bootstrap.servers": node.bootstrap, **_auth("alice"),
                         "sasl.password": "not-alices-password",
                         "error_cb": lambda err: errors.append(err.name())})
    producer.poll(5)
    assert errors, "a wrong password raised no error"
    topic = _name("denied")
    _create_topic(node, topic)
    assert _produce(node, "dave", topic) == "TOPIC_AUTHORIZATION_FAILED"
    assert _counter(node, "kafka_server_socketservermetrics_failed_authentication_total",
                    **listener) > failed
    assert _counter(node, "kafka_server_socketservermetrics_successful_authentication_total",
                    **listener) > ok
    # librdkafka learns of the refusal from Metadata (the topic it asked for), before any
    # Produce: the refusal is counted under the request that was refused.
    assert _denied(node)["Metadata"] > denied.get("Metadata", 0), _denied(node)


def _denied(node: BrokerProcess) -> dict[str, float]:
    family = scrape("127.0.0.1", node.metrics_port).get(  # type: ignore[attr-defined]
        "kafka_server_authorizermetrics_authorization_denied")
    return {} if family is None else {s.labels["request"]: s.value for s in family.samples}


def _tool_as(node: BrokerProcess, user: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A ``raftlog`` tool logged in as ``user`` with a PLAIN ``--command-config``."""
    config = Path(node.workdir) / f"{user}.properties"
    config.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                      f"sasl.username={user}\nsasl.password={USERS[user]}\n")
    return subprocess.run(
        [sys.executable, "-m", "raftlog", *args, "--bootstrap-server", node.bootstrap,
         "--command-config", str(config)], capture_output=True, text=True, timeout=60,
        check=False)


def test_client_quotas_need_cluster_alter_and_describe_configs(node: BrokerProcess) -> None:
    """Without an ACL a user can neither lift its own quota nor read anyone's; a super user
    can; an ALLOW AlterConfigs on the cluster lets alice alter them."""
    client = _name("quota-client")
    alter = ("quotas", "alter", "--client-id", client, "--add-config", "producer_byte_rate=1024")
    refused = _tool_as(node, "alice", *alter)
    assert refused.returncode != 0 and "CLUSTER_AUTHORIZATION_FAILED" in (
        refused.stdout + refused.stderr), refused.stdout + refused.stderr
    described = _tool_as(node, "alice", "quotas", "describe", "--client-id", client)
    assert "CLUSTER_AUTHORIZATION_FAILED" in described.stdout + described.stderr
    assert _tool_as(node, "admin", *alter).returncode == 0
    shown = _tool_as(node, "admin", "quotas", "describe", "--client-id", client)
    assert "producer_byte_rate=1024" in shown.stdout, shown.stdout + shown.stderr
    acls(node, "add", "--allow-principal", "User:alice", "--operation", "AlterConfigs",
         "--cluster")
    lifted = _tool_as(node, "alice", "quotas", "alter", "--client-id", client,
                      "--delete-config", "producer_byte_rate")
    assert lifted.returncode == 0, lifted.stdout + lifted.stderr
    acls(node, "remove", "--cluster", "--allow-principal", "User:alice", "--operation",
         "AlterConfigs")
