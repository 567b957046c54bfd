"""The consumer-group core's data: a group, its members, and what a group-metadata write
vouches for. Plain mutable records, owned by :class:`raftlog.group.coordinator.GroupCoordinator`
(membership and rebalances) and read and written by :mod:`raftlog.group.offsets` (commits);
and a group's conversions: to and from its ``__consumer_offsets`` record, to DescribeGroups.

States follow Kafka's ``GroupMetadata``: Empty → PreparingRebalance → CompletingRebalance →
Stable, and back to PreparingRebalance when members join, leave or time out; Dead once gone.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from raftlog.group.records import GroupValue, MemberValue, OffsetValue

EMPTY = "Empty"
PREPARING_REBALANCE = "PreparingRebalance"
COMPLETING_REBALANCE = "CompletingRebalance"
STABLE = "Stable"
DEAD = "Dead"

Body = dict[str, Any]
TopicPartition = tuple[str, int]


@dataclass
class Member:
    """One member of a group: its session, its protocols and what it awaits."""

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
    """One consumer group: its state, generation, members and committed offsets."""

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


# The client id (or group.instance.id) that starts a member id is the client's, up to 32767
# bytes; a member id longer than that could not be sent back (JoinGroup v0-5 strings).
MEMBER_ID_PREFIX_CHARS_MAX = 1024


def random_member_id(prefix: str) -> str:
    """A new member id: the client's prefix (cut to a sendable length), a dash, a UUID."""
    return f"{prefix[:MEMBER_ID_PREFIX_CHARS_MAX]}-{uuid.uuid4()}"


def is_fenced(group: Group, member_id: str, instance_id: str | None) -> bool:
    """Whether ``instance_id`` (a static member) now belongs to another member id (KIP-345)."""
    return instance_id is not None and group.static.get(instance_id, member_id) != member_id


def select_protocol(members: Iterable[Member]) -> str:
    """Kafka's vote: among protocols every member supports, each member votes for its first."""
    members = list(members)
    common = set.intersection(*({n for n, _ in m.protocols} for m in members))
    votes: dict[str, int] = {}
    for member in members:
        choice = next(n for n, _ in member.protocols if n in common)
        votes[choice] = votes.get(choice, 0) + 1
    order = [n for n, _ in members[0].protocols if n in common]
    return max(order, key=lambda n: (votes.get(n, 0), -order.index(n)))


def group_value(group: Group) -> GroupValue:
    """The group-metadata record of ``group`` as it stands (its members with their
    subscription to the chosen protocol and their assignment)."""
    return GroupValue(
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


def restore_group(group: Group, value: GroupValue, now_ms: int) -> None:
    """``group`` as its group-metadata record says (a replay): Stable with the recorded
    members, each with a full session from ``now_ms``, or Empty without members."""
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


def describe_group(group_id: str, group: Group | None) -> Body:
    """What DescribeGroups shows of a group: assignments only once Stable, Dead if none."""
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
