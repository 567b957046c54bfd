"""DescribeClientQuotas (48) and AlterClientQuotas (49), KIP-546.

Describe is answered by any node from its metadata image, with the filter semantics of Kafka's
``ClientQuotasImage.describe``: each component names an entity type once and matches EXACT
(that name), DEFAULT (the type's default) or ANY (any name or the default, as long as the
entity has the type); a strict filter also excludes entities with types it does not name. A
malformed filter answers the whole request INVALID_REQUEST (or UNSUPPORTED_VERSION for an
unknown entity or match type), as Kafka does.

Alter is decided by the controller (``raftlog.broker.controller_apis`` routes and forwards
it): one ``AlterClientQuota`` record per entity, each its own commit, answered per entity
(INVALID_REQUEST for an entity, key or value Kafka would refuse). ``validate_only`` checks
and commits nothing. One request alters at most ``ENTITIES_PER_REQUEST_MAX`` entities; the
others are answered POLICY_VIOLATION and may be sent again.

Without an authorizer every principal may call both (Kafka without ``authorizer.class.name``
too); the ACL work puts DESCRIBE_CONFIGS/ALTER_CONFIGS on the cluster in front of them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final

from raftlog.controller.service import ControllerService, ControllerUnavailableError
from raftlog.metadata import errors
from raftlog.metadata.image import MetadataImage, QuotaEntity
from raftlog.metadata.quota_apply import (
    QUOTA_KEYS,
    describe_entity,
    entity_problem,
    quota_entity,
    value_problem,
)
from raftlog.metadata.records import AlterClientQuota
from raftlog.protocol.codec import Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.quorum.interface import Quorum
from raftlog.server.listener import Body, HandlerResult, RequestContext

log = logging.getLogger(__name__)

MATCH_EXACT: Final = 0
MATCH_DEFAULT: Final = 1
MATCH_ANY: Final = 2
# Entities one AlterClientQuotas may change: each is a metadata commit.
ENTITIES_PER_REQUEST_MAX: Final = 100
_FILTER_TYPES: Final = ("user", "client-id", "ip")
_UNSUPPORTED_VERSION: Final = int(ErrorCode.UNSUPPORTED_VERSION)


class _BadFilter(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _parse_filter(components: Sequence[Struct]) -> tuple[dict[str, str | None], set[str]]:
    """(exact matches by type, a name or None for the default; types matched by ANY)."""
    exact: dict[str, str | None] = {}
    any_of: set[str] = set()
    for component in components:
        kind, match = component.entity_type, component.match
        if not kind:
            raise _BadFilter(errors.INVALID_REQUEST, "Invalid empty entity type.")
        if kind in exact or kind in any_of:
            raise _BadFilter(errors.INVALID_REQUEST,
                             f"Entity type {kind} cannot appear more than once in the filter.")
        if kind not in _FILTER_TYPES:
            raise _BadFilter(_UNSUPPORTED_VERSION, f"Unsupported entity type {kind}")
        if component.match_type == MATCH_EXACT:
            if match is None:
                raise _BadFilter(errors.INVALID_REQUEST, "Request specified MATCH_TYPE_EXACT,"
                                 " but set match string to null.")
            exact[kind] = match
        elif component.match_type in (MATCH_DEFAULT, MATCH_ANY):
            if match is not None:
                name = "DEFAULT" if component.match_type == MATCH_DEFAULT else "SPECIFIED"
                raise _BadFilter(errors.INVALID_REQUEST, f"Request specified MATCH_TYPE_{name},"
                                 " but also specified a match string.")
            if component.match_type == MATCH_DEFAULT:
                exact[kind] = None
            else:
                any_of.add(kind)
        else:
            raise _BadFilter(_UNSUPPORTED_VERSION,
                             f"Unknown match type {component.match_type}")
    if ("ip" in exact or "ip" in any_of) and len(exact) + len(any_of) > 1:
        raise _BadFilter(errors.INVALID_REQUEST, "Invalid entity filter component"
                         " combination. IP filter component should not be used with user"
                         " or clientId filter component.")
    return exact, any_of


def _matches(entity: QuotaEntity, exact: dict[str, str | None], any_of: set[str],
             strict: bool) -> bool:
    named = dict(entity)
    if strict and len(named) != len(exact) + len(any_of):
        return False
    if any(kind not in named or named[kind] != name for kind, name in exact.items()):
        return False
    return all(kind in named for kind in any_of)


def describe_body(image: MetadataImage, request: Struct) -> Body:
    """The DescribeClientQuotas answer from ``image``."""
    try:
        exact, any_of = _parse_filter(request.components)
    except _BadFilter as exc:
        return {"throttle_time_ms": 0, "error_code": exc.code, "error_message": exc.message,
                "entries": None}
    entries = [
        {"entity": _entity_body(quota.entity),
         "values": [{"key": key, "value": value} for key, value in sorted(quota.values.items())]}
        for quota in image.client_quotas
        if _matches(quota.entity, exact, any_of, request.strict)
    ]
    return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "entries": entries}


def _entity_body(entity: QuotaEntity) -> list[Body]:
    return [{"entity_type": kind, "entity_name": name} for kind, name in entity]


def plan_entry(entry: Struct) -> AlterClientQuota | tuple[int, str]:
    """The record for one AlterClientQuotas entry, or (error code, message)."""
    entity = quota_entity((e.entity_type, e.entity_name) for e in entry.entity)
    problem = entity_problem(entity)
    if problem is not None:
        return errors.INVALID_REQUEST, problem
    keys = [op.key for op in entry.ops]
    if len(set(keys)) != len(keys):
        return errors.INVALID_REQUEST, "A quota key appears twice for one entity"
    if not keys:
        return errors.INVALID_REQUEST, "No quota to alter"
    set_values, remove = [], []
    for op in entry.ops:
        if op.remove:
            if op.key not in QUOTA_KEYS:
                return errors.INVALID_REQUEST, f"Invalid configuration key {op.key}"
            remove.append(op.key)
            continue
        problem = value_problem(op.key, op.value)
        if problem is not None:
            return errors.INVALID_REQUEST, problem
        set_values.append((op.key, float(op.value)))
    return AlterClientQuota(entity, tuple(set_values), tuple(remove))


def refused_body(request: Struct, code: int, message: str | None) -> Body:
    """Every entry of ``request`` answered with ``code``."""
    return {"throttle_time_ms": 0, "entries": [
        {"error_code": code, "error_message": message, "entity": [
            {"entity_type": e.entity_type, "entity_name": e.entity_name} for e in entry.entity]}
        for entry in request.entries]}


class ClientQuotaApis:
    """The two handlers; ``alter`` runs on the controller only (the routing checks that)."""

    def __init__(self, quorum: Quorum, controller: ControllerService) -> None:
        self.quorum = quorum
        self.controller = controller

    def describe(self, ctx: RequestContext) -> HandlerResult:
        return describe_body(self.quorum.image, ctx.body)

    def alter(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        plans: list[AlterClientQuota | tuple[int, str]] = []
        for index, entry in enumerate(request.entries):
            if index >= ENTITIES_PER_REQUEST_MAX:
                plans.append((int(ErrorCode.POLICY_VIOLATION),
                              f"At most {ENTITIES_PER_REQUEST_MAX} entities per request"))
            else:
                plans.append(plan_entry(entry))
        body = refused_body(request, 0, None)
        if request.validate_only:
            for result, plan in zip(body["entries"], plans, strict=True):
                if isinstance(plan, tuple):
                    result["error_code"], result["error_message"] = plan
            return body

        async def commit_all() -> Body:
            for result, plan in zip(body["entries"], plans, strict=True):
                if isinstance(plan, tuple):
                    result["error_code"], result["error_message"] = plan
                    continue
                try:
                    outcome = await self.controller.commit(plan)
                except ControllerUnavailableError as exc:
                    outcome = (exc.error_code, str(exc))
                result["error_code"], result["error_message"] = outcome
                if outcome[0] == errors.NONE:
                    log.info("client quotas of %s: set %s, removed %s (from %s)",
                             describe_entity(plan.entity), dict(plan.set), list(plan.remove),
                             ctx.session.principal)
            return body

        return commit_all
