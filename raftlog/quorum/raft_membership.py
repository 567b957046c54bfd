"""Who takes part in the Raft metadata quorum, and how it looks from this node.

:class:`RaftMembership` is ``controller.quorum.voters`` resolved for one node: whether it votes
(``process.roles`` with ``controller``) or only observes, the Raft address it binds, and the
voters' node ids by Raft address. :meth:`RaftMembership.status` turns the tick thread's
latest :class:`~raftlog.quorum.raft_events.RaftView` into the
:class:`~raftlog.quorum.interface.QuorumStatus` that ``raftlog quorum status`` and DescribeQuorum
report. Pure: no trio, no threads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from raftlog.config import QuorumVoter
from raftlog.metadata.image import MetadataImage
from raftlog.quorum.interface import ObserverStatus, QuorumError, QuorumStatus, VoterStatus
from raftlog.quorum.raft_events import CANDIDATE, LEADER, RaftView
from raftlog.quorum.raft_transport import OBSERVER_PREFIX

_OBSERVER_NODE: Final = re.compile(re.escape(OBSERVER_PREFIX) + r"(\d+)#\d+")


class RaftConfigError(QuorumError):
    """The node cannot start: missing secret, bad voters, or a data directory that belongs to
    another cluster or node."""


@dataclass(frozen=True, slots=True)
class RaftMembership:
    """``controller.quorum.voters`` as one node takes part in them (see the module docstring).

    Attributes:
        node_id: This node's ``node.id``.
        voters: ``controller.quorum.voters``.
        self_address: This voter's Raft ``host:port``; None for a non-voting observer.
        bind_address: The ``host:port`` its Raft port binds; None for an observer.
        voter_ids_by_address: Every voter's node id by its Raft ``host:port``.
    """

    node_id: int
    voters: tuple[QuorumVoter, ...]
    self_address: str | None
    bind_address: str | None
    voter_ids_by_address: Mapping[str, int]

    @classmethod
    def resolve(
        cls, node_id: int, voters: Sequence[QuorumVoter], *, is_voter: bool,
        bind_host: str | None,
    ) -> RaftMembership:
        """This node's place among ``voters``.

        Args:
            bind_host: Interface the Raft port binds (default: the host of the voter entry).

        Raises:
            RaftConfigError: no voter, or the voters do not match the role.
        """
        if not voters:
            raise RaftConfigError("controller.quorum.voters lists no voter")
        by_address = {f"{voter.host}:{voter.port}": voter.node_id for voter in voters}
        own = [voter for voter in voters if voter.node_id == node_id]
        if is_voter and not own:
            raise RaftConfigError(f"node.id {node_id} is not in controller.quorum.voters")
        if not is_voter and own:
            raise RaftConfigError(
                f"node.id {node_id} is a voter but process.roles has no controller"
            )
        return cls(
            node_id=node_id,
            voters=tuple(voters),
            self_address=f"{own[0].host}:{own[0].port}" if own else None,
            bind_address=(
                None
                if not own
                else f"{bind_host if bind_host is not None else own[0].host}:{own[0].port}"
            ),
            voter_ids_by_address=by_address,
        )

    @property
    def is_voter(self) -> bool:
        """False for a non-voting observer (``process.roles=broker``)."""
        return self.self_address is not None

    @property
    def peer_addresses(self) -> list[str]:
        """The other voters' Raft addresses."""
        return [a for a in self.voter_ids_by_address if a != self.self_address]

    def voter_id(self, address: str) -> int | None:
        """The node id of the voter at Raft ``address``, if it is one."""
        return self.voter_ids_by_address.get(address)

    def status(
        self, view: RaftView | None, image: MetadataImage, controller_ready: bool
    ) -> QuorumStatus:
        """The quorum as ``view`` (None before the first tick) and ``image`` show it."""
        if view is None:
            return QuorumStatus(
                self.node_id, "observer" if not self.is_voter else "follower", None, 0,
                image.controller_term, image.controller_node_id, False, 0, 0, 0, image.version,
                tuple(VoterStatus(v.node_id, f"{v.host}:{v.port}", False) for v in self.voters),
            )  # fmt: skip
        leading = view.state == LEADER
        voters = tuple(self._voter_status(voter, view, leading) for voter in self.voters)
        observers: tuple[ObserverStatus, ...] = ()
        if leading:
            observers = tuple(_observer_status(key, view) for key in view.observers)
        return QuorumStatus(
            node_id=self.node_id,
            role=_role_name(view.state, self.is_voter),
            leader_node_id=None if view.leader is None else self.voter_id(view.leader),
            term=view.term,
            controller_term=image.controller_term,
            controller_node_id=image.controller_node_id,
            controller_ready=controller_ready,
            commit_index=view.commit_index,
            last_applied=view.last_applied,
            last_log_index=view.last_log_index,
            metadata_version=image.version,
            voters=voters,
            observers=observers,
        )

    def _voter_status(self, voter: QuorumVoter, view: RaftView, leading: bool) -> VoterStatus:
        address = f"{voter.host}:{voter.port}"
        is_self = address == self.self_address
        match: int | None = None
        contact: float | None = None
        if leading:
            match = view.last_log_index if is_self else view.match_index.get(address)
            contact = 0.0 if is_self else view.last_contact_s.get(address)
        return VoterStatus(
            node_id=voter.node_id,
            address=address,
            connected=is_self or address in view.connected,
            match_index=match,
            lag=None if match is None else view.last_log_index - match,
            last_contact_s=contact,
        )


def _observer_status(key: str, view: RaftView) -> ObserverStatus:
    match = view.match_index.get(key)
    lag = None if match is None else view.last_log_index - match
    return ObserverStatus(_observer_node_id(key), match, lag)


def _role_name(state: int, is_voter: bool) -> str:
    if not is_voter:
        return "observer"
    return {LEADER: "leader", CANDIDATE: "candidate"}.get(state, "follower")


def _observer_node_id(key: str) -> int | None:
    match = _OBSERVER_NODE.fullmatch(key)
    return None if match is None else int(match.group(1))
