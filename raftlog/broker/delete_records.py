"""DeleteRecords (21): a partition's leader moves its log start offset forward and answers
once every live replica's log start (the low watermark) has followed, as Kafka's
DelayedDeleteRecords.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import trio

from raftlog.broker.partition_checks import missing_partition_error
from raftlog.partition.errors import PartitionLogError
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import Partition
from raftlog.protocol.codec import Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.internal_topics import is_internal_topic
from raftlog.protocol.schemas import DELETE_RECORDS
from raftlog.quorum.interface import Quorum
from raftlog.replication.manager import ReplicaManager
from raftlog.server.listener import Body, Handler, HandlerResult, RequestContext

log = logging.getLogger(__name__)


class DeleteRecordsApis:
    """DeleteRecords on the partitions this node leads; ``replicas`` says which followers
    count towards the low watermark."""

    def __init__(self, quorum: Quorum, manager: PartitionManager,
                 replicas: ReplicaManager) -> None:
        self.quorum = quorum
        self.manager = manager
        self.replicas = replicas

    def handlers(self) -> dict[int, Handler]:
        table: dict[int, Callable[[RequestContext], HandlerResult]] = {
            DELETE_RECORDS.key: self.delete_records,
        }
        return dict(table)

    def delete_records(self, ctx: RequestContext) -> HandlerResult:
        """Kafka's handleDeleteRecordsRequest: each partition's leader advances its log start
        offset (``_delete_on_leader``) right here, synchronously, in the same step as its
        checks; the answer waits, like Kafka's DelayedDeleteRecords, until every live
        replica's log start offset (the low watermark) has reached the requested offset, or
        ``timeout_ms`` (then REQUEST_TIMED_OUT)."""
        request = ctx.body
        topics: list[Body] = []
        waiting: list[tuple[Body, Partition, int, int]] = []
        for topic in request.topics:
            results = []
            for requested in topic.partitions:
                result, pending = self._delete_on_leader(topic.name, requested)
                results.append(result)
                if pending is not None:
                    waiting.append((result, *pending))
            topics.append({"name": topic.name, "partitions": results})
        body: Body = {"throttle_time_ms": 0, "topics": topics}
        if not waiting:
            return body
        deadline = trio.current_time() + max(request.timeout_ms, 0) / 1000

        async def wait_for_replicas() -> Body:
            for result, partition, offset, generation in waiting:
                await partition.wait_until(
                    functools.partial(self._delete_settled, partition, offset, generation),
                    deadline)
                self._finish_delete(result, partition, offset, generation)
            return body

        return wait_for_replicas

    def _delete_on_leader(self, topic: str, requested: Struct
                          ) -> tuple[Body, tuple[Partition, int, int] | None]:
        """One partition (Kafka's deleteRecordsOnLocalLog + Partition.deleteRecordsOnLeader):
        the checks (``_delete_offset``), then the move, with no await in between, so a
        partition that stopped leading can never have its start moved by a DeleteRecords.
        The move runs on the event loop, as retention does: a checkpoint fsync and a
        directory fsync (two when segments go) per partition in the request. Returns the
        result, and (partition, offset, leadership generation) when it must wait for the
        followers."""
        result: Body = {"partition_index": requested.partition_index, "low_watermark": -1,
                        "error_code": ErrorCode.NONE}
        partition = self.manager.get(topic, requested.partition_index)
        error, offset = _delete_offset(topic, partition, requested.offset)
        if error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            error = missing_partition_error(self.quorum.image, topic,
                                            requested.partition_index)
        result["error_code"] = error
        if error != ErrorCode.NONE or partition is None:
            return result, None
        try:
            if partition.move_log_start_offset(offset):
                log.info("partition %s-%d: log start offset advanced to %d by DeleteRecords",
                         topic, partition.index, offset)
                self.manager.note_role_change(partition)  # wakes follower long polls
        except (PartitionLogError, OSError) as exc:
            log.warning("DeleteRecords on %s-%d to %d failed: %s", topic, partition.index,
                        offset, exc)
            result["error_code"] = ErrorCode.KAFKA_STORAGE_ERROR
            return result, None
        result["low_watermark"] = partition.low_watermark(self.replicas.is_eligible)
        if result["low_watermark"] >= offset:
            return result, None
        return result, (partition, offset, partition.leadership_generation)

    def _delete_settled(self, partition: Partition, offset: int, generation: int) -> bool:
        return partition.deleted or partition.leadership_generation != generation or \
            partition.low_watermark(self.replicas.is_eligible) >= offset

    def _finish_delete(self, result: Body, partition: Partition, offset: int,
                       generation: int) -> None:
        """DelayedDeleteRecords' outcome: the low watermark once it reached ``offset``,
        else the error (leadership moved, deleted, or REQUEST_TIMED_OUT with the low
        watermark as it was when the request arrived)."""
        if partition.deleted:
            result["error_code"], result["low_watermark"] = \
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1
        elif partition.leadership_generation != generation or not partition.is_leader:
            result["error_code"], result["low_watermark"] = \
                ErrorCode.NOT_LEADER_OR_FOLLOWER, -1
        elif (low := partition.low_watermark(self.replicas.is_eligible)) >= offset:
            result["error_code"], result["low_watermark"] = ErrorCode.NONE, low
        else:
            result["error_code"] = ErrorCode.REQUEST_TIMED_OUT


def _delete_offset(topic: str, partition: Partition | None, requested_offset: int
                   ) -> tuple[ErrorCode, int]:
    """DeleteRecords' checks for one partition (pure): the error, or NONE and the offset to
    move the log start to (a requested -1 means the high watermark). UNKNOWN_TOPIC_OR_PARTITION
    when it is not here (the caller tells that from NOT_LEADER_OR_FOLLOWER with the image).
    Never above the HW: the log start must not pass it (see ``enforce_retention``)."""
    if is_internal_topic(topic):
        return ErrorCode.INVALID_TOPIC_EXCEPTION, -1  # as Kafka's ReplicaManager
    if partition is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1
    if not partition.is_leader:
        return ErrorCode.NOT_LEADER_OR_FOLLOWER, -1
    if not partition.log.config.deletes:
        return ErrorCode.POLICY_VIOLATION, -1  # cleanup.policy=compact
    offset = partition.high_watermark if requested_offset == -1 else requested_offset
    if not 0 <= offset <= partition.high_watermark:
        return ErrorCode.OFFSET_OUT_OF_RANGE, -1
    return ErrorCode.NONE, offset
