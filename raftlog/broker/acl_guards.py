"""ACL checks of every API, in one place per API, in front of the unchanged handlers.

With an authorizer (``authorizer.class.name``), ``guard_handlers`` wraps each served API's
handler in its guard: a function that reads the request, asks the authorizer the questions
Kafka's ``KafkaApis`` asks for that API, and either

* lets the request through unchanged (everything allowed: the common case, one cached lookup
  per resource),
* answers it alone (``Body``: the whole request is refused, e.g. GROUP_AUTHORIZATION_FAILED
  for a JoinGroup), or
* hands the handler the request without the refused resources and adds their errors to its
  answer (``Split``: Produce to two topics, one of them denied, writes the other one).

Every refusal is counted and logged (rate-limited) by ``raftlog.server.authz.Refusals``. The
per-API rules are in this module (the data-path and admin APIs) and in
``acl_guards_coordinators`` (groups, transactions, cluster-wide APIs); ``GUARDS`` is their union
and a unit test checks that every API the node serves has a guard or is listed as open.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from raftlog.metadata.image import MetadataImage
from raftlog.protocol.codec import Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.security.acl import CLUSTER_NAME, AclOperation, AclResourceType
from raftlog.security.authorizer import Authorizer
from raftlog.server.authz import Refusals
from raftlog.server.listener import Body, Handler, HandlerResult, RequestContext

TOPIC_DENIED: Final = int(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
GROUP_DENIED: Final = int(ErrorCode.GROUP_AUTHORIZATION_FAILED)
CLUSTER_DENIED: Final = int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
TXN_ID_DENIED: Final = int(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
NO_AUTHORIZED_OPERATIONS: Final = -(2**31)
_ZERO_UUID: Final = bytes(16)
_TOPIC: Final = AclResourceType.TOPIC
_GROUP: Final = AclResourceType.GROUP
_CLUSTER: Final = AclResourceType.CLUSTER
_TXN_ID: Final = AclResourceType.TRANSACTIONAL_ID
Op = AclOperation


@dataclass(frozen=True)
class Split:
    """Run the handler on the request with ``changes``, then ``merge`` its answer."""

    changes: dict[str, Any]
    merge: Callable[[Body], Body]


Verdict = Body | Split | None


class Check:
    """One request's questions to the authorizer; refusals are counted and logged."""

    def __init__(self, authorizer: Authorizer, refusals: Refusals, ctx: RequestContext,
                 image: Callable[[], MetadataImage]) -> None:
        self.authorizer, self.refusals, self.ctx = authorizer, refusals, ctx
        self._image = image

    @property
    def image(self) -> MetadataImage:
        return self._image()

    def may(self, operation: AclOperation, resource_type: AclResourceType,
            name: str = CLUSTER_NAME) -> bool:
        """Asks without logging (for questions whose "no" is not yet a refusal)."""
        return self.authorizer.authorize(self.ctx.session, operation, resource_type, name)

    def allows(self, operation: AclOperation, resource_type: AclResourceType,
               name: str = CLUSTER_NAME) -> bool:
        if self.may(operation, resource_type, name):
            return True
        self.refused(operation, resource_type, name)
        return False

    def refused(self, operation: AclOperation, resource_type: AclResourceType,
                name: str = CLUSTER_NAME) -> None:
        self.refusals.refused(self.ctx, f"{operation.name} on {resource_type.name} {name!r}")

    def denied_names(self, names: Iterable[str], operation: AclOperation,
                     resource_type: AclResourceType = _TOPIC) -> set[str]:
        """The names (of ``resource_type``) the principal may not ``operation``."""
        return {name for name in set(names) if not self.allows(operation, resource_type, name)}


Guard = Callable[[Check], Verdict]


def guard_handlers(handlers: dict[int, Handler], guards: dict[int, Guard],
                   authorizer: Authorizer, refusals: Refusals,
                   image: Callable[[], MetadataImage]) -> dict[int, Handler]:
    """``handlers`` with each guarded API behind its guard (unchanged without ACLs)."""
    if not authorizer.enabled:
        return handlers
    wrapped = dict(handlers)
    for key, inner in handlers.items():
        guard = guards.get(key)
        if guard is not None:
            wrapped[key] = _guarded(inner, guard, authorizer, refusals, image)
    return wrapped


def _guarded(inner: Handler, guard: Guard, authorizer: Authorizer, refusals: Refusals,
             image: Callable[[], MetadataImage]) -> Handler:
    def guarded(request: RequestContext) -> HandlerResult:
        ctx = request
        verdict = guard(Check(authorizer, refusals, ctx, image))
        if verdict is None:
            return inner(ctx)
        if isinstance(verdict, dict):
            return verdict
        narrowed = dataclasses.replace(ctx, body=ctx.body.replace(**verdict.changes))
        return _then(inner(narrowed), verdict.merge)

    return guarded


def _then(result: HandlerResult, merge: Callable[[Body], Body]) -> HandlerResult:
    if result is None:
        return None
    if isinstance(result, dict):
        return merge(result)
    deferred = result

    async def merged() -> Body | None:
        body = await deferred()
        return None if body is None else merge(body)

    return merged


# -- helpers for "topics, then partitions" requests ----------------------------------------


def split_topics(check: Check, operation: AclOperation, topics_field: str, name_field: str,
                 response_field: str, denied_entry: Callable[[Struct, int], Body],
                 ) -> Verdict:
    """The common shape: a list of topics in the request, each refused or kept; the refused
    ones come back as ``denied_entry(topic, code)`` in ``response_field``."""
    topics: Sequence[Struct] = check.ctx.body[topics_field]
    denied = check.denied_names((t[name_field] for t in topics), operation)
    if not denied:
        return None
    kept = tuple(t for t in topics if t[name_field] not in denied)
    refused = [denied_entry(t, TOPIC_DENIED) for t in topics if t[name_field] in denied]
    return Split({topics_field: kept}, appending(response_field, refused))


def appending(field: str, entries: list[Body]) -> Callable[[Body], Body]:
    def merge(body: Body) -> Body:
        body[field] = [*body.get(field, ()), *entries]
        return body

    return merge


def _partitions(topic: Struct, field: str, index: str, code: int, **extra: Any) -> list[Body]:
    return [{"partition_index": p[index] if index else p, "error_code": code, **extra}
            for p in topic[field]]


# -- the data path -------------------------------------------------------------------------


def produce(check: Check) -> Verdict:
    body = check.ctx.body
    if body.transactional_id is not None and not check.allows(Op.WRITE, _TXN_ID,
                                                              body.transactional_id):
        return {"responses": [_produce_entry(t, TXN_ID_DENIED) for t in body.topic_data],
                "throttle_time_ms": 0}
    return split_topics(check, Op.WRITE, "topic_data", "name", "responses", _produce_entry)


def _produce_entry(topic: Struct, code: int) -> Body:
    return {"name": topic.name, "partition_responses": [
        {"index": p.index, "error_code": code, "base_offset": -1, "log_append_time_ms": -1,
         "log_start_offset": -1, "record_errors": [], "error_message": None}
        for p in topic.partition_data]}


def fetch(check: Check) -> Verdict:
    if check.ctx.body.replica_id >= 0:
        return None  # a follower's fetch: ClusterAction, checked by FetchApis' gate
    return split_topics(check, Op.READ, "topics", "topic", "responses", lambda t, code: {
        "topic": t.topic, "partitions": [
            {"partition_index": p.partition, "error_code": code, "high_watermark": -1,
             "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None,
             "preferred_read_replica": -1, "records": None} for p in t.partitions]})


def list_offsets(check: Check) -> Verdict:
    return split_topics(check, Op.DESCRIBE, "topics", "name", "topics", lambda t, code: {
        "name": t.name, "partitions": _partitions(
            t, "partitions", "partition_index", code, old_style_offsets=[], timestamp=-1,
            offset=-1, leader_epoch=-1)})


def offset_for_leader_epoch(check: Check) -> Verdict:
    if check.ctx.body.replica_id >= 0:
        return None  # a follower's question: ClusterAction, checked by OffsetApis' gate
    return split_topics(check, Op.DESCRIBE, "topics", "topic", "topics", lambda t, code: {
        "topic": t.topic, "partitions": [
            {"error_code": code, "partition": p.partition, "leader_epoch": -1,
             "end_offset": -1} for p in t.partitions]})


def delete_records(check: Check) -> Verdict:
    return split_topics(check, Op.DELETE, "topics", "name", "topics", lambda t, code: {
        "name": t.name, "partitions": _partitions(t, "partitions", "partition_index", code,
                                                  low_watermark=-1)})


def describe_producers(check: Check) -> Verdict:
    return split_topics(check, Op.READ, "topics", "name", "topics", lambda t, code: {
        "name": t.name, "partitions": _partitions(t, "partition_indexes", "", code,
                                                  error_message=None, active_producers=[])})


# -- Metadata ------------------------------------------------------------------------------


def metadata(check: Check) -> Verdict:
    """Describe on each topic: unrequested ones the principal may not describe are hidden,
    requested ones answered TOPIC_AUTHORIZATION_FAILED; a topic auto-creation would create
    needs Create on the cluster or the topic (else TOPIC_AUTHORIZATION_FAILED, not created)."""
    body = check.ctx.body
    if body.topics is None:
        return Split({}, lambda answer: _hide_topics(check, answer))
    existing = check.image.topics
    refused: dict[str, None] = {}
    may_create_any = None
    for topic in body.topics:
        name = topic.name
        if name is None:
            continue  # by topic id: judged on the answer
        if not check.allows(Op.DESCRIBE, _TOPIC, name):
            refused[name] = None
        elif name not in existing:
            if may_create_any is None:
                may_create_any = check.may(Op.CREATE, _CLUSTER)
            if not may_create_any and not check.may(Op.CREATE, _TOPIC, name):
                refused[name] = None  # not created, and said so (Kafka does the same)
    kept = tuple(t for t in body.topics if t.name not in refused)
    entries = [_metadata_denied(name) for name in refused]

    def merge(answer: Body) -> Body:
        answer = _hide_topics(check, answer)
        answer["topics"] = [*answer.get("topics", ()), *entries]
        return answer

    return Split({"topics": kept} if refused else {}, merge)


def _hide_topics(check: Check, answer: Body) -> Body:
    topics = answer.get("topics") or ()
    shown = []
    for topic in topics:
        name = topic.get("name")
        if name is None or topic.get("error_code") or check.may(Op.DESCRIBE, _TOPIC, name):
            shown.append(topic)
    answer["topics"] = shown
    return answer


def _metadata_denied(name: str) -> Body:
    return {"error_code": TOPIC_DENIED, "name": name, "topic_id": _ZERO_UUID,
            "is_internal": False, "partitions": [],
            "topic_authorized_operations": NO_AUTHORIZED_OPERATIONS}


# -- topic administration ------------------------------------------------------------------


def create_topics(check: Check) -> Verdict:
    if check.may(Op.CREATE, _CLUSTER):
        return None
    return split_topics(check, Op.CREATE, "topics", "name", "topics", lambda t, code: {
        "name": t.name, "error_code": code, "error_message": "Authorization failed."})


def delete_topics(check: Check) -> Verdict:
    names: Sequence[str] = check.ctx.body.topic_names
    denied = check.denied_names(names, Op.DELETE)
    if not denied:
        return None
    return Split({"topic_names": tuple(n for n in names if n not in denied)},
                 appending("responses", [{"name": n, "error_code": TOPIC_DENIED}
                                         for n in names if n in denied]))


def create_partitions(check: Check) -> Verdict:
    return split_topics(check, Op.ALTER, "topics", "name", "results", lambda t, code: {
        "name": t.name, "error_code": code, "error_message": "Authorization failed."})


# Kafka's ConfigResource types: 2 topic, 4 broker, 8 broker logger.
_CONFIG_TOPIC: Final = 2


def _config_split(check: Check, operation: AclOperation, response_field: str,
                  extra: dict[str, Any]) -> Verdict:
    resources: Sequence[Struct] = check.ctx.body.resources
    refused: list[tuple[Struct, int]] = []
    for resource in resources:
        if resource.resource_type == _CONFIG_TOPIC:
            if not check.allows(operation, _TOPIC, resource.resource_name):
                refused.append((resource, TOPIC_DENIED))
        elif not check.allows(operation, _CLUSTER):
            refused.append((resource, CLUSTER_DENIED))
    if not refused:
        return None
    gone = {id(r) for r, _ in refused}
    return Split({"resources": tuple(r for r in resources if id(r) not in gone)},
                 appending(response_field, [
                     {"error_code": code, "error_message": "Authorization failed.",
                      "resource_type": r.resource_type, "resource_name": r.resource_name,
                      **extra} for r, code in refused]))


def describe_configs(check: Check) -> Verdict:
    return _config_split(check, Op.DESCRIBE_CONFIGS, "results", {"configs": []})


def alter_configs(check: Check) -> Verdict:
    return _config_split(check, Op.ALTER_CONFIGS, "responses", {})
