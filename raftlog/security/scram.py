"""SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka speaks them: a pure core.

No I/O: ``ScramServer`` and ``ScramClient`` are driven by the bytes of each SASL step and
return the bytes to send back. The primitives are ``hashlib.pbkdf2_hmac`` and ``hmac``.

Kafka's dialect: no channel binding (the GS2 header is ``n,,``), extensions after the nonce
in the client-first message (``tokenauth=true`` in Kafka; raftlog adds ``brokerepoch=N`` for
cluster members), at least 4096 iterations. The server:

* extends the client's nonce with its own (a client whose final message names another nonce
  fails; the one exception is old librdkafka's form, the client nonce followed by the full
  nonce, which still carries the server's nonce, see ``ScramServer.final``);
* compares the proof in constant time (``hmac.compare_digest``);
* answers an unknown user with a server-first message built from a salt derived from the
  name, so an unknown user and a wrong password fail at the same step with the same error
  (no user enumeration).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

ITERATIONS_MIN: Final = 4096
NONCE_BYTES: Final = 24
MESSAGE_BYTES_MAX: Final = 4096  # a SCRAM message is a few hundred bytes
_HASHES: Final = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MECHANISMS: Final = tuple(_HASHES)


class ScramError(Exception):
    """The exchange failed: malformed message, bad proof, unknown user (indistinguishable)."""


@dataclass(frozen=True)
class ScramCredential:
    """What a server stores for one user and mechanism: never the password."""

    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def from_password(cls, mechanism: str, password: bytes, salt: bytes,
                      iterations: int = ITERATIONS_MIN) -> ScramCredential:
        name = _hash_name(mechanism)
        salted = salted_password(mechanism, password, salt, iterations)
        client_key = _hmac(name, salted, b"Client Key")
        return cls(mechanism, salt, iterations, hashlib.new(name, client_key).digest(),
                   _hmac(name, salted, b"Server Key"))


CredentialLookup = Callable[[str, str], ScramCredential | None]  # (mechanism, user)


def salted_password(mechanism: str, password: bytes, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(_hash_name(mechanism), password, salt, iterations)


@dataclass
class ScramServer:
    """One server side of one exchange: ``first`` then ``final``."""

    mechanism: str
    lookup: CredentialLookup
    # Derives the decoy salt for unknown users: keyed, so it is stable per name and says
    # nothing about which names exist.
    decoy_key: bytes
    user: str | None = None
    extensions: Mapping[str, str] = field(default_factory=dict)
    _credential: ScramCredential | None = None
    _client_first_bare: str = ""
    _server_first: str = ""
    _nonce: str = ""
    _client_nonce: str = ""
    _done: bool = False
    legacy_nonce: bool = False  # the client-final nonce had old librdkafka's extra prefix

    def first(self, message: bytes) -> bytes:
        """The client-first message in, the server-first message out."""
        text = _text(message)
        gs2, sep, bare = _split_gs2(text)
        if gs2 != "n,," or not sep:
            raise ScramError("channel binding and authzid are not supported (expected 'n,,')")
        attrs = _attributes(bare)
        if list(attrs)[:2] != ["n", "r"]:
            raise ScramError("client-first message must start with n= and r=")
        self.user = _unescape_name(attrs.pop("n"))
        client_nonce = attrs.pop("r")
        if not client_nonce or "," in client_nonce:
            raise ScramError("bad client nonce")
        self.extensions = attrs
        self._client_first_bare = bare
        self._client_nonce = client_nonce
        self._nonce = client_nonce + _nonce()
        credential = self.lookup(self.mechanism, self.user)
        if credential is not None and credential.iterations < ITERATIONS_MIN:
            credential = None  # refuse weak credentials exactly like unknown users
        self._credential = credential
        salt, iterations = (credential.salt, credential.iterations) if credential else (
            _hmac("sha256", self.decoy_key, self.user.encode())[:16], ITERATIONS_MIN)
        self._server_first = (f"r={self._nonce},s={base64.b64encode(salt).decode()},"
                              f"i={iterations}")
        return self._server_first.encode()

    def final(self, message: bytes) -> bytes:
        """The client-final message in, the server-final message out; raises on a bad proof."""
        if not self._server_first or self._done:
            raise ScramError("client-final message out of order")
        self._done = True
        text = _text(message)
        without_proof, sep, proof_text = text.rpartition(",p=")
        if not sep:
            raise ScramError("client-final message without a proof")
        attrs = _attributes(without_proof)
        if attrs.get("c") != base64.b64encode(b"n,,").decode():
            raise ScramError("channel binding does not match the client-first message")
        nonce = attrs.get("r")
        if nonce == self._client_nonce + self._nonce:
            # librdkafka before 2.6.1 (Debian's kcat) prefixes the full nonce with its own
            # once more (librdkafka#4895). Accepted in exactly this form: it still carries the
            # whole server nonce, and the proof covers it and this exchange's server-first.
            self.legacy_nonce = True
        elif nonce != self._nonce:
            raise ScramError("nonce does not match the server's")
        proof = _b64(proof_text)
        credential = self._credential
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}"
        if credential is None or not _proof_ok(credential, auth_message, proof):
            raise ScramError("Authentication failed: invalid credentials")
        name = _hash_name(self.mechanism)
        signature = _hmac(name, credential.server_key, auth_message.encode())
        return b"v=" + base64.b64encode(signature)


class ScramExchange:
    """``ScramServer`` as a SASL exchange of two client tokens (``respond`` each in turn)."""

    def __init__(self, server: ScramServer) -> None:
        self._server = server
        self._step = 0
        self.complete = False

    @property
    def user(self) -> str | None:
        return self._server.user

    @property
    def extensions(self) -> Mapping[str, str]:
        return self._server.extensions

    @property
    def legacy_nonce(self) -> bool:
        return self._server.legacy_nonce

    def respond(self, token: bytes) -> bytes:
        self._step += 1
        if self._step == 1:
            return self._server.first(token)
        reply = self._server.final(token)
        self.complete = True
        return reply


@dataclass
class ScramClient:
    """One client side of one exchange: ``first``, ``final``, then ``verify``."""

    mechanism: str
    user: str
    password: bytes
    extensions: Mapping[str, str] = field(default_factory=dict)
    _nonce: str = field(default_factory=lambda: _nonce())
    _client_first_bare: str = ""
    _auth_message: str = ""
    _salted: bytes = b""

    def first(self) -> bytes:
        parts = [f"n={_escape_name(self.user)}", f"r={self._nonce}"]
        parts += [f"{key}={value}" for key, value in self.extensions.items()]
        self._client_first_bare = ",".join(parts)
        return ("n,," + self._client_first_bare).encode()

    def final(self, server_first: bytes) -> bytes:
        text = _text(server_first)
        attrs = _attributes(text)
        nonce, salt, iterations = attrs.get("r", ""), attrs.get("s", ""), attrs.get("i", "")
        if not nonce.startswith(self._nonce) or len(nonce) <= len(self._nonce):
            raise ScramError("server nonce does not extend the client's")
        if not iterations.isdigit() or int(iterations) < ITERATIONS_MIN:
            raise ScramError(f"server asks for {iterations!r} iterations")
        name = _hash_name(self.mechanism)
        self._salted = salted_password(self.mechanism, self.password, _b64(salt),
                                       int(iterations))
        without_proof = f"c={base64.b64encode(b'n,,').decode()},r={nonce}"
        self._auth_message = f"{self._client_first_bare},{text},{without_proof}"
        client_key = _hmac(name, self._salted, b"Client Key")
        stored_key = hashlib.new(name, client_key).digest()
        signature = _hmac(name, stored_key, self._auth_message.encode())
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> None:
        """Checks the server's signature: the server knew the credential too."""
        attrs = _attributes(_text(server_final))
        if "e" in attrs:
            raise ScramError(f"server refused: {attrs['e']}")
        name = _hash_name(self.mechanism)
        server_key = _hmac(name, self._salted, b"Server Key")
        expected = _hmac(name, server_key, self._auth_message.encode())
        if not hmac.compare_digest(_b64(attrs.get("v", "")), expected):
            raise ScramError("server signature does not verify")


def _proof_ok(credential: ScramCredential, auth_message: str, proof: bytes) -> bool:
    name = _hash_name(credential.mechanism)
    signature = _hmac(name, credential.stored_key, auth_message.encode())
    if len(proof) != len(signature):
        return False
    client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
    return hmac.compare_digest(hashlib.new(name, client_key).digest(), credential.stored_key)


def _hash_name(mechanism: str) -> str:
    try:
        return _HASHES[mechanism]
    except KeyError:
        raise ScramError(f"unknown SCRAM mechanism {mechanism!r}") from None


def _hmac(name: str, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, name).digest()


def _nonce() -> str:
    return secrets.token_urlsafe(NONCE_BYTES)


def _text(message: bytes) -> str:
    if len(message) > MESSAGE_BYTES_MAX:
        raise ScramError(f"SCRAM message of {len(message)} bytes")
    try:
        return message.decode("utf-8")
    except UnicodeDecodeError:
        raise ScramError("SCRAM message is not UTF-8") from None


def _split_gs2(text: str) -> tuple[str, str, str]:
    """'n,,n=user,r=...' -> ('n,,', ',', 'n=user,r=...')."""
    first = text.find(",")
    second = text.find(",", first + 1) if first >= 0 else -1
    if second < 0:
        return text, "", ""
    return text[: second + 1], ",", text[second + 1 :]


def _attributes(text: str) -> dict[str, str]:
    attrs: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key or key in attrs:
            raise ScramError(f"malformed SCRAM attribute {item[:40]!r}")
        attrs[key] = value
    return attrs


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise ScramError("bad base64 in SCRAM message") from None


def _escape_name(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _unescape_name(name: str) -> str:
    if "=" in name.replace("=3D", "").replace("=2C", ""):
        raise ScramError("bad escape in SCRAM user name")
    return name.replace("=2C", ",").replace("=3D", "=")
