"""Option parsing and validation, with the names of Spark's Kafka source and sink.

Everything here is pure Python (no Spark, no network) so it runs first, on the driver, when a
query is defined: `DataSource.schema()` at `load()`, `writer()` before any write task. The
parsed forms are frozen dataclasses: they are pickled to the executors inside the reader and
writer objects.

Spark lower-cases option names before the data source sees them, so lookups are
case-insensitive and errors print the canonical (camelCase) spelling.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from spark_connector.errors import RaftLogOptionError
from spark_connector.security import librdkafka_properties

TopicPartition = tuple[str, int]
"""(topic, partition): the key of every offset map in the connector."""

EARLIEST = -2
LATEST = -1

DEFAULT_API_TIMEOUT_MS = 60_000  # Kafka's default.api.timeout.ms: driver metadata and offsets
DEFAULT_POLL_TIMEOUT_MS = 120_000  # Spark's kafkaConsumer.pollTimeoutMs default
DEFAULT_DELIVERY_TIMEOUT_MS = 120_000  # Kafka's delivery.timeout.ms; librdkafka's is 300 s

BOOTSTRAP = "kafka.bootstrap.servers"

# Canonical names. Spark hands them to us lower-cased.
READ_OPTIONS = (
    "subscribe", "subscribePattern", "assign",
    "startingOffsets", "startingTimestamp", "startingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp",
    "maxOffsetsPerTrigger", "failOnDataLoss", "includeHeaders",
    "kafkaConsumer.pollTimeoutMs", "groupIdPrefix", "isolation.level",
)
STREAM_ONLY_READ_OPTIONS = ("maxOffsetsPerTrigger",)
BATCH_ONLY_READ_OPTIONS = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
GUARANTEE = "raftlog.sink.guarantee"
MARKER_TOPIC = "raftlog.sink.markerTopic"
WRITE_OPTIONS = ("topic", "checkpointLocation", GUARANTEE, MARKER_TOPIC)
EXACTLY_ONCE: Final = "exactly_once"
AT_LEAST_ONCE: Final = "at_least_once"
GUARANTEES = (EXACTLY_ONCE, AT_LEAST_ONCE)
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000  # how long a dead writer's open transaction blocks
                                         # read_committed readers if nobody fences it first

# Options of Spark's Kafka connector that this connector does not implement (yet): a clear
# error beats silently ignoring them.
UNSUPPORTED_OPTIONS: dict[str, str] = {
    "minOffsetsPerTrigger": "minimum trigger sizes are not implemented",
    "maxTriggerDelay": "minimum trigger sizes are not implemented",
    "minPartitions": "there is exactly one Spark partition per Kafka partition",
    "maxRecordsPerPartition": "there is exactly one Spark partition per Kafka partition",
    "fetchOffset.numRetries": "offset lookups retry until kafka.default.api.timeout.ms",
    "fetchOffset.retryIntervalMs": "offset lookups retry until kafka.default.api.timeout.ms",
}

# kafka.<name> properties that the connector sets itself, or that make no sense here.
REJECTED_KAFKA_READ: dict[str, str] = {
    "auto.offset.reset": "set the option 'startingOffsets' instead",
    "enable.auto.commit": "offsets live in Spark's checkpoint; the connector never commits them",
    "enable.partition.eof": "the connector manages it",
    "key.deserializer": "key and value are always binary columns; cast them in the query",
    "value.deserializer": "key and value are always binary columns; cast them in the query",
    "interceptor.classes": "not supported",
}
REJECTED_KAFKA_WRITE: dict[str, str] = {
    "key.serializer": "key and value columns must be STRING or BINARY",
    "value.serializer": "key and value columns must be STRING or BINARY",
    "transactional.id": "the exactly-once sink derives one per query and Spark partition"
                        " (raftlog-spark-<queryId>-<partition>); see docs/spark.md",
}

_CANONICAL: dict[str, str] = {
    name.lower(): name
    for name in (BOOTSTRAP, *READ_OPTIONS, *WRITE_OPTIONS, *UNSUPPORTED_OPTIONS,
                 "kafka.isolation.level", "kafka.default.api.timeout.ms")
}

OFFSETS_HELP = ("expected 'earliest', 'latest' or per-partition JSON such as "
                '{"topicA":{"0":23,"1":-2}} (-2 = earliest, -1 = latest)')
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")


def canonical(name: str) -> str:
    return _CANONICAL.get(name.lower(), name)


# -- parsed forms ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientSettings:
    """What a confluent-kafka client needs, on the driver or on an executor."""

    bootstrap_servers: str
    extra: tuple[tuple[str, str], ...] = ()  # librdkafka properties from kafka.* options
    api_timeout_ms: int = DEFAULT_API_TIMEOUT_MS

    def config(self, **overrides: Any) -> dict[str, Any]:
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        conf.update(overrides)
        conf.update(dict(self.extra))  # the user's kafka.* settings win over our defaults
        return conf

    @property
    def api_timeout_s(self) -> float:
        return self.api_timeout_ms / 1000.0


@dataclass(frozen=True)
class Subscription:
    """Exactly one of subscribe / subscribePattern / assign."""

    kind: Literal["subscribe", "subscribePattern", "assign"]
    topics: tuple[str, ...] = ()
    pattern: str = ""
    assigned: tuple[TopicPartition, ...] = ()

    def describe(self) -> str:
        if self.kind == "subscribe":
            return f"subscribe={','.join(self.topics)}"
        if self.kind == "subscribePattern":
            return f"subscribePattern={self.pattern}"
        return "assign=" + ",".join(f"{t}-{p}" for t, p in self.assigned)

    def matches(self, topic: str) -> bool:
        if self.kind == "subscribe":
            return topic in self.topics
        if self.kind == "subscribePattern":
            # Spark uses Java's Pattern.matcher(topic).matches(): a full match.
            return re.fullmatch(self.pattern, topic) is not None
        return any(t == topic for t, _ in self.assigned)


BoundKind = Literal["earliest", "latest", "offsets", "timestamp", "timestamps"]


@dataclass(frozen=True)
class OffsetBound:
    """A starting or ending position, as the user gave it (resolved later against the log)."""

    option: str  # the option it came from, for error messages
    kind: BoundKind
    # kind "offsets" (-2 / -1 allowed) or "timestamps": per partition
    offsets: tuple[tuple[TopicPartition, int], ...] = ()
    timestamp: int = 0  # "timestamp": one time for every partition

    def offset_map(self) -> dict[TopicPartition, int]:
        return dict(self.offsets)


@dataclass(frozen=True)
class SourceOptions:
    client: ClientSettings
    subscription: Subscription
    starting: OffsetBound | None  # None: the default (earliest for batch, latest for streams)
    ending: OffsetBound | None  # batch only; None: latest
    timestamp_strategy: Literal["error", "latest"] = "error"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed"
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    group_id_prefix: str = "spark-raftlog"
    given: frozenset[str] = field(default_factory=frozenset)  # canonical names the user set


Guarantee = Literal["exactly_once", "at_least_once"]


@dataclass(frozen=True)
class SinkOptions:
    client: ClientSettings
    topic: str | None
    # None: the default of the kind of write (exactly_once for streams, at_least_once for
    # batch writes); see resolve_guarantee().
    guarantee: Guarantee | None = None
    marker_topic: str | None = None  # where exactly-once progress markers are keyed

    def resolve_guarantee(self, *, streaming: bool) -> Guarantee:
        if self.guarantee is None:
            return EXACTLY_ONCE if streaming else AT_LEAST_ONCE
        if self.guarantee == EXACTLY_ONCE and not streaming:
            raise RaftLogOptionError(
                GUARANTEE, "'exactly_once' applies to streaming writes (df.writeStream) only:"
                " a batch job that Spark re-runs would publish again; batch writes are"
                " at_least_once")
        return self.guarantee

    @property
    def marker(self) -> str | None:
        """The topic whose partition 0 keys the exactly-once progress markers."""
        return self.marker_topic or self.topic


# -- entry points ----------------------------------------------------------------------------


def parse_source_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate the options of `spark.read` / `spark.readStream` (either kind)."""
    opts = _lower(options)
    _reject_unknown(opts, allowed=(BOOTSTRAP, *READ_OPTIONS), scope="reading",
                    other_scope=WRITE_OPTIONS)
    extra, isolation = _kafka_properties(opts, REJECTED_KAFKA_READ, reading=True)
    client = ClientSettings(_bootstrap(opts), extra, _api_timeout(opts))
    given = frozenset(canonical(k) for k in opts)

    starting = _bound(opts, "starting", allow_earliest=True, allow_latest=True)
    ending = _bound(opts, "ending", allow_earliest=False, allow_latest=True)
    strategy = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise RaftLogOptionError("startingOffsetsByTimestampStrategy",
                                 f"expected 'error' or 'latest', got {strategy!r}")
    max_offsets = None
    if "maxoffsetspertrigger" in opts:
        max_offsets = _positive_int(opts, "maxOffsetsPerTrigger")
    prefix = opts.get("groupidprefix", "spark-raftlog").strip()
    if not prefix:
        raise RaftLogOptionError("groupIdPrefix", "must not be empty")
    return SourceOptions(
        client=client,
        subscription=_subscription(opts),
        starting=starting,
        ending=ending,
        timestamp_strategy="latest" if strategy == "latest" else "error",
        max_offsets_per_trigger=max_offsets,
        fail_on_data_loss=_boolean(opts, "failOnDataLoss", default=True),
        include_headers=_boolean(opts, "includeHeaders", default=False),
        isolation_level=isolation,
        poll_timeout_ms=(_positive_int(opts, "kafkaConsumer.pollTimeoutMs")
                         if "kafkaconsumer.polltimeoutms" in opts else DEFAULT_POLL_TIMEOUT_MS),
        group_id_prefix=prefix,
        given=given,
    )


def check_batch_read(source: SourceOptions) -> None:
    """Spark's rules for `spark.read`: no stream-only options, no 'latest' start, no
    'earliest' end."""
    for name in STREAM_ONLY_READ_OPTIONS:
        if name in source.given:
            raise RaftLogOptionError(name, "applies to streaming queries only (spark.readStream)")
    start = source.starting
    if start is not None and start.kind == "latest":
        raise RaftLogOptionError(start.option, "'latest' is not allowed as the start of a batch"
                                 " query (it would read nothing); use 'earliest' or JSON")
    if start is not None and start.kind == "offsets" and LATEST in start.offset_map().values():
        raise RaftLogOptionError(start.option, "-1 (latest) is not allowed as a starting offset"
                                 " of a batch query")
    end = source.ending
    if end is not None and end.kind == "offsets" and EARLIEST in end.offset_map().values():
        raise RaftLogOptionError(end.option, "-2 (earliest) is not allowed as an ending offset")


def check_stream_read(source: SourceOptions) -> None:
    for name in BATCH_ONLY_READ_OPTIONS:
        if name in source.given:
            raise RaftLogOptionError(name, "applies to batch queries only (spark.read); a stream"
                                     " has no end")


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """Validate the options of `df.write` / `df.writeStream`."""
    opts = _lower(options)
    _reject_unknown(opts, allowed=(BOOTSTRAP, *WRITE_OPTIONS), scope="writing",
                    other_scope=READ_OPTIONS)
    extra, _ = _kafka_properties(opts, REJECTED_KAFKA_WRITE, reading=False)
    topic = opts.get("topic")
    if topic is not None:
        topic = topic.strip()
        _check_topic_name("topic", topic)
    guarantee: Guarantee | None = None
    if GUARANTEE.lower() in opts:
        raw = opts[GUARANTEE.lower()].strip().lower().replace("-", "_")
        if raw == EXACTLY_ONCE:
            guarantee = EXACTLY_ONCE
        elif raw == AT_LEAST_ONCE:
            guarantee = AT_LEAST_ONCE
        else:
            raise RaftLogOptionError(GUARANTEE, "expected 'exactly_once' or 'at_least_once',"
                                     f" got {opts[GUARANTEE.lower()]!r}")
    marker_topic = opts.get(MARKER_TOPIC.lower())
    if marker_topic is not None:
        marker_topic = marker_topic.strip()
        _check_topic_name(MARKER_TOPIC, marker_topic)
    return SinkOptions(ClientSettings(_bootstrap(opts), extra, _api_timeout(opts)), topic,
                       guarantee, marker_topic)


# -- helpers ---------------------------------------------------------------------------------


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _reject_unknown(opts: Mapping[str, str], *, allowed: tuple[str, ...], scope: str,
                    other_scope: tuple[str, ...]) -> None:
    allowed_lower = {a.lower() for a in allowed}
    other_lower = {o.lower() for o in other_scope}
    for key in opts:
        if key.startswith("kafka.") or key in allowed_lower:
            continue
        name = canonical(key)
        if name in UNSUPPORTED_OPTIONS:
            continue  # reported by the caller with its specific reason (below)
        if key == "path":
            raise RaftLogOptionError("path", "raftlog takes no path: name the topics with"
                                     " 'subscribe', 'subscribePattern' or 'assign' (reading) or"
                                     " 'topic' (writing)")
        if key in other_lower:
            raise RaftLogOptionError(name, f"is not an option for {scope}")
        hint = difflib.get_close_matches(key, sorted(allowed_lower), n=1, cutoff=0.6)
        suggestion = f"; did you mean '{canonical(hint[0])}'?" if hint else ""
        raise RaftLogOptionError(
            key, f"unknown option for {scope}{suggestion} Options for {scope}: "
            + ", ".join(allowed) + ", and any Kafka client property as kafka.<property>")
    for key in opts:
        name = canonical(key)
        if name in UNSUPPORTED_OPTIONS:
            raise RaftLogOptionError(name, "not supported by the raftlog connector: "
                                     + UNSUPPORTED_OPTIONS[name])


def _bootstrap(opts: Mapping[str, str]) -> str:
    value = opts.get(BOOTSTRAP)
    if value is None or not value.strip():
        raise RaftLogOptionError(BOOTSTRAP, "is required (host:port[,host:port...])")
    servers = [s.strip() for s in value.split(",") if s.strip()]
    for server in servers:
        host, sep, port = server.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise RaftLogOptionError(BOOTSTRAP, f"'{server}' is not host:port")
    return ",".join(servers)


def _api_timeout(opts: Mapping[str, str]) -> int:
    if "kafka.default.api.timeout.ms" in opts:
        return _positive_int(opts, "kafka.default.api.timeout.ms")
    return DEFAULT_API_TIMEOUT_MS


def _kafka_properties(
    opts: Mapping[str, str], rejected: Mapping[str, str], *, reading: bool,
) -> tuple[tuple[tuple[str, str], ...], Literal["read_committed", "read_uncommitted"]]:
    """kafka.* options become librdkafka properties (names are the same as Java's for
    everything the connector cares about; librdkafka rejects the ones it does not know, and
    the driver turns that into an option error before the query starts)."""
    extra: dict[str, str] = {}
    for key, value in opts.items():
        if not key.startswith("kafka."):
            continue
        prop = key[len("kafka."):]
        if prop in ("bootstrap.servers", "default.api.timeout.ms", "isolation.level"):
            continue
        if prop in rejected:
            raise RaftLogOptionError(f"kafka.{prop}", "not supported: " + rejected[prop])
        extra[prop] = value
    isolation: Literal["read_committed", "read_uncommitted"] = "read_committed"
    values = {name: opts[name.lower()].strip().lower()
              for name in ("isolation.level", "kafka.isolation.level") if name.lower() in opts}
    if values and not reading:
        raise RaftLogOptionError(next(iter(values)), "is not an option for writing")
    if len(set(values.values())) > 1:
        raise RaftLogOptionError("isolation.level", "'isolation.level' and"
                                 " 'kafka.isolation.level' disagree; set only one")
    for name, value in values.items():
        if value not in ("read_committed", "read_uncommitted"):
            raise RaftLogOptionError(name, "expected 'read_committed' or 'read_uncommitted',"
                                     f" got {value!r}")
        isolation = "read_committed" if value == "read_committed" else "read_uncommitted"
    # Spark's Kafka source takes the Java client's security names; librdkafka's differ.
    return tuple(sorted(librdkafka_properties(extra).items())), isolation


def _boolean(opts: Mapping[str, str], name: str, *, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise RaftLogOptionError(name, f"expected 'true' or 'false', got {raw!r}")
    return value == "true"


def _positive_int(opts: Mapping[str, str], name: str) -> int:
    raw = opts[name.lower()].strip()
    try:
        value = int(raw)
    except ValueError:
        raise RaftLogOptionError(name, f"expected a positive integer, got {raw!r}") from None
    if value <= 0:
        raise RaftLogOptionError(name, f"expected a positive integer, got {raw!r}")
    return value


def _check_topic_name(option: str, topic: str) -> None:
    if not _TOPIC_RE.fullmatch(topic) or topic in (".", ".."):
        raise RaftLogOptionError(option, f"{topic!r} is not a valid topic name")


def _subscription(opts: Mapping[str, str]) -> Subscription:
    given = [name for name in ("subscribe", "subscribePattern", "assign") if name.lower() in opts]
    if len(given) != 1:
        which = ", ".join(f"'{g}'" for g in given) if given else "none"
        raise RaftLogOptionError(
            "subscribe", "exactly one of 'subscribe', 'subscribePattern' or 'assign' must be"
            f" set (got {which})")
    name = given[0]
    raw = opts[name.lower()].strip()
    if name == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
        if not topics:
            raise RaftLogOptionError(name, "names no topic (expected topicA,topicB,...)")
        for topic in topics:
            _check_topic_name(name, topic)
        return Subscription("subscribe", topics=topics)
    if name == "subscribePattern":
        if not raw:
            raise RaftLogOptionError(name, "is empty (expected a regular expression)")
        try:
            re.compile(raw)
        except re.error as exc:
            raise RaftLogOptionError(name, f"invalid regular expression: {exc}") from None
        return Subscription("subscribePattern", pattern=raw)
    parsed = _json_object(name, raw, 'JSON such as {"topicA":[0,1],"topicB":[2,4]}')
    assigned: list[TopicPartition] = []
    for topic, partitions in parsed.items():
        _check_topic_name(name, topic)
        if not isinstance(partitions, list) or not partitions:
            raise RaftLogOptionError(name, f"topic {topic!r}: expected a non-empty list of"
                                     " partition numbers")
        for partition in partitions:
            if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
                raise RaftLogOptionError(name, f"topic {topic!r}: {partition!r} is not a"
                                         " partition number")
            assigned.append((topic, partition))
    return Subscription("assign", assigned=tuple(sorted(set(assigned))))


def _bound(opts: Mapping[str, str], which: str, *, allow_earliest: bool,
           allow_latest: bool) -> OffsetBound | None:
    """startingOffsets / startingTimestamp / startingOffsetsByTimestamp (or ending*).
    Spark applies a silent precedence when several are set; we refuse the ambiguity."""
    names = [f"{which}Offsets", f"{which}Timestamp", f"{which}OffsetsByTimestamp"]
    set_names = [n for n in names if n.lower() in opts]
    if len(set_names) > 1:
        raise RaftLogOptionError(set_names[0], "conflicts with "
                                 + ", ".join(f"'{n}'" for n in set_names[1:]) + "; set only one")
    if not set_names:
        return None
    name = set_names[0]
    raw = opts[name.lower()].strip()
    if name.endswith("Timestamp"):
        try:
            stamp = int(raw)
        except ValueError:
            raise RaftLogOptionError(name, f"expected milliseconds since the epoch, got {raw!r}"
                                     ) from None
        if stamp < 0:
            raise RaftLogOptionError(name, f"expected milliseconds since the epoch, got {raw!r}")
        return OffsetBound(name, "timestamp", timestamp=stamp)
    if name.endswith("ByTimestamp"):
        stamps = _partition_map(name, raw, 'JSON such as {"topicA":{"0":1700000000000}}',
                                minimum=0)
        return OffsetBound(name, "timestamps", offsets=tuple(sorted(stamps.items())))
    word = raw.lower()
    if word == "earliest":
        if not allow_earliest:
            raise RaftLogOptionError(name, "'earliest' is not allowed as an end; use 'latest'"
                                     " or JSON")
        return OffsetBound(name, "earliest")
    if word == "latest":
        if not allow_latest:
            raise RaftLogOptionError(name, "'latest' is not allowed here")
        return OffsetBound(name, "latest")
    offsets = _partition_map(name, raw, OFFSETS_HELP, minimum=EARLIEST)
    return OffsetBound(name, "offsets", offsets=tuple(sorted(offsets.items())))


def _json_object(option: str, raw: str, expected: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise RaftLogOptionError(
            option, f"malformed JSON ({exc.msg} at line {exc.lineno} column {exc.colno}):"
            f" {expected}, got {raw!r}") from None
    if not isinstance(value, dict) or not value:
        raise RaftLogOptionError(option, f"{expected}, got {raw!r}")
    return value


def _partition_map(option: str, raw: str, expected: str, *,
                   minimum: int) -> dict[TopicPartition, int]:
    parsed = _json_object(option, raw, expected)
    result: dict[TopicPartition, int] = {}
    for topic, partitions in parsed.items():
        _check_topic_name(option, topic)
        if not isinstance(partitions, dict) or not partitions:
            raise RaftLogOptionError(option, f"topic {topic!r}: {expected}")
        for key, value in partitions.items():
            if not (isinstance(key, str) and key.isdigit()):
                raise RaftLogOptionError(option, f"topic {topic!r}: partition {key!r} is not a"
                                         " partition number")
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise RaftLogOptionError(option, f"{topic}-{key}: {value!r} is not valid"
                                         f" ({expected})")
            result[(topic, int(key))] = value
    return result
