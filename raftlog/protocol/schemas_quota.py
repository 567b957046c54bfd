"""Schemas of the client quota admin APIs: DescribeClientQuotas (48) and AlterClientQuotas (49),
v0-1 (v1 is flexible), as Kafka's message JSON declares them (KIP-546)."""

from __future__ import annotations

from raftlog.protocol.codec import Api
from raftlog.protocol.codec import Field as F

_ENTITY = [F("entity_type", "string"), F("entity_name", "string", nullable="0+")]

DESCRIBE_CLIENT_QUOTAS = Api(
    key=48,
    name="DescribeClientQuotas",
    min_version=0,
    max_version=1,
    flexible="1+",
    request=[
        F("components", [
            F("entity_type", "string"),
            F("match_type", "int8"),
            F("match", "string", nullable="0+"),
        ]),
        F("strict", "bool"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("error_message", "string", nullable="0+"),
        F("entries", [
            F("entity", _ENTITY),
            F("values", [F("key", "string"), F("value", "float64")]),
        ], nullable="0+"),
    ],
)

ALTER_CLIENT_QUOTAS = Api(
    key=49,
    name="AlterClientQuotas",
    min_version=0,
    max_version=1,
    flexible="1+",
    request=[
        F("entries", [
            F("entity", _ENTITY),
            F("ops", [F("key", "string"), F("value", "float64"), F("remove", "bool")]),
        ]),
        F("validate_only", "bool"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("entries", [
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+"),
            F("entity", _ENTITY),
        ]),
    ],
)

QUOTA_APIS: tuple[Api, ...] = (DESCRIBE_CLIENT_QUOTAS, ALTER_CLIENT_QUOTAS)
