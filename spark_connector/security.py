"""Spark's Kafka source takes the Java client's security properties as ``kafka.*`` options
(``kafka.security.protocol``, ``kafka.sasl.mechanism``, ``kafka.sasl.jaas.config``,
``kafka.ssl.truststore.location``, ``kafka.ssl.keystore.location``, ...). The connector's
clients are librdkafka's, whose names differ for a few of them; this turns the Java ones into
librdkafka's so the options a Spark job already uses against Kafka work unchanged (librdkafka's
own names, ``kafka.sasl.username``, ``kafka.ssl.ca.location``, ... pass through as they are).

* ``sasl.jaas.config`` with ``PlainLoginModule`` or ``ScramLoginModule`` becomes
  ``sasl.username`` + ``sasl.password``; ``sasl.mechanism`` becomes ``sasl.mechanisms``.
* PEM stores (``ssl.truststore.type``/``ssl.keystore.type`` PEM): ``ssl.truststore.location``
  becomes ``ssl.ca.location``; ``ssl.keystore.location`` (key and chain in one PEM file)
  becomes ``ssl.certificate.location`` and ``ssl.key.location``. A PKCS12 keystore passes as
  librdkafka's ``ssl.keystore.location``/``ssl.keystore.password``; JKS is refused.
* ``ssl.endpoint.identification.algorithm`` empty (Java's "off") becomes ``none``.
"""

from __future__ import annotations

import re
from typing import Final

from spark_connector.errors import RaftLogOptionError

_LOGIN_MODULES: Final = (
    "org.apache.kafka.common.security.plain.PlainLoginModule",
    "org.apache.kafka.common.security.scram.ScramLoginModule",
)
_OPTION: Final = re.compile(r'\s*([A-Za-z0-9_.\-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s;"]+)')
_JAVA_ONLY: Final = ("sasl.jaas.config", "ssl.truststore.location", "ssl.truststore.type",
                     "ssl.truststore.password", "ssl.keystore.type", "sasl.mechanism")


def librdkafka_properties(props: dict[str, str]) -> dict[str, str]:
    """``props`` (``kafka.`` already stripped) with the Java security names translated."""
    if not any(name in props for name in _JAVA_ONLY) and (
            props.get("ssl.endpoint.identification.algorithm", "x") != ""):
        return props
    out = dict(props)
    if "sasl.mechanism" in out:
        out.setdefault("sasl.mechanisms", out.pop("sasl.mechanism"))
    jaas = out.pop("sasl.jaas.config", None)
    if jaas is not None:
        user, password = _jaas_login(jaas)
        out.setdefault("sasl.username", user)
        out.setdefault("sasl.password", password)
    trust_type = out.pop("ssl.truststore.type", "PEM").strip().upper()
    out.pop("ssl.truststore.password", None)
    if "ssl.truststore.location" in out:
        if trust_type != "PEM":
            raise RaftLogOptionError("kafka.ssl.truststore.type", f"{trust_type} is a Java"
                                     " store; give the CA certificates as PEM"
                                     " (kafka.ssl.truststore.type=PEM or kafka.ssl.ca.location)")
        out.setdefault("ssl.ca.location", out.pop("ssl.truststore.location"))
    key_type = out.pop("ssl.keystore.type", None)
    if key_type is not None and "ssl.keystore.location" in out:
        kind = key_type.strip().upper()
        if kind == "PEM":
            location = out.pop("ssl.keystore.location")
            out.pop("ssl.keystore.password", None)
            out.setdefault("ssl.certificate.location", location)
            out.setdefault("ssl.key.location", location)
        elif kind != "PKCS12":
            raise RaftLogOptionError("kafka.ssl.keystore.type", f"{kind} is Java's own store;"
                                     " use PEM or PKCS12")
    if out.get("ssl.endpoint.identification.algorithm") == "":
        out["ssl.endpoint.identification.algorithm"] = "none"
    return out


def _jaas_login(text: str) -> tuple[str, str]:
    body = text.strip()
    module = next((m for m in _LOGIN_MODULES if body.startswith(m)), None)
    if module is None:
        raise RaftLogOptionError("kafka.sasl.jaas.config", "expected PlainLoginModule or"
                                 ' ScramLoginModule required username="..." password="...";')
    rest = body[len(module):].strip()
    _, _, rest = rest.partition(" ")  # the control flag
    options: dict[str, str] = {}
    pos = 0
    rest = rest.strip().rstrip(";")
    while rest[pos:].strip():
        match = _OPTION.match(rest, pos)
        if match is None:
            raise RaftLogOptionError("kafka.sasl.jaas.config",
                                     f"cannot parse options at {rest[pos:pos + 30]!r}")
        value = match.group(2)
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        options[match.group(1)] = value
        pos = match.end()
    if "username" not in options or "password" not in options:
        raise RaftLogOptionError("kafka.sasl.jaas.config", "needs username and password")
    return options["username"], options["password"]
