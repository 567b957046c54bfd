"""The server configuration: ``ServerConfig``, validated and frozen, from a Kafka-style
``server.properties`` with Kafka's property names.

``ServerConfig.from_properties`` merges the properties with overrides, warns about unknown ones
(``catalog``), and parses each value, raising :class:`ConfigError` naming the property on a
bad one. Listener and voter parsing live in ``listeners``, the topic configs the broker's
``log.*`` settings default in ``topics``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from raftlog.config.authorizer import AuthorizerSettings, parse_authorizer_settings
from raftlog.config.catalog import (
    LOG_RETENTION_CHECK_INTERVAL_MS_DEFAULT,
    Properties,
    warn_unknown,
)
from raftlog.config.listeners import (
    Listener,
    QuorumVoter,
    find_listener,
    parse_all_listeners,
    parse_inter_broker_name,
    parse_metrics_listener,
    parse_quorum_voters,
)
from raftlog.config.properties import (
    INT_MAX,
    LONG_MAX,
    MS_PER_HOUR,
    MS_PER_MINUTE,
    ConfigError,
    load_properties,
    parse_list,
)
from raftlog.config.sasl import SaslSettings, parse_sasl_settings
from raftlog.config.tls import (
    TLS_PROTOCOLS,
    TlsSettings,
    parse_security_protocols,
    parse_tls_settings,
)
from raftlog.config.topics import (
    BROKER_TO_TOPIC_CONFIG,
    COMPRESSION_TYPES,
    TIMESTAMP_TYPES,
    TOPIC_CONFIG_KEYS,
    check_cleanup_policy,
    check_ratio,
    validate_broker_dynamic_config,
)

ROLES: Final = frozenset({"broker", "controller"})
_CLUSTER_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """A validated broker configuration. Build it with :meth:`from_properties` or :meth:`load`.

    Attribute names are the Kafka property names with dots as underscores; time and size
    settings are resolved to one unit (``log_retention_ms`` already applies Kafka's
    ms > minutes > hours precedence).
    """

    node_id: int
    process_roles: tuple[str, ...]
    controller_quorum_voters: tuple[QuorumVoter, ...]
    listeners: tuple[Listener, ...]
    advertised_listeners: tuple[Listener, ...]
    controller_listener_names: tuple[str, ...]
    inter_broker_listener_name: str
    log_dirs: tuple[Path, ...]
    metadata_log_dir: Path
    num_partitions: int
    default_replication_factor: int
    auto_create_topics_enable: bool
    log_retention_ms: int
    log_retention_bytes: int
    log_segment_bytes: int
    log_roll_ms: int
    log_flush_interval_messages: int
    log_flush_interval_ms: int
    log_index_interval_bytes: int
    log_cleanup_policy: str
    log_message_timestamp_type: str
    compression_type: str
    min_insync_replicas: int
    message_max_bytes: int
    socket_request_max_bytes: int
    connections_max_idle_ms: int
    group_initial_rebalance_delay_ms: int
    cluster_id: str | None
    raft_secret: str | None = field(default=None, repr=False)
    broker_session_timeout_ms: int = 9000
    broker_heartbeat_interval_ms: int = 2000
    replica_lag_time_max_ms: int = 30000
    replica_fetch_max_bytes: int = 4 << 20
    replica_fetch_response_max_bytes: int = 10 << 20
    replica_fetch_wait_max_ms: int = 500
    replica_fetch_min_bytes: int = 1
    unclean_leader_election_enable: bool = False
    auto_leader_rebalance_enable: bool = True
    leader_imbalance_check_interval_seconds: int = 5
    controlled_shutdown_enable: bool = True
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1800000
    offset_metadata_max_bytes: int = 4096
    offsets_retention_ms: int = 604800000
    offsets_retention_check_interval_ms: int = 600000
    producer_id_expiration_ms: int = 86400000
    producer_id_expiration_check_interval_ms: int = 600000
    transaction_max_timeout_ms: int = 900000
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 1000
    log_cleaner_enable: bool = True
    log_scrub_bytes_per_second: int = 16 << 20
    log_cleaner_backoff_ms: int = 15000
    log_cleaner_dedupe_buffer_size: int = 128 << 20
    log_cleaner_delete_retention_ms: int = 86400000
    log_cleaner_min_cleanable_ratio: str = "0.5"  # kept as text: it is only a topic default
    log_cleaner_min_compaction_lag_ms: int = 0
    log_retention_check_interval_ms: int = LOG_RETENTION_CHECK_INTERVAL_MS_DEFAULT
    queued_max_request_bytes: int = 100 << 20
    quota_window_num: int = 11  # quota.window.num
    quota_window_size_seconds: int = 1  # quota.window.size.seconds
    # metrics.listener as (host, port), None when the metrics endpoint is off.
    metrics_listener: tuple[str, int] | None = None
    metrics_partition_detail_enable: bool = False
    trace_produce_enable: bool = False  # trace.produce.enable
    trace_produce_summary_interval_ms: int = 10_000
    metrics_consumer_group_lag_partition_enable: bool = False
    # Each listener's security protocol and each SSL/SASL_SSL listener's TLS settings.
    listener_protocols: tuple[tuple[str, str], ...] = ()
    tls: tuple[TlsSettings, ...] = ()
    # SASL mechanisms, PLAIN users, re-authentication (raftlog.config.sasl).
    sasl: SaslSettings = field(default_factory=SaslSettings)
    # authorizer.class.name, super.users, allow.everyone.if.no.acl.found (config.authorizer).
    authorizer: AuthorizerSettings = field(default_factory=AuthorizerSettings)

    @classmethod
    def load(cls, path: Path | str, overrides: Mapping[str, str] | None = None) -> ServerConfig:
        """Read ``path`` and build the config (``overrides`` win over the file)."""
        return cls.from_properties(load_properties(path), overrides)

    @classmethod
    def from_properties(
        cls, props: Mapping[str, str], overrides: Mapping[str, str] | None = None
    ) -> ServerConfig:
        """Validate properties and build the config.

        Raises:
            ConfigError: a required property is missing or a value is invalid.
        """
        merged = {key.strip(): value.strip() for key, value in props.items()}
        merged.update({key.strip(): value.strip() for key, value in (overrides or {}).items()})
        warn_unknown(merged)
        return _build(Properties(merged))

    def protocol_of(self, name: str) -> str:
        """The security protocol of listener ``name`` (PLAINTEXT unless mapped otherwise)."""
        return dict(self.listener_protocols).get(name.upper(), "PLAINTEXT")

    def tls_of(self, name: str) -> TlsSettings | None:
        """The TLS settings of listener ``name``, None for a PLAINTEXT listener."""
        return next((tls for tls in self.tls if tls.listener == name.upper()), None)

    def listener(self, name: str) -> tuple[str, int]:
        """The (host, port) to bind for listener ``name``."""
        return find_listener("listeners", self.listeners, name)

    def advertised_listener(self, name: str | None = None) -> tuple[str, int]:
        """The (host, port) clients should use; defaults to the inter-broker listener."""
        wanted = self.inter_broker_listener_name if name is None else name
        return find_listener("advertised.listeners", self.advertised_listeners, wanted)

    def topic_defaults(self, dynamic: Mapping[str, str] | None = None) -> dict[str, str]:
        """Topic-level config defaults from the broker config, under Kafka's topic names.

        Args:
            dynamic: Cluster-wide dynamic broker configs (``log.retention.ms``...), e.g. from
                the metadata image; they override the static values. Invalid ones are ignored.
        """
        defaults = {
            "retention.ms": str(self.log_retention_ms),
            "retention.bytes": str(self.log_retention_bytes),
            "segment.bytes": str(self.log_segment_bytes),
            "segment.ms": str(self.log_roll_ms),
            "flush.messages": str(self.log_flush_interval_messages),
            "flush.ms": str(self.log_flush_interval_ms),
            "cleanup.policy": self.log_cleanup_policy,
            "max.message.bytes": str(self.message_max_bytes),
            "message.timestamp.type": self.log_message_timestamp_type,
            "min.insync.replicas": str(self.min_insync_replicas),
            "compression.type": self.compression_type,
            "index.interval.bytes": str(self.log_index_interval_bytes),
            "delete.retention.ms": str(self.log_cleaner_delete_retention_ms),
            "min.cleanable.dirty.ratio": self.log_cleaner_min_cleanable_ratio,
            "min.compaction.lag.ms": str(self.log_cleaner_min_compaction_lag_ms),
        }
        for key, value in (dynamic or {}).items():
            if validate_broker_dynamic_config(key, value) is None:
                defaults[BROKER_TO_TOPIC_CONFIG[key]] = value
        assert set(defaults) <= TOPIC_CONFIG_KEYS
        return defaults

    @property
    def is_controller(self) -> bool:
        """Whether ``process.roles`` includes ``controller``."""
        return "controller" in self.process_roles


def _build(props: Properties) -> ServerConfig:
    node_id = props.integer("node.id", 0, INT_MAX)
    roles = _parse_roles(props)
    controller_names = tuple(
        n.upper() for n in parse_list(props.required("controller.listener.names"))
    )
    listeners, advertised = parse_all_listeners(props, roles, controller_names)
    protocols = parse_security_protocols(
        props, {listener.name for listener in listeners}, controller_names)
    voters = parse_quorum_voters(props, node_id, roles, listeners, controller_names)
    inter_broker = parse_inter_broker_name(props, roles, advertised, protocols)
    log_dirs = _parse_log_dirs(props)
    return ServerConfig(
        node_id=node_id,
        process_roles=roles,
        controller_quorum_voters=voters,
        listeners=listeners,
        advertised_listeners=advertised,
        controller_listener_names=controller_names,
        inter_broker_listener_name=inter_broker,
        log_dirs=log_dirs,
        metadata_log_dir=Path(props.text("metadata.log.dir") or log_dirs[0]),
        num_partitions=props.integer("num.partitions", 1, INT_MAX),
        default_replication_factor=props.integer("default.replication.factor", 1, 32767),
        auto_create_topics_enable=props.boolean("auto.create.topics.enable"),
        log_retention_ms=_parse_retention_ms(props),
        log_retention_bytes=props.integer("log.retention.bytes"),
        log_segment_bytes=props.integer("log.segment.bytes", 14, INT_MAX),
        log_roll_ms=_parse_roll_ms(props),
        log_flush_interval_messages=props.integer("log.flush.interval.messages", 1),
        log_flush_interval_ms=props.integer("log.flush.interval.ms", 0),
        log_index_interval_bytes=props.integer("log.index.interval.bytes", 4, INT_MAX),
        log_cleanup_policy=_parse_cleanup_policy(props),
        log_message_timestamp_type=props.choice("log.message.timestamp.type", TIMESTAMP_TYPES),
        compression_type=props.choice("compression.type", COMPRESSION_TYPES),
        min_insync_replicas=props.integer("min.insync.replicas", 1, INT_MAX),
        message_max_bytes=props.integer("message.max.bytes", 0, INT_MAX),
        socket_request_max_bytes=props.integer("socket.request.max.bytes", 1, INT_MAX),
        connections_max_idle_ms=props.integer("connections.max.idle.ms", -1),
        group_initial_rebalance_delay_ms=props.integer("group.initial.rebalance.delay.ms", 0),
        cluster_id=_parse_cluster_id(props),
        raft_secret=_parse_raft_secret(props),
        broker_session_timeout_ms=props.integer("broker.session.timeout.ms", 1, INT_MAX),
        broker_heartbeat_interval_ms=_parse_heartbeat_interval(props),
        replica_lag_time_max_ms=props.integer("replica.lag.time.max.ms", 1, LONG_MAX),
        replica_fetch_max_bytes=props.integer("replica.fetch.max.bytes", 1, 1 << 30),
        replica_fetch_response_max_bytes=props.integer("replica.fetch.response.max.bytes", 1,
                                                       1 << 30),
        replica_fetch_wait_max_ms=props.integer("replica.fetch.wait.max.ms", 0, 60_000),
        replica_fetch_min_bytes=props.integer("replica.fetch.min.bytes", 1, 1 << 30),
        unclean_leader_election_enable=props.boolean("unclean.leader.election.enable"),
        auto_leader_rebalance_enable=props.boolean("auto.leader.rebalance.enable"),
        leader_imbalance_check_interval_seconds=props.integer(
            "leader.imbalance.check.interval.seconds", 1, INT_MAX // 1000
        ),
        controlled_shutdown_enable=props.boolean("controlled.shutdown.enable"),
        group_min_session_timeout_ms=props.integer("group.min.session.timeout.ms", 0, INT_MAX),
        group_max_session_timeout_ms=props.integer("group.max.session.timeout.ms", 0, INT_MAX),
        offset_metadata_max_bytes=props.integer("offset.metadata.max.bytes", 0, INT_MAX),
        offsets_retention_ms=props.integer("offsets.retention.ms", 1),
        offsets_retention_check_interval_ms=props.integer(
            "offsets.retention.check.interval.ms", 1),
        producer_id_expiration_ms=props.integer("producer.id.expiration.ms", 1, INT_MAX),
        producer_id_expiration_check_interval_ms=props.integer(
            "producer.id.expiration.check.interval.ms", 1, INT_MAX),
        transaction_max_timeout_ms=props.integer("transaction.max.timeout.ms", 1, INT_MAX),
        transaction_abort_timed_out_transaction_cleanup_interval_ms=props.integer(
            "transaction.abort.timed.out.transaction.cleanup.interval.ms", 1, INT_MAX),
        log_cleaner_enable=props.boolean("log.cleaner.enable"),
        log_scrub_bytes_per_second=props.integer("log.scrub.bytes.per.second", 0),
        log_cleaner_backoff_ms=props.integer("log.cleaner.backoff.ms", 0),
        log_cleaner_dedupe_buffer_size=props.integer("log.cleaner.dedupe.buffer.size", 1),
        log_cleaner_delete_retention_ms=props.integer("log.cleaner.delete.retention.ms", 0),
        log_cleaner_min_cleanable_ratio=_parse_ratio(props, "log.cleaner.min.cleanable.ratio"),
        log_cleaner_min_compaction_lag_ms=props.integer("log.cleaner.min.compaction.lag.ms", 0),
        # Kafka validates it with atLeast(1).
        log_retention_check_interval_ms=props.integer("log.retention.check.interval.ms", 1),
        queued_max_request_bytes=props.integer("queued.max.request.bytes"),
        # Kafka: atLeast(1) both (a rate needs two samples: at least 2 windows here).
        quota_window_num=props.integer("quota.window.num", 2, 1000),
        quota_window_size_seconds=props.integer("quota.window.size.seconds", 1, 3600),
        metrics_listener=parse_metrics_listener(props.text("metrics.listener"), listeners),
        metrics_partition_detail_enable=props.boolean("metrics.partition.detail.enable"),
        trace_produce_enable=props.boolean("trace.produce.enable"),
        trace_produce_summary_interval_ms=props.integer("trace.produce.summary.interval.ms",
                                                        100),
        sasl=parse_sasl_settings(props.given, props.required("listener.security.protocol.map"),
                                 tuple(listener.name for listener in listeners)),
        authorizer=parse_authorizer_settings(props.given),
        metrics_consumer_group_lag_partition_enable=props.boolean(
            "metrics.consumer.group.lag.partition.enable"),
        listener_protocols=tuple(sorted(protocols.items())),
        tls=tuple(parse_tls_settings(props, name)
                  for name, protocol in sorted(protocols.items()) if protocol in TLS_PROTOCOLS),
    )


def _parse_ratio(props: Properties, name: str) -> str:
    text = props.required(name)
    check_ratio(name, text)
    return text


def _parse_heartbeat_interval(props: Properties) -> int:
    session_ms = props.integer("broker.session.timeout.ms", 1, INT_MAX)
    heartbeat_ms = props.integer("broker.heartbeat.interval.ms", 1, INT_MAX)
    if heartbeat_ms >= session_ms:
        # A broker that heartbeats less often than its session lasts is fenced between beats.
        raise ConfigError(
            "broker.heartbeat.interval.ms",
            f"{heartbeat_ms} must be below broker.session.timeout.ms ({session_ms})",
        )
    return heartbeat_ms


def _parse_roles(props: Properties) -> tuple[str, ...]:
    roles = tuple(role.lower() for role in parse_list(props.required("process.roles")))
    if not roles or not set(roles) <= ROLES or len(set(roles)) != len(roles):
        raise ConfigError("process.roles", f"expected broker and/or controller, got {roles}")
    return roles


def _parse_log_dirs(props: Properties) -> tuple[Path, ...]:
    name = "log.dirs" if props.is_set("log.dirs") else "log.dir"
    dirs = parse_list(props.required(name))
    if not dirs:
        raise ConfigError(name, "must name at least one directory")
    return tuple(Path(d) for d in dirs)


def _parse_retention_ms(props: Properties) -> int:
    # Kafka's precedence: log.retention.ms, then .minutes, then .hours; -1 means no limit.
    if props.is_set("log.retention.ms"):
        return props.integer("log.retention.ms", -1)
    if props.is_set("log.retention.minutes"):
        minutes = props.integer("log.retention.minutes", -1, LONG_MAX // MS_PER_MINUTE)
        return -1 if minutes < 0 else minutes * MS_PER_MINUTE
    hours = props.integer("log.retention.hours", -1, LONG_MAX // MS_PER_HOUR)
    return -1 if hours < 0 else hours * MS_PER_HOUR


def _parse_roll_ms(props: Properties) -> int:
    if props.is_set("log.roll.ms"):
        return props.integer("log.roll.ms", 1)
    return props.integer("log.roll.hours", 1, LONG_MAX // MS_PER_HOUR) * MS_PER_HOUR


def _parse_cleanup_policy(props: Properties) -> str:
    text = props.required("log.cleanup.policy")
    check_cleanup_policy("log.cleanup.policy", text)
    return ",".join(parse_list(text))


def _parse_cluster_id(props: Properties) -> str | None:
    text = props.text("cluster.id")
    if text is not None and _CLUSTER_ID_PATTERN.fullmatch(text) is None:
        raise ConfigError("cluster.id", f"expected 1-64 characters of [A-Za-z0-9_-], got {text!r}")
    return text


def raft_secret_of(properties: Mapping[str, str]) -> str | None:
    """``raft.secret`` or the contents of ``raft.secret.file`` in ``properties`` (an operator
    tool's ``--command-config``), or None."""
    return _parse_raft_secret(Properties(properties))


def _parse_raft_secret(props: Properties) -> str | None:
    if props.is_set("raft.secret") and props.is_set("raft.secret.file"):
        raise ConfigError("raft.secret", "set raft.secret or raft.secret.file, not both")
    path = props.text("raft.secret.file")
    if path is None:
        return props.text("raft.secret")
    try:
        secret = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("raft.secret.file", f"cannot read {path}: {exc}") from exc
    if not secret:
        raise ConfigError("raft.secret.file", f"{path} is empty")
    return secret
