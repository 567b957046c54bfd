"""Offsets as Spark checkpoints them, and the arithmetic on them.

The source offset is Spark's Kafka JSON shape, {"topic": {"partition": next_offset}}. Spark's
Python runner `json.dumps` the dict we return and the JVM compares those *strings* to decide
whether a trigger has new data, so the dict must be canonical: topics sorted by name,
partitions sorted numerically, keys str, values int. Two equal maps in different key orders
would otherwise look like progress and cause empty micro-batches.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import InputPartition

from spark_connector.options import TopicPartition

OffsetJson = dict[str, dict[str, int]]


def to_json(offsets: Mapping[TopicPartition, int]) -> OffsetJson:
    """The canonical JSON-able form (see the module docstring)."""
    result: OffsetJson = {}
    for topic, partition in sorted(offsets):
        result.setdefault(topic, {})[str(partition)] = int(offsets[(topic, partition)])
    return result


def from_json(value: Mapping[str, Any] | None) -> dict[TopicPartition, int]:
    """Back from what Spark hands us (keys come back as str, order as checkpointed)."""
    result: dict[TopicPartition, int] = {}
    for topic, partitions in (value or {}).items():
        for partition, offset in partitions.items():
            result[(str(topic), int(partition))] = int(offset)
    return result


def describe(tps: Iterable[TopicPartition]) -> str:
    return ", ".join(f"{t}-{p}" for t, p in sorted(tps))


@dataclass
class OffsetRange(InputPartition):
    """One Spark input partition: offsets [start, end) of one Kafka partition. It is pickled to
    an executor, so it carries everything read() needs besides the reader's own settings."""

    topic: str
    partition: int
    start: int
    end: int


def ranges(start: Mapping[TopicPartition, int],
           end: Mapping[TopicPartition, int]) -> list[OffsetRange]:
    """One range per partition with something to read. A partition absent from `start` is new
    since the last batch and is read from offset 0 (the executor reports data loss if the
    log no longer starts there, as Spark's Kafka source does)."""
    return [OffsetRange(t, p, start.get((t, p), 0), until)
            for (t, p), until in sorted(end.items()) if until > start.get((t, p), 0)]


def rate_limit(limit: int, start: Mapping[TopicPartition, int],
               latest: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
    """Spark's maxOffsetsPerTrigger split: each partition gets a share of `limit` in
    proportion to its backlog (a share below 1 rounds up, above 1 rounds down), so the
    slowest partition is not starved and the total stays close to the limit."""
    backlog = {tp: end - start.get(tp, 0) for tp, end in latest.items()
               if end > start.get(tp, 0)}
    total = sum(backlog.values())
    if total <= limit:
        return dict(latest)
    result: dict[TopicPartition, int] = {}
    for tp, end in latest.items():
        begin = start.get(tp, 0)
        size = backlog.get(tp, 0)
        if size <= 0:
            result[tp] = end
            continue
        share = limit * size / total
        step = math.ceil(share) if share < 1 else math.floor(share)
        result[tp] = min(end, begin + step)
    return result
