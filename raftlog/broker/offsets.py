"""ListOffsets (2) and OffsetForLeaderEpoch (23): where a client (or a follower) should read.

ListOffsets answers the earliest, latest, or max-timestamp offset, or the first record at or
after a timestamp, never beyond what the requester may fetch. OffsetForLeaderEpoch answers
where a leader epoch ends in this log: followers truncate to it (KIP-101/279) and KIP-320
consumers validate their position with it. Both refuse a stale or future leader epoch.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from raftlog.broker.fetch import CONSUMER_REPLICA_ID, READ_COMMITTED
from raftlog.broker.partition_checks import check_leader_epoch, missing_partition_error
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import Partition
from raftlog.protocol.codec import Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH
from raftlog.quorum.interface import Quorum
from raftlog.server.listener import Body, Handler, HandlerResult, RequestContext
from raftlog.server.sasl import ClusterActionGate

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3  # KIP-734 (ListOffsets v7+): the record with the largest timestamp
# A debugging tool that may read from any replica (OffsetForLeaderEpoch below v3 has no
# replica id and means this).
DEBUGGING_REPLICA_ID = -2
OFFSET_NOT_AVAILABLE = 78  # retriable: a new leader's HW is still below its epoch start


class OffsetApis:
    """ListOffsets and OffsetForLeaderEpoch, answered from the partitions here; ``gate``
    admits only cluster members' (followers') OffsetForLeaderEpoch."""

    def __init__(self, quorum: Quorum, manager: PartitionManager,
                 gate: ClusterActionGate) -> None:
        self.quorum = quorum
        self.manager = manager
        self.gate = gate

    def handlers(self) -> dict[int, Handler]:
        table: dict[int, Callable[[RequestContext], HandlerResult]] = {
            LIST_OFFSETS.key: self.list_offsets,
            OFFSET_FOR_LEADER_EPOCH.key: self.offset_for_leader_epoch,
        }
        return dict(table)

    def list_offsets(self, ctx: RequestContext) -> HandlerResult:
        """Kafka's handleListOffsetRequest. A partition named more than once in the request
        is answered INVALID_REQUEST in every entry, as Kafka (ListOffsetsRequest
        .duplicatePartitions): so one request cannot make this node look up (and perhaps
        decompress) the same batch over and over. There is no cap on the number of
        entries, as in Kafka: each one is a distinct partition, only partitions hosted here
        cost a lookup (one index search, at most one batch decoded, an unreadable batch only
        once per segment), and the request's size is bounded by socket.request.max.bytes."""
        request = ctx.body
        seen: collections.Counter[tuple[str, int]] = collections.Counter(
            (topic.name, p.partition_index) for topic in request.topics for p in topic.partitions)
        topics = []
        for topic in request.topics:
            parts = [self._list_offset(topic.name, p, request.isolation_level,
                                       request.replica_id)
                     if seen[(topic.name, p.partition_index)] == 1
                     else _list_offset_error(p.partition_index, ErrorCode.INVALID_REQUEST)
                     for p in topic.partitions]
            topics.append({"name": topic.name, "partitions": parts})
        return {"throttle_time_ms": 0, "topics": topics}

    def _list_offset(self, topic: str, request: Struct, isolation_level: int,
                     replica_id: int) -> Body:
        result: Body = {"partition_index": request.partition_index, "error_code": 0,
                        "timestamp": -1, "offset": -1, "leader_epoch": -1}
        partition = self.manager.get(topic, request.partition_index)
        if partition is None:
            result["error_code"] = missing_partition_error(self.quorum.image, topic,
                                                           request.partition_index)
            return result
        epoch_error = check_leader_epoch(request.current_leader_epoch, partition.leader_epoch)
        if epoch_error:
            result["error_code"] = epoch_error
            return result
        if not partition.is_leader and replica_id != DEBUGGING_REPLICA_ID:
            result["error_code"] = ErrorCode.NOT_LEADER_OR_FOLLOWER
            return result
        result["leader_epoch"] = partition.leader_epoch
        from_client = replica_id == CONSUMER_REPLICA_ID
        # A new leader whose HW has not yet reached the start of its epoch may be behind
        # what the previous leader exposed: clients retry rather than see offsets go back.
        state = partition.leader_state
        hw_lagging = from_client and state is not None and \
            partition.high_watermark < state.epoch_start_offset
        if request.timestamp == LATEST_TIMESTAMP:
            if not from_client:
                result["offset"] = partition.log.log_end_offset  # a replica: the log end
            elif hw_lagging:
                result["error_code"] = OFFSET_NOT_AVAILABLE
            elif isolation_level == READ_COMMITTED:
                result["offset"] = partition.last_stable_offset
            else:
                result["offset"] = partition.high_watermark
        elif request.timestamp == EARLIEST_TIMESTAMP:
            result["offset"] = partition.log.log_start_offset
            # Kafka (UnifiedLog.fetchOffsetByTimestamp): the epoch of the earliest epoch
            # entry when it covers the log start, else -1; not the current leader epoch.
            earliest = partition.log.epoch_cache.earliest_entry
            result["leader_epoch"] = -1
            if earliest is not None and earliest.start_offset <= partition.log.log_start_offset:
                result["leader_epoch"] = earliest.epoch
        elif request.timestamp >= 0 or request.timestamp == MAX_TIMESTAMP:
            # Record-granular, as Kafka: the record's own offset, timestamp and batch epoch.
            found = partition.log.find_max_timestamp() \
                if request.timestamp == MAX_TIMESTAMP \
                else partition.log.find_offset_by_timestamp(request.timestamp)
            fetchable_end = _last_fetchable_offset(partition, from_client, isolation_level)
            result["leader_epoch"] = -1  # Kafka's answer when nothing is found
            if found is not None and found.offset < fetchable_end:
                result["offset"], result["timestamp"] = found.offset, found.timestamp_ms
                result["leader_epoch"] = found.leader_epoch
            elif hw_lagging:
                result["error_code"] = OFFSET_NOT_AVAILABLE
        else:
            result["error_code"] = ErrorCode.INVALID_REQUEST
        return result

    # -- OffsetForLeaderEpoch ------------------------------------------------------------------

    def offset_for_leader_epoch(self, ctx: RequestContext) -> HandlerResult:
        """Where a leader epoch ends in this log (KIP-101/279): followers truncate to it,
        KIP-320 consumers validate their position with it."""
        request = ctx.body
        if request.replica_id >= 0 and not self.gate.allows(ctx):
            # Kafka: a replica's OffsetForLeaderEpoch is a cluster action.
            return {"throttle_time_ms": 0, "topics": [
                {"topic": topic.topic, "partitions": [
                    {"error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                     "partition": p.partition, "leader_epoch": -1, "end_offset": -1}
                    for p in topic.partitions]}
                for topic in request.topics]}
        topics = []
        for topic in request.topics:
            parts = [self._epoch_end_offset(topic.topic, p, request.replica_id)
                     for p in topic.partitions]
            topics.append({"topic": topic.topic, "partitions": parts})
        return {"throttle_time_ms": 0, "topics": topics}

    def _epoch_end_offset(self, topic: str, request: Struct, replica_id: int) -> Body:
        result: Body = {"error_code": 0, "partition": request.partition, "leader_epoch": -1,
                        "end_offset": -1}
        partition = self.manager.get(topic, request.partition)
        if partition is None:
            result["error_code"] = missing_partition_error(self.quorum.image, topic,
                                                           request.partition)
            return result
        epoch_error = check_leader_epoch(request.current_leader_epoch, partition.leader_epoch)
        if epoch_error:
            result["error_code"] = epoch_error
            return result
        if not partition.is_leader and replica_id != DEBUGGING_REPLICA_ID:
            result["error_code"] = ErrorCode.NOT_LEADER_OR_FOLLOWER
            return result
        result["leader_epoch"], result["end_offset"] = partition.log.end_offset_for_epoch(
            request.leader_epoch)
        return result


def _list_offset_error(partition_index: int, error: ErrorCode) -> Body:
    return {"partition_index": partition_index, "error_code": error, "timestamp": -1,
            "offset": -1, "leader_epoch": -1}


def _last_fetchable_offset(partition: Partition, from_client: bool, isolation_level: int) -> int:
    """Kafka's lastFetchableOffset for ListOffsets: a timestamp answer must lie below what
    the requester may fetch (the LSO for read_committed, the high watermark for other
    consumers, the log end for replicas and tools)."""
    if not from_client:
        return partition.log.log_end_offset
    if isolation_level == READ_COMMITTED:
        return partition.last_stable_offset
    return partition.high_watermark
