"""SASL settings for client authentication: Kafka's property names, a pure parser.

* ``sasl.enabled.mechanisms``: Kafka's default is GSSAPI, which raftlog does not serve; when
  the property is unset raftlog enables ``PLAIN,SCRAM-SHA-256,SCRAM-SHA-512`` (PLAIN only
  authenticates users configured in a JAAS line, so with none configured it admits nobody).
  Setting it to a list without GSSAPI/OAUTHBEARER restricts the mechanisms; an unknown or
  unserved mechanism in the list is a configuration error.
* PLAIN users come from Kafka's JAAS syntax, per listener first
  (``listener.name.<listener>.plain.sasl.jaas.config``), then broker-wide
  (``sasl.jaas.config``)::

      org.apache.kafka.common.security.plain.PlainLoginModule required
          user_alice="alice-secret" user_bob="bob-secret";

  The ``user_<name>="<password>"`` options are the users; ``username``/``password`` (the
  broker's own client login in Kafka) are accepted and ignored.
* ``connections.max.reauth.ms`` (default 0: never): the session lifetime SaslAuthenticate v1+
  tells clients (KIP-368); a connection must re-authenticate before it runs out.

SCRAM users live in the metadata log (``raftlog users``, AlterUserScramCredentials).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from raftlog.config.properties import LONG_MAX, ConfigError, parse_int, parse_list

SERVED_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
DEFAULT_MECHANISMS: Final = SERVED_MECHANISMS  # when sasl.enabled.mechanisms is unset
PLAIN_LOGIN_MODULE: Final = "org.apache.kafka.common.security.plain.PlainLoginModule"
SASL_PROPERTY_DEFAULTS: Final[Mapping[str, str | None]] = {
    "sasl.enabled.mechanisms": None,
    "sasl.jaas.config": None,
    "connections.max.reauth.ms": "0",
}
_OPTION: Final = re.compile(r'\s*([A-Za-z0-9_.\-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s;"]+)')
_LISTENER_JAAS: Final = re.compile(r"listener\.name\.([^.]+)\.plain\.sasl\.jaas\.config")
_LISTENER_MECHANISMS: Final = re.compile(r"listener\.name\.([^.]+)\.sasl\.enabled\.mechanisms")


@dataclass(frozen=True)
class SaslSettings:
    """What the node's SASL server serves (``raftlog.security.sasl_server``)."""

    enabled_mechanisms: tuple[str, ...] = DEFAULT_MECHANISMS
    # Broker-wide PLAIN users, and per-listener ones (which replace them on that listener).
    plain_users: Mapping[str, str] = field(default_factory=dict, repr=False)
    listener_plain_users: Mapping[str, Mapping[str, str]] = field(default_factory=dict,
                                                                  repr=False)
    reauth_ms: int = 0
    # The listeners whose protocol is SASL_PLAINTEXT or SASL_SSL: a connection there must
    # authenticate before anything but ApiVersions and the SASL exchange.
    sasl_listeners: tuple[str, ...] = ()
    # listener.name.<listener>.sasl.enabled.mechanisms, which replace the broker-wide list.
    listener_mechanisms: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def plain_users_of(self, listener: str) -> Mapping[str, str]:
        return self.listener_plain_users.get(listener.upper(), self.plain_users)

    def mechanisms_of(self, listener: str) -> tuple[str, ...]:
        return self.listener_mechanisms.get(listener.upper(), self.enabled_mechanisms)


def parse_sasl_settings(props: Mapping[str, str], protocol_map: str = "",
                        listener_names: tuple[str, ...] = ()) -> SaslSettings:
    """The SASL settings of the node's merged properties (``protocol_map``: the value of
    ``listener.security.protocol.map``; ``listener_names``: the node's listeners).

    Raises:
        ConfigError: an unserved mechanism, or a JAAS line that is not a PlainLoginModule.
    """
    mechanisms = _mechanisms("sasl.enabled.mechanisms", props.get("sasl.enabled.mechanisms", ""))
    listener_mechanisms = {}
    jaas = props.get("sasl.jaas.config", "")
    plain = parse_plain_jaas("sasl.jaas.config", jaas) if jaas else {}
    per_listener = {}
    for key, value in props.items():
        match = _LISTENER_JAAS.fullmatch(key)
        if match is not None and value:
            per_listener[match.group(1).upper()] = parse_plain_jaas(key, value)
        match = _LISTENER_MECHANISMS.fullmatch(key)
        if match is not None and value:
            listener_mechanisms[match.group(1).upper()] = _mechanisms(key, value)
    reauth = parse_int("connections.max.reauth.ms",
                       props.get("connections.max.reauth.ms", "") or "0", 0, LONG_MAX)
    return SaslSettings(mechanisms, plain, per_listener, reauth,
                        sasl_listener_names(protocol_map, listener_names), listener_mechanisms)


def _mechanisms(name: str, text: str) -> tuple[str, ...]:
    mechanisms = tuple(m.upper() for m in parse_list(text)) if text else DEFAULT_MECHANISMS
    unserved = [m for m in mechanisms if m not in SERVED_MECHANISMS]
    if unserved:
        raise ConfigError(name, f"{unserved} not served; raftlog serves {list(SERVED_MECHANISMS)}")
    return mechanisms


def sasl_listener_names(protocol_map: str, listener_names: tuple[str, ...]) -> tuple[str, ...]:
    """The listeners mapped to SASL_PLAINTEXT or SASL_SSL (a name missing from the map is its
    own protocol, as in Kafka)."""
    mapped = {}
    for item in parse_list(protocol_map):
        name, _, protocol = item.partition(":")
        mapped[name.strip().upper()] = protocol.strip().upper()
    return tuple(name for name in listener_names
                 if mapped.get(name, name) in ("SASL_PLAINTEXT", "SASL_SSL"))


def parse_plain_jaas(name: str, text: str) -> dict[str, str]:
    """The ``user_<name>="<password>"`` options of one PlainLoginModule JAAS entry."""
    body = text.strip()
    if not body.startswith(PLAIN_LOGIN_MODULE):
        raise ConfigError(name, f"expected {PLAIN_LOGIN_MODULE} required ...;")
    rest = body[len(PLAIN_LOGIN_MODULE):].lstrip()
    flag, _, rest = rest.partition(" ")
    if flag.rstrip(";") not in ("required", "requisite", "sufficient", "optional"):
        raise ConfigError(name, f"expected a control flag after the login module, got {flag!r}")
    rest = rest.strip()
    if not rest.endswith(";"):
        raise ConfigError(name, "a JAAS entry ends with ';'")
    rest = rest[:-1]
    users: dict[str, str] = {}
    pos = 0
    while rest[pos:].strip():
        match = _OPTION.match(rest, pos)
        if match is None:
            raise ConfigError(name, f"cannot parse JAAS options at {rest[pos:pos + 30]!r}")
        key, value = match.group(1), match.group(2)
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        if key.startswith("user_") and len(key) > len("user_"):
            users[key[len("user_"):]] = value
        pos = match.end()
    return users
