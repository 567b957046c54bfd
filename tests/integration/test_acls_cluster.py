"""ACLs in a 3-node cluster: an ACL created through a node that is not the controller (the
request is forwarded in an Envelope) is enforced by every node, and so is its removal. The
cluster runs with ``allow.everyone.if.no.acl.found=true`` (the harness probes anonymously), so
a resource no ACL names is open and a DENY closes it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import FIND_COORDINATOR
from raftlog.protocol.schemas_security import SASL_AUTHENTICATE, SASL_HANDSHAKE
from tests.integration.cluster_harness import Cluster, running_cluster, wait_for, wait_until
from tests.integration.test_sasl_users import _Raw

PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
GROUP_DENIED = int(ErrorCode.GROUP_AUTHORIZATION_FAILED)


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path / "cluster", extra_properties={
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "true",
        "sasl.jaas.config": f'{PLAIN_MODULE} required user_alice="alice-pw";'}) as cluster:
        yield cluster


def _find_group_coordinator(port: int) -> int:
    raw = _Raw(port)
    shake = raw.call(SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
    assert shake is not None and shake.error_code == 0
    login = raw.call(SASL_AUTHENTICATE, 1, {"auth_bytes": b"\0alice\0alice-pw"})
    assert login is not None and login.error_code == 0
    answer = raw.call(FIND_COORDINATOR, 2, {"key": "shared-group", "key_type": 0})
    assert answer is not None
    return int(answer.error_code)


def _acls(bootstrap: str, config: Path, *args: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "raftlog", "acls", *args, "--bootstrap-server", bootstrap,
         "--command-config", str(config)], capture_output=True, text=True, timeout=60,
        check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_acls_replicate_to_every_node(secured: Cluster) -> None:
    # A node's own properties name the cluster's secret: the tool logs in as the admin.
    config = next(iter(secured.nodes.values())).directory / "server.properties"
    ports = [node.address[1] for node in secured.nodes.values()]
    assert all(_find_group_coordinator(port) != GROUP_DENIED for port in ports)
    controller = wait_for(secured.quorum_leader, 10, "a ready controller")
    other = next(n for n in secured.nodes.values() if n.node_id != controller)
    _acls(other.bootstrap, config, "add", "--deny-principal", "User:alice", "--operation",
          "Describe", "--group", "shared-group")
    wait_until(lambda: all(_find_group_coordinator(port) == GROUP_DENIED for port in ports),
               30, "every node refuses alice")
    _acls(other.bootstrap, config, "remove", "--group", "shared-group")
    wait_until(lambda: all(_find_group_coordinator(port) != GROUP_DENIED for port in ports),
               30, "every node allows alice again")
