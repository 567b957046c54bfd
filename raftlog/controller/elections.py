"""The pure election rules: the leader and ISR each partition should have, given the brokers
that are usable now, and the PartitionChange records that get it there. The rules are in
:mod:`raftlog.controller.core`'s docstring; a controller reconciles with them on every tick.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Final

from raftlog.metadata.image import NO_LEADER, MetadataImage, PartitionImage
from raftlog.metadata.records import PartitionChange

UNCLEAN_ELECTION_CONFIG: Final = "unclean.leader.election.enable"


def all_partitions(image: MetadataImage) -> Iterable[PartitionImage]:
    """Every partition of every topic of ``image``."""
    for topic in image.topics.values():
        yield from topic.partitions


def plan_partition_changes(
    image: MetadataImage,
    usable: frozenset[int],
    *,
    preferred: bool = False,
    default_unclean: bool = False,
) -> list[PartitionChange]:
    """The PartitionChange records that bring every partition in line with ``usable``.

    Topics in name order, partitions in index order, so the result is deterministic.
    """
    changes = []
    for name in sorted(image.topics):
        topic = image.topics[name]
        unclean = _unclean_enabled(topic.configs.get(UNCLEAN_ELECTION_CONFIG), default_unclean)
        for partition in topic.partitions:
            change = plan_partition(name, partition, usable, preferred=preferred, unclean=unclean)
            if change is not None:
                changes.append(change)
    return changes


def _unclean_enabled(value: str | None, default: bool) -> bool:
    if value is None:
        return default
    return value.strip().lower() == "true"


def plan_partition(
    topic: str,
    partition: PartitionImage,
    usable: frozenset[int],
    *,
    preferred: bool = False,
    unclean: bool = False,
) -> PartitionChange | None:
    """The change ``partition`` needs given the usable brokers, or None if it is fine."""
    leader, isr = elect(partition, usable, preferred=preferred, unclean=unclean)
    if leader == partition.leader and isr == partition.isr:
        return None
    leader_epoch = partition.leader_epoch + (1 if leader != partition.leader else 0)
    return PartitionChange(
        topic, partition.partition, leader, isr, leader_epoch, partition.partition_epoch + 1
    )


def elect(
    partition: PartitionImage,
    usable: frozenset[int],
    *,
    preferred: bool = False,
    unclean: bool = False,
) -> tuple[int, tuple[int, ...]]:
    """The leader and ISR ``partition`` should have. See the module docstring for the rules."""
    isr = tuple(r for r in partition.isr if r in usable) or partition.isr
    leader = partition.leader
    if leader == NO_LEADER or leader not in usable or leader not in isr:
        leader = _first(partition.replicas, lambda r: r in isr and r in usable)
        if leader == NO_LEADER and unclean:
            leader = _first(partition.replicas, lambda r: r in usable)
            if leader != NO_LEADER:
                isr = (leader,)  # Unclean: the new leader's log is the truth now.
    elif preferred:
        first = partition.replicas[0]
        if first != leader and first in isr and first in usable:
            leader = first
    return leader, isr


def _first(replicas: Sequence[int], wanted: Callable[[int], bool]) -> int:
    for replica in replicas:
        if wanted(replica):
            return replica
    return NO_LEADER
