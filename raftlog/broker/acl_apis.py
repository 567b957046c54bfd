"""DescribeAcls (29), CreateAcls (30) and DeleteAcls (31): ACL bindings in the metadata log.

DescribeAcls is answered by any node from its image. CreateAcls and DeleteAcls are decided by
the controller (``raftlog.broker.controller_apis`` routes and forwards them in an Envelope, as
AlterUserScramCredentials): each request is one metadata commit, so its bindings appear (or
disappear) together on every node. Who may call them (Describe / Alter on the cluster) is
checked before the handler runs (``raftlog.broker.acl_guards``).

* CreateAcls: each creation is checked (``raftlog.security.acl.binding_problem``: a known
  resource type, LITERAL or PREFIXED, a known operation and permission, a ``Type:name``
  principal, the cluster resource named ``kafka-cluster``); an invalid one gets
  INVALID_REQUEST and the valid ones are still created. At most
  ``CREATIONS_PER_REQUEST_MAX`` per request; the rest get POLICY_VIOLATION.
* DeleteAcls: every filter (null fields and ANY match everything, MATCH the bindings that
  apply to a resource of that name) selects bindings from the controller's image; all of them
  are removed in one record and each filter's result lists what it matched. At most
  ``FILTERS_PER_REQUEST_MAX`` filters per request; the rest get POLICY_VIOLATION.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import Final

from raftlog.controller.service import ControllerService, ControllerUnavailableError
from raftlog.metadata import errors
from raftlog.metadata.image import AclBindingImage, MetadataImage
from raftlog.metadata.records import CreateAcls, DeleteAcls
from raftlog.protocol.codec import Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.quorum.interface import Quorum
from raftlog.security.acl import (
    AclFilter,
    AclOperation,
    AclPermission,
    AclResourceType,
    PatternType,
    binding_problem,
    filter_matches,
)
from raftlog.server.listener import Body, HandlerResult, RequestContext

log = logging.getLogger(__name__)

CREATIONS_PER_REQUEST_MAX: Final = 1000
FILTERS_PER_REQUEST_MAX: Final = 100
_POLICY: Final = int(ErrorCode.POLICY_VIOLATION)


def filter_of(request: Struct, version: int) -> AclFilter:
    """The filter of a DescribeAcls request or of one DeleteAcls filter."""
    pattern = request.pattern_type_filter if version >= 1 else PatternType.LITERAL
    return AclFilter(request.resource_type_filter, request.resource_name_filter, pattern,
                     request.principal_filter, request.host_filter, request.operation,
                     request.permission_type)


def matching(image: MetadataImage, acl_filter: AclFilter) -> list[AclBindingImage]:
    return sorted((b for b in image.acls.values() if filter_matches(acl_filter, b)),
                  key=_order)


def _order(binding: AclBindingImage) -> tuple[int, str, int, str, str, int, int]:
    return (binding.resource_type, binding.resource_name, binding.pattern_type,
            binding.principal, binding.host, binding.operation, binding.permission)


def describe_body(image: MetadataImage, request: Struct, version: int) -> Body:
    acl_filter = filter_of(request, version)
    problem = acl_filter.problem()
    if problem is not None:
        return {"throttle_time_ms": 0, "error_code": errors.INVALID_REQUEST,
                "error_message": problem, "resources": []}
    resources: dict[tuple[int, str, int], list[Body]] = {}
    for binding in matching(image, acl_filter):
        if version == 0 and binding.pattern_type != PatternType.LITERAL:
            continue  # v0 cannot say PREFIXED
        key = (binding.resource_type, binding.resource_name, binding.pattern_type)
        resources.setdefault(key, []).append({
            "principal": binding.principal, "host": binding.host,
            "operation": binding.operation, "permission_type": binding.permission})
    return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "resources": [
        {"resource_type": kind, "resource_name": name, "pattern_type": pattern, "acls": acls}
        for (kind, name, pattern), acls in resources.items()]}


def plan_creations(request: Struct, version: int
                   ) -> tuple[list[tuple[int, str | None]], list[AclBindingImage]]:
    """(one result per creation, the bindings to commit)."""
    results: list[tuple[int, str | None]] = []
    bindings = []
    for index, creation in enumerate(request.creations):
        if index >= CREATIONS_PER_REQUEST_MAX:
            results.append((_POLICY, f"At most {CREATIONS_PER_REQUEST_MAX} ACLs per request"))
            continue
        binding = AclBindingImage(
            uuid.uuid4().hex, creation.resource_type, creation.resource_name,
            creation.resource_pattern_type if version >= 1 else PatternType.LITERAL,
            creation.principal, creation.host, creation.operation, creation.permission_type)
        problem = binding_problem(binding)
        if problem is not None:
            results.append((errors.INVALID_REQUEST, problem))
            continue
        results.append((errors.NONE, None))
        bindings.append(binding)
    return results, bindings


def create_refused(request: Struct, code: int, message: str | None) -> Body:
    return {"throttle_time_ms": 0, "results": [
        {"error_code": code, "error_message": message} for _ in request.creations]}


def delete_refused(request: Struct, code: int, message: str | None) -> Body:
    return {"throttle_time_ms": 0, "filter_results": [
        {"error_code": code, "error_message": message, "matching_acls": []}
        for _ in request.filters]}


def _matched_body(binding: AclBindingImage) -> Body:
    return {"error_code": 0, "error_message": None, "resource_type": binding.resource_type,
            "resource_name": binding.resource_name, "pattern_type": binding.pattern_type,
            "principal": binding.principal, "host": binding.host,
            "operation": binding.operation, "permission_type": binding.permission}


class AclApis:
    """The three handlers; ``create`` and ``delete`` run on the controller only."""

    def __init__(self, quorum: Quorum, controller: ControllerService) -> None:
        self.quorum = quorum
        self.controller = controller

    def describe(self, ctx: RequestContext) -> HandlerResult:
        return describe_body(self.quorum.image, ctx.body, ctx.header.api_version)

    def create(self, ctx: RequestContext) -> HandlerResult:
        results, bindings = plan_creations(ctx.body, ctx.header.api_version)

        async def commit() -> Body:
            outcome = results
            if bindings:
                code, message = await self._commit(CreateAcls(tuple(bindings)))
                if code != errors.NONE:
                    outcome = [(code, message) if r[0] == errors.NONE else r for r in results]
                else:
                    log.info("ACLs created by %s: %s", ctx.session.principal,
                             _describe(bindings))
            return {"throttle_time_ms": 0, "results": [
                {"error_code": code, "error_message": message} for code, message in outcome]}

        return commit

    def delete(self, ctx: RequestContext) -> HandlerResult:
        version = ctx.header.api_version
        image = self.quorum.image
        filter_results: list[Body] = []
        ids: dict[str, AclBindingImage] = {}
        for index, request_filter in enumerate(ctx.body.filters):
            acl_filter = filter_of(request_filter, version)
            problem = acl_filter.problem()
            if index >= FILTERS_PER_REQUEST_MAX:
                problem = f"At most {FILTERS_PER_REQUEST_MAX} filters per request"
            if problem is not None:
                code = _POLICY if index >= FILTERS_PER_REQUEST_MAX else errors.INVALID_REQUEST
                filter_results.append({"error_code": code, "error_message": problem,
                                       "matching_acls": []})
                continue
            found = matching(image, acl_filter)
            ids.update((b.acl_id, b) for b in found)
            filter_results.append({"error_code": 0, "error_message": None,
                                   "matching_acls": [_matched_body(b) for b in found]})

        async def commit() -> Body:
            if ids:
                code, message = await self._commit(DeleteAcls(tuple(ids)))
                if code != errors.NONE:
                    for result in filter_results:
                        if result["error_code"] == errors.NONE:
                            result.update(error_code=code, error_message=message,
                                          matching_acls=[])
                else:
                    log.info("ACLs deleted by %s: %s", ctx.session.principal,
                             _describe(ids.values()))
            return {"throttle_time_ms": 0, "filter_results": filter_results}

        return commit

    async def _commit(self, record: CreateAcls | DeleteAcls) -> tuple[int, str | None]:
        try:
            return await self.controller.commit(record)
        except ControllerUnavailableError as exc:
            return exc.error_code, str(exc)


def _describe(bindings: Iterable[AclBindingImage]) -> str:
    return "; ".join(
        f"{AclPermission(b.permission).name} {b.principal}@{b.host}"
        f" {AclOperation(b.operation).name} {AclResourceType(b.resource_type).name}:"
        f"{PatternType(b.pattern_type).name}:{b.resource_name}" for b in bindings)
