"""Metadata (3): the brokers, the controller and the topics' partitions with their leaders.

After a restart the image is replayed from the quorum; until it has caught up (the node
wires ``metadata_caught_up`` to "my registration of this incarnation is in the image") a
Metadata request waits briefly, then calls topics missing from the stale image "retry"
(LEADER_NOT_AVAILABLE) rather than unknown. With ``auto.create.topics.enable`` a request may
create the topics it names (``create_topic``, the CreateTopics path).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence

import trio

from raftlog.config import ServerConfig
from raftlog.metadata.image import NO_LEADER, MetadataImage
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.internal_topics import is_internal_topic
from raftlog.protocol.schemas import METADATA
from raftlog.quorum.interface import Quorum, QuorumTimeoutError
from raftlog.server.listener import Body, Handler, HandlerResult, RequestContext

# How long Metadata waits for a restarted node's image to catch up before saying "retry".
METADATA_CATCH_UP_WAIT_S = 5.0

# (name, partitions, replication factor, assignments, configs) -> (error code, message):
# ``TopicAdmin.create_topic``.
CreateTopicFn = Callable[[str, int, int, tuple[tuple[int, ...], ...], Mapping[str, str]],
                         Awaitable[tuple[int, str | None]]]


class MetadataApis:
    """The Metadata handler; ``create_topic`` auto-creates topics, ``metadata_caught_up``
    says whether the replayed image is current."""

    def __init__(self, config: ServerConfig, quorum: Quorum, create_topic: CreateTopicFn,
                 metadata_caught_up: Callable[[], bool]) -> None:
        self.config = config
        self.quorum = quorum
        self.create_topic = create_topic
        self.metadata_caught_up = metadata_caught_up

    def handlers(self) -> dict[int, Handler]:
        table: dict[int, Callable[[RequestContext], HandlerResult]] = {
            METADATA.key: self.metadata,
        }
        return dict(table)

    def metadata(self, ctx: RequestContext) -> HandlerResult:
        if self.metadata_caught_up():
            return self._metadata_now(ctx, caught_up=True)

        async def after_catch_up() -> Body | None:
            # After a restart the image is replayed from the quorum; answering from a
            # half-replayed image would call existing topics unknown (librdkafka then gives up
            # on them for topic.metadata.propagation.max.ms). Wait briefly, as a KRaft broker
            # waits for its metadata catch-up before serving clients.
            caught_up = await self._wait_caught_up(METADATA_CATCH_UP_WAIT_S)
            result = self._metadata_now(ctx, caught_up=caught_up)
            return await result() if callable(result) else result

        return after_catch_up

    async def _wait_caught_up(self, timeout_s: float) -> bool:
        with trio.move_on_after(timeout_s):
            while not self.metadata_caught_up():
                with contextlib.suppress(QuorumTimeoutError):
                    await self.quorum.wait_changed(self.quorum.image.version, timeout_s=timeout_s)
        return self.metadata_caught_up()

    def _metadata_now(self, ctx: RequestContext, *, caught_up: bool) -> HandlerResult:
        request = ctx.body
        version = ctx.header.api_version
        image = self.quorum.image
        if request.topics is None or (version == 0 and not request.topics):
            names = sorted(image.topics)
            return self._metadata_body(image, names)
        if version < 12 and any(t.name is None for t in request.topics):
            # v10-11 carry topic ids but serve no lookups by id, and their response has no
            # null name: Kafka refuses the whole request (InvalidRequestException).
            body = self._metadata_body(image, [])
            body["topics"] = [{"error_code": ErrorCode.INVALID_REQUEST, "name": t.name or "",
                               "partitions": []} for t in request.topics]
            return body
        if not caught_up:  # a topic missing from a stale image may exist: say "retry"
            names = [t.name for t in request.topics]
            return self._metadata_body(image, names, unknown_code=ErrorCode.LEADER_NOT_AVAILABLE)
        # v10+ may name a topic by id only (v12+: name null); an unknown id stays unknown.
        names = [t.name if t.name is not None else _topic_name_for_id(image, t.topic_id)
                 for t in request.topics]
        allow_create = self.config.auto_create_topics_enable and (
            version < 4 or request.allow_auto_topic_creation
        )
        missing = [n for n in names if n not in image.topics and not _is_id_name(n)]
        if not (allow_create and missing):
            return self._metadata_body(image, names)

        async def create_then_describe() -> Body:
            failures = {}
            for name in missing:
                code, _ = await self.create_topic(name, -1, -1, (), {})
                if code not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
                    failures[name] = code
            body = self._metadata_body(self.quorum.image, names)
            for topic in body["topics"]:
                if topic["name"] in failures:  # e.g. INVALID_TOPIC_EXCEPTION for a bad name
                    topic["error_code"] = failures[topic["name"]]
            return body

        return create_then_describe

    def _metadata_body(self, image: MetadataImage, names: Sequence[str | None],
                       unknown_code: int = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION) -> Body:
        brokers = [
            {"node_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack}
            for b in image.brokers.values()
        ]
        return {
            "throttle_time_ms": 0,
            "brokers": brokers,
            "cluster_id": self.config.cluster_id,
            "controller_id": image.controller_node_id,
            "topics": [self._topic_metadata(image, name, unknown_code) for name in names],
        }

    def _topic_metadata(self, image: MetadataImage, name: str | None,
                        unknown_code: int = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION) -> Body:
        if name is None:
            return {"error_code": unknown_code, "name": None, "partitions": []}
        if _is_id_name(name):
            return {"error_code": ErrorCode.UNKNOWN_TOPIC_ID, "name": None,
                    "topic_id": uuid.UUID(name.removeprefix(_ID_NAME_PREFIX)), "partitions": []}
        topic = image.topics.get(name)
        if topic is None:
            return {"error_code": unknown_code, "name": name, "partitions": []}
        partitions = [
            {
                "error_code": ErrorCode.LEADER_NOT_AVAILABLE if p.leader == NO_LEADER else 0,
                "partition_index": p.partition,
                "leader_id": p.leader,
                "leader_epoch": p.leader_epoch,
                "replica_nodes": list(p.replicas),
                "isr_nodes": list(p.isr),
                "offline_replicas": [],
            }
            for p in topic.partitions
        ]
        return {"error_code": 0, "name": name, "topic_id": uuid.UUID(bytes=topic.topic_id),
                "is_internal": is_internal_topic(name), "partitions": partitions}


_ID_NAME_PREFIX = "\0id:"  # never a valid topic name


def _topic_name_for_id(image: MetadataImage, topic_id: uuid.UUID) -> str:
    topic = image.topic_by_id(topic_id.bytes)
    return topic.name if topic is not None else _ID_NAME_PREFIX + str(topic_id)


def _is_id_name(name: str) -> bool:
    return name.startswith(_ID_NAME_PREFIX)
