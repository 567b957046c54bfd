"""The Raft quorum across real processes: SIGKILL failover time and SIGSTOP fencing.

Goal: with raftlog's settings a SIGKILLed controller is replaced in well under 1.5 s (median),
where pysyncobj's defaults need a second election round (findings §7c, §8-B); and a controller
frozen with SIGSTOP while another takes over cannot, after SIGCONT, change the image: its
proposals are refused or fenced (NOT_CONTROLLER), its linearizable read is refused or fresh,
and it ends with the same image as the others. Acknowledged writes survive every kill.
Method: ``python -m raftlog.quorum.raft_node`` processes on 127.0.0.1 (``RaftCluster``), failover
measured from the kill to the new controller's "ready" event (both wall-clock on this host).
"""

from __future__ import annotations

import signal
import statistics
import time
from pathlib import Path

import pytest

from raftlog.metadata import errors
from raftlog.quorum.raft_testing import RaftCluster, RaftNodeProcess

FAILOVER_CAP_S = 12.0
LINK_TIMEOUT_S = 2.0


def measure_failovers(
    cluster: RaftCluster, trials: int, idle_s: float, acked: list[int]
) -> tuple[list[float], list[int]]:
    """Kill the controller ``trials`` times (restarting it in between); return the seconds
    until a new controller was ready, and the term each failover ended in minus the old one."""
    gaps: list[float] = []
    jumps: list[int] = []
    cluster.current_controller(15)
    for trial in range(trials):
        time.sleep(idle_s)  # links idle, as between failovers in a real deployment
        leader = cluster.current_controller(15)
        write = 1000 + trial
        assert leader.request("propose", broker=write)["ok"]
        acked.append(write)
        term = leader.request("status")["status"]["term"]
        survivors = [n.node_id for n in cluster.voters() if n is not leader]
        killed_at = time.time()
        leader.kill()
        try:
            node, event = cluster.wait_controller(FAILOVER_CAP_S, after=killed_at, among=survivors)
            gaps.append(event["time"] - killed_at)
            jumps.append(node.request("status")["status"]["term"] - term)
        except TimeoutError:
            gaps.append(FAILOVER_CAP_S)
        if trial < trials - 1:
            leader.start()
            cluster.wait_caught_up(leader, 15)
    return gaps, jumps


def brokers(node: RaftNodeProcess) -> list[int]:
    image = node.request("image")
    brokers_seen: list[int] = image["brokers"]
    return brokers_seen


@pytest.mark.slow
def test_5_failover_after_sigkill_pysyncobj_defaults_vs_raftlog(tmp_path: Path) -> None:
    with RaftCluster(tmp_path / "defaults", pysyncobj_defaults=True) as cluster:
        cluster.start()
        # Idle longer than the default connectionTimeout (3.5 s): the follower link goes stale.
        default_gaps, default_jumps = measure_failovers(cluster, 2, 4.0, [])
    acked: list[int] = []
    with RaftCluster(tmp_path / "raftlog") as cluster:
        cluster.start()
        gaps, jumps = measure_failovers(cluster, 3, 0.5, acked)
        controller = cluster.current_controller(10)
        assert set(acked) <= set(brokers(controller)), "acknowledged writes survive the kills"
    print(
        f"\nfailover after SIGKILL of the controller (kill -> new controller ready):\n"
        f"  pysyncobj defaults: {[round(g, 2) for g in default_gaps]} s, term +{default_jumps}\n"
        f"  raftlog settings:   {[round(g, 2) for g in gaps]} s, term +{jumps}, "
        f"median {statistics.median(gaps):.2f} s"
    )
    # The measured median is 0.5-0.6 s on an idle box; the bound leaves room for a loaded CI
    # machine while still catching the default settings' dropped first vote (1.6-2.1 s, +2).
    assert statistics.median(gaps) < 2.0


def test_4_sigstopped_controller_is_fenced_after_sigcont(tmp_path: Path) -> None:
    # A short connectionTimeout makes the others drop their links to the frozen node, so it
    # cannot catch up from messages buffered before the new controller snapshotted: it must
    # install a snapshot after SIGCONT (the scenario of findings §8-A).
    with RaftCluster(tmp_path, settings={"connection_timeout_s": LINK_TIMEOUT_S}) as cluster:
        cluster.start()
        old = cluster.current_controller(15)
        assert old.request("propose", broker=1)["ok"]
        old_term = old.request("status")["status"]["controller_term"]

        old.signal(signal.SIGSTOP)
        stopped_at = time.time()
        others = [n.node_id for n in cluster.voters() if n is not old]
        new, event = cluster.wait_controller(10, after=stopped_at, among=others)
        assert event["term"] > old_term
        time.sleep(max(0.0, stopped_at + LINK_TIMEOUT_S + 1.0 - time.time()))
        for broker in range(500, 510):
            assert new.request("propose", broker=broker)["ok"]
        for node_id in others:
            assert cluster.nodes[node_id].request("compact")["ok"]
        time.sleep(0.3)  # the journals drop what the snapshots cover on the next tick

        # Queued while frozen, handled the moment it resumes, racing its tick thread.
        propose = old.send_only("propose", broker=900)
        stale = old.send_only("propose_stale", broker=901, term=old_term)
        barrier = old.send_only("read_barrier")
        old.signal(signal.SIGCONT)

        proposed = old.response(propose)
        assert proposed.get("error") == "NotControllerError" or (
            proposed.get("ok") is False and proposed.get("error_code") == errors.NOT_CONTROLLER
        ), proposed
        stale_result = old.response(stale)
        assert not stale_result.get("ok"), stale_result
        read = old.response(barrier)
        # A barrier that timed out answered nothing (the node, CPU-starved, had not yet heard
        # of the new term within the driver's 5 s), and neither did one whose outcome became
        # unknown when its tick thread saw the leader change (ProposalTimeoutError, seen in a
        # fresh-clone run): ask again until it answers. What it must never do is answer with
        # the image it had before it was frozen.
        no_answer = ("QuorumTimeoutError", "ProposalTimeoutError")
        deadline = time.monotonic() + 60
        while read.get("error") in no_answer and time.monotonic() < deadline:
            read = old.request("read_barrier")
        assert read.get("error") == "NotControllerError" or 509 in read.get("brokers", ()), read

        target = new.request("image")["version"]
        deadline = time.monotonic() + 60
        while old.request("image")["version"] < target:
            assert time.monotonic() < deadline, "the old controller did not catch up"
            time.sleep(0.05)
        expected = [1, *range(500, 510)]
        for node in cluster.voters():
            assert brokers(node) == expected, (node.node_id, brokers(node))
        assert not old.request("status")["status"]["controller_ready"]
        # It caught up from the new controller's snapshot: the path of findings §8-A. (The
        # counter is published at the end of the tick that installed it: poll.)
        while old.request("status")["raft"]["snapshots_installed"] < 1:
            assert time.monotonic() < deadline, "no snapshot was installed"
            time.sleep(0.05)
