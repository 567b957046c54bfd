"""RaftQuorum through trio: the Quorum interface over a real three-voter pysyncobj group.

Goal: a Raft quorum behaves like LocalQuorum to its callers (images published whole, results
after the image, bounded waits), only the ready controller proposes or serves linearizable
reads, observers follow the log, restarts after snapshots lose nothing, and a node refuses to
start without a secret or on another node's data. Method: voters and observers in this process
on 127.0.0.1 (each with its own tick thread), real files under tmp_path.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from pysyncobj.config import FAIL_REASON

from raftlog.config import QuorumVoter, ServerConfig
from raftlog.metadata import errors
from raftlog.metadata.records import BecomeController, RegisterBroker
from raftlog.quorum.interface import (
    NotControllerError,
    Quorum,
    QuorumBusyError,
    QuorumError,
    QuorumFailedError,
)
from raftlog.quorum.raft import RaftConfigError, RaftQuorum
from raftlog.quorum.raft_settings import RaftSettings
from raftlog.quorum.raft_storage import JOURNAL_FILE_NAME, SNAPSHOT_FILE_NAME
from raftlog.quorum.raft_testing import (
    SECRET,
    free_port,
    open_quorums,
    wait_for_controller,
    wait_until,
)

TIMEOUT_S = 10.0


def broker(node_id: int) -> RegisterBroker:
    return RegisterBroker(node_id, "127.0.0.1", 9000 + node_id, None, f"inc-{node_id}")


async def test_voters_and_observer_replicate_and_only_the_controller_proposes(
    tmp_path: Path,
) -> None:
    async with open_quorums(tmp_path, voters=3, observers=1) as quorums:
        protocol_check: list[Quorum] = list(quorums)
        assert len(protocol_check) == 4
        controller = await wait_for_controller(quorums[:3], TIMEOUT_S)
        followers = [q for q in quorums[:3] if q is not controller]
        observer = quorums[3]
        for node_id in range(1, 21):
            result = await controller.propose(broker(node_id))
            assert result.ok, result
            # LocalQuorum's promise: the result comes after the image that has it.
            assert node_id in controller.image.brokers
        image = await controller.read_barrier()
        for quorum in quorums:
            seen = await quorum.wait_for_version(image.version, TIMEOUT_S)
            assert sorted(seen.brokers) == list(range(1, 21))
            assert seen.controller_node_id == controller.node_id

        for quorum in [*followers, observer]:
            assert not quorum.controller_ready
            assert quorum.leader_node_id == controller.node_id
            with pytest.raises(NotControllerError) as raised:
                await quorum.propose(broker(99))
            assert raised.value.leader_node_id == controller.node_id
            with pytest.raises(NotControllerError):
                await quorum.read_barrier()
        with pytest.raises(QuorumError, match="proposed by the Raft quorum itself"):
            await controller.propose(BecomeController(99, controller.node_id))

        status = controller.status()
        assert (status.role, status.leader_node_id, status.controller_ready) == (
            "leader", controller.node_id, True,
        )  # fmt: skip
        assert status.term == status.controller_term >= 1
        assert [v.node_id for v in status.voters] == [1, 2, 3]
        assert all(v.connected and v.match_index is not None for v in status.voters)
        assert [o.node_id for o in status.observers] == [101]
        assert observer.status().role == "observer"
        assert followers[0].status().role == "follower"


async def test_concurrent_proposals_and_barrier_reads_share_the_log(tmp_path: Path) -> None:
    async with open_quorums(tmp_path, voters=3) as quorums:
        controller = await wait_for_controller(quorums, TIMEOUT_S)
        barriers = 0
        real_submit_barrier = controller.syncobj.submit_barrier

        def counting_submit_barrier(callback: object) -> None:
            nonlocal barriers
            barriers += 1
            real_submit_barrier(callback)

        controller.syncobj.submit_barrier = counting_submit_barrier  # type: ignore[method-assign]
        versions: list[int] = []

        async def read() -> None:
            versions.append((await controller.read_barrier()).version)

        async with trio.open_nursery() as nursery:
            for node_id in range(100, 150):
                nursery.start_soon(controller.propose, broker(node_id))
            for _ in range(20):
                nursery.start_soon(read)
        assert len(controller.image.brokers) == 50
        assert len(versions) == 20
        assert barriers <= 10, f"{barriers} barriers for 20 concurrent reads"


def _snapshots(quorum: RaftQuorum) -> int:
    """Snapshots this voter holds: written by itself or installed from the leader."""
    view = quorum.syncobj.view
    return 0 if view is None else view.snapshots_written + view.snapshots_installed


async def test_restart_after_snapshots_loses_nothing(tmp_path: Path) -> None:
    settings = RaftSettings(log_compaction_min_entries=20)
    async with open_quorums(tmp_path, voters=3, settings=settings) as quorums:
        controller = await wait_for_controller(quorums, TIMEOUT_S)
        for node_id in range(1, 61):
            assert (await controller.propose(broker(node_id))).ok
        image = await controller.read_barrier()
        for quorum in quorums:
            await quorum.wait_for_version(image.version, TIMEOUT_S)
        # Compaction runs on each node's tick thread, so a loaded machine may lag a little.
        with trio.move_on_after(TIMEOUT_S):
            # The counter is written by pysyncobj's tick thread: nothing to wait on but a poll.
            # A voter that lagged may get the leader's snapshot instead of writing its own.
            while min(_snapshots(q) for q in quorums) < 1:  # noqa: ASYNC110
                await trio.sleep(0.05)
        snapshots = [_snapshots(q) for q in quorums]
        assert min(snapshots) >= 1, snapshots
        before = [dataclasses.replace(q.image) for q in quorums]
    for node_id in (1, 2, 3):
        data = tmp_path / f"node-{node_id}" / "__cluster_metadata-0"
        assert (data / SNAPSHOT_FILE_NAME).exists()
        assert len((data / JOURNAL_FILE_NAME).read_bytes()) < 60 * 80, "journal was compacted"
    # Same directories, same ports are not needed: open_quorums picks new ones, and the Raft
    # log does not record addresses (no dynamic membership).
    async with open_quorums(tmp_path, voters=3, settings=settings) as quorums:
        for quorum, old in zip(quorums, before, strict=True):
            # Replayed locally (snapshot + journal) before any election.
            assert quorum.image.version >= old.version - 1
        controller = await wait_for_controller(quorums, TIMEOUT_S)
        assert sorted(controller.image.brokers) == list(range(1, 61))
        assert controller.image.controller_term > before[0].controller_term


async def test_secret_is_required(tmp_path: Path) -> None:
    voters = [QuorumVoter(1, "127.0.0.1", free_port())]
    for secret in (None, ""):
        with pytest.raises(RaftConfigError, match=r"raft\.secret"):
            RaftQuorum(node_id=1, voters=voters, metadata_dir=tmp_path, secret=secret)
    config = ServerConfig.from_properties(
        {
            "node.id": "1",
            "process.roles": "broker,controller",
            "listeners": f"PLAINTEXT://127.0.0.1:{free_port()},CONTROLLER://127.0.0.1:{voters[0].port}",
            "controller.quorum.voters": f"1@127.0.0.1:{voters[0].port}",
            "log.dirs": str(tmp_path),
        }
    )
    with pytest.raises(RaftConfigError, match=r"raft\.secret"):
        RaftQuorum.from_config(config)


async def test_cluster_id_is_required_for_a_raft_quorum(tmp_path: Path) -> None:
    """Nodes that each made one up reported three ClusterIds for one cluster."""
    ports = [free_port() for _ in range(3)]
    properties = {
        "node.id": "1",
        "process.roles": "broker,controller",
        "listeners": f"PLAINTEXT://127.0.0.1:{free_port()},CONTROLLER://127.0.0.1:{ports[0]}",
        "controller.quorum.voters": ",".join(
            f"{i + 1}@127.0.0.1:{port}" for i, port in enumerate(ports)),
        "log.dirs": str(tmp_path),
        "raft.secret": SECRET,
    }
    with pytest.raises(RaftConfigError, match=r"cluster\.id is required"):
        RaftQuorum.from_config(ServerConfig.from_properties(properties))
    RaftQuorum.from_config(ServerConfig.from_properties({**properties, "cluster.id": "c1"}))


async def test_data_directory_of_another_cluster_or_node_is_refused(tmp_path: Path) -> None:
    async with open_quorums(tmp_path, voters=1) as quorums:
        await wait_for_controller(quorums, TIMEOUT_S)
    voters = [QuorumVoter(1, "127.0.0.1", free_port())]
    other_cluster = RaftQuorum(
        node_id=1, voters=voters, metadata_dir=tmp_path / "node-1", secret=SECRET,
        cluster_id="another-cluster",
    )  # fmt: skip
    with pytest.raises(RaftConfigError, match="belongs to cluster"):
        async with other_cluster:
            pass
    voters = [QuorumVoter(2, "127.0.0.1", free_port())]
    other_node = RaftQuorum(
        node_id=2, voters=voters, metadata_dir=tmp_path / "node-1", secret=SECRET
    )
    with pytest.raises(RaftConfigError, match=r"belongs to node\.id 1"):
        async with other_node:
            pass


async def test_observer_never_becomes_controller_and_voter_role_is_checked(
    tmp_path: Path,
) -> None:
    voters = [QuorumVoter(1, "127.0.0.1", free_port())]
    with pytest.raises(RaftConfigError, match=r"not in controller\.quorum\.voters"):
        RaftQuorum(node_id=5, voters=voters, metadata_dir=tmp_path, secret=SECRET)
    with pytest.raises(RaftConfigError, match="is a voter"):
        RaftQuorum(node_id=1, voters=voters, metadata_dir=tmp_path, secret=SECRET, is_voter=False)
    async with open_quorums(tmp_path, voters=1, observers=1) as quorums:
        voter, observer = quorums
        await wait_for_controller([voter], TIMEOUT_S)
        assert (await voter.propose(broker(1))).ok
        image = await observer.wait_for_version(voter.image.version, TIMEOUT_S)
        assert 1 in image.brokers
        await observer.wait_caught_up(TIMEOUT_S)
        assert not observer.controller_ready and observer.leader_node_id == 1
        result = await voter.propose(broker(1))  # same broker, same incarnation: a no-op
        assert result.error_code == errors.NONE


async def test_corrupt_snapshot_refuses_to_start(tmp_path: Path) -> None:
    settings = RaftSettings(log_compaction_min_entries=10)
    async with open_quorums(tmp_path, voters=1, settings=settings) as quorums:
        controller = await wait_for_controller(quorums, TIMEOUT_S)
        for node_id in range(1, 31):
            assert (await controller.propose(broker(node_id))).ok
        view = controller.syncobj
        await wait_until(lambda: bool(view.view and view.view.snapshots_written), TIMEOUT_S)
    snapshot = tmp_path / "node-1" / "__cluster_metadata-0" / SNAPSHOT_FILE_NAME
    data = bytearray(snapshot.read_bytes())
    data[len(data) // 2] ^= 0xFF
    snapshot.write_bytes(bytes(data))
    with pytest.raises(QuorumFailedError, match="snapshot"):
        async with open_quorums(tmp_path, voters=1, settings=settings):
            pass


async def test_busy_when_raft_queue_is_full_or_too_many_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_quorums(tmp_path, voters=1) as quorums:
        controller = await wait_for_controller(quorums, TIMEOUT_S)

        def full(payload: bytes, callback: Callable[[object, int], None]) -> None:
            callback(None, FAIL_REASON.QUEUE_FULL)  # what pysyncobj does on a full queue

        monkeypatch.setattr(controller.syncobj, "submit", full)
        with pytest.raises(QuorumBusyError, match="queue is full"):
            await controller.propose(broker(1))
        # A proposal Raft never answers holds the only pending slot.
        monkeypatch.setattr(controller.syncobj, "submit", lambda payload, callback: None)
        monkeypatch.setattr(controller, "_pending_max", 1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(controller.propose, broker(2))
            await wait_until(lambda: len(controller._waiters) == 1, TIMEOUT_S)
            with pytest.raises(QuorumBusyError, match="already waiting"):
                await controller.propose(broker(3))
            nursery.cancel_scope.cancel()


async def test_raft_port_in_use_fails_open(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        quorum = RaftQuorum(
            node_id=1,
            voters=[QuorumVoter(1, "127.0.0.1", port)],
            metadata_dir=tmp_path,
            secret=SECRET,
            settings=RaftSettings(bind_attempts=2, bind_retry_s=0.05),
        )
        with pytest.raises(QuorumError, match="cannot bind"):
            async with quorum:
                pass
