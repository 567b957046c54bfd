"""A voter that starts on a new (or wiped) Raft directory does not vote until it is whole.

Raft's safety rests on voters never forgetting: a vote is granted only to a candidate whose log
is at least as up to date as the voter's. A voter that lost its disk (a replaced machine, the
harness's wipe-disk fault) and came back under its old ``node.id`` with an empty log would
grant its vote to any candidate, so one stale node plus the wiped one could elect a leader
missing committed entries and overwrite them everywhere. Kafka closes this with directory ids
(KIP-853: a voter with a new disk is not the same voter until an operator adds it again).

raftlog's rule, decided here without I/O (``RaftSyncObj`` feeds it from the tick thread):

* A voter whose Raft directory was created by this start (``raft.rejoin`` marker, written
  with ``meta.properties`` and removed only when this guard finishes, so a crash midway starts
  over) neither votes nor stands for election while the guard is active.
* It asks every other voter for the index of its last log entry (``raftlog_probe``). If some
  voter's log holds more than the initial no-op, the cluster has a history: this voter lost
  its data. Otherwise, once a majority (itself included) is known to be empty, the cluster is
  new and the guard finishes at once (every voter of a new cluster starts this way).
* A voter that lost its data waits for a leader, which was necessarily elected without it and
  so holds every committed entry, takes that leader's last log index as its target, and
  finishes once its own commit index has reached the target: it then holds every entry that
  was committed before it came back and may vote again.

Until then the cluster counts on the other voters alone: with one of three voters wiped and
another down, the metadata quorum waits for the one that is down, as it must (only that one
may hold the latest committed entries).
"""

from __future__ import annotations

import enum
import logging
import random
from pathlib import Path
from typing import Any, Final

from pysyncobj.monotonic import monotonic as monotonic_time

from raftlog.log_budget import LogBudget
from raftlog.quorum.raft_storage import clear_rejoin

__all__ = [
    "ELECTION_HOLD_S",
    "INITIAL_LOG_INDEX",
    "PROBE_INTERVAL_S",
    "PROBE_MESSAGE_TYPE",
    "PROBE_REPLY_MESSAGE_TYPE",
    "UNDECIDED_PROBE_INTERVAL_S",
    "RejoinGuard",
    "RejoinMixin",
    "RejoinState",
]

logger = logging.getLogger(__name__)
_malformed = LogBudget(logger, "malformed probe answers")

# pysyncobj starts every journal with a no-op at index 1: a log ending there holds nothing.
INITIAL_LOG_INDEX: Final = 1
PROBE_INTERVAL_S: Final = 0.5
# Undecided, every start of a new cluster waits on the answer: ask often (a few bytes a peer).
UNDECIDED_PROBE_INTERVAL_S: Final = 0.05
# While guarded, the election deadline is kept at least this far ahead (jittered, so that the
# voters of a new cluster do not all stand at once when their guards finish).
ELECTION_HOLD_S: Final = (0.1, 0.3)
PROBE_MESSAGE_TYPE: Final = "raftlog_probe"  # where does your log end?
PROBE_REPLY_MESSAGE_TYPE: Final = "raftlog_probe_reply"


class RejoinState(enum.Enum):
    UNDECIDED = "undecided"  # new directory: is the cluster new too?
    CATCHING_UP = "catching-up"  # the cluster has a history this voter lost
    DONE = "done"


class RejoinGuard:
    """The decision for one voter started on a new directory (tick thread only).

    Args:
        voters: How many voters the quorum has, this one included.
        now: The monotonic time at start.
    """

    def __init__(self, voters: int, now: float, probe_interval_s: float = PROBE_INTERVAL_S,
                 undecided_probe_interval_s: float = UNDECIDED_PROBE_INTERVAL_S) -> None:
        assert voters >= 1 and probe_interval_s > 0 and undecided_probe_interval_s > 0
        self._empty_peers_needed = voters // 2  # with itself: a majority of the voters
        self._probe_interval_s = probe_interval_s
        self._undecided_probe_interval_s = undecided_probe_interval_s
        self._next_probe = now
        self._empty_peers: set[str] = set()
        self.state = RejoinState.DONE if voters == 1 else RejoinState.UNDECIDED
        self.target_index: int | None = None  # the leader's last index, once it answered
        self.history_seen_from: str | None = None

    @property
    def active(self) -> bool:
        """True while this voter must neither vote nor stand for election."""
        return self.state is not RejoinState.DONE

    def probe_due(self, now: float) -> bool:
        """Whether to ask the other voters again now (and remember that it did)."""
        if not self.active or now < self._next_probe:
            return False
        self._next_probe = now + (self._undecided_probe_interval_s
                                  if self.state is RejoinState.UNDECIDED
                                  else self._probe_interval_s)
        return True

    def on_probe_reply(self, peer: str, last_index: int, from_leader: bool) -> None:
        """``peer`` answered that its log ends at ``last_index``; ``from_leader`` if it is the
        leader this voter follows now."""
        if self.state is RejoinState.UNDECIDED:
            if last_index > INITIAL_LOG_INDEX:
                self.state, self.history_seen_from = RejoinState.CATCHING_UP, peer
            else:
                self._empty_peers.add(peer)
                if len(self._empty_peers) >= self._empty_peers_needed:
                    self.state = RejoinState.DONE
                    return
        if self.state is RejoinState.CATCHING_UP and from_leader and self.target_index is None:
            self.target_index = last_index

    def on_commit_index(self, commit_index: int) -> bool:
        """This voter's commit index now; True when the guard finishes with this call."""
        if (self.state is RejoinState.CATCHING_UP and self.target_index is not None
                and commit_index >= self.target_index):
            self.state = RejoinState.DONE
            return True
        return False


class RejoinMixin:
    """The guard's shell inside ``RaftSyncObj`` (tick thread): probes the other voters, keeps
    the election deadline away while guarded, and removes the marker when the guard finishes.
    ``RaftSyncObj`` sets ``_raft_rejoin`` (None: not guarded) and ``_raft_dir``."""

    _raft_rejoin: RejoinGuard | None
    _raft_dir: Path
    # pysyncobj's private fields used here (``SyncObj`` sets them).
    _SyncObj__raftElectionDeadline: float
    _SyncObj__raftCommitIndex: int
    _SyncObj__otherNodes: Any
    _SyncObj__transport: Any
    _SyncObj__raftLeader: Any

    def _raft_guard_rejoin(self) -> None:
        guard = self._raft_rejoin
        if guard is None:
            return
        if guard.active:
            now = monotonic_time()
            if self._SyncObj__raftElectionDeadline < now + ELECTION_HOLD_S[0]:
                # No candidacy while guarded; a deadline further out is left as it is, so a
                # guard that finishes before it costs a new cluster no time.
                self._SyncObj__raftElectionDeadline = now + random.uniform(*ELECTION_HOLD_S)
            guard.on_commit_index(self._SyncObj__raftCommitIndex)
            if guard.active and guard.probe_due(now):
                for node in self._SyncObj__otherNodes:
                    self._SyncObj__transport.send(node, {"type": PROBE_MESSAGE_TYPE})
        if not guard.active:
            clear_rejoin(self._raft_dir)
            self._raft_rejoin = None
            if guard.target_index is not None:
                logger.warning("raft: caught up to index %d from the leader: this voter votes "
                               "again", guard.target_index)

    def _raft_on_probe_reply(self, node: Any, last_index: object) -> None:
        """A probe's answer. Only authenticated Raft peers reach here (``raft.secret``, frames
        capped by the transport); only the voters' answers count, and a malformed one (not a
        non-negative int) is dropped with a log line rather than trusted or raised."""
        guard = self._raft_rejoin
        if guard is None or node not in self._SyncObj__otherNodes:
            return
        if not isinstance(last_index, int) or isinstance(last_index, bool) or last_index < 0:
            _malformed.log(logging.WARNING, "raft: ignored a malformed probe answer from %s: "
                           "%.40r", node, last_index)
            return
        was = guard.state
        guard.on_probe_reply(str(node), last_index, node == self._SyncObj__raftLeader)
        if guard.state is not was and guard.history_seen_from is not None:
            logger.warning("raft: this voter's directory is new but %s holds a log up to index "
                           "%d: it lost its data, and neither votes nor stands for election "
                           "until it has caught up from a leader", node, last_index)
        self._raft_guard_rejoin()
