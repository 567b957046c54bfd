"""Produce (0): a leader appends a client's record batches and answers once they are as
durable as ``acks`` asks.

The synchronous part validates and appends, in request order, on the connection's reader
task (so a producer's batches keep their order); what waits is the acknowledgement (acks=all:
every ISR member has the records, acks=1: this leader fsynced them, ``_AckWait``) and, for a
transactional batch, the transaction coordinator's verdict (KIP-890 part 1,
``_VerifiedAppend``): the append itself runs when the verdict arrives. Clients never write to
the internal topics; the group coordinator appends its offsets there through
``ProduceApis.append``.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass

import trio

from raftlog.broker.partition_checks import missing_partition_error
from raftlog.metrics.recorders import CounterMap
from raftlog.partition.append import AppendOrigin
from raftlog.partition.batch import (
    ATTRIBUTES_OFFSET,
    BATCH_LENGTH_OFFSET,
    LOG_OVERHEAD,
    TRANSACTIONAL_BIT,
    BatchHeader,
    validate_batches,
)
from raftlog.partition.errors import PartitionLogError
from raftlog.partition.log import KafkaStorageError, describe_os_error
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import AckWait, Partition
from raftlog.protocol.codec import Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.internal_topics import is_internal_topic
from raftlog.protocol.schemas import PRODUCE
from raftlog.quorum.interface import Quorum
from raftlog.server.listener import Body, ConnectionClosed, Handler, HandlerResult, RequestContext
from raftlog.txn.coordinator_service import PendingVerification, Verdict

log = logging.getLogger(__name__)

# The produce path's check (KIP-890 part 1): (topic, partition, transactional id, producer id,
# epoch) -> a verdict now, or a verification in flight whose answer resumes the append.
TxnProduceVerifier = Callable[[str, int, "str | None", int, int],
                              "Verdict | PendingVerification"]

_ATTRIBUTES = struct.Struct(">h")
_BATCH_LENGTH = struct.Struct(">i")


class ProduceStats:
    """What the produce path counts (read by ``raftlog.observe``): per topic, the bytes and
    records of client batches appended as leader (Kafka's BrokerTopicMetrics BytesInPerSec,
    MessagesInPerSec; retried duplicates, refused and failed appends do not count), and the
    acks=all Produce requests waiting for replication (the Produce purgatory).

    Keys are topic names; a deleted topic's stay (one integer each) and the collector
    exports only topics the metadata still has."""

    __slots__ = ("bytes_in", "messages_in", "waiting")

    def __init__(self) -> None:
        self.bytes_in = CounterMap()
        self.messages_in = CounterMap()
        self.waiting = 0


class ProduceApis:
    """The Produce handler and the leader's append path, bound to the partitions here.

    ``txn_produce_verifier`` is the transaction coordinator's check for transactional
    batches; without one (no transactions on this node) they are refused INVALID_TXN_STATE.
    """

    def __init__(self, quorum: Quorum, manager: PartitionManager, *,
                 txn_produce_verifier: TxnProduceVerifier | None = None) -> None:
        self.quorum = quorum  # its image tells "not here" from "not the leader"
        self.manager = manager
        self.txn_produce_verifier = txn_produce_verifier
        self.stats = ProduceStats()

    def handlers(self) -> dict[int, Handler]:
        table: dict[int, Callable[[RequestContext], HandlerResult]] = {
            PRODUCE.key: self.produce,
        }
        return dict(table)

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
                    result, wait = self.append(topic.name, data.index, data.records,
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
        stats = self.stats
        delayed = request.acks == -1  # Kafka's Produce purgatory holds acks=all only

        async def wait_until_acknowledged() -> Body:
            if delayed:
                stats.waiting += 1
            try:
                for pending in verifying:
                    # The verification task always finishes (bounded by its own timeout).
                    await pending.verification.done.wait()
                    if pending.wait is not None:
                        waits.append(pending.wait)
                for wait in waits:
                    await wait.partition.wait_until(wait.settled, deadline)
                    wait.result["error_code"] = wait.error_code()
                    if wait.partition.trace is not None:
                        wait.partition.trace.answered(wait.target)
            finally:
                if delayed:
                    stats.waiting -= 1
            return body

        return wait_until_acknowledged

    def append(
        self, topic: str, index: int, records: memoryview | None, acks: int,
        transactional_id: str | None = None,
    ) -> tuple[Body, _AckWait | _VerifiedAppend | None]:
        result: Body = {"index": index, "error_code": 0, "base_offset": -1,
                        "log_append_time_ms": -1, "log_start_offset": -1}
        partition = self.manager.get(topic, index)
        if partition is None:
            result["error_code"] = missing_partition_error(self.quorum.image, topic, index)
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
        if not appended.duplicate:
            # Client batches' offsets are dense (recordsCount == lastOffsetDelta + 1 is
            # validated), so the offset span is the record count: no decoding.
            self.stats.bytes_in.inc(topic, len(records))
            self.stats.messages_in.inc(topic, appended.last_offset - appended.base_offset + 1)
        result["base_offset"] = appended.base_offset
        result["log_append_time_ms"] = appended.log_append_time_ms
        result["log_start_offset"] = partition.log.log_start_offset
        return result, _AckWait(partition, appended.end_offset, acks,
                                appended.leadership_generation, result)


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
