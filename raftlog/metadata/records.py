"""Metadata records and the command envelope, encoded as CBOR.

A *record* says what should change (create a topic, fence a broker...). A *command* wraps one record
in the envelope every proposal carries: the controller term it was proposed under, a request id for
deduplication and the metadata version the proposer read (for compare-and-set). Commands are what
the quorum log stores and what :class:`~raftlog.metadata.state.MetadataStateMachine` applies.

Wire shape of a record: a CBOR map ``{"t": tag, "v": version, <field>: <value>, ...}``. Tags are
stable small integers and must never be reused; a record type that changes shape gets a new
``VERSION``. Decoding rejects unknown tags, newer versions, and missing, extra or mistyped fields.

Records are frozen dataclasses ("don't subclass these"); sequences are tuples so records hash and
compare by value.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Final, TypeAlias

from raftlog.metadata import _codec
from raftlog.metadata._codec import CodecError
from raftlog.metadata.image import (
    AclBindingImage,
    BrokerEndpoint,
    QuotaEntity,
    ScramCredentialImage,
)


class RecordFormatError(CodecError):
    """Bytes that are not a valid record or command (unknown tag, bad field, bad CBOR)."""


@dataclass(frozen=True, slots=True)
class RegisterBroker:
    """A broker announces itself; a new incarnation starts fenced until ``UnfenceBroker``.
    ``host:port`` is its inter-broker listener; ``endpoints`` (version 1) every listener it
    serves clients on. A version-0 record reads as one without endpoints."""

    TAG: ClassVar[int] = 1
    VERSION: ClassVar[int] = 1
    node_id: int
    host: str
    port: int
    rack: str | None
    incarnation_id: str
    endpoints: tuple[BrokerEndpoint, ...] = ()


@dataclass(frozen=True, slots=True)
class FenceBroker:
    """The broker may no longer lead or join ISRs (the controller moves its partitions away)."""

    TAG: ClassVar[int] = 2
    VERSION: ClassVar[int] = 0
    node_id: int


@dataclass(frozen=True, slots=True)
class UnfenceBroker:
    """The broker has caught up and may lead partitions and join ISRs again."""

    TAG: ClassVar[int] = 3
    VERSION: ClassVar[int] = 0
    node_id: int


@dataclass(frozen=True, slots=True)
class CreateTopic:
    """Create a topic with explicit replica lists (the proposer ran ``assign_replicas``)."""

    TAG: ClassVar[int] = 4
    VERSION: ClassVar[int] = 0
    name: str
    topic_id: bytes
    partitions: tuple[tuple[int, ...], ...]
    configs: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class DeleteTopic:
    """Delete a topic; ``topic_id`` must match so a retry cannot delete a re-created topic."""

    TAG: ClassVar[int] = 5
    VERSION: ClassVar[int] = 0
    name: str
    topic_id: bytes


@dataclass(frozen=True, slots=True)
class CreatePartitions:
    """Append partitions (one replica list each) to an existing topic."""

    TAG: ClassVar[int] = 6
    VERSION: ClassVar[int] = 0
    name: str
    new_partitions: tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class AlterConfigs:
    """Set and delete config keys of one resource (Kafka ``ConfigResource`` types 2 and 4)."""

    TAG: ClassVar[int] = 7
    VERSION: ClassVar[int] = 0
    resource_type: int
    resource_name: str
    set: tuple[tuple[str, str], ...]
    delete: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PartitionChange:
    """New leader and ISR for one partition; ``partition_epoch`` must be the current one + 1."""

    TAG: ClassVar[int] = 8
    VERSION: ClassVar[int] = 0
    topic: str
    partition: int
    leader: int
    isr: tuple[int, ...]
    leader_epoch: int
    partition_epoch: int


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    """Hand producer ids ``[next_block_start, next_block_start + block_size)`` to ``node_id``.

    ``next_block_start`` must equal the image's ``next_producer_id`` (compare-and-set), else
    STALE_METADATA_VERSION: two controllers can never hand out the same block.
    """

    TAG: ClassVar[int] = 9
    VERSION: ClassVar[int] = 0
    next_block_start: int
    block_size: int
    node_id: int


@dataclass(frozen=True, slots=True)
class BecomeController:
    """``node_id`` is the controller for ``term``; later commands must carry this term."""

    TAG: ClassVar[int] = 10
    VERSION: ClassVar[int] = 0
    term: int
    node_id: int


@dataclass(frozen=True, slots=True)
class AlterUserScram:
    """Set and delete one user's SCRAM credentials (by mechanism); salted keys only, the
    controller derived them from the client's salted password (Kafka's
    ``UserScramCredentialRecord`` / ``RemoveUserScramCredentialRecord``)."""

    TAG: ClassVar[int] = 11
    VERSION: ClassVar[int] = 0
    user: str
    upserts: tuple[ScramCredentialImage, ...]
    deletions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class BootstrapScramUsers:
    """The SCRAM users of ``raftlog format --add-scram`` (KIP-900): applied only to a log that
    never changed a SCRAM user, else a no-op, so whichever controller proposes them first
    bootstraps the cluster exactly once."""

    TAG: ClassVar[int] = 12
    VERSION: ClassVar[int] = 0
    users: tuple[AlterUserScram, ...]


@dataclass(frozen=True, slots=True)
class CreateAcls:
    """Add ACL bindings, atomically (one CreateAcls request). A binding that says the same as
    one already stored is skipped, as Kafka treats creating an existing ACL as done."""

    TAG: ClassVar[int] = 13
    VERSION: ClassVar[int] = 0
    bindings: tuple[AclBindingImage, ...]


@dataclass(frozen=True, slots=True)
class DeleteAcls:
    """Remove the ACL bindings with these ids, atomically (what one DeleteAcls request's
    filters matched). Ids already gone are ignored."""

    TAG: ClassVar[int] = 14
    VERSION: ClassVar[int] = 0
    acl_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AlterClientQuota:
    """Set and remove client quota values of one entity (Kafka's ``ClientQuotaRecord``): the
    entity is (type, name) pairs, sorted by type, for ``user`` and/or ``client-id``, a name of
    None being the type's default (Kafka's ``<default>``); ``set`` gives key and value,
    ``remove`` the keys to drop. Tags 13 and 14 belong to the ACL records."""

    TAG: ClassVar[int] = 15
    VERSION: ClassVar[int] = 0
    entity: QuotaEntity
    set: tuple[tuple[str, float], ...]
    remove: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PartitionChanges:
    """Many PartitionChange in one command (Kafka's controller writes a broker's partition
    moves as one record batch): each applies on its own terms, and one whose check fails (a
    stale partition epoch, a partition gone) is skipped without failing the others. Fencing
    a broker, a new incarnation leaving what its predecessor held, a controlled shutdown and
    the reconciliation move hundreds of partitions at once: one Raft entry, not hundreds."""

    TAG: ClassVar[int] = 16
    VERSION: ClassVar[int] = 0
    changes: tuple[PartitionChange, ...]


Record: TypeAlias = (
    RegisterBroker
    | FenceBroker
    | UnfenceBroker
    | CreateTopic
    | DeleteTopic
    | CreatePartitions
    | AlterConfigs
    | PartitionChange
    | PartitionChanges
    | ProducerIdBlock
    | BecomeController
    | AlterUserScram
    | BootstrapScramUsers
    | CreateAcls
    | DeleteAcls
    | AlterClientQuota
)

RECORD_TYPES: Final[tuple[type[Record], ...]] = (
    RegisterBroker,
    FenceBroker,
    UnfenceBroker,
    CreateTopic,
    DeleteTopic,
    CreatePartitions,
    AlterConfigs,
    PartitionChange,
    ProducerIdBlock,
    BecomeController,
    AlterUserScram,
    BootstrapScramUsers,
    CreateAcls,
    DeleteAcls,
    AlterClientQuota,
    PartitionChanges,
)
RECORD_TYPE_BY_TAG: Final[dict[int, type[Record]]] = {cls.TAG: cls for cls in RECORD_TYPES}

# Invariant: tags are unique, and no field can shadow the "t"/"v" keys of the wire map.
assert len(RECORD_TYPE_BY_TAG) == len(RECORD_TYPES)
assert all({"t", "v"}.isdisjoint(f.name for f in dataclasses.fields(c)) for c in RECORD_TYPES)


@dataclass(frozen=True, slots=True)
class Command:
    """A record plus the envelope every proposal carries.

    Attributes:
        record: What to change.
        controller_term: The controller term the proposer believed current. Apply rejects the
            command with NOT_CONTROLLER if it differs from the recorded term.
        request_id: Unique per proposal; apply returns the first result for a repeated id.
        expected_version: The image version the proposer read, or None for no check. Apply
            rejects with STALE_METADATA_VERSION if the targeted resource changed after it.
    """

    VERSION: ClassVar[int] = 0
    record: Record
    controller_term: int
    request_id: str
    expected_version: int | None = None


def encode_record(record: Record) -> bytes:
    """Encode ``record`` as a CBOR map ``{"t": tag, "v": version, ...fields}``."""
    return _codec.dumps(_record_to_plain(record))


def decode_record(data: bytes) -> Record:
    """Decode bytes from :func:`encode_record`.

    Raises:
        RecordFormatError: unknown tag, newer version, or fields that do not match the type.
    """
    return _record_from_plain(_loads(data), "record")


def encode_command(command: Command) -> bytes:
    """Encode a command: the envelope fields plus the record map under ``"record"``."""
    plain = {
        "v": Command.VERSION,
        "controller_term": command.controller_term,
        "request_id": command.request_id,
        "expected_version": command.expected_version,
        "record": _record_to_plain(command.record),
    }
    _check_round_trip(command, plain)
    return _codec.dumps(plain)


def decode_command(data: bytes) -> Command:
    """Decode bytes from :func:`encode_command`.

    Raises:
        RecordFormatError: the envelope or the record is malformed.
    """
    plain = _loads(data)
    if not isinstance(plain, dict):
        raise RecordFormatError(f"command: expected a map, got {type(plain).__name__}")
    return _command_from_plain(dict(plain))


def _loads(data: bytes) -> object:
    try:
        return _codec.loads(data)
    except CodecError as exc:
        raise RecordFormatError(str(exc)) from exc


def _record_to_plain(record: Record) -> dict[str, object]:
    if type(record) not in RECORD_TYPES:
        raise RecordFormatError(f"not a metadata record: {type(record).__name__}")
    plain = _codec.to_plain(record)
    assert isinstance(plain, dict)
    result: dict[str, object] = {"t": record.TAG, "v": record.VERSION, **plain}
    _check_round_trip(record, result)
    return result


def _check_round_trip(value: object, plain: dict[str, object]) -> None:
    # Pair assertion: what we write must read back equal, so a list where a tuple belongs, or a
    # bool where an int belongs, fails at the proposer instead of diverging replicas later.
    decoded = (
        _command_from_plain(dict(plain))
        if isinstance(value, Command)
        else _record_from_plain(plain, "record")
    )
    if decoded != value:
        raise RecordFormatError(f"{type(value).__name__} has fields of the wrong type: {value!r}")


def _record_from_plain(plain: object, path: str) -> Record:
    if not isinstance(plain, dict):
        raise RecordFormatError(f"{path}: expected a map, got {type(plain).__name__}")
    fields = dict(plain)
    tag = fields.pop("t", None)
    version = fields.pop("v", None)
    cls = RECORD_TYPE_BY_TAG.get(tag) if type(tag) is int else None
    if cls is None:
        raise RecordFormatError(f"{path}: unknown metadata record tag {tag!r}")
    if type(version) is not int or not 0 <= version <= cls.VERSION:
        raise RecordFormatError(
            f"{path}: {cls.__name__} version {version!r} not supported (max {cls.VERSION})"
        )
    if cls is RegisterBroker and version == 0 and "endpoints" not in fields:
        fields["endpoints"] = []  # version 0 registered the inter-broker address only
    try:
        record: Record = _codec.from_plain(cls, fields, f"{path}<{cls.__name__}>")
    except CodecError as exc:
        raise RecordFormatError(str(exc)) from exc
    return record


def _command_from_plain(plain: dict[Any, object]) -> Command:
    version = plain.pop("v", None)
    if version != Command.VERSION or type(version) is not int:
        raise RecordFormatError(f"command: envelope version {version!r} not supported")
    record = _record_from_plain(plain.pop("record", None), "command.record")
    envelope_fields = {f.name for f in dataclasses.fields(Command)} - {"record"}
    if set(plain) != envelope_fields:
        raise RecordFormatError(f"command: envelope fields {sorted(map(str, plain))}")
    try:
        term = _codec.from_plain(int, plain["controller_term"], "command.controller_term")
        request_id = _codec.from_plain(str, plain["request_id"], "command.request_id")
        expected = _codec.from_plain(int | None, plain["expected_version"], "command.expected")
    except CodecError as exc:
        raise RecordFormatError(str(exc)) from exc
    return Command(record, term, request_id, expected)
