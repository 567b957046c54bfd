"""Who is on the other end of a connection, and what it may do: a pure core.

Every Kafka connection has one ``Session``. It starts as ``User:ANONYMOUS``, or on an SSL
listener as ``User:<DN>`` of the client's certificate (``raftlog.security.principal``); a
SaslHandshake and SaslAuthenticate exchange (``raftlog.server.sasl``) may turn it into an
authenticated principal. Authorization asks one question, as Kafka's ``Authorizer`` does: may this
principal perform this operation on this resource? (``raftlog.security.authorizer``: without
an authorizer only ``ClusterAction`` is guarded and only cluster members hold it; with
Kafka's StandardAuthorizer, ACLs from the metadata log decide.)

Cluster members prove they hold ``raft.secret`` with SCRAM-SHA-256. Their credentials are
derived from the secret (``ClusterCredentials``), so nothing new is stored or configured:
brokers authenticate as ``__raftlog-broker-<node.id>`` and operator tools as
``__raftlog-admin``. The secret never crosses the network; a server that does not know it
cannot complete the exchange either (the client checks the server's signature).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from raftlog.protocol.errors import ErrorCode
from raftlog.security.acl import AclOperation, AclResourceType
from raftlog.security.scram import (
    ITERATIONS_MIN,
    ScramClient,
    ScramCredential,
    ScramError,
    ScramExchange,
    ScramServer,
)

log = logging.getLogger(__name__)

CLUSTER_MECHANISM: Final = "SCRAM-SHA-256"
BROKER_USER_PREFIX: Final = "__raftlog-broker-"
ADMIN_USER: Final = "__raftlog-admin"
BROKER_EPOCH_EXTENSION: Final = "brokerepoch"
# Kafka's limit for frames before a connection has authenticated (SaslHandshake and
# SaslAuthenticate are tiny; a larger frame is an attack or a confused client).
PRE_AUTH_FRAME_BYTES_MAX: Final = 512 * 1024
# The Kafka error codes this exchange answers with, as plain ints from the one table.
UNSUPPORTED_SASL_MECHANISM: Final = int(ErrorCode.UNSUPPORTED_SASL_MECHANISM)
ILLEGAL_SASL_STATE: Final = int(ErrorCode.ILLEGAL_SASL_STATE)
SASL_AUTHENTICATION_FAILED: Final = int(ErrorCode.SASL_AUTHENTICATION_FAILED)
API_VERSIONS_KEY: Final = 18


class Exchange(Protocol):
    """One SASL exchange on the server side (``ScramExchange``, ``PlainExchange``):
    ``respond`` to each client token (raises ``ScramError`` on failure) until ``complete``."""

    @property
    def user(self) -> str | None: ...

    @property
    def extensions(self) -> Mapping[str, str]: ...

    complete: bool

    def respond(self, token: bytes) -> bytes: ...


class Authenticator(Protocol):
    """Starts exchanges for the mechanisms it serves (``raftlog.security.sasl_server``)."""

    @property
    def reauth_ms(self) -> int: ...

    def start(self, mechanism: str) -> Exchange | None: ...


@dataclass(frozen=True)
class KafkaPrincipal:
    type: str
    name: str

    def __str__(self) -> str:
        return f"{self.type}:{self.name}"


ANONYMOUS: Final = KafkaPrincipal("User", "ANONYMOUS")


# Kafka's operations and resource types, with their wire codes (raftlog.security.acl).
Operation = AclOperation
ResourceType = AclResourceType


class SaslState(enum.Enum):
    NONE = "none"  # no handshake yet: the connection is anonymous
    HANDSHAKE_DONE = "handshake"  # mechanism chosen: only SaslAuthenticate may follow
    CHALLENGED = "challenged"  # server-first sent, waiting for the client's proof
    AUTHENTICATED = "authenticated"
    FAILED = "failed"  # the connection is closed after the error response


class ClusterCredentials:
    """SCRAM credentials derived from ``raft.secret`` for the cluster's own principals."""

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("an empty cluster secret authenticates nobody")
        self._secret = secret.encode("utf-8")
        self._credential: ScramCredential | None = None

    def lookup(self, mechanism: str, user: str) -> ScramCredential | None:
        """One credential for every cluster user: they share the password, and the user name
        is bound into every proof anyway (SCRAM's AuthMessage). One salt means one PBKDF2
        derivation per node, computed once: per-user salts let a stranger make a node derive
        (and keep) a credential for each of a billion broker ids."""
        if mechanism != CLUSTER_MECHANISM or not is_cluster_user(user):
            return None
        if self._credential is None:
            # Deterministic, so every node derives the same credential without storing one;
            # keyed by the secret, so it tells an eavesdropper nothing new.
            salt = hmac.new(self._secret, b"raftlog scram salt", hashlib.sha256).digest()[:16]
            self._credential = ScramCredential.from_password(
                mechanism, self._secret, salt, ITERATIONS_MIN)
        return self._credential

    @property
    def decoy_key(self) -> bytes:
        return hmac.new(self._secret, b"raftlog scram decoy", hashlib.sha256).digest()

    def client(self, user: str, extensions: dict[str, str] | None = None) -> ScramClient:
        return ScramClient(CLUSTER_MECHANISM, user, self._secret, dict(extensions or {}))


def broker_user(node_id: int) -> str:
    return f"{BROKER_USER_PREFIX}{node_id}"


def is_cluster_user(user: str) -> bool:
    return user == ADMIN_USER or _broker_id_of(user) is not None


def _broker_id_of(user: str) -> int | None:
    if not user.startswith(BROKER_USER_PREFIX):
        return None
    digits = user[len(BROKER_USER_PREFIX):]
    return int(digits) if digits.isdigit() and len(digits) <= 9 else None


@dataclass
class Session:
    """One connection's identity. Mutated only by the connection's reader task, in order."""

    peer: str
    principal: KafkaPrincipal = ANONYMOUS
    # Set when the principal is a broker: its node id and the broker epoch it claimed when
    # it authenticated (KIP-903's replica epoch; -1 before it registered).
    broker_id: int | None = None
    broker_epoch: int = -1
    sasl_state: SaslState = SaslState.NONE
    # The listener the connection came in on (its PLAIN users may be its own).
    listener: str = "PLAINTEXT"
    # On a SASL_* listener: nothing but ApiVersions and the SASL exchange until authenticated.
    sasl_required: bool = False
    # KIP-368: when the authenticated session ends (the clock's seconds; None: never), and the
    # clock (injected by the trio shell, so this module reads none itself).
    expires_at: float | None = None
    clock: Callable[[], float] | None = field(default=None, repr=False)
    _exchange: Exchange | None = field(default=None, repr=False)
    _mechanism: str = ""
    _reauthenticating: bool = False

    @property
    def host(self) -> str:
        """The peer's address without its port (what ACL hosts match)."""
        host = self.peer.rpartition(":")[0] if ":" in self.peer else self.peer
        return host.strip("[]")

    @property
    def authenticated(self) -> bool:
        return self.sasl_state is SaslState.AUTHENTICATED

    @property
    def frame_bytes_max(self) -> int | None:
        """A tighter frame limit while a SASL exchange is under way (and on a SASL listener
        before authentication), else None."""
        if self.sasl_state in (SaslState.HANDSHAKE_DONE, SaslState.CHALLENGED):
            return PRE_AUTH_FRAME_BYTES_MAX
        if self.sasl_required and not self.authenticated:
            return PRE_AUTH_FRAME_BYTES_MAX
        return None

    @property
    def expired(self) -> bool:
        """Whether the authenticated session outlived ``connections.max.reauth.ms``."""
        return (self.expires_at is not None and self.clock is not None
                and self.clock() >= self.expires_at)

    def may_send(self, api_key: int, sasl_keys: frozenset[int]) -> bool:
        """Whether a request of ``api_key`` is allowed in the current SASL state (Kafka: once
        a handshake starts, nothing but SaslAuthenticate until it ends; on a SASL listener
        nothing but ApiVersions and the SASL exchange before authentication)."""
        if self.sasl_state is SaslState.FAILED:
            return False
        if self.sasl_state in (SaslState.HANDSHAKE_DONE, SaslState.CHALLENGED):
            return api_key in sasl_keys
        if self.expired and api_key not in sasl_keys:
            # Kafka closes a connection whose session expired unless it re-authenticates.
            log.info("%s: the session of %s expired without re-authentication", self.peer,
                     self.principal)
            return False
        if self.sasl_required and not self.authenticated:
            return api_key in sasl_keys or api_key == API_VERSIONS_KEY
        return True

    def handshake(self, mechanism: str,
                  server: ClusterCredentials | Authenticator | None) -> int:
        """SaslHandshake: returns a Kafka error code (0 or one of the SASL errors above).
        An authenticated session may hand-shake again to re-authenticate (KIP-368) with the
        mechanism it used when sessions have a lifetime (``connections.max.reauth.ms`` > 0:
        clients re-authenticate only then); the principal must stay the same."""
        reauth = not isinstance(server, ClusterCredentials) and server is not None and (
            server.reauth_ms > 0)
        if (self.sasl_state is SaslState.AUTHENTICATED and reauth
                and mechanism == self._mechanism):
            self._reauthenticating = True
        elif self.sasl_state is not SaslState.NONE:
            return ILLEGAL_SASL_STATE
        exchange: Exchange | None
        if isinstance(server, ClusterCredentials):
            exchange = None if mechanism != CLUSTER_MECHANISM else ScramExchange(
                ScramServer(mechanism, server.lookup, server.decoy_key))
        else:
            exchange = None if server is None else server.start(mechanism)
        if exchange is None:
            self._reauthenticating = False
            return UNSUPPORTED_SASL_MECHANISM
        self._exchange = exchange
        self._mechanism = mechanism
        self.sasl_state = SaslState.HANDSHAKE_DONE
        return 0

    def authenticate(self, auth_bytes: bytes) -> tuple[int, bytes, str | None]:
        """SaslAuthenticate: (error code, server bytes, error message)."""
        exchange = self._exchange
        if exchange is None or self.sasl_state not in (SaslState.HANDSHAKE_DONE,
                                                        SaslState.CHALLENGED):
            self.sasl_state = SaslState.FAILED
            return ILLEGAL_SASL_STATE, b"", "SaslAuthenticate before SaslHandshake"
        try:
            reply = exchange.respond(auth_bytes)
        except ScramError as exc:
            self.sasl_state = SaslState.FAILED
            self._exchange = None
            log.warning("authentication failed from %s (%s, user %r): %s", self.peer,
                        self._mechanism, exchange.user, exc)
            return (SASL_AUTHENTICATION_FAILED, b"",
                    f"Authentication failed during {self._mechanism} authentication")
        if not exchange.complete:
            self.sasl_state = SaslState.CHALLENGED
            return 0, reply, None
        if self._reauthenticating and exchange.user != self.principal.name:
            self.sasl_state = SaslState.FAILED
            self._exchange = None
            log.warning("re-authentication from %s as %r refused: the connection is %s",
                        self.peer, exchange.user, self.principal)
            return (SASL_AUTHENTICATION_FAILED, b"",
                    "Cannot change principals during re-authentication")
        self._become(exchange)
        return 0, reply, None

    def _become(self, exchange: Exchange) -> None:
        assert exchange.user is not None
        self.principal = KafkaPrincipal("User", exchange.user)
        self.broker_id = _broker_id_of(exchange.user)
        epoch = exchange.extensions.get(BROKER_EPOCH_EXTENSION, "-1")
        self.broker_epoch = int(epoch) if epoch.lstrip("-").isdigit() else -1
        self.sasl_state = SaslState.AUTHENTICATED
        self._exchange = None
        if self._reauthenticating:
            log.debug("%s re-authenticated as %s", self.peer, self.principal)
        else:
            log.info("%s authenticated as %s (%s%s)", self.peer, self.principal, self._mechanism,
                     ", old librdkafka's SCRAM nonce" if getattr(exchange, "legacy_nonce", False)
                     else "")
        self._reauthenticating = False
