"""Guards raftlog puts around pysyncobj, each shown against the defect it closes.

Goal: reproduce on raw pysyncobj 0.3.17 first, then show the guard closing it:

* no fsync anywhere (findings §6): count real ``os.fsync`` calls per committed entry;
* pickle over an unauthenticated port (findings §5): a pickled payload that creates a file;
* a journal without a snapshot file (findings §6): restart after compaction comes back empty;
* the first RequestVote over an idle follower link is dropped (findings §8-B): the follower
  link's read age, and the term the failover ends in.

Method: nodes in this process on 127.0.0.1 (raw ``SyncObj`` with its own tick thread, or
raftlog's), real files under tmp_path; fsyncs are counted by wrapping ``os.fsync`` and naming
the file behind each descriptor.
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import struct
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.batteries import ReplCounter
from pysyncobj.journal import ResizableFile

from raftlog.metadata.records import RegisterBroker
from raftlog.metadata.state import MetadataStateMachine
from raftlog.quorum.raft_events import LEADER
from raftlog.quorum.raft_settings import RaftSettings, UnsafeRaftConfigError, build_conf
from raftlog.quorum.raft_storage import JOURNAL_FILE_NAME, SNAPSHOT_FILE_NAME
from raftlog.quorum.raft_syncobj import RaftSyncObj, make_syncobj
from raftlog.quorum.raft_testing import (
    SECRET,
    free_port,
    open_quorums,
    wait_for_controller,
    wait_until,
)

TIMEOUT_S = 10.0


def wait(condition: Callable[[], bool], timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


@pytest.fixture
def destroy() -> Iterator[Callable[[Any], Any]]:
    """Registers autoTick SyncObjs to stop (and join) at teardown."""
    nodes: list[Any] = []
    yield lambda node: nodes.append(node) or node
    for node in nodes:
        node.destroy_synchronous()


def raw_cluster(
    tmp_path: Path, destroy: Callable[[Any], Any], count: int, **conf: Any
) -> list[tuple[SyncObj, ReplCounter]]:
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(count)]
    nodes = []
    for i, address in enumerate(addresses):
        counter = ReplCounter()
        options: dict[str, Any] = {"appendEntriesUseBatch": False, **conf}
        for key in ("journalFile", "fullDumpFile"):
            if options.get(key):
                options[key] = str(tmp_path / f"{options[key]}-{i}")
        peers = [a for a in addresses if a != address]
        node = destroy(SyncObj(address, peers, SyncObjConf(**options), consumers=[counter]))
        nodes.append((node, counter))
    wait(lambda: any(node._isLeader() for node, _ in nodes))
    return nodes


# --- No fsync -------------------------------------------------------------------------------


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """fsyncs and pysyncobj mmap flushes, by file path, from every thread."""
    counts: Counter[str] = Counter()
    real_fsync = os.fsync
    real_flush = ResizableFile.flush

    def fsync(fd: int) -> None:
        counts[os.readlink(f"/proc/self/fd/{fd}")] += 1
        real_fsync(fd)

    def flush(self: ResizableFile) -> None:
        counts["mmap:" + self._ResizableFile__fileName] += 1
        real_flush(self)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "fdatasync", fsync)
    monkeypatch.setattr(ResizableFile, "flush", flush)
    return counts


COMMITS = 30


def test_2_reproduced_raw_pysyncobj_never_fsyncs(
    tmp_path: Path, destroy: Callable[[Any], Any], fsyncs: Counter[str]
) -> None:
    nodes = raw_cluster(tmp_path, destroy, 3, journalFile="journal", fullDumpFile="dump")
    leader_counter = next(counter for node, counter in nodes if node._isLeader())
    fsyncs.clear()
    for _ in range(COMMITS):
        leader_counter.inc(sync=True, timeout=5)
    wait(lambda: all(counter.get() == COMMITS for _, counter in nodes))
    assert sum(fsyncs.values()) == 0, f"raw pysyncobj synced something: {fsyncs}"


async def test_2_closed_every_committed_entry_is_fsynced_on_every_voter(
    tmp_path: Path, fsyncs: Counter[str]
) -> None:
    async with open_quorums(tmp_path, voters=3) as quorums:
        controller = await wait_for_controller(quorums, TIMEOUT_S)
        # Every voter connected and caught up before counting.
        await wait_until(lambda: all(v.lag == 0 for v in controller.status().voters), TIMEOUT_S)
        fsyncs.clear()
        for node_id in range(COMMITS):
            assert (await controller.propose(RegisterBroker(node_id, "h", 1, None, "i"))).ok
        for quorum in quorums:
            await quorum.wait_for_version(controller.image.version, TIMEOUT_S)
    journals = {
        q.node_id: str(tmp_path / f"node-{q.node_id}" / "__cluster_metadata-0" / JOURNAL_FILE_NAME)
        for q in quorums
    }
    per_voter = {node_id: fsyncs[path] for node_id, path in journals.items()}
    print(f"journal fsyncs per voter for {COMMITS} commits: {per_voter}")
    # Sequential proposals: entry i+1 exists only once entry i is committed, and committing i
    # took two fsyncs made after i was appended, by the leader (before counting it) and by a
    # follower (before acknowledging it); so the commits' fsyncs are distinct events. Not per
    # voter: a follower that lags (a busy machine) receives several entries in one
    # AppendEntries and rightly fsyncs them together, as does a leader after an election.
    assert sum(per_voter.values()) >= 2 * COMMITS, per_voter


# --- Pickle over an unauthenticated port ----------------------------------------------------


class CreateFile:
    """Unpickling this creates ``path``: what any code execution could do."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


def send_pickled(address: str, payload: object) -> None:
    host, port = address.rsplit(":", 1)
    data = zlib.compress(pickle.dumps(payload, protocol=2))
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(struct.pack("i", len(data)) + data)
        time.sleep(0.3)  # let the node's tick thread read it


def test_6_reproduced_raw_pysyncobj_without_password_runs_pickled_code(
    tmp_path: Path, destroy: Callable[[Any], Any]
) -> None:
    address = f"127.0.0.1:{free_port()}"
    destroy(SyncObj(address, [], SyncObjConf()))
    marker = tmp_path / "created-by-the-attacker"
    send_pickled(address, CreateFile(marker))
    wait(marker.exists, 5)


async def test_6_closed_unauthenticated_pickle_is_refused_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "created-by-the-attacker"
    with caplog.at_level(logging.WARNING, logger="raftlog.quorum.raft_syncobj"):
        async with open_quorums(tmp_path, voters=1) as quorums:
            quorum = await wait_for_controller(quorums, TIMEOUT_S)
            address = f"127.0.0.1:{quorum.status().voters[0].address.rsplit(':', 1)[1]}"
            # The key exchange message, then the payload: neither is a valid Fernet token.
            await trio.to_thread.run_sync(send_pickled, address, CreateFile(marker))
            assert quorum.syncobj.transport.rejected_count >= 1
            assert quorum.controller_ready, "the node keeps working"
    assert not marker.exists()
    assert any("failed authentication" in r.getMessage() for r in caplog.records)


def test_6_closed_pysyncobj_conf_without_password_is_refused(tmp_path: Path) -> None:
    conf = build_conf(
        RaftSettings(),
        journal_file=tmp_path / JOURNAL_FILE_NAME,
        snapshot_file=tmp_path / SNAPSHOT_FILE_NAME,
        password=SECRET,
        bind_address=None,
    )
    conf.password = None
    with pytest.raises(UnsafeRaftConfigError, match="password must be set"):
        RaftSyncObj(f"127.0.0.1:{free_port()}", [], conf, machine=MetadataStateMachine(), node_id=1)


# --- Journal without a snapshot file --------------------------------------------------------


def test_7_reproduced_raw_pysyncobj_journal_without_dump_loses_everything(
    tmp_path: Path, destroy: Callable[[Any], Any]
) -> None:
    address = f"127.0.0.1:{free_port()}"
    journal = str(tmp_path / "journal")
    counter = ReplCounter()
    conf = SyncObjConf(journalFile=journal, appendEntriesUseBatch=False)
    node = SyncObj(address, [], conf, consumers=[counter])
    wait(node._isLeader)
    for _ in range(30):
        counter.inc(sync=True, timeout=5)
    node.forceLogCompaction()
    wait(lambda: len(node._SyncObj__raftLog) < 10)
    node.destroy_synchronous()

    again = ReplCounter()
    restarted = destroy(SyncObj(address, [], SyncObjConf(journalFile=journal), consumers=[again]))
    wait(restarted._isLeader)
    time.sleep(0.3)
    assert again.get() == 0, "30 committed increments silently gone after restart"


def test_7_closed_journal_without_snapshot_file_is_refused(tmp_path: Path) -> None:
    conf = build_conf(
        RaftSettings(),
        journal_file=tmp_path / JOURNAL_FILE_NAME,
        snapshot_file=tmp_path / SNAPSHOT_FILE_NAME,
        password=SECRET,
        bind_address=None,
    )
    conf.fullDumpFile = None
    with pytest.raises(UnsafeRaftConfigError, match="must both be set"):
        RaftSyncObj(f"127.0.0.1:{free_port()}", [], conf, machine=MetadataStateMachine(), node_id=1)
    # And raw pysyncobj's own defaults fail every check at once.
    with pytest.raises(UnsafeRaftConfigError, match=r"password.*useFork.*commandsWaitLeader"):
        RaftSyncObj(
            f"127.0.0.1:{free_port()}", [], SyncObjConf(journalFile="j"),
            machine=MetadataStateMachine(), node_id=1,
        )  # fmt: skip


# --- First vote over an idle follower link --------------------------------------------------

IDLE_TIMEOUT = RaftSettings(connection_timeout_s=1.0)


def term_after_leader_loss(
    tmp_path: Path, destroy: Callable[[Any], Any], keepalive_s: float | None
) -> tuple[int, int, float]:
    """Three voters idle for longer than connectionTimeout, then the leader dies.

    Returns (term jump, largest follower-link read age before the kill, failover seconds).
    """
    settings = IDLE_TIMEOUT.replace(keepalive_interval_s=keepalive_s)
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    nodes: list[RaftSyncObj] = []
    for i, address in enumerate(addresses):
        data = tmp_path / f"k{keepalive_s}-{i}"
        data.mkdir(parents=True)
        nodes.append(
            make_syncobj(
                self_address=address,
                peer_addresses=[a for a in addresses if a != address],
                data_dir=data,
                password=SECRET,
                machine=MetadataStateMachine(),
                node_id=i + 1,
                settings=settings,
                bind_address=address,
            )
        )
    registered = [destroy(node) for node in nodes]
    wait(lambda: any(n._isLeader() for n in registered))
    leader = next(n for n in registered if n._isLeader())
    followers = [n for n in registered if n is not leader]
    time.sleep(settings.connection_timeout_s * 1.6)
    ages = []
    for follower in followers:
        other = next(f for f in followers if f is not follower)
        connection = follower.transport._connections[other.selfNode]
        ages.append(time.monotonic() - connection._TcpConnection__lastReadTime)
    term = leader.raftCurrentTerm
    killed = time.monotonic()
    leader.destroy_synchronous()
    wait(lambda: any(f._SyncObj__raftState == LEADER for f in followers), 15)
    failover_s = time.monotonic() - killed
    new_leader = next(f for f in followers if f._SyncObj__raftState == LEADER)
    return new_leader.raftCurrentTerm - term, max(ages), failover_s


def test_8b_reproduced_idle_follower_link_drops_the_first_vote(
    tmp_path: Path, destroy: Callable[[Any], Any]
) -> None:
    jump, age, failover_s = term_after_leader_loss(tmp_path, destroy, keepalive_s=None)
    print(f"no keepalive: link idle {age:.2f} s, failover {failover_s:.2f} s, term +{jump}")
    assert age > IDLE_TIMEOUT.connection_timeout_s
    assert jump >= 2, "the first RequestVote was dropped: a second election round was needed"


def test_8b_closed_keepalive_keeps_follower_links_alive(
    tmp_path: Path, destroy: Callable[[Any], Any]
) -> None:
    jumps = []
    for attempt in range(2):  # a genuine split vote can also cost a round: allow one retry
        jump, age, failover_s = term_after_leader_loss(tmp_path / str(attempt), destroy, 0.3)
        print(f"keepalive: link idle {age:.2f} s, failover {failover_s:.2f} s, term +{jump}")
        assert age < IDLE_TIMEOUT.connection_timeout_s
        jumps.append(jump)
        if jump == 1:
            break
    assert 1 in jumps, jumps
