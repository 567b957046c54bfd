"""Kafka's ``Authorizer`` question, answered two ways. Pure.

``ClusterAuthorizer`` is the answer without ``authorizer.class.name``: only cluster members
(brokers and operator tools holding ``raft.secret``) hold ClusterAction on the cluster, every
other operation is allowed, as Kafka without an authorizer allows everything.

``StandardAuthorizer`` is Kafka's KRaft authorizer over the ACL bindings of the metadata image
(``raftlog.security.acl`` has the matching rules): super users (``super.users`` and always the
cluster's own principals) may do everything; otherwise a matching DENY refuses, a matching
ALLOW allows, and a resource that no binding names at all is allowed only with
``allow.everyone.if.no.acl.found``. Answers are cached per (principal, host, operation,
resource) until the image's ACL version changes, so the request path pays one dict lookup per
resource.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from raftlog.security.acl import (
    CLUSTER_NAME,
    WILDCARD,
    AclOperation,
    AclPermission,
    AclResourceType,
    Binding,
    PatternType,
    binding_applies,
    operation_allowed_by,
    operation_denied_by,
    who_matches,
)
from raftlog.security.session import Session, is_cluster_user

CACHE_ENTRIES_MAX: Final = 65_536  # answers kept per ACL version (then the cache restarts)


class Authorizer(Protocol):
    @property
    def enabled(self) -> bool:
        """Whether ACLs are enforced (False: only ClusterAction is guarded)."""
        ...

    def authorize(self, session: Session, operation: AclOperation,
                  resource_type: AclResourceType, name: str = CLUSTER_NAME) -> bool: ...

    def authorize_any(self, session: Session, operation: AclOperation,
                      resource_type: AclResourceType) -> bool:
        """Whether the principal may do ``operation`` on at least one resource of the type
        (Kafka's ``authorizeByResourceType``)."""
        ...


def is_cluster_member(session: Session) -> bool:
    return session.authenticated and is_cluster_user(session.principal.name)


class ClusterAuthorizer:
    """No ACLs: ClusterAction is for cluster members, everything else is allowed."""

    enabled = False

    def authorize(self, session: Session, operation: AclOperation,
                  resource_type: AclResourceType, name: str = CLUSTER_NAME) -> bool:
        if operation is AclOperation.CLUSTER_ACTION:
            return is_cluster_member(session)
        return True

    def authorize_any(self, session: Session, operation: AclOperation,
                      resource_type: AclResourceType) -> bool:
        return self.authorize(session, operation, resource_type)


@dataclass
class _Index:
    """The bindings of one ACL version, by resource type: literal names, ``*``, prefixes."""

    literal: dict[tuple[int, str], list[Binding]] = field(default_factory=dict)
    prefixed: dict[tuple[int, str], list[Binding]] = field(default_factory=dict)
    by_type: dict[int, list[Binding]] = field(default_factory=dict)
    prefix_lengths: dict[int, set[int]] = field(default_factory=dict)

    @classmethod
    def build(cls, bindings: Iterable[Binding]) -> _Index:
        index = cls()
        for b in bindings:
            index.by_type.setdefault(b.resource_type, []).append(b)
            if b.pattern_type == PatternType.PREFIXED:
                index.prefixed.setdefault((b.resource_type, b.resource_name), []).append(b)
                index.prefix_lengths.setdefault(b.resource_type, set()).add(len(b.resource_name))
            else:
                index.literal.setdefault((b.resource_type, b.resource_name), []).append(b)
        return index

    def candidates(self, resource_type: int, name: str) -> list[Binding]:
        """Every binding whose pattern covers the resource (any principal or operation)."""
        found = list(self.literal.get((resource_type, name), ()))
        if name != WILDCARD:
            found += self.literal.get((resource_type, WILDCARD), ())
        for length in self.prefix_lengths.get(resource_type, ()):
            if length <= len(name):
                found += self.prefixed.get((resource_type, name[:length]), ())
        return found


class StandardAuthorizer:
    """ACLs from ``image_acls()`` (version, bindings), Kafka's rules. See the module docstring.

    Args:
        acls: The current ACL version and bindings (the node's metadata image).
        super_users: Principals (``User:alice``) allowed everything.
        allow_everyone_if_no_acl_found: Kafka's ``allow.everyone.if.no.acl.found``.
    """

    enabled = True

    def __init__(self, acls: Callable[[], tuple[int, Mapping[str, Binding]]],
                 super_users: Iterable[str] = (),
                 allow_everyone_if_no_acl_found: bool = False) -> None:
        self._acls = acls
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._version: int | None = None
        self._index = _Index()
        self._cache: dict[tuple[str, str, int, int, str], bool] = {}

    def _current(self) -> _Index:
        version, bindings = self._acls()
        if version != self._version:
            self._index = _Index.build(bindings.values())
            self._cache = {}
            self._version = version
        return self._index

    def _is_super(self, session: Session) -> bool:
        return is_cluster_member(session) or str(session.principal) in self.super_users

    def authorize(self, session: Session, operation: AclOperation,
                  resource_type: AclResourceType, name: str = CLUSTER_NAME) -> bool:
        if self._is_super(session):
            return True
        index = self._current()
        principal, host = str(session.principal), session.host
        key = (principal, host, int(operation), int(resource_type), name)
        answer = self._cache.get(key)
        if answer is None:
            answer = self.decide(index.candidates(resource_type, name), principal, host,
                                 operation, resource_type, name)
            if len(self._cache) >= CACHE_ENTRIES_MAX:
                self._cache = {}
            self._cache[key] = answer
        return answer

    def decide(self, candidates: list[Binding], principal: str, host: str,
               operation: AclOperation, resource_type: AclResourceType, name: str) -> bool:
        """The answer from the bindings that cover the resource (no super users, no cache)."""
        if not candidates:
            return self.allow_everyone_if_no_acl_found
        allowed = False
        for binding in candidates:
            verdict = binding_applies(binding, principal, host, operation, resource_type, name)
            if verdict is AclPermission.DENY:
                return False
            allowed = allowed or verdict is AclPermission.ALLOW
        return allowed

    def authorize_any(self, session: Session, operation: AclOperation,
                      resource_type: AclResourceType) -> bool:
        if self._is_super(session):
            return True
        bindings = self._current().by_type.get(resource_type, [])
        if not bindings:
            return self.allow_everyone_if_no_acl_found
        principal, host = str(session.principal), session.host
        mine = [b for b in bindings if who_matches(b, principal, host)]
        denials = [b for b in mine if b.permission == AclPermission.DENY
                   and operation_denied_by(b.operation, operation)]
        return any(b.permission == AclPermission.ALLOW
                   and operation_allowed_by(b.operation, operation)
                   and not any(_covers(d, b) for d in denials) for b in mine)


def _covers(denial: Binding, allow: Binding) -> bool:
    """Whether ``denial``'s pattern covers every resource ``allow``'s pattern does."""
    if denial.pattern_type == PatternType.LITERAL:
        return denial.resource_name == WILDCARD or (
            allow.pattern_type == PatternType.LITERAL
            and allow.resource_name == denial.resource_name)
    return allow.resource_name.startswith(denial.resource_name)
