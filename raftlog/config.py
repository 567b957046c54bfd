"""Server configuration: a Kafka-style ``server.properties`` file, with Kafka's property names.

``load_properties`` reads Java ``.properties`` syntax; ``ServerConfig.from_properties`` turns the
strings into a validated, frozen config. Defaults are Kafka's, except where a laptop wants
something else (listeners on 127.0.0.1, no initial rebalance delay); each such case says why.

This module also owns the topic-level config names (``TOPIC_CONFIG_KEYS``) and their validation,
because the broker's ``log.*`` settings are the defaults for exactly those topic configs.
Unknown properties are logged at WARNING and ignored, as Kafka does; a bad value raises
:class:`ConfigError` naming the property.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

logger = logging.getLogger(__name__)

INT_MAX: Final = 2**31 - 1
LONG_MIN: Final = -(2**63)
LONG_MAX: Final = 2**63 - 1
MS_PER_MINUTE: Final = 60_000
MS_PER_HOUR: Final = 3_600_000
# log.retention.check.interval.ms: how often retention (and the producer-state snapshot) runs.
# Why 30 s and not Kafka's 300000: raftlog always ran it every 30 s, and a laptop deployment
# with a short retention.ms should see old segments go while someone is still watching.
LOG_RETENTION_CHECK_INTERVAL_MS_DEFAULT: Final = 30_000


class ConfigError(ValueError):
    """A property is missing or has an invalid value; ``property_name`` says which."""

    def __init__(self, property_name: str, message: str) -> None:
        super().__init__(f"{property_name}: {message}")
        self.property_name = property_name


# --- Java .properties syntax ----------------------------------------------------------------

_WHITESPACE: Final = " \t\f"
_ESCAPES: Final = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def load_properties(path: Path | str) -> dict[str, str]:
    """Read a ``.properties`` file (UTF-8) into a dict; later keys win, as in Java.

    Raises:
        ConfigError: the file cannot be read or has a malformed ``\\uXXXX`` escape.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), f"cannot read properties file: {exc}") from exc
    return parse_properties(text)


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java ``.properties`` text: ``#``/``!`` comments, ``key=value``, ``key: value`` or
    ``key value``, backslash line continuations and escapes. Values are whitespace-trimmed."""
    result: dict[str, str] = {}
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index].lstrip(_WHITESPACE)
        index += 1
        if not line or line[0] in "#!":
            continue
        while _continues(line) and index < len(lines):
            line = line[:-1] + lines[index].lstrip(_WHITESPACE)
            index += 1
        if _continues(line):
            line = line[:-1]  # A continuation at end of file continues into nothing, as in Java.
        key, value = _split_property(line)
        result[key] = value.strip()
    return result


def _continues(line: str) -> bool:
    # An odd number of trailing backslashes: the last one is not itself escaped.
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


def _split_property(line: str) -> tuple[str, str]:
    position = 0
    while position < len(line) and line[position] not in "=:" + _WHITESPACE:
        position += 2 if line[position] == "\\" else 1
    key_end = min(position, len(line))
    while position < len(line) and line[position] in _WHITESPACE:
        position += 1
    if position < len(line) and line[position] in "=:":
        position += 1
    while position < len(line) and line[position] in _WHITESPACE:
        position += 1
    return _unescape(line[:key_end]), _unescape(line[position:])


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    position = 0
    while position < len(text):
        char = text[position]
        if char != "\\" or position + 1 == len(text):
            out.append(char)
            position += 1
            continue
        escaped = text[position + 1]
        if escaped == "u":
            out.append(_unicode_escape(text[position + 2 : position + 6]))
            position += 6
            continue
        out.append(_ESCAPES.get(escaped, escaped))
        position += 2
    return "".join(out)


def _unicode_escape(digits: str) -> str:
    if len(digits) != 4 or not all(c in "0123456789abcdefABCDEF" for c in digits):
        raise ConfigError("<properties>", f"malformed \\uxxxx escape: \\u{digits}")
    return chr(int(digits, 16))


# --- Typed value parsers --------------------------------------------------------------------


def parse_int(name: str, text: str, minimum: int = LONG_MIN, maximum: int = LONG_MAX) -> int:
    """Parse a Kafka INT/LONG value within ``[minimum, maximum]``."""
    try:
        value = int(text.strip(), 10)
    except ValueError:
        raise ConfigError(name, f"expected an integer, got {text!r}") from None
    if not minimum <= value <= maximum:
        raise ConfigError(name, f"value {value} outside [{minimum}, {maximum}]")
    return value


def parse_bool(name: str, text: str) -> bool:
    """Parse a Kafka BOOLEAN ("true"/"false", any case)."""
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise ConfigError(name, f"expected true or false, got {text!r}")
    return lowered == "true"


def parse_choice(name: str, text: str, choices: frozenset[str]) -> str:
    """Parse a value that must be one of ``choices`` (case-sensitive, as Kafka's ValidString)."""
    value = text.strip()
    if value not in choices:
        raise ConfigError(name, f"expected one of {sorted(choices)}, got {text!r}")
    return value


def parse_list(text: str) -> tuple[str, ...]:
    """Split a Kafka LIST value on commas, trimming items and dropping empty ones."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


# --- Topic-level configs ----------------------------------------------------------------------

COMPRESSION_TYPES: Final = frozenset({"uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"})
TIMESTAMP_TYPES: Final = frozenset({"CreateTime", "LogAppendTime"})
CLEANUP_POLICIES: Final = frozenset({"delete", "compact"})

Validator = Callable[[str, str], None]


def _long_at_least(minimum: int) -> Validator:
    def validate(name: str, text: str) -> None:
        parse_int(name, text, minimum)

    return validate


def _int_between(minimum: int, maximum: int) -> Validator:
    def validate(name: str, text: str) -> None:
        parse_int(name, text, minimum, maximum)

    return validate


def _boolean(name: str, text: str) -> None:
    parse_bool(name, text)


def _any_string(name: str, text: str) -> None:
    del name, text  # Kafka accepts any string here; we keep it verbatim.


def _ratio(name: str, text: str) -> None:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(name, f"expected a number, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise ConfigError(name, f"value {value} outside [0, 1]")


def _cleanup_policy(name: str, text: str) -> None:
    policies = parse_list(text)
    if not policies or not set(policies) <= CLEANUP_POLICIES:
        raise ConfigError(name, f"expected a list of {sorted(CLEANUP_POLICIES)}, got {text!r}")


def _compression_type(name: str, text: str) -> None:
    parse_choice(name, text, COMPRESSION_TYPES)


def _timestamp_type(name: str, text: str) -> None:
    parse_choice(name, text, TIMESTAMP_TYPES)


# Kafka's LogConfig definitions: name -> validator. Ranges follow Kafka 3.x ``ConfigDef``.
TOPIC_CONFIG_VALIDATORS: Final[Mapping[str, Validator]] = {
    "cleanup.policy": _cleanup_policy,
    "compression.type": _compression_type,
    "compression.gzip.level": _int_between(-1, 9),
    "compression.lz4.level": _int_between(1, 17),
    "compression.zstd.level": _int_between(-131072, 22),
    "delete.retention.ms": _long_at_least(0),
    "file.delete.delay.ms": _long_at_least(0),
    "flush.messages": _long_at_least(1),
    "flush.ms": _long_at_least(0),
    "follower.replication.throttled.replicas": _any_string,
    "index.interval.bytes": _int_between(0, INT_MAX),
    "leader.replication.throttled.replicas": _any_string,
    "local.retention.bytes": _long_at_least(-2),
    "local.retention.ms": _long_at_least(-2),
    "max.compaction.lag.ms": _long_at_least(1),
    "max.message.bytes": _int_between(0, INT_MAX),
    "message.downconversion.enable": _boolean,
    "message.format.version": _any_string,
    "message.timestamp.after.max.ms": _long_at_least(0),
    "message.timestamp.before.max.ms": _long_at_least(0),
    "message.timestamp.difference.max.ms": _long_at_least(0),
    "message.timestamp.type": _timestamp_type,
    "min.cleanable.dirty.ratio": _ratio,
    "min.compaction.lag.ms": _long_at_least(0),
    "min.insync.replicas": _int_between(1, INT_MAX),
    "preallocate": _boolean,
    "remote.storage.enable": _boolean,
    "retention.bytes": _long_at_least(LONG_MIN),
    "retention.ms": _long_at_least(-1),
    "segment.bytes": _int_between(14, INT_MAX),
    "segment.index.bytes": _int_between(4, INT_MAX),
    "segment.jitter.ms": _long_at_least(0),
    "segment.ms": _long_at_least(1),
    "unclean.leader.election.enable": _boolean,
}
TOPIC_CONFIG_KEYS: Final = frozenset(TOPIC_CONFIG_VALIDATORS)

# Broker property -> the topic config it provides the default for (Kafka's synonyms).
BROKER_TO_TOPIC_CONFIG: Final[Mapping[str, str]] = {
    "log.retention.ms": "retention.ms",
    "log.retention.bytes": "retention.bytes",
    "log.segment.bytes": "segment.bytes",
    "log.roll.ms": "segment.ms",
    "log.flush.interval.messages": "flush.messages",
    "log.flush.interval.ms": "flush.ms",
    "log.cleanup.policy": "cleanup.policy",
    "message.max.bytes": "max.message.bytes",
    "log.message.timestamp.type": "message.timestamp.type",
    "min.insync.replicas": "min.insync.replicas",
    "compression.type": "compression.type",
    "log.index.interval.bytes": "index.interval.bytes",
    "log.cleaner.delete.retention.ms": "delete.retention.ms",
    "log.cleaner.min.cleanable.ratio": "min.cleanable.dirty.ratio",
    "log.cleaner.min.compaction.lag.ms": "min.compaction.lag.ms",
}
# Broker configs that AlterConfigs may change at runtime (resource type BROKER): the topic
# defaults above, as in Kafka's cluster-wide dynamic "log.*" configs.
BROKER_DYNAMIC_CONFIG_KEYS: Final = frozenset(BROKER_TO_TOPIC_CONFIG)

assert set(BROKER_TO_TOPIC_CONFIG.values()) <= TOPIC_CONFIG_KEYS


def validate_topic_config(key: str, value: str) -> str | None:
    """Return why ``key=value`` is not a valid topic config, or None if it is."""
    validator = TOPIC_CONFIG_VALIDATORS.get(key)
    if validator is None:
        return f"unknown topic config {key!r}"
    return _run_validator(validator, key, value)


def validate_broker_dynamic_config(key: str, value: str) -> str | None:
    """Return why ``key=value`` is not a valid dynamic broker config, or None if it is."""
    topic_key = BROKER_TO_TOPIC_CONFIG.get(key)
    if topic_key is None:
        return f"{key!r} is not a dynamic broker config"
    return _run_validator(TOPIC_CONFIG_VALIDATORS[topic_key], key, value)


def _run_validator(validator: Validator, key: str, value: str) -> str | None:
    try:
        validator(key, value)
    except ConfigError as exc:
        return str(exc)
    return None


# --- Listeners and voters -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Listener:
    """One ``NAME://host:port`` entry; host "0.0.0.0" binds every interface, port 0 any port."""

    name: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class QuorumVoter:
    """One ``id@host:port`` entry of ``controller.quorum.voters``."""

    node_id: int
    host: str
    port: int


_LISTENER_PATTERN: Final = re.compile(r"([A-Za-z0-9_]+)://(\[[0-9A-Fa-f:.]+\]|[^:\[\]/]*):(\d+)")
_VOTER_PATTERN: Final = re.compile(r"(\d+)@(\[[0-9A-Fa-f:.]+\]|[^:\[\]@]+):(\d+)")
_CLUSTER_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_WILDCARD_HOSTS: Final = frozenset({"", "0.0.0.0", "::"})
PORT_MAX: Final = 65535


def parse_listeners(name: str, text: str) -> tuple[Listener, ...]:
    """Parse a ``listeners``-style list; names are upper-cased and must be unique."""
    listeners = []
    for item in parse_list(text):
        match = _LISTENER_PATTERN.fullmatch(item)
        if match is None:
            raise ConfigError(name, f"expected NAME://host:port, got {item!r}")
        host = match.group(2).strip("[]") or "0.0.0.0"
        port = parse_int(name, match.group(3), 0, PORT_MAX)
        listeners.append(Listener(match.group(1).upper(), host, port))
    names = [listener.name for listener in listeners]
    if len(set(names)) != len(names):
        raise ConfigError(name, f"listener names must be unique, got {names}")
    ports = [listener.port for listener in listeners if listener.port != 0]
    if len(set(ports)) != len(ports):
        raise ConfigError(name, f"each listener needs its own port, got {ports}")
    return tuple(listeners)


def parse_voters(name: str, text: str) -> tuple[QuorumVoter, ...]:
    """Parse ``controller.quorum.voters`` (``1@host:port,2@host:port``)."""
    voters = []
    for item in parse_list(text):
        match = _VOTER_PATTERN.fullmatch(item)
        if match is None:
            raise ConfigError(name, f"expected id@host:port, got {item!r}")
        node_id = parse_int(name, match.group(1), 0, INT_MAX)
        port = parse_int(name, match.group(3), 1, PORT_MAX)
        voters.append(QuorumVoter(node_id, match.group(2).strip("[]"), port))
    ids = [voter.node_id for voter in voters]
    if len(set(ids)) != len(ids):
        raise ConfigError(name, f"voter ids must be unique, got {ids}")
    return tuple(voters)


# --- The server config ----------------------------------------------------------------------

ROLES: Final = frozenset({"broker", "controller"})

# Properties raftlog understands, with Kafka's defaults (None: no default, derived or optional).
# Why 127.0.0.1 listeners: a laptop broker should not listen on every interface by default.
# Why no rebalance delay: Kafka's shipped server.properties sets 0 "for development" too.
DEFAULTS: Final[Mapping[str, str | None]] = {
    "node.id": None,
    "process.roles": "broker,controller",
    "controller.quorum.voters": None,
    "listeners": None,
    "advertised.listeners": None,
    "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": None,
    "log.dirs": None,
    "log.dir": "/tmp/raftlog-logs",
    "metadata.log.dir": None,
    "num.partitions": "1",
    "default.replication.factor": "1",
    "auto.create.topics.enable": "true",
    "log.retention.ms": None,
    "log.retention.minutes": None,
    "log.retention.hours": "168",
    "log.retention.bytes": "-1",
    "log.segment.bytes": str(1024**3),
    "log.roll.ms": None,
    "log.roll.hours": "168",
    "log.flush.interval.messages": str(LONG_MAX),
    "log.flush.interval.ms": str(LONG_MAX),
    "log.index.interval.bytes": "4096",
    "log.cleanup.policy": "delete",
    # The log cleaner (raftlog.partition.cleaner_service), Kafka's names and defaults.
    "log.cleaner.enable": "true",
    "log.cleaner.backoff.ms": "15000",
    "log.cleaner.dedupe.buffer.size": str(128 << 20),
    "log.cleaner.delete.retention.ms": "86400000",
    "log.cleaner.min.cleanable.ratio": "0.5",
    "log.cleaner.min.compaction.lag.ms": "0",
    "log.retention.check.interval.ms": str(LOG_RETENTION_CHECK_INTERVAL_MS_DEFAULT),
    "log.message.timestamp.type": "CreateTime",
    "compression.type": "producer",
    "min.insync.replicas": "1",
    "message.max.bytes": "1048588",
    "socket.request.max.bytes": "104857600",
    "connections.max.idle.ms": "600000",
    # Why bounded (Kafka's default is -1, unbounded): without a budget, connections that each
    # send part of a big request grow the node's memory without limit. Any value <= 0 is
    # unbounded, as in Kafka.
    "queued.max.request.bytes": str(100 << 20),
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "6000",
    "group.max.session.timeout.ms": "1800000",
    "offset.metadata.max.bytes": "4096",
    "offsets.retention.ms": "604800000",
    "offsets.retention.check.interval.ms": "600000",
    # Transactions and idempotent producers (raftlog.txn), Kafka's names. The abort check runs
    # every second rather than Kafka's 10 s so a laptop sees a timed-out transaction end soon.
    "producer.id.expiration.ms": "86400000",
    "producer.id.expiration.check.interval.ms": "600000",
    "transaction.max.timeout.ms": "900000",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    "raft.secret": None,
    "raft.secret.file": None,
    "cluster.id": None,
    "broker.session.timeout.ms": "9000",
    "broker.heartbeat.interval.ms": "2000",
    "replica.lag.time.max.ms": "30000",
    # Why 4 MiB and not Kafka's 1 MiB: a raftlog follower fsyncs before every next fetch (the
    # offset it reports must be durable), so a bigger round spreads that fsync over more bytes.
    "replica.fetch.max.bytes": str(4 << 20),
    "replica.fetch.response.max.bytes": str(10 << 20),
    "replica.fetch.wait.max.ms": "500",
    "replica.fetch.min.bytes": "1",
    "unclean.leader.election.enable": "false",
    "auto.leader.rebalance.enable": "true",
    # Why 5 s and not Kafka's 300: a laptop cluster whose broker restarted should get its
    # preferred leaderships back while someone is still watching.
    "leader.imbalance.check.interval.seconds": "5",
    "controlled.shutdown.enable": "true",
}

# Kafka properties that are valid but mean nothing here (thread pools, socket buffers, internal
# topic replication): accepted quietly so a copied Kafka server.properties loads without noise.
ACCEPTED_WITHOUT_EFFECT: Final = frozenset(
    {
        "num.network.threads",
        "num.io.threads",
        "num.recovery.threads.per.data.dir",
        "socket.send.buffer.bytes",
        "socket.receive.buffer.bytes",
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
    }
)


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
    log_cleaner_backoff_ms: int = 15000
    log_cleaner_dedupe_buffer_size: int = 128 << 20
    log_cleaner_delete_retention_ms: int = 86400000
    log_cleaner_min_cleanable_ratio: str = "0.5"  # kept as text: it is only a topic default
    log_cleaner_min_compaction_lag_ms: int = 0
    log_retention_check_interval_ms: int = LOG_RETENTION_CHECK_INTERVAL_MS_DEFAULT
    queued_max_request_bytes: int = 100 << 20

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
        _warn_unknown(merged)
        return _build(_Properties(merged))

    def listener(self, name: str) -> tuple[str, int]:
        """The (host, port) to bind for listener ``name``."""
        return _find_listener("listeners", self.listeners, name)

    def advertised_listener(self, name: str | None = None) -> tuple[str, int]:
        """The (host, port) clients should use; defaults to the inter-broker listener."""
        wanted = self.inter_broker_listener_name if name is None else name
        return _find_listener("advertised.listeners", self.advertised_listeners, wanted)

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


def _find_listener(
    property_name: str, listeners: tuple[Listener, ...], name: str
) -> tuple[str, int]:
    for listener in listeners:
        if listener.name == name.upper():
            return listener.host, listener.port
    raise ConfigError(property_name, f"no listener named {name!r}")


def _warn_unknown(props: Mapping[str, str]) -> None:
    for key in sorted(props):
        if key in ACCEPTED_WITHOUT_EFFECT:
            logger.info("property %s is accepted for Kafka compatibility and has no effect", key)
        elif key not in DEFAULTS:
            logger.warning("unknown property %s ignored", key)


class _Properties:
    """Typed access to the merged properties, falling back to ``DEFAULTS``."""

    def __init__(self, props: Mapping[str, str]) -> None:
        self._props = props

    def is_set(self, name: str) -> bool:
        return bool(self._props.get(name, ""))

    def text(self, name: str) -> str | None:
        assert name in DEFAULTS, name
        value = self._props.get(name, "") or DEFAULTS[name]
        return value

    def required(self, name: str) -> str:
        value = self.text(name)
        if value is None:
            raise ConfigError(name, "is required")
        return value

    def integer(self, name: str, minimum: int = LONG_MIN, maximum: int = LONG_MAX) -> int:
        return parse_int(name, self.required(name), minimum, maximum)

    def boolean(self, name: str) -> bool:
        return parse_bool(name, self.required(name))

    def choice(self, name: str, choices: frozenset[str]) -> str:
        return parse_choice(name, self.required(name), choices)


def _build(props: _Properties) -> ServerConfig:
    node_id = props.integer("node.id", 0, INT_MAX)
    roles = _parse_roles(props)
    controller_names = tuple(
        n.upper() for n in parse_list(props.required("controller.listener.names"))
    )
    listeners, advertised = _parse_all_listeners(props, roles, controller_names)
    log_dirs = _parse_log_dirs(props)
    return ServerConfig(
        node_id=node_id,
        process_roles=roles,
        controller_quorum_voters=_parse_voters(props, node_id, roles, listeners, controller_names),
        listeners=listeners,
        advertised_listeners=advertised,
        controller_listener_names=controller_names,
        inter_broker_listener_name=_parse_inter_broker_name(props, roles, advertised),
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
        log_cleaner_backoff_ms=props.integer("log.cleaner.backoff.ms", 0),
        log_cleaner_dedupe_buffer_size=props.integer("log.cleaner.dedupe.buffer.size", 1),
        log_cleaner_delete_retention_ms=props.integer("log.cleaner.delete.retention.ms", 0),
        log_cleaner_min_cleanable_ratio=_parse_ratio(props, "log.cleaner.min.cleanable.ratio"),
        log_cleaner_min_compaction_lag_ms=props.integer("log.cleaner.min.compaction.lag.ms", 0),
        # Kafka validates it with atLeast(1).
        log_retention_check_interval_ms=props.integer("log.retention.check.interval.ms", 1),
        queued_max_request_bytes=props.integer("queued.max.request.bytes"),
    )


def _parse_ratio(props: _Properties, name: str) -> str:
    text = props.required(name)
    _ratio(name, text)
    return text


def _parse_heartbeat_interval(props: _Properties) -> int:
    session_ms = props.integer("broker.session.timeout.ms", 1, INT_MAX)
    heartbeat_ms = props.integer("broker.heartbeat.interval.ms", 1, INT_MAX)
    if heartbeat_ms >= session_ms:
        # A broker that heartbeats less often than its session lasts is fenced between beats.
        raise ConfigError(
            "broker.heartbeat.interval.ms",
            f"{heartbeat_ms} must be below broker.session.timeout.ms ({session_ms})",
        )
    return heartbeat_ms


def _parse_roles(props: _Properties) -> tuple[str, ...]:
    roles = tuple(role.lower() for role in parse_list(props.required("process.roles")))
    if not roles or not set(roles) <= ROLES or len(set(roles)) != len(roles):
        raise ConfigError("process.roles", f"expected broker and/or controller, got {roles}")
    return roles


def _parse_all_listeners(
    props: _Properties, roles: tuple[str, ...], controller_names: tuple[str, ...]
) -> tuple[tuple[Listener, ...], tuple[Listener, ...]]:
    default_listeners = "PLAINTEXT://127.0.0.1:9092"
    if "controller" in roles:
        default_listeners += ",CONTROLLER://127.0.0.1:9093"
    listeners = parse_listeners("listeners", props.text("listeners") or default_listeners)
    names = {listener.name for listener in listeners}
    if "controller" in roles and (not controller_names or controller_names[0] not in names):
        raise ConfigError(
            "controller.listener.names", f"{controller_names} must name one of {sorted(names)}"
        )
    _check_security_protocols(props, names)
    advertised = _parse_advertised(props, listeners, controller_names)
    return listeners, advertised


def _parse_advertised(
    props: _Properties, listeners: tuple[Listener, ...], controller_names: tuple[str, ...]
) -> tuple[Listener, ...]:
    text = props.text("advertised.listeners")
    if text is None:
        # Kafka advertises the canonical host name for a wildcard listener.
        return tuple(
            Listener(
                lst.name,
                socket.gethostname() if lst.host in _WILDCARD_HOSTS else lst.host,
                lst.port,
            )
            for lst in listeners
            if lst.name not in controller_names
        )
    advertised = parse_listeners("advertised.listeners", text)
    names = {listener.name for listener in listeners}
    for listener in advertised:
        if listener.name in controller_names or listener.name not in names:
            raise ConfigError("advertised.listeners", f"cannot advertise {listener.name}")
        if listener.host in _WILDCARD_HOSTS:
            raise ConfigError("advertised.listeners", f"cannot advertise {listener.host!r}")
    return advertised


def _check_security_protocols(props: _Properties, listener_names: set[str]) -> None:
    # Only PLAINTEXT exists here; refusing SSL/SASL beats silently serving plaintext.
    protocol_map: dict[str, str] = {}
    for item in parse_list(props.required("listener.security.protocol.map")):
        name, _, protocol = item.partition(":")
        protocol_map[name.strip().upper()] = protocol.strip().upper()
    for name in sorted(listener_names):
        protocol = protocol_map.get(name, name)
        if protocol != "PLAINTEXT":
            raise ConfigError(
                "listener.security.protocol.map",
                f"listener {name} uses {protocol}; raftlog supports only PLAINTEXT",
            )


def _parse_inter_broker_name(
    props: _Properties, roles: tuple[str, ...], advertised: tuple[Listener, ...]
) -> str:
    names = [listener.name for listener in advertised]
    text = props.text("inter.broker.listener.name")
    if text is None:
        if "broker" in roles and not names:
            raise ConfigError("listeners", "a broker needs at least one non-controller listener")
        return names[0] if names else ""
    name = text.upper()
    if "broker" in roles and name not in names:
        raise ConfigError("inter.broker.listener.name", f"{name} is not in {names}")
    return name


def _parse_voters(
    props: _Properties,
    node_id: int,
    roles: tuple[str, ...],
    listeners: tuple[Listener, ...],
    controller_names: tuple[str, ...],
) -> tuple[QuorumVoter, ...]:
    text = props.text("controller.quorum.voters")
    if text is None:
        if "controller" not in roles:
            raise ConfigError("controller.quorum.voters", "is required for a broker-only node")
        # A single combined node votes for itself on its controller listener.
        host, port = _find_listener("listeners", listeners, controller_names[0])
        host = "127.0.0.1" if host in _WILDCARD_HOSTS else host
        return (QuorumVoter(node_id, host, port),)
    voters = parse_voters("controller.quorum.voters", text)
    if not voters:
        raise ConfigError("controller.quorum.voters", "must list at least one voter")
    if "controller" in roles and node_id not in {voter.node_id for voter in voters}:
        raise ConfigError("controller.quorum.voters", f"node.id {node_id} is not a voter")
    return voters


def _parse_log_dirs(props: _Properties) -> tuple[Path, ...]:
    name = "log.dirs" if props.is_set("log.dirs") else "log.dir"
    dirs = parse_list(props.required(name))
    if not dirs:
        raise ConfigError(name, "must name at least one directory")
    return tuple(Path(d) for d in dirs)


def _parse_retention_ms(props: _Properties) -> int:
    # Kafka's precedence: log.retention.ms, then .minutes, then .hours; -1 means no limit.
    if props.is_set("log.retention.ms"):
        return props.integer("log.retention.ms", -1)
    if props.is_set("log.retention.minutes"):
        minutes = props.integer("log.retention.minutes", -1, LONG_MAX // MS_PER_MINUTE)
        return -1 if minutes < 0 else minutes * MS_PER_MINUTE
    hours = props.integer("log.retention.hours", -1, LONG_MAX // MS_PER_HOUR)
    return -1 if hours < 0 else hours * MS_PER_HOUR


def _parse_roll_ms(props: _Properties) -> int:
    if props.is_set("log.roll.ms"):
        return props.integer("log.roll.ms", 1)
    return props.integer("log.roll.hours", 1, LONG_MAX // MS_PER_HOUR) * MS_PER_HOUR


def _parse_cleanup_policy(props: _Properties) -> str:
    text = props.required("log.cleanup.policy")
    _cleanup_policy("log.cleanup.policy", text)
    return ",".join(parse_list(text))


def _parse_cluster_id(props: _Properties) -> str | None:
    text = props.text("cluster.id")
    if text is not None and _CLUSTER_ID_PATTERN.fullmatch(text) is None:
        raise ConfigError("cluster.id", f"expected 1-64 characters of [A-Za-z0-9_-], got {text!r}")
    return text


def raft_secret_of(properties: Mapping[str, str]) -> str | None:
    """``raft.secret`` or the contents of ``raft.secret.file`` in ``properties`` (an operator
    tool's ``--command-config``), or None."""
    return _parse_raft_secret(_Properties(properties))


def _parse_raft_secret(props: _Properties) -> str | None:
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
