"""Schemas of the SASL APIs (SaslHandshake 17, SaslAuthenticate 36) and of the SCRAM
credential admin APIs (DescribeUserScramCredentials 50, AlterUserScramCredentials 51).

The SASL APIs are served and advertised on every listener: they authenticate cluster members
(brokers and operator tools holding ``raft.secret``) and users, see ``raftlog.security``.
SaslHandshake is advertised as v0-1 because librdkafka refuses SASL when the range lacks v0;
a v0 handshake (raw SASL tokens outside Kafka framing would follow) is answered with an error
and the connection closed (``raftlog.server.sasl``). Never advertise it above v1 (KAFKA-9577).
"""

from __future__ import annotations

from raftlog.protocol.codec import Api
from raftlog.protocol.codec import Field as F

SASL_HANDSHAKE = Api(
    key=17,
    name="SaslHandshake",
    min_version=0,
    max_version=1,
    flexible="none",
    request=[F("mechanism", "string")],
    response=[F("error_code", "int16"), F("mechanisms", "[]string")],
)

SASL_AUTHENTICATE = Api(
    key=36,
    name="SaslAuthenticate",
    min_version=0,
    max_version=2,
    flexible="2+",
    request=[F("auth_bytes", "bytes")],
    response=[
        F("error_code", "int16"),
        F("error_message", "string", nullable="0+"),
        F("auth_bytes", "bytes"),
        F("session_lifetime_ms", "int64", "1+", default=0),
    ],
)

DESCRIBE_USER_SCRAM_CREDENTIALS = Api(
    key=50,
    name="DescribeUserScramCredentials",
    min_version=0,
    max_version=0,
    flexible="0+",
    request=[F("users", [F("name", "string")], nullable="0+")],
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("error_message", "string", nullable="0+"),
        F("results", [
            F("user", "string"),
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+"),
            F("credential_infos", [F("mechanism", "int8"), F("iterations", "int32")]),
        ]),
    ],
)

ALTER_USER_SCRAM_CREDENTIALS = Api(
    key=51,
    name="AlterUserScramCredentials",
    min_version=0,
    max_version=0,
    flexible="0+",
    request=[
        F("deletions", [F("name", "string"), F("mechanism", "int8")]),
        F("upsertions", [
            F("name", "string"),
            F("mechanism", "int8"),
            F("iterations", "int32"),
            F("salt", "bytes"),
            F("salted_password", "bytes"),
        ]),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("results", [
            F("user", "string"),
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+"),
        ]),
    ],
)

# The APIs of the SASL exchange: the only ones (besides ApiVersions) a connection may send
# while authenticating.
SECURITY_APIS: tuple[Api, ...] = (SASL_HANDSHAKE, SASL_AUTHENTICATE)
SCRAM_ADMIN_APIS: tuple[Api, ...] = (DESCRIBE_USER_SCRAM_CREDENTIALS,
                                     ALTER_USER_SCRAM_CREDENTIALS)

# ACL APIs (KIP-140, KIP-290 pattern types): served v0-3 (v2+ flexible). Codes are Kafka's:
# resource type, pattern type, operation and permission as in raftlog.security.acl.
_ACL_FILTER = [
    F("resource_type_filter", "int8"),
    F("resource_name_filter", "string", nullable="0+"),
    F("pattern_type_filter", "int8", "1+", default=3),
    F("principal_filter", "string", nullable="0+"),
    F("host_filter", "string", nullable="0+"),
    F("operation", "int8"),
    F("permission_type", "int8"),
]

DESCRIBE_ACLS = Api(
    key=29,
    name="DescribeAcls",
    min_version=0,
    max_version=3,
    flexible="2+",
    request=_ACL_FILTER,
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("error_message", "string", nullable="0+"),
        F("resources", [
            F("resource_type", "int8"),
            F("resource_name", "string"),
            F("pattern_type", "int8", "1+", default=3),
            F("acls", [
                F("principal", "string"),
                F("host", "string"),
                F("operation", "int8"),
                F("permission_type", "int8"),
            ]),
        ]),
    ],
)

CREATE_ACLS = Api(
    key=30,
    name="CreateAcls",
    min_version=0,
    max_version=3,
    flexible="2+",
    request=[
        F("creations", [
            F("resource_type", "int8"),
            F("resource_name", "string"),
            F("resource_pattern_type", "int8", "1+", default=3),
            F("principal", "string"),
            F("host", "string"),
            F("operation", "int8"),
            F("permission_type", "int8"),
        ]),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("results", [
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+"),
        ]),
    ],
)

DELETE_ACLS = Api(
    key=31,
    name="DeleteAcls",
    min_version=0,
    max_version=3,
    flexible="2+",
    request=[F("filters", _ACL_FILTER)],
    response=[
        F("throttle_time_ms", "int32"),
        F("filter_results", [
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+"),
            F("matching_acls", [
                F("error_code", "int16"),
                F("error_message", "string", nullable="0+"),
                F("resource_type", "int8"),
                F("resource_name", "string"),
                F("pattern_type", "int8", "1+", default=3),
                F("principal", "string"),
                F("host", "string"),
                F("operation", "int8"),
                F("permission_type", "int8"),
            ]),
        ]),
    ],
)

ACL_APIS: tuple[Api, ...] = (DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS)
