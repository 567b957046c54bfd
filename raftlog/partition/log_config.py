"""LogConfig: the per-topic settings of a partition's log (Kafka's topic configs).

Apart from the log itself because the partition manager, the cleaner and the topic-config
code read and build it without touching a log.
"""

from __future__ import annotations

from dataclasses import dataclass

from raftlog.partition.batch import RECORD_BATCH_OVERHEAD
from raftlog.partition.index import INT32_MAX

__all__ = ["CREATE_TIME", "LOG_APPEND_TIME", "LogConfig"]

CREATE_TIME = "CreateTime"
LOG_APPEND_TIME = "LogAppendTime"
_DAY_MS = 24 * 60 * 60 * 1000


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Per-topic log settings: Kafka's names in snake_case, units last.

    ``flush_messages=None`` means fsync before every acknowledgement (raftlog's default, and
    stricter than Kafka's, which leaves flushing to the OS).
    """

    segment_bytes: int = 1 << 30  # segment.bytes / log.segment.bytes
    segment_ms: int = 7 * _DAY_MS  # segment.ms / log.roll.ms
    retention_ms: int = 7 * _DAY_MS  # retention.ms; -1 = unlimited
    retention_bytes: int = -1  # retention.bytes; -1 = unlimited
    index_interval_bytes: int = 4096  # index.interval.bytes
    flush_messages: int | None = None  # flush.messages
    flush_ms: int | None = None  # flush.ms
    # message.timestamp.type; a plain str because topic configs arrive as strings.
    message_timestamp_type: str = CREATE_TIME
    max_message_bytes: int = 1048588  # max.message.bytes: the largest batch accepted
    # cleanup.policy: "delete", "compact" or "compact,delete". Time and size retention apply
    # only with "delete" (Kafka), compaction only with "compact" (``cleaner_service``).
    cleanup_policy: str = "delete"
    delete_retention_ms: int = _DAY_MS  # delete.retention.ms: how long tombstones stay
    min_cleanable_dirty_ratio: float = 0.5  # min.cleanable.dirty.ratio
    min_compaction_lag_ms: int = 0  # min.compaction.lag.ms

    @property
    def deletes(self) -> bool:
        """Whether time/size retention deletes segments (``delete`` in cleanup.policy)."""
        return "delete" in {p.strip() for p in self.cleanup_policy.split(",")}

    @property
    def compacts(self) -> bool:
        """Whether the cleaner compacts this log (``compact`` in cleanup.policy)."""
        return "compact" in {p.strip() for p in self.cleanup_policy.split(",")}

    def __post_init__(self) -> None:
        # Positions in the offset index are int32, so a segment must fit in one.
        _require(RECORD_BATCH_OVERHEAD <= self.segment_bytes <= INT32_MAX, "segment_bytes")
        _require(self.segment_ms > 0, "segment_ms")
        _require(self.retention_ms >= -1, "retention_ms")
        _require(self.retention_bytes >= -1, "retention_bytes")
        _require(self.index_interval_bytes >= 0, "index_interval_bytes")
        _require(self.flush_messages is None or self.flush_messages >= 1, "flush_messages")
        _require(self.flush_ms is None or self.flush_ms >= 0, "flush_ms")
        timestamp_types = (CREATE_TIME, LOG_APPEND_TIME)
        _require(self.message_timestamp_type in timestamp_types, "message_timestamp_type")
        _require(self.max_message_bytes >= RECORD_BATCH_OVERHEAD, "max_message_bytes")
        _require(self.delete_retention_ms >= 0, "delete_retention_ms")
        _require(0.0 <= self.min_cleanable_dirty_ratio <= 1.0, "min_cleanable_dirty_ratio")
        _require(self.min_compaction_lag_ms >= 0, "min_compaction_lag_ms")


def _require(condition: bool, name: str) -> None:
    if not condition:
        raise ValueError(f"invalid LogConfig.{name}")
