"""ACL bindings and their matching rules, as Kafka's StandardAuthorizer has them. Pure.

An ACL binding says: ``principal`` from ``host`` is ALLOWed (or DENYed) ``operation`` on the
resources of ``resource_type`` whose name is ``resource_name`` (LITERAL; ``*`` is every name)
or starts with it (PREFIXED). The codes are Kafka's wire codes (``AclOperation``,
``AclPermissionType``, ``PatternType``, ``ResourceType``), which is also how the metadata log
stores them (``raftlog.metadata.image.AclBindingImage``).

Two questions live here:

* **matching a request** (``binding_allows`` / ``binding_denies``): does a binding decide
  whether this principal from this host may do this operation on this resource? An ALLOW
  binding for Read, Write, Delete or Alter also allows Describe, and one for AlterConfigs also
  allows DescribeConfigs; All matches every operation; ``User:*`` matches every user, host
  ``*`` every host. DENY bindings never imply: a DENY of Read does not deny Describe.
* **matching a filter** (``filter_matches``, DescribeAcls and DeleteAcls): null fields and
  ANY match everything; pattern type MATCH matches the bindings that would apply to a
  resource of that exact name (LITERAL of the name, LITERAL ``*``, PREFIXED prefixes of it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, Protocol

WILDCARD: Final = "*"
WILDCARD_PRINCIPAL: Final = "User:*"
CLUSTER_NAME: Final = "kafka-cluster"  # Kafka's one cluster resource name


class AclOperation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


class AclPermission(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


# What a binding may name (the rest are filter values only).
BINDING_RESOURCE_TYPES: Final = frozenset({AclResourceType.TOPIC, AclResourceType.GROUP,
                                           AclResourceType.CLUSTER,
                                           AclResourceType.TRANSACTIONAL_ID})
BINDING_PATTERN_TYPES: Final = frozenset({PatternType.LITERAL, PatternType.PREFIXED})
BINDING_PERMISSIONS: Final = frozenset({AclPermission.ALLOW, AclPermission.DENY})
BINDING_OPERATIONS: Final = frozenset(op for op in AclOperation
                                      if op not in (AclOperation.UNKNOWN, AclOperation.ANY))
# Kafka's implication rule: an ALLOW of any of these also allows Describe / DescribeConfigs.
_IMPLIES_DESCRIBE: Final = frozenset({AclOperation.READ, AclOperation.WRITE,
                                      AclOperation.DELETE, AclOperation.ALTER})
NAME_LENGTH_MAX: Final = 1000  # resource names, principals and hosts in a binding


class Binding(Protocol):
    """What matching reads of a binding (``AclBindingImage`` has these fields)."""

    @property
    def resource_type(self) -> int: ...

    @property
    def resource_name(self) -> str: ...

    @property
    def pattern_type(self) -> int: ...

    @property
    def principal(self) -> str: ...

    @property
    def host(self) -> str: ...

    @property
    def operation(self) -> int: ...

    @property
    def permission(self) -> int: ...


def name_matches(binding: Binding, name: str) -> bool:
    """Whether ``binding``'s resource pattern covers the resource called ``name``."""
    if binding.pattern_type == PatternType.PREFIXED:
        return name.startswith(binding.resource_name)
    return binding.resource_name in (WILDCARD, name)


def who_matches(binding: Binding, principal: str, host: str) -> bool:
    return (binding.principal in (principal, WILDCARD_PRINCIPAL)
            and binding.host in (WILDCARD, host))


def operation_allowed_by(granted: int, wanted: int) -> bool:
    """Whether an ALLOW of ``granted`` allows ``wanted`` (Kafka's implication rules)."""
    if granted in (AclOperation.ALL, wanted):
        return True
    if wanted == AclOperation.DESCRIBE:
        return granted in _IMPLIES_DESCRIBE
    return wanted == AclOperation.DESCRIBE_CONFIGS and granted == AclOperation.ALTER_CONFIGS


def operation_denied_by(denied: int, wanted: int) -> bool:
    """Whether a DENY of ``denied`` denies ``wanted`` (no implication for DENY)."""
    return denied in (AclOperation.ALL, wanted)


def binding_applies(binding: Binding, principal: str, host: str, operation: int,
                    resource_type: int, name: str) -> AclPermission | None:
    """ALLOW or DENY when ``binding`` decides the request, else None."""
    if binding.resource_type != resource_type or not name_matches(binding, name):
        return None
    if not who_matches(binding, principal, host):
        return None
    if binding.permission == AclPermission.DENY:
        return AclPermission.DENY if operation_denied_by(binding.operation, operation) else None
    if operation_allowed_by(binding.operation, operation):
        return AclPermission.ALLOW
    return None


@dataclass(frozen=True, slots=True)
class AclFilter:
    """DescribeAcls' and DeleteAcls' filter: None strings match anything, ANY codes too."""

    resource_type: int = AclResourceType.ANY
    resource_name: str | None = None
    pattern_type: int = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: int = AclOperation.ANY
    permission: int = AclPermission.ANY

    def problem(self) -> str | None:
        """Why the filter is invalid (Kafka answers INVALID_REQUEST), or None."""
        if self.resource_type not in {*BINDING_RESOURCE_TYPES, AclResourceType.ANY}:
            return f"Unknown or unsupported resource type {self.resource_type}"
        if self.pattern_type not in {*BINDING_PATTERN_TYPES, PatternType.ANY, PatternType.MATCH}:
            return f"Unknown pattern type {self.pattern_type}"
        if self.operation not in {*BINDING_OPERATIONS, AclOperation.ANY}:
            return f"Unknown operation {self.operation}"
        if self.permission not in {*BINDING_PERMISSIONS, AclPermission.ANY}:
            return f"Unknown permission type {self.permission}"
        return None


def filter_matches(acl_filter: AclFilter, binding: Binding) -> bool:
    """Whether ``binding`` is one of those ``acl_filter`` selects (Kafka's
    ``AclBindingFilter.matches``)."""
    f = acl_filter
    if f.resource_type != AclResourceType.ANY and f.resource_type != binding.resource_type:
        return False
    if not _pattern_filter_matches(f, binding):
        return False
    if f.principal is not None and f.principal != binding.principal:
        return False
    if f.host is not None and f.host != binding.host:
        return False
    if f.operation != AclOperation.ANY and f.operation != binding.operation:
        return False
    return f.permission == AclPermission.ANY or f.permission == binding.permission


def _pattern_filter_matches(f: AclFilter, binding: Binding) -> bool:
    if f.pattern_type == PatternType.MATCH:
        # The bindings that apply to a resource called resource_name (None: any name).
        return f.resource_name is None or name_matches(binding, f.resource_name)
    if f.pattern_type != PatternType.ANY and f.pattern_type != binding.pattern_type:
        return False
    return f.resource_name is None or f.resource_name == binding.resource_name


def binding_problem(binding: Binding) -> str | None:
    """Why ``binding`` cannot be created (Kafka answers INVALID_REQUEST), or None."""
    if binding.resource_type not in BINDING_RESOURCE_TYPES:
        return f"Invalid resource type {binding.resource_type}"
    if binding.pattern_type not in BINDING_PATTERN_TYPES:
        return f"Invalid pattern type {binding.pattern_type}: only LITERAL or PREFIXED"
    if binding.operation not in BINDING_OPERATIONS:
        return f"Invalid operation {binding.operation}"
    if binding.permission not in BINDING_PERMISSIONS:
        return f"Invalid permission type {binding.permission}"
    if not binding.resource_name:
        return "Resource name must not be empty"
    if (binding.resource_type == AclResourceType.CLUSTER
            and binding.resource_name != CLUSTER_NAME):
        return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
    kind, sep, name = binding.principal.partition(":")
    if not sep or not kind or not name:
        return (f"Could not parse principal from `{binding.principal}` (no colon is present"
                " separating the principal type from the principal name)")
    if not binding.host:
        return "Host must not be empty (use * for every host)"
    if max(len(binding.resource_name), len(binding.principal),
           len(binding.host)) > NAME_LENGTH_MAX:
        return f"Resource names, principals and hosts are at most {NAME_LENGTH_MAX} characters"
    return None
