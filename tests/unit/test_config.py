"""server.properties parsing and ServerConfig validation.

Goal: Java .properties syntax is read as Java reads it, Kafka's property names and defaults
(and precedence rules) apply, unknown properties warn and are ignored, and every invalid value
raises ConfigError naming the property.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from raftlog.config import (
    BROKER_DYNAMIC_CONFIG_KEYS,
    TOPIC_CONFIG_KEYS,
    ConfigError,
    Listener,
    QuorumVoter,
    ServerConfig,
    load_properties,
    parse_properties,
    validate_broker_dynamic_config,
    validate_topic_config,
)


def config(**props: str) -> ServerConfig:
    """Build a config from keyword properties (``log_dirs`` -> ``log.dirs``) plus node.id 1."""
    merged = {"node.id": "1", **{key.replace("_", "."): value for key, value in props.items()}}
    return ServerConfig.from_properties(merged)


# --- .properties syntax ---------------------------------------------------------------------


def test_properties_syntax() -> None:
    text = "\n".join(
        [
            "# a comment",
            "! another comment",
            "   ",
            "a=1",
            "b = two words  ",
            "c: colon",
            "d   space separated",
            "e=first \\",
            "   second",
            "f=tab\\tand\\u0041 and \\=",
            "g",
            "h=ends in backslash\\\\",
            "i=x",
            "i=last wins",
            "  # indented comment",
            "j\\:k=escaped separator in key",
            "l=continued to eof\\",
        ]
    )
    assert parse_properties(text) == {
        "a": "1",
        "b": "two words",
        "c": "colon",
        "d": "space separated",
        "e": "first second",
        "f": "tab\tandA and =",
        "g": "",
        "h": "ends in backslash\\",
        "i": "last wins",
        "j:k": "escaped separator in key",
        "l": "continued to eof",
    }


def test_a_comment_marker_after_a_continuation_is_part_of_the_value() -> None:
    assert parse_properties("a=1,\\\n  # not a comment\r\nb=2") == {
        "a": "1,# not a comment",
        "b": "2",
    }


def test_malformed_unicode_escape_raises() -> None:
    with pytest.raises(ConfigError, match="uxxxx"):
        parse_properties("a=\\u12")


def test_load_properties_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text("node.id=3\nlog.dirs=/data/a, /data/b\n", encoding="utf-8")
    assert load_properties(path) == {"node.id": "3", "log.dirs": "/data/a, /data/b"}
    loaded = ServerConfig.load(path, {"num.partitions": "4"})
    assert loaded.node_id == 3 and loaded.num_partitions == 4
    assert loaded.log_dirs == (Path("/data/a"), Path("/data/b"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_properties(tmp_path / "missing.properties")


# --- Defaults and precedence ----------------------------------------------------------------


def test_defaults_are_kafkas_for_a_laptop() -> None:
    cfg = config()
    assert cfg.process_roles == ("broker", "controller")
    assert cfg.listeners == (
        Listener("PLAINTEXT", "127.0.0.1", 9092),
        Listener("CONTROLLER", "127.0.0.1", 9093),
    )
    assert cfg.advertised_listeners == (Listener("PLAINTEXT", "127.0.0.1", 9092),)
    assert cfg.controller_quorum_voters == (QuorumVoter(1, "127.0.0.1", 9093),)
    assert cfg.inter_broker_listener_name == "PLAINTEXT"
    assert (cfg.num_partitions, cfg.default_replication_factor) == (1, 1)
    assert cfg.auto_create_topics_enable is True
    assert cfg.log_retention_ms == 168 * 3_600_000
    assert cfg.log_retention_bytes == -1
    assert cfg.log_segment_bytes == 1024**3
    assert cfg.log_roll_ms == 168 * 3_600_000
    assert cfg.message_max_bytes == 1048588
    assert cfg.socket_request_max_bytes == 104857600
    assert cfg.connections_max_idle_ms == 600000
    assert cfg.log_index_interval_bytes == 4096
    assert cfg.metadata_log_dir == cfg.log_dirs[0] == Path("/tmp/raftlog-logs")
    assert cfg.raft_secret is None and cfg.cluster_id is None
    assert cfg.is_controller


def test_retention_precedence_ms_then_minutes_then_hours() -> None:
    assert config(log_retention_hours="1").log_retention_ms == 3_600_000
    assert config(log_retention_hours="1", log_retention_minutes="2").log_retention_ms == 120_000
    both = config(log_retention_hours="1", log_retention_minutes="2", log_retention_ms="5")
    assert both.log_retention_ms == 5
    assert config(log_retention_ms="-1").log_retention_ms == -1
    assert config(log_retention_hours="-1").log_retention_ms == -1


def test_roll_ms_wins_over_roll_hours() -> None:
    assert config(log_roll_hours="2").log_roll_ms == 7_200_000
    assert config(log_roll_hours="2", log_roll_ms="10").log_roll_ms == 10


def test_log_dirs_wins_over_log_dir_and_metadata_dir_defaults_to_the_first() -> None:
    cfg = ServerConfig.from_properties({"node.id": "1", "log.dir": "/a", "log.dirs": "/b,/c"})
    assert cfg.log_dirs == (Path("/b"), Path("/c")) and cfg.metadata_log_dir == Path("/b")
    cfg = ServerConfig.from_properties({"node.id": "1", "log.dir": "/a", "metadata.log.dir": "/m"})
    assert cfg.log_dirs == (Path("/a"),) and cfg.metadata_log_dir == Path("/m")


def test_overrides_win_over_the_file() -> None:
    cfg = ServerConfig.from_properties(
        {"node.id": "1", "num.partitions": "3"}, {"num.partitions": "7"}
    )
    assert cfg.num_partitions == 7


def test_topic_defaults_use_topic_level_names() -> None:
    cfg = config(log_retention_ms="1000", log_cleanup_policy="compact, delete")
    defaults = cfg.topic_defaults()
    assert set(defaults) <= TOPIC_CONFIG_KEYS
    assert defaults["retention.ms"] == "1000"
    assert defaults["cleanup.policy"] == "compact,delete"
    assert defaults["max.message.bytes"] == "1048588"
    assert defaults["segment.ms"] == str(168 * 3_600_000)
    assert defaults["compression.type"] == "producer"
    assert defaults["message.timestamp.type"] == "CreateTime"
    assert defaults["min.insync.replicas"] == "1"
    for key in ("retention.bytes", "segment.bytes", "flush.messages", "flush.ms"):
        assert key in defaults
    dynamic = {"log.retention.ms": "5", "log.segment.bytes": "oops", "node.id": "2"}
    assert cfg.topic_defaults(dynamic)["retention.ms"] == "5"
    assert cfg.topic_defaults(dynamic)["segment.bytes"] == str(1024**3)


# --- Listeners and voters -------------------------------------------------------------------


def test_listener_helpers() -> None:
    cfg = config(
        listeners="plaintext://0.0.0.0:19092,CONTROLLER://[::1]:19093",
        advertised_listeners="PLAINTEXT://broker.example:29092",
        controller_quorum_voters="1@[::1]:19093",
    )
    assert cfg.listener("PLAINTEXT") == ("0.0.0.0", 19092)
    assert cfg.listener("controller") == ("::1", 19093)
    assert cfg.advertised_listener() == ("broker.example", 29092)
    assert cfg.controller_quorum_voters == (QuorumVoter(1, "::1", 19093),)
    with pytest.raises(ConfigError, match="no listener named"):
        cfg.listener("EXTERNAL")


def test_wildcard_listener_advertises_the_host_name() -> None:
    cfg = config(listeners="PLAINTEXT://:9092,CONTROLLER://127.0.0.1:9093")
    assert cfg.listener("PLAINTEXT") == ("0.0.0.0", 9092)
    assert cfg.advertised_listener() == (socket.gethostname(), 9092)


def test_broker_only_node_needs_voters() -> None:
    with pytest.raises(ConfigError, match=r"controller\.quorum\.voters"):
        config(process_roles="broker")
    cfg = config(process_roles="broker", controller_quorum_voters="2@c1:9093,3@c2:9093")
    assert [v.node_id for v in cfg.controller_quorum_voters] == [2, 3]
    assert cfg.listeners == (Listener("PLAINTEXT", "127.0.0.1", 9092),)
    assert not cfg.is_controller


def test_ephemeral_ports_are_allowed_for_tests() -> None:
    cfg = config(listeners="PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:0")
    assert cfg.listener("PLAINTEXT") == ("127.0.0.1", 0)


# --- Secrets and cluster id -----------------------------------------------------------------


def test_raft_secret_inline_or_from_file(tmp_path: Path) -> None:
    assert config(raft_secret="s3cret").raft_secret == "s3cret"
    assert "s3cret" not in repr(config(raft_secret="s3cret"))
    secret_file = tmp_path / "secret"
    secret_file.write_text("from-file\n", encoding="utf-8")
    assert config(raft_secret_file=str(secret_file)).raft_secret == "from-file"
    with pytest.raises(ConfigError, match=r"raft\.secret"):
        config(raft_secret="a", raft_secret_file=str(secret_file))
    with pytest.raises(ConfigError, match=r"raft\.secret\.file"):
        config(raft_secret_file=str(tmp_path / "missing"))
    (tmp_path / "empty").write_text("\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="empty"):
        config(raft_secret_file=str(tmp_path / "empty"))


def test_cluster_id() -> None:
    assert config(cluster_id="MkU3OEVBNTcwNTJENDM2Qk").cluster_id == "MkU3OEVBNTcwNTJENDM2Qk"


# --- Unknown and invalid properties ---------------------------------------------------------


def test_unknown_properties_warn_and_are_ignored(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="raftlog.config"):
        cfg = config(zookeeper_connect="localhost:2181", num_network_threads="3")
    assert cfg.node_id == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["unknown property zookeeper.connect ignored"]
    assert any("num.network.threads" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("props", "property_name"),
    [
        ({"node.id": ""}, "node.id"),
        ({"node.id": "-1"}, "node.id"),
        ({"node.id": "one"}, "node.id"),
        ({"process.roles": "broker,zookeeper"}, "process.roles"),
        ({"process.roles": "broker,broker"}, "process.roles"),
        ({"num.partitions": "0"}, "num.partitions"),
        ({"default.replication.factor": "0"}, "default.replication.factor"),
        ({"auto.create.topics.enable": "yes"}, "auto.create.topics.enable"),
        ({"log.retention.ms": "-2"}, "log.retention.ms"),
        ({"log.retention.hours": "a week"}, "log.retention.hours"),
        ({"log.segment.bytes": "10"}, "log.segment.bytes"),
        ({"log.segment.bytes": str(2**31)}, "log.segment.bytes"),
        ({"log.roll.ms": "0"}, "log.roll.ms"),
        ({"log.flush.interval.messages": "0"}, "log.flush.interval.messages"),
        ({"message.max.bytes": "-1"}, "message.max.bytes"),
        ({"socket.request.max.bytes": "0"}, "socket.request.max.bytes"),
        ({"log.cleanup.policy": "shred"}, "log.cleanup.policy"),
        ({"compression.type": "brotli"}, "compression.type"),
        ({"log.message.timestamp.type": "createtime"}, "log.message.timestamp.type"),
        ({"listeners": "PLAINTEXT:9092"}, "listeners"),
        ({"listeners": "PLAINTEXT://h:99999"}, "listeners"),
        ({"listeners": "PLAINTEXT://h:1,PLAINTEXT://h:2"}, "listeners"),
        ({"listeners": "A://h:1,B://h:1"}, "listeners"),
        ({"listeners": "PLAINTEXT://h:1"}, "controller.listener.names"),
        ({"listeners": "SASL_SSL://h:1,CONTROLLER://h:2"}, "ssl.keystore.location"),
        ({"listeners": "SSL://h:1,CONTROLLER://h:2"}, "ssl.keystore.location"),
        ({"advertised.listeners": "PLAINTEXT://0.0.0.0:9092"}, "advertised.listeners"),
        ({"advertised.listeners": "CONTROLLER://h:9093"}, "advertised.listeners"),
        ({"advertised.listeners": "OTHER://h:9093"}, "advertised.listeners"),
        ({"inter.broker.listener.name": "CONTROLLER"}, "inter.broker.listener.name"),
        ({"controller.quorum.voters": "2@h:9093"}, "controller.quorum.voters"),
        ({"controller.quorum.voters": "1@h"}, "controller.quorum.voters"),
        ({"controller.quorum.voters": "1@h:1,1@g:2"}, "controller.quorum.voters"),
        ({"log.dirs": " , "}, "log.dirs"),
        ({"cluster.id": "not/valid"}, "cluster.id"),
    ],
)
def test_invalid_values_name_the_property(props: dict[str, str], property_name: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ServerConfig.from_properties({"node.id": "1", **props})
    assert caught.value.property_name == property_name
    assert str(caught.value).startswith(property_name)


# --- Topic-level config validation ----------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "valid"),
    [
        ("retention.ms", "-1", True),
        ("retention.ms", "-2", False),
        ("retention.bytes", "-1", True),
        ("cleanup.policy", "compact,delete", True),
        ("cleanup.policy", "", False),
        ("compression.type", "zstd", True),
        ("compression.type", "brotli", False),
        ("min.cleanable.dirty.ratio", "0.5", True),
        ("min.cleanable.dirty.ratio", "1.5", False),
        ("preallocate", "TRUE", True),
        ("preallocate", "1", False),
        ("segment.bytes", "13", False),
        ("max.message.bytes", str(2**31), False),
        ("message.timestamp.type", "LogAppendTime", True),
        ("leader.replication.throttled.replicas", "*", True),
        ("no.such.key", "1", False),
    ],
)
def test_validate_topic_config(key: str, value: str, valid: bool) -> None:
    assert (validate_topic_config(key, value) is None) == valid


def test_topic_config_keys_cover_kafkas_common_names() -> None:
    expected = {"retention.ms", "retention.bytes", "segment.bytes", "segment.ms", "flush.messages"}
    expected |= {"flush.ms", "cleanup.policy", "max.message.bytes", "message.timestamp.type"}
    expected |= {"min.insync.replicas", "compression.type"}
    assert expected <= TOPIC_CONFIG_KEYS


def test_validate_broker_dynamic_config() -> None:
    assert "log.retention.ms" in BROKER_DYNAMIC_CONFIG_KEYS
    assert validate_broker_dynamic_config("log.retention.ms", "1000") is None
    assert validate_broker_dynamic_config("log.retention.ms", "-3") is not None
    assert validate_broker_dynamic_config("node.id", "3") is not None


def test_per_listener_properties_are_known_only_for_known_names(
        caplog: pytest.LogCaptureFixture) -> None:
    from raftlog.config.catalog import warn_unknown

    with caplog.at_level(logging.INFO, logger="raftlog.config"):
        warn_unknown({
            "listener.name.ssl.ssl.client.auth": "required",
            "listener.name.users.plain.sasl.jaas.config": "x",
            "listener.name.users.scram-sha-512.sasl.jaas.config": "x",
            "listener.name.ssl.ssl.bogus": "1",
            "listener.name.ssl": "1",
        })
    warnings = sorted(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert warnings == ["unknown property listener.name.ssl ignored",
                        "unknown property listener.name.ssl.ssl.bogus ignored"]
