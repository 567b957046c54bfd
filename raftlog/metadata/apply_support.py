"""What every part of the metadata state machine's apply shares: the rejection it raises
(caught by :func:`raftlog.metadata.state.apply_command`, which turns it into the result),
the copy-on-write helpers that keep images immutable, and the limits on record fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Final, NoReturn, TypeVar

from raftlog.metadata import errors
from raftlog.metadata.image import MetadataImage, TopicImage, frozen_mapping

INT32_MAX: Final = 2**31 - 1
INT64_MAX: Final = 2**63 - 1

# Kafka ConfigResource.Type codes.
RESOURCE_TYPE_TOPIC: Final = 2
RESOURCE_TYPE_BROKER: Final = 4


class Rejected(Exception):
    """A command the state machine refuses, with the error code its result carries."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        assert error_code != errors.NONE
        self.error_code = error_code
        self.message = message


def reject(error_code: int, message: str) -> NoReturn:
    """Refuse the command being applied: nothing it did so far is kept."""
    raise Rejected(error_code, message)


def check_node_id(node_id: int) -> None:
    """Node ids are Kafka int32s, never negative."""
    if not 0 <= node_id <= INT32_MAX:
        reject(errors.INVALID_REQUEST, f"node id {node_id} out of range")


def existing_topic(image: MetadataImage, name: str) -> TopicImage:
    """The topic ``name``, or a rejection with UNKNOWN_TOPIC_OR_PARTITION."""
    topic = image.topics.get(name)
    if topic is None:
        reject(errors.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
    return topic


def with_topic(image: MetadataImage, topic: TopicImage) -> MetadataImage:
    """``image`` with ``topic`` replaced (same name, same id)."""
    assert image.topics[topic.name].topic_id == topic.topic_id
    return dataclasses.replace(image, topics=with_item(image.topics, topic.name, topic))


K = TypeVar("K")
V = TypeVar("V")


def with_item(mapping: Mapping[K, V], key: K, value: V) -> Mapping[K, V]:
    """A frozen copy of ``mapping`` with ``key`` set."""
    copy = dict(mapping)
    copy[key] = value
    return frozen_mapping(copy)


def without_item(mapping: Mapping[K, V], key: K) -> Mapping[K, V]:
    """A frozen copy of ``mapping`` without ``key``."""
    copy = dict(mapping)
    del copy[key]
    return frozen_mapping(copy)
