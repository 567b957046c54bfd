"""Topic-level config names, their validation, and the broker properties that default them.

The broker's ``log.*`` settings are the defaults for exactly these topic configs (Kafka's
synonyms, ``BROKER_TO_TOPIC_CONFIG``), and are also the broker configs AlterConfigs may change
at runtime (``BROKER_DYNAMIC_CONFIG_KEYS``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from raftlog.config.properties import (
    INT_MAX,
    LONG_MIN,
    ConfigError,
    parse_bool,
    parse_choice,
    parse_int,
    parse_list,
)

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


def check_ratio(name: str, text: str) -> None:
    """A number in [0, 1] (min.cleanable.dirty.ratio)."""
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(name, f"expected a number, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise ConfigError(name, f"value {value} outside [0, 1]")


def check_cleanup_policy(name: str, text: str) -> None:
    """A non-empty list of delete and/or compact."""
    policies = parse_list(text)
    if not policies or not set(policies) <= CLEANUP_POLICIES:
        raise ConfigError(name, f"expected a list of {sorted(CLEANUP_POLICIES)}, got {text!r}")


def _compression_type(name: str, text: str) -> None:
    parse_choice(name, text, COMPRESSION_TYPES)


def _timestamp_type(name: str, text: str) -> None:
    parse_choice(name, text, TIMESTAMP_TYPES)


# Kafka's LogConfig definitions: name -> validator. Ranges follow Kafka 3.x ``ConfigDef``.
TOPIC_CONFIG_VALIDATORS: Final[Mapping[str, Validator]] = {
    "cleanup.policy": check_cleanup_policy,
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
    "min.cleanable.dirty.ratio": check_ratio,
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

