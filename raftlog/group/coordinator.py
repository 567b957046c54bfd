"""The classic consumer-group protocol as a pure, synchronous state machine (sans-I/O).

Nothing here waits, sleeps or reads a clock: every call takes ``now_ms``, and the shell
(:mod:`raftlog.group.service`) calls :meth:`GroupCoordinator.tick` at
:meth:`GroupCoordinator.next_deadline`. Requests that Kafka answers later (a JoinGroup waiting
for the rebalance, a SyncGroup waiting for the leader's assignment) carry a ``token``; their
answers appear in :attr:`GroupCoordinator.outbox` as ``(token, body)``. Records to persist in
``__consumer_offsets`` appear in :attr:`GroupCoordinator.writes` as ``(group, key, value)``;
the shell appends them before it delivers the outbox entries produced by the same call, so a
SyncGroup is answered only once its group metadata is in the log, as in Kafka.

States follow Kafka's ``GroupMetadata``: Empty → PreparingRebalance → CompletingRebalance →
Stable, and back to PreparingRebalance when members join, leave or time out. A rebalance
completes when every known member has rejoined (and no MEMBER_ID_REQUIRED member is still
pending) or when the longest rebalance timeout passes; members that did not rejoin are
removed. The broker never looks inside subscription or assignment bytes.

This module is the membership and rebalance state machine; the data it works on (and a group's
record conversions) are in :mod:`raftlog.group.model`, the offset-commit rules in
:mod:`raftlog.group.offsets`, which its offset methods apply to the same groups.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

import raftlog.group.offsets as group_offsets
from raftlog.group.model import (
    COMPLETING_REBALANCE,
    DEAD,
    EMPTY,
    PREPARING_REBALANCE,
    STABLE,
    Body,
    Group,
    Member,
    PendingPersist,
    TopicPartition,
    describe_group,
    group_value,
    is_fenced,
    random_member_id,
    restore_group,
    select_protocol,
)
from raftlog.group.offsets import check_offset_entries, offset_entry_error
from raftlog.group.records import (
    GroupKey,
    GroupValue,
    OffsetKey,
    OffsetValue,
    encode_group_value,
    encode_key,
)
from raftlog.metrics.recorders import Counter
from raftlog.protocol.errors import ErrorCode

# The group core's interface: the coordinator and the model and offset checks its users need.
__all__ = [
    "COMPLETING_REBALANCE",
    "DEAD",
    "EMPTY",
    "GROUP_MAX_SESSION_TIMEOUT_MS",
    "GROUP_MIN_SESSION_TIMEOUT_MS",
    "PREPARING_REBALANCE",
    "STABLE",
    "Group",
    "GroupCoordinator",
    "Member",
    "PendingPersist",
    "check_offset_entries",
    "offset_entry_error",
]

GROUP_MIN_SESSION_TIMEOUT_MS = 6_000  # Kafka's group.min.session.timeout.ms default
GROUP_MAX_SESSION_TIMEOUT_MS = 1_800_000  # group.max.session.timeout.ms

log = logging.getLogger(__name__)


class GroupCoordinator:
    """Every group this node coordinates. See the module docstring."""

    def __init__(
        self,
        *,
        min_session_timeout_ms: int = GROUP_MIN_SESSION_TIMEOUT_MS,
        max_session_timeout_ms: int = GROUP_MAX_SESSION_TIMEOUT_MS,
        new_member_id: Callable[[str], str] | None = None,
        initial_rebalance_delay_ms: int = 0,
    ) -> None:
        self.groups: dict[str, Group] = {}
        self.outbox: list[tuple[int, Body]] = []
        self.writes: list[tuple[str, bytes, bytes | None]] = []
        # One entry per group-metadata record (not tombstone) in ``writes``.
        self.persists: list[PendingPersist] = []
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self._new_member_id = new_member_id or random_member_id
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.rebalances = Counter()  # generations started (raftlog_group_rebalances)

    # -- JoinGroup ---------------------------------------------------------------------------

    def join(
        self,
        token: int,
        group_id: str,
        member_id: str,
        *,
        instance_id: str | None,
        protocol_type: str,
        protocols: Iterable[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        client_id: str,
        client_host: str,
        require_known_member_id: bool,
        now_ms: int,
    ) -> Body | None:
        """A JoinGroup: its answer now, or None (the answer comes through the outbox)."""
        protocols = tuple(protocols)
        if not group_id:
            return _join_error(ErrorCode.INVALID_GROUP_ID, member_id)
        if not self.min_session_timeout_ms <= session_timeout_ms <= self.max_session_timeout_ms:
            return _join_error(ErrorCode.INVALID_SESSION_TIMEOUT, member_id)
        if rebalance_timeout_ms < 0:
            rebalance_timeout_ms = session_timeout_ms  # JoinGroup v0 has none
        group = self.groups.get(group_id)
        if group is None:
            if member_id:
                return _join_error(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
            group = self.groups[group_id] = Group(group_id, state_timestamp_ms=now_ms)
        if not protocols or not protocol_type or (
            group.members and (group.protocol_type != protocol_type
                               or not self._supports(group, protocols))):
            return _join_error(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)

        def new_member(new_id: str) -> Member:
            return Member(new_id, instance_id, client_id, client_host, session_timeout_ms,
                          rebalance_timeout_ms, protocols, now_ms + session_timeout_ms)

        if not member_id:
            if instance_id is not None and instance_id in group.static:
                # A static member restarted: its new id replaces (fences) the old one.
                return self._replace_static(group, instance_id, new_member, token, now_ms)
            new_id = self._new_member_id(client_id or "member")
            if require_known_member_id and instance_id is None:
                # KIP-394: the client must come back with this id before it counts.
                group.pending[new_id] = now_ms + session_timeout_ms
                return _join_error(ErrorCode.MEMBER_ID_REQUIRED, new_id)
            return self._add_member(group, new_member(new_id), protocol_type, token, now_ms)
        if member_id in group.pending:
            del group.pending[member_id]
            return self._add_member(group, new_member(member_id), protocol_type, token, now_ms)
        if self._fenced(group, member_id, instance_id):
            return _join_error(ErrorCode.FENCED_INSTANCE_ID, member_id)
        known = group.members.get(member_id)
        if known is None:
            return _join_error(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
        member = known
        changed = member.protocols != protocols
        member.protocols = protocols
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.client_id, member.client_host = client_id, client_host
        return self._rejoin(group, member, token, now_ms, changed=changed)

    def _replace_static(self, group: Group, instance_id: str,
                        new_member: Callable[[str], Member], token: int, now_ms: int
                        ) -> Body | None:
        """A static member restarted (no member id, a known group.instance.id): its new id
        replaces (fences) the old one. In a Stable group whose protocol choice stays the same
        this is not a rebalance: the member gets the current generation and its old assignment
        (Kafka's KIP-345), once the group metadata with the new id is in the log."""
        old_id = group.static[instance_id]
        old = group.members[old_id]
        self._answer_pending(old, ErrorCode.FENCED_INSTANCE_ID)
        member = new_member(self._new_member_id(old.client_id or instance_id))
        member.assignment = old.assignment
        # Same place in the member order (the order decides the fallback leader).
        group.members = {(member.member_id if k == old_id else k): (member if k == old_id else m)
                         for k, m in group.members.items()}
        group.static[instance_id] = member.member_id
        if group.leader == old_id:
            group.leader = member.member_id
        if group.state == STABLE and select_protocol(group.members.values()) == group.protocol:
            # The new id goes to the client only once the group metadata naming it is in the
            # log: a coordinator that reloads the group must know it, or it would fence the
            # member (FENCED_INSTANCE_ID) after a restart or failover.
            self._persist_group(group, (token,), replaced=old, replacement=member)
            # The leader gets the members as in every JoinGroup answer (Kafka before
            # JoinGroup v9's skipAssignment); a Stable group's SyncGroup then hands back the
            # current assignments whatever the leader computes.
            self.outbox.append((token, self._join_body(
                group, member, leader_view=member.member_id == group.leader)))
            return None
        return self._rejoin(group, member, token, now_ms, changed=True)

    def _rejoin(self, group: Group, member: Member, token: int, now_ms: int, *,
                changed: bool) -> Body | None:
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        if member.join_token is not None and member.join_token != token:
            self.outbox.append((member.join_token, _join_error(ErrorCode.REBALANCE_IN_PROGRESS,
                                                               member.member_id)))
        if group.state in (STABLE, COMPLETING_REBALANCE) and not changed \
                and group.leader != member.member_id:
            # Nothing to rebalance: the member gets the current generation again.
            return self._join_body(group, member, leader_view=False)
        member.join_token = token
        if group.state != PREPARING_REBALANCE:
            reason = "metadata changed" if changed else "the leader rejoined"
            self._prepare_rebalance(group, now_ms, f"member {member.member_id}: {reason}")
        self._maybe_complete_join(group, now_ms)
        return None

    def _add_member(self, group: Group, member: Member, protocol_type: str, token: int,
                    now_ms: int) -> Body | None:
        if not group.members:
            group.protocol_type = protocol_type
        group.members[member.member_id] = member
        if member.instance_id is not None:
            group.static[member.instance_id] = member.member_id
        if group.leader is None:
            group.leader = member.member_id
        member.join_token = token
        if group.state == EMPTY and self.initial_rebalance_delay_ms > 0:
            group.initial_delay_until_ms = now_ms + self.initial_rebalance_delay_ms
            # Kafka: the delay, then extensions until the rebalance timeout, whichever is later.
            group.initial_delay_limit_ms = now_ms + max(self.initial_rebalance_delay_ms,
                                                        member.rebalance_timeout_ms)
        elif group.initial_delay_until_ms is not None:
            group.initial_delay_until_ms = min(now_ms + self.initial_rebalance_delay_ms,
                                               group.initial_delay_limit_ms)
        if group.state != PREPARING_REBALANCE:
            self._prepare_rebalance(group, now_ms, f"member {member.member_id} joined")
        self._maybe_complete_join(group, now_ms)
        return None

    def _supports(self, group: Group, protocols: tuple[tuple[str, bytes], ...]) -> bool:
        names = {name for name, _ in protocols}
        common = set.intersection(*({n for n, _ in m.protocols} for m in group.members.values()))
        return bool(names & common)

    def _prepare_rebalance(self, group: Group, now_ms: int, reason: str) -> None:
        # Kafka logs every transition at INFO: operators read rebalances off these lines.
        log.info("preparing to rebalance group %s in state %s with old generation %d "
                 "(reason: %s)", group.group_id, group.state, group.generation, reason)
        if group.state == COMPLETING_REBALANCE:
            for member in group.members.values():
                member.assignment = b""
                if member.sync_token is not None:
                    self.outbox.append((member.sync_token,
                                        _sync_body(ErrorCode.REBALANCE_IN_PROGRESS)))
                    member.sync_token = None
        group.state = PREPARING_REBALANCE
        group.state_timestamp_ms = now_ms
        timeout = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
        group.rebalance_deadline_ms = now_ms + timeout

    def _maybe_complete_join(self, group: Group, now_ms: int) -> None:
        if group.state != PREPARING_REBALANCE or group.pending:
            return
        if group.initial_delay_until_ms is not None and now_ms < group.initial_delay_until_ms:
            return
        if all(m.join_token is not None for m in group.members.values()):
            self._complete_join(group, now_ms)

    def _complete_join(self, group: Group, now_ms: int) -> None:
        for member in [m for m in group.members.values() if m.join_token is None]:
            log.info("member %s of group %s did not rejoin within the rebalance timeout: "
                     "removed", member.member_id, group.group_id)
            self._remove(group, member)
        group.pending.clear()
        group.generation += 1
        self.rebalances.inc()
        group.rebalance_deadline_ms = None
        group.initial_delay_until_ms = None
        group.state_timestamp_ms = now_ms
        if not group.members:
            group.state, group.protocol, group.leader = EMPTY, None, None
            log.info("group %s is empty at generation %d", group.group_id, group.generation)
            self._persist_group(group)
            return
        first = next(iter(group.members.values()))
        group.protocol = select_protocol(group.members.values())
        if group.leader not in group.members:
            group.leader = first.member_id
        group.state = COMPLETING_REBALANCE
        log.info("stabilized group %s generation %d (protocol %s, %d members, leader %s)",
                 group.group_id, group.generation, group.protocol, len(group.members),
                 group.leader)
        for member in group.members.values():
            token = member.join_token
            member.join_token = None
            member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
            assert token is not None
            self.outbox.append((token, self._join_body(
                group, member, leader_view=member.member_id == group.leader)))

    def _join_body(self, group: Group, member: Member, *, leader_view: bool) -> Body:
        members = [
            {"member_id": m.member_id, "group_instance_id": m.instance_id,
             "metadata": m.metadata_for(group.protocol)}
            for m in group.members.values()
        ] if leader_view else []
        return {"error_code": ErrorCode.NONE, "generation_id": group.generation,
                "protocol_name": group.protocol or "", "leader": group.leader or "",
                "member_id": member.member_id, "members": members}

    # -- SyncGroup, Heartbeat, LeaveGroup -------------------------------------------------------

    def sync(self, token: int, group_id: str, generation: int, member_id: str, *,
             instance_id: str | None, assignments: Mapping[str, bytes], now_ms: int,
             ) -> Body | None:
        group = self.groups.get(group_id)
        if group is not None and self._fenced(group, member_id, instance_id):
            return _sync_body(ErrorCode.FENCED_INSTANCE_ID)
        if group is None or member_id not in group.members:
            return _sync_body(ErrorCode.UNKNOWN_MEMBER_ID)
        if generation != group.generation:
            return _sync_body(ErrorCode.ILLEGAL_GENERATION)
        member = group.members[member_id]
        if group.state == PREPARING_REBALANCE:
            return _sync_body(ErrorCode.REBALANCE_IN_PROGRESS)
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        if group.state == STABLE:
            return _sync_body(ErrorCode.NONE, member.assignment)
        # CompletingRebalance: wait for the leader's assignment.
        member.sync_token = token
        if member_id == group.leader:
            for m in group.members.values():
                m.assignment = bytes(assignments.get(m.member_id, b""))
            log.info("assignment received from leader %s of group %s for generation %d",
                     member_id, group.group_id, group.generation)
            group.state = STABLE
            group.state_timestamp_ms = now_ms
            self._persist_group(group, tuple(m.sync_token for m in group.members.values()
                                             if m.sync_token is not None))
            for m in group.members.values():
                if m.sync_token is not None:
                    self.outbox.append((m.sync_token, _sync_body(ErrorCode.NONE, m.assignment)))
                    m.sync_token = None
        return None

    def heartbeat(self, group_id: str, generation: int, member_id: str, *,
                  instance_id: str | None, now_ms: int) -> int:
        group = self.groups.get(group_id)
        if group is not None and self._fenced(group, member_id, instance_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if group is None or member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        member = group.members[member_id]
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms
        if group.state == PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(self, group_id: str, members: Iterable[tuple[str, str | None]], *,
              now_ms: int) -> list[int]:
        """Per (member id, instance id): its error code."""
        group = self.groups.get(group_id)
        codes: list[int] = []
        for member_id, instance_id in members:
            if group is None:
                codes.append(ErrorCode.UNKNOWN_MEMBER_ID)
                continue
            if instance_id is not None:
                mapped = group.static.get(instance_id)
                if mapped is None:
                    codes.append(ErrorCode.UNKNOWN_MEMBER_ID)
                    continue
                if member_id and mapped != member_id:
                    codes.append(ErrorCode.FENCED_INSTANCE_ID)
                    continue
                member_id = mapped
            if member_id in group.pending:
                del group.pending[member_id]
            elif member_id in group.members:
                self._remove(group, group.members[member_id])
            else:
                codes.append(ErrorCode.UNKNOWN_MEMBER_ID)
                continue
            codes.append(ErrorCode.NONE)
            self._after_removal(group, now_ms, f"member {member_id} left the group")
        return codes

    def _remove(self, group: Group, member: Member) -> None:
        del group.members[member.member_id]
        if member.instance_id is not None and group.static.get(member.instance_id) == \
                member.member_id:
            del group.static[member.instance_id]
        self._answer_pending(member, ErrorCode.UNKNOWN_MEMBER_ID)
        if group.leader == member.member_id:
            group.leader = next(iter(group.members), None)

    def _answer_pending(self, member: Member, error: int) -> None:
        if member.join_token is not None:
            self.outbox.append((member.join_token, _join_error(error, member.member_id)))
            member.join_token = None
        if member.sync_token is not None:
            self.outbox.append((member.sync_token, _sync_body(error)))
            member.sync_token = None

    def _after_removal(self, group: Group, now_ms: int, reason: str) -> None:
        if group.state in (STABLE, COMPLETING_REBALANCE):
            self._prepare_rebalance(group, now_ms, reason)
        self._maybe_complete_join(group, now_ms)

    def _fenced(self, group: Group, member_id: str, instance_id: str | None) -> bool:
        return is_fenced(group, member_id, instance_id)

    # -- time ---------------------------------------------------------------------------------

    def tick(self, now_ms: int) -> None:
        """Session expiry, pending-member expiry and rebalance timeouts due by ``now_ms``."""
        for group in list(self.groups.values()):
            for pending_id, deadline in list(group.pending.items()):
                if deadline <= now_ms:
                    del group.pending[pending_id]
                    self._maybe_complete_join(group, now_ms)
            if group.initial_delay_until_ms is not None and group.initial_delay_until_ms <= now_ms:
                group.initial_delay_until_ms = None
                self._maybe_complete_join(group, now_ms)
            expired = [m for m in group.members.values()
                       if m.join_token is None and m.heartbeat_deadline_ms <= now_ms]
            for member in expired:
                if member.member_id in group.members:
                    self._remove(group, member)
                    self._after_removal(group, now_ms, f"member {member.member_id} failed: "
                                        f"no heartbeat within {member.session_timeout_ms} ms")
            if group.state == PREPARING_REBALANCE and group.rebalance_deadline_ms is not None \
                    and group.rebalance_deadline_ms <= now_ms \
                    and group.initial_delay_until_ms is None:
                self._complete_join(group, now_ms)

    def next_deadline(self) -> int | None:
        deadlines: list[int] = []
        for group in self.groups.values():
            deadlines.extend(group.pending.values())
            deadlines.extend(m.heartbeat_deadline_ms for m in group.members.values()
                             if m.join_token is None)
            if group.rebalance_deadline_ms is not None:
                deadlines.append(group.rebalance_deadline_ms)
            if group.initial_delay_until_ms is not None:
                deadlines.append(group.initial_delay_until_ms)
        return min(deadlines, default=None)

    # -- offsets (the rules are in :mod:`raftlog.group.offsets`) ---------------------------

    def validate_commit(self, group_id: str, generation: int, member_id: str,
                        instance_id: str | None, now_ms: int | None = None) -> int:
        """Kafka's checks before an OffsetCommit writes anything (classic protocol, < v9);
        a valid commit from a member counts as its heartbeat (given ``now_ms``)."""
        return group_offsets.validate_commit(self.groups, group_id, generation, member_id,
                                       instance_id, now_ms)

    def commit_records(self, group_id: str, offsets: Mapping[TopicPartition, OffsetValue]
                       ) -> list[tuple[bytes, bytes | None]]:
        """The records that store ``offsets`` (written by the shell, then :meth:`apply_commit`)."""
        return group_offsets.commit_records(group_id, offsets)

    def apply_commit(self, group_id: str, offsets: Mapping[TopicPartition, OffsetValue],
                     now_ms: int) -> None:
        group_offsets.apply_commit(self.groups, group_id, offsets, now_ms)

    def committed(self, group_id: str, partitions: Iterable[TopicPartition] | None
                  ) -> dict[TopicPartition, OffsetValue | None]:
        return group_offsets.committed(self.groups, group_id, partitions)

    def expire_offsets(self, now_ms: int, retention_ms: int,
                       busy: Callable[[str], set[TopicPartition]] = lambda _: set()) -> int:
        """Kafka's offsets.retention.ms (KIP-211); tombstones go to :attr:`writes`. Returns
        how many offsets expired (see :func:`raftlog.group.offsets.expire_offsets`)."""
        return group_offsets.expire_offsets(self.groups, self.writes, now_ms, retention_ms, busy)

    def load_offset(self, group_id: str, tp: TopicPartition, value: OffsetValue | None) -> None:
        """Replay of one offset record (None: a tombstone)."""
        group_offsets.load_offset(self.groups, group_id, tp, value)

    # -- admin --------------------------------------------------------------------------------

    def describe(self, group_id: str) -> Body:
        """The DescribeGroups entry of ``group_id`` (Dead when there is no such group)."""
        return describe_group(group_id, self.groups.get(group_id))

    def listed(self) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) of every group."""
        return [(g.group_id, g.protocol_type or "", g.state) for g in self.groups.values()]

    def delete(self, group_id: str) -> tuple[int, list[tuple[bytes, bytes | None]]]:
        """Kafka's DeleteGroups checks; on success the tombstones to write (the shell then
        calls :meth:`drop`)."""
        group = self.groups.get(group_id)
        if group is None or group.state == DEAD:
            return ErrorCode.GROUP_ID_NOT_FOUND, []
        if group.state != EMPTY or group.members:
            return ErrorCode.NON_EMPTY_GROUP, []
        tombstones: list[tuple[bytes, bytes | None]] = [
            (encode_key(OffsetKey(group_id, t, p)), None) for t, p in group.offsets]
        tombstones.append((encode_key(GroupKey(group_id)), None))
        return ErrorCode.NONE, tombstones

    def drop(self, group_id: str) -> None:
        self.groups.pop(group_id, None)

    def unload(self, group_ids: Iterable[str]) -> None:
        """This node stopped coordinating these groups: waiting requests get NOT_COORDINATOR."""
        for group_id in list(group_ids):
            group = self.groups.pop(group_id, None)
            if group is None:
                continue
            for member in group.members.values():
                self._answer_pending(member, ErrorCode.NOT_COORDINATOR)

    # -- persistence --------------------------------------------------------------------------

    def _persist_group(self, group: Group, tokens: tuple[int, ...] = (), *,
                       replaced: Member | None = None, replacement: Member | None = None
                       ) -> None:
        self.persists.append(PendingPersist(group.group_id, group.generation, tokens,
                                            replaced, replacement))
        self.writes.append((group.group_id, encode_key(GroupKey(group.group_id)),
                            encode_group_value(group_value(group))))

    def persist_failed(self, persist: PendingPersist, error: int, now_ms: int) -> None:
        """The record of ``persist`` did not reach the log (``error``: the code for the
        client). As Kafka does: a static replacement is undone (the old member id is back,
        the joiner gets the error and retries with no member id); a SyncGroup's assignment
        is dropped, every waiting member gets the error and the group rebalances again. The
        answers for ``persist.tokens`` in the outbox are superseded by the ones appended
        here (the shell delivers these instead)."""
        group = self.groups.get(persist.group_id)
        current = group is not None and group.generation == persist.generation
        if persist.replacement is not None and persist.replaced is not None:
            self._undo_replacement(group if current else None, persist.replaced,
                                   persist.replacement, now_ms)
            for token in persist.tokens:
                self.outbox.append((token, _join_error(error, "")))
            return
        for token in persist.tokens:
            self.outbox.append((token, _sync_body(error)))
        if group is not None and current and group.state == STABLE:
            for member in group.members.values():
                member.assignment = b""
            self._prepare_rebalance(group, now_ms, f"writing the group metadata failed "
                                    f"(error {error})")
            self._maybe_complete_join(group, now_ms)

    def _undo_replacement(self, group: Group | None, old: Member, new: Member,
                          now_ms: int) -> None:
        instance_id = new.instance_id
        if group is None or instance_id is None or \
                group.members.get(new.member_id) is not new or \
                group.static.get(instance_id) != new.member_id:
            return  # the group moved on meanwhile (the member left, rejoined, was evicted)
        self._answer_pending(new, ErrorCode.FENCED_INSTANCE_ID)
        old.heartbeat_deadline_ms = now_ms + old.session_timeout_ms
        old.assignment = new.assignment
        group.members = {(old.member_id if k == new.member_id else k):
                         (old if k == new.member_id else m)
                         for k, m in group.members.items()}
        group.static[instance_id] = old.member_id
        if group.leader == new.member_id:
            group.leader = old.member_id

    def restart_sessions(self, group_ids: Iterable[str], now_ms: int) -> None:
        """Every member of these (just loaded) groups gets a full session from ``now_ms``."""
        for group_id in group_ids:
            group = self.groups.get(group_id)
            for member in () if group is None else group.members.values():
                member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms

    def load_group(self, group_id: str, value: GroupValue | None, now_ms: int) -> None:
        """Replay of one group-metadata record (None: the group was deleted)."""
        if value is None:
            self.groups.pop(group_id, None)
            return
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        restore_group(group, value, now_ms)


def _join_error(code: int, member_id: str) -> Body:
    return {"error_code": code, "generation_id": -1, "protocol_name": "", "leader": "",
            "member_id": member_id, "members": []}


def _sync_body(code: int, assignment: bytes = b"") -> Body:
    return {"error_code": code, "assignment": assignment}
