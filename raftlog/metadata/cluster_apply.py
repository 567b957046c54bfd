"""Applying the cluster records: brokers (RegisterBroker, FenceBroker, UnfenceBroker), the
controller (BecomeController), producer-id blocks (ProducerIdBlock) and configs (AlterConfigs on
a topic or on the brokers). Pure: image in, image out, or a rejection.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Final

from raftlog.config import (
    BROKER_DYNAMIC_CONFIG_KEYS,
    TOPIC_CONFIG_KEYS,
    validate_broker_dynamic_config,
)
from raftlog.metadata import errors
from raftlog.metadata.apply_support import (
    INT64_MAX,
    RESOURCE_TYPE_BROKER,
    RESOURCE_TYPE_TOPIC,
    check_node_id,
    existing_topic,
    reject,
    with_item,
    with_topic,
)
from raftlog.metadata.image import (
    BrokerImage,
    ConfigResourceImage,
    MetadataImage,
    frozen_mapping,
)
from raftlog.metadata.records import (
    AlterConfigs,
    BecomeController,
    ProducerIdBlock,
    RegisterBroker,
)
from raftlog.metadata.topic_apply import checked_configs

PRODUCER_ID_BLOCK_SIZE_MAX: Final = 1 << 20
HOST_LENGTH_MAX: Final = 255
PORT_MAX: Final = 65535


ENDPOINTS_MAX: Final = 64
LISTENER_NAME_LENGTH_MAX: Final = 255
SECURITY_PROTOCOLS: Final = frozenset({"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"})


def _check_endpoints(record: RegisterBroker) -> None:
    """Every endpoint a valid address under a unique listener name with a known protocol."""
    if len(record.endpoints) > ENDPOINTS_MAX:
        reject(errors.INVALID_REQUEST, f"{len(record.endpoints)} endpoints (max {ENDPOINTS_MAX})")
    names = [endpoint.name for endpoint in record.endpoints]
    if len(set(names)) != len(names):
        reject(errors.INVALID_REQUEST, f"listener names registered twice: {names}")
    for endpoint in record.endpoints:
        if (not 0 < len(endpoint.name) <= LISTENER_NAME_LENGTH_MAX
                or endpoint.name != endpoint.name.upper()
                or not 0 < len(endpoint.host) <= HOST_LENGTH_MAX
                or not 1 <= endpoint.port <= PORT_MAX
                or endpoint.security_protocol not in SECURITY_PROTOCOLS):
            reject(errors.INVALID_REQUEST, f"invalid endpoint {endpoint}")


def register_broker(
    image: MetadataImage, record: RegisterBroker, offset: int
) -> tuple[MetadataImage, int]:
    """RegisterBroker: a new incarnation starts fenced; the same one again is a no-op."""
    check_node_id(record.node_id)
    if not 0 < len(record.host) <= HOST_LENGTH_MAX or not 1 <= record.port <= PORT_MAX:
        reject(errors.INVALID_REQUEST, f"invalid endpoint {record.host!r}:{record.port}")
    if record.rack == "" or not record.incarnation_id:
        reject(errors.INVALID_REQUEST, "rack must be None or non-empty; incarnation_id non-empty")
    _check_endpoints(record)
    existing = image.brokers.get(record.node_id)
    if existing is not None and existing.incarnation_id == record.incarnation_id:
        # A retried registration of the same incarnation is a no-op, like Kafka's.
        if (existing.host, existing.port, existing.rack) != (record.host, record.port, record.rack):
            reject(errors.INVALID_REQUEST, "incarnation re-registered with a different endpoint")
        if existing.endpoints == record.endpoints:
            return image, existing.epoch
        # The same incarnation naming its listeners again (a single node registers itself as
        # its quorum opens, before every listener is bound; its lifecycle then registers the
        # bound ports): the endpoints change, the epoch does not.
        updated = dataclasses.replace(existing, endpoints=record.endpoints, version=offset)
        brokers = with_item(image.brokers, record.node_id, updated)
        return dataclasses.replace(image, brokers=brokers), existing.epoch
    # A new incarnation starts fenced: it must catch up before it leads anything.
    broker = BrokerImage(
        record.node_id, record.host, record.port, record.rack, record.incarnation_id,
        fenced=True, epoch=offset, version=offset, endpoints=record.endpoints,
    )  # fmt: skip
    brokers = with_item(image.brokers, record.node_id, broker)
    return dataclasses.replace(image, brokers=brokers), offset


def set_fenced(
    image: MetadataImage, node_id: int, fenced: bool, offset: int
) -> tuple[MetadataImage, None]:
    """FenceBroker and UnfenceBroker."""
    broker = image.brokers.get(node_id)
    if broker is None:
        reject(errors.BROKER_ID_NOT_REGISTERED, f"broker {node_id} is not registered")
    if broker.fenced == fenced:
        return image, None
    changed = dataclasses.replace(broker, fenced=fenced, version=offset)
    return dataclasses.replace(image, brokers=with_item(image.brokers, node_id, changed)), None


def become_controller(image: MetadataImage, record: BecomeController) -> tuple[MetadataImage, int]:
    """BecomeController: the term and its node (fencing was checked before)."""
    check_node_id(record.node_id)
    next_image = dataclasses.replace(
        image, controller_term=record.term, controller_node_id=record.node_id
    )
    return next_image, record.term


def producer_id_block(image: MetadataImage, record: ProducerIdBlock) -> tuple[MetadataImage, int]:
    """ProducerIdBlock: the next block, under compare-and-set on the next free id."""
    if record.node_id not in image.brokers:
        reject(errors.BROKER_ID_NOT_REGISTERED, f"broker {record.node_id} is not registered")
    if not 1 <= record.block_size <= PRODUCER_ID_BLOCK_SIZE_MAX:
        reject(errors.INVALID_REQUEST, f"block size {record.block_size} out of range")
    if record.next_block_start != image.next_producer_id:
        reject(
            errors.STALE_METADATA_VERSION,
            f"block starts at {record.next_block_start}, next free id is {image.next_producer_id}",
        )
    next_producer_id = record.next_block_start + record.block_size
    if next_producer_id > INT64_MAX:
        reject(errors.INVALID_REQUEST, "producer ids exhausted")
    return dataclasses.replace(image, next_producer_id=next_producer_id), record.next_block_start


def alter_configs(
    image: MetadataImage, record: AlterConfigs, offset: int
) -> tuple[MetadataImage, None]:
    """AlterConfigs on a topic or on the brokers (cluster-wide or one node)."""
    set_keys = [key for key, _ in record.set]
    if len(set(set_keys)) != len(set_keys) or len(set(record.delete)) != len(record.delete):
        reject(errors.INVALID_REQUEST, "a config key appears twice")
    if not set(set_keys).isdisjoint(record.delete):
        reject(errors.INVALID_REQUEST, "a config key is both set and deleted")
    if record.resource_type == RESOURCE_TYPE_TOPIC:
        return _alter_topic_configs(image, record, offset), None
    if record.resource_type == RESOURCE_TYPE_BROKER:
        return _alter_broker_configs(image, record, offset), None
    reject(errors.INVALID_REQUEST, f"unsupported config resource type {record.resource_type}")


def _alter_topic_configs(image: MetadataImage, record: AlterConfigs, offset: int) -> MetadataImage:
    topic = existing_topic(image, record.resource_name)
    for key in record.delete:
        if key not in TOPIC_CONFIG_KEYS:
            reject(errors.INVALID_CONFIG, f"unknown topic config {key!r}")
    configs = _merged_configs(topic.configs, checked_configs(record.set), record.delete)
    changed = dataclasses.replace(topic, configs=configs, version=offset)
    return with_topic(image, changed)


def _alter_broker_configs(image: MetadataImage, record: AlterConfigs, offset: int) -> MetadataImage:
    name = record.resource_name
    if name and not (name.isascii() and name.isdigit()):
        reject(errors.INVALID_REQUEST, f"broker config resource {name!r} is not '' or a node id")
    for key, value in record.set:
        problem = validate_broker_dynamic_config(key, value)
        if problem is not None:
            reject(errors.INVALID_CONFIG, problem)
    for key in record.delete:
        if key not in BROKER_DYNAMIC_CONFIG_KEYS:
            reject(errors.INVALID_CONFIG, f"{key!r} is not a dynamic broker config")
    current = image.broker_configs.get(name)
    base = frozen_mapping() if current is None else current.configs
    configs = _merged_configs(base, dict(record.set), record.delete)
    resource = ConfigResourceImage(name, configs, offset)
    return dataclasses.replace(
        image, broker_configs=with_item(image.broker_configs, name, resource)
    )


def _merged_configs(
    base: Mapping[str, str], updates: Mapping[str, str], deletes: Iterable[str]
) -> Mapping[str, str]:
    merged = dict(base)
    merged.update(updates)
    for key in deletes:
        merged.pop(key, None)
    return frozen_mapping(merged)
