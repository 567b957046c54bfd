"""Schemas of the SASL APIs (SaslHandshake 17, SaslAuthenticate 36).

Served on every listener: today they authenticate cluster members (brokers and operator tools
holding ``raft.secret``) with SCRAM, see ``raftlog.security``. Not advertised in ApiVersions
yet, so a PLAINTEXT client's feature detection is unchanged; only SaslHandshake v1 is served
(v0 would be followed by raw SASL tokens outside Kafka framing).
"""

from __future__ import annotations

from raftlog.protocol.codec import Api
from raftlog.protocol.codec import Field as F

SASL_HANDSHAKE = Api(
    key=17,
    name="SaslHandshake",
    min_version=1,
    max_version=1,
    flexible="none",
    internal=True,
    request=[F("mechanism", "string")],
    response=[F("error_code", "int16"), F("mechanisms", "[]string")],
)

SASL_AUTHENTICATE = Api(
    key=36,
    name="SaslAuthenticate",
    min_version=0,
    max_version=2,
    flexible="2+",
    internal=True,
    request=[F("auth_bytes", "bytes")],
    response=[
        F("error_code", "int16"),
        F("error_message", "string", nullable="0+"),
        F("auth_bytes", "bytes"),
        F("session_lifetime_ms", "int64", "1+", default=0),
    ],
)

SECURITY_APIS: tuple[Api, ...] = (SASL_HANDSHAKE, SASL_AUTHENTICATE)
