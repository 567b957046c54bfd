"""CreateTopics (19), DeleteTopics (20) and CreatePartitions (37): topic changes proposed to
the metadata quorum.

On a node that is not the controller these are wrapped by ``raftlog.broker.controller_apis``,
which forwards them; ``TopicAdmin.create_topic`` is also how Metadata auto-creates a topic
and how the group coordinator creates ``__consumer_offsets``. After a committed change the local
partitions are brought in step (``sync_partitions``, once per request) before the answer goes
out, not at the next image watch.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping

from raftlog.config import TOPIC_CONFIG_KEYS, ServerConfig
from raftlog.metadata import errors as metadata_errors
from raftlog.metadata.errors import wire_error_code
from raftlog.metadata.image import TopicImage
from raftlog.metadata.placement import PlacementError, assign_replicas
from raftlog.metadata.records import CreatePartitions, CreateTopic, DeleteTopic, Record
from raftlog.protocol.codec import Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.internal_topics import cleanup_policy_refusal, is_internal_topic
from raftlog.protocol.schemas import CREATE_PARTITIONS, CREATE_TOPICS, DELETE_TOPICS
from raftlog.quorum.interface import NotControllerError, Quorum, QuorumError
from raftlog.server.listener import Body, Handler, HandlerResult, RequestContext

log = logging.getLogger(__name__)

# CreatePartitions re-checks this often when the topic changes under it (e.g. elections).
CREATE_PARTITIONS_CAS_ATTEMPTS = 5
ADMIN_TIMEOUT_S = 10.0
# Kafka's ReplicationControlManager.MAX_PARTITIONS_PER_BATCH: more new partitions in one
# CreateTopics/CreatePartitions request are refused with POLICY_VIOLATION.
PARTITIONS_PER_REQUEST_MAX = 10_000


class _Refused(Exception):
    """An admin request refused with a Kafka error code and message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class TopicAdmin:
    """Topic creation, deletion and growth, proposed to ``quorum``; ``sync_partitions``
    brings this node's partitions in step with the image after a committed change."""

    def __init__(self, config: ServerConfig, quorum: Quorum,
                 sync_partitions: Callable[[], Awaitable[None]]) -> None:
        self.config = config
        self.quorum = quorum
        self.sync_partitions = sync_partitions

    def handlers(self) -> dict[int, Handler]:
        table: dict[int, Callable[[RequestContext], HandlerResult]] = {
            CREATE_TOPICS.key: self.create_topics,
            DELETE_TOPICS.key: self.delete_topics,
            CREATE_PARTITIONS.key: self.create_partitions,
        }
        return dict(table)

    def create_topics(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        requested = sum(
            len(t.assignments) if t.assignments
            else self.config.num_partitions if t.num_partitions == -1
            else max(t.num_partitions, 0)
            for t in request.topics)
        if requested > PARTITIONS_PER_REQUEST_MAX:
            # Placement builds every partition on the event loop: num_partitions=2**31-1
            # froze the node and exhausted its memory. Refuse it up front, as Kafka does.
            return _too_many_partitions([t.name for t in request.topics])

        async def create_all() -> Body:
            results = []
            for topic in request.topics:
                configs = {c.name: c.value for c in topic.configs if c.value is not None}
                assignments = tuple(tuple(a.broker_ids) for a in
                                    sorted(topic.assignments, key=lambda a: a.partition_index))
                code, message = await self.create_topic(
                    topic.name, topic.num_partitions, topic.replication_factor, assignments,
                    configs, validate_only=request.validate_only, sync=False)
                results.append({"name": topic.name, "error_code": code, "error_message": message})
            if not request.validate_only and _any_applied(results):
                # Once for the request, and not for one that changed nothing (a client retrying
                # TOPIC_ALREADY_EXISTS): each sync looks at every partition of the image.
                await self.sync_partitions()
            return {"throttle_time_ms": 0, "topics": results}

        return create_all

    async def create_topic(
        self,
        name: str,
        num_partitions: int,
        replication_factor: int,
        assignments: tuple[tuple[int, ...], ...],
        configs: Mapping[str, str],
        *,
        validate_only: bool = False,
        sync: bool = True,
    ) -> tuple[int, str | None]:
        image = self.quorum.image
        if name in image.topics:
            return ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists."
        unknown = sorted(set(configs) - TOPIC_CONFIG_KEYS)
        if unknown:
            return ErrorCode.INVALID_CONFIG, f"Unknown topic config name: {unknown[0]}"
        refusal = cleanup_policy_refusal(name, configs.get("cleanup.policy"))
        if refusal is not None:  # the coordinators create them compacted; so must anyone
            return ErrorCode.INVALID_CONFIG, refusal
        if num_partitions == -1:
            num_partitions = self.config.num_partitions
        if replication_factor == -1:
            replication_factor = self.config.default_replication_factor
        live = list(image.live_broker_ids())
        if not assignments:
            if num_partitions <= 0:
                return ErrorCode.INVALID_PARTITIONS, "Number of partitions must be larger than 0."
            if not 0 < replication_factor <= len(live):
                return (ErrorCode.INVALID_REPLICATION_FACTOR,
                        f"Replication factor {replication_factor} is outside [1, {len(live)}]:"
                        f" there are {len(live)} live brokers.")
            try:
                assignments = assign_replicas(num_partitions, replication_factor, live, 0)
            except PlacementError as exc:
                return exc.error_code, str(exc)
        elif any(b not in image.brokers for a in assignments for b in a):
            return ErrorCode.INVALID_REPLICA_ASSIGNMENT, "Assignment names an unknown broker."
        if validate_only:
            return ErrorCode.NONE, None
        record = CreateTopic(name=name, topic_id=uuid.uuid4().bytes, partitions=assignments,
                             configs=tuple(sorted(configs.items())))
        return await self._propose(record, sync=sync)

    async def _propose(self, record: Record, *, sync: bool = True) -> tuple[int, str | None]:
        try:
            result = await self.quorum.propose(record, timeout_s=ADMIN_TIMEOUT_S)
        except NotControllerError as exc:
            # Nothing was applied (see NotControllerError): Kafka's NOT_CONTROLLER, which
            # clients answer by finding the new controller and sending the request again.
            log.info("metadata proposal not made: %s", exc)
            return ErrorCode.NOT_CONTROLLER, f"Not the controller: {exc}"
        except QuorumError as exc:
            log.warning("metadata proposal failed: %s", exc)
            return ErrorCode.REQUEST_TIMED_OUT, f"The metadata quorum did not commit: {exc}"
        if sync:
            await self.sync_partitions()
        return wire_error_code(result.error_code), result.message

    def delete_topics(self, ctx: RequestContext) -> HandlerResult:
        names = list(ctx.body.topic_names)

        async def delete_all() -> Body:
            responses = []
            for name in names:
                topic = self.quorum.image.topics.get(name)
                if topic is None:
                    code: int = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                elif is_internal_topic(name):  # the coordinators' state: see internal_topics
                    log.info("refused to delete internal topic %s", name)
                    code = ErrorCode.INVALID_TOPIC_EXCEPTION
                else:
                    code, _ = await self._propose(DeleteTopic(name=name, topic_id=topic.topic_id),
                                                  sync=False)
                responses.append({"name": name, "error_code": code})
            if _any_applied(responses):
                await self.sync_partitions()
            return {"throttle_time_ms": 0, "responses": responses}

        return delete_all

    def create_partitions(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        image = self.quorum.image
        requested = sum(
            max(t.count - len(image.topics[t.name].partitions), 0)
            for t in request.topics if t.name in image.topics)
        if requested > PARTITIONS_PER_REQUEST_MAX:
            # As in create_topics: a huge count would freeze the node in placement.
            return _too_many_partitions([t.name for t in request.topics], key="results")

        async def create_all() -> Body:
            results = []
            for topic in request.topics:
                code, message = await self._add_partitions(
                    topic.name, topic.count, topic.assignments, request.validate_only)
                results.append({"name": topic.name, "error_code": code, "error_message": message})
            return {"throttle_time_ms": 0, "results": results}

        return create_all

    async def _add_partitions(
        self, name: str, count: int, assignments: tuple[Struct, ...] | None, validate_only: bool
    ) -> tuple[int, str | None]:
        """Grow ``name`` to ``count`` partitions, as a compare-and-set on the topic version: the
        new partitions are computed from one image and committed only if the topic has not
        changed since, so two concurrent requests for the same count cannot both add (Kafka
        answers the second with INVALID_PARTITIONS). A topic that changed meanwhile (also a
        leader election) is re-checked against the newer image."""
        for _ in range(CREATE_PARTITIONS_CAS_ATTEMPTS):
            topic = self.quorum.image.topics.get(name)
            if topic is None:
                return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic '{name}' does not exist."
            if is_internal_topic(name):  # keys are routed by hash % partition count
                return (ErrorCode.INVALID_TOPIC_EXCEPTION,
                        f"Cannot add partitions to internal topic {name}.")
            try:
                planned = self._plan_partitions(topic, count, assignments)
            except _Refused as refused:
                return refused.code, refused.message
            if validate_only:
                return ErrorCode.NONE, None
            record = CreatePartitions(name=name, new_partitions=planned)
            try:
                result = await self.quorum.propose(record, expected_version=topic.version,
                                                   timeout_s=ADMIN_TIMEOUT_S)
            except QuorumError as exc:
                log.warning("metadata proposal failed: %s", exc)
                return ErrorCode.REQUEST_TIMED_OUT, f"The metadata quorum did not commit: {exc}"
            if result.error_code != metadata_errors.STALE_METADATA_VERSION:
                await self.sync_partitions()
                return wire_error_code(result.error_code), result.message
        return ErrorCode.REQUEST_TIMED_OUT, f"Topic '{name}' kept changing; retry."

    def _plan_partitions(
        self, topic: TopicImage, count: int, assignments: tuple[Struct, ...] | None
    ) -> tuple[tuple[int, ...], ...]:
        """The replica lists of the partitions to add.

        Raises:
            _Refused: the request cannot be met (Kafka's error code and message).
        """
        current = len(topic.partitions)
        if count <= current:
            raise _Refused(ErrorCode.INVALID_PARTITIONS, f"Topic currently has {current} "
                           f"partitions, {count} would not be an increase.")
        if count - current > PARTITIONS_PER_REQUEST_MAX:
            # create_partitions checked the image the request arrived with; a topic created
            # (or re-created smaller) since then reaches placement only through this check.
            raise _Refused(ErrorCode.POLICY_VIOLATION, _TOO_MANY_PARTITIONS)
        if assignments is not None:
            new = tuple(tuple(a.broker_ids) for a in assignments)
            if len(new) != count - current:
                raise _Refused(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                               "Wrong number of assignments.")
            return new
        replication_factor = len(topic.partitions[0].replicas)
        try:
            return tuple(assign_replicas(count - current, replication_factor,
                                         list(self.quorum.image.live_broker_ids()), current,
                                         first_partition=current))
        except PlacementError as exc:
            raise _Refused(exc.error_code, str(exc)) from exc


def _any_applied(results: list[Body]) -> bool:
    return any(result["error_code"] == ErrorCode.NONE for result in results)


_TOO_MANY_PARTITIONS = (f"Excessively large number of partitions per request"
                        f" (more than {PARTITIONS_PER_REQUEST_MAX}).")


def _too_many_partitions(names: Iterable[str], key: str = "topics") -> Body:
    return {"throttle_time_ms": 0, key: [
        {"name": name, "error_code": ErrorCode.POLICY_VIOLATION,
         "error_message": _TOO_MANY_PARTITIONS}
        for name in names]}
