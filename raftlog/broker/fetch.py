"""Fetch (1): consumers read up to the high watermark (or the last stable offset), followers
read everything written and, by fetching, report how far they have replicated.

A Fetch is normalised once into a ``FetchPlan`` and re-read on every wake-up of its long poll
(``max_wait_ms``) until ``min_bytes`` are there, a partition failed, or a follower has a new
log start to adopt. A follower's fetch is a cluster action: only the authenticated broker of
that replica id, at its registered broker epoch (KIP-903), moves the high watermark.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import trio

from raftlog.broker.fetch_sessions import FetchSession, FetchSessionCache, PartitionRequest
from raftlog.broker.partition_checks import check_leader_epoch, missing_partition_error
from raftlog.metrics.recorders import Counter, CounterMap
from raftlog.partition.errors import OffsetOutOfRangeError
from raftlog.partition.log import describe_os_error
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import Partition
from raftlog.protocol.codec import Struct
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import FETCH
from raftlog.quorum.interface import Quorum
from raftlog.replication.manager import ReplicaManager
from raftlog.server.listener import Body, Handler, HandlerResult, RequestContext
from raftlog.server.sasl import ClusterActionGate

log = logging.getLogger(__name__)

# Kafka's replica id of a consumer's fetch (>= 0: a follower's).
CONSUMER_REPLICA_ID = -1
READ_COMMITTED = 1


@dataclass(frozen=True)
class FetchPlan:
    """A Fetch request, normalised once so a long poll can re-read it cheaply."""

    version: int
    isolation_level: int
    max_bytes: int
    min_bytes: int
    partitions: Sequence[tuple[str, Sequence[PartitionRequest]]]
    replica_id: int = CONSUMER_REPLICA_ID  # >= 0: a follower's fetch
    broker_epoch: int = -1  # a follower's: the broker epoch its connection proved

    @property
    def from_follower(self) -> bool:
        return self.replica_id >= 0


class FetchStats:
    """What the fetch path counts (read by ``raftlog.observe``): record bytes answered to
    consumers per topic and to followers in all (Kafka's BrokerTopicMetrics BytesOutPerSec,
    ReplicationBytesOutPerSec: the file regions of the responses returned, counted once
    per Fetch), and the Fetch requests long-polling (the Fetch purgatory).

    Keys are topic names; a deleted topic's stay (one integer each) and the collector
    exports only topics the metadata still has."""

    __slots__ = ("bytes_out", "replication_bytes_out", "waiting")

    def __init__(self) -> None:
        self.bytes_out = CounterMap()
        self.replication_bytes_out = Counter()
        self.waiting = 0

    def count_served(self, plan: FetchPlan, body: Body) -> None:
        """Count the records of the Fetch response ``body`` about to be returned."""
        total = 0
        for topic in body["responses"]:
            size = 0
            for partition in topic["partitions"]:
                records = partition["records"]
                if isinstance(records, list):
                    size += sum(region.size_bytes for region in records)
            if size and not plan.from_follower:
                self.bytes_out.inc(topic["topic"], size)
            total += size
        if plan.from_follower and total:
            self.replication_bytes_out.inc(total)


class FetchApis:
    """The Fetch handler, bound to the partitions here and the replica manager that records
    followers' progress; ``gate`` admits only cluster members' replica fetches."""

    def __init__(self, quorum: Quorum, manager: PartitionManager, replicas: ReplicaManager,
                 gate: ClusterActionGate) -> None:
        self.quorum = quorum
        self.manager = manager
        self.replicas = replicas
        self.gate = gate
        self.stats = FetchStats()
        self.sessions = FetchSessionCache()  # followers' incremental fetch sessions (KIP-227)

    def handlers(self) -> dict[int, Handler]:
        table: dict[int, Callable[[RequestContext], HandlerResult]] = {
            FETCH.key: self.fetch,
        }
        return dict(table)

    def fetch(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        if request.replica_id >= 0:
            refused = self._replica_fetch_error(ctx, request.replica_id)
            if refused:
                return _fetch_refused(request, refused)
        topics = tuple((t.topic, t.partitions) for t in request.topics)
        session: FetchSession | None = None
        if request.session_id != 0 or request.session_epoch != -1:
            error, session = self.sessions.begin(
                replica_id=request.replica_id, session_id=request.session_id,
                session_epoch=request.session_epoch, topics=topics,
                forgotten=[(f.topic, f.partitions) for f in request.forgotten_topics_data])
            if error:
                return {"throttle_time_ms": 0, "error_code": error, "session_id": 0,
                        "responses": []}
        plan = FetchPlan(
            version=ctx.header.api_version,
            isolation_level=request.isolation_level,
            max_bytes=max(request.max_bytes, 0),
            min_bytes=max(request.min_bytes, 0),
            partitions=topics if session is None else session.plan(),
            replica_id=request.replica_id,
            broker_epoch=ctx.session.broker_epoch if request.replica_id >= 0 else -1,
        )
        stats = self.stats
        incremental = request.session_epoch > 0

        def answer(body: Body) -> Body:
            if session is not None:
                body["responses"] = session.answered(body["responses"],
                                                     incremental=incremental)
                body["session_id"] = session.session_id
            stats.count_served(plan, body)
            return body

        changes = self.manager.changes
        seen = changes.seq  # what moved after this, the first read may not have seen
        body, total_bytes, failed = self._read_fetch(plan, record=True)
        if request.max_wait_ms <= 0 or self._fetch_complete(plan, total_bytes, failed):
            return answer(body)
        # An incremental answer leaves out what did not change: a wake-up reads again only
        # the partitions that moved since this request came (change_journal) and those whose
        # first read already had news for the follower (a HW without records, say); None:
        # every partition.
        news = session.unanswered(body["responses"]) if session and incremental else None
        _close_regions(body)
        deadline = trio.current_time() + request.max_wait_ms / 1000

        async def long_poll() -> Body:
            nonlocal seen, news
            stats.waiting += 1
            try:
                while True:
                    # Only when nothing moved since the last read: the writer starts this
                    # wait when it reaches the request, and an append in between (its wake-up
                    # already spent) would otherwise wait out max_wait_ms.
                    if changes.seq == seen:
                        if plan.from_follower:  # followers want anything appended, not the HW
                            await self.manager.wait_for_append(deadline)
                        else:
                            await self.manager.wait_for_data(deadline)
                    moved = changes.since(seen)
                    seen = changes.seq
                    news = None if news is None or moved is None else news | moved
                    again = plan if news is None else _only(plan, news)
                    body, total_bytes, failed = self._read_fetch(again, record=False)
                    if trio.current_time() >= deadline or \
                            self._fetch_complete(again, total_bytes, failed):
                        return answer(body)
                    _close_regions(body)
            finally:
                stats.waiting -= 1

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
        self, plan: FetchPlan, topic: str, request: PartitionRequest, budget: int, first: bool,
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
            result["error_code"] = missing_partition_error(self.quorum.image, topic,
                                                           request.partition)
            return result, 0
        epoch_error = check_leader_epoch(request.current_leader_epoch, partition.leader_epoch)
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
                partition, plan.replica_id, offset, request.log_start_offset, plan.broker_epoch):
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
        if plan.from_follower and partition.trace is not None:
            _trace_sent(partition, plan.replica_id, read.size_bytes, limit, max_offset)
        if plan.isolation_level == READ_COMMITTED and not plan.from_follower:
            # Transactions: the aborted ones overlapping what is returned, so the consumer
            # drops their batches (KIP-98; upper bound: the LSO, a harmless superset).
            result["aborted_transactions"] = [
                {"producer_id": txn.producer_id, "first_offset": txn.first_offset}
                for txn in partition.txns.aborted_between(offset, max_offset)]
        return result, sum(s.size_bytes for s in read.slices)


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


def _trace_sent(partition: Partition, replica_id: int, size_bytes: int, limit_bytes: int,
                max_offset: int) -> None:
    """A follower's answer carries everything up to ``max_offset`` unless the byte limit cut
    it; only then is it "sent" (``append_trace``)."""
    assert partition.trace is not None
    if size_bytes < limit_bytes:
        partition.trace.sent(replica_id, max_offset)


def _only(plan: FetchPlan, keys: set[tuple[str, int]]) -> FetchPlan:
    """``plan`` restricted to the partitions in ``keys``."""
    partitions = []
    for name, requests in plan.partitions:
        kept = [r for r in requests if (name, r.partition) in keys]
        if kept:
            partitions.append((name, kept))
    return replace(plan, partitions=partitions)


def _close_regions(body: Body) -> None:
    for topic in body["responses"]:
        for partition in topic["partitions"]:
            records = partition["records"]
            if isinstance(records, list):
                for region in records:
                    region.close()


def _fetch_refused(request: Struct, error: ErrorCode) -> Body:
    """A Fetch answered with ``error`` for every partition, nothing read."""
    return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": [
        {"topic": topic.topic, "partitions": [
            {"partition_index": p.partition, "error_code": error, "high_watermark": -1,
             "last_stable_offset": -1, "log_start_offset": -1, "records": b"",
             "aborted_transactions": None}
            for p in topic.partitions]}
        for topic in request.topics]}
