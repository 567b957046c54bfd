"""The metadata image: an immutable snapshot of cluster metadata at one log offset.

Everything here is a frozen dataclass, a tuple or a ``MappingProxyType``, so a trio task holding an
image can read it at leisure while the state machine builds the next one. Applying a record never
mutates an image; it builds a new one and the owner swaps a single reference.

Thread-safety: images are immutable and safe to share between threads and tasks.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, TypeVar

from raftlog.metadata import _codec
from raftlog.metadata._codec import CodecError

# Kafka's "no leader" partition leader id.
NO_LEADER: Final = -1
# Offset of an image to which nothing has been applied yet.
EMPTY_VERSION: Final = -1
# Snapshot layout version, bumped whenever an image dataclass changes shape.
IMAGE_FORMAT_VERSION: Final = 4
# Format 1 had no ``scram_users`` (it reads as an image without SCRAM users); formats 1 and 2
# had no ``acls`` (no ACLs) and no broker ``endpoints`` (each broker's one host:port); formats
# 1-3 had no ``client_quotas`` (no quotas).
_IMAGE_FORMATS_READ: Final = (1, 2, 3, 4)
_IMAGE_KIND: Final = "raftlog.metadata.image"

K = TypeVar("K")
V = TypeVar("V")


def frozen_mapping(items: Mapping[K, V] | None = None) -> Mapping[K, V]:
    """Return a read-only copy of ``items``."""
    return types.MappingProxyType(dict(items or {}))


@dataclass(frozen=True, slots=True)
class BrokerEndpoint:
    """One listener a broker registered (KRaft's ``BrokerEndpoint``): clients on listener
    ``name`` are given ``host:port``."""

    name: str
    host: str
    port: int
    security_protocol: str


@dataclass(frozen=True, slots=True)
class BrokerImage:
    """A registered broker.

    Attributes:
        host, port: The inter-broker listener's address (what nodes connect to).
        epoch: Offset of the RegisterBroker record of this incarnation (KRaft's broker epoch).
        version: Offset of the last record that changed this broker.
        endpoints: Every listener it registered; empty for a registration made before brokers
            registered their listeners (then ``host:port`` serves every listener).
    """

    node_id: int
    host: str
    port: int
    rack: str | None
    incarnation_id: str
    fenced: bool
    epoch: int
    version: int
    endpoints: tuple[BrokerEndpoint, ...] = ()

    def endpoint(self, listener: str) -> tuple[str, int] | None:
        """Where clients of ``listener`` reach this broker, or None when it lacks that
        listener (a broker registered without endpoints answers with its one address)."""
        if not self.endpoints:
            return self.host, self.port
        for endpoint in self.endpoints:
            if endpoint.name == listener.upper():
                return endpoint.host, endpoint.port
        return None


@dataclass(frozen=True, slots=True)
class PartitionImage:
    """One partition: its replicas, in-sync replicas and leader."""

    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int


@dataclass(frozen=True, slots=True)
class TopicImage:
    """A topic; ``version`` is the offset of the last record that changed it (for CAS)."""

    name: str
    topic_id: bytes
    partitions: tuple[PartitionImage, ...]
    configs: Mapping[str, str]
    version: int


@dataclass(frozen=True, slots=True)
class ConfigResourceImage:
    """Dynamic broker configs: ``resource_name`` "" is the cluster default, else a node id."""

    resource_name: str
    configs: Mapping[str, str]
    version: int


@dataclass(frozen=True, slots=True)
class ScramCredentialImage:
    """One user's SCRAM credential for one mechanism: salted keys only, never a password
    (Kafka's ``UserScramCredentialRecord``)."""

    mechanism: str
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


# A client quota entity: (entity type, name) pairs sorted by type, the types "client-id" and
# "user" (Kafka's ClientQuotaEntity); a name of None is the type's default (``<default>``).
QuotaEntity = tuple[tuple[str, str | None], ...]


@dataclass(frozen=True, slots=True)
class ClientQuotaImage:
    """The quota values (``producer_byte_rate``, ``consumer_byte_rate``,
    ``request_percentage``) set for one entity; never empty."""

    entity: QuotaEntity
    values: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class AclBindingImage:
    """One ACL binding (Kafka's ``AccessControlEntryRecord``), with Kafka's wire codes:
    resource type 2 Topic, 3 Group, 4 Cluster, 5 TransactionalId; pattern 3 LITERAL,
    4 PREFIXED; operation 2 All .. 12 IdempotentWrite; permission 2 DENY, 3 ALLOW. ``acl_id``
    is chosen by the controller, so DeleteAcls removes exactly the bindings it matched."""

    acl_id: str
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission: int

    def same_rule(self, other: AclBindingImage) -> bool:
        """Whether both say the same thing (every field but the id)."""
        return (self.resource_type, self.resource_name, self.pattern_type, self.principal,
                self.host, self.operation, self.permission) == (
            other.resource_type, other.resource_name, other.pattern_type, other.principal,
            other.host, other.operation, other.permission)


@dataclass(frozen=True, slots=True)
class MetadataImage:
    """All cluster metadata as of log offset ``version``.

    Attributes:
        version: Offset of the last applied record, including rejected ones, so a reader waiting
            for "my command at offset N" can wait for ``version >= N``.
        controller_term: Term of the last accepted BecomeController; 0 means none yet.
        controller_node_id: The node that became controller in ``controller_term``, or -1.
        next_producer_id: First producer id not yet handed out in a ProducerIdBlock.
        scram_users: SCRAM credentials by user name, then by mechanism.
        scram_version: Offset of the last record that changed ``scram_users``, -1 if none.
        acls: ACL bindings by id.
        acl_version: Offset of the last record that changed ``acls``, -1 if none (the
            authorizer's cache key).
        client_quotas: Client quota entities with their values, sorted by
            :func:`quota_entity_order`.
    """

    version: int = EMPTY_VERSION
    brokers: Mapping[int, BrokerImage] = field(default_factory=frozen_mapping)
    topics: Mapping[str, TopicImage] = field(default_factory=frozen_mapping)
    topic_names_by_id: Mapping[bytes, str] = field(default_factory=frozen_mapping)
    broker_configs: Mapping[str, ConfigResourceImage] = field(default_factory=frozen_mapping)
    controller_term: int = 0
    controller_node_id: int = -1
    next_producer_id: int = 0
    # SCRAM users: user name -> mechanism -> credential.
    scram_users: Mapping[str, Mapping[str, ScramCredentialImage]] = field(
        default_factory=frozen_mapping)
    # Offset of the last SCRAM change (-1: none ever; bootstrap users apply only then).
    scram_version: int = EMPTY_VERSION
    acls: Mapping[str, AclBindingImage] = field(default_factory=frozen_mapping)
    acl_version: int = EMPTY_VERSION
    client_quotas: tuple[ClientQuotaImage, ...] = ()

    def topic(self, name: str) -> TopicImage | None:
        """The topic called ``name``, or None."""
        return self.topics.get(name)

    def topic_by_id(self, topic_id: bytes) -> TopicImage | None:
        """The topic with id ``topic_id``, or None."""
        name = self.topic_names_by_id.get(topic_id)
        return None if name is None else self.topics[name]

    def partition(self, topic: str, partition: int) -> PartitionImage | None:
        """One partition of a topic, or None if either does not exist."""
        image = self.topics.get(topic)
        if image is None or not 0 <= partition < len(image.partitions):
            return None
        return image.partitions[partition]

    def live_broker_ids(self) -> tuple[int, ...]:
        """Ids of registered, unfenced brokers in ascending order (placement input)."""
        return tuple(sorted(b.node_id for b in self.brokers.values() if not b.fenced))


def image_to_bytes(image: MetadataImage) -> bytes:
    """Encode an image as canonical CBOR: equal images give equal bytes."""
    header = {"kind": _IMAGE_KIND, "format": IMAGE_FORMAT_VERSION}
    return _codec.dumps({**header, "image": _codec.to_plain(image)})


def image_from_bytes(data: bytes) -> MetadataImage:
    """Decode bytes from :func:`image_to_bytes` and check the image's invariants.

    Raises:
        CodecError: the bytes are not an image of a supported format.
    """
    plain = _codec.loads(data)
    header = (plain.get("kind"), plain.get("format")) if isinstance(plain, dict) else None
    if header is None or header[0] != _IMAGE_KIND or header[1] not in _IMAGE_FORMATS_READ:
        raise CodecError(f"not a metadata image of a supported format: {header}")
    assert isinstance(plain, dict)
    image = image_from_plain(plain.get("image"), header[1], "image")
    check_image(image)
    return image


def image_from_plain(plain: object, image_format: object, path: str) -> MetadataImage:
    """Decode an image written in ``image_format`` (an older format is read as the current
    one: format 1 had no SCRAM users, formats 1-2 no ACLs and no broker endpoints,
    formats 1-3 no client quotas)."""
    if image_format == 1 and isinstance(plain, dict) and "scram_users" not in plain:
        plain = {**plain, "scram_users": {}, "scram_version": EMPTY_VERSION}
    if image_format in (1, 2) and isinstance(plain, dict) and "acls" not in plain:
        plain = {**plain, "acls": {}, "acl_version": EMPTY_VERSION}
    if image_format in (1, 2) and isinstance(plain, dict) and isinstance(
            plain.get("brokers"), dict):
        plain = {**plain, "brokers": {
            node_id: ({**broker, "endpoints": []} if isinstance(broker, dict) else broker)
            for node_id, broker in plain["brokers"].items()}}
    if image_format in (1, 2, 3) and isinstance(plain, dict) and "client_quotas" not in plain:
        plain = {**plain, "client_quotas": []}
    image: MetadataImage = _codec.from_plain(MetadataImage, plain, path)
    return image


def check_image(image: MetadataImage) -> None:
    """Assert the invariants every image must satisfy (used by tests and snapshot loading)."""
    assert image.version >= EMPTY_VERSION
    assert len(image.topic_names_by_id) == len(image.topics)
    for node_id, broker in image.brokers.items():
        assert node_id == broker.node_id
        assert broker.epoch <= broker.version <= image.version
    for name, topic in image.topics.items():
        assert name == topic.name
        assert image.topic_names_by_id.get(topic.topic_id) == name
        assert topic.version <= image.version
        for index, partition in enumerate(topic.partitions):
            _check_partition(index, partition)
    for name, resource in image.broker_configs.items():
        assert name == resource.resource_name
        assert resource.version <= image.version
    assert image.controller_term >= 0
    assert image.next_producer_id >= 0
    assert EMPTY_VERSION <= image.scram_version <= image.version
    for user, credentials in image.scram_users.items():
        assert user and credentials
        assert all(c.mechanism == m for m, c in credentials.items())
    assert EMPTY_VERSION <= image.acl_version <= image.version
    assert all(acl_id == acl.acl_id for acl_id, acl in image.acls.items())
    entities = [quota.entity for quota in image.client_quotas]
    assert entities == sorted(entities, key=quota_entity_order)
    assert len(set(entities)) == len(entities)
    assert all(quota.values for quota in image.client_quotas)


def quota_entity_order(entity: QuotaEntity) -> tuple[tuple[str, bool, str], ...]:
    """A total order on quota entities (a default name sorts before every specific one)."""
    return tuple((kind, name is not None, name or "") for kind, name in entity)


def _check_partition(index: int, partition: PartitionImage) -> None:
    assert partition.partition == index
    assert len(set(partition.replicas)) == len(partition.replicas) > 0
    assert set(partition.isr) <= set(partition.replicas)
    assert partition.leader == NO_LEADER or partition.leader in partition.isr
    assert partition.leader_epoch >= 0
    assert partition.partition_epoch >= 0
