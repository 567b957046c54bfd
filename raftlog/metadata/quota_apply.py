"""Applying AlterClientQuota: one client quota entity's values, set and removed. Pure.

The rules are Kafka's ``ClientQuotaControlManager``'s, shared with the controller's answer to
AlterClientQuotas (``raftlog.broker.quota_apis``) and checked again here in log order: an
entity names ``user`` and/or ``client-id`` once each, each a name or the default (None); the
keys are ``producer_byte_rate`` and ``consumer_byte_rate`` (whole numbers of bytes per second)
and ``request_percentage`` (a percentage of one request thread), each a finite value above 0.
Everything else is INVALID_REQUEST. Removing a key that is not set changes nothing; an entity
left without values disappears.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Final

from raftlog.metadata import errors
from raftlog.metadata.apply_support import reject
from raftlog.metadata.image import (
    ClientQuotaImage,
    MetadataImage,
    QuotaEntity,
    frozen_mapping,
    quota_entity_order,
)
from raftlog.metadata.records import AlterClientQuota

USER: Final = "user"
CLIENT_ID: Final = "client-id"
ENTITY_TYPES: Final = (CLIENT_ID, USER)  # sorted: the order of an entity's pairs
PRODUCER_BYTE_RATE: Final = "producer_byte_rate"
CONSUMER_BYTE_RATE: Final = "consumer_byte_rate"
REQUEST_PERCENTAGE: Final = "request_percentage"
# Kafka's quota keys for user and client-id entities, and whether the value is a long.
QUOTA_KEYS: Final = {PRODUCER_BYTE_RATE: True, CONSUMER_BYTE_RATE: True,
                     REQUEST_PERCENTAGE: False}
ENTITY_NAME_LENGTH_MAX: Final = 1024
LONG_MAX: Final = 2**63 - 1


def quota_entity(pairs: Iterable[tuple[str, str | None]]) -> QuotaEntity:
    """``pairs`` as an entity (sorted by type); duplicates are kept for the checks to see."""
    return tuple(sorted(pairs, key=lambda pair: pair[0]))


def entity_problem(entity: QuotaEntity) -> str | None:
    """Why ``entity`` cannot carry quotas (Kafka answers INVALID_REQUEST), or None."""
    if not entity:
        return "Invalid empty client quota entity"
    kinds = [kind for kind, _ in entity]
    if len(set(kinds)) != len(kinds):
        return f"Duplicate entity type in {describe_entity(entity)}"
    for kind, name in entity:
        if kind == "ip":
            return "IP quotas (connection_creation_rate) are not supported by raftlog"
        if kind not in ENTITY_TYPES:
            return f"Unhandled client quota entity type: {kind}"
        if name is not None and len(name) > ENTITY_NAME_LENGTH_MAX:
            return f"A {kind} name longer than {ENTITY_NAME_LENGTH_MAX} characters"
    return None


def value_problem(key: str, value: float) -> str | None:
    """Why ``key`` cannot be set to ``value`` (INVALID_REQUEST), or None."""
    is_long = QUOTA_KEYS.get(key)
    if is_long is None:
        return f"Invalid configuration key {key}"
    if not math.isfinite(value) or value <= 0.0:
        return f"Quota {key} must be greater than 0"
    if is_long and (value != int(value) or value > LONG_MAX):
        return f"Configuration {key} must be a Long value"
    return None


def describe_entity(entity: QuotaEntity) -> str:
    """``user=alice,client-id=<default>`` (the form kafka-configs.sh prints)."""
    return ",".join(f"{kind}={'<default>' if name is None else name}" for kind, name in entity)


def alter_client_quota(image: MetadataImage, record: AlterClientQuota
                       ) -> tuple[MetadataImage, None]:
    """AlterClientQuota: removals, then the values set (a key may not appear twice)."""
    problem = entity_problem(record.entity)
    if problem is None and record.entity != quota_entity(record.entity):
        problem = "entity pairs out of order"
    keys = [key for key, _ in record.set] + list(record.remove)
    if problem is None and len(set(keys)) != len(keys):
        problem = "a quota key appears twice for one entity"
    if problem is None and not keys:
        problem = "AlterClientQuota changes nothing"
    for key, value in record.set:
        problem = problem or value_problem(key, value)
    for key in record.remove:
        if problem is None and key not in QUOTA_KEYS:
            problem = f"Invalid configuration key {key}"
    if problem is not None:
        reject(errors.INVALID_REQUEST, problem)
    quotas = {quota.entity: quota for quota in image.client_quotas}
    current = quotas.get(record.entity)
    values = dict(current.values) if current is not None else {}
    for key in record.remove:
        values.pop(key, None)
    values.update(record.set)
    if values:
        quotas[record.entity] = ClientQuotaImage(record.entity, frozen_mapping(values))
    else:
        quotas.pop(record.entity, None)
    ordered = tuple(quotas[entity] for entity in sorted(quotas, key=quota_entity_order))
    return dataclasses.replace(image, client_quotas=ordered), None
