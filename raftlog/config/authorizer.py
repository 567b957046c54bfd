"""Authorizer settings: Kafka's property names, a pure parser.

* ``authorizer.class.name``: empty (the default) means no ACLs, as in Kafka: every operation
  is allowed except ClusterAction, which only the cluster's own principals hold.
  ``org.apache.kafka.metadata.authorizer.StandardAuthorizer`` (and ZooKeeper-era
  ``kafka.security.authorizer.AclAuthorizer``, accepted as an alias) enforces the ACLs of the
  metadata log; any other class is a configuration error.
* ``super.users``: semicolon-separated principals (``User:admin;User:ops``) allowed
  everything. The cluster's own principals (``raft.secret``) always are.
* ``allow.everyone.if.no.acl.found`` (default false): whether a resource no ACL names is open
  to everyone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from raftlog.config.properties import ConfigError, parse_bool

STANDARD_AUTHORIZER: Final = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
ACL_AUTHORIZER_ALIAS: Final = "kafka.security.authorizer.AclAuthorizer"
AUTHORIZER_PROPERTY_DEFAULTS: Final[Mapping[str, str | None]] = {
    "authorizer.class.name": "",
    "super.users": None,
    "allow.everyone.if.no.acl.found": "false",
}


@dataclass(frozen=True)
class AuthorizerSettings:
    enabled: bool = False
    super_users: tuple[str, ...] = ()
    allow_everyone_if_no_acl_found: bool = False


def parse_authorizer_settings(given: Mapping[str, str]) -> AuthorizerSettings:
    name = given.get("authorizer.class.name", "").strip()
    if name not in ("", STANDARD_AUTHORIZER, ACL_AUTHORIZER_ALIAS):
        raise ConfigError("authorizer.class.name",
                          f"{name!r} is not served; use {STANDARD_AUTHORIZER} (or leave it"
                          " empty for no ACLs)")
    users = []
    for entry in given.get("super.users", "").split(";"):
        principal = entry.strip()
        if not principal:
            continue
        kind, sep, user = principal.partition(":")
        if not (sep and kind and user):
            raise ConfigError("super.users", f"{principal!r} is not a principal like"
                              " User:admin")
        users.append(principal)
    allow = parse_bool("allow.everyone.if.no.acl.found",
                       given.get("allow.everyone.if.no.acl.found", "false"))
    return AuthorizerSettings(bool(name), tuple(users), allow)
