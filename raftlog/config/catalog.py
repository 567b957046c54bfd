"""The catalog of properties raftlog understands, with their defaults, and typed access to a
node's merged properties that falls back to those defaults.

Defaults are Kafka's, except where a laptop wants something else (listeners on 127.0.0.1, no
initial rebalance delay); each such case says why. Unknown properties are logged at WARNING and
ignored, as Kafka does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final

from raftlog.config.authorizer import AUTHORIZER_PROPERTY_DEFAULTS
from raftlog.config.properties import (
    LONG_MAX,
    LONG_MIN,
    ConfigError,
    parse_bool,
    parse_choice,
    parse_int,
)
from raftlog.config.sasl import SASL_PROPERTY_DEFAULTS

logger = logging.getLogger(__name__)

# log.retention.check.interval.ms: how often retention (and the producer-state snapshot) runs.
# Why 30 s and not Kafka's 300000: raftlog always ran it every 30 s, and a laptop deployment
# with a short retention.ms should see old segments go while someone is still watching.
LOG_RETENTION_CHECK_INTERVAL_MS_DEFAULT: Final = 30_000

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
    "security.inter.broker.protocol": None,  # Kafka's alternative to the listener name
    # TLS listeners (raftlog.config.tls), Kafka's names; each may be set per listener as
    # listener.name.<name>.ssl.*. Why PEM by default (Kafka's is JKS): PEM is all raftlog reads.
    "ssl.keystore.type": "PEM",
    "ssl.keystore.location": None,
    "ssl.keystore.certificate.chain": None,
    "ssl.keystore.key": None,
    "ssl.key.password": None,
    "ssl.truststore.type": "PEM",
    "ssl.truststore.location": None,
    "ssl.truststore.certificates": None,
    "ssl.client.auth": "none",
    "ssl.enabled.protocols": "TLSv1.2,TLSv1.3",
    "ssl.cipher.suites": None,
    "ssl.principal.mapping.rules": "DEFAULT",
    # The node's own TLS connections check the peer's host name (Kafka's default, https).
    "ssl.endpoint.identification.algorithm": "https",
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
    # raftlog's own: the background CRC check of segments loaded from disk (bytes a second,
    # 0 = off; raftlog.partition.scrubber, docs/operations.md "Corruption at rest").
    "log.scrub.bytes.per.second": str(16 << 20),
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
    # Client quotas (raftlog.server.quota_core): Kafka's sample windows of the rates.
    "quota.window.num": "11",
    "quota.window.size.seconds": "1",
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
    # The Prometheus metrics and health endpoint (docs/metrics.md): http://HOST:PORT, off when
    # absent (port 0 picks a free port); and the two opt-ins into per-partition series.
    "metrics.listener": None,
    "metrics.partition.detail.enable": "false",
    # raftlog's own: per-stage timing of the replication path, one summary line per interval
    # (raftlog.partition.append_trace). Off: it is for finding latency, not for production.
    "trace.produce.enable": "false",
    "trace.produce.summary.interval.ms": "10000",
    "metrics.consumer.group.lag.partition.enable": "false",
    # SASL for clients (raftlog.config.sasl): sasl.enabled.mechanisms, sasl.jaas.config,
    # connections.max.reauth.ms.
    **SASL_PROPERTY_DEFAULTS,
    **AUTHORIZER_PROPERTY_DEFAULTS,
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


def warn_unknown(props: Mapping[str, str]) -> None:
    """Log each property outside the catalog (INFO for Kafka's no-op ones, WARNING else)."""
    for key in sorted(props):
        if key in ACCEPTED_WITHOUT_EFFECT:
            logger.info("property %s is accepted for Kafka compatibility and has no effect", key)
        elif key not in DEFAULTS and not _is_listener_override(key):
            logger.warning("unknown property %s ignored", key)


def _is_listener_override(key: str) -> bool:
    """``listener.name.<name>.<property>``: a catalog property set for one listener (the
    ``ssl.*`` ones), or a mechanism's ``<mechanism>.sasl.jaas.config`` (Kafka's form)."""
    parts = key.split(".", 3)
    if len(parts) != 4 or parts[:2] != ["listener", "name"]:
        return False
    return parts[3] in DEFAULTS or parts[3].endswith(".sasl.jaas.config")


class Properties:
    """Typed access to the merged properties, falling back to ``DEFAULTS``."""

    def __init__(self, props: Mapping[str, str]) -> None:
        self._props = props

    @property
    def given(self) -> Mapping[str, str]:
        """The properties as given, without defaults (for per-listener names)."""
        return self._props

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
