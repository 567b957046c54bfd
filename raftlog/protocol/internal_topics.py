"""The internal topics: the one place that says which topics only the coordinators write.

Kafka's ``Topic.isInternal`` names ``__consumer_offsets`` and ``__transaction_state``. Their
records are the group and transaction coordinators' state, so a client may read them but not
produce to them, delete them, add partitions to them, delete their records or make them stop
being compacted (``raftlog.broker.apis``, ``raftlog.controller.core``). ``__cluster_metadata``
is not a partition topic here at all (the quorum's log), and its name is refused separately by
topic creation (``raftlog.metadata.state``).

Pure constants and functions, importable from every layer (no imports of raftlog itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = [
    "INTERNAL_TOPICS",
    "OFFSETS_TOPIC",
    "OFFSETS_TOPIC_PARTITIONS",
    "TRANSACTION_STATE_TOPIC",
    "UndecodableRecords",
    "cleanup_policy_refusal",
    "coordinator_partition",
    "is_internal_topic",
    "java_string_hash",
]

OFFSETS_TOPIC: Final = "__consumer_offsets"
TRANSACTION_STATE_TOPIC: Final = "__transaction_state"
INTERNAL_TOPICS: Final = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})
OFFSETS_TOPIC_PARTITIONS: Final = 10  # Kafka: offsets.topic.num.partitions=50


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: over UTF-16 code units, with int32 overflow."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinator_partition(key: str, partitions: int) -> int:
    """Kafka's ``Utils.abs(key.hashCode) % partitions``: the internal-topic partition, and so
    the coordinator, of a group id or a transactional id (``Utils.abs(MIN_VALUE)`` is 0)."""
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def is_internal_topic(name: str) -> bool:
    """Kafka's ``Topic.isInternal``: a topic only the coordinators append to."""
    return name in INTERNAL_TOPICS


def cleanup_policy_refusal(name: str, policy: str | None) -> str | None:
    """Why ``policy`` (the topic's effective ``cleanup.policy`` after a config change, None if
    unset) may not be given to topic ``name``; None if it may.

    The coordinators keep only the latest record per key and rebuild their state from the
    whole log, so an internal topic must stay exactly ``compact``: ``delete`` (also inside
    ``compact,delete``) would let retention drop a group's committed offsets or a live
    transaction's state."""
    if not is_internal_topic(name):
        return None
    values = {v.strip() for v in (policy or "").split(",") if v.strip()}
    if values == {"compact"}:
        return None
    return f"cleanup.policy of internal topic {name} must stay compact, not {policy!r}"


@dataclass
class UndecodableRecords:
    """What one coordinator load skipped: records it could not decode (an unknown version,
    truncated bytes, bad UTF-8, a field of the wrong type, a batch it cannot read).

    Kafka's coordinators skip a record of an unknown type or version while loading instead of
    failing the load; so do ours, and the load logs one line with the count and the first
    offending offset (:meth:`summary`) rather than one line per record, so a partition full of
    garbage cannot flood the log."""

    count: int = 0
    first_offset: int = -1
    first_reason: str = ""

    def add(self, offset: int, reason: str, records: int = 1) -> None:
        if self.count == 0:
            self.first_offset, self.first_reason = offset, reason
        self.count += records

    def summary(self, partition: str) -> str:
        return (f"skipped {self.count} undecodable record(s) of {partition}; the first, at "
                f"offset {self.first_offset}: {self.first_reason}")
