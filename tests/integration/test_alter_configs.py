"""AlterConfigs (33) / IncrementalAlterConfigs (44) with real clients, and their live effect.

One single node (``log.retention.check.interval.ms=200``) serves the client and retention
tests; a 3-node cluster checks that a change sent to a node that is not the controller is
forwarded, committed and applied by the partition leader (min.insync.replicas).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from raftlog.cli import main as cli_main
from raftlog.client.connection import KafkaConnection
from raftlog.protocol.codec import Api, Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import ALTER_CONFIGS, DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS
from tests.integration.cluster_harness import Cluster, cluster3, wait_until
from tests.integration.conftest import BrokerProcess

__all__ = ["cluster3"]  # the fixture, imported for pytest

TIMEOUT_S = 20.0
DYNAMIC_TOPIC_CONFIG = 1
DYNAMIC_BROKER_CONFIG = 2
DYNAMIC_DEFAULT_BROKER_CONFIG = 3
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
OP_SET = 0
OP_DELETE = 1


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("alter-configs"),
                            extra_properties={"log.retention.check.interval.ms": "200"})
    process.start()
    try:
        yield process
    finally:
        process.stop()


_ADMINS: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def _forget_admins() -> Iterator[None]:
    yield
    _ADMINS.clear()  # no client outlives its test (or keeps dialling a stopped node)


def _admin(bootstrap: str) -> Any:
    """One AdminClient per bootstrap, kept alive: a collected client fails its futures."""
    from confluent_kafka.admin import AdminClient

    if bootstrap not in _ADMINS:
        _ADMINS[bootstrap] = AdminClient({"bootstrap.servers": bootstrap})
    return _ADMINS[bootstrap]


def _create(bootstrap: str, partitions: int = 1, replication: int = 1,
            configs: dict[str, str] | None = None) -> str:
    from confluent_kafka.admin import NewTopic

    topic = f"alter-{uuid.uuid4().hex[:8]}"
    futures = _admin(bootstrap).create_topics(
        [NewTopic(topic, partitions, replication, config=configs or {})], request_timeout=15)
    futures[topic].result(timeout=TIMEOUT_S)
    return topic


def _described(bootstrap: str, topic: str) -> dict[str, Any]:
    from confluent_kafka.admin import ConfigResource, ResourceType

    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = _admin(bootstrap).describe_configs([resource])[resource].result(timeout=TIMEOUT_S)
    return dict(entries)


def _value_source(bootstrap: str, topic: str, key: str) -> tuple[str, int]:
    entry = _described(bootstrap, topic)[key]
    return entry.value, int(entry.source)


def _incremental(bootstrap: str, topic: str, ops: Sequence[tuple[str, str, str | None]],
                 validate_only: bool = False) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    entries = [ConfigEntry(name, value, incremental_operation=AlterConfigOpType[op])
               for name, op, value in ops]
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
    futures = _admin(bootstrap).incremental_alter_configs([resource],
                                                          validate_only=validate_only)
    futures[resource].result(timeout=TIMEOUT_S)


def _overrides(bootstrap: str, topic: str) -> dict[str, str]:
    return {k: e.value for k, e in _described(bootstrap, topic).items()
            if int(e.source) == DYNAMIC_TOPIC_CONFIG}


def test_incremental_set_delete_append_show_in_describe(node: BrokerProcess) -> None:
    topic = _create(node.bootstrap, configs={"segment.bytes": "1048576"})
    _incremental(node.bootstrap, topic, [("retention.ms", "SET", "3600000"),
                                         ("cleanup.policy", "APPEND", "compact")])
    assert _value_source(node.bootstrap, topic, "retention.ms") == (
        "3600000", DYNAMIC_TOPIC_CONFIG)
    assert _value_source(node.bootstrap, topic, "cleanup.policy") == (
        "delete,compact", DYNAMIC_TOPIC_CONFIG)
    assert _overrides(node.bootstrap, topic)["segment.bytes"] == "1048576"  # kept
    _incremental(node.bootstrap, topic, [("retention.ms", "DELETE", None)])
    value, source = _value_source(node.bootstrap, topic, "retention.ms")
    assert (value, source) == ("604800000", DEFAULT_CONFIG)


def test_legacy_alter_configs_replaces_every_override(node: BrokerProcess) -> None:
    from confluent_kafka.admin import ConfigResource, ResourceType

    topic = _create(node.bootstrap, configs={"segment.bytes": "1048576",
                                             "retention.ms": "3600000"})
    resource = ConfigResource(ResourceType.TOPIC, topic, set_config={"retention.ms": "7200000"})
    _admin(node.bootstrap).alter_configs([resource])[resource].result(timeout=TIMEOUT_S)
    assert _overrides(node.bootstrap, topic) == {"retention.ms": "7200000"}


def test_bad_names_values_and_validate_only_change_nothing(node: BrokerProcess) -> None:
    from confluent_kafka import KafkaError, KafkaException

    topic = _create(node.bootstrap, configs={"retention.ms": "3600000"})
    for ops in ([("no.such.config", "SET", "1")], [("retention.ms", "SET", "-5")],
                [("min.insync.replicas", "SET", "0")], [("retention.ms", "APPEND", "1")],
                [("retention.ms", "SET", "5"), ("cleanup.policy", "SET", "shred")]):
        with pytest.raises(KafkaException) as raised:
            _incremental(node.bootstrap, topic, ops)
        assert raised.value.args[0].code() == KafkaError.INVALID_CONFIG, ops
    _incremental(node.bootstrap, topic, [("retention.ms", "SET", "1000")], validate_only=True)
    with pytest.raises(KafkaException) as raised:
        _incremental(node.bootstrap, f"{topic}-missing", [("retention.ms", "SET", "1000")])
    assert raised.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert _overrides(node.bootstrap, topic) == {"retention.ms": "3600000"}


def test_kafka_python_alter_configs(node: BrokerProcess) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType

    topic = _create(node.bootstrap)
    admin = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=15_000)
    try:
        for incremental in (True, False):
            value = "111000" if incremental else "222000"
            resource = ConfigResource(ConfigResourceType.TOPIC, topic,
                                      configs={"retention.ms": value})
            admin.alter_configs([resource], incremental=incremental)
            assert _value_source(node.bootstrap, topic, "retention.ms") == (
                value, DYNAMIC_TOPIC_CONFIG)
    finally:
        admin.close()


def _segment_files(node: BrokerProcess, topic: str) -> list[Path]:
    return sorted((node.data_dir / f"{topic}-0").glob("*.log"))


def _produce(bootstrap: str, topic: str, count: int, size: int = 200) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": 1})
    for i in range(count):
        producer.produce(topic, value=b"x" * size, key=str(i).encode())
        producer.poll(0)
        if i % 10 == 9:
            producer.flush(TIMEOUT_S)  # one small batch at a time: many segments
    assert producer.flush(TIMEOUT_S) == 0


def test_segment_bytes_and_retention_take_effect_live(node: BrokerProcess) -> None:
    """Created with the defaults (1 GiB segments, 7 days); altered to tiny segments and a
    short retention, the live partition rolls and then deletes its old segments."""
    topic = _create(node.bootstrap)
    _produce(node.bootstrap, topic, 20)
    assert len(_segment_files(node, topic)) == 1
    assert cli_main(["--log-level", "WARNING", "topics", "alter", "--bootstrap-server",
                     node.bootstrap, "--topic", topic,
                     "--add-config", "segment.bytes=2048,retention.ms=500"]) == 0
    assert _overrides(node.bootstrap, topic) == {"segment.bytes": "2048", "retention.ms": "500"}
    _produce(node.bootstrap, topic, 60)
    first = _segment_files(node, topic)[0].name
    wait_until(lambda: not _segment_files(node, topic)
               or _segment_files(node, topic)[0].name != first,
               TIMEOUT_S, "retention to delete the oldest segment", interval_s=0.2)
    assert cli_main(["--log-level", "WARNING", "topics", "alter", "--bootstrap-server",
                     node.bootstrap, "--topic", topic, "--delete-config",
                     "segment.bytes,retention.ms"]) == 0
    assert _overrides(node.bootstrap, topic) == {}


def test_dynamic_broker_config_changes_topic_defaults(node: BrokerProcess) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    topic = _create(node.bootstrap)
    admin = _admin(node.bootstrap)

    def alter(op: AlterConfigOpType, name: str, value: str | None) -> None:
        resource = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[
            ConfigEntry(name, value, incremental_operation=op)])
        admin.incremental_alter_configs([resource])[resource].result(timeout=TIMEOUT_S)

    with pytest.raises(KafkaException) as raised:  # static only: not dynamic here
        alter(AlterConfigOpType.SET, "num.io.threads", "3")
    assert raised.value.args[0].code() == KafkaError.INVALID_CONFIG
    alter(AlterConfigOpType.SET, "log.retention.ms", "4321000")
    try:
        broker = ConfigResource(ResourceType.BROKER, "1")
        entry = admin.describe_configs([broker])[broker].result(timeout=TIMEOUT_S)[
            "log.retention.ms"]
        assert (entry.value, int(entry.source)) == ("4321000", 2)  # DYNAMIC_BROKER_CONFIG
        assert _value_source(node.bootstrap, topic, "retention.ms") == ("4321000", 2)
    finally:
        alter(AlterConfigOpType.DELETE, "log.retention.ms", None)
    assert _value_source(node.bootstrap, topic, "retention.ms") == ("604800000", DEFAULT_CONFIG)


def _raw(bootstrap: str, api: Api, body: dict[str, Any], *, version: int,
         client_id: str = "raftlog-test") -> Struct:
    """One request over raftlog's own wire client: its client.id and target are exact (the
    Kafka clients route a BROKER resource to that broker and refuse an empty name)."""
    host, port = bootstrap.rsplit(":", 1)

    async def send() -> Struct:
        connection = await KafkaConnection.connect(host, int(port), client_id=client_id,
                                                   timeout_s=TIMEOUT_S)
        try:
            return await connection.request(api, body, version=version, timeout_s=TIMEOUT_S)
        finally:
            await connection.aclose()

    result: Struct = trio.run(send)
    return result


def _alter_cluster_default(bootstrap: str, name: str, value: str | None) -> None:
    op = OP_SET if value is not None else OP_DELETE
    response = _raw(bootstrap, INCREMENTAL_ALTER_CONFIGS, {"resources": [
        {"resource_type": RESOURCE_BROKER, "resource_name": "", "configs": [
            {"name": name, "config_operation": op, "value": value}]}],
        "validate_only": False}, version=1)
    assert [(r.error_code, r.error_message) for r in response.responses] == [(0, None)]


def _describe_broker(bootstrap: str, name: str) -> Struct:
    response = _raw(bootstrap, DESCRIBE_CONFIGS, {"resources": [
        {"resource_type": RESOURCE_BROKER, "resource_name": name, "configuration_keys": None}],
        "include_synonyms": False}, version=2)
    result: Struct = response.results[0]
    return result


def test_describe_broker_configs_follows_kafkas_resource_names(node: BrokerProcess) -> None:
    """Kafka's ConfigHelper: this broker's id gives static + dynamic configs; "" gives only
    the cluster-wide dynamic defaults; another id or a non-number is INVALID_REQUEST."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    _alter_cluster_default(node.bootstrap, "log.retention.ms", "5432000")
    try:
        broker = ConfigResource(ResourceType.BROKER, "1")
        described = _admin(node.bootstrap).describe_configs([broker])[broker].result(
            timeout=TIMEOUT_S)
        assert (described["log.retention.ms"].value, int(described["log.retention.ms"].source)
                ) == ("5432000", DYNAMIC_DEFAULT_BROKER_CONFIG)
        assert (described["node.id"].value, int(described["node.id"].source)) == (
            "1", STATIC_BROKER_CONFIG)

        cluster = _describe_broker(node.bootstrap, "")
        assert cluster.error_code == 0
        assert [(c.name, c.value, c.config_source) for c in cluster.configs] == [
            ("log.retention.ms", "5432000", DYNAMIC_DEFAULT_BROKER_CONFIG)]
    finally:
        _alter_cluster_default(node.bootstrap, "log.retention.ms", None)
    assert list(_describe_broker(node.bootstrap, "").configs) == []

    other = _describe_broker(node.bootstrap, "2")
    assert (other.error_code, other.error_message, list(other.configs)) == (
        ErrorCode.INVALID_REQUEST,
        "Unexpected broker id, expected 1 or empty string, but received 2", [])
    named = _describe_broker(node.bootstrap, "one")
    assert (named.error_code, named.error_message) == (
        ErrorCode.INVALID_REQUEST, "Broker id must be an integer, but it is: one")


def test_dynamic_cleanup_policy_default_applies_to_produce(node: BrokerProcess) -> None:
    """A dynamic log.cleanup.policy=compact (broker 1) makes a topic without an override compacted:
    produce then refuses records without a key (INVALID_RECORD), as Kafka's LogValidator."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    topic = _create(node.bootstrap)
    admin = _admin(node.bootstrap)

    def alter(op: AlterConfigOpType, value: str | None) -> None:
        resource = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[
            ConfigEntry("log.cleanup.policy", value, incremental_operation=op)])
        admin.incremental_alter_configs([resource])[resource].result(timeout=TIMEOUT_S)

    assert _produce_all_acks(node.bootstrap, topic) is None
    alter(AlterConfigOpType.SET, "compact")
    try:
        def refused() -> bool:
            return type(_produce_all_acks(node.bootstrap, topic)).__name__ == \
                "InvalidRecordError"
        wait_until(refused, TIMEOUT_S, "keyless produce refused under a compact default")
    finally:
        alter(AlterConfigOpType.DELETE, None)
    wait_until(lambda: _produce_all_acks(node.bootstrap, topic) is None, TIMEOUT_S,
               "keyless produce accepted again")


# -- 3 nodes: forwarded to the controller, applied by the leader -------------------------------


def _produce_all_acks(bootstrap: str, topic: str) -> Exception | None:
    """One acks=all record without retries; the error kafka-python raised, or None."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", retries=0,
                             request_timeout_ms=10_000)
    try:
        producer.send(topic, b"v").get(timeout=TIMEOUT_S)
    except Exception as exc:  # the test inspects it
        return exc
    finally:
        producer.close(timeout=5)
    return None


def test_min_insync_replicas_via_a_non_controller_node(cluster3: Cluster) -> None:
    from kafka.errors import NotEnoughReplicasError

    controller = cluster3.quorum_leader()
    assert controller is not None
    other = next(n for n in cluster3.nodes.values() if n.node_id != controller)
    topic = _create(cluster3.bootstrap, replication=2)  # ISR of 2
    wait_until(lambda: _produce_all_acks(cluster3.bootstrap, topic) is None, TIMEOUT_S,
               "the new topic to take acks=all produce", interval_s=0.2)  # leader elected
    _incremental(other.bootstrap, topic, [("min.insync.replicas", "SET", "3")])
    wait_until(lambda: _value_source(other.bootstrap, topic, "min.insync.replicas")[0] == "3",
               TIMEOUT_S, "node to see min.insync.replicas=3", interval_s=0.2)
    error = None
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:  # until the leader has applied the image
        error = _produce_all_acks(cluster3.bootstrap, topic)
        if isinstance(error, NotEnoughReplicasError):
            break
        time.sleep(0.2)
    assert isinstance(error, NotEnoughReplicasError), error
    _incremental(other.bootstrap, topic, [("min.insync.replicas", "DELETE", None)])
    wait_until(lambda: _produce_all_acks(cluster3.bootstrap, topic) is None, TIMEOUT_S,
               "acks=all produce to succeed again", interval_s=0.2)
    cluster3.check_logs()


def test_a_broker_like_client_id_is_forwarded_like_any_other(cluster3: Cluster) -> None:
    """Only an Envelope counts as forwarded (KIP-590): a client whose client.id looks like a
    raftlog broker's still has its AlterConfigs forwarded by a node that is not the controller
    (it used to be answered NOT_CONTROLLER)."""
    controller = cluster3.quorum_leader()
    assert controller is not None
    other = next(n for n in cluster3.nodes.values() if n.node_id != controller)
    topic = _create(cluster3.bootstrap)
    incremental = _raw(other.bootstrap, INCREMENTAL_ALTER_CONFIGS, {"resources": [
        {"resource_type": RESOURCE_TOPIC, "resource_name": topic, "configs": [
            {"name": "retention.ms", "config_operation": OP_SET, "value": "4321000"}]}],
        "validate_only": False}, version=1, client_id="raftlog-broker-1")
    assert [(r.error_code, r.error_message) for r in incremental.responses] == [(0, None)]
    wait_until(lambda: _overrides(other.bootstrap, topic) == {"retention.ms": "4321000"},
               TIMEOUT_S, "the forwarded IncrementalAlterConfigs to show", interval_s=0.2)
    legacy = _raw(other.bootstrap, ALTER_CONFIGS, {"resources": [
        {"resource_type": RESOURCE_TOPIC, "resource_name": topic, "configs": [
            {"name": "segment.bytes", "value": "1048576"}]}],
        "validate_only": False}, version=1, client_id="raftlog-broker-1")
    assert [(r.error_code, r.error_message) for r in legacy.responses] == [(0, None)]
    wait_until(lambda: _overrides(other.bootstrap, topic) == {"segment.bytes": "1048576"},
               TIMEOUT_S, "the forwarded AlterConfigs to show", interval_s=0.2)
    cluster3.check_logs()
