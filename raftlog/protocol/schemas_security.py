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
