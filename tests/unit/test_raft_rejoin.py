"""RejoinGuard: when a voter on a new Raft directory may vote (the pure decision).

Goal: a voter that lost its disk votes only once it holds every committed entry, and a new
cluster (every directory new) still elects a leader at once. Method: the guard's inputs by
hand (probe replies, the leader's identity, commit indexes); the real processes are in
``tests/integration/test_raft_wiped_voter.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raftlog.quorum.raft_rejoin import (
    INITIAL_LOG_INDEX,
    RejoinGuard,
    RejoinMixin,
    RejoinState,
)
from raftlog.quorum.raft_storage import REJOIN_MARKER_FILE_NAME


def test_a_single_voter_is_never_guarded() -> None:
    assert not RejoinGuard(1, now=0.0).active


def test_a_new_cluster_is_recognised_by_a_majority_of_empty_logs() -> None:
    three = RejoinGuard(3, now=0.0)
    assert three.active and three.state is RejoinState.UNDECIDED
    three.on_probe_reply("b", INITIAL_LOG_INDEX, from_leader=False)
    assert not three.active, "itself and one empty peer are a majority of three"

    five = RejoinGuard(5, now=0.0)
    five.on_probe_reply("b", INITIAL_LOG_INDEX, from_leader=False)
    five.on_probe_reply("b", INITIAL_LOG_INDEX, from_leader=False)  # the same peer twice
    assert five.active
    five.on_probe_reply("c", INITIAL_LOG_INDEX, from_leader=False)
    assert not five.active and five.target_index is None


def test_a_peer_with_a_log_means_this_voter_lost_its_data() -> None:
    guard = RejoinGuard(3, now=0.0)
    guard.on_probe_reply("b", 40, from_leader=False)
    assert guard.state is RejoinState.CATCHING_UP and guard.history_seen_from == "b"
    guard.on_probe_reply("c", INITIAL_LOG_INDEX, from_leader=False)  # another wiped voter
    assert guard.active, "an empty peer does not make a cluster with a history new again"
    assert not guard.on_commit_index(10_000), "no target before a leader answered"
    guard.on_probe_reply("b", 41, from_leader=True)
    assert guard.target_index == 41
    guard.on_probe_reply("b", 60, from_leader=True)
    assert guard.target_index == 41, "the target is fixed at the leader's first answer"
    assert not guard.on_commit_index(40)
    assert guard.active
    assert guard.on_commit_index(41)
    assert not guard.active
    assert not guard.on_commit_index(42), "finishes once"


def test_the_leaders_first_answer_can_also_reveal_the_history() -> None:
    guard = RejoinGuard(3, now=0.0)
    guard.on_probe_reply("leader", 7, from_leader=True)
    assert guard.state is RejoinState.CATCHING_UP and guard.target_index == 7


def test_probes_are_paced_fast_while_undecided_then_slower() -> None:
    guard = RejoinGuard(3, now=10.0, probe_interval_s=0.5, undecided_probe_interval_s=0.05)
    assert guard.probe_due(10.0)
    assert not guard.probe_due(10.02)
    assert guard.probe_due(10.05), "a new cluster waits on the first answer: ask often"
    guard.on_probe_reply("b", 9, from_leader=False)  # a history: catching up
    assert guard.probe_due(10.11)
    assert not guard.probe_due(10.35)
    assert guard.probe_due(10.62)
    guard.on_probe_reply("b", 9, from_leader=True)
    assert guard.on_commit_index(9)
    assert not guard.probe_due(20.0), "no probes once finished"


class _Voter(RejoinMixin):
    """The mixin's view of a RaftSyncObj: two peers, no leader yet."""

    def __init__(self, directory: Path) -> None:
        self._raft_rejoin = RejoinGuard(3, now=0.0)
        self._raft_dir = directory
        self._SyncObj__otherNodes = {"b", "c"}
        self._SyncObj__raftLeader = None
        self._SyncObj__raftCommitIndex = 0
        self._SyncObj__raftElectionDeadline = 0.0
        self._SyncObj__transport = self
        self.sent: list[tuple[Any, Any]] = []

    def send(self, node: Any, message: Any) -> None:
        self.sent.append((node, message))


def test_only_well_formed_answers_from_voters_count(tmp_path: Path) -> None:
    (tmp_path / REJOIN_MARKER_FILE_NAME).write_text("new\n")
    voter = _Voter(tmp_path)
    voter._raft_on_probe_reply("stranger", INITIAL_LOG_INDEX)  # not a voter
    for junk in ("1", None, -5, True, 2**70 * 1.0):
        voter._raft_on_probe_reply("b", junk)
    guard = voter._raft_rejoin
    assert guard is not None and guard.state is RejoinState.UNDECIDED
    voter._raft_on_probe_reply("b", INITIAL_LOG_INDEX)
    assert voter._raft_rejoin is None, "a majority of empty logs: a new cluster"
    assert not (tmp_path / REJOIN_MARKER_FILE_NAME).exists()
