"""The metadata state machine: pure, deterministic, applied in log order.

House rules (the next milestone runs this on every voter of a Raft quorum, and they must agree):

1. ``apply`` is a function of (image, command, offset) only: no I/O, clocks, randomness, or
   iteration over unordered sets. Topic ids, incarnation ids and placements come in the record.
2. Validation happens here, in log order, not only at the proposer: two proposers racing on stale
   images cannot both win, and a deposed controller is fenced by ``controller_term``.
3. A rejected command changes nothing except the image version (the offset is consumed) and the
   request-id window (so a retry gets the same answer).
4. Applying never mutates an image; it builds a new one. Readers hold whichever image they got.

The validation rules are part of the replicated semantics: changing them changes what an old log
replays to, so such a change must come with a metadata version bump, never silently.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, NoReturn, TypeVar, assert_never

from raftlog.config import (
    BROKER_DYNAMIC_CONFIG_KEYS,
    TOPIC_CONFIG_KEYS,
    validate_broker_dynamic_config,
    validate_topic_config,
)
from raftlog.metadata import _codec, errors
from raftlog.metadata._codec import CodecError
from raftlog.metadata.image import (
    NO_LEADER,
    BrokerImage,
    ConfigResourceImage,
    MetadataImage,
    PartitionImage,
    TopicImage,
    check_image,
    frozen_mapping,
    image_from_bytes,
    image_to_bytes,
)
from raftlog.metadata.records import (
    AlterConfigs,
    BecomeController,
    Command,
    CreatePartitions,
    CreateTopic,
    DeleteTopic,
    FenceBroker,
    PartitionChange,
    ProducerIdBlock,
    Record,
    RegisterBroker,
    UnfenceBroker,
)

__all__ = [
    "ApplyResult",
    "MetadataImage",
    "MetadataStateMachine",
    "apply_command",
    "image_from_bytes",
    "image_to_bytes",
    "validate_topic_name",
]

REQUEST_WINDOW_MAX: Final = 10_000
# Why a cap: every apply copies the topic's partition tuple, and a laptop broker has no use for
# more; Kafka has no hard limit but warns well below this.
PARTITIONS_PER_TOPIC_MAX: Final = 10_000
TOPIC_NAME_LENGTH_MAX: Final = 249
TOPIC_ID_BYTES: Final = 16
PRODUCER_ID_BLOCK_SIZE_MAX: Final = 1 << 20
INT32_MAX: Final = 2**31 - 1
INT64_MAX: Final = 2**63 - 1
HOST_LENGTH_MAX: Final = 255
PORT_MAX: Final = 65535
METADATA_TOPIC_NAME: Final = "__cluster_metadata"

# Kafka ConfigResource.Type codes.
RESOURCE_TYPE_TOPIC: Final = 2
RESOURCE_TYPE_BROKER: Final = 4

_TOPIC_NAME_PATTERN: Final = re.compile(r"[a-zA-Z0-9._-]+")
_SNAPSHOT_KIND: Final = "raftlog.metadata.state"
_SNAPSHOT_FORMAT_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What applying one command did.

    Attributes:
        error_code: ``errors.NONE`` or the Kafka (or internal, >= 1000) error code.
        message: Why the command was rejected, for the client's error message.
        value: Record-specific result: the topic id for CreateTopic/DeleteTopic, the partition
            count for CreatePartitions, the broker epoch for RegisterBroker, the first id of
            the block for ProducerIdBlock, the term for BecomeController, the partition epoch
            for PartitionChange; None otherwise.
    """

    error_code: int
    message: str | None = None
    value: int | bytes | str | None = None

    @property
    def ok(self) -> bool:
        """Whether the command was applied."""
        return self.error_code == errors.NONE


class _Rejected(Exception):
    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        assert error_code != errors.NONE
        self.error_code = error_code
        self.message = message


def _reject(error_code: int, message: str) -> NoReturn:
    raise _Rejected(error_code, message)


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


# --- Applying one command -------------------------------------------------------------------


def apply_command(
    image: MetadataImage, command: Command, offset: int
) -> tuple[MetadataImage, ApplyResult]:
    """Apply ``command`` at log ``offset`` to ``image``; pure.

    Returns:
        The next image (its ``version`` is ``offset`` whether or not the command was accepted)
        and the result. Request-id deduplication is :class:`MetadataStateMachine`'s job.
    """
    assert offset > image.version, (offset, image.version)
    try:
        _check_controller_term(image, command)
        _check_expected_version(image, command)
        next_image, value = _apply_record(image, command.record, offset)
    except _Rejected as rejection:
        result = ApplyResult(rejection.error_code, rejection.message)
        return dataclasses.replace(image, version=offset), result
    return dataclasses.replace(next_image, version=offset), ApplyResult(errors.NONE, None, value)


def _apply_record(
    image: MetadataImage, record: Record, offset: int
) -> tuple[MetadataImage, int | bytes | str | None]:
    match record:
        case RegisterBroker():
            return _register_broker(image, record, offset)
        case FenceBroker():
            return _set_fenced(image, record.node_id, True, offset)
        case UnfenceBroker():
            return _set_fenced(image, record.node_id, False, offset)
        case CreateTopic():
            return _create_topic(image, record, offset)
        case DeleteTopic():
            return _delete_topic(image, record)
        case CreatePartitions():
            return _create_partitions(image, record, offset)
        case AlterConfigs():
            return _alter_configs(image, record, offset)
        case PartitionChange():
            return _partition_change(image, record, offset)
        case ProducerIdBlock():
            return _producer_id_block(image, record)
        case BecomeController():
            return _become_controller(image, record)
        case _:
            assert_never(record)


def _check_controller_term(image: MetadataImage, command: Command) -> None:
    record = command.record
    if isinstance(record, BecomeController):
        _check_become_controller(image, command, record)
        return
    # Before the first BecomeController there is no term to fence against.
    if image.controller_term > 0 and command.controller_term != image.controller_term:
        _reject(
            errors.NOT_CONTROLLER,
            f"command from controller term {command.controller_term}, "
            f"current term is {image.controller_term}",
        )


def _check_become_controller(
    image: MetadataImage, command: Command, record: BecomeController
) -> None:
    if record.term < 1 or command.controller_term != record.term:
        _reject(errors.INVALID_REQUEST, "BecomeController needs term >= 1 in record and envelope")
    if record.term < image.controller_term:
        _reject(errors.NOT_CONTROLLER, f"term {record.term} < current {image.controller_term}")
    if record.term == image.controller_term and record.node_id != image.controller_node_id:
        _reject(
            errors.NOT_CONTROLLER,
            f"term {record.term} already belongs to node {image.controller_node_id}",
        )


def _check_expected_version(image: MetadataImage, command: Command) -> None:
    expected = command.expected_version
    if expected is None:
        return
    current = _resource_version(image, command.record)
    if current > expected:
        _reject(
            errors.STALE_METADATA_VERSION,
            f"resource changed at version {current}, after the expected version {expected}",
        )


def _resource_version(image: MetadataImage, record: Record) -> int:
    """Offset of the last change to the resource ``record`` targets; -1 if it does not exist.

    BecomeController (fenced by term) and ProducerIdBlock (its own CAS on ``next_block_start``)
    have no per-resource version.
    """
    match record:
        case RegisterBroker() | FenceBroker() | UnfenceBroker():
            broker = image.brokers.get(record.node_id)
            return -1 if broker is None else broker.version
        case CreateTopic() | DeleteTopic() | CreatePartitions():
            return _topic_version(image, record.name)
        case PartitionChange():
            return _topic_version(image, record.topic)
        case AlterConfigs() if record.resource_type == RESOURCE_TYPE_TOPIC:
            return _topic_version(image, record.resource_name)
        case AlterConfigs():
            resource = image.broker_configs.get(record.resource_name)
            return -1 if resource is None else resource.version
        case ProducerIdBlock() | BecomeController():
            return -1
        case _:
            assert_never(record)


def _topic_version(image: MetadataImage, name: str) -> int:
    topic = image.topics.get(name)
    return -1 if topic is None else topic.version


# --- Brokers and the controller -------------------------------------------------------------


def _register_broker(
    image: MetadataImage, record: RegisterBroker, offset: int
) -> tuple[MetadataImage, int]:
    _check_node_id(record.node_id)
    if not 0 < len(record.host) <= HOST_LENGTH_MAX or not 1 <= record.port <= PORT_MAX:
        _reject(errors.INVALID_REQUEST, f"invalid endpoint {record.host!r}:{record.port}")
    if record.rack == "" or not record.incarnation_id:
        _reject(errors.INVALID_REQUEST, "rack must be None or non-empty; incarnation_id non-empty")
    existing = image.brokers.get(record.node_id)
    if existing is not None and existing.incarnation_id == record.incarnation_id:
        # A retried registration of the same incarnation is a no-op, like Kafka's.
        if (existing.host, existing.port, existing.rack) != (record.host, record.port, record.rack):
            _reject(errors.INVALID_REQUEST, "incarnation re-registered with a different endpoint")
        return image, existing.epoch
    # A new incarnation starts fenced: it must catch up before it leads anything.
    broker = BrokerImage(
        record.node_id, record.host, record.port, record.rack, record.incarnation_id,
        fenced=True, epoch=offset, version=offset,
    )  # fmt: skip
    brokers = _with_item(image.brokers, record.node_id, broker)
    return dataclasses.replace(image, brokers=brokers), offset


def _set_fenced(
    image: MetadataImage, node_id: int, fenced: bool, offset: int
) -> tuple[MetadataImage, None]:
    broker = image.brokers.get(node_id)
    if broker is None:
        _reject(errors.BROKER_ID_NOT_REGISTERED, f"broker {node_id} is not registered")
    if broker.fenced == fenced:
        return image, None
    changed = dataclasses.replace(broker, fenced=fenced, version=offset)
    return dataclasses.replace(image, brokers=_with_item(image.brokers, node_id, changed)), None


def _become_controller(image: MetadataImage, record: BecomeController) -> tuple[MetadataImage, int]:
    _check_node_id(record.node_id)
    next_image = dataclasses.replace(
        image, controller_term=record.term, controller_node_id=record.node_id
    )
    return next_image, record.term


def _producer_id_block(image: MetadataImage, record: ProducerIdBlock) -> tuple[MetadataImage, int]:
    if record.node_id not in image.brokers:
        _reject(errors.BROKER_ID_NOT_REGISTERED, f"broker {record.node_id} is not registered")
    if not 1 <= record.block_size <= PRODUCER_ID_BLOCK_SIZE_MAX:
        _reject(errors.INVALID_REQUEST, f"block size {record.block_size} out of range")
    if record.next_block_start != image.next_producer_id:
        _reject(
            errors.STALE_METADATA_VERSION,
            f"block starts at {record.next_block_start}, next free id is {image.next_producer_id}",
        )
    next_producer_id = record.next_block_start + record.block_size
    if next_producer_id > INT64_MAX:
        _reject(errors.INVALID_REQUEST, "producer ids exhausted")
    return dataclasses.replace(image, next_producer_id=next_producer_id), record.next_block_start


def _check_node_id(node_id: int) -> None:
    if not 0 <= node_id <= INT32_MAX:
        _reject(errors.INVALID_REQUEST, f"node id {node_id} out of range")


# --- Topics ---------------------------------------------------------------------------------


def _create_topic(
    image: MetadataImage, record: CreateTopic, offset: int
) -> tuple[MetadataImage, bytes]:
    _check_new_topic_name(image, record.name)
    if len(record.topic_id) != TOPIC_ID_BYTES or not any(record.topic_id):
        _reject(errors.INVALID_REQUEST, "topic id must be 16 bytes and not all zero")
    if record.topic_id in image.topic_names_by_id:
        _reject(errors.INVALID_REQUEST, f"topic id {record.topic_id.hex()} is already in use")
    if not 1 <= len(record.partitions) <= PARTITIONS_PER_TOPIC_MAX:
        _reject(
            errors.INVALID_PARTITIONS,
            f"partition count {len(record.partitions)} outside [1, {PARTITIONS_PER_TOPIC_MAX}]",
        )
    _check_assignment(image, record.partitions, replication_factor=None)
    configs = _checked_configs(record.configs)
    partitions = tuple(
        _new_partition(image, index, replicas) for index, replicas in enumerate(record.partitions)
    )
    topic = TopicImage(record.name, record.topic_id, partitions, frozen_mapping(configs), offset)
    next_image = dataclasses.replace(
        image,
        topics=_with_item(image.topics, record.name, topic),
        topic_names_by_id=_with_item(image.topic_names_by_id, record.topic_id, record.name),
    )
    return next_image, record.topic_id


def _check_new_topic_name(image: MetadataImage, name: str) -> None:
    problem = validate_topic_name(name)
    if problem is not None:
        _reject(errors.INVALID_TOPIC_EXCEPTION, problem)
    if name == METADATA_TOPIC_NAME:
        _reject(errors.INVALID_REQUEST, f"creation of internal topic {name} is prohibited")
    if name in image.topics:
        _reject(errors.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
    # Kafka rejects names that differ only in '.' vs '_': they collide in metric names.
    collision_key = name.replace(".", "_")
    for existing in image.topics:
        if existing.replace(".", "_") == collision_key:
            _reject(errors.INVALID_TOPIC_EXCEPTION, f"topic {name!r} collides with {existing!r}")


def _check_assignment(
    image: MetadataImage,
    assignment: tuple[tuple[int, ...], ...],
    replication_factor: int | None,
) -> None:
    """Check replica lists; ``replication_factor`` is the one they must all have, if known."""
    live_count = len(image.live_broker_ids())
    for index, replicas in enumerate(assignment):
        if not replicas:
            _reject(errors.INVALID_REPLICATION_FACTOR, f"partition {index} has no replicas")
        if len(replicas) > live_count:
            _reject(
                errors.INVALID_REPLICATION_FACTOR,
                f"replication factor {len(replicas)} is larger than the "
                f"{live_count} available broker(s)",
            )
        expected = len(assignment[0]) if replication_factor is None else replication_factor
        if len(replicas) != expected or len(set(replicas)) != len(replicas):
            _reject(
                errors.INVALID_REPLICA_ASSIGNMENT,
                f"partition {index} replicas {list(replicas)}: duplicate broker or "
                f"replication factor other than {expected}",
            )
        _check_replicas_usable(image, index, replicas)


def _check_replicas_usable(image: MetadataImage, index: int, replicas: tuple[int, ...]) -> None:
    unknown = [r for r in replicas if r not in image.brokers]
    if unknown:
        _reject(errors.INVALID_REPLICA_ASSIGNMENT, f"partition {index}: brokers {unknown} unknown")
    if all(image.brokers[r].fenced for r in replicas):
        _reject(errors.INVALID_REPLICA_ASSIGNMENT, f"partition {index}: all replicas are fenced")


def _new_partition(image: MetadataImage, index: int, replicas: tuple[int, ...]) -> PartitionImage:
    # Replica order is preference order: the first unfenced replica leads.
    isr = tuple(r for r in replicas if not image.brokers[r].fenced)
    assert isr, "checked by _check_replicas_usable"
    return PartitionImage(index, replicas, isr, isr[0], leader_epoch=0, partition_epoch=0)


def _checked_configs(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    configs: dict[str, str] = {}
    for key, value in pairs:
        if key in configs:
            _reject(errors.INVALID_CONFIG, f"duplicate config key {key!r}")
        problem = validate_topic_config(key, value)
        if problem is not None:
            _reject(errors.INVALID_CONFIG, problem)
        configs[key] = value
    return configs


def _existing_topic(image: MetadataImage, name: str) -> TopicImage:
    topic = image.topics.get(name)
    if topic is None:
        _reject(errors.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
    return topic


def _delete_topic(image: MetadataImage, record: DeleteTopic) -> tuple[MetadataImage, bytes]:
    topic = _existing_topic(image, record.name)
    if topic.topic_id != record.topic_id:
        _reject(errors.UNKNOWN_TOPIC_ID, f"topic {record.name!r} has a different topic id")
    next_image = dataclasses.replace(
        image,
        topics=_without_item(image.topics, record.name),
        topic_names_by_id=_without_item(image.topic_names_by_id, topic.topic_id),
    )
    return next_image, topic.topic_id


def _create_partitions(
    image: MetadataImage, record: CreatePartitions, offset: int
) -> tuple[MetadataImage, int]:
    topic = _existing_topic(image, record.name)
    total = len(topic.partitions) + len(record.new_partitions)
    if not record.new_partitions or total > PARTITIONS_PER_TOPIC_MAX:
        _reject(
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
    return _with_topic(image, changed), total


def _with_topic(image: MetadataImage, topic: TopicImage) -> MetadataImage:
    assert image.topics[topic.name].topic_id == topic.topic_id
    return dataclasses.replace(image, topics=_with_item(image.topics, topic.name, topic))


# --- Configs --------------------------------------------------------------------------------


def _alter_configs(
    image: MetadataImage, record: AlterConfigs, offset: int
) -> tuple[MetadataImage, None]:
    set_keys = [key for key, _ in record.set]
    if len(set(set_keys)) != len(set_keys) or len(set(record.delete)) != len(record.delete):
        _reject(errors.INVALID_REQUEST, "a config key appears twice")
    if not set(set_keys).isdisjoint(record.delete):
        _reject(errors.INVALID_REQUEST, "a config key is both set and deleted")
    if record.resource_type == RESOURCE_TYPE_TOPIC:
        return _alter_topic_configs(image, record, offset), None
    if record.resource_type == RESOURCE_TYPE_BROKER:
        return _alter_broker_configs(image, record, offset), None
    _reject(errors.INVALID_REQUEST, f"unsupported config resource type {record.resource_type}")


def _alter_topic_configs(image: MetadataImage, record: AlterConfigs, offset: int) -> MetadataImage:
    topic = _existing_topic(image, record.resource_name)
    for key in record.delete:
        if key not in TOPIC_CONFIG_KEYS:
            _reject(errors.INVALID_CONFIG, f"unknown topic config {key!r}")
    configs = _merged_configs(topic.configs, _checked_configs(record.set), record.delete)
    changed = dataclasses.replace(topic, configs=configs, version=offset)
    return _with_topic(image, changed)


def _alter_broker_configs(image: MetadataImage, record: AlterConfigs, offset: int) -> MetadataImage:
    name = record.resource_name
    if name and not (name.isascii() and name.isdigit()):
        _reject(errors.INVALID_REQUEST, f"broker config resource {name!r} is not '' or a node id")
    for key, value in record.set:
        problem = validate_broker_dynamic_config(key, value)
        if problem is not None:
            _reject(errors.INVALID_CONFIG, problem)
    for key in record.delete:
        if key not in BROKER_DYNAMIC_CONFIG_KEYS:
            _reject(errors.INVALID_CONFIG, f"{key!r} is not a dynamic broker config")
    current = image.broker_configs.get(name)
    base = frozen_mapping() if current is None else current.configs
    configs = _merged_configs(base, dict(record.set), record.delete)
    resource = ConfigResourceImage(name, configs, offset)
    return dataclasses.replace(
        image, broker_configs=_with_item(image.broker_configs, name, resource)
    )


def _merged_configs(
    base: Mapping[str, str], updates: Mapping[str, str], deletes: Iterable[str]
) -> Mapping[str, str]:
    merged = dict(base)
    merged.update(updates)
    for key in deletes:
        merged.pop(key, None)
    return frozen_mapping(merged)


# --- Partitions -----------------------------------------------------------------------------


def _partition_change(
    image: MetadataImage, record: PartitionChange, offset: int
) -> tuple[MetadataImage, int]:
    topic = _existing_topic(image, record.topic)
    current = image.partition(record.topic, record.partition)
    if current is None:
        _reject(errors.UNKNOWN_TOPIC_OR_PARTITION, f"{record.topic}-{record.partition} unknown")
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
    return _with_topic(image, next_topic), record.partition_epoch


def _check_partition_shape(current: PartitionImage, record: PartitionChange) -> None:
    if len(set(record.isr)) != len(record.isr) or not set(record.isr) <= set(current.replicas):
        _reject(errors.INVALID_REQUEST, f"ISR {list(record.isr)} is not a subset of replicas")
    if record.leader != NO_LEADER and record.leader not in record.isr:
        _reject(errors.INVALID_REQUEST, f"leader {record.leader} is not in the ISR")


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
        _reject(errors.INELIGIBLE_REPLICA, f"brokers {ineligible} are fenced or not registered")


def _check_partition_epochs(current: PartitionImage, record: PartitionChange) -> None:
    if record.partition_epoch != current.partition_epoch + 1:
        _reject(
            errors.INVALID_UPDATE_VERSION,
            f"partition epoch {record.partition_epoch}, expected {current.partition_epoch + 1}",
        )
    if record.leader_epoch < current.leader_epoch:
        _reject(
            errors.FENCED_LEADER_EPOCH,
            f"leader epoch {record.leader_epoch} < current {current.leader_epoch}",
        )
    if record.leader != current.leader and record.leader_epoch == current.leader_epoch:
        _reject(errors.INVALID_REQUEST, "leader changed without a new leader epoch")


# --- Copy-on-write helpers ------------------------------------------------------------------


K = TypeVar("K")
V = TypeVar("V")


def _with_item(mapping: Mapping[K, V], key: K, value: V) -> Mapping[K, V]:
    copy = dict(mapping)
    copy[key] = value
    return frozen_mapping(copy)


def _without_item(mapping: Mapping[K, V], key: K) -> Mapping[K, V]:
    copy = dict(mapping)
    del copy[key]
    return frozen_mapping(copy)


# --- The state machine ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _StateSnapshot:
    image: MetadataImage
    requests: tuple[tuple[str, ApplyResult], ...]


class MetadataStateMachine:
    """Applies commands in log order and owns the current image and the request-id window.

    The request-id window is part of the replicated state: it is written into snapshots, so a
    node restored from a snapshot answers a retried command exactly as a node that replayed the
    whole log does.

    Not thread-safe: one task (or the Raft apply thread) calls :meth:`apply`. Readers elsewhere
    read :attr:`image`, which is swapped atomically and never mutated.
    """

    def __init__(self, image: MetadataImage | None = None) -> None:
        self._image = MetadataImage() if image is None else image
        self._requests: collections.OrderedDict[str, ApplyResult] = collections.OrderedDict()

    @property
    def image(self) -> MetadataImage:
        """The image after the last applied command."""
        return self._image

    @property
    def recent_requests(self) -> tuple[tuple[str, ApplyResult], ...]:
        """The request-id window, oldest first (at most ``REQUEST_WINDOW_MAX`` entries)."""
        return tuple(self._requests.items())

    def apply(self, command: Command, offset: int) -> ApplyResult:
        """Apply ``command`` at log ``offset`` (which must exceed :attr:`image`.version).

        A request id seen in the last ``REQUEST_WINDOW_MAX`` commands returns its first result
        and changes nothing but the image version.
        """
        previous = self._requests.get(command.request_id)
        if previous is not None:
            assert offset > self._image.version, (offset, self._image.version)
            self._image = dataclasses.replace(self._image, version=offset)
            return previous
        self._image, result = apply_command(self._image, command, offset)
        self._requests[command.request_id] = result
        if len(self._requests) > REQUEST_WINDOW_MAX:
            self._requests.popitem(last=False)
        assert self._image.version == offset
        return result

    def snapshot(self) -> bytes:
        """Encode the image and the request-id window (canonical CBOR)."""
        state = _StateSnapshot(self._image, self.recent_requests)
        plain = {"kind": _SNAPSHOT_KIND, "format": _SNAPSHOT_FORMAT_VERSION}
        return _codec.dumps({**plain, "state": _codec.to_plain(state)})

    def restore(self, data: bytes) -> None:
        """Replace the whole state with a :meth:`snapshot`.

        Raises:
            CodecError: ``data`` is not a snapshot of a supported format.
        """
        plain = _codec.loads(data)
        header = (plain.get("kind"), plain.get("format")) if isinstance(plain, dict) else None
        if header != (_SNAPSHOT_KIND, _SNAPSHOT_FORMAT_VERSION):
            raise CodecError(f"not a metadata state snapshot of a supported format: {header}")
        assert isinstance(plain, dict)
        state: _StateSnapshot = _codec.from_plain(_StateSnapshot, plain.get("state"), "state")
        check_image(state.image)
        assert len(state.requests) <= REQUEST_WINDOW_MAX
        self._image = state.image
        self._requests = collections.OrderedDict(state.requests)

    @classmethod
    def from_snapshot(cls, data: bytes) -> MetadataStateMachine:
        """A state machine restored from :meth:`snapshot` bytes."""
        machine = cls()
        machine.restore(data)
        return machine
