"""The group coordinator's I/O with ``__consumer_offsets``: creating it, routing a group to its
partition, writing records, reading a partition back, and the append errors as group errors.

* Routing: a group belongs to partition ``abs(javaHashCode(group)) % N`` of the internal topic
  (``raftlog.protocol.internal_topics.coordinator_partition``, as Kafka computes it); its
  coordinator is that partition's leader. N is ``OFFSETS_TOPIC_PARTITIONS`` = 10 (Kafka's
  ``offsets.topic.num.partitions`` default is 50; 10 keeps a laptop cluster light).
* Creation: through the controller on the first FindCoordinator, compacted, replication factor
  min(3, live brokers) (``forwarded_topic_creation``).
* Writes: offsets and group metadata go in through ``Partition.append`` as the coordinator's
  own records, acks=all: a commit is acknowledged only once every ISR member has it, and the
  caller changes in-memory state only after that (``AckWait``).

Shared by ``raftlog.group.service`` and ``raftlog.group.txn_offsets``; imports neither.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final

import trio

from raftlog.clock import SteadyWallClock
from raftlog.partition.append import AppendOrigin
from raftlog.partition.batch import BatchHeader, build_batch, check_batch
from raftlog.partition.errors import PartitionLogError
from raftlog.partition.log import KafkaStorageError, describe_os_error
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import AckWait, Partition
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.internal_topics import OFFSETS_TOPIC, coordinator_partition
from raftlog.protocol.schemas import CREATE_TOPICS
from raftlog.quorum.interface import Quorum

__all__ = ["CreateInternalTopic", "OffsetsLog", "commit_write_error",
           "forwarded_topic_creation"]

log = logging.getLogger(__name__)

OFFSETS_TOPIC_REPLICATION_MAX: Final = 3
OFFSETS_TOPIC_CONFIGS: Final = {"cleanup.policy": "compact", "segment.bytes": str(100 << 20)}
LOAD_CHUNK_BYTES: Final = 1 << 20
CREATE_TIMEOUT_S: Final = 10.0
WRITE_TIMEOUT_S: Final = 5.0

# (name, partitions, replication factor, configs) -> the CreateTopics error code.
CreateInternalTopic = Callable[[str, int, int, Mapping[str, str]], Awaitable[int]]
OffsetRecords = list[tuple[bytes, bytes | None]]


def commit_write_error(code: int) -> int:
    """Kafka's mapping of an offsets-log append error to what the group client sees."""
    if code in (ErrorCode.NONE, ErrorCode.NOT_COORDINATOR):
        return code
    if code in (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NOT_ENOUGH_REPLICAS,
                ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, ErrorCode.REQUEST_TIMED_OUT):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if code == ErrorCode.NOT_LEADER_OR_FOLLOWER:
        return ErrorCode.NOT_COORDINATOR
    if code in (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE,
                ErrorCode.INVALID_FETCH_SIZE):
        return ErrorCode.INVALID_COMMIT_OFFSET_SIZE
    return ErrorCode.UNKNOWN_SERVER_ERROR


def forwarded_topic_creation(forward: Callable[..., Awaitable[Any]]) -> CreateInternalTopic:
    """Topic creation as a CreateTopics request to the active controller (``forward`` is
    ``ControllerChannel.call``)."""

    async def create(name: str, partitions: int, replication_factor: int,
                     configs: Mapping[str, str]) -> int:
        topic = {"name": name, "num_partitions": partitions,
                 "replication_factor": replication_factor, "assignments": [],
                 "configs": [{"name": k, "value": v} for k, v in configs.items()]}
        body = {"topics": [topic], "timeout_ms": int(CREATE_TIMEOUT_S * 1000),
                "validate_only": False}
        response = await forward(
            CREATE_TOPICS, body, version=4, timeout_s=CREATE_TIMEOUT_S,
            is_not_controller=lambda r: any(t.error_code == ErrorCode.NOT_CONTROLLER
                                            for t in r.topics))
        return int(response.topics[0].error_code)

    return create


class OffsetsLog:
    """``__consumer_offsets`` as the group coordinator of this node sees it."""

    def __init__(self, quorum: Quorum, manager: PartitionManager, num_partitions: int,
                 clock: SteadyWallClock, create_topic: CreateInternalTopic | None) -> None:
        self.quorum = quorum
        self.manager = manager
        self.num_partitions = num_partitions
        self.clock = clock
        self._create_topic = create_topic
        self._creating = False

    def partition_of(self, group_id: str) -> int:
        return coordinator_partition(group_id, self.num_partitions)

    def partition(self, index: int) -> Partition | None:
        return self.manager.get(OFFSETS_TOPIC, index)

    # -- creation ---------------------------------------------------------------------------

    def ensure_topic(self, nursery: trio.Nursery | None) -> None:
        """Start creating the topic in ``nursery`` unless that is under way already."""
        if self._creating or nursery is None or self._create_topic is None:
            return
        self._creating = True
        nursery.start_soon(self._create, self._create_topic)

    async def _create(self, create_topic: CreateInternalTopic) -> None:
        try:
            live = len(list(self.quorum.image.live_broker_ids()))
            factor = max(1, min(OFFSETS_TOPIC_REPLICATION_MAX, live))
            code = await create_topic(OFFSETS_TOPIC, self.num_partitions, factor,
                                      OFFSETS_TOPIC_CONFIGS)
            if code not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
                log.warning("creating %s failed with error %d", OFFSETS_TOPIC, code)
            else:
                log.info("created %s (%d partitions, replication factor %d)", OFFSETS_TOPIC,
                         self.num_partitions, factor)
        except Exception as exc:  # the next FindCoordinator retries
            log.warning("creating %s failed: %s", OFFSETS_TOPIC, exc)
        finally:
            self._creating = False

    # -- writing ----------------------------------------------------------------------------

    def append(self, index: int, records: OffsetRecords) -> tuple[int, AckWait | None]:
        """Append the coordinator's records to offsets partition ``index`` (acks=all): the
        append's error code (NONE when written) and the acknowledgement to wait for."""
        partition = self.partition(index)
        if partition is None:
            return self._missing_partition_error(index), None
        if not partition.is_leader:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, None
        batch = build_batch([(k, v, ()) for k, v in records], timestamp_ms=self.clock.now_ms())
        try:
            appended = partition.append(memoryview(batch), AppendOrigin.COORDINATOR)
        except KafkaStorageError as exc:
            log.debug("rejected a write to %s-%d: %s", OFFSETS_TOPIC, index, exc)
            return ErrorCode.KAFKA_STORAGE_ERROR, None
        except PartitionLogError as exc:
            log.info("rejected a write to %s-%d: %s", OFFSETS_TOPIC, index, exc)
            return exc.error_code, None
        except OSError as exc:
            log.error("write to %s-%d failed: %s", OFFSETS_TOPIC, index, describe_os_error(exc))
            return ErrorCode.KAFKA_STORAGE_ERROR, None
        if appended.error:
            return appended.error, None
        return ErrorCode.NONE, AckWait.after(partition, appended, -1)

    def _missing_partition_error(self, index: int) -> int:
        known = self.quorum.image.topics.get(OFFSETS_TOPIC)
        if known is not None and 0 <= index < len(known.partitions):
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    # -- reading back -----------------------------------------------------------------------

    @staticmethod
    async def batches(partition: Partition
                      ) -> AsyncIterator[tuple[BatchHeader, bytes, int]]:
        """Every batch of ``partition``'s log, in order, with the offset the read started
        from (records below it were replayed already); a checkpoint after each chunk."""
        plog = partition.log
        offset = plog.log_start_offset
        while offset < plog.log_end_offset:
            with plog.read(offset, LOAD_CHUNK_BYTES, max_offset=plog.log_end_offset) as read:
                data = read.read_bytes()
            if not data:
                break
            position = 0
            while position < len(data):
                header = check_batch(data, position)
                end = position + header.size_bytes
                yield header, data[position:end], offset
                offset = max(offset, header.next_offset)
                position = end
            await trio.lowlevel.checkpoint()
