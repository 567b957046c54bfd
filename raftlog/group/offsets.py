"""Committed offsets of the consumer groups, as pure functions of the coordinator's groups:
Kafka's checks before a commit, the records that store it, reads, replay and expiry
(offsets.retention.ms, KIP-211).

The groups map and the pending writes are :class:`raftlog.group.coordinator.GroupCoordinator`'s;
it passes them in, so membership (which decides whether a commit is valid) and offsets share
one state without either owning the other's rules.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from raftlog.group.model import COMPLETING_REBALANCE, DEAD, EMPTY, Group, TopicPartition, is_fenced
from raftlog.group.records import GroupKey, OffsetKey, OffsetValue, encode_key, encode_offset_value
from raftlog.protocol.errors import ErrorCode

OFFSET_METADATA_MAX_BYTES = 4096  # offset.metadata.max.bytes

log = logging.getLogger(__name__)

Write = tuple[str, bytes, bytes | None]


def validate_commit(groups: Mapping[str, Group], group_id: str, generation: int,
                    member_id: str, instance_id: str | None, now_ms: int | None = None) -> int:
    """Kafka's checks before an OffsetCommit writes anything (classic protocol, < v9).
    A valid commit from a member counts as its heartbeat (given ``now_ms``), as in Kafka:
    a consumer busy committing is alive."""
    if not group_id:
        return ErrorCode.INVALID_GROUP_ID
    group = groups.get(group_id)
    if group is None:
        # Only a group that does not use Kafka's membership (generation -1) may start by
        # committing; anything else is a commit from a generation that no longer exists.
        return ErrorCode.NONE if generation < 0 else ErrorCode.ILLEGAL_GENERATION
    if group.state == DEAD:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if is_fenced(group, member_id, instance_id):
        return ErrorCode.FENCED_INSTANCE_ID
    if generation < 0 and group.state == EMPTY:
        return ErrorCode.NONE
    if group.state == COMPLETING_REBALANCE:
        return ErrorCode.REBALANCE_IN_PROGRESS
    if member_id not in group.members:
        return ErrorCode.UNKNOWN_MEMBER_ID
    if generation != group.generation:
        return ErrorCode.ILLEGAL_GENERATION
    if now_ms is not None:
        member = group.members[member_id]
        member.heartbeat_deadline_ms = max(member.heartbeat_deadline_ms,
                                           now_ms + member.session_timeout_ms)
    return ErrorCode.NONE


def commit_records(group_id: str, offsets: Mapping[TopicPartition, OffsetValue]
                   ) -> list[tuple[bytes, bytes | None]]:
    """The records that store ``offsets`` (written by the shell, then :func:`apply_commit`)."""
    return [(encode_key(OffsetKey(group_id, topic, partition)), encode_offset_value(value))
            for (topic, partition), value in offsets.items()]


def apply_commit(groups: dict[str, Group], group_id: str,
                 offsets: Mapping[TopicPartition, OffsetValue], now_ms: int) -> None:
    """``offsets`` are in the log: the group (created if it is new) now holds them."""
    group = groups.get(group_id)
    if group is None:
        group = groups[group_id] = Group(group_id, state_timestamp_ms=now_ms)
    group.offsets.update(offsets)


def committed(groups: Mapping[str, Group], group_id: str,
              partitions: Iterable[TopicPartition] | None
              ) -> dict[TopicPartition, OffsetValue | None]:
    """The group's committed offsets: all of them, or those of ``partitions`` (None if none)."""
    group = groups.get(group_id)
    offsets = {} if group is None else group.offsets
    if partitions is None:
        return dict(offsets)
    return {tp: offsets.get(tp) for tp in partitions}


def expire_offsets(groups: dict[str, Group], writes: list[Write], now_ms: int,
                   retention_ms: int, busy: Callable[[str], set[TopicPartition]]) -> int:
    """Kafka's offsets.retention.ms (KIP-211): the offsets of a group that had members and
    is now Empty expire ``retention_ms`` after it became Empty; those of a group that only
    ever committed (no membership, generation 0) expire ``retention_ms`` after their own
    commit. Groups with members keep every offset. ``busy(group)`` names partitions with a
    transactional commit in flight, which stay. An Empty group left without offsets is
    dropped (Dead). Tombstones for both go to ``writes``; returns how many offsets
    expired."""
    expired_total = 0
    for group in list(groups.values()):
        if group.state != EMPTY or group.members or group.pending:
            continue
        kept_back = busy(group.group_id)
        empty_since = group.state_timestamp_ms if group.generation > 0 else -1
        expired = [tp for tp, value in group.offsets.items() if tp not in kept_back
                   and now_ms - (value.commit_timestamp_ms if empty_since < 0
                                 else empty_since) >= retention_ms]
        for topic, partition in expired:
            del group.offsets[(topic, partition)]
            writes.append((group.group_id,
                           encode_key(OffsetKey(group.group_id, topic, partition)), None))
        expired_total += len(expired)
        if not group.offsets and not kept_back:
            log.info("group %s is dead: empty and without offsets", group.group_id)
            del groups[group.group_id]
            writes.append((group.group_id, encode_key(GroupKey(group.group_id)), None))
    return expired_total


def load_offset(groups: dict[str, Group], group_id: str, tp: TopicPartition,
                value: OffsetValue | None) -> None:
    """Replay of one offset record (None: a tombstone)."""
    group = groups.get(group_id)
    if value is None:
        if group is not None:
            group.offsets.pop(tp, None)
        return
    if group is None:
        group = groups[group_id] = Group(group_id)
    group.offsets[tp] = value


def offset_entry_error(partition_count: int | None, partition: int, metadata: str,
                       metadata_max_bytes: int) -> int:
    """The error for one partition of an OffsetCommit or TxnOffsetCommit (NONE if it may be
    stored): ``partition_count`` is the topic's, None when the topic does not exist."""
    if partition_count is None or not 0 <= partition < partition_count:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if len(metadata.encode()) > metadata_max_bytes:
        return ErrorCode.OFFSET_METADATA_TOO_LARGE
    return ErrorCode.NONE


def check_offset_entries(
    topics: Iterable[Any], known_topics: Mapping[str, Any], error: int,
    metadata_max_bytes: int, with_leader_epoch: bool, now_ms: int,
) -> tuple[list[tuple[TopicPartition, int]], dict[TopicPartition, OffsetValue]]:
    """The per-partition part of OffsetCommit and TxnOffsetCommit: every requested partition
    with its error code, in request order, and the offsets that may be stored. ``error`` (a
    group- or producer-level failure) applies to every partition; ``topics`` are the
    request's topics (``name``, ``partitions`` with ``partition_index``,
    ``committed_offset``, ``committed_leader_epoch``, ``committed_metadata``);
    ``known_topics`` is the metadata image's topics (each with ``partitions``)."""
    codes: list[tuple[TopicPartition, int]] = []
    valid: dict[TopicPartition, OffsetValue] = {}
    for topic in topics:
        known = known_topics.get(topic.name)
        count = None if known is None else len(known.partitions)
        for p in topic.partitions:
            tp = (topic.name, p.partition_index)
            metadata = p.committed_metadata or ""
            code = error or offset_entry_error(count, p.partition_index, metadata,
                                               metadata_max_bytes)
            codes.append((tp, code))
            if not code:
                epoch = p.committed_leader_epoch if with_leader_epoch else -1
                valid[tp] = OffsetValue(p.committed_offset, epoch, metadata, now_ms)
    return codes, valid
