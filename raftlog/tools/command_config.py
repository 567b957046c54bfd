"""``--command-config FILE`` for every tool that talks to the cluster: the client properties
(``raftlog.config.client_properties``, librdkafka's and Kafka's names) turned into how the
tool's connections are made (``raftlog.client.connection.Security``). With ``raft.secret`` or
``raft.secret.file`` the tool logs in as the cluster admin; else with the SASL user the file
names, on a SASL_* protocol.
"""

from __future__ import annotations

import argparse
from typing import Any

from raftlog.client.connection import PLAINTEXT, ClusterLogin, Login, Security, UserLogin
from raftlog.client.tls import client_context
from raftlog.config.client_properties import ClientSecurity, parse_client_properties
from raftlog.config.properties import load_properties
from raftlog.security.session import ADMIN_USER, ClusterCredentials

HELP = ("client properties (librdkafka/Kafka names: security.protocol, ssl.ca.location,"
        " ssl.certificate.location, ssl.key.location, sasl.mechanism, sasl.username,"
        " sasl.password, sasl.jaas.config; raft.secret(.file) for the cluster admin)")


def add_argument(parser: Any) -> None:
    parser.add_argument("--command-config", metavar="FILE", help=HELP)


def security_of(settings: ClientSecurity) -> Security:
    """The connections' TLS context and login for ``settings``."""
    tls = client_context(settings.tls) if settings.tls is not None else None
    login: Login | None = None
    if settings.raft_secret:
        login = ClusterLogin(ClusterCredentials(settings.raft_secret), ADMIN_USER)
    elif settings.uses_sasl and settings.mechanism and settings.username:
        login = UserLogin(settings.mechanism, settings.username, settings.password or "")
    return Security(login, tls)


def load_security(path: str | None) -> Security:
    """The Security of ``--command-config`` ``path`` (plain TCP without one).

    Raises:
        ConfigError, OSError: the file cannot be read or names invalid settings.
    """
    if path is None:
        return PLAINTEXT
    return security_of(parse_client_properties(load_properties(path), path))


def from_args(args: argparse.Namespace) -> Security:
    return load_security(getattr(args, "command_config", None))
