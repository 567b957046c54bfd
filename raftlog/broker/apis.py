"""Request handlers: one method per Kafka API, turning decoded requests into response bodies.

Handlers run their synchronous part in request order on the connection's reader task and
return either a body or a coroutine function that finishes it (see ``server.py``). They
never raise for bad input: every expected failure is a Kafka error code in the body.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import logging
import struct
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import trio

from raftlog.config import BROKER_TO_TOPIC_CONFIG, TOPIC_CONFIG_KEYS, ServerConfig
from raftlog.metadata import errors as metadata_errors
from raftlog.metadata.errors import wire_error_code
from raftlog.metadata.image import NO_LEADER, MetadataImage, TopicImage
from raftlog.metadata.placement import PlacementError, assign_replicas
from raftlog.metadata.records import CreatePartitions, CreateTopic, DeleteTopic, Record
from raftlog.partition.append import AppendOrigin
from raftlog.partition.batch import (
    ATTRIBUTES_OFFSET,
    BATCH_LENGTH_OFFSET,
    LOG_OVERHEAD,
    TRANSACTIONAL_BIT,
    BatchHeader,
    validate_batches,
)
from raftlog.partition.errors import OffsetOutOfRangeError, PartitionLogError
from raftlog.partition.log import KafkaStorageError, describe_os_error
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import AckWait, Partition
from raftlog.protocol.codec import Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.internal_topics import cleanup_policy_refusal, is_internal_topic
from raftlog.protocol.schemas import (
    API_VERSIONS,
    CREATE_PARTITIONS,
    CREATE_TOPICS,
    DELETE_RECORDS,
    DELETE_TOPICS,
    DESCRIBE_CONFIGS,
    FETCH,
    FIND_COORDINATOR,
    LIST_OFFSETS,
    METADATA,
    OFFSET_FOR_LEADER_EPOCH,
    PRODUCE,
)
from raftlog.quorum.local import Quorum, QuorumError, QuorumTimeoutError
from raftlog.replication.manager import ReplicaManager
from raftlog.server.listener import (
    Body,
    ConnectionClosed,
    Handler,
    HandlerResult,
    RequestContext,
    api_versions_body,
)
from raftlog.server.sasl import ClusterActionGate
from raftlog.txn.coordinator_service import PendingVerification, Verdict

log = logging.getLogger(__name__)

# (topic, partition, producer id, epoch) -> None when a transactional write may go in, else
# (error code, message); answered from this node's coordinator state only (used by
# TxnOffsetCommit, raftlog.group.txn_offsets).
TxnVerifier = Callable[[str, int, int, int], "tuple[int, str] | None"]
# The produce path's check (KIP-890 part 1): (topic, partition, transactional id, producer id,
# epoch) -> a verdict now, or a verification in flight whose answer resumes the append.
TxnProduceVerifier = Callable[[str, int, "str | None", int, int],
                              "Verdict | PendingVerification"]

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3  # KIP-734 (ListOffsets v7+): the record with the largest timestamp
# Kafka's ListOffsets/OffsetForLeaderEpoch replica ids: a consumer, and a debugging tool that
# may read from any replica (OffsetForLeaderEpoch below v3 has no replica id and means this).
CONSUMER_REPLICA_ID = -1
DEBUGGING_REPLICA_ID = -2
OFFSET_NOT_AVAILABLE = 78  # retriable: a new leader's HW is still below its epoch start
READ_COMMITTED = 1
# How long Metadata waits for a restarted node's image to catch up before saying "retry".
METADATA_CATCH_UP_WAIT_S = 5.0
# CreatePartitions re-checks this often when the topic changes under it (e.g. elections).
CREATE_PARTITIONS_CAS_ATTEMPTS = 5
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
CONFIG_SOURCE_TOPIC = 1
CONFIG_SOURCE_DYNAMIC_BROKER = 2
CONFIG_SOURCE_DYNAMIC_DEFAULT_BROKER = 3
CONFIG_SOURCE_STATIC_BROKER = 4
CONFIG_SOURCE_DEFAULT = 5
ADMIN_TIMEOUT_S = 10.0
# Kafka's ReplicationControlManager.MAX_PARTITIONS_PER_BATCH: more new partitions in one
# CreateTopics/CreatePartitions request are refused with POLICY_VIOLATION.
PARTITIONS_PER_REQUEST_MAX = 10_000
_ATTRIBUTES = struct.Struct(">h")
_BATCH_LENGTH = struct.Struct(">i")


@dataclass(frozen=True)
class FetchPlan:
    """A Fetch request, normalised once so a long poll can re-read it cheaply."""

    version: int
    isolation_level: int
    max_bytes: int
    min_bytes: int
    partitions: tuple[tuple[str, tuple[Struct, ...]], ...]
    replica_id: int = CONSUMER_REPLICA_ID  # >= 0: a follower's fetch

    @property
    def from_follower(self) -> bool:
        return self.replica_id >= 0


class _Refused(Exception):
    """An admin request refused with a Kafka error code and message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class KafkaApis:
    """The broker's handlers, bound to its configuration, quorum and partitions.

    ``replicas`` assigns partition roles from metadata and runs the follower fetchers; without
    one, a ReplicaManager with default settings and no AlterPartition callback is made (enough
    for a single node, where every partition has one replica and no fetcher is needed).
    """

    def __init__(
        self,
        config: ServerConfig,
        quorum: Quorum,
        manager: PartitionManager,
        replicas: ReplicaManager | None = None,
        gate: ClusterActionGate | None = None,
    ) -> None:
        self.config = config
        self.quorum = quorum
        self.manager = manager
        # Replica fetches are cluster actions: only an authenticated broker, as itself.
        self.gate = ClusterActionGate() if gate is None else gate
        self.replicas = ReplicaManager(manager) if replicas is None else replicas
        # Transactions (raftlog.txn.install): (topic, partition, producer id, epoch) ->
        # None when a transactional batch may be appended, else (error code, message).
        self.txn_verifier: TxnVerifier | None = None
        self.txn_produce_verifier: TxnProduceVerifier | None = None
        # Whether the replayed image is current (the node wires this to "my registration of
        # this incarnation is in the image"); until then Metadata waits or says "retry".
        self.metadata_caught_up: Callable[[], bool] = lambda: True

    def handlers(self) -> dict[int, Handler]:
        table: dict[int, Callable[[RequestContext], HandlerResult]] = {
            API_VERSIONS.key: self.api_versions,
            METADATA.key: self.metadata,
            PRODUCE.key: self.produce,
            FETCH.key: self.fetch,
            LIST_OFFSETS.key: self.list_offsets,
            OFFSET_FOR_LEADER_EPOCH.key: self.offset_for_leader_epoch,
            CREATE_TOPICS.key: self.create_topics,
            DELETE_TOPICS.key: self.delete_topics,
            CREATE_PARTITIONS.key: self.create_partitions,
            DESCRIBE_CONFIGS.key: self.describe_configs,
            DELETE_RECORDS.key: self.delete_records,
            FIND_COORDINATOR.key: self.find_coordinator,
        }
        return dict(table)

    # -- ApiVersions, Metadata -----------------------------------------------------------------

    def api_versions(self, ctx: RequestContext) -> HandlerResult:
        return api_versions_body(ErrorCode.NONE, self.handlers())

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
                code, _ = await self._create_topic(name, -1, -1, (), {})
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

    def find_coordinator(self, ctx: RequestContext) -> HandlerResult:
        # Group and transaction coordinators are later milestones. The API is advertised now
        # because librdkafka enables LZ4 (and its balanced consumer) only when the broker lists
        # FindCoordinator; until then every lookup says "not available", which clients retry.
        return {"throttle_time_ms": 0, "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE,
                "error_message": "group and transaction coordinators are not implemented yet",
                "node_id": -1, "host": "", "port": -1}

    # -- Produce -------------------------------------------------------------------------------

    def produce(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        version = ctx.header.api_version
        if version in PRODUCE.rejected:
            if request.acks == 0:
                # An acks=0 producer reads no response, so an answer would be taken as the
                # reply to its next request. Kafka reports acks=0 failures by disconnecting.
                raise ConnectionClosed(f"Produce v{version} with acks=0 is not supported")
            # Advertised only so old librdkafka enables compression (KAFKA-18659).
            return _produce_body(request, ErrorCode.UNSUPPORTED_VERSION)
        if request.acks not in (-1, 0, 1):
            return _produce_body(request, ErrorCode.INVALID_REQUIRED_ACKS)
        results: dict[str, list[Body]] = {}
        waits: list[_AckWait] = []
        verifying: list[_VerifiedAppend] = []
        transactional_id = request.transactional_id if version >= 3 else None
        for topic in request.topic_data:
            for data in topic.partition_data:
                if is_internal_topic(topic.name):  # coordinators append there, never Produce
                    result, wait = _internal_topic_refusal(topic.name, data.index), None
                else:
                    result, wait = self._append(topic.name, data.index, data.records,
                                                request.acks, transactional_id)
                results.setdefault(topic.name, []).append(result)
                if isinstance(wait, _VerifiedAppend):
                    verifying.append(wait)
                elif wait is not None:
                    waits.append(wait)
        body: Body = {
            "responses": [
                {"name": name, "partition_responses": parts} for name, parts in results.items()
            ],
            "throttle_time_ms": 0,
        }
        if request.acks == 0 and verifying:
            # No response is read; the verification still decides whether the records go in.
            return None
        if request.acks == 0:
            failed = [f"{name}-{r['index']} (error {r['error_code']})"
                      for name, parts in results.items() for r in parts if r["error_code"]]
            if failed:
                # No response can carry the error to an acks=0 producer; Kafka closes the
                # connection so the client notices, instead of dropping the records silently.
                raise ConnectionClosed(f"Produce with acks=0 failed for {', '.join(failed)}")
            return None
        waits = [wait for wait in waits if not wait.satisfied()]
        if not waits and not verifying:
            return body
        deadline = trio.current_time() + max(request.timeout_ms, 0) / 1000

        async def wait_until_acknowledged() -> Body:
            for pending in verifying:
                # The verification task always finishes (bounded by its own timeout).
                await pending.verification.done.wait()
                if pending.wait is not None:
                    waits.append(pending.wait)
            for wait in waits:
                await wait.partition.wait_until(wait.settled, deadline)
                wait.result["error_code"] = wait.error_code()
            return body

        return wait_until_acknowledged

    def _append(
        self, topic: str, index: int, records: memoryview | None, acks: int,
        transactional_id: str | None = None,
    ) -> tuple[Body, _AckWait | _VerifiedAppend | None]:
        result: Body = {"index": index, "error_code": 0, "base_offset": -1,
                        "log_append_time_ms": -1, "log_start_offset": -1}
        partition = self.manager.get(topic, index)
        if partition is None:
            result["error_code"] = self._missing_partition_error(topic, index)
            return result, None
        if not partition.is_leader:
            result["error_code"] = ErrorCode.NOT_LEADER_OR_FOLLOWER
            return result, None
        if records is None or len(records) == 0:
            return _record_error(result, ErrorCode.INVALID_RECORD, "empty record set"), None
        if _has_transactional_batch(records):
            try:
                # The walk reads unvalidated headers, so a corrupt batch (a lying batchLength,
                # an old magic) can look transactional: report the corruption first, as append
                # would. Only this rare path pays for the extra CRC pass.
                txn_headers = validate_batches(records)
            except PartitionLogError as exc:
                log.info("rejected produce to %s-%d: %s", topic, index, exc)
                return _record_error(result, ErrorCode(exc.error_code), str(exc)), None
            verdict = _check_transactional(self.txn_produce_verifier, topic, index,
                                           transactional_id, txn_headers)
            if isinstance(verdict, PendingVerification):
                # The coordinator is asked first; the append resumes with its answer, in the
                # order requests registered, so the producer's sequence order holds.
                pending = _VerifiedAppend(verdict)

                def resume(answer: Verdict) -> None:
                    try:
                        pending.wait = self._append_verified(topic, index, records, acks,
                                                             result, answer)
                    except Exception:  # never answer "appended" for a batch that was not
                        log.exception("appending to %s-%d after verification", topic, index)
                        _record_error(result, ErrorCode.UNKNOWN_SERVER_ERROR,
                                      "internal error after transaction verification")

                verdict.continuations.append(resume)
                return result, pending
            if verdict is not None:  # KIP-890 part 1: only partitions added to the txn
                return _record_error(result, ErrorCode(verdict[0]), verdict[1]), None
        return self._append_checked(partition, topic, index, records, acks, result)

    def _append_verified(self, topic: str, index: int, records: memoryview, acks: int,
                         result: Body, verdict: Verdict) -> _AckWait | None:
        """The rest of ``_append`` once the coordinator answered for a transactional batch."""
        if verdict is not None:
            _record_error(result, ErrorCode(verdict[0]), verdict[1])
            return None
        partition = self.manager.get(topic, index)
        if partition is None or not partition.is_leader:
            result["error_code"] = ErrorCode.NOT_LEADER_OR_FOLLOWER
            return None
        _, wait = self._append_checked(partition, topic, index, records, acks, result)
        return wait

    def _append_checked(self, partition: Partition, topic: str, index: int,
                        records: memoryview, acks: int, result: Body
                        ) -> tuple[Body, _AckWait | None]:
        try:
            appended = partition.append(records, AppendOrigin.CLIENT, required_acks=acks)
        except KafkaStorageError as exc:
            # The log logged the failure (once, as an ERROR) and is intact; the producer
            # gets a retriable error instead of a closed connection.
            log.debug("rejected produce to %s-%d: %s", topic, index, exc)
            return _record_error(result, ErrorCode.KAFKA_STORAGE_ERROR, str(exc)), None
        except PartitionLogError as exc:
            log.info("rejected produce to %s-%d: %s", topic, index, exc)
            return _record_error(result, ErrorCode(exc.error_code), str(exc)), None
        except OSError as exc:  # the disk, anywhere else on the way: never the connection
            log.error("produce to %s-%d failed: %s", topic, index, describe_os_error(exc))
            return _record_error(result, ErrorCode.KAFKA_STORAGE_ERROR,
                                 describe_os_error(exc)), None
        if appended.error == ErrorCode.NOT_ENOUGH_REPLICAS:  # nothing was written
            result["error_code"] = ErrorCode.NOT_ENOUGH_REPLICAS
            result["error_message"] = appended.message
            return result, None
        if appended.error:
            return _record_error(result, ErrorCode(appended.error), appended.message), None
        # Appended, or a retried batch already in the log (``duplicate``): answered with its
        # offsets once it is as durable as the producer asked (Kafka waits for both).
        result["base_offset"] = appended.base_offset
        result["log_append_time_ms"] = appended.log_append_time_ms
        result["log_start_offset"] = partition.log.log_start_offset
        return result, _AckWait(partition, appended.end_offset, acks,
                                appended.leadership_generation, result)

    def _missing_partition_error(self, topic: str, index: int) -> ErrorCode:
        known = self.quorum.image.topics.get(topic)
        if known is not None and 0 <= index < len(known.partitions):
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    # -- Fetch ---------------------------------------------------------------------------------

    def fetch(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        if request.replica_id >= 0:
            refused = self._replica_fetch_error(ctx, request.replica_id)
            if refused:
                return _fetch_refused(request, refused)
        plan = FetchPlan(
            version=ctx.header.api_version,
            isolation_level=request.isolation_level,
            max_bytes=max(request.max_bytes, 0),
            min_bytes=max(request.min_bytes, 0),
            partitions=tuple((t.topic, t.partitions) for t in request.topics),
            replica_id=request.replica_id,
        )
        body, total_bytes, failed = self._read_fetch(plan, record=True)
        if request.max_wait_ms <= 0 or self._fetch_complete(plan, total_bytes, failed):
            return body
        _close_regions(body)
        deadline = trio.current_time() + request.max_wait_ms / 1000

        async def long_poll() -> Body:
            while True:
                if plan.from_follower:  # followers want anything appended, not just the HW
                    await self.manager.wait_for_append(deadline)
                else:
                    await self.manager.wait_for_data(deadline)
                body, total_bytes, failed = self._read_fetch(plan, record=False)
                if trio.current_time() >= deadline or \
                        self._fetch_complete(plan, total_bytes, failed):
                    return body
                _close_regions(body)

        return long_poll

    def _replica_fetch_error(self, ctx: RequestContext, replica_id: int) -> ErrorCode | None:
        """Why a fetch naming ``replica_id`` may not count as that replica's (Kafka:
        ClusterAction, then KIP-903's broker epoch), or None. Only a follower's own fetch may
        move the high watermark."""
        session = ctx.session
        if not self.gate.allows(ctx):
            return ErrorCode.TOPIC_AUTHORIZATION_FAILED
        if session.broker_id != replica_id:
            log.warning("refused a Fetch from %s (%s) for replica %d: not that broker",
                        ctx.peer, session.principal, replica_id)
            return ErrorCode.TOPIC_AUTHORIZATION_FAILED
        broker = self.quorum.image.brokers.get(replica_id)
        if broker is None or broker.epoch != session.broker_epoch:
            log.info("Fetch from replica %d with broker epoch %d, registered epoch %s:"
                     " STALE_BROKER_EPOCH", replica_id, session.broker_epoch,
                     "none" if broker is None else broker.epoch)
            return ErrorCode.STALE_BROKER_EPOCH
        return None

    def _fetch_complete(self, plan: FetchPlan, total_bytes: int, failed: bool) -> bool:
        """Whether a Fetch answers now rather than (keep) waiting, deadline aside: min_bytes
        reached, a partition failed, or a follower has a log start to adopt."""
        return total_bytes >= plan.min_bytes or failed or \
            (plan.from_follower and self._log_start_passed(plan))

    def _log_start_passed(self, plan: FetchPlan) -> bool:
        """Whether a follower can move its log start past the one it reported (the leader's
        moved: DeleteRecords, retention): its long poll ends at once so that it adopts the
        new start and the DeleteRecords waiting for it can answer."""
        for name, partitions in plan.partitions:
            for request in partitions:
                partition = self.manager.get(name, request.partition)
                if partition is not None and follower_can_advance_start(
                        request.log_start_offset, request.fetch_offset,
                        partition.log.log_start_offset, partition.high_watermark):
                    return True
        return False

    def _read_fetch(self, plan: FetchPlan, *, record: bool) -> tuple[Body, int, bool]:
        budget = plan.max_bytes
        total = 0
        failed = False
        topics = []
        for name, partitions in plan.partitions:
            out = []
            for request in partitions:
                result, size = self._read_partition(plan, name, request, budget, total == 0,
                                                    record)
                budget = max(budget - size, 0)
                total += size
                failed = failed or result["error_code"] != 0
                out.append(result)
            topics.append({"topic": name, "partitions": out})
        body = {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": topics}
        return body, total, failed

    def _read_partition(
        self, plan: FetchPlan, topic: str, request: Struct, budget: int, first: bool,
        record: bool,
    ) -> tuple[Body, int]:
        result: Body = {"partition_index": request.partition, "error_code": 0,
                        "high_watermark": -1, "last_stable_offset": -1,
                        # Empty, never null, even with an error: librdkafka fails to parse
                        # the whole response on a null (-1) record set, so it never sees the
                        # error (OFFSET_OUT_OF_RANGE, NOT_LEADER...) and refetches forever.
                        "log_start_offset": -1, "records": b"",
                        "aborted_transactions": [] if plan.isolation_level else None}
        partition = self.manager.get(topic, request.partition)
        if partition is None:
            result["error_code"] = self._missing_partition_error(topic, request.partition)
            return result, 0
        epoch_error = _check_leader_epoch(request.current_leader_epoch, partition.leader_epoch)
        if epoch_error:
            result["error_code"] = epoch_error
            return result, 0
        if not partition.is_leader:
            result["error_code"] = ErrorCode.NOT_LEADER_OR_FOLLOWER
            return result, 0
        partition_log = partition.log
        offset = request.fetch_offset
        in_range = partition_log.log_start_offset <= offset <= partition_log.log_end_offset
        if plan.from_follower and in_range and record and not self.replicas.record_follower_fetch(
                partition, plan.replica_id, offset, request.log_start_offset):
            result["error_code"] = ErrorCode.NOT_LEADER_OR_FOLLOWER  # not one of its replicas
            return result, 0
        result["high_watermark"] = partition.high_watermark
        result["last_stable_offset"] = partition.last_stable_offset
        result["log_start_offset"] = partition_log.log_start_offset
        if not in_range:
            result["error_code"] = ErrorCode.OFFSET_OUT_OF_RANGE
            return result, 0
        if plan.from_follower:  # followers replicate everything written, not just the HW
            max_offset = partition_log.log_end_offset
        elif plan.isolation_level == READ_COMMITTED:
            max_offset = partition.last_stable_offset
        else:
            max_offset = partition.high_watermark
        limit = min(max(request.partition_max_bytes, 0), budget)
        if offset >= max_offset or (limit == 0 and not first):
            result["records"] = b""
            return result, 0
        try:
            read = partition_log.read(offset, limit, max_offset=max_offset, min_one_batch=first)
        except OffsetOutOfRangeError:
            result["error_code"] = ErrorCode.OFFSET_OUT_OF_RANGE
            return result, 0
        except OSError as exc:  # EIO, EMFILE: this partition fails, not the connection
            log.warning("fetch from %s-%d at %d failed: %s", topic, request.partition, offset,
                        describe_os_error(exc))
            result["error_code"] = ErrorCode.KAFKA_STORAGE_ERROR
            return result, 0
        result["records"] = read.slices
        if plan.isolation_level == READ_COMMITTED and not plan.from_follower:
            # Transactions: the aborted ones overlapping what is returned, so the consumer
            # drops their batches (KIP-98; upper bound: the LSO, a harmless superset).
            result["aborted_transactions"] = [
                {"producer_id": txn.producer_id, "first_offset": txn.first_offset}
                for txn in partition.txns.aborted_between(offset, max_offset)]
        return result, sum(s.size_bytes for s in read.slices)

    # -- DeleteRecords -------------------------------------------------------------------------

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
            error = self._missing_partition_error(topic, requested.partition_index)
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

    # -- ListOffsets ---------------------------------------------------------------------------

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
            result["error_code"] = self._missing_partition_error(topic, request.partition_index)
            return result
        epoch_error = _check_leader_epoch(request.current_leader_epoch, partition.leader_epoch)
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
            result["error_code"] = self._missing_partition_error(topic, request.partition)
            return result
        epoch_error = _check_leader_epoch(request.current_leader_epoch, partition.leader_epoch)
        if epoch_error:
            result["error_code"] = epoch_error
            return result
        if not partition.is_leader and replica_id != DEBUGGING_REPLICA_ID:
            result["error_code"] = ErrorCode.NOT_LEADER_OR_FOLLOWER
            return result
        result["leader_epoch"], result["end_offset"] = partition.log.end_offset_for_epoch(
            request.leader_epoch)
        return result

    # -- Admin: CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs ----------------

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
                code, message = await self._create_topic(
                    topic.name, topic.num_partitions, topic.replication_factor, assignments,
                    configs, validate_only=request.validate_only)
                results.append({"name": topic.name, "error_code": code, "error_message": message})
            return {"throttle_time_ms": 0, "topics": results}

        return create_all

    async def _create_topic(
        self,
        name: str,
        num_partitions: int,
        replication_factor: int,
        assignments: tuple[tuple[int, ...], ...],
        configs: Mapping[str, str],
        *,
        validate_only: bool = False,
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
        return await self._propose(record)

    async def _propose(self, record: Record) -> tuple[int, str | None]:
        try:
            result = await self.quorum.propose(record, timeout_s=ADMIN_TIMEOUT_S)
        except QuorumError as exc:
            log.warning("metadata proposal failed: %s", exc)
            return ErrorCode.REQUEST_TIMED_OUT, f"The metadata quorum did not commit: {exc}"
        self.sync_partitions()
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
                    code, _ = await self._propose(DeleteTopic(name=name, topic_id=topic.topic_id))
                responses.append({"name": name, "error_code": code})
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
                self.sync_partitions()
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

    def describe_configs(self, ctx: RequestContext) -> HandlerResult:
        version = ctx.header.api_version
        results = [self._describe_resource(r, version) for r in ctx.body.resources]
        return {"throttle_time_ms": 0, "results": results}

    def _describe_resource(self, resource: Struct, version: int) -> Body:
        result: Body = {"error_code": 0, "error_message": None,
                        "resource_type": resource.resource_type,
                        "resource_name": resource.resource_name, "configs": []}
        if resource.resource_type == RESOURCE_TOPIC:
            topic = self.quorum.image.topics.get(resource.resource_name)
            if topic is None:
                result["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                return result
            entries = self._topic_config_entries(dict(topic.configs))
        elif resource.resource_type == RESOURCE_BROKER:
            refusal = self._broker_name_refusal(resource.resource_name)
            if refusal is not None:
                result["error_code"] = ErrorCode.INVALID_REQUEST
                result["error_message"] = refusal
                return result
            entries = self._broker_config_entries(resource.resource_name)
        else:
            result["error_code"] = ErrorCode.INVALID_REQUEST
            result["error_message"] = f"Unsupported resource type {resource.resource_type}"
            return result
        wanted = resource.configuration_keys
        result["configs"] = [
            {"name": k, "value": v, "read_only": False, "is_default": source ==
             CONFIG_SOURCE_DEFAULT, "config_source": source, "is_sensitive": False,
             "synonyms": []}
            for k, v, source in entries if wanted is None or k in wanted
        ]
        return result

    def _topic_config_entries(self, overrides: Mapping[str, str]) -> list[tuple[str, str, int]]:
        defaults = self.config.topic_defaults(self.dynamic_broker_configs())
        inherited = self._dynamic_topic_default_sources()
        entries = []
        for key in sorted(TOPIC_CONFIG_KEYS):
            if key in overrides:
                entries.append((key, overrides[key], CONFIG_SOURCE_TOPIC))
            elif key in defaults:
                entries.append((key, defaults[key], inherited.get(key, CONFIG_SOURCE_DEFAULT)))
        return entries

    def _dynamic_topic_default_sources(self) -> dict[str, int]:
        """Topic configs whose default comes from a dynamic broker config, with Kafka's source
        for it: this node's own (DYNAMIC_BROKER_CONFIG) wins over the cluster-wide one."""
        sources: dict[str, int] = {}
        for name, source in (("", CONFIG_SOURCE_DYNAMIC_DEFAULT_BROKER),
                             (str(self.config.node_id), CONFIG_SOURCE_DYNAMIC_BROKER)):
            resource = self.quorum.image.broker_configs.get(name)
            for key in resource.configs if resource is not None else ():
                if key in BROKER_TO_TOPIC_CONFIG:
                    sources[BROKER_TO_TOPIC_CONFIG[key]] = source
        return sources

    def _broker_name_refusal(self, name: str) -> str | None:
        """Why a BROKER resource name is refused, as Kafka's ConfigHelper words it: a node
        describes only itself (its id) or the cluster-wide defaults (the empty name)."""
        if not name:
            return None
        try:
            if name.strip() != name or "_" in name:  # which Java's toInt refuses too
                raise ValueError(name)
            broker_id = int(name)
        except ValueError:
            return f"Broker id must be an integer, but it is: {name}"
        if broker_id != self.config.node_id:
            return (f"Unexpected broker id, expected {self.config.node_id} or empty string, "
                    f"but received {name}")
        return None

    def _broker_config_entries(self, name: str) -> list[tuple[str, str, int]]:
        """For this node's id: static properties overlaid by AlterConfigs' dynamic ones, this
        node's own (DYNAMIC_BROKER_CONFIG) over the cluster default
        (DYNAMIC_DEFAULT_BROKER_CONFIG). For the empty name: only the cluster-wide dynamic
        defaults, as Kafka (no static properties)."""
        props: dict[str, tuple[str, int]] = {}
        layers = [("", CONFIG_SOURCE_DYNAMIC_DEFAULT_BROKER)]
        if name:
            props = {k: (v, CONFIG_SOURCE_STATIC_BROKER)
                     for k, v in _broker_properties(self.config).items()}
            layers.append((str(self.config.node_id), CONFIG_SOURCE_DYNAMIC_BROKER))
        for resource_name, source in layers:
            dynamic = self.quorum.image.broker_configs.get(resource_name)
            if dynamic is not None:
                props.update((k, (v, source)) for k, v in dynamic.configs.items())
        return [(k, v, source) for k, (v, source) in sorted(props.items())]

    def dynamic_broker_configs(self) -> dict[str, str]:
        """AlterConfigs' broker configs in effect here: this node's over the cluster's."""
        merged: dict[str, str] = {}
        for name in ("", str(self.config.node_id)):
            resource = self.quorum.image.broker_configs.get(name)
            if resource is not None:
                merged.update(resource.configs)
        return merged

    # -- keeping local partitions in step with metadata --------------------------------------

    def sync_partitions(self) -> None:
        """Brings local partitions and their roles in step with the metadata image: opens
        logs for partitions assigned to this node, makes each leader or follower, and
        deletes those no longer assigned here (see ``ReplicaManager.apply_image``)."""
        self.replicas.apply_image(self.quorum.image,
                                  self.config.topic_defaults(self.dynamic_broker_configs()))


_ID_NAME_PREFIX = "\0id:"  # never a valid topic name


def _topic_name_for_id(image: MetadataImage, topic_id: uuid.UUID) -> str:
    topic = image.topic_by_id(topic_id.bytes)
    return topic.name if topic is not None else _ID_NAME_PREFIX + str(topic_id)


def _is_id_name(name: str) -> bool:
    return name.startswith(_ID_NAME_PREFIX)


def _broker_properties(config: ServerConfig) -> dict[str, str]:
    """The broker's effective static settings under Kafka's property names."""
    out = {}
    for item in dataclasses.fields(config):
        value = getattr(config, item.name)
        if item.name == "raft_secret" or not isinstance(value, int | str | bool):
            continue
        out[item.name.replace("_", ".")] = str(value).lower() if isinstance(value, bool) \
            else str(value)
    return out


def _list_offset_error(partition_index: int, error: ErrorCode) -> Body:
    return {"partition_index": partition_index, "error_code": error, "timestamp": -1,
            "offset": -1, "leader_epoch": -1}


def follower_can_advance_start(reported_start: int, fetch_offset: int, leader_start: int,
                               leader_high_watermark: int) -> bool:
    """Whether a follower that reported ``reported_start`` and fetches from its log end
    ``fetch_offset`` would move its log start on the answer. It adopts
    min(leader start, its HW) and its HW becomes min(leader HW, its end), so what it can
    adopt is the smallest of the three; comparing against the leader's start alone would
    answer at once, again and again, a follower that cannot move (a hot Fetch loop)."""
    if reported_start < 0:  # Fetch < v5 reports none
        return False
    return reported_start < min(leader_start, leader_high_watermark, fetch_offset)


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


def _last_fetchable_offset(partition: Partition, from_client: bool, isolation_level: int) -> int:
    """Kafka's lastFetchableOffset for ListOffsets: a timestamp answer must lie below what
    the requester may fetch (the LSO for read_committed, the high watermark for other
    consumers, the log end for replicas and tools)."""
    if not from_client:
        return partition.log.log_end_offset
    if isolation_level == READ_COMMITTED:
        return partition.last_stable_offset
    return partition.high_watermark


def _check_leader_epoch(requested: int, current: int) -> int:
    """KIP-320: a client that knows a newer epoch than ours, or an older one, is told so."""
    if requested < 0 or requested == current:
        return 0
    return ErrorCode.FENCED_LEADER_EPOCH if requested < current else ErrorCode.UNKNOWN_LEADER_EPOCH


def _check_transactional(verifier: TxnProduceVerifier | None, topic: str, index: int,
                         transactional_id: str | None, headers: list[BatchHeader]
                         ) -> Verdict | PendingVerification:
    """A produce carrying transactional batches: one producer, no control batches (the
    validation refused those), and the transaction coordinator must know this partition
    is in the producer's ongoing transaction."""
    if verifier is None:
        return ErrorCode.INVALID_TXN_STATE, "transactional batch outside a transaction"
    first = headers[0]
    if first.producer_id < 0 or any(not h.is_transactional or h.producer_id != first.producer_id
                                    or h.producer_epoch != first.producer_epoch
                                    for h in headers):
        return ErrorCode.INVALID_RECORD, "transactional batches need one producer id and epoch"
    return verifier(topic, index, transactional_id, first.producer_id, first.producer_epoch)


def _has_transactional_batch(records: memoryview) -> bool:
    """Walks batch headers (no CRC work) looking for the isTransactional attribute bit."""
    pos = 0
    while pos + ATTRIBUTES_OFFSET + _ATTRIBUTES.size <= len(records):
        (length,) = _BATCH_LENGTH.unpack_from(records, pos + BATCH_LENGTH_OFFSET)
        (attributes,) = _ATTRIBUTES.unpack_from(records, pos + ATTRIBUTES_OFFSET)
        if attributes & TRANSACTIONAL_BIT:
            return True
        if length <= 0:
            return False  # malformed: append's validation reports it
        pos += LOG_OVERHEAD + length
    return False


_TOO_MANY_PARTITIONS = (f"Excessively large number of partitions per request"
                        f" (more than {PARTITIONS_PER_REQUEST_MAX}).")


def _too_many_partitions(names: Iterable[str], key: str = "topics") -> Body:
    return {"throttle_time_ms": 0, key: [
        {"name": name, "error_code": ErrorCode.POLICY_VIOLATION,
         "error_message": _TOO_MANY_PARTITIONS}
        for name in names]}


def _internal_topic_refusal(topic: str, index: int) -> Body:
    """Kafka's answer to a client's Produce to an internal topic (ReplicaManager: "Cannot
    append to internal topic"): nothing is written, so no client can put a record there
    that the coordinators' replay would have to make sense of."""
    result: Body = {"index": index, "error_code": 0, "base_offset": -1,
                    "log_append_time_ms": -1, "log_start_offset": -1}
    return _record_error(result, ErrorCode.INVALID_TOPIC_EXCEPTION,
                         f"Cannot append to internal topic {topic}")


def _record_error(result: Body, code: ErrorCode, message: str) -> Body:
    result["error_code"] = code
    result["error_message"] = message
    result["record_errors"] = [{"batch_index": 0, "batch_index_error_message": message}]
    return result


def _produce_body(request: Struct, error: ErrorCode) -> Body:
    return {
        "responses": [
            {
                "name": topic.name,
                "partition_responses": [
                    {"index": p.index, "error_code": error, "base_offset": -1}
                    for p in topic.partition_data
                ],
            }
            for topic in request.topic_data
        ],
        "throttle_time_ms": 0,
    }


def _close_regions(body: Body) -> None:
    for topic in body["responses"]:
        for partition in topic["partitions"]:
            records = partition["records"]
            if isinstance(records, list):
                for region in records:
                    region.close()


@dataclass(eq=False)
class _VerifiedAppend:
    """A transactional append waiting for its coordinator's verify_only answer; the append
    runs (synchronously) when the answer arrives, before ``verification.done`` is set, and
    leaves its acknowledgement wait in ``wait``."""

    verification: PendingVerification
    wait: _AckWait | None = None


@dataclass(eq=False)
class _AckWait(AckWait):
    """One partition of a Produce waiting for its acknowledgement (``AckWait``), with the
    response entry that gets the outcome."""

    result: Body = dataclasses.field(default_factory=dict)


def _fetch_refused(request: Struct, error: ErrorCode) -> Body:
    """A Fetch answered with ``error`` for every partition, nothing read."""
    return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": [
        {"topic": topic.topic, "partitions": [
            {"partition_index": p.partition, "error_code": error, "high_watermark": -1,
             "last_stable_offset": -1, "log_start_offset": -1, "records": b"",
             "aborted_transactions": None}
            for p in topic.partitions]}
        for topic in request.topics]}
