"""The node's SASL server for users and cluster members: which mechanisms, whose credentials.

``SaslAuthenticator`` answers a SaslHandshake's question "which mechanisms?" and starts one
exchange per SaslAuthenticate sequence:

* SCRAM-SHA-256 / SCRAM-SHA-512 (``raftlog.security.scram``) with the users of the metadata
  log (salted keys, looked up at the moment of the exchange, so a user added or deleted on
  the controller counts on every node as soon as its image has it) and, for SCRAM-SHA-256,
  the cluster's own principals derived from ``raft.secret``. A user name reserved for the
  cluster (``__raftlog-broker-<id>``, ``__raftlog-admin``) is only ever looked up among the
  cluster credentials, whatever the metadata log holds, and is served even when
  ``sasl.enabled.mechanisms`` leaves SCRAM-SHA-256 out (nodes must reach each other).
* PLAIN (RFC 4616): one token ``authzid NUL user NUL password`` checked against the JAAS users
  (``raftlog.config.sasl``); the password comparison is constant-time (HMAC digests of both
  sides, so neither the length nor the first differing byte shows), and an unknown user is
  compared against a decoy so it fails the same way and in the same time.

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from raftlog.security.scram import ScramCredential, ScramError, ScramExchange, ScramServer
from raftlog.security.session import CLUSTER_MECHANISM, ClusterCredentials, is_cluster_user

PLAIN: Final = "PLAIN"
SCRAM_MECHANISMS: Final = ("SCRAM-SHA-256", "SCRAM-SHA-512")
PLAIN_TOKEN_BYTES_MAX: Final = 4096
# (mechanism, user) -> the user's SCRAM credential from the metadata image, or None.
UserLookup = Callable[[str, str], ScramCredential | None]


class PlainExchange:
    """One PLAIN exchange: a single client token, no server challenge."""

    def __init__(self, users: Mapping[str, str], decoy_key: bytes) -> None:
        self._users = users
        self._decoy_key = decoy_key
        self.user: str | None = None
        self.extensions: Mapping[str, str] = {}
        self.complete = False

    def respond(self, token: bytes) -> bytes:
        if self.complete or len(token) > PLAIN_TOKEN_BYTES_MAX:
            raise ScramError("unexpected PLAIN token")
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise ScramError("a PLAIN token is authzid NUL user NUL password")
        try:
            authzid, user, password = (part.decode("utf-8") for part in parts)
        except UnicodeDecodeError:
            raise ScramError("PLAIN token is not UTF-8") from None
        if not user or (authzid and authzid != user):
            raise ScramError("PLAIN authorization id must be empty or the user name")
        self.user = user
        known = self._users.get(user) if not is_cluster_user(user) else None
        expected = known if known is not None else "\0decoy"
        ok = hmac.compare_digest(self._digest(password), self._digest(expected))
        if known is None or not ok:
            raise ScramError("Authentication failed: Invalid username or password")
        self.complete = True
        return b""

    def _digest(self, text: str) -> bytes:
        return hmac.new(self._decoy_key, text.encode("utf-8"), hashlib.sha256).digest()


@dataclass
class SaslAuthenticator:
    """The node's SASL mechanisms and credentials (one per listener: PLAIN users may differ).

    Args:
        enabled: ``sasl.enabled.mechanisms``.
        cluster: credentials derived from ``raft.secret``, None without a secret.
        users: the SCRAM users of the current metadata image.
        plain_users: the JAAS ``user_<name>`` entries of this listener.
        reauth_ms: ``connections.max.reauth.ms`` (0: sessions never expire).
    """

    enabled: tuple[str, ...]
    cluster: ClusterCredentials | None = None
    users: UserLookup = field(default=lambda mechanism, user: None)
    plain_users: Mapping[str, str] = field(default_factory=dict, repr=False)
    reauth_ms: int = 0
    decoy_key: bytes = field(default=b"", repr=False)

    def __post_init__(self) -> None:
        if not self.decoy_key:
            # Keyed by raft.secret: every node answers an unknown user with the same salt.
            self.decoy_key = (self.cluster.decoy_key if self.cluster is not None
                              else secrets.token_bytes(32))

    @property
    def mechanisms(self) -> list[str]:
        """What a SaslHandshake answer lists."""
        listed = list(self.enabled)
        if self.cluster is not None and CLUSTER_MECHANISM not in listed:
            listed.append(CLUSTER_MECHANISM)
        return listed

    def start(self, mechanism: str) -> PlainExchange | ScramExchange | None:
        """A new exchange for ``mechanism``, or None when it is not served."""
        if mechanism == PLAIN and PLAIN in self.enabled:
            return PlainExchange(self.plain_users, self.decoy_key)
        if mechanism in SCRAM_MECHANISMS and mechanism in self.mechanisms:
            user_scram = mechanism in self.enabled
            return ScramExchange(ScramServer(
                mechanism, lambda m, user: self._scram_lookup(m, user, user_scram),
                self.decoy_key))
        return None

    def _scram_lookup(self, mechanism: str, user: str, user_scram: bool
                      ) -> ScramCredential | None:
        if is_cluster_user(user):
            return None if self.cluster is None else self.cluster.lookup(mechanism, user)
        return self.users(mechanism, user) if user_scram else None
