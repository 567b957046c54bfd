"""Raft safety corrections over pysyncobj 0.3.17, reproduced first and then shown closed.

Goal: each measured defect from ``pysyncobj-findings.md`` that is about what a node *does* with
messages (not timing) is reproduced deterministically on raw pysyncobj (or with raftlog's guard
disabled) and shown closed in :class:`RaftSyncObj`:

* 8-A: a deposed leader applies and acknowledges its own uncommitted write (and a barrier
  read) when an AppendEntries carries a snapshot chunk or ``serialized: None``;
* 8-C: overlapping AppendEntries truncate already-applied entries;
* two nodes believing they lead: a stale leader's proposal must never change the image;
  a partitioned leader must step down within about a second (leaderFallbackTimeout);
* no fsync: a follower acknowledges only fsynced entries, a leader counts only fsynced ones.

Method: ``autoTick=False`` nodes ticked by the test thread. The 8-A/8-C tests feed synthetic
messages from peers that do not exist (their ports are 1 and 2, and a node only dials peers with
a smaller address string, so nothing connects); the leadership tests run three real nodes over
loopback and "stop" one by not ticking it, which is what SIGSTOP does to its tick thread.
"""

from __future__ import annotations

import functools
import gzip
import logging
import pickle
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.batteries import ReplCounter
from pysyncobj.config import FAIL_REASON
from pysyncobj.node import TCPNode

from raftlog.metadata import errors, state
from raftlog.metadata.records import Command, RegisterBroker, encode_command
from raftlog.metadata.state import ApplyResult, MetadataStateMachine
from raftlog.metadata.testing import MachineDriver
from raftlog.quorum.raft_events import CANDIDATE, FOLLOWER, LEADER, Submission
from raftlog.quorum.raft_settings import PYSYNCOBJ_DEFAULT_SETTINGS, RaftSettings
from raftlog.quorum.raft_storage import DurableJournal, RaftSnapshot, encode_snapshot
from raftlog.quorum.raft_syncobj import RaftApplyError, RaftSyncObj, make_syncobj
from raftlog.quorum.raft_testing import free_port

SECRET = "unit-test-secret"
GHOST_B = "127.0.0.1:1"
GHOST_C = "127.0.0.1:2"
TICK_S = 0.002

Outcome = list[tuple[object, int]]


def recorder() -> tuple[Outcome, Callable[[object, int], None]]:
    outcomes: Outcome = []
    return outcomes, lambda result, error: outcomes.append((result, error))


def broker(node_id: int) -> RegisterBroker:
    return RegisterBroker(node_id, "127.0.0.1", 9000 + node_id, None, f"inc-{node_id}")


def command(node_id: int, term: int, request_id: str) -> bytes:
    return encode_command(Command(broker(node_id), term, request_id))


def raft_node(
    tmp_path: Path,
    node_id: int,
    address: str,
    peers: list[str],
    settings: RaftSettings | None = None,
) -> RaftSyncObj:
    data = tmp_path / f"node-{node_id}"
    data.mkdir(exist_ok=True)
    return make_syncobj(
        self_address=address,
        peer_addresses=peers,
        data_dir=data,
        password=SECRET,
        machine=MetadataStateMachine(),
        node_id=node_id,
        settings=settings or RaftSettings(),
        bind_address=address,
        auto_tick=False,
    )


def raw_node(address: str, peers: list[str], counter: ReplCounter) -> SyncObj:
    conf = SyncObjConf(
        autoTick=False, appendEntriesUseBatch=False, password=SECRET, commandsWaitLeader=False
    )
    return SyncObj(address, peers, conf, consumers=[counter])


@pytest.fixture
def destroy() -> Iterator[Callable[[Any], Any]]:
    """Registers nodes to destroy at teardown (closes their sockets and files)."""
    nodes: list[Any] = []
    yield lambda node: nodes.append(node) or node
    for node in nodes:
        node._doDestroy()


def make_leader_alone(node: Any) -> None:
    """Elect ``node`` with a faked vote from GHOST_B: it now leads a log nobody else has."""
    ghost = TCPNode(GHOST_B)
    node._SyncObj__onNodeConnected(ghost)
    node._SyncObj__raftElectionDeadline = 0
    node.doTick(0)
    assert node._SyncObj__raftState == CANDIDATE
    node._SyncObj__onMessageReceived(ghost, {"type": "response_vote", "term": node.raftCurrentTerm})
    assert node._isLeader()


def deposing_message(node: Any, variant: str) -> dict[str, Any]:
    """AppendEntries from GHOST_C, the new leader one term later, whose log is far ahead."""
    message: dict[str, Any] = {
        "type": "append_entries",
        "term": node.raftCurrentTerm + 1,
        "commit_index": 100,
    }
    message["serialized"] = None if variant == "none" else (b"first chunk", True, False)
    return message


# --- 8-A ------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["none", "chunk"])
def test_8a_reproduced_raw_pysyncobj_deposed_leader_acknowledges_uncommitted_write(
    variant: str, destroy: Callable[[Any], Any]
) -> None:
    counter = ReplCounter()
    node = destroy(raw_node(f"127.0.0.1:{free_port()}", [GHOST_B, GHOST_C], counter))
    make_leader_alone(node)
    acked, on_write = recorder()
    counter.inc(callback=on_write)
    barrier, on_barrier = recorder()
    node._applyCommand(b"", on_barrier, 1)  # a replicated no-op: a "linearizable" barrier read
    node.doTick(0)  # appended at index 3 and 4 in term 1; no other node has them
    assert node.raftCommitIndex == 1 and acked == []

    node._SyncObj__onMessageReceived(TCPNode(GHOST_C), deposing_message(node, variant))
    node.doTick(0)

    # The defect: the uncommitted term-1 entries are marked committed and applied, and the
    # write is acknowledged SUCCESS; the barrier "read" succeeds on the deposed node.
    assert not node._isLeader()
    assert acked == [(1, FAIL_REASON.SUCCESS)]
    assert barrier == [(None, FAIL_REASON.SUCCESS)]
    assert counter.get() == 1

    # The new leader's snapshot (its committed state never had the write) then erases it.
    dump = ([{}, {"_ReplCounter__counter": 0}], (b"\x01", 50, 2), (b"\x01", 49, 2), set())
    node._SyncObj__onMessageReceived(
        TCPNode(GHOST_C),
        {**deposing_message(node, "none"), "serialized": (_gzip(dump), True, False)},
    )
    node._SyncObj__onMessageReceived(
        TCPNode(GHOST_C), {**deposing_message(node, "none"), "serialized": (b"", False, True)}
    )
    node.doTick(0)
    assert counter.get() == 0, "the acknowledged write is gone: it never committed"


@pytest.mark.parametrize("variant", ["none", "chunk"])
def test_8a_closed_deposed_leader_never_acknowledges_uncommitted_write(
    variant: str, tmp_path: Path, destroy: Callable[[Any], Any]
) -> None:
    node = destroy(raft_node(tmp_path, 1, f"127.0.0.1:{free_port()}", [GHOST_B, GHOST_C]))
    make_leader_alone(node)
    node.doTick(0)  # proposes BecomeController(1, 1)
    acked, on_write = recorder()
    node.submit(command(7, 1, "write-7"), Submission("write-7", on_write))
    barrier, on_barrier = recorder()
    node.submit_barrier(Submission(None, on_barrier))
    node.doTick(0)
    assert node.journal[-1][1] >= 4 and node.raftCommitIndex == 1

    node._SyncObj__onMessageReceived(TCPNode(GHOST_C), deposing_message(node, variant))
    for _ in range(3):
        node.doTick(0)

    assert not node._isLeader()
    assert node.raftCommitIndex == 1, "a snapshot chunk or serialized=None must not commit"
    assert acked == [] and barrier == []
    assert node._raft_machine.image.version == -1

    # The snapshot completes: the node takes the new leader's state, and the waiting write is
    # resolved as not applied (its request id is not in the restored window).
    driver = MachineDriver()
    driver.bootstrap([8], term=2)
    snapshot = RaftSnapshot((b"\x01", 50, 2), (b"\x01", 49, 2), (), driver.machine.snapshot())
    ghost = TCPNode(GHOST_C)
    start = {
        **deposing_message(node, "none"),
        "serialized": (encode_snapshot(snapshot), True, False),
    }
    node._SyncObj__onMessageReceived(ghost, start)
    node._SyncObj__onMessageReceived(ghost, {**start, "serialized": (b"", False, True)})
    node.doTick(0)

    assert node.raftLastApplied == 50 and node.raftCommitIndex == 50
    assert sorted(node._raft_machine.image.brokers) == [8]
    assert acked == [(None, Submission.NOT_APPLIED)]
    assert barrier == [(None, FAIL_REASON.UNKNOWN_OUTCOME)]


def _gzip(data: object) -> bytes:
    return gzip.compress(pickle.dumps(data, protocol=2))


# --- 8-C ------------------------------------------------------------------------------------


def _entries_message(
    prev: tuple[int, int], entries: list[tuple[bytes, int, int]]
) -> dict[str, Any]:
    return {
        "type": "append_entries",
        "term": 1,
        "commit_index": entries[-1][1],
        "prevLogIdx": prev[0],
        "prevLogTerm": prev[1],
        "entries": entries,
    }


def test_8c_overlapping_append_entries_no_longer_truncate(
    tmp_path: Path, destroy: Callable[[Any], Any], caplog: pytest.LogCaptureFixture
) -> None:
    entries = [(b"\x01", i, 1) for i in range(2, 6)]  # no-ops: both kinds of node apply them
    raw = destroy(raw_node(f"127.0.0.1:{free_port()}", [GHOST_B, GHOST_C], ReplCounter()))
    ours = destroy(raft_node(tmp_path, 1, f"127.0.0.1:{free_port()}", [GHOST_B, GHOST_C]))
    ghost = TCPNode(GHOST_C)
    with caplog.at_level(logging.CRITICAL):
        for node in (raw, ours):
            node._SyncObj__onMessageReceived(ghost, _entries_message((1, 0), entries))
            node.doTick(0)  # applies 2..5
            # The leader re-sends an overlapping range (it does after every acknowledgement).
            node._SyncObj__onMessageReceived(ghost, _entries_message((2, 1), entries[1:3]))
    truncations = [r for r in caplog.records if "truncating already-applied" in r.getMessage()]
    assert len(truncations) == 1, "raw pysyncobj truncates applied entries; raftlog does not"
    assert [e[1] for e in ours.journal[:]] == [1, 2, 3, 4, 5]
    assert ours.raftCommitIndex == 5


# --- Durability ordering (no fsync in pysyncobj) --------------------------------------------


def test_follower_acknowledges_only_fsynced_entries(
    tmp_path: Path, destroy: Callable[[Any], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = destroy(raft_node(tmp_path, 1, f"127.0.0.1:{free_port()}", [GHOST_B, GHOST_C]))
    acks: list[tuple[int, bool, int, bool]] = []

    def send(target: Any, message: dict[str, Any]) -> bool:
        if message.get("type") == "next_node_idx":
            journal = node.journal
            acks.append(
                (message["next_node_idx"], message["success"], journal[-1][1], journal.dirty)
            )
        return False

    monkeypatch.setattr(node.transport, "send", send)
    entries = [(b"\x00" + command(i, 0, f"r{i}"), i, 1) for i in range(2, 5)]
    node._SyncObj__onMessageReceived(TCPNode(GHOST_C), _entries_message((1, 0), entries))
    assert acks == [(5, True, 4, False)], "acknowledged index 4 with the journal fsynced"


def test_leader_commits_only_fsynced_entries(
    tmp_path: Path, destroy: Callable[[Any], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A one-voter group: the leader's own vote is the majority, so it commits alone.
    node = destroy(raft_node(tmp_path, 1, f"127.0.0.1:{free_port()}", []))
    durable = [0]
    real_flush = DurableJournal.flush

    def flush(journal: DurableJournal) -> None:
        real_flush(journal)
        durable[0] = journal[-1][1]

    monkeypatch.setattr(DurableJournal, "flush", flush)
    deadline = time.monotonic() + 5
    results, on_done = recorder()
    submitted = 0
    while len(results) < 20 and time.monotonic() < deadline:
        node.doTick(TICK_S)
        assert node.raftCommitIndex <= max(durable[0], 1), "committed an entry not yet fsynced"
        if controller(node) and submitted < 20:
            submitted += 1
            node.submit(command(submitted, node.raftCurrentTerm, f"c{submitted}"), on_done)
    assert len(results) == 20 and all(error == FAIL_REASON.SUCCESS for _, error in results)


# --- Two leaders: fencing by term, leader fallback ------------------------------------------


def tick(nodes: list[RaftSyncObj], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for node in nodes:
            node.doTick(TICK_S)


def tick_until(nodes: list[RaftSyncObj], done: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "condition not reached in time"
        for node in nodes:
            node.doTick(TICK_S)


def controller(node: RaftSyncObj) -> bool:
    image = node._raft_machine.image
    return bool(node._isLeader() and image.controller_term == node.raftCurrentTerm)


def cluster(
    tmp_path: Path, destroy: Callable[[Any], Any], settings: RaftSettings | None = None
) -> list[RaftSyncObj]:
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    return [
        destroy(raft_node(tmp_path, i + 1, a, [p for p in addresses if p != a], settings))
        for i, a in enumerate(addresses)
    ]


def deposed_leader(
    tmp_path: Path, destroy: Callable[[Any], Any]
) -> tuple[RaftSyncObj, RaftSyncObj, list[RaftSyncObj]]:
    """Three nodes; the first controller is "stopped" (not ticked) until another takes over.

    Returns (old, new, all nodes); ``old`` still believes it is leader and controller.
    """
    nodes = cluster(tmp_path, destroy)
    tick_until(nodes, lambda: any(controller(n) for n in nodes), 10)
    old = next(n for n in nodes if controller(n))
    others = [n for n in nodes if n is not old]
    tick_until(others, lambda: any(controller(n) for n in others), 10)
    new = next(n for n in others if controller(n))
    return old, new, nodes


def has_broker(nodes: list[RaftSyncObj], node_id: int) -> list[bool]:
    return [node_id in n._raft_machine.image.brokers for n in nodes]


def test_two_leaders_reproduced_and_stale_local_read(
    tmp_path: Path, destroy: Callable[[Any], Any]
) -> None:
    old, new, nodes = deposed_leader(tmp_path, destroy)
    assert old._isLeader() and new._isLeader(), "two nodes believe they lead"
    assert new.raftCurrentTerm > old.raftCurrentTerm
    # A write through the real leader; the old one's local image is stale.
    done, on_done = recorder()
    new.submit(command(50, new.raftCurrentTerm, "w50"), on_done)
    others = [n for n in nodes if n is not old]
    tick_until(others, lambda: bool(done) and all(has_broker(others, 50)), 5)
    assert has_broker(nodes, 50) == [n is not old for n in nodes]
    assert controller(old), "the stale node still looks like the controller locally"


def test_stale_leader_proposal_and_barrier_never_apply(
    tmp_path: Path, destroy: Callable[[Any], Any]
) -> None:
    old, new, nodes = deposed_leader(tmp_path, destroy)
    stale_term = old._raft_machine.image.controller_term
    proposal, on_proposal = recorder()
    old.submit(command(901, stale_term, "stale-901"), Submission("stale-901", on_proposal))
    barrier, on_barrier = recorder()
    old.submit_barrier(Submission(None, on_barrier))
    # The old leader resumes: it appends both in its old term, then hears of the new leader.
    tick_until(
        nodes,
        lambda: bool(proposal and barrier) and old.raftLastApplied >= new.raftCommitIndex,
        10,
    )
    assert not old._isLeader() and old._SyncObj__raftState == FOLLOWER
    print(f"stale proposal outcome {proposal}, barrier outcome {barrier}")
    assert proposal[0][1] != FAIL_REASON.SUCCESS and barrier[0][1] != FAIL_REASON.SUCCESS
    assert has_broker(nodes, 901) == [False, False, False]


def allow_forwarding(
    proposer: RaftSyncObj, leader: RaftSyncObj, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Undo raftlog's no-forwarding guard: the proposer forwards, the leader accepts."""
    raw_check = functools.partial(SyncObj._checkCommandsToApply, proposer)
    monkeypatch.setattr(proposer, "_checkCommandsToApply", raw_check)

    def receive(node: Any, message: dict[str, Any]) -> None:
        handler = SyncObj if message.get("type") == "apply_command" else RaftSyncObj
        handler._SyncObj__onMessageReceived(leader, node, message)

    monkeypatch.setattr(leader.transport, "_onMessageReceivedCallback", receive)


def test_stale_proposal_reaching_new_leader_is_fenced_by_term(
    tmp_path: Path, destroy: Callable[[Any], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new, nodes = deposed_leader(tmp_path, destroy)
    stale_term = old._raft_machine.image.controller_term
    old.doTick(TICK_S)  # the tick thread learns of the new leader ...
    tick(nodes, 0.05)
    assert not old._isLeader() and old._getLeader() == new.selfNode
    # ... while the proposer already checked "controller ready" (check-then-act race).
    # pysyncobj would forward the command to the new leader, which would accept it: allow both
    # (raftlog's guards disabled), and also disable the state machine's term fence.
    allow_forwarding(old, new, monkeypatch)
    monkeypatch.setattr(state, "_check_controller_term", lambda image, command: None)
    unfenced, on_unfenced = recorder()
    old.submit(command(902, stale_term, "stale-902"), on_unfenced)
    tick_until(nodes, lambda: bool(unfenced) and all(has_broker(nodes, 902)), 5)
    assert unfenced[0][1] == FAIL_REASON.SUCCESS, "unfenced: the stale write applied everywhere"

    # The term fence alone: the forwarded command commits but is rejected, image unchanged.
    monkeypatch.undo()
    allow_forwarding(old, new, monkeypatch)
    fenced, on_fenced = recorder()
    old.submit(command(903, stale_term, "stale-903"), on_fenced)
    tick_until(nodes, lambda: bool(fenced), 5)
    result = fenced[0][0]
    assert isinstance(result, ApplyResult) and result.error_code == errors.NOT_CONTROLLER
    tick(nodes, 0.1)
    assert has_broker(nodes, 903) == [False, False, False]

    # raftlog as shipped: a non-leader never forwards; the command is refused outright.
    monkeypatch.undo()
    refused, on_refused = recorder()
    old.submit(command(904, stale_term, "stale-904"), on_refused)
    tick_until(nodes, lambda: bool(refused), 5)
    assert refused == [(None, FAIL_REASON.NOT_LEADER)]
    tick(nodes, 0.1)
    assert has_broker(nodes, 904) == [False, False, False]


@pytest.mark.parametrize(
    ("settings", "steps_down"),
    [(PYSYNCOBJ_DEFAULT_SETTINGS, False), (RaftSettings(), True)],
    ids=["pysyncobj-defaults", "raftlog"],
)
def test_partitioned_leader_steps_down_within_leader_fallback_timeout(
    settings: RaftSettings, steps_down: bool, tmp_path: Path, destroy: Callable[[Any], Any]
) -> None:
    nodes = cluster(tmp_path, destroy, settings)
    tick_until(nodes, lambda: any(controller(n) for n in nodes), 15)
    leader = next(n for n in nodes if controller(n))
    # The followers stop answering (not ticked); only the leader runs.
    cut = time.monotonic()
    while leader._SyncObj__raftState == LEADER and time.monotonic() - cut < 2.0:
        leader.doTick(TICK_S)
    elapsed = time.monotonic() - cut
    print(f"leader state after {elapsed:.2f} s without a majority: {leader._SyncObj__raftState}")
    if steps_down:
        assert leader._SyncObj__raftState != LEADER
        assert elapsed < settings.leader_fallback_timeout_s + 0.6, elapsed
    else:
        assert leader._SyncObj__raftState == LEADER, "30 s default: still leading after 2 s"


# --- Fail-stop and back-pressure ------------------------------------------------------------


def test_undecodable_committed_entry_stops_the_node(
    tmp_path: Path, destroy: Callable[[Any], Any]
) -> None:
    # Skipping an entry a newer node wrote would diverge from the nodes that can apply it.
    node = destroy(raft_node(tmp_path, 1, f"127.0.0.1:{free_port()}", [GHOST_B, GHOST_C]))
    entries = [(b"\x00not cbor", 2, 1)]
    node._SyncObj__onMessageReceived(TCPNode(GHOST_C), _entries_message((1, 0), entries))
    with pytest.raises(RaftApplyError):
        node.doTick(0)  # with autoTick, pysyncobj's tick loop logs this and carries on
    assert node.failure is not None and "cannot apply log entry 2" in str(node.failure)
    applied = node.raftLastApplied
    node._SyncObj__onMessageReceived(TCPNode(GHOST_C), _entries_message((2, 1), [(b"\x01", 3, 1)]))
    node.doTick(0)
    assert node.raftLastApplied == applied, "a failed node stops applying"


def test_full_command_queue_is_reported_at_once(
    tmp_path: Path, destroy: Callable[[Any], Any]
) -> None:
    settings = RaftSettings(commands_queue_size=2)
    node = destroy(raft_node(tmp_path, 1, f"127.0.0.1:{free_port()}", [GHOST_B], settings))
    outcomes, on_done = recorder()
    for i in range(3):
        node.submit(command(i, 0, f"q{i}"), on_done)
    assert outcomes == [(None, FAIL_REASON.QUEUE_FULL)]
    node.doTick(0)  # not leader: the queued two are refused, never forwarded
    assert outcomes[1:] == [(None, FAIL_REASON.NOT_LEADER)] * 2


# --- Crash between writing a snapshot and compacting the journal ----------------------------


@pytest.mark.parametrize("fixed", [False, True], ids=["pysyncobj-startup", "raftlog"])
def test_crash_after_snapshot_before_compaction_keeps_the_journal_tail(
    fixed: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    address = f"127.0.0.1:{free_port()}"
    node = raft_node(tmp_path, 1, address, [])
    deadline = time.monotonic() + 5
    while not controller(node):
        assert time.monotonic() < deadline
        node.doTick(TICK_S)
    term = node.raftCurrentTerm
    for i in range(1, 4):
        node.submit(command(i, term, f"before-{i}"), lambda result, error: None)
    tick(_one(node), 0.05)
    # One tick appends three more entries, then snapshots what is applied (not them yet) ...
    for i in range(4, 7):
        node.submit(command(i, term, f"tail-{i}"), lambda result, error: None)
    node.forceLogCompaction()
    node.doTick(0)
    assert node._raft_snapshots.written == 1
    snapshot_index = node.raftLastApplied
    assert node.journal[0][1] < snapshot_index < node.journal[-1][1], "not compacted yet"
    node._doDestroy()  # ... and the process dies before the next tick compacts the journal.

    if not fixed:
        monkeypatch.setattr(RaftSyncObj, "_raft_check_snapshot_on_start", lambda self: None)
    restarted = raft_node(tmp_path, 1, address, [])
    try:
        deadline = time.monotonic() + 5
        while not controller(restarted):
            assert time.monotonic() < deadline
            restarted.doTick(TICK_S)
        tick(_one(restarted), 0.05)
        brokers_seen = sorted(restarted._raft_machine.image.brokers)
    finally:
        restarted._doDestroy()
    if fixed:
        assert brokers_seen == [1, 2, 3, 4, 5, 6]
    else:
        assert brokers_seen == [1, 2, 3], "pysyncobj cleared the journal tail after the snapshot"


def _one(node: RaftSyncObj) -> list[RaftSyncObj]:
    return [node]
