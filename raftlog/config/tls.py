"""Listener security protocols and the TLS settings of SSL listeners, in Kafka's PEM form.

``listener.security.protocol.map`` gives each listener its protocol: PLAINTEXT, SSL,
SASL_PLAINTEXT and SASL_SSL (TLS first, then the SASL exchange of raftlog.config.sasl). An
SSL or SASL_SSL listener takes Kafka's ``ssl.*`` properties, each overridable per listener as
``listener.name.<lower-case name>.ssl.*``:

* the key and certificate chain: ``ssl.keystore.location`` (one PEM file holding the key and
  the chain) or inline ``ssl.keystore.certificate.chain`` + ``ssl.keystore.key``, with
  ``ssl.key.password`` for an encrypted key; ``ssl.keystore.type`` must be PEM (JKS and PKCS12
  are Java's formats and are refused with a clear error);
* the CAs that sign client certificates: ``ssl.truststore.location`` or inline
  ``ssl.truststore.certificates`` (``ssl.truststore.type=PEM``);
* ``ssl.client.auth`` none|requested|required, ``ssl.enabled.protocols`` (TLSv1.2,TLSv1.3),
  ``ssl.cipher.suites`` (OpenSSL names, TLS 1.2 only: Python cannot restrict TLS 1.3 suites);
* ``ssl.principal.mapping.rules`` (``raftlog.security.principal``).

Nothing here reads a file: ``raftlog.server.tls`` builds the ``ssl.SSLContext``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from raftlog.config.catalog import Properties
from raftlog.config.properties import ConfigError, parse_list
from raftlog.security.principal import PrincipalMapper, PrincipalMappingError

PLAINTEXT: Final = "PLAINTEXT"
SSL: Final = "SSL"
SASL_PLAINTEXT: Final = "SASL_PLAINTEXT"
SASL_SSL: Final = "SASL_SSL"
SASL_PROTOCOLS: Final = frozenset({SASL_PLAINTEXT, SASL_SSL})
TLS_PROTOCOLS: Final = frozenset({SSL, SASL_SSL})
KNOWN_PROTOCOLS: Final = frozenset({PLAINTEXT, SSL, *SASL_PROTOCOLS})
CLIENT_AUTH: Final = frozenset({"none", "requested", "required"})
TLS_VERSIONS: Final = ("TLSv1.2", "TLSv1.3")
# The ssl.* properties an SSL listener reads (each may be set per listener).
SSL_PROPERTIES: Final = (
    "ssl.keystore.type", "ssl.keystore.location", "ssl.keystore.certificate.chain",
    "ssl.keystore.key", "ssl.key.password", "ssl.truststore.type", "ssl.truststore.location",
    "ssl.truststore.certificates", "ssl.client.auth", "ssl.enabled.protocols",
    "ssl.cipher.suites", "ssl.principal.mapping.rules", "ssl.endpoint.identification.algorithm",
)
LISTENER_PREFIX: Final = "listener.name."  # listener.name.<lower-case name>.ssl.*


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """The TLS side of one SSL listener (what ``raftlog.server.tls`` builds a context from)."""

    listener: str
    keystore_location: str | None = None
    keystore_chain: str | None = None  # inline PEM certificate chain
    keystore_key: str | None = field(default=None, repr=False)  # inline PEM key
    key_password: str | None = field(default=None, repr=False)
    truststore_location: str | None = None
    truststore_certificates: str | None = None  # inline PEM CA certificates
    client_auth: str = "none"
    protocols: tuple[str, ...] = TLS_VERSIONS
    cipher_suites: tuple[str, ...] = ()
    principal_rules: str = "DEFAULT"
    # Whether the node's own connections to this listener of its peers check the peer's host
    # name against its certificate: "https" (Kafka's default) or "" (none).
    endpoint_identification: str = "https"

    @property
    def has_truststore(self) -> bool:
        return bool(self.truststore_location or self.truststore_certificates)


def parse_security_protocols(
    props: Properties, listener_names: set[str], controller_names: tuple[str, ...]
) -> dict[str, str]:
    """Each listener's protocol; refuses what raftlog cannot serve, saying what is missing."""
    protocol_map: dict[str, str] = {}
    for item in parse_list(props.required("listener.security.protocol.map")):
        name, _, protocol = item.partition(":")
        protocol_map[name.strip().upper()] = protocol.strip().upper()
    protocols = {}
    for name in sorted(listener_names):
        protocol = protocol_map.get(name, name)
        if protocol not in KNOWN_PROTOCOLS:
            raise ConfigError("listener.security.protocol.map",
                              f"listener {name} has no security protocol (got {protocol!r};"
                              f" expected one of {sorted(KNOWN_PROTOCOLS)})")
        if protocol != PLAINTEXT and name in controller_names:
            raise ConfigError(
                "listener.security.protocol.map",
                f"controller listener {name} cannot be {protocol}: it carries the Raft transport"
                " (pysyncobj, authenticated and encrypted with raft.secret, no TLS); map it to"
                " PLAINTEXT")
        protocols[name] = protocol
    return protocols


def parse_tls_settings(props: Properties, listener: str) -> TlsSettings:
    """The TLS settings of SSL or SASL_SSL listener ``listener`` (per-listener properties
    win)."""

    def scoped(name: str) -> str:
        return f"{LISTENER_PREFIX}{listener.lower()}.{name}"

    def text(name: str) -> str | None:
        override = props.given.get(scoped(name)) or None
        return override if override is not None else props.text(name)

    def where(name: str) -> str:
        """The property as it was set (the per-listener one when it was)."""
        return scoped(name) if props.given.get(scoped(name)) or None is not None else name

    for store in ("ssl.keystore.type", "ssl.truststore.type"):
        kind = (text(store) or "PEM").upper()
        if kind != "PEM":
            raise ConfigError(where(store), f"{kind} is a Java keystore format; raftlog reads"
                              " PEM only (convert with openssl, e.g. `openssl pkcs12 -in"
                              " store.p12 -nodes`, and set ssl.keystore.type=PEM)")
    location, chain, key = (text("ssl.keystore.location"), text("ssl.keystore.certificate.chain"),
                            text("ssl.keystore.key"))
    if location and (chain or key):
        raise ConfigError(where("ssl.keystore.location"), "set either ssl.keystore.location or"
                          " ssl.keystore.certificate.chain + ssl.keystore.key, not both")
    if not location and not (chain and key):
        raise ConfigError(where("ssl.keystore.location"), f"TLS listener {listener} needs its key"
                          " and certificate: ssl.keystore.location (a PEM file with both) or"
                          " ssl.keystore.certificate.chain + ssl.keystore.key")
    trust_location, trust_inline = (text("ssl.truststore.location"),
                                    text("ssl.truststore.certificates"))
    if trust_location and trust_inline:
        raise ConfigError(where("ssl.truststore.location"), "set either"
                          " ssl.truststore.location or ssl.truststore.certificates, not both")
    client_auth = (text("ssl.client.auth") or "none").strip().lower()
    if client_auth not in CLIENT_AUTH:
        raise ConfigError(where("ssl.client.auth"), f"expected none, requested or required,"
                          f" got {client_auth!r}")
    if client_auth != "none" and not (trust_location or trust_inline):
        raise ConfigError(where("ssl.client.auth"), f"{client_auth} needs a truststore"
                          " (ssl.truststore.location) to verify client certificates")
    protocols = tuple(parse_list(text("ssl.enabled.protocols") or ""))
    unknown = [p for p in protocols if p not in TLS_VERSIONS]
    if unknown or not protocols:
        raise ConfigError(where("ssl.enabled.protocols"),
                          f"supported: {', '.join(TLS_VERSIONS)}; got {list(protocols)}")
    rules = text("ssl.principal.mapping.rules") or "DEFAULT"
    try:
        PrincipalMapper(rules)
    except PrincipalMappingError as exc:
        raise ConfigError(where("ssl.principal.mapping.rules"), str(exc)) from exc
    # Kafka disables the check with an empty value, which text() would read as the default.
    algorithm_name = "ssl.endpoint.identification.algorithm"
    given = props.given.get(scoped(algorithm_name), props.given.get(algorithm_name))
    algorithm = (given if given is not None else "https").strip().lower()
    if algorithm not in ("https", "", "none"):
        raise ConfigError(where("ssl.endpoint.identification.algorithm"),
                          f"expected https or empty, got {algorithm!r}")
    return TlsSettings(
        endpoint_identification="https" if algorithm == "https" else "",
        listener=listener, keystore_location=location, keystore_chain=chain, keystore_key=key,
        key_password=text("ssl.key.password"), truststore_location=trust_location,
        truststore_certificates=trust_inline, client_auth=client_auth, protocols=protocols,
        cipher_suites=tuple(parse_list(text("ssl.cipher.suites") or "")),
        principal_rules=rules,
    )
