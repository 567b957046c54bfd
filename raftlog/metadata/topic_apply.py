"""Applying the topic and partition records: CreateTopic, DeleteTopic, CreatePartitions and
PartitionChange, with the checks that make them part of the replicated semantics (topic names,
replica assignments, partition epochs). Pure: image in, image out, or a rejection.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Final

from raftlog.config import validate_topic_config
from raftlog.metadata import errors
from raftlog.metadata.apply_support import (
    Rejected,
    existing_topic,
    reject,
    with_item,
    with_topic,
    without_item,
)
from raftlog.metadata.image import (
    NO_LEADER,
    MetadataImage,
    PartitionImage,
    TopicImage,
    frozen_mapping,
)
from raftlog.metadata.records import (
    CreatePartitions,
    CreateTopic,
    DeleteTopic,
    PartitionChange,
    PartitionChanges,
)

# Why a cap: every apply copies the topic's partition tuple, and a laptop broker has no use for
# more; Kafka has no hard limit but warns well below this.
PARTITIONS_PER_TOPIC_MAX: Final = 10_000
TOPIC_NAME_LENGTH_MAX: Final = 249
TOPIC_ID_BYTES: Final = 16
METADATA_TOPIC_NAME: Final = "__cluster_metadata"

_TOPIC_NAME_PATTERN: Final = re.compile(r"[a-zA-Z0-9._-]+")


def validate_topic_name(name: str) -> str | None:
    """Return why ``name`` is not a legal Kafka topic name, or None if it is."""
    if not name:
        return "topic name is empty"
    if name in (".", ".."):
        return f"topic name cannot be {name!r}"
    if len(name) > TOPIC_NAME_LENGTH_MAX:
        return f"topic name is longer than {TOPIC_NAME_LENGTH_MAX} characters"
    if _TOPIC_NAME_PATTERN.fullmatch(name) is None:
        return f"topic name {name!r} has characters outside [a-zA-Z0-9._-]"
    return None


def create_topic(
    image: MetadataImage, record: CreateTopic, offset: int
) -> tuple[MetadataImage, bytes]:
    """CreateTopic: a new topic with the recorded id, placement and configs."""
    _check_new_topic_name(image, record.name)
    if len(record.topic_id) != TOPIC_ID_BYTES or not any(record.topic_id):
        reject(errors.INVALID_REQUEST, "topic id must be 16 bytes and not all zero")
    if record.topic_id in image.topic_names_by_id:
        reject(errors.INVALID_REQUEST, f"topic id {record.topic_id.hex()} is already in use")
    if not 1 <= len(record.partitions) <= PARTITIONS_PER_TOPIC_MAX:
        reject(
            errors.INVALID_PARTITIONS,
            f"partition count {len(record.partitions)} outside [1, {PARTITIONS_PER_TOPIC_MAX}]",
        )
    _check_assignment(image, record.partitions, replication_factor=None)
    configs = checked_configs(record.configs)
    partitions = tuple(
        _new_partition(image, index, replicas) for index, replicas in enumerate(record.partitions)
    )
    topic = TopicImage(record.name, record.topic_id, partitions, frozen_mapping(configs), offset)
    next_image = dataclasses.replace(
        image,
        topics=with_item(image.topics, record.name, topic),
        topic_names_by_id=with_item(image.topic_names_by_id, record.topic_id, record.name),
    )
    return next_image, record.topic_id


def _check_new_topic_name(image: MetadataImage, name: str) -> None:
    problem = validate_topic_name(name)
    if problem is not None:
        reject(errors.INVALID_TOPIC_EXCEPTION, problem)
    if name == METADATA_TOPIC_NAME:
        reject(errors.INVALID_REQUEST, f"creation of internal topic {name} is prohibited")
    if name in image.topics:
        reject(errors.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
    # Kafka rejects names that differ only in '.' vs '_': they collide in metric names.
    collision_key = name.replace(".", "_")
    for existing in image.topics:
        if existing.replace(".", "_") == collision_key:
            reject(errors.INVALID_TOPIC_EXCEPTION, f"topic {name!r} collides with {existing!r}")


def _check_assignment(
    image: MetadataImage,
    assignment: tuple[tuple[int, ...], ...],
    replication_factor: int | None,
) -> None:
    """Check replica lists; ``replication_factor`` is the one they must all have, if known."""
    live_count = len(image.live_broker_ids())
    for index, replicas in enumerate(assignment):
        if not replicas:
            reject(errors.INVALID_REPLICATION_FACTOR, f"partition {index} has no replicas")
        if len(replicas) > live_count:
            reject(
                errors.INVALID_REPLICATION_FACTOR,
                f"replication factor {len(replicas)} is larger than the "
                f"{live_count} available broker(s)",
            )
        expected = len(assignment[0]) if replication_factor is None else replication_factor
        if len(replicas) != expected or len(set(replicas)) != len(replicas):
            reject(
                errors.INVALID_REPLICA_ASSIGNMENT,
                f"partition {index} replicas {list(replicas)}: duplicate broker or "
                f"replication factor other than {expected}",
            )
        _check_replicas_usable(image, index, replicas)


def _check_replicas_usable(image: MetadataImage, index: int, replicas: tuple[int, ...]) -> None:
    unknown = [r for r in replicas if r not in image.brokers]
    if unknown:
        reject(errors.INVALID_REPLICA_ASSIGNMENT, f"partition {index}: brokers {unknown} unknown")
    if all(image.brokers[r].fenced for r in replicas):
        reject(errors.INVALID_REPLICA_ASSIGNMENT, f"partition {index}: all replicas are fenced")


def _new_partition(image: MetadataImage, index: int, replicas: tuple[int, ...]) -> PartitionImage:
    # Replica order is preference order: the first unfenced replica leads.
    isr = tuple(r for r in replicas if not image.brokers[r].fenced)
    assert isr, "checked by _check_replicas_usable"
    return PartitionImage(index, replicas, isr, isr[0], leader_epoch=0, partition_epoch=0)


def checked_configs(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Topic configs as a dict, each key once and each value valid."""
    configs: dict[str, str] = {}
    for key, value in pairs:
        if key in configs:
            reject(errors.INVALID_CONFIG, f"duplicate config key {key!r}")
        problem = validate_topic_config(key, value)
        if problem is not None:
            reject(errors.INVALID_CONFIG, problem)
        configs[key] = value
    return configs


def delete_topic(image: MetadataImage, record: DeleteTopic) -> tuple[MetadataImage, bytes]:
    """DeleteTopic: the named topic goes, if its id is the recorded one."""
    topic = existing_topic(image, record.name)
    if topic.topic_id != record.topic_id:
        reject(errors.UNKNOWN_TOPIC_ID, f"topic {record.name!r} has a different topic id")
    next_image = dataclasses.replace(
        image,
        topics=without_item(image.topics, record.name),
        topic_names_by_id=without_item(image.topic_names_by_id, topic.topic_id),
    )
    return next_image, topic.topic_id


def create_partitions(
    image: MetadataImage, record: CreatePartitions, offset: int
) -> tuple[MetadataImage, int]:
    """CreatePartitions: new partitions appended with the topic's replication factor."""
    topic = existing_topic(image, record.name)
    total = len(topic.partitions) + len(record.new_partitions)
    if not record.new_partitions or total > PARTITIONS_PER_TOPIC_MAX:
        reject(
            errors.INVALID_PARTITIONS,
            f"topic has {len(topic.partitions)} partitions; cannot grow to {total}",
        )
    _check_assignment(image, record.new_partitions, len(topic.partitions[0].replicas))
    first = len(topic.partitions)
    added = tuple(
        _new_partition(image, first + i, replicas)
        for i, replicas in enumerate(record.new_partitions)
    )
    changed = dataclasses.replace(topic, partitions=topic.partitions + added, version=offset)
    return with_topic(image, changed), total


def partition_change(
    image: MetadataImage, record: PartitionChange, offset: int
) -> tuple[MetadataImage, int]:
    """PartitionChange: a new leader and ISR, under the partition-epoch compare-and-set."""
    topic = existing_topic(image, record.topic)
    current = image.partition(record.topic, record.partition)
    if current is None:
        reject(errors.UNKNOWN_TOPIC_OR_PARTITION, f"{record.topic}-{record.partition} unknown")
    _check_partition_shape(current, record)
    _check_partition_eligibility(image, current, record)
    _check_partition_epochs(current, record)
    changed = dataclasses.replace(
        current,
        leader=record.leader,
        isr=record.isr,
        leader_epoch=record.leader_epoch,
        partition_epoch=record.partition_epoch,
    )
    partitions = list(topic.partitions)
    partitions[record.partition] = changed
    next_topic = dataclasses.replace(topic, partitions=tuple(partitions), version=offset)
    return with_topic(image, next_topic), record.partition_epoch


def partition_changes(
    image: MetadataImage, record: PartitionChanges, offset: int
) -> tuple[MetadataImage, bytes]:
    """PartitionChanges: each change as PartitionChange would apply it, in order; a rejected
    one is skipped. The value holds each change's error code (0: applied), two bytes each."""
    codes = bytearray()
    for change in record.changes:
        try:
            image, _ = partition_change(image, change, offset)
        except Rejected as rejection:
            codes += rejection.error_code.to_bytes(2, "big", signed=True)
            continue
        codes += bytes(2)
    return image, bytes(codes)


def _check_partition_shape(current: PartitionImage, record: PartitionChange) -> None:
    if len(set(record.isr)) != len(record.isr) or not set(record.isr) <= set(current.replicas):
        reject(errors.INVALID_REQUEST, f"ISR {list(record.isr)} is not a subset of replicas")
    if record.leader != NO_LEADER and record.leader not in record.isr:
        reject(errors.INVALID_REQUEST, f"leader {record.leader} is not in the ISR")


def _check_partition_eligibility(
    image: MetadataImage, current: PartitionImage, record: PartitionChange
) -> None:
    # As in KRaft: a new leader, and replicas joining the ISR, must be live brokers. Members
    # already in the ISR may stay while fenced, so ISR shrinks can be applied one at a time.
    joining = [r for r in record.isr if r not in current.isr]
    if record.leader != NO_LEADER and record.leader != current.leader:
        joining.append(record.leader)
    ineligible = sorted({r for r in joining if r not in image.brokers or image.brokers[r].fenced})
    if ineligible:
        reject(errors.INELIGIBLE_REPLICA, f"brokers {ineligible} are fenced or not registered")


def _check_partition_epochs(current: PartitionImage, record: PartitionChange) -> None:
    if record.partition_epoch != current.partition_epoch + 1:
        reject(
            errors.INVALID_UPDATE_VERSION,
            f"partition epoch {record.partition_epoch}, expected {current.partition_epoch + 1}",
        )
    if record.leader_epoch < current.leader_epoch:
        reject(
            errors.FENCED_LEADER_EPOCH,
            f"leader epoch {record.leader_epoch} < current {current.leader_epoch}",
        )
    if record.leader != current.leader and record.leader_epoch == current.leader_epoch:
        reject(errors.INVALID_REQUEST, "leader changed without a new leader epoch")
