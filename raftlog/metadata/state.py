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

This module dispatches each record, fences commands by controller term and checks their
expected version, and holds the state machine (request-id window, snapshots). Applying the
records themselves is in ``topic_apply`` (topics and partitions) and ``cluster_apply``
(brokers, the controller, producer-id blocks, configs).
"""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass
from typing import Final, assert_never

from raftlog.metadata import _codec, errors
from raftlog.metadata._codec import CodecError
from raftlog.metadata.acl_apply import create_acls, delete_acls
from raftlog.metadata.apply_support import (
    RESOURCE_TYPE_BROKER,
    RESOURCE_TYPE_TOPIC,
    Rejected,
    reject,
)
from raftlog.metadata.cluster_apply import (
    alter_configs,
    become_controller,
    producer_id_block,
    register_broker,
    set_fenced,
)
from raftlog.metadata.image import (
    MetadataImage,
    check_image,
    image_from_bytes,
    image_from_plain,
    image_to_bytes,
)
from raftlog.metadata.quota_apply import alter_client_quota
from raftlog.metadata.records import (
    AlterClientQuota,
    AlterConfigs,
    AlterUserScram,
    BecomeController,
    BootstrapScramUsers,
    Command,
    CreateAcls,
    CreatePartitions,
    CreateTopic,
    DeleteAcls,
    DeleteTopic,
    FenceBroker,
    PartitionChange,
    PartitionChanges,
    ProducerIdBlock,
    Record,
    RegisterBroker,
    UnfenceBroker,
)
from raftlog.metadata.scram_apply import alter_user_scram, bootstrap_scram_users
from raftlog.metadata.topic_apply import (
    METADATA_TOPIC_NAME,
    PARTITIONS_PER_TOPIC_MAX,
    create_partitions,
    create_topic,
    delete_topic,
    partition_change,
    partition_changes,
    validate_topic_name,
)

__all__ = [
    "METADATA_TOPIC_NAME",
    "PARTITIONS_PER_TOPIC_MAX",
    "REQUEST_WINDOW_MAX",
    "RESOURCE_TYPE_BROKER",
    "RESOURCE_TYPE_TOPIC",
    "ApplyResult",
    "MetadataImage",
    "MetadataStateMachine",
    "apply_command",
    "image_from_bytes",
    "image_to_bytes",
    "validate_topic_name",
]

REQUEST_WINDOW_MAX: Final = 10_000
_SNAPSHOT_KIND: Final = "raftlog.metadata.state"
# 1: no SCRAM users; 1-2: no ACLs, no broker endpoints; 1-3: no client quotas.
_SNAPSHOT_FORMAT_VERSION: Final = 4
_SNAPSHOT_FORMATS_READ: Final = (1, 2, 3, 4)


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What applying one command did.

    Attributes:
        error_code: ``errors.NONE`` or the Kafka (or internal, >= 1000) error code.
        message: Why the command was rejected, for the client's error message.
        value: Record-specific result: the topic id for CreateTopic/DeleteTopic, the partition
            count for CreatePartitions, the broker epoch for RegisterBroker, the first id of
            the block for ProducerIdBlock, the term for BecomeController, the partition epoch
            for PartitionChange, for PartitionChanges each change's error code (two bytes
            big-endian, 0 applied); None otherwise.
    """

    error_code: int
    message: str | None = None
    value: int | bytes | str | None = None

    @property
    def ok(self) -> bool:
        """Whether the command was applied."""
        return self.error_code == errors.NONE


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
    except Rejected as rejection:
        result = ApplyResult(rejection.error_code, rejection.message)
        return dataclasses.replace(image, version=offset), result
    return dataclasses.replace(next_image, version=offset), ApplyResult(errors.NONE, None, value)


def _apply_record(
    image: MetadataImage, record: Record, offset: int
) -> tuple[MetadataImage, int | bytes | str | None]:
    match record:
        case RegisterBroker():
            return register_broker(image, record, offset)
        case FenceBroker():
            return set_fenced(image, record.node_id, True, offset)
        case UnfenceBroker():
            return set_fenced(image, record.node_id, False, offset)
        case CreateTopic():
            return create_topic(image, record, offset)
        case DeleteTopic():
            return delete_topic(image, record)
        case CreatePartitions():
            return create_partitions(image, record, offset)
        case AlterConfigs():
            return alter_configs(image, record, offset)
        case PartitionChange():
            return partition_change(image, record, offset)
        case PartitionChanges():
            return partition_changes(image, record, offset)
        case ProducerIdBlock():
            return producer_id_block(image, record)
        case BecomeController():
            return become_controller(image, record)
        case AlterUserScram():
            return alter_user_scram(image, record, offset)
        case BootstrapScramUsers():
            return bootstrap_scram_users(image, record, offset)
        case CreateAcls():
            return create_acls(image, record, offset)
        case DeleteAcls():
            return delete_acls(image, record, offset)
        case AlterClientQuota():
            return alter_client_quota(image, record)
        case _:
            assert_never(record)


def _check_controller_term(image: MetadataImage, command: Command) -> None:
    record = command.record
    if isinstance(record, BecomeController):
        _check_become_controller(image, command, record)
        return
    # Before the first BecomeController there is no term to fence against.
    if image.controller_term > 0 and command.controller_term != image.controller_term:
        reject(
            errors.NOT_CONTROLLER,
            f"command from controller term {command.controller_term}, "
            f"current term is {image.controller_term}",
        )


def _check_become_controller(
    image: MetadataImage, command: Command, record: BecomeController
) -> None:
    if record.term < 1 or command.controller_term != record.term:
        reject(errors.INVALID_REQUEST, "BecomeController needs term >= 1 in record and envelope")
    if record.term < image.controller_term:
        reject(errors.NOT_CONTROLLER, f"term {record.term} < current {image.controller_term}")
    if record.term == image.controller_term and record.node_id != image.controller_node_id:
        reject(
            errors.NOT_CONTROLLER,
            f"term {record.term} already belongs to node {image.controller_node_id}",
        )


def _check_expected_version(image: MetadataImage, command: Command) -> None:
    expected = command.expected_version
    if expected is None:
        return
    current = _resource_version(image, command.record)
    if current > expected:
        reject(
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
        case (ProducerIdBlock() | BecomeController() | AlterUserScram() | BootstrapScramUsers()
              | AlterClientQuota() | PartitionChanges()):
            return -1
        case CreateAcls() | DeleteAcls():
            return image.acl_version
        case _:
            assert_never(record)


def _topic_version(image: MetadataImage, name: str) -> int:
    topic = image.topics.get(name)
    return -1 if topic is None else topic.version


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
        if header is None or header[0] != _SNAPSHOT_KIND or header[1] not in _SNAPSHOT_FORMATS_READ:
            raise CodecError(f"not a metadata state snapshot of a supported format: {header}")
        assert isinstance(plain, dict)
        state_plain = plain.get("state")
        if not isinstance(state_plain, dict) or set(state_plain) != {"image", "requests"}:
            raise CodecError("state: expected a map of image and requests")
        # A format-N snapshot holds a format-N image (1: no SCRAM users; 1-2: no ACLs, no
        # broker endpoints; 1-3: no client quotas).
        image = image_from_plain(state_plain["image"], header[1], "state.image")
        requests = _codec.from_plain(tuple[tuple[str, ApplyResult], ...],
                                     state_plain["requests"], "state.requests")
        state = _StateSnapshot(image, requests)
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
