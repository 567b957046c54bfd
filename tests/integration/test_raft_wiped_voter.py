"""A voter that comes back with an empty disk cannot elect a stale leader (issue 19).

Goal: Raft's safety needs voters that never forget. Voter 3 misses an entry that voters 1 and 2
commit (it is down); then 2 loses its disk and 1 goes down, and 3 and the wiped 2 start. Before
the rejoin guard, wiped 2 voted for stale 3 (an empty log is behind every candidate), 3 became
controller without the committed entry and, when 1 came back, truncated it there too: committed
metadata lost. Now the wiped voter neither votes nor stands until it has caught up from a leader
elected without it, so the quorum waits for voter 1, elects a leader that holds the entry, and
nothing is lost.
Method: ``raft_node`` processes on 127.0.0.1 (``RaftCluster``), SIGKILL and a deleted data
directory. (Not SIGSTOP for voter 3: the kernel would buffer the leader's messages to it.)
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from raftlog.quorum.raft_testing import RaftCluster, RaftNodeProcess

STALE_WINDOW_S = 8.0  # several election timeouts: the stale voter would have won by then


def brokers(node: RaftNodeProcess) -> list[int]:
    seen: list[int] = node.request("image")["brokers"]
    return seen


def test_a_wiped_voter_does_not_vote_a_stale_candidate_into_leadership(tmp_path: Path) -> None:
    with RaftCluster(tmp_path) as cluster:
        cluster.start()
        one, two, three = (cluster.nodes[i] for i in (1, 2, 3))
        leader = cluster.current_controller(20)
        assert leader.request("propose", broker=11)["ok"]
        for node in (one, two, three):
            cluster.wait_caught_up(node, 20)

        three.kill()  # 3 misses what 1 and 2 commit next
        leader = cluster.current_controller(20)
        assert leader.request("propose", broker=22)["ok"]  # committed on 1 and 2 only

        two.kill()
        shutil.rmtree(two.properties["log.dirs"])  # 2's disk is replaced
        one.kill()
        three.start()
        two.start()
        assert 22 not in brokers(three), "voter 3 was meant to miss the entry"

        deadline = time.monotonic() + STALE_WINDOW_S
        while time.monotonic() < deadline:
            for node in (two, three):
                status = node.request("status")["status"]
                assert not status["controller_ready"], (
                    f"node {node.node_id} became controller with voter 1 down: the wiped "
                    f"voter 2 voted (3's image: {brokers(three)})\n{cluster.logs()}")
            time.sleep(0.1)
        assert "lost its data" in two.log_path.read_text(), cluster.logs()

        one.start()
        cluster.current_controller(30)
        for node in (one, two, three):
            cluster.wait_caught_up(node, 30)
            assert 22 in brokers(node), f"node {node.node_id} lost the committed entry"
        marker = Path(two.properties["log.dirs"]) / "__cluster_metadata-0" / "raft.rejoin"
        deadline = time.monotonic() + 20
        while marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)  # the guard finishes on a tick after the leader's probe reply
        assert not marker.exists(), cluster.logs()
        assert "votes again" in two.log_path.read_text(), cluster.logs()
