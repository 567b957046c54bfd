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
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from raftlog.group.records import (
    GroupKey,
    GroupValue,
    MemberValue,
    OffsetKey,
    OffsetValue,
    encode_group_value,
    encode_key,
    encode_offset_value,
)
from raftlog.protocol.errors import ErrorCode

EMPTY = "Empty"
PREPARING_REBALANCE = "PreparingRebalance"
COMPLETING_REBALANCE = "CompletingRebalance"
STABLE = "Stable"
DEAD = "Dead"

GROUP_MIN_SESSION_TIMEOUT_MS = 6_000  # Kafka's group.min.session.timeout.ms default
GROUP_MAX_SESSION_TIMEOUT_MS = 1_800_000  # group.max.session.timeout.ms
OFFSET_METADATA_MAX_BYTES = 4096  # offset.metadata.max.bytes

log = logging.getLogger(__name__)

Body = dict[str, Any]
TopicPartition = tuple[str, int]


@dataclass
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]
    heartbeat_deadline_ms: int
    assignment: bytes = b""
    join_token: int | None = None  # awaiting the end of the rebalance
    sync_token: int | None = None  # awaiting the leader's assignment

    def metadata_for(self, protocol: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""


@dataclass
class Group:
    group_id: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    pending: dict[str, int] = field(default_factory=dict)  # MEMBER_ID_REQUIRED ids → deadline
    static: dict[str, str] = field(default_factory=dict)  # group.instance.id → member id
    offsets: dict[TopicPartition, OffsetValue] = field(default_factory=dict)
    rebalance_deadline_ms: int | None = None
    state_timestamp_ms: int = -1
    # group.initial.rebalance.delay.ms: the first rebalance of an empty group waits this long
    # (extended by each new member, never past the rebalance timeout) so that consumers
    # starting together land in one generation instead of a rebalance each.
    initial_delay_until_ms: int | None = None
    initial_delay_limit_ms: int = 0


@dataclass
class PendingPersist:
    """What one group-metadata record in :attr:`GroupCoordinator.writes` vouches for: the
    answers (tokens in the outbox) that may only succeed once it is in the log, and for a
    static member's replacement, the member it replaced. The shell reports a write that did
    not make it with :meth:`GroupCoordinator.persist_failed` (Kafka's ``storeGroup`` error
    callbacks): a client must never hold a member id or an assignment that a reloading
    coordinator would not find."""

    group_id: str
    generation: int
    tokens: tuple[int, ...] = ()
    replaced: Member | None = None  # a static member's old incarnation
    replacement: Member | None = None  # ...and the member that took its place


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
        self._new_member_id = new_member_id or _random_member_id
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms

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
        if group.state == STABLE and _select_protocol(group.members.values()) == group.protocol:
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
        group.rebalance_deadline_ms = None
        group.initial_delay_until_ms = None
        group.state_timestamp_ms = now_ms
        if not group.members:
            group.state, group.protocol, group.leader = EMPTY, None, None
            log.info("group %s is empty at generation %d", group.group_id, group.generation)
            self._persist_group(group)
            return
        first = next(iter(group.members.values()))
        group.protocol = _select_protocol(group.members.values())
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
        return instance_id is not None and group.static.get(instance_id, member_id) != member_id

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

    # -- offsets ------------------------------------------------------------------------------

    def validate_commit(self, group_id: str, generation: int, member_id: str,
                        instance_id: str | None, now_ms: int | None = None) -> int:
        """Kafka's checks before an OffsetCommit writes anything (classic protocol, < v9).
        A valid commit from a member counts as its heartbeat (given ``now_ms``), as in Kafka:
        a consumer busy committing is alive."""
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        group = self.groups.get(group_id)
        if group is None:
            # Only a group that does not use Kafka's membership (generation -1) may start by
            # committing; anything else is a commit from a generation that no longer exists.
            return ErrorCode.NONE if generation < 0 else ErrorCode.ILLEGAL_GENERATION
        if group.state == DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if self._fenced(group, member_id, instance_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if generation < 0 and group.state == EMPTY:
            return ErrorCode.NONE
        if group.state == COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        if member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        if now_ms is not None:
            member = group.members[member_id]
            member.heartbeat_deadline_ms = max(member.heartbeat_deadline_ms,
                                               now_ms + member.session_timeout_ms)
        return ErrorCode.NONE

    def commit_records(self, group_id: str, offsets: Mapping[TopicPartition, OffsetValue]
                       ) -> list[tuple[bytes, bytes | None]]:
        """The records that store ``offsets`` (written by the shell, then :meth:`apply_commit`)."""
        return [(encode_key(OffsetKey(group_id, topic, partition)), encode_offset_value(value))
                for (topic, partition), value in offsets.items()]

    def apply_commit(self, group_id: str, offsets: Mapping[TopicPartition, OffsetValue],
                     now_ms: int) -> None:
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id, state_timestamp_ms=now_ms)
        group.offsets.update(offsets)

    def committed(self, group_id: str, partitions: Iterable[TopicPartition] | None
                  ) -> dict[TopicPartition, OffsetValue | None]:
        group = self.groups.get(group_id)
        offsets = {} if group is None else group.offsets
        if partitions is None:
            return dict(offsets)
        return {tp: offsets.get(tp) for tp in partitions}

    def expire_offsets(self, now_ms: int, retention_ms: int,
                       busy: Callable[[str], set[TopicPartition]] = lambda _: set()) -> int:
        """Kafka's offsets.retention.ms (KIP-211): the offsets of a group that had members and
        is now Empty expire ``retention_ms`` after it became Empty; those of a group that only
        ever committed (no membership, generation 0) expire ``retention_ms`` after their own
        commit. Groups with members keep every offset. ``busy(group)`` names partitions with a
        transactional commit in flight, which stay. An Empty group left without offsets is
        dropped (Dead). Tombstones for both go to :attr:`writes`; returns how many offsets
        expired."""
        expired_total = 0
        for group in list(self.groups.values()):
            if group.state != EMPTY or group.members or group.pending:
                continue
            kept_back = busy(group.group_id)
            empty_since = group.state_timestamp_ms if group.generation > 0 else -1
            expired = [tp for tp, value in group.offsets.items() if tp not in kept_back
                       and now_ms - (value.commit_timestamp_ms if empty_since < 0
                                     else empty_since) >= retention_ms]
            for topic, partition in expired:
                del group.offsets[(topic, partition)]
                self.writes.append((group.group_id,
                                    encode_key(OffsetKey(group.group_id, topic, partition)),
                                    None))
            expired_total += len(expired)
            if not group.offsets and not kept_back:
                log.info("group %s is dead: empty and without offsets", group.group_id)
                del self.groups[group.group_id]
                self.writes.append((group.group_id, encode_key(GroupKey(group.group_id)), None))
        return expired_total

    # -- admin --------------------------------------------------------------------------------

    def describe(self, group_id: str) -> Body:
        group = self.groups.get(group_id)
        if group is None:
            return {"error_code": 0, "group_id": group_id, "group_state": DEAD,
                    "protocol_type": "", "protocol_data": "", "members": []}
        members = [
            {"member_id": m.member_id, "group_instance_id": m.instance_id,
             "client_id": m.client_id, "client_host": m.client_host,
             "member_metadata": m.metadata_for(group.protocol),
             "member_assignment": m.assignment if group.state == STABLE else b""}
            for m in group.members.values()
        ]
        return {"error_code": 0, "group_id": group_id, "group_state": group.state,
                "protocol_type": group.protocol_type or "",
                "protocol_data": group.protocol or "", "members": members}

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
        value = GroupValue(
            protocol_type=group.protocol_type or "",
            generation=group.generation,
            protocol=group.protocol,
            leader=group.leader,
            current_state_timestamp_ms=group.state_timestamp_ms,
            members=tuple(
                MemberValue(m.member_id, m.instance_id, m.client_id, m.client_host,
                            m.rebalance_timeout_ms, m.session_timeout_ms,
                            m.metadata_for(group.protocol), m.assignment)
                for m in group.members.values()),
        )
        self.writes.append((group.group_id, encode_key(GroupKey(group.group_id)),
                            encode_group_value(value)))

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

    def load_offset(self, group_id: str, tp: TopicPartition, value: OffsetValue | None) -> None:
        """Replay of one offset record (None: a tombstone)."""
        group = self.groups.get(group_id)
        if value is None:
            if group is not None:
                group.offsets.pop(tp, None)
            return
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        group.offsets[tp] = value

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
        group.generation = value.generation
        group.protocol_type = value.protocol_type or None
        group.protocol = value.protocol
        group.leader = value.leader
        group.state_timestamp_ms = value.current_state_timestamp_ms
        group.members = {}
        group.static = {}
        for m in value.members:
            protocols = ((value.protocol, m.subscription),) if value.protocol else ()
            group.members[m.member_id] = Member(
                m.member_id, m.group_instance_id, m.client_id, m.client_host,
                m.session_timeout_ms, m.rebalance_timeout_ms, protocols,
                now_ms + m.session_timeout_ms, assignment=m.assignment)
            if m.group_instance_id is not None:
                group.static[m.group_instance_id] = m.member_id
        group.state = STABLE if group.members else EMPTY


def offset_entry_error(partition_count: int | None, partition: int, metadata: str,
                       metadata_max_bytes: int) -> int:
    """The error for one partition of an OffsetCommit or TxnOffsetCommit (NONE if it may be
    stored): ``partition_count`` is the topic's, None when the topic does not exist."""
    if partition_count is None or not 0 <= partition < partition_count:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if len(metadata.encode()) > metadata_max_bytes:
        return ErrorCode.OFFSET_METADATA_TOO_LARGE
    return ErrorCode.NONE


def check_offset_entries(
    topics: Iterable[Any], known_topics: Mapping[str, Any], error: int,
    metadata_max_bytes: int, with_leader_epoch: bool, now_ms: int,
) -> tuple[list[tuple[TopicPartition, int]], dict[TopicPartition, OffsetValue]]:
    """The per-partition part of OffsetCommit and TxnOffsetCommit: every requested partition
    with its error code, in request order, and the offsets that may be stored. ``error`` (a
    group- or producer-level failure) applies to every partition; ``topics`` are the
    request's topics (``name``, ``partitions`` with ``partition_index``,
    ``committed_offset``, ``committed_leader_epoch``, ``committed_metadata``);
    ``known_topics`` is the metadata image's topics (each with ``partitions``)."""
    codes: list[tuple[TopicPartition, int]] = []
    valid: dict[TopicPartition, OffsetValue] = {}
    for topic in topics:
        known = known_topics.get(topic.name)
        count = None if known is None else len(known.partitions)
        for p in topic.partitions:
            tp = (topic.name, p.partition_index)
            metadata = p.committed_metadata or ""
            code = error or offset_entry_error(count, p.partition_index, metadata,
                                               metadata_max_bytes)
            codes.append((tp, code))
            if not code:
                epoch = p.committed_leader_epoch if with_leader_epoch else -1
                valid[tp] = OffsetValue(p.committed_offset, epoch, metadata, now_ms)
    return codes, valid


def _select_protocol(members: Iterable[Member]) -> str:
    """Kafka's vote: among protocols every member supports, each member votes for its first."""
    members = list(members)
    common = set.intersection(*({n for n, _ in m.protocols} for m in members))
    votes: dict[str, int] = {}
    for member in members:
        choice = next(n for n, _ in member.protocols if n in common)
        votes[choice] = votes.get(choice, 0) + 1
    order = [n for n, _ in members[0].protocols if n in common]
    return max(order, key=lambda n: (votes.get(n, 0), -order.index(n)))


def _join_error(code: int, member_id: str) -> Body:
    return {"error_code": code, "generation_id": -1, "protocol_name": "", "leader": "",
            "member_id": member_id, "members": []}


def _sync_body(code: int, assignment: bytes = b"") -> Body:
    return {"error_code": code, "assignment": assignment}


# The client id (or group.instance.id) that starts a member id is the client's, up to 32767
# bytes; a member id longer than that could not be sent back (JoinGroup v0-5 strings).
MEMBER_ID_PREFIX_CHARS_MAX = 1024


def _random_member_id(prefix: str) -> str:
    return f"{prefix[:MEMBER_ID_PREFIX_CHARS_MAX]}-{uuid.uuid4()}"
