"""The trio shell around :class:`~raftlog.group.coordinator.GroupCoordinator`, and the group
API handlers.

* Routing and writes: ``raftlog.group.offsets_log`` (a group's ``__consumer_offsets``
  partition, whose leader is its coordinator; the topic's creation; appends with acks=all,
  so a commit is acknowledged only once every ISR member has it, and in-memory offsets
  change only after that).
* Loading: a watcher notices when this node becomes leader of an offsets partition (or its
  leader epoch moves) and rebuilds that partition's groups and offsets from the log; requests
  for those groups get COORDINATOR_LOAD_IN_PROGRESS meanwhile, and NOT_COORDINATOR on a node
  that does not lead the partition.
* Offsets in transactions: ``raftlog.group.txn_offsets``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Final

import trio

from raftlog.clock import SteadyWallClock
from raftlog.config import ServerConfig
from raftlog.group.coordinator import GroupCoordinator, PendingPersist, check_offset_entries
from raftlog.group.offsets_log import (
    WRITE_TIMEOUT_S,
    CreateInternalTopic,
    OffsetRecords,
    OffsetsLog,
    commit_write_error,
)
from raftlog.group.records import (
    GroupKey,
    OffsetKey,
    RecordFormatError,
    decode_group_value,
    decode_key,
    decode_offset_value,
)
from raftlog.group.txn_offsets import TxnOffsets, TxnWriteVerifier
from raftlog.metadata.image import NO_LEADER
from raftlog.partition.batch import BatchHeader, Record, decode_records
from raftlog.partition.errors import PartitionLogError
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import AckWait
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.internal_topics import (
    OFFSETS_TOPIC,
    OFFSETS_TOPIC_PARTITIONS,
    UndecodableRecords,
)
from raftlog.protocol.schemas_group import (
    DELETE_GROUPS,
    DESCRIBE_GROUPS,
    HEARTBEAT,
    JOIN_GROUP,
    LEAVE_GROUP,
    LIST_GROUPS,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    SYNC_GROUP,
)
from raftlog.protocol.schemas_txn import TXN_OFFSET_COMMIT
from raftlog.quorum.interface import Quorum
from raftlog.server.find_coordinator import CoordinatorLocation
from raftlog.server.listener import Body, Handler, HandlerResult, RequestContext

log = logging.getLogger(__name__)

__all__ = ["GroupService"]

WATCH_INTERVAL_S: Final = 0.1
JOIN_WAIT_MARGIN_S: Final = 5.0


class _Waiter:
    def __init__(self) -> None:
        self.event = trio.Event()
        self.body: Body | None = None


class GroupService:
    """Group coordinator of this node: a pure core, the offsets-log I/O and the handlers."""

    def __init__(
        self,
        config: ServerConfig,
        quorum: Quorum,
        manager: PartitionManager,
        *,
        create_topic: CreateInternalTopic | None = None,
        verify_txn_write: TxnWriteVerifier | None = None,
        num_partitions: int = OFFSETS_TOPIC_PARTITIONS,
        core: GroupCoordinator | None = None,
        clock: SteadyWallClock | None = None,
    ) -> None:
        self.config = config
        # Membership deadlines, and the commit and state timestamps compared with them, on
        # one clock that a stepped wall clock cannot move (see SteadyWallClock).
        self.clock = clock or SteadyWallClock()
        self.quorum = quorum
        self.manager = manager
        self.num_partitions = num_partitions
        self.offsets_log = OffsetsLog(quorum, manager, num_partitions, self.clock, create_topic)
        self.core = core or GroupCoordinator(
            min_session_timeout_ms=config.group_min_session_timeout_ms,
            max_session_timeout_ms=config.group_max_session_timeout_ms,
            initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms)
        self._next_expiry_check_ms = 0
        self._loaded: dict[int, int] = {}  # offsets partition → leader epoch loaded
        self._group_partition: dict[str, int] = {}
        self._waiters: dict[int, _Waiter] = {}
        self._next_token = 0
        self._nursery: trio.Nursery | None = None
        # Offsets in transactions (raftlog.group.txn_offsets): the PendingOffsets seam.
        self.txn_offsets = TxnOffsets(config, quorum, self.core, self.offsets_log,
                                      self._coordinator_error, verify_txn_write)
        # Records (or unreadable batches) of __consumer_offsets that loads skipped, since start.
        self.undecodable_records_skipped = 0

    def now_ms(self) -> int:
        return self.clock.now_ms()

    # -- routing --------------------------------------------------------------------------------

    def partition_of(self, group_id: str) -> int:
        return self.offsets_log.partition_of(group_id)

    def locate(self, group_id: str) -> CoordinatorLocation:
        """FindCoordinator for a group: the leader of its offsets partition."""
        image = self.quorum.image
        topic = image.topics.get(OFFSETS_TOPIC)
        if topic is None:
            self.offsets_log.ensure_topic(self._nursery)
            return CoordinatorLocation(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                       message="the offsets topic is being created")
        index = self.partition_of(group_id)
        if index >= len(topic.partitions):
            return CoordinatorLocation(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        leader = topic.partitions[index].leader
        broker = image.brokers.get(leader)
        if leader == NO_LEADER or broker is None:
            return CoordinatorLocation(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return CoordinatorLocation(ErrorCode.NONE, leader, broker.host, broker.port)

    def _coordinator_error(self, group_id: str) -> int:
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        index = self.partition_of(group_id)
        partition = self.manager.get(OFFSETS_TOPIC, index)
        if partition is None or not partition.is_leader or partition.deleted:
            return ErrorCode.NOT_COORDINATOR
        if self._loaded.get(index) != partition.leader_epoch:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        self._group_partition[group_id] = index
        return ErrorCode.NONE

    # -- the background task --------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                await self._watch_leadership()
                self.core.tick(self.now_ms())
                self._expire_offsets()
                self._flush_effects()
                await trio.sleep(WATCH_INTERVAL_S)

    def _expire_offsets(self) -> None:
        """offsets.retention.ms, checked every offsets.retention.check.interval.ms; the
        tombstones go out with the next :meth:`_flush_effects`."""
        now = self.now_ms()
        if now < self._next_expiry_check_ms:
            return
        self._next_expiry_check_ms = now + self.config.offsets_retention_check_interval_ms
        pending = self.txn_offsets.pending.pending_partitions
        expired = self.core.expire_offsets(now, self.config.offsets_retention_ms, pending)
        if expired:
            log.info("expired %d committed offsets (offsets.retention.ms=%d)", expired,
                     self.config.offsets_retention_ms)

    async def _watch_leadership(self) -> None:
        for index in range(self.num_partitions):
            partition = self.manager.get(OFFSETS_TOPIC, index)
            leading = partition is not None and partition.is_leader and not partition.deleted
            if not leading:
                if index in self._loaded:
                    self._unload(index)
                continue
            assert partition is not None
            if self._loaded.get(index) == partition.leader_epoch:
                continue
            self._unload(index)
            epoch = partition.leader_epoch
            try:
                await self._load(index)
            except Exception:
                log.exception("loading %s-%d failed; retrying", OFFSETS_TOPIC, index)
                continue
            if partition.is_leader and partition.leader_epoch == epoch:
                self._loaded[index] = epoch

    def _unload(self, index: int) -> None:
        self._loaded.pop(index, None)
        self.txn_offsets.unload(index)
        gone = [g for g in self.core.groups if self.partition_of(g) == index]
        self.core.unload(gone)
        self._deliver(self.core.outbox)
        self.core.outbox = []

    async def _load(self, index: int) -> None:
        """Rebuild the groups of one offsets partition from its log."""
        partition = self.manager.get(OFFSETS_TOPIC, index)
        assert partition is not None
        now = self.now_ms()
        loaded = 0
        groups: set[str] = set()
        skipped = UndecodableRecords()
        async for header, batch, from_offset in self.offsets_log.batches(partition):
            loaded += self._replay_batch(index, header, batch, from_offset, now, groups,
                                         skipped)
        # Members' sessions start when the load ends (as Kafka schedules their heartbeat
        # expirations then): a load longer than session.timeout.ms must not evict them all.
        self.core.restart_sessions(groups, self.now_ms())
        if skipped.count:
            self.undecodable_records_skipped += skipped.count
            log.warning("%s", skipped.summary(f"{OFFSETS_TOPIC}-{index}"))
        log.info("loaded %d records of %s-%d (leader epoch %d)", loaded, OFFSETS_TOPIC, index,
                 partition.leader_epoch)

    def _replay_batch(self, index: int, header: BatchHeader, batch: bytes, from_offset: int,
                      now_ms: int, groups: set[str], skipped: UndecodableRecords) -> int:
        """Replay one batch of offsets partition ``index``: the number of plain records
        replayed. A batch whose records cannot be read (a compressed batch, a record that
        overruns it) is skipped as one undecodable record; the load goes on."""
        try:
            if self.txn_offsets.replay_batch(index, header, batch, from_offset, skipped):
                return 0  # transactional offsets and markers
            records = decode_records(batch)
        except PartitionLogError as exc:
            skipped.add(header.base_offset, f"unreadable batch: {exc}")
            return 0
        replayed = 0
        for record in records:
            if record.offset >= from_offset:
                self._replay(record, now_ms, groups, skipped)
                replayed += 1
        return replayed

    def _replay(self, record: Record, now_ms: int, groups: set[str],
                skipped: UndecodableRecords) -> None:
        key, value = record.key, record.value
        if key is None:
            return
        try:
            parsed = decode_key(key)
            if isinstance(parsed, OffsetKey):
                self.core.load_offset(parsed.group, (parsed.topic, parsed.partition),
                                      None if value is None else decode_offset_value(value))
            elif isinstance(parsed, GroupKey):
                self.core.load_group(parsed.group,
                                     None if value is None else decode_group_value(value), now_ms)
                groups.add(parsed.group)
        except RecordFormatError as exc:
            skipped.add(record.offset, str(exc))

    # -- effects: persist the core's writes, then answer its waiting requests -----------------

    def _token(self) -> tuple[int, _Waiter]:
        self._next_token += 1
        waiter = self._waiters[self._next_token] = _Waiter()
        return self._next_token, waiter

    def _flush_effects(self) -> None:
        """Append the core's records, then deliver its answers. An answer that depends on a
        group-metadata record (a static member's new id, a SyncGroup's assignment) succeeds
        only if that record is in the log (acks=all) in time; otherwise the core undoes what
        the record stood for and the client gets the mapped error."""
        writes, outbox, persists = self.core.writes, self.core.outbox, self.core.persists
        self.core.writes, self.core.outbox, self.core.persists = [], [], []
        if not writes:
            self._deliver(outbox)
            return
        by_partition: dict[int, list[tuple[bytes, bytes | None]]] = {}
        for group_id, key, value in writes:
            by_partition.setdefault(self.partition_of(group_id), []).append((key, value))
        failed: dict[int, int] = {}
        waits: dict[int, AckWait] = {}
        for index, records in by_partition.items():
            error, wait = self._append(index, records)
            if error:
                log.warning("could not write group metadata to %s-%d: error %d", OFFSETS_TOPIC,
                            index, error)
                failed[index] = commit_write_error(error)
            elif wait is not None:
                waits[index] = wait
        if not waits or self._nursery is None:
            self._settle(outbox, persists, failed)
            return

        async def deliver_when_written() -> None:
            deadline = trio.current_time() + WRITE_TIMEOUT_S
            for index, wait in waits.items():
                await wait.partition.wait_until(wait.settled, deadline)
                code = wait.error_code() if wait.settled() else ErrorCode.REQUEST_TIMED_OUT
                if code:
                    log.warning("group metadata write to %s-%d failed: error %d",
                                OFFSETS_TOPIC, index, code)
                    failed[index] = commit_write_error(code)
            self._settle(outbox, persists, failed)

        self._nursery.start_soon(deliver_when_written)

    def _settle(self, outbox: list[tuple[int, Body]], persists: list[PendingPersist],
                failed: dict[int, int]) -> None:
        """Deliver ``outbox``, except the answers vouched for by a record that failed: the
        core turns those into errors (and undoes what they announced)."""
        superseded: set[int] = set()
        now = self.now_ms()
        for persist in persists:
            error = failed.get(self.partition_of(persist.group_id))
            if error is not None:
                superseded.update(persist.tokens)
                self.core.persist_failed(persist, error, now)
        self._deliver([(t, b) for t, b in outbox if t not in superseded])
        if superseded:
            self._flush_effects()  # the core's error answers (no records of their own)

    def _deliver(self, outbox: Iterable[tuple[int, Body]]) -> None:
        for token, body in outbox:
            waiter = self._waiters.pop(token, None)
            if waiter is not None:
                waiter.body = body
                waiter.event.set()

    def _append(self, index: int, records: OffsetRecords) -> tuple[int, AckWait | None]:
        return self.offsets_log.append(index, records)

    async def _await_waiter(self, token: int, waiter: _Waiter, timeout_s: float,
                            fallback: Body) -> Body:
        try:
            with trio.move_on_after(timeout_s):
                await waiter.event.wait()
        finally:
            self._waiters.pop(token, None)
        return waiter.body if waiter.body is not None else fallback

    # -- handlers ---------------------------------------------------------------------------------

    def handlers(self) -> dict[int, Handler]:
        table: dict[int, Callable[[RequestContext], HandlerResult]] = {
            JOIN_GROUP.key: self.join_group,
            SYNC_GROUP.key: self.sync_group,
            HEARTBEAT.key: self.heartbeat,
            LEAVE_GROUP.key: self.leave_group,
            OFFSET_COMMIT.key: self.offset_commit,
            OFFSET_FETCH.key: self.offset_fetch,
            DESCRIBE_GROUPS.key: self.describe_groups,
            LIST_GROUPS.key: self.list_groups,
            DELETE_GROUPS.key: self.delete_groups,
            TXN_OFFSET_COMMIT.key: self.txn_offsets.txn_offset_commit,
        }
        return dict(table)

    def join_group(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        version = ctx.header.api_version
        error = self._coordinator_error(request.group_id)
        if error:
            return _join_response(_join_error_body(error, request.member_id))
        token, waiter = self._token()
        rebalance_ms = request.rebalance_timeout_ms if version >= 1 else -1
        body = self.core.join(
            token, request.group_id, request.member_id,
            instance_id=request.group_instance_id if version >= 5 else None,
            protocol_type=request.protocol_type,
            protocols=[(p.name, bytes(p.metadata)) for p in request.protocols],
            session_timeout_ms=request.session_timeout_ms,
            rebalance_timeout_ms=rebalance_ms,
            client_id=ctx.header.client_id or "",
            client_host="/" + ctx.peer.rsplit(":", 1)[0],
            require_known_member_id=version >= 4,
            now_ms=self.now_ms(),
        )
        self._flush_effects()
        if body is not None:
            self._waiters.pop(token, None)
            return _join_response(body)
        timeout_s = max(rebalance_ms, request.session_timeout_ms) / 1000 + JOIN_WAIT_MARGIN_S

        async def wait_for_rebalance() -> Body:
            fallback = _join_error_body(ErrorCode.REBALANCE_IN_PROGRESS, request.member_id)
            return _join_response(await self._await_waiter(token, waiter, timeout_s, fallback))

        return wait_for_rebalance

    def sync_group(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        version = ctx.header.api_version
        error = self._coordinator_error(request.group_id)
        if error:
            return {"throttle_time_ms": 0, "error_code": error, "assignment": b""}
        token, waiter = self._token()
        body = self.core.sync(
            token, request.group_id, request.generation_id, request.member_id,
            instance_id=request.group_instance_id if version >= 3 else None,
            assignments={a.member_id: bytes(a.assignment) for a in request.assignments},
            now_ms=self.now_ms(),
        )
        self._flush_effects()
        if body is not None:
            self._waiters.pop(token, None)
            return {"throttle_time_ms": 0, **body}

        async def wait_for_assignment() -> Body:
            fallback = {"error_code": ErrorCode.REBALANCE_IN_PROGRESS, "assignment": b""}
            result = await self._await_waiter(token, waiter, 60.0, fallback)
            return {"throttle_time_ms": 0, **result}

        return wait_for_assignment

    def heartbeat(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        error = self._coordinator_error(request.group_id)
        if not error:
            error = self.core.heartbeat(
                request.group_id, request.generation_id, request.member_id,
                instance_id=request.group_instance_id if ctx.header.api_version >= 3 else None,
                now_ms=self.now_ms())
            self._flush_effects()
        return {"throttle_time_ms": 0, "error_code": error}

    def leave_group(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        version = ctx.header.api_version
        if version >= 3:
            identities = [(m.member_id, m.group_instance_id) for m in request.members]
        else:
            identities = [(request.member_id, None)]
        error = self._coordinator_error(request.group_id)
        if error:
            return {"throttle_time_ms": 0, "error_code": error, "members": []}
        codes = self.core.leave(request.group_id, identities, now_ms=self.now_ms())
        self._flush_effects()
        if version >= 3:
            members = [{"member_id": m, "group_instance_id": i, "error_code": c}
                       for (m, i), c in zip(identities, codes, strict=True)]
            return {"throttle_time_ms": 0, "error_code": 0, "members": members}
        return {"throttle_time_ms": 0, "error_code": codes[0], "members": []}

    def offset_commit(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        version = ctx.header.api_version
        group_id = request.group_id
        generation = request.generation_id_or_member_epoch if version >= 1 else -1
        member_id = request.member_id if version >= 1 else ""
        instance_id = request.group_instance_id if version >= 7 else None
        results: dict[str, list[Body]] = {}

        def reply(tp: tuple[str, int], code: int) -> Body:
            entry = {"partition_index": tp[1], "error_code": code}
            results.setdefault(tp[0], []).append(entry)
            return entry

        error = self._coordinator_error(group_id)
        if not error:
            error = self.core.validate_commit(group_id, generation, member_id, instance_id,
                                              self.now_ms())
        codes, valid = check_offset_entries(
            request.topics, self.quorum.image.topics, error,
            self.config.offset_metadata_max_bytes, version >= 6, self.now_ms())
        entries: list[Body] = []  # the stored ones: they get the write's outcome below
        for tp, code in codes:
            entry = reply(tp, code)
            if not code:
                entries.append(entry)
        body = {"throttle_time_ms": 0, "topics": [
            {"name": name, "partitions": parts} for name, parts in results.items()]}
        if not valid:
            return body
        index = self.partition_of(group_id)
        code, wait = self._append(index, self.core.commit_records(group_id, valid))
        if code:
            for entry in entries:
                entry["error_code"] = commit_write_error(code)
            return body
        epoch = self._loaded.get(index)

        async def wait_until_written() -> Body:
            if wait is not None:
                deadline = trio.current_time() + WRITE_TIMEOUT_S
                await wait.partition.wait_until(wait.settled, deadline)
                code = wait.error_code()
            else:
                code = ErrorCode.NONE
            if code == ErrorCode.NONE and self._loaded.get(index) == epoch:
                self.core.apply_commit(group_id, valid, self.now_ms())
            elif code == ErrorCode.NONE:
                code = ErrorCode.NOT_COORDINATOR
            for entry in entries:
                entry["error_code"] = commit_write_error(code)
            return body

        return wait_until_written

    def offset_fetch(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        version = ctx.header.api_version
        error = self._coordinator_error(request.group_id)
        if error and version >= 2:
            return {"throttle_time_ms": 0, "topics": [], "error_code": error}
        wanted = None if request.topics is None else [
            (t.name, i) for t in request.topics for i in t.partition_indexes]
        committed = {} if error else self.core.committed(request.group_id, wanted)
        stable = version >= 7 and request.require_stable
        if wanted is None:
            wanted = sorted(committed)
            if stable:  # pending transactional offsets are listed too, as unstable
                pending = self.txn_offsets.pending.pending_partitions(request.group_id)
                wanted = sorted(set(wanted) | pending)
        unstable = self.txn_offsets.pending.pending_partitions(request.group_id) \
            if stable and not error else set()
        topics: dict[str, list[Body]] = {}
        for tp in wanted:
            value = committed.get(tp)
            if tp in unstable:
                topics.setdefault(tp[0], []).append({
                    "partition_index": tp[1], "committed_offset": -1,
                    "committed_leader_epoch": -1, "metadata": "",
                    "error_code": ErrorCode.UNSTABLE_OFFSET_COMMIT})
                continue
            topics.setdefault(tp[0], []).append({
                "partition_index": tp[1],
                "committed_offset": -1 if value is None else value.offset,
                "committed_leader_epoch": -1 if value is None else value.leader_epoch,
                "metadata": "" if value is None else value.metadata,
                "error_code": error,
            })
        return {"throttle_time_ms": 0, "error_code": 0, "topics": [
            {"name": name, "partitions": parts} for name, parts in topics.items()]}

    def describe_groups(self, ctx: RequestContext) -> HandlerResult:
        groups = []
        for group_id in ctx.body.groups:
            error = self._coordinator_error(group_id)
            if error:
                groups.append({"error_code": error, "group_id": group_id, "group_state": "",
                               "protocol_type": "", "protocol_data": "", "members": []})
            else:
                groups.append(self.core.describe(group_id))
        return {"throttle_time_ms": 0, "groups": groups}

    def list_groups(self, ctx: RequestContext) -> HandlerResult:
        listed = [{"group_id": g, "protocol_type": t} for g, t, _ in self.core.listed()]
        return {"throttle_time_ms": 0, "error_code": 0, "groups": listed}

    def delete_groups(self, ctx: RequestContext) -> HandlerResult:
        results: list[Body] = []
        waits = []
        for group_id in ctx.body.groups_names:
            entry: Body = {"group_id": group_id, "error_code": 0}
            results.append(entry)
            error = self._coordinator_error(group_id)
            tombstones: list[tuple[bytes, bytes | None]] = []
            if not error:
                error, tombstones = self.core.delete(group_id)
            if not error:
                error, wait = self._append(self.partition_of(group_id), tombstones)
                error = commit_write_error(error) if error else 0
                if not error:
                    self.core.drop(group_id)
                    if wait is not None:
                        waits.append((entry, wait))
            entry["error_code"] = error
        body = {"throttle_time_ms": 0, "results": results}
        if not waits:
            return body

        async def wait_until_written() -> Body:
            deadline = trio.current_time() + WRITE_TIMEOUT_S
            for entry, wait in waits:
                await wait.partition.wait_until(wait.settled, deadline)
                entry["error_code"] = commit_write_error(wait.error_code())
            return body

        return wait_until_written


def _join_error_body(code: int, member_id: str) -> Body:
    return {"error_code": code, "generation_id": -1, "protocol_name": "", "leader": "",
            "member_id": member_id, "members": []}


def _join_response(body: Body) -> Body:
    return {"throttle_time_ms": 0, **body}
