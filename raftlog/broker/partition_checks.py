"""Checks that every partition-level request makes of the partition it names: whether it is
served here at all, and whether the client's leader epoch is the partition's (KIP-320)."""

from __future__ import annotations

from raftlog.metadata.image import MetadataImage
from raftlog.protocol.errors import ErrorCode


def missing_partition_error(image: MetadataImage, topic: str, index: int) -> ErrorCode:
    """A partition not open here: NOT_LEADER_OR_FOLLOWER when the image knows it (another
    broker hosts it; the client refreshes its metadata), else UNKNOWN_TOPIC_OR_PARTITION."""
    known = image.topics.get(topic)
    if known is not None and 0 <= index < len(known.partitions):
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def check_leader_epoch(requested: int, current: int) -> int:
    """KIP-320: a client that knows a newer epoch than ours, or an older one, is told so."""
    if requested < 0 or requested == current:
        return 0
    return ErrorCode.FENCED_LEADER_EPOCH if requested < current else ErrorCode.UNKNOWN_LEADER_EPOCH
