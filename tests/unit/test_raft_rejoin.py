"""RejoinGuard: when a voter on a new Raft directory may vote (the pure decision).

Goal: a voter that lost its disk votes only once it holds every committed entry, and a new
cluster (every directory new) still elects a leader at once. Method: the guard's inputs by
hand (probe replies, the leader's identity, commit indexes); the real processes are in
``tests/integration/test_raft_wiped_voter.py``.
"""

from __future__ import annotations

from raftlog.quorum.raft_rejoin import INITIAL_LOG_INDEX, RejoinGuard, RejoinState


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
