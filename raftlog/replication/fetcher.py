"""The follower side of replication: one ``LeaderFetcher`` task per leader node.

First OffsetForLeaderEpoch (v3) for partitions whose leader epoch is new, truncating divergent
tails (Kafka's getOffsetTruncationState); then a loop of Fetch (v11, replica_id = this node)
from each partition's log end, appended with ``Partition.append`` (origin REPLICATION), fsynced
through the manager's group commit, HW = min(leader HW, own end), and the leader's log start
followed. Every network wait has a timeout; fetch errors back a partition (or the whole
fetcher) off.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from raftlog.client.connection import KafkaClientError, KafkaConnection
from raftlog.log_budget import LogBudget
from raftlog.partition.append import AppendOrigin
from raftlog.partition.append_trace import FollowerRound
from raftlog.partition.batch import BATCH_LENGTH_OFFSET, LOG_OVERHEAD, RECORD_BATCH_OVERHEAD
from raftlog.partition.epoch_cache import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
from raftlog.partition.errors import PartitionLogError, UnexpectedOffsetError
from raftlog.partition.log import KafkaStorageError
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import FETCH, LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH
from raftlog.replication.assignment import FetcherStats, Follower, FollowerAssignment
from raftlog.replication.fetch_session import FollowerSession, PartitionFetch
from raftlog.replication.settings import PartitionKey

__all__ = ["FetcherStats", "Follower", "FollowerAssignment", "LeaderFetcher"]

log = logging.getLogger(__name__)

FETCH_VERSION = 11
# The leader lost our session or we lost an answer: the next Fetch starts a new one at once.
_SESSION_ERRORS = frozenset({ErrorCode.FETCH_SESSION_ID_NOT_FOUND,
                             ErrorCode.INVALID_FETCH_SESSION_EPOCH})
OFFSET_FOR_LEADER_EPOCH_VERSION = 3
LIST_OFFSETS_VERSION = 5
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
IDLE_WAIT_S = 1.0
# After STALE_BROKER_EPOCH: a restarted follower's registration reaches the leader's image (and
# its own) within milliseconds, so it reconnects this soon rather than after the full backoff
# (which added a second to every restarted node's return to the ISR); doubling per stale answer
# in a row, up to the backoff, so a follower whose image stays behind does not spin.
STALE_EPOCH_RETRY_S = 0.05

# Errors after which a follower waits for new metadata (and retries after a backoff).
_METADATA_ERRORS = frozenset({
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.STALE_BROKER_EPOCH,  # our registration is not in the leader's image yet
})


class LeaderFetcher:
    """Replicates every partition this node follows from one leader, over one connection."""

    def __init__(self, replicas: Follower, leader_id: int) -> None:
        self.replicas = replicas
        self.manager = replicas.manager
        self.settings = replicas.settings
        self.stats = replicas.fetcher_stats
        self.leader_id = leader_id
        self.assignments: dict[PartitionKey, FollowerAssignment] = {}
        self.cancel_scope = trio.CancelScope()
        self.fetch_rounds = 0  # visible for testing
        self._started = False
        self._changed = trio.Event()
        self._connection: KafkaConnection | None = None
        self._address: tuple[str, int] | None = None
        self._rotation = 0
        self._stale_answers = 0  # STALE_BROKER_EPOCH answers in a row
        self._session = FollowerSession()  # KIP-227, with this leader over this connection
        # After a restart every partition of a leader may answer UNKNOWN_LEADER_EPOCH until
        # its image arrives: 26,000 lines in one 4,000-partition restart. A few, then a count.
        self._back_off_lines = LogBudget(log, f"back-off lines about leader {leader_id}")
        self.last_request_partitions = 0  # partitions named in the last Fetch (for tests)
        stats = self.manager.trace_stats  # trace.produce.enable: the rounds' stage timing
        self._trace = None if stats is None else FollowerRound(stats)

    def start(self, nursery: trio.Nursery) -> None:
        if not self._started:
            self._started = True
            nursery.start_soon(self.run)

    def stop(self) -> None:
        self.cancel_scope.cancel()

    def add(self, assignment: FollowerAssignment) -> None:
        self.assignments[assignment.key] = assignment
        self.wake()

    def remove(self, assignment: FollowerAssignment) -> None:
        if self.assignments.get(assignment.key) is assignment:
            del self.assignments[assignment.key]
            self.wake()

    def wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _current(self, assignment: FollowerAssignment) -> bool:
        return (self.assignments.get(assignment.key) is assignment
                and self.replicas.is_following(assignment))

    async def run(self) -> None:
        with self.cancel_scope:
            try:
                while True:
                    await self._run_once()
            finally:
                await self._disconnect()

    async def _run_once(self) -> None:
        if not self.assignments:
            await self._wait_changed(IDLE_WAIT_S)
            return
        connection = await self._connect()
        if connection is None:
            await trio.sleep(self.settings.fetch_backoff_ms / 1000)
            return
        try:
            await self._truncate_diverged(connection)
            await self._fetch(connection)
        except KafkaClientError as exc:
            log.warning("replica fetcher %d -> %d: %s; reconnecting", self.replicas.node_id,
                        self.leader_id, exc)
        except Exception:
            # A bug or a disk error must cost a retry, never the node.
            log.exception("replica fetcher %d -> %d failed; retrying", self.replicas.node_id,
                          self.leader_id)
        else:
            return
        await self._disconnect()
        await trio.sleep(self.settings.fetch_backoff_ms / 1000)

    async def _wait_changed(self, timeout_s: float) -> None:
        changed = self._changed
        with trio.move_on_after(timeout_s):
            await changed.wait()

    # --- connection ------------------------------------------------------------------------

    async def _connect(self) -> KafkaConnection | None:
        address = self.replicas.broker_address(self.leader_id)
        if address is None:
            log.warning("replica fetcher %d: leader %d has no registered address",
                        self.replicas.node_id, self.leader_id)
            return None
        if self._connection is not None and address == self._address:
            return self._connection
        await self._disconnect()
        try:
            self._connection = await KafkaConnection.connect(
                *address, client_id=f"raftlog-replica-{self.replicas.node_id}",
                timeout_s=self.settings.socket_timeout_ms / 1000, login=self.replicas.login)
        except KafkaClientError as exc:
            log.warning("replica fetcher %d: cannot reach leader %d at %s:%d: %s",
                        self.replicas.node_id, self.leader_id, *address, exc)
            return None
        self._address = address
        return self._connection

    async def _disconnect(self) -> None:
        connection, self._connection = self._connection, None
        self._session.failed()
        if connection is not None:
            with trio.move_on_after(1) as cleanup:
                cleanup.shield = True
                await connection.aclose()

    async def _request(self, connection: KafkaConnection, api: Any, body: dict[str, Any],
                       version: int, extra_wait_s: float = 0.0) -> Any:
        return await connection.request(
            api, body, version=version,
            timeout_s=self.settings.socket_timeout_ms / 1000 + extra_wait_s)

    # --- epoch validation and truncation ---------------------------------------------------

    async def _truncate_diverged(self, connection: KafkaConnection) -> None:
        """OffsetForLeaderEpoch for every partition with a new leader epoch; truncate each to
        where its log and the leader's agree (Kafka's getOffsetTruncationState)."""
        while True:
            now = trio.current_time()
            pending = [a for a in self.assignments.values()
                       if a.needs_truncation and a.delayed_until <= now]
            asking = []
            for assignment in pending:
                partition = assignment.partition
                if partition.log.latest_epoch == UNDEFINED_EPOCH:
                    # No epochs (an empty log): nothing can have diverged beyond the HW.
                    if self._truncate(assignment, partition.high_watermark):
                        assignment.needs_truncation = False
                else:
                    asking.append(assignment)
            if not asking:
                return
            by_topic: dict[str, list[dict[str, int]]] = {}
            for assignment in asking:
                by_topic.setdefault(assignment.partition.topic, []).append({
                    "partition": assignment.partition.index,
                    "current_leader_epoch": assignment.leader_epoch,
                    "leader_epoch": assignment.partition.log.latest_epoch,
                })
            response = await self._request(connection, OFFSET_FOR_LEADER_EPOCH, {
                "replica_id": self.replicas.node_id,
                "topics": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
            }, OFFSET_FOR_LEADER_EPOCH_VERSION)
            sent = {a.key: a for a in asking}
            again = False
            for topic in response.topics:
                for result in topic.partitions:
                    answered = sent.get((topic.topic, result.partition))
                    if answered is None or not self._current(answered):
                        continue
                    again = self._apply_epoch_end(answered, result) or again
            if not again:
                return

    def _apply_epoch_end(self, assignment: FollowerAssignment, result: Any) -> bool:
        """Truncate per one OffsetForLeaderEpoch answer; True when another round is needed."""
        partition = assignment.partition
        if result.error_code != ErrorCode.NONE:
            self._back_off(assignment, result.error_code, "OffsetForLeaderEpoch")
            return False
        end = partition.log.log_end_offset
        leader_epoch, leader_end = result.leader_epoch, result.end_offset
        done = True
        if leader_end == UNDEFINED_EPOCH_OFFSET:
            target = partition.high_watermark
        elif leader_epoch == UNDEFINED_EPOCH:
            target = min(leader_end, end)
        else:
            own_epoch, own_end = partition.log.end_offset_for_epoch(leader_epoch)
            if own_end == UNDEFINED_EPOCH_OFFSET:
                target = min(leader_end, end)
            elif own_epoch != leader_epoch:
                # We never saw the leader's epoch: cut back to where our older one ends and
                # ask again with the epoch that is then our latest.
                target = min(own_end, end)
                done = False
            else:
                target = min(own_end, leader_end, end)
        if not self._truncate(assignment, target):
            return False  # backed off; validated again after the backoff
        if done or partition.log.latest_epoch == UNDEFINED_EPOCH:
            assignment.needs_truncation = False
            return False
        return True

    def _truncate(self, assignment: FollowerAssignment, offset: int) -> bool:
        """Cut the log back to ``offset``; False (the partition backed off, still needing
        truncation) when its log is offline after an I/O error."""
        partition = assignment.partition
        log_ = partition.log
        if offset >= log_.log_end_offset:
            return True
        log.info("partition %s-%d: truncating from %d to %d (leader %d, epoch %d)",
                 partition.topic, partition.index, log_.log_end_offset, offset,
                 assignment.leader_id, assignment.leader_epoch)
        try:
            if offset < log_.log_start_offset:
                partition.reset_to(offset)
            else:
                partition.truncate_to(offset)
        except KafkaStorageError as exc:
            self._back_off_offline(assignment, "truncate", exc)
            return False
        self.manager.note_role_change(partition)
        return True

    def _drop_corrupt(self, assignment: FollowerAssignment) -> None:
        """A follower whose log holds a corrupt batch (``log_verify``) gets the good copy
        from the leader: truncate to the batch and fetch from there. Only once this replica
        is out of the committed ISR, so that it never leads, nor counts for the HW, with
        less than the acknowledged data: first its fetches report the corrupt batch's offset
        as its log end (their answers are dropped), so the leader neither counts it for the
        HW nor lets it (re)join the ISR, and drops it from the ISR at once if it is a member
        (``LeaderState.out_of_sync``); then, one backoff later and out of the ISR, it
        truncates. (An ISR expansion the leader sent before that report and the controller
        commits more than a backoff later is the window left: docs/operations.md.)"""
        partition = assignment.partition
        bad = partition.corrupt_offset
        if bad is None or self.replicas.node_id in partition.isr \
                or assignment.reported_corrupt_offset != bad or not self._current(assignment):
            return
        log.warning("partition %s-%d: dropping the corrupt batch at offset %d and what "
                    "follows; fetching them again from leader %d", partition.topic,
                    partition.index, bad, self.leader_id)
        self._truncate(assignment, bad)

    def _back_off_offline(self, assignment: FollowerAssignment, operation: str,
                          exc: KafkaStorageError) -> None:
        """The partition's log is offline (a restart recovers it): log it and retry only
        after the backoff, so an offline partition neither spins nor stalls the others."""
        partition = assignment.partition
        log.warning("partition %s-%d: cannot %s: %s; retrying after %d ms", partition.topic,
                    partition.index, operation, exc, self.settings.fetch_backoff_ms)
        assignment.delayed_until = trio.current_time() + self.settings.fetch_backoff_ms / 1000

    # --- fetching --------------------------------------------------------------------------

    async def _fetch(self, connection: KafkaConnection) -> None:
        for assignment in list(self.assignments.values()):
            self._drop_corrupt(assignment)
        now = trio.current_time()
        ready = [a for a in self.assignments.values()
                 if not a.needs_truncation and a.delayed_until <= now]
        if not ready:
            if any(a.needs_truncation and a.delayed_until <= now
                   for a in self.assignments.values()):
                return  # added while we were busy: validate its epoch first
            delays = [a.delayed_until for a in self.assignments.values()
                      if a.delayed_until > now]
            await self._wait_changed(min(delays, default=now + IDLE_WAIT_S) - now)
            return
        self._rotation = (self._rotation + 1) % len(ready)
        ready = ready[self._rotation:] + ready[:self._rotation]  # fairness under max_bytes
        holding: set[PartitionKey] = set()  # corrupt, still in the ISR: see _drop_corrupt
        wanted: dict[PartitionKey, PartitionFetch] = {}
        for assignment in ready:
            partition = assignment.partition
            fetch_offset = partition.log.log_end_offset
            if partition.corrupt_offset is not None:
                fetch_offset = partition.corrupt_offset
                holding.add(assignment.key)
            wanted[assignment.key] = PartitionFetch(
                assignment.leader_epoch, fetch_offset, partition.log.log_start_offset,
                self.settings.fetch_max_bytes)
        response = await self._send_fetch(connection, wanted)
        if response.error_code in _SESSION_ERRORS:
            log.info("replica fetcher %d -> %d: %s; starting a new fetch session",
                     self.replicas.node_id, self.leader_id, _error_name(response.error_code))
            return
        if response.error_code != ErrorCode.NONE:
            for assignment in ready:
                self._back_off(assignment, response.error_code, "Fetch")
            return
        sent = {a.key: a for a in ready}
        appended: list[tuple[FollowerAssignment, int, int, int]] = []
        out_of_range: list[FollowerAssignment] = []
        stale_epoch = False
        for topic in response.responses:
            for result in topic.partitions:
                answered = sent.get((topic.topic, result.partition_index))
                if answered is None or not self._current(answered):
                    continue
                stale_epoch = stale_epoch or result.error_code == ErrorCode.STALE_BROKER_EPOCH
                if answered.key in holding:  # told the leader; the records are not for us
                    if result.error_code == ErrorCode.NONE:
                        answered.reported_corrupt_offset = answered.partition.corrupt_offset \
                            if answered.partition.corrupt_offset is not None else -1
                    answered.delayed_until = trio.current_time() + \
                        self.settings.fetch_backoff_ms / 1000
                elif result.error_code == ErrorCode.OFFSET_OUT_OF_RANGE:
                    out_of_range.append(answered)
                elif result.error_code == ErrorCode.STALE_BROKER_EPOCH:
                    answered.delayed_until = trio.current_time() + min(
                        STALE_EPOCH_RETRY_S * 2 ** min(self._stale_answers, 10),
                        self.settings.fetch_backoff_ms / 1000)
                elif result.error_code != ErrorCode.NONE:
                    self._back_off(answered, result.error_code, "Fetch")
                elif self._append(answered, result.records, result.high_watermark):
                    appended.append((answered, answered.partition.log.log_end_offset,
                                     result.high_watermark, result.log_start_offset))
        await self._sync_and_advance(appended)
        if self._trace is not None:
            self._trace.flushed()
        self._stale_answers = self._stale_answers + 1 if stale_epoch else 0
        if stale_epoch:
            # The connection authenticated with a broker epoch the leader does not hold as
            # ours (KIP-903): a new connection claims the epoch our image has now.
            log.info("replica fetcher %d: leader %d holds another broker epoch for us;"
                     " reconnecting", self.replicas.node_id, self.leader_id)
            await self._disconnect()
            return
        for assignment in out_of_range:
            if self._current(assignment):
                await self._handle_out_of_range(connection, assignment)

    async def _send_fetch(self, connection: KafkaConnection,
                          wanted: dict[PartitionKey, PartitionFetch]) -> Any:
        """One Fetch for ``wanted`` in the session with this leader (KIP-227): only what
        changed since the last answer is sent, and only what changed comes back."""
        request = self._session.build(wanted)
        by_topic: dict[str, list[dict[str, int]]] = {}
        for (topic, index), fetch in request.partitions.items():
            by_topic.setdefault(topic, []).append({
                "partition": index, "current_leader_epoch": fetch.current_leader_epoch,
                "fetch_offset": fetch.fetch_offset, "log_start_offset": fetch.log_start_offset,
                "partition_max_bytes": fetch.partition_max_bytes})
        forgotten: dict[str, list[int]] = {}
        for topic, index in request.forgotten:
            forgotten.setdefault(topic, []).append(index)
        self.stats.requests.inc()
        self.last_request_partitions = len(request.partitions)
        if self._trace is not None:
            self._trace.fetch_sent()
        try:
            response = await self._request(connection, FETCH, {
                "replica_id": self.replicas.node_id,
                "max_wait_ms": self.settings.fetch_wait_max_ms,
                "min_bytes": self.settings.fetch_min_bytes,
                "max_bytes": self.settings.fetch_response_max_bytes,
                "isolation_level": 0,
                "session_id": request.session_id,
                "session_epoch": request.session_epoch,
                "topics": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
                "forgotten_topics_data": [{"topic": t, "partitions": ps}
                                          for t, ps in forgotten.items()],
                "rack_id": "",
            }, FETCH_VERSION, extra_wait_s=self.settings.fetch_wait_max_ms / 1000)
        except BaseException:
            self._session.failed()  # the leader's session state is unknown: start over
            raise
        self._session.answered(response.error_code, response.session_id)
        self.fetch_rounds += 1
        if self._trace is not None:
            self._trace.answered()
        return response

    def _append(self, assignment: FollowerAssignment, records: memoryview | None,
                leader_high_watermark: int = -1) -> bool:
        """Append a fetch answer's batches; False after an error (the partition backs off)."""
        partition = assignment.partition
        assignment.leader_high_watermark = leader_high_watermark
        if records is not None:
            self.stats.fetched_bytes.inc(len(records))
        data = _whole_batches(records)
        if not data:
            return True  # nothing new: still learn the leader's HW
        try:
            partition.append(data, AppendOrigin.REPLICATION)
        except UnexpectedOffsetError as exc:
            log.warning("partition %s-%d: %s; validating the epoch again", partition.topic,
                        partition.index, exc)
            assignment.needs_truncation = True
            return False
        except (PartitionLogError, OSError) as exc:
            log.error("partition %s-%d: cannot append replicated batches: %s",
                      partition.topic, partition.index, exc)
            assignment.delayed_until = trio.current_time() + self.settings.fetch_backoff_ms / 1000
            return False
        self.stats.appended_bytes.inc(len(data))
        if self._trace is not None:
            self._trace.appended()
        return True

    async def _sync_and_advance(
            self, appended: list[tuple[FollowerAssignment, int, int, int]]) -> None:
        """fsync what was appended (one group-commit round covers all of them), then set
        each HW to min(leader HW, own end): only then may the next fetch report the end.
        Then follow the leader's log start offset (DeleteRecords, retention)."""
        timeout_s = self.settings.socket_timeout_ms / 1000
        if appended:
            # Quick fsyncs run here and now rather than in the flusher task (two scheduler
            # passes fewer between the answer and the next Fetch); slow ones stay there.
            self.manager.flush_inline()
        for assignment, end_offset, leader_high_watermark, leader_start in appended:
            partition = assignment.partition
            # Most answers carry nothing for most partitions: no wait (and no cancel scope)
            # for a partition already fsynced to its end.
            if partition.durable_acks and partition.log.flushed_offset < end_offset:
                while not await partition.wait_flushed(end_offset,
                                                       trio.current_time() + timeout_s):
                    if not self._current(assignment):
                        break
                    log.warning("partition %s-%d: still waiting for fsync to offset %d",
                                partition.topic, partition.index, end_offset)
            if self._current(assignment):
                self.manager.set_follower_high_watermark(partition, leader_high_watermark)
                self._follow_log_start(assignment, leader_start)

    def _follow_log_start(self, assignment: FollowerAssignment, leader_start: int) -> None:
        """Kafka's ReplicaFetcherThread ``maybeIncrementLogStartOffset``: advance to the
        leader's log start, capped at our HW (UnifiedLog refuses a start past it), so the
        next Fetch reports it and the leader's DeleteRecords can complete. Synchronous, on
        the event loop (``Partition.move_log_start_offset``: the checkpoint's fsyncs and a
        directory fsync after any unlinks; no await, so no cancellation or role change can
        interleave). A failure changes nothing (the retry writes the checkpoint again) and
        backs the partition off (the leader answers a follower whose reported start is
        behind at once, so retrying without a pause would spin)."""
        partition = assignment.partition
        target = min(leader_start, partition.high_watermark)
        if target <= partition.log.log_start_offset:
            return
        try:
            if partition.move_log_start_offset(target):
                log.info("partition %s-%d: log start offset advanced to %d (the leader's)",
                         partition.topic, partition.index, target)
        except (PartitionLogError, OSError) as exc:  # retried after the backoff
            log.warning("partition %s-%d: cannot advance the log start offset to %d: %s",
                        partition.topic, partition.index, target, exc)
            assignment.delayed_until = trio.current_time() + self.settings.fetch_backoff_ms / 1000

    async def _handle_out_of_range(self, connection: KafkaConnection,
                                   assignment: FollowerAssignment) -> None:
        """Kafka's handleOutOfRangeError: our end is past the leader's (validate the epoch
        again) or below its log start (start over at the leader's log start)."""
        partition = assignment.partition
        latest = await self._list_offset(connection, assignment, LATEST_TIMESTAMP)
        earliest = await self._list_offset(connection, assignment, EARLIEST_TIMESTAMP)
        if latest is None or earliest is None or not self._current(assignment):
            return
        end = partition.log.log_end_offset
        if latest < end:
            assignment.needs_truncation = True
        elif earliest > end:
            log.warning("partition %s-%d: log end %d is below the leader's log start %d; "
                        "starting over there", partition.topic, partition.index, end, earliest)
            try:
                partition.reset_to(earliest)
            except KafkaStorageError as exc:
                self._back_off_offline(assignment, f"restart the log at {earliest}", exc)
                return
            self.manager.note_role_change(partition)
        else:  # in range again (retention or an append raced the fetch): retry shortly
            assignment.delayed_until = trio.current_time() + self.settings.fetch_backoff_ms / 1000

    async def _list_offset(self, connection: KafkaConnection, assignment: FollowerAssignment,
                           timestamp: int) -> int | None:
        partition = assignment.partition
        response = await self._request(connection, LIST_OFFSETS, {
            "replica_id": self.replicas.node_id,
            "isolation_level": 0,
            "topics": [{"name": partition.topic, "partitions": [{
                "partition_index": partition.index,
                "current_leader_epoch": assignment.leader_epoch,
                "timestamp": timestamp}]}],
        }, LIST_OFFSETS_VERSION)
        result = response.topics[0].partitions[0]
        if result.error_code != ErrorCode.NONE:
            self._back_off(assignment, result.error_code, "ListOffsets")
            return None
        offset: int = result.offset
        return offset

    def _back_off(self, assignment: FollowerAssignment, error_code: int, api: str) -> None:
        partition = assignment.partition
        name = _error_name(error_code)
        level = logging.INFO if error_code in _METADATA_ERRORS else logging.WARNING
        self._back_off_lines.log(level, "partition %s-%d: %s from leader %d answered %s; "
                                 "backing off", partition.topic, partition.index, api,
                                 self.leader_id, name)
        assignment.delayed_until = trio.current_time() + self.settings.fetch_backoff_ms / 1000


def _error_name(error_code: int) -> str:
    try:
        return ErrorCode(error_code).name
    except ValueError:
        return f"error {error_code}"


def _whole_batches(records: memoryview | bytes | None) -> memoryview:
    """The complete batches at the start of ``records`` (a leader may cut the last one)."""
    if records is None:
        return memoryview(b"")
    view = memoryview(records)
    position = 0
    while len(view) - position >= RECORD_BATCH_OVERHEAD:
        batch_length = int.from_bytes(view[position + BATCH_LENGTH_OFFSET:position + LOG_OVERHEAD],
                                      "big", signed=True)
        size = batch_length + LOG_OVERHEAD
        if batch_length <= 0 or position + size > len(view):
            break
        position += size
    return view[:position]
