"""Incremental fetch sessions (KIP-227): the follower's side.

Pure and synchronous. A ``LeaderFetcher`` keeps one ``FollowerSession`` per leader
connection. ``build`` turns the partitions it wants now into a request: the first one (and
every one after a failure) is full and asks the leader for a session (epoch 0); then each
request names only partitions whose fetch state changed, and the ones no longer wanted
(``forgotten``). ``answered`` or ``failed`` moves the session on. The leader's side and the
meaning of the (session id, epoch) pairs are in ``raftlog.broker.fetch_sessions``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from raftlog.protocol.errors import ErrorCode

__all__ = ["FollowerSession", "PartitionFetch", "SessionRequest"]

INITIAL_EPOCH = 0
Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class PartitionFetch:
    """What a follower asks of one partition (the Fetch request's partition fields)."""

    current_leader_epoch: int
    fetch_offset: int
    log_start_offset: int
    partition_max_bytes: int


@dataclass(frozen=True, slots=True)
class SessionRequest:
    """The session fields and partitions of one Fetch request."""

    session_id: int
    session_epoch: int
    partitions: Mapping[Key, PartitionFetch]
    forgotten: tuple[Key, ...]

    @property
    def full(self) -> bool:
        return self.session_epoch == INITIAL_EPOCH


class FollowerSession:
    """The follower's view of its session with one leader."""

    def __init__(self) -> None:
        self.session_id = 0
        self.epoch = INITIAL_EPOCH
        self._known: dict[Key, PartitionFetch] = {}  # what the leader's session holds
        self._pending: dict[Key, PartitionFetch] | None = None

    def build(self, wanted: Mapping[Key, PartitionFetch]) -> SessionRequest:
        """The request for ``wanted`` (every partition to fetch now, in order)."""
        self._pending = dict(wanted)
        if self.epoch == INITIAL_EPOCH:
            return SessionRequest(self.session_id, INITIAL_EPOCH, self._pending, ())
        changed = {key: fetch for key, fetch in wanted.items() if self._known.get(key) != fetch}
        forgotten = tuple(key for key in self._known if key not in wanted)
        return SessionRequest(self.session_id, self.epoch, changed, forgotten)

    def answered(self, error_code: int, session_id: int) -> None:
        """The leader answered the last request with this top-level error and session id."""
        pending, self._pending = self._pending, None
        assert pending is not None, "an answer without a request"
        if error_code != ErrorCode.NONE:
            self.failed()  # FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH: anew
            return
        if self.epoch == INITIAL_EPOCH:
            self.session_id = session_id
            if session_id == 0:  # the leader keeps no session: every request stays full
                self._known = {}
                return
        self.epoch = 1 if self.epoch >= 0x7FFFFFFF else self.epoch + 1
        self._known = pending

    def failed(self) -> None:
        """The request failed or its answer was lost: the leader's session is unknown, so
        the next request is full (and names the old id, which closes it)."""
        self._pending = None
        self.epoch = INITIAL_EPOCH
        self._known = {}
