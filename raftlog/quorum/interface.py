"""The metadata quorum's interface: what the rest of raftlog needs from it, and its errors.

Two quorums implement :class:`Quorum`: ``LocalQuorum`` (:mod:`raftlog.quorum.local`, one voter,
no Raft) and ``RaftQuorum`` (:mod:`raftlog.quorum.raft`). Everything outside ``raftlog.quorum``
depends on this module only, never on which quorum runs.

Every wait has a timeout. A proposal that times out after it was handed to the log has an
unknown outcome (it may still apply); retry it with the same ``request_id`` and the state machine
returns the first result instead of applying it twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from raftlog.metadata.image import MetadataImage
from raftlog.metadata.records import Record
from raftlog.metadata.state import ApplyResult

PROPOSE_TIMEOUT_S_DEFAULT: Final = 5.0
# The kinds ``Quorum.error_counts`` reports, always all of them: proposals and read barriers
# that timed out (or whose outcome a leader change made unknown); Raft connections refused
# (authentication, oversized frames, handshake timeouts) or lost once established; failed
# writes or fsyncs of the metadata log, its term/vote file or snapshots.
QUORUM_ERROR_KINDS: Final = ("proposal_timeout", "transport", "storage")


class QuorumError(Exception):
    """Base class of quorum failures."""


class QuorumBusyError(QuorumError):
    """Too many proposals are waiting; shed load and retry later."""


class QuorumClosedError(QuorumError):
    """The quorum is not open (not opened yet, or closed)."""


class QuorumFailedError(QuorumError):
    """Writing the log failed; the quorum refuses further work until the process restarts."""


class QuorumTimeoutError(QuorumError):
    """A wait did not finish within its timeout."""


class NotControllerError(QuorumError):
    """This node is not the ready controller (Raft leader with its ``BecomeController`` applied).

    Raised by ``propose`` and linearizable reads before anything is submitted, and when leadership
    was lost before the command committed (it was not applied). Kafka's NOT_CONTROLLER (41): the
    caller re-reads ``image.controller_node_id`` (or ``leader_node_id``) and re-routes.

    Attributes:
        leader_node_id: The Raft leader this node believes in, if any (a hint, possibly stale).
    """

    def __init__(self, message: str, *, leader_node_id: int | None = None) -> None:
        super().__init__(message)
        self.leader_node_id = leader_node_id


class ProposalTimeoutError(QuorumTimeoutError):
    """A proposal did not commit in time.

    Attributes:
        outcome_unknown: True if the command had already been handed to the log, so it may
            still be applied; False if it was withdrawn and will never apply.
    """

    def __init__(self, message: str, *, outcome_unknown: bool) -> None:
        super().__init__(message)
        self.outcome_unknown = outcome_unknown


class Quorum(Protocol):
    """What the server needs from a metadata quorum, single-voter or Raft."""

    @property
    def image(self) -> MetadataImage:
        """The latest applied image; never half-applied."""
        ...

    @property
    def controller_ready(self) -> bool:
        """Whether this node is the controller: the Raft leader, with its ``BecomeController``
        for the current term applied. Only then does ``propose`` accept commands."""
        ...

    @property
    def leader_node_id(self) -> int | None:
        """The node id of the Raft leader as this node believes (possibly stale), or None."""
        ...

    def status(self) -> QuorumStatus:
        """Voters, leader, term, commit and applied index, per-voter lag."""
        ...

    def leader_contact_age_s(self) -> float:
        """Seconds since this node last heard from the Raft leader (0 on the leader; before
        any contact, since the quorum was built). Cheap: read at every metrics scrape."""
        ...

    def error_counts(self) -> Mapping[str, int]:
        """Quorum-side failures so far, by each of :data:`QUORUM_ERROR_KINDS` (monotonic)."""
        ...

    async def propose(
        self,
        record: Record,
        *,
        expected_version: int | None = None,
        request_id: str | None = None,
        timeout_s: float = PROPOSE_TIMEOUT_S_DEFAULT,
    ) -> ApplyResult:
        """Commit ``record`` through the log and return the state machine's result.

        Raises:
            NotControllerError: this node is not the ready controller.
        """
        ...

    async def wait_for_version(self, version: int, timeout_s: float) -> MetadataImage:
        """Wait until the applied image's version is at least ``version``."""
        ...

    async def wait_changed(self, since_version: int, timeout_s: float) -> MetadataImage:
        """Wait until the applied image's version exceeds ``since_version``; return the latest."""
        ...


@dataclass(frozen=True, slots=True)
class VoterStatus:
    """One voter as this node sees it (``raftlog quorum status``, DescribeQuorum).

    Attributes:
        node_id: The voter's ``node.id``.
        address: Its Raft address (``host:port`` from ``controller.quorum.voters``).
        connected: Whether this node has a Raft connection to it (True for itself).
        match_index: Highest log index known replicated on it; only known on the leader (and
            for the leader itself, its last log index).
        lag: Leader's last log index minus ``match_index``; None where ``match_index`` is.
        last_contact_s: Seconds since the leader last heard from it; leader only.
    """

    node_id: int
    address: str
    connected: bool
    match_index: int | None = None
    lag: int | None = None
    last_contact_s: float | None = None


@dataclass(frozen=True, slots=True)
class ObserverStatus:
    """A non-voting member (``process.roles=broker``) following the log; leader only."""

    node_id: int | None
    match_index: int | None
    lag: int | None


@dataclass(frozen=True, slots=True)
class QuorumStatus:
    """A point-in-time view of the metadata quorum from one node.

    Attributes:
        node_id: This node.
        role: "leader", "follower", "candidate" or "observer" (a non-voting member).
        leader_node_id: The Raft leader as this node believes, or None.
        term: The Raft term (``LocalQuorum``: the controller term).
        controller_term: The term of the last applied ``BecomeController``.
        controller_node_id: The node of the last applied ``BecomeController`` (-1 if none).
        controller_ready: See ``Quorum.controller_ready``.
        commit_index: Highest log index known committed.
        last_applied: Highest log index applied to this node's image.
        last_log_index: Highest log index in this node's log.
        metadata_version: ``image.version``.
        voters: Every voter, this node included if it votes.
        observers: Non-voting members connected to this node (the leader knows them).
    """

    node_id: int
    role: str
    leader_node_id: int | None
    term: int
    controller_term: int
    controller_node_id: int
    controller_ready: bool
    commit_index: int
    last_applied: int
    last_log_index: int
    metadata_version: int
    voters: tuple[VoterStatus, ...]
    observers: tuple[ObserverStatus, ...] = ()
