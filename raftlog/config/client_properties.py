"""Client properties (``--command-config FILE``): how a ``raftlog`` tool connects, in the names
librdkafka and Kafka's Java clients use, so the file an operator gives confluent-kafka, kcat or
``kafka-topics.sh --command-config`` works here as is. One parser for every tool.

* ``security.protocol``: PLAINTEXT (default), SSL, SASL_PLAINTEXT, SASL_SSL.
* TLS, librdkafka's names or Java's PEM ones: ``ssl.ca.location`` / ``ssl.truststore.location``
  (CA certificates; without one the system's CAs), ``ssl.certificate.location`` +
  ``ssl.key.location`` / ``ssl.keystore.location`` (one PEM with key and chain), for mutual TLS;
  ``ssl.key.password``; ``ssl.endpoint.identification.algorithm`` (``https``, the default,
  checks the broker's host name against its certificate; ``none`` or empty does not);
  ``enable.ssl.certificate.verification=false`` (librdkafka) trusts any certificate.
  ``ssl.keystore.type``/``ssl.truststore.type`` must be PEM.
* SASL: ``sasl.mechanism`` (Java) or ``sasl.mechanisms`` (librdkafka): PLAIN, SCRAM-SHA-256,
  SCRAM-SHA-512; ``sasl.username`` + ``sasl.password`` (librdkafka) or Java's
  ``sasl.jaas.config`` (``...PlainLoginModule``/``...ScramLoginModule required
  username="..." password="...";``).
* ``raft.secret`` / ``raft.secret.file``: log in as the cluster admin (``__raftlog-admin``,
  SCRAM-SHA-256 with credentials derived from the secret) instead of a user; needed by the
  tools that act for the cluster (``transactions abort``).

Properties that only tune a client (``client.id``, ``acks``, ...) are ignored. Pure: nothing
here reads a file but ``raft.secret.file`` (through the server config's reader).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from raftlog.config.properties import ConfigError, parse_bool
from raftlog.config.server_config import raft_secret_of

PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_LOGIN_MODULES: Final = {
    "org.apache.kafka.common.security.plain.PlainLoginModule": "PLAIN",
    "org.apache.kafka.common.security.scram.ScramLoginModule": "SCRAM",
}
_JAAS: Final = re.compile(r"\s*([\w.$]+)\s+(required|requisite|sufficient|optional)\s+(.*?);?\s*$",
                          re.DOTALL)
_OPTION: Final = re.compile(r'\s*([A-Za-z0-9_.\-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s;"]+)')


@dataclass(frozen=True)
class ClientTlsSettings:
    """What a client's ``ssl.SSLContext`` is built from (``raftlog.client.tls``)."""

    ca_location: str | None = None
    certificate_location: str | None = None  # PEM certificate chain (or key + chain)
    key_location: str | None = None  # PEM key; None when certificate_location holds it
    key_password: str | None = field(default=None, repr=False)
    check_hostname: bool = True
    verify: bool = True


@dataclass(frozen=True)
class ClientSecurity:
    """How a tool connects: ``tls`` for SSL/SASL_SSL, a SASL user, or the cluster admin."""

    protocol: str = "PLAINTEXT"
    tls: ClientTlsSettings | None = None
    mechanism: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    raft_secret: str | None = field(default=None, repr=False)

    @property
    def uses_sasl(self) -> bool:
        return self.protocol.startswith("SASL_")


def parse_client_properties(props: Mapping[str, str], source: str = "--command-config"
                            ) -> ClientSecurity:
    """The client security of ``props`` (``source`` names the file in errors).

    Raises:
        ConfigError: an unknown protocol or mechanism, a keystore that is not PEM, a SASL
            protocol without a mechanism and credentials (or the cluster secret).
    """

    def text(name: str) -> str | None:
        value = props.get(name, "").strip()
        return value or None

    protocol = (text("security.protocol") or "PLAINTEXT").upper()
    if protocol not in PROTOCOLS:
        raise ConfigError("security.protocol", f"{protocol!r} in {source}; expected one of"
                          f" {', '.join(PROTOCOLS)}")
    secret = raft_secret_of(props)
    tls = _tls(props) if protocol in ("SSL", "SASL_SSL") else None
    mechanism = text("sasl.mechanism") or text("sasl.mechanisms")
    username, password = text("sasl.username"), props.get("sasl.password")
    jaas = text("sasl.jaas.config")
    if jaas is not None:
        module, username, password = _parse_jaas(jaas)
        if mechanism is None and module == "PLAIN":
            mechanism = "PLAIN"
        if mechanism is not None and (module == "PLAIN") != (mechanism.upper() == "PLAIN"):
            raise ConfigError("sasl.jaas.config", f"its login module does not match"
                              f" sasl.mechanism={mechanism}")
    if mechanism is not None:
        mechanism = mechanism.upper()
        if mechanism not in MECHANISMS:
            raise ConfigError("sasl.mechanism", f"{mechanism!r} in {source}; raftlog's tools"
                              f" log in with {', '.join(MECHANISMS)}")
    if protocol.startswith("SASL_") and secret is None:
        if mechanism is None:
            raise ConfigError("sasl.mechanism", f"{protocol} in {source} needs sasl.mechanism"
                              " (or raft.secret to log in as the cluster admin)")
        if not username or password is None:
            raise ConfigError("sasl.username", f"{protocol} in {source} needs sasl.username and"
                              " sasl.password (or sasl.jaas.config)")
    return ClientSecurity(protocol, tls, mechanism, username, password, secret)


def _tls(props: Mapping[str, str]) -> ClientTlsSettings:
    get = props.get
    for kind in ("ssl.keystore.type", "ssl.truststore.type"):
        value = (get(kind, "") or "PEM").strip().upper()
        if value != "PEM":
            raise ConfigError(kind, f"{value} is a Java keystore format; raftlog's tools read"
                              " PEM (ssl.ca.location, ssl.certificate.location, ssl.key.location)")
    ca = (get("ssl.ca.location", "") or get("ssl.truststore.location", "")).strip() or None
    cert = (get("ssl.certificate.location", "") or get("ssl.keystore.location", "")).strip()
    key = get("ssl.key.location", "").strip() or None
    if key and not cert:
        raise ConfigError("ssl.key.location", "needs ssl.certificate.location too")
    algorithm = get("ssl.endpoint.identification.algorithm", "https").strip().lower()
    if algorithm not in ("https", "none", ""):
        raise ConfigError("ssl.endpoint.identification.algorithm",
                          f"expected https or none, got {algorithm!r}")
    verify = parse_bool("enable.ssl.certificate.verification",
                        get("enable.ssl.certificate.verification", "true").strip() or "true")
    return ClientTlsSettings(ca, cert or None, key, get("ssl.key.password") or None,
                             check_hostname=algorithm == "https" and verify, verify=verify)


def _parse_jaas(text: str) -> tuple[str, str | None, str | None]:
    """(PLAIN or SCRAM, username, password) of one JAAS login line."""
    match = _JAAS.fullmatch(text)
    if match is None or match.group(1) not in _LOGIN_MODULES:
        raise ConfigError("sasl.jaas.config", "expected org.apache.kafka.common.security."
                          "plain.PlainLoginModule or ...scram.ScramLoginModule required"
                          ' username="..." password="...";')
    options: dict[str, str] = {}
    rest = match.group(3)
    pos = 0
    while rest[pos:].strip():
        option = _OPTION.match(rest, pos)
        if option is None:
            raise ConfigError("sasl.jaas.config", f"cannot parse options at {rest[pos:pos + 30]!r}")
        value = option.group(2)
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        options[option.group(1)] = value
        pos = option.end()
    return _LOGIN_MODULES[match.group(1)], options.get("username"), options.get("password")
