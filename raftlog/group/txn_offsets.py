"""Offsets in transactions (KIP-98, KIP-447): the group coordinator's half.

* **TxnOffsetCommit (28, v0-3).** The offsets are written to the group's ``__consumer_offsets``
  partition as a *transactional* batch of the producer (its id and epoch, baseSequence -1,
  the transactional attribute; the same OffsetCommitKey/Value records as a plain commit), the
  way Kafka's group coordinator writes them, and staged as *pending*: OffsetFetch does not
  see them. v3 checks the generation, member id and group instance id as Kafka's
  ``validateOffsetCommit(isTransactional = true)`` does (no check when all three are unset).
* **Verification (KIP-890 part 1).** Before writing, the group's offsets partition must be in
  the producer's ongoing transaction (AddOffsetsToTxn added it). The transaction coordinator
  is asked wherever it is, through the produce path's verifier (``TxnWriteVerifier``, given
  by the node: local state, or AddPartitionsToTxn v4 ``verify_only`` to the coordinator's
  node); the append runs synchronously with a positive answer. Refusals:
  INVALID_TXN_STATE (not in the transaction), INVALID_PRODUCER_EPOCH (fenced),
  COORDINATOR_NOT_AVAILABLE (the coordinator could not be asked: retriable).
* **Commit/abort.** The transaction coordinator writes a COMMIT or ABORT marker to that
  partition (AddOffsetsToTxn added it to the transaction); the partition leader — this node,
  as group coordinator — calls :meth:`TxnOffsets.complete` once the marker is replicated
  (``raftlog.txn.markers.TxnCompletion.append_marker``): COMMIT applies
  the staged offsets, ABORT drops them.
* **Replay.** Loading an offsets partition stages the transactional records and resolves them
  at the markers that follow them in the log, so a new coordinator ends up in the same state.
* **OffsetFetch require_stable (v7).** A partition with pending transactional offsets is
  answered with UNSTABLE_OFFSET_COMMIT (88); the consumer retries.

This object implements ``raftlog.txn.markers.PendingOffsets``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import trio

from raftlog.clock import SteadyWallClock
from raftlog.config import ServerConfig
from raftlog.group.coordinator import DEAD, Group, GroupCoordinator, check_offset_entries
from raftlog.group.offsets_log import WRITE_TIMEOUT_S, OffsetsLog, commit_write_error
from raftlog.group.records import (
    OffsetKey,
    OffsetValue,
    RecordFormatError,
    decode_key,
    decode_offset_value,
)
from raftlog.partition.append import AppendOrigin
from raftlog.partition.batch import TRANSACTIONAL_BIT, BatchHeader, build_batch, decode_records
from raftlog.partition.errors import PartitionLogError
from raftlog.partition.partition import Partition, Replicated
from raftlog.partition.txn_index import ABORT, COMMIT
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.internal_topics import OFFSETS_TOPIC, UndecodableRecords
from raftlog.quorum.interface import Quorum
from raftlog.server.listener import Body, HandlerResult, RequestContext
from raftlog.txn.verification import VERIFY_TIMEOUT_S, PendingVerification, Verdict

__all__ = ["PendingTxnOffsets", "TxnOffsets", "TxnWriteVerifier"]

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
# (topic, partition, transactional id, producer id, epoch) -> None when the transactional
# write may go in, else (error code, message), or a verify_only question in flight.
TxnWriteVerifier = Callable[[str, int, "str | None", int, int],
                            "Verdict | PendingVerification"]
# The verification task answers within VERIFY_TIMEOUT_S; past this margin the commit gives up
# with a retriable error (and a late answer writes nothing).
VERIFY_WAIT_S = VERIFY_TIMEOUT_S + 5.0


@dataclass
class PendingTxnOffsets:
    """Pure bookkeeping: producer id → offsets partition → group → staged offsets."""

    staged: dict[int, dict[int, dict[str, dict[TopicPartition, OffsetValue]]]] = \
        field(default_factory=dict)

    def stage(self, producer_id: int, index: int, group: str,
              offsets: Mapping[TopicPartition, OffsetValue]) -> None:
        by_group = self.staged.setdefault(producer_id, {}).setdefault(index, {})
        by_group.setdefault(group, {}).update(offsets)

    def resolve(self, producer_id: int, index: int
                ) -> dict[str, dict[TopicPartition, OffsetValue]]:
        """The offsets the producer staged on that partition, now no longer pending."""
        partitions = self.staged.get(producer_id)
        if partitions is None:
            return {}
        resolved = partitions.pop(index, {})
        if not partitions:
            del self.staged[producer_id]
        return resolved

    def drop_partition(self, index: int) -> None:
        for producer_id in list(self.staged):
            self.staged[producer_id].pop(index, None)
            if not self.staged[producer_id]:
                del self.staged[producer_id]

    def has_pending(self, group: str, tp: TopicPartition | None = None) -> bool:
        for partitions in self.staged.values():
            for by_group in partitions.values():
                offsets = by_group.get(group)
                if offsets and (tp is None or tp in offsets):
                    return True
        return False

    def pending_partitions(self, group: str) -> set[TopicPartition]:
        out: set[TopicPartition] = set()
        for partitions in self.staged.values():
            for by_group in partitions.values():
                out.update(by_group.get(group, {}))
        return out


def validate_txn_commit(group: Group | None, generation: int, member_id: str,
                        instance_id: str | None,
                        fenced: Callable[[Group, str, str | None], bool]) -> int:
    """Kafka's ``validateOffsetCommit(..., isTransactional = true)`` (KIP-447)."""
    if group is None:
        return ErrorCode.NONE if generation < 0 and not member_id and instance_id is None \
            else ErrorCode.ILLEGAL_GENERATION
    if group.state == DEAD:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if generation >= 0 or member_id or instance_id is not None:
        if fenced(group, member_id, instance_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if member_id and member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
    return ErrorCode.NONE


class TxnOffsets:
    """TxnOffsetCommit, the pending offsets and their completion, for one group service:
    its core, its offsets log and its check that this node coordinates a group
    (``coordinator_error``)."""

    def __init__(self, config: ServerConfig, quorum: Quorum, core: GroupCoordinator,
                 offsets_log: OffsetsLog, coordinator_error: Callable[[str], int],
                 verify: TxnWriteVerifier | None = None) -> None:
        self.config = config
        self.quorum = quorum
        self.core = core
        self.offsets_log = offsets_log
        self.clock: SteadyWallClock = offsets_log.clock
        self.coordinator_error = coordinator_error
        self.verify = verify
        self.pending = PendingTxnOffsets()

    # -- the PendingOffsets seam (called by the transaction side) ---------------------------

    def complete(self, producer_id: int, index: int, commit: bool) -> None:
        """A COMMIT/ABORT marker of ``producer_id`` is replicated on offsets partition
        ``index``: apply or drop what the producer staged there."""
        resolved = self.pending.resolve(producer_id, index)
        if commit:
            now = self.clock.now_ms()
            for group, offsets in resolved.items():
                self.core.apply_commit(group, offsets, now)
        if resolved:
            log.debug("transactional offsets of producer %d on partition %d %s: %s",
                      producer_id, index, "committed" if commit else "aborted",
                      sorted(resolved))

    def has_pending(self, group: str, tp: TopicPartition | None = None) -> bool:
        return self.pending.has_pending(group, tp)

    # -- replay (GroupService._load) -----------------------------------------------------------

    def replay_batch(self, index: int, header: BatchHeader, batch: bytes | memoryview,
                     from_offset: int, skipped: UndecodableRecords) -> bool:
        """Handle one transactional or control batch of the offsets log; False if it is a
        plain batch the caller replays itself. A record it cannot decode is counted in
        ``skipped``; an unreadable batch raises PartitionLogError (the caller skips it)."""
        if header.is_control:
            for record in decode_records(bytes(batch), include_control=True):
                if record.key is not None and len(record.key) >= 4:
                    kind = int.from_bytes(record.key[2:4], "big", signed=True)
                    if kind in (ABORT, COMMIT):
                        self.complete(header.producer_id, index, kind == COMMIT)
            return True
        if not header.is_transactional:
            return False
        for record in decode_records(bytes(batch)):
            if record.offset < from_offset or record.key is None or record.value is None:
                continue
            try:
                key = decode_key(record.key)
                if isinstance(key, OffsetKey):
                    self.pending.stage(header.producer_id, index, key.group,
                                       {(key.topic, key.partition):
                                        decode_offset_value(record.value)})
            except RecordFormatError as exc:
                skipped.add(record.offset, f"transactional offsets record: {exc}")
        return True

    def unload(self, index: int) -> None:
        self.pending.drop_partition(index)

    # -- TxnOffsetCommit ---------------------------------------------------------------------

    def txn_offset_commit(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        version = ctx.header.api_version
        group_id = request.group_id
        producer_id, epoch = request.producer_id, request.producer_epoch
        results: dict[str, list[Body]] = {}
        entries: list[Body] = []

        def reply(tp: TopicPartition, code: int) -> Body:
            entry = {"partition_index": tp[1], "error_code": int(code)}
            results.setdefault(tp[0], []).append(entry)
            return entry

        def body() -> Body:
            return {"throttle_time_ms": 0, "topics": [
                {"name": name, "partitions": parts} for name, parts in results.items()]}

        error = self.coordinator_error(group_id)
        if not error and version >= 3:
            error = validate_txn_commit(
                self.core.groups.get(group_id), request.generation_id, request.member_id,
                request.group_instance_id, self.core._fenced)
        index = self.offsets_log.partition_of(group_id)
        partition = self.offsets_log.partition(index)
        if not error and partition is not None:
            error = self._check_producer(partition, producer_id, epoch)
        codes, valid = check_offset_entries(
            request.topics, self.quorum.image.topics, error,
            self.config.offset_metadata_max_bytes, version >= 2, self.clock.now_ms())
        for tp, code in codes:
            entry = reply(tp, code)
            if not code:
                entries.append(entry)
        if not valid or partition is None:
            return body()

        def fail(code: int) -> Body:
            for entry in entries:
                entry["error_code"] = int(code)
            return body()

        verdict = self._verify(index, request.transactional_id, producer_id, epoch)
        if not isinstance(verdict, PendingVerification):
            if verdict is not None:
                return fail(_verify_error(verdict[0]))
            written = self._append_offsets(partition, index, group_id, valid, producer_id,
                                           epoch)
            return fail(written) if isinstance(written, int) else \
                self._wait_until_written(partition, written, fail, body)
        # KIP-890 part 1: the transaction coordinator is another node; the append happens in
        # the continuation, synchronously with its answer, so no COMMIT/ABORT marker can land
        # between a positive answer and the records it vouched for.
        pending = verdict
        outcome: dict[str, int | tuple[int, int]] = {}
        abandoned = False

        def resume(answer: Verdict) -> None:
            if abandoned:
                return
            if answer is not None:
                outcome["result"] = _verify_error(answer[0])
                return
            current = self.offsets_log.partition(index)
            if current is not partition or not partition.is_leader:
                outcome["result"] = ErrorCode.NOT_COORDINATOR
                return
            outcome["result"] = self._append_offsets(partition, index, group_id, valid,
                                                     producer_id, epoch)

        pending.continuations.append(resume)

        async def wait_for_verification() -> Body:
            nonlocal abandoned
            with trio.move_on_after(VERIFY_WAIT_S):
                await pending.done.wait()
            result = outcome.get("result")
            if result is None:
                abandoned = True  # a late answer must not write anything
                return fail(ErrorCode.COORDINATOR_NOT_AVAILABLE)
            if isinstance(result, int):
                return fail(result)
            return await self._wait_until_written(partition, result, fail, body)()

        return wait_for_verification

    def _verify(self, index: int, transactional_id: str | None, producer_id: int,
                epoch: int) -> Verdict | PendingVerification:
        """Whether the group's offsets partition is in the producer's ongoing transaction
        (AddOffsetsToTxn added it), asked of the transaction coordinator wherever it is —
        Kafka's AddPartitionsToTxn v4 verify_only, as on the produce path."""
        if self.verify is None:
            return None
        return self.verify(OFFSETS_TOPIC, index, transactional_id or None, producer_id, epoch)

    def _append_offsets(self, partition: Partition, index: int, group_id: str,
                        valid: Mapping[TopicPartition, OffsetValue], producer_id: int,
                        epoch: int) -> int | tuple[int, int]:
        """Append the offsets as a transactional batch of the producer and stage them: an
        error code, or (leadership generation, offset the high watermark must pass)."""
        now = self.clock.now_ms()
        records = self.core.commit_records(group_id, valid)
        batch = build_batch([(k, v, ()) for k, v in records], timestamp_ms=now,
                            producer_id=producer_id, producer_epoch=epoch, base_sequence=-1,
                            attributes=TRANSACTIONAL_BIT)
        try:
            appended = partition.append(batch, AppendOrigin.COORDINATOR, now=now)
        except PartitionLogError as exc:
            log.info("TxnOffsetCommit for %r: %s", group_id, exc)
            return commit_write_error(exc.error_code)
        except OSError as exc:
            log.warning("TxnOffsetCommit for %r: %s", group_id, exc)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if appended.error:  # the ISR is below min.insync.replicas: nothing was written
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        # Staged at once: the record is in the log, and its marker decides its fate.
        self.pending.stage(producer_id, index, group_id, valid)
        return appended.leadership_generation, appended.end_offset

    @staticmethod
    def _wait_until_written(partition: Partition, written: tuple[int, int],
                            fail: Callable[[int], Body], body: Callable[[], Body]
                            ) -> Callable[[], Awaitable[Body]]:
        generation, target = written

        async def wait_until_written() -> Body:
            replicated = await partition.wait_replicated(
                target, generation, trio.current_time() + WRITE_TIMEOUT_S)
            if replicated is Replicated.MOVED:
                return fail(ErrorCode.NOT_COORDINATOR)
            if replicated is Replicated.TIMED_OUT:
                return fail(ErrorCode.COORDINATOR_NOT_AVAILABLE)
            return body()

        return wait_until_written

    @staticmethod
    def _check_producer(partition: Partition, producer_id: int, epoch: int) -> int:
        """The partition's own producer state; the transaction itself is verified later
        (:meth:`_verify`)."""
        if producer_id < 0 or epoch < 0:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        entry = partition.producers.get(producer_id)
        if entry is not None and entry.epoch > epoch:
            # Kafka's log append answers a stale epoch with INVALID_PRODUCER_EPOCH; clients
            # treat it as fenced (the Java producer maps it to PRODUCER_FENCED itself).
            return ErrorCode.INVALID_PRODUCER_EPOCH
        return ErrorCode.NONE


def _verify_error(code: int) -> int:
    """A verification verdict (produce-path codes) as TxnOffsetCommit's error, as Kafka's
    group coordinator converts append errors: retriable trouble reaching the transaction
    coordinator → COORDINATOR_NOT_AVAILABLE (the client finds the coordinator and retries),
    a partition no longer led here → NOT_COORDINATOR, and INVALID_TXN_STATE (the offsets
    partition is not in the transaction) or INVALID_PRODUCER_EPOCH (fenced) as they are."""
    if code in (ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                ErrorCode.REQUEST_TIMED_OUT, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                ErrorCode.CONCURRENT_TRANSACTIONS):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if code == ErrorCode.NOT_LEADER_OR_FOLLOWER:
        return ErrorCode.NOT_COORDINATOR
    if code == ErrorCode.PRODUCER_FENCED:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return int(code)
