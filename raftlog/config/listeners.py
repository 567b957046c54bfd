"""Listeners and controller voters: ``NAME://host:port`` lists, ``id@host:port`` lists, and
how the server config derives its bound, advertised and inter-broker listeners and its voters
from them (with Kafka's rules: a wildcard host is advertised as the host name; the protocols
are ``raftlog.config.tls``'s).
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import Final

from raftlog.config.catalog import Properties
from raftlog.config.properties import INT_MAX, ConfigError, parse_int, parse_list


@dataclass(frozen=True, slots=True)
class Listener:
    """One ``NAME://host:port`` entry; host "0.0.0.0" binds every interface, port 0 any port."""

    name: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class QuorumVoter:
    """One ``id@host:port`` entry of ``controller.quorum.voters``."""

    node_id: int
    host: str
    port: int


_LISTENER_PATTERN: Final = re.compile(r"([A-Za-z0-9_]+)://(\[[0-9A-Fa-f:.]+\]|[^:\[\]/]*):(\d+)")
_VOTER_PATTERN: Final = re.compile(r"(\d+)@(\[[0-9A-Fa-f:.]+\]|[^:\[\]@]+):(\d+)")
_WILDCARD_HOSTS: Final = frozenset({"", "0.0.0.0", "::"})
PORT_MAX: Final = 65535


def parse_listeners(name: str, text: str) -> tuple[Listener, ...]:
    """Parse a ``listeners``-style list; names are upper-cased and must be unique."""
    listeners = []
    for item in parse_list(text):
        match = _LISTENER_PATTERN.fullmatch(item)
        if match is None:
            raise ConfigError(name, f"expected NAME://host:port, got {item!r}")
        host = match.group(2).strip("[]") or "0.0.0.0"
        port = parse_int(name, match.group(3), 0, PORT_MAX)
        listeners.append(Listener(match.group(1).upper(), host, port))
    names = [listener.name for listener in listeners]
    if len(set(names)) != len(names):
        raise ConfigError(name, f"listener names must be unique, got {names}")
    ports = [listener.port for listener in listeners if listener.port != 0]
    if len(set(ports)) != len(ports):
        raise ConfigError(name, f"each listener needs its own port, got {ports}")
    return tuple(listeners)


def parse_voters(name: str, text: str) -> tuple[QuorumVoter, ...]:
    """Parse ``controller.quorum.voters`` (``1@host:port,2@host:port``)."""
    voters = []
    for item in parse_list(text):
        match = _VOTER_PATTERN.fullmatch(item)
        if match is None:
            raise ConfigError(name, f"expected id@host:port, got {item!r}")
        node_id = parse_int(name, match.group(1), 0, INT_MAX)
        port = parse_int(name, match.group(3), 1, PORT_MAX)
        voters.append(QuorumVoter(node_id, match.group(2).strip("[]"), port))
    ids = [voter.node_id for voter in voters]
    if len(set(ids)) != len(ids):
        raise ConfigError(name, f"voter ids must be unique, got {ids}")
    return tuple(voters)


def find_listener(
    property_name: str, listeners: tuple[Listener, ...], name: str
) -> tuple[str, int]:
    """The (host, port) of listener ``name`` among ``listeners`` (of ``property_name``)."""
    for listener in listeners:
        if listener.name == name.upper():
            return listener.host, listener.port
    raise ConfigError(property_name, f"no listener named {name!r}")


def parse_all_listeners(
    props: Properties, roles: tuple[str, ...], controller_names: tuple[str, ...]
) -> tuple[tuple[Listener, ...], tuple[Listener, ...]]:
    """(listeners, advertised listeners) of the server config, checked against each other."""
    default_listeners = "PLAINTEXT://127.0.0.1:9092"
    if "controller" in roles:
        default_listeners += ",CONTROLLER://127.0.0.1:9093"
    listeners = parse_listeners("listeners", props.text("listeners") or default_listeners)
    names = {listener.name for listener in listeners}
    if "controller" in roles and (not controller_names or controller_names[0] not in names):
        raise ConfigError(
            "controller.listener.names", f"{controller_names} must name one of {sorted(names)}"
        )
    advertised = _parse_advertised(props, listeners, controller_names)
    return listeners, advertised


def _parse_advertised(
    props: Properties, listeners: tuple[Listener, ...], controller_names: tuple[str, ...]
) -> tuple[Listener, ...]:
    text = props.text("advertised.listeners")
    if text is None:
        # Kafka advertises the canonical host name for a wildcard listener.
        return tuple(
            Listener(
                lst.name,
                socket.gethostname() if lst.host in _WILDCARD_HOSTS else lst.host,
                lst.port,
            )
            for lst in listeners
            if lst.name not in controller_names
        )
    advertised = parse_listeners("advertised.listeners", text)
    names = {listener.name for listener in listeners}
    for listener in advertised:
        if listener.name in controller_names or listener.name not in names:
            raise ConfigError("advertised.listeners", f"cannot advertise {listener.name}")
        if listener.host in _WILDCARD_HOSTS:
            raise ConfigError("advertised.listeners", f"cannot advertise {listener.host!r}")
    return advertised


def parse_inter_broker_name(
    props: Properties, roles: tuple[str, ...], advertised: tuple[Listener, ...],
    protocols: dict[str, str] | None = None,
) -> str:
    """The listener brokers talk to each other on: ``inter.broker.listener.name``, or the
    listener of protocol ``security.inter.broker.protocol`` (the one named after it first, as
    in Kafka), by default the first advertised PLAINTEXT one, else the first advertised one."""
    names = [listener.name for listener in advertised]
    text = props.text("inter.broker.listener.name")
    by_protocol = props.text("security.inter.broker.protocol")
    if text is not None and by_protocol is not None:
        raise ConfigError("security.inter.broker.protocol", "set inter.broker.listener.name or"
                          " security.inter.broker.protocol, not both")
    if by_protocol is not None:
        wanted = by_protocol.strip().upper()
        matching = [name for name in names
                    if (protocols or {}).get(name, "PLAINTEXT") == wanted]
        if wanted in matching:
            return wanted
        if not matching:
            if "broker" in roles:
                raise ConfigError("security.inter.broker.protocol",
                                  f"no advertised listener uses {wanted} (listeners: {names})")
            return names[0] if names else ""
        return matching[0]
    if text is None:
        if "broker" in roles and not names:
            raise ConfigError("listeners", "a broker needs at least one non-controller listener")
        plain = [name for name in names if (protocols or {}).get(name, "PLAINTEXT") == "PLAINTEXT"]
        return plain[0] if plain else names[0] if names else ""
    name = text.upper()
    if "broker" in roles and name not in names:
        raise ConfigError("inter.broker.listener.name", f"{name} is not in {names}")
    return name


def parse_quorum_voters(
    props: Properties,
    node_id: int,
    roles: tuple[str, ...],
    listeners: tuple[Listener, ...],
    controller_names: tuple[str, ...],
) -> tuple[QuorumVoter, ...]:
    """``controller.quorum.voters``; a combined node without it votes for itself alone."""
    text = props.text("controller.quorum.voters")
    if text is None:
        if "controller" not in roles:
            raise ConfigError("controller.quorum.voters", "is required for a broker-only node")
        # A single combined node votes for itself on its controller listener.
        host, port = find_listener("listeners", listeners, controller_names[0])
        host = "127.0.0.1" if host in _WILDCARD_HOSTS else host
        return (QuorumVoter(node_id, host, port),)
    voters = parse_voters("controller.quorum.voters", text)
    if not voters:
        raise ConfigError("controller.quorum.voters", "must list at least one voter")
    if "controller" in roles and node_id not in {voter.node_id for voter in voters}:
        raise ConfigError("controller.quorum.voters", f"node.id {node_id} is not a voter")
    return voters


_METRICS_PATTERN: Final = re.compile(r"http://(\[[0-9A-Fa-f:.]+\]|[^:\[\]/@?#\s]*):(\d+)/?",
                                     re.IGNORECASE)


def parse_metrics_listener(
    text: str | None, listeners: tuple[Listener, ...] = ()
) -> tuple[str, int] | None:
    """``metrics.listener`` (``http://HOST:PORT``, plain HTTP only; an empty host binds every
    interface, port 0 any free port) as (host, port), or None when it is not set. The port
    must differ from every fixed port in ``listeners``."""
    if text is None:
        return None
    match = _METRICS_PATTERN.fullmatch(text.strip())
    if match is None and "://" in text and not text.lower().startswith("http://"):
        raise ConfigError("metrics.listener", f"only plain http:// is supported, got {text!r}")
    if match is None:
        raise ConfigError("metrics.listener", f"expected http://HOST:PORT, got {text!r}")
    host = match.group(1).strip("[]") or "0.0.0.0"
    port = parse_int("metrics.listener", match.group(2), 0, PORT_MAX)
    taken = {listener.port: listener.name for listener in listeners}
    if port != 0 and port in taken:
        raise ConfigError("metrics.listener", f"port {port} is the {taken[port]} listener's")
    return host, port
