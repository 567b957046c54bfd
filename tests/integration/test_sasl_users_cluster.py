"""SCRAM users in a 3-node cluster: AlterUserScramCredentials sent to a node that is not the
controller is forwarded to it in an Envelope; every node then describes the user and logs it
in (the credential is in every node's image)."""

from __future__ import annotations

import subprocess
import sys

from tests.integration.cluster_harness import Cluster, cluster3, wait_for, wait_until
from tests.integration.test_sasl_users import _Raw

__all__ = ["cluster3"]


def _users(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raftlog", "users", *args,
                           "--bootstrap-server", bootstrap],
                          capture_output=True, text=True, timeout=60, check=False)


def test_users_added_through_any_node_log_in_on_every_node(cluster3: Cluster) -> None:
    controller = wait_for(cluster3.quorum_leader, 10, "a ready controller")
    other = next(n for n in cluster3.nodes.values() if n.node_id != controller)
    added = _users(other.bootstrap, "add", "zoe", "--mechanism", "SCRAM-SHA-256",
                   "--password", "zoe-secret")
    assert added.returncode == 0, added.stderr
    assert "forwarding" not in other.tail()  # no forwarding failure logged

    def everywhere() -> bool:
        return all("zoe: SCRAM-SHA-256 (iterations 8192)" in _users(
            node.bootstrap, "list", "zoe").stdout for node in cluster3.nodes.values())

    wait_until(everywhere, 10, "every node describes zoe")
    for node in cluster3.nodes.values():
        assert _Raw(node.address[1]).scram("SCRAM-SHA-256", "zoe", "zoe-secret") == (0, None)
    deleted = _users(other.bootstrap, "delete", "zoe")
    assert deleted.returncode == 0, deleted.stderr
    wait_until(lambda: all(_users(node.bootstrap, "list", "zoe").returncode == 1
                           for node in cluster3.nodes.values()), 10, "zoe gone everywhere")
    for node in cluster3.nodes.values():
        assert _Raw(node.address[1]).scram("SCRAM-SHA-256", "zoe", "zoe-secret")[0] == 58
