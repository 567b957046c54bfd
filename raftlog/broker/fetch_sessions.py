"""Incremental fetch sessions (KIP-227) for follower fetches: the leader's side.

Pure and synchronous. A follower that follows a thousand partitions of one leader would
otherwise send all of them in every Fetch and get all of them back, twice a second even when
nothing is written: most of an idle broker's CPU. With a session, the leader remembers each
partition's fetch state; a follower's incremental Fetch carries only what changed (new
offsets, new partitions, forgotten ones) and the answer only the partitions with something to
say (records, an error, a new high watermark or log start).

The request's (session_id, session_epoch) means, as in Kafka's ``FetchSession``:

* (0, -1): no session (consumers, and every client that does not use sessions);
* (any, 0): close that session if any, start a new one with the partitions given (a full
  request; the answer carries every partition and the new id);
* (id, n > 0): the n-th incremental request of session ``id``: FETCH_SESSION_ID_NOT_FOUND if
  there is none (or it is another broker's), INVALID_FETCH_SESSION_EPOCH if n is not the one
  expected (a lost answer: the follower starts over);
* (id, -1): close session ``id``; the request itself is a full sessionless one.

Only follower fetches get sessions (a consumer asking for one gets id 0, which KIP-227 allows:
"no session"). What the cache holds is bounded: ``max_sessions`` in all (least recently used
evicted, Kafka's ``max.incremental.fetch.session.cache.slots``), ``SESSIONS_PER_BROKER`` per
broker (a follower needs one per leader connection; its oldest goes), and
``SESSION_PARTITIONS_MAX`` partitions per session: a full request naming more gets no session,
and an incremental one growing past it ends the session (FETCH_SESSION_ID_NOT_FOUND, so the
follower starts over).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from raftlog.protocol.errors import ErrorCode

__all__ = [
    "FINAL_EPOCH",
    "INITIAL_EPOCH",
    "FetchSession",
    "FetchSessionCache",
    "PartitionRequest",
    "SessionPartition",
]

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
MAX_SESSIONS = 1000
SESSIONS_PER_BROKER = 2
SESSION_PARTITIONS_MAX = 50_000
_NEVER = -2  # "not answered yet": any value differs from it


class PartitionRequest(Protocol):
    """One partition of a Fetch request, as decoded or as a session remembers it."""

    @property
    def partition(self) -> int: ...

    @property
    def current_leader_epoch(self) -> int: ...

    @property
    def fetch_offset(self) -> int: ...

    @property
    def log_start_offset(self) -> int: ...

    @property
    def partition_max_bytes(self) -> int: ...


@dataclass(slots=True)
class SessionPartition:
    """A partition of a session: its latest fetch state and what the leader last answered."""

    partition: int
    current_leader_epoch: int
    fetch_offset: int
    log_start_offset: int
    partition_max_bytes: int
    answered_high_watermark: int = _NEVER
    answered_log_start_offset: int = _NEVER
    answered_last_stable_offset: int = _NEVER

    def update(self, request: PartitionRequest) -> None:
        self.current_leader_epoch = request.current_leader_epoch
        self.fetch_offset = request.fetch_offset
        self.log_start_offset = request.log_start_offset
        self.partition_max_bytes = request.partition_max_bytes

    def differs(self, result: dict[str, Any]) -> bool:
        """Whether ``result`` says something the follower was not told yet."""
        return (
            bool(result["records"]) or result["error_code"] != ErrorCode.NONE
            or result["high_watermark"] != self.answered_high_watermark
            or result["log_start_offset"] != self.answered_log_start_offset
            or result["last_stable_offset"] != self.answered_last_stable_offset
        )

    def must_answer(self, result: dict[str, Any]) -> bool:
        """Whether an incremental answer includes this partition (Kafka's
        ``CachedPartition.maybeUpdateResponseData``), remembering what it says if so."""
        changed = self.differs(result)
        if changed:
            self.answered_high_watermark = result["high_watermark"]
            self.answered_log_start_offset = result["log_start_offset"]
            self.answered_last_stable_offset = result["last_stable_offset"]
        return changed


Key = tuple[str, int]


class FetchSession:
    """One follower's session: its partitions in fetch order and the epoch expected next."""

    def __init__(self, session_id: int, replica_id: int) -> None:
        self.session_id = session_id
        self.replica_id = replica_id
        self.next_epoch = 1
        self.partitions: OrderedDict[Key, SessionPartition] = OrderedDict()

    def update(self, topics: Iterable[tuple[str, Sequence[PartitionRequest]]],
               forgotten: Iterable[tuple[str, Sequence[int]]]) -> None:
        for topic, indexes in forgotten:
            for index in indexes:
                self.partitions.pop((topic, index), None)
        for topic, requests in topics:
            for request in requests:
                key = (topic, request.partition)
                known = self.partitions.get(key)
                if known is None:
                    self.partitions[key] = SessionPartition(
                        request.partition, request.current_leader_epoch, request.fetch_offset,
                        request.log_start_offset, request.partition_max_bytes)
                else:
                    known.update(request)

    def plan(self) -> tuple[tuple[str, tuple[SessionPartition, ...]], ...]:
        """Every partition of the session, grouped by topic in session order."""
        groups: list[tuple[str, list[SessionPartition]]] = []
        for (topic, _), partition in self.partitions.items():
            if groups and groups[-1][0] == topic:
                groups[-1][1].append(partition)
            else:
                groups.append((topic, [partition]))
        return tuple((topic, tuple(parts)) for topic, parts in groups)

    def unanswered(self, topics: list[dict[str, Any]]) -> set[Key]:
        """The partitions of a read whose result an incremental answer would include (what
        ``answered`` would keep), without remembering anything."""
        keys: set[Key] = set()
        for topic in topics:
            name = topic["topic"]
            for result in topic["partitions"]:
                key = (name, result["partition_index"])
                cached = self.partitions.get(key)
                if cached is not None and cached.differs(result):
                    keys.add(key)
        return keys

    def answered(self, topics: list[dict[str, Any]], *, incremental: bool
                 ) -> list[dict[str, Any]]:
        """The answer's topics as sent: an incremental answer keeps only partitions with
        something new. Partitions that returned records move to the end of the session's
        order, so that under ``max_bytes`` the others get their turn (Kafka does the same)."""
        out = []
        rotate: list[Key] = []
        for topic in topics:
            name = topic["topic"]
            kept = []
            for result in topic["partitions"]:
                key = (name, result["partition_index"])
                cached = self.partitions.get(key)
                if cached is None:
                    continue
                if cached.must_answer(result) or not incremental:
                    kept.append(result)
                if result["records"]:
                    rotate.append(key)
            if kept:
                out.append({"topic": name, "partitions": kept})
        for key in rotate:
            self.partitions.move_to_end(key)
        return out


class FetchSessionCache:
    """The sessions of one broker's followers (bounded, least recently used evicted)."""

    def __init__(self, max_sessions: int = MAX_SESSIONS, first_id: int = 1,
                 partitions_max: int = SESSION_PARTITIONS_MAX) -> None:
        assert max_sessions > 0 and partitions_max > 0
        self.max_sessions = max_sessions
        self.partitions_max = partitions_max
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()
        self._ids = itertools.count(first_id)
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def begin(
        self, *, replica_id: int, session_id: int, session_epoch: int,
        topics: Iterable[tuple[str, Sequence[PartitionRequest]]],
        forgotten: Iterable[tuple[str, Sequence[int]]],
    ) -> tuple[int, FetchSession | None]:
        """Resolve a Fetch's session fields: (error code, session). A session of None with
        no error is a sessionless (full) fetch. ``replica_id`` < 0 (a consumer) never gets
        one."""
        if session_epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id != 0:
                self._close(session_id, replica_id)
            if session_epoch == FINAL_EPOCH or replica_id < 0:
                return ErrorCode.NONE, None
            created = self._create(replica_id)
            created.update(topics, forgotten)
            if len(created.partitions) > self.partitions_max:
                del self._sessions[created.session_id]  # answered in full, without a session
                return ErrorCode.NONE, None
            return ErrorCode.NONE, created
        session = self._sessions.get(session_id)
        if session is None or session.replica_id != replica_id:
            return ErrorCode.FETCH_SESSION_ID_NOT_FOUND, None
        if session_epoch != session.next_epoch:
            self._sessions.pop(session_id)  # the follower starts over with a full fetch
            return ErrorCode.INVALID_FETCH_SESSION_EPOCH, None
        session.next_epoch = _next_epoch(session.next_epoch)
        self._sessions.move_to_end(session_id)
        session.update(topics, forgotten)
        if len(session.partitions) > self.partitions_max:
            del self._sessions[session_id]
            return ErrorCode.FETCH_SESSION_ID_NOT_FOUND, None
        return ErrorCode.NONE, session

    def _close(self, session_id: int, replica_id: int) -> None:
        session = self._sessions.get(session_id)
        if session is not None and session.replica_id == replica_id:
            del self._sessions[session_id]

    def _create(self, replica_id: int) -> FetchSession:
        own = [s.session_id for s in self._sessions.values() if s.replica_id == replica_id]
        for session_id in own[:max(len(own) - SESSIONS_PER_BROKER + 1, 0)]:
            del self._sessions[session_id]  # this broker's oldest
            self.evicted += 1
        while len(self._sessions) >= self.max_sessions:
            self._sessions.popitem(last=False)
            self.evicted += 1
        session_id = next(self._ids)
        if session_id > 0x7FFFFFFF:
            self._ids = itertools.count(1)
            session_id = next(self._ids)
        while session_id in self._sessions:
            session_id = next(self._ids)
        session = FetchSession(session_id, replica_id)
        self._sessions[session_id] = session
        return session


def _next_epoch(epoch: int) -> int:
    """Epochs run 1, 2, ... and wrap to 1 after the largest int32 (Kafka's nextEpoch)."""
    return 1 if epoch >= 0x7FFFFFFF else epoch + 1
