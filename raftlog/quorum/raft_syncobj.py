"""pysyncobj 0.3.17 with raftlog's corrections and guards (no trio in this module).

Everything here runs on pysyncobj's tick thread unless a docstring says otherwise. The measured
defects (``/work/shared/reference/pysyncobj-findings.md``) and how raftlog closes them:

* **8-A** (a deposed leader applies and acknowledges its own uncommitted entries on the snapshot
  path): :meth:`RaftSyncObj._raft_on_append_entries` replaces the follower's AppendEntries
  handling. The commit index only advances up to the last entry a *successful* log-matching check
  verified; a snapshot chunk or ``serialized: None`` never moves it; a fully received snapshot
  moves it to the snapshot's last index only once the snapshot is loaded.
* **8-C** (unconditional truncation): entries already present with the same term are skipped;
  the log is truncated only at a real term conflict (Raft §5.3).
* **8-D** (a re-sent snapshot rolls applied state back): a snapshot not newer than what this node
  has applied is acknowledged without loading it.
* **8-E** (callbacks silently never fire after a snapshot jumps past them): waiting proposals are
  resolved after a snapshot install, from the restored request-id window when it can tell
  (:class:`~raftlog.quorum.raft_events.Submission`).
* **No fsync**: :class:`~raftlog.quorum.raft_storage.DurableJournal` replaces the journal; a
  follower fsyncs before it acknowledges, the leader before it counts its own entries. Snapshots
  are fsynced before they replace the previous one (own ones by the serializer, received ones
  here: pysyncobj renamed a received snapshot over the node's own, unsynced, before looking at
  it; :class:`~raftlog.quorum.raft_snapshots.SnapshotKeeper` collects it instead), and the journal
  only drops entries once the snapshot covering them is durable.
* **Crash between snapshot and compaction**: pysyncobj's startup clears the whole journal unless
  it starts exactly at the snapshot; :meth:`RaftSyncObj._raft_check_snapshot_on_start` trims it
  to the snapshot instead, keeping the (possibly acknowledged) entries after it.
* **8-B** (the first RequestVote over an idle follower link is dropped): ``connectionTimeout=30``
  as the findings recommend (:mod:`raftlog.quorum.raft_settings`), *and* a keepalive message on
  every link each second. The timeout alone only postpones the bug: once a follower link has
  been idle longer than the timeout the first vote is dropped again.
* **Pickle RCE**: a password is required (:func:`~raftlog.quorum.raft_settings.check_conf`);
  messages that fail authentication are logged (pysyncobj drops them silently).
* **Unbounded reads on the Raft port** (a stranger's 2^31-1-byte frame was buffered while it
  stalled the tick thread and moved the term): :mod:`raftlog.quorum.raft_transport` caps
  every frame, allows only a handshake-sized frame before the peer proves the secret, and
  bounds the work per poll.
* **Journal without snapshot file**: :func:`~raftlog.quorum.raft_settings.check_conf` refuses it.
* Commands are never forwarded to another node and raftlog's payloads are CBOR, not pickle: a
  replicated command is ``b"\\x00" + encode_command(...)`` applied by ``MetadataStateMachine``.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import pysyncobj.syncobj as pysyncobj_syncobj
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj.config import FAIL_REASON
from pysyncobj.monotonic import monotonic as monotonic_time

from raftlog.metadata.records import BecomeController, Command, decode_command, encode_command
from raftlog.metadata.state import ApplyResult, MetadataStateMachine
from raftlog.quorum.raft_events import (
    FOLLOWER,
    LEADER,
    RaftListener,
    RaftView,
    Submission,
    SubmitCallback,
)
from raftlog.quorum.raft_rejoin import (
    PROBE_MESSAGE_TYPE,
    PROBE_REPLY_MESSAGE_TYPE,
    RejoinGuard,
    RejoinMixin,
)
from raftlog.quorum.raft_settings import RaftSettings, build_conf, check_conf
from raftlog.quorum.raft_snapshots import SnapshotKeeper, trim_journal
from raftlog.quorum.raft_storage import (
    JOURNAL_FILE_NAME,
    SNAPSHOT_FILE_NAME,
    DurableJournal,
    RaftStorageError,
    clear_rejoin,
    decode_snapshot,
    rejoin_pending,
    write_durably,
)
from raftlog.quorum.raft_transport import RaftTransport
from raftlog.quorum.tick_stalls import TickStalls

logger = logging.getLogger(__name__)

# pysyncobj's command type bytes (_COMMAND_TYPE): REGULAR commands are ours, NO_OP is a barrier.
REGULAR_COMMAND: Final = b"\x00"
NO_OP_COMMAND: Final = b"\x01"
KEEPALIVE_MESSAGE_TYPE: Final = "raftlog_keepalive"


class RaftApplyError(Exception):
    """A committed entry could not be applied; this node stops taking part (fail-stop)."""


# --- The SyncObj ----------------------------------------------------------------------------

_CONSTRUCT_LOCK: Final = threading.Lock()


class RaftSyncObj(RejoinMixin, SyncObj):  # type: ignore[misc]
    """A pysyncobj SyncObj replicating ``MetadataStateMachine`` commands, with the corrections
    described in the module docstring.

    Attributes named ``_SyncObj__*`` are pysyncobj's private (name-mangled) fields and methods;
    the overrides below use them because the corrected code paths are private in pysyncobj.

    Construct it in the main thread (its tick thread stops when the constructing thread ends).
    Thread-safe entry points for other threads: :meth:`submit`, :meth:`submit_barrier`,
    :attr:`view`, ``destroy()``, and pysyncobj's atomic properties (``raftCurrentTerm``,
    ``_isLeader()``, ``_getLeader()``).

    Args:
        self_address: This voter's ``host:port``, or None for a non-voting observer.
        peer_addresses: The other voters' ``host:port``.
        conf: From :func:`build_conf` (checked again with :func:`check_conf`).
        machine: A fresh state machine; only the tick thread touches it afterwards.
        node_id: This node's id (used for ``BecomeController`` when it leads).
        listener: Receives apply and state events on the tick thread.
        keepalive_interval_s: See :attr:`RaftSettings.keepalive_interval_s`.
    """

    # pysyncobj's private fields this class assigns (declared for the type checker).
    _SyncObj__raftLeader: Any
    _SyncObj__raftCommitIndex: int
    _SyncObj__leaderCommitIndex: int | None
    _SyncObj__transferInProgress: bool
    _SyncObj__raftElectionDeadline: float
    _SyncObj__recvTransmission: Any

    def __init__(
        self,
        self_address: str | None,
        peer_addresses: Sequence[str],
        conf: SyncObjConf,
        *,
        machine: MetadataStateMachine,
        node_id: int,
        listener: RaftListener | None = None,
        keepalive_interval_s: float | None = None,
    ) -> None:
        check_conf(conf)
        # A voter on a directory this start created stays out of elections (raft_rejoin).
        self._raft_dir = Path(conf.fullDumpFile).parent
        self._raft_rejoin: RejoinGuard | None = (
            RejoinGuard(len(peer_addresses) + 1, monotonic_time())
            if self_address is not None and rejoin_pending(self._raft_dir) else None)
        if self_address is None and rejoin_pending(self._raft_dir):
            clear_rejoin(self._raft_dir)  # an observer never votes: nothing to guard
        assert machine.image.version == -1, "a RaftSyncObj needs a fresh state machine"
        # Everything the tick thread uses is set before SyncObj.__init__ starts that thread.
        self._raft_machine = machine
        self._raft_node_id = node_id
        self._raft_listener = listener or RaftListener()
        self._raft_observer_id = None if self_address is not None else str(node_id)
        self._raft_journal: DurableJournal | None = None
        self._raft_failure: BaseException | None = None
        self._raft_snapshots = SnapshotKeeper(machine, self._raft_listener, Path(conf.fullDumpFile))
        self._raft_started = False
        self._raft_keepalive_s = keepalive_interval_s
        self._raft_next_keepalive = 0.0
        self._raft_become_pending: int | None = None
        self._raft_view: RaftView | None = None
        # Metrics, written by the tick thread only (plain attribute writes, read anywhere).
        self.leader_contact_at = monotonic_time()  # last AppendEntries from a leader
        self.storage_errors = 0  # ticks that failed on a journal or snapshot write
        # Half the shortest election timeout: a longer gap between ticks is worth a warning.
        self._raft_tick_stalls = TickStalls(conf.raftMinTimeout / 2)
        conf.onStateChanged = self._raft_on_state_changed
        conf.serializer = self._raft_snapshots.serialize
        conf.deserializer = self._raft_snapshots.deserialize
        conf.serializeChecker = None
        with _CONSTRUCT_LOCK:
            original = pysyncobj_syncobj.createJournal
            pysyncobj_syncobj.createJournal = self._raft_create_journal
            try:
                super().__init__(
                    self_address, list(peer_addresses), conf, transportClass=RaftTransport
                )
            finally:
                pysyncobj_syncobj.createJournal = original

    # --- Thread-safe API ----------------------------------------------------------------------

    def submit(self, payload: bytes, callback: SubmitCallback) -> None:
        """Queue an encoded command for this node's log (only a leader accepts it).

        ``callback(result, error)`` runs later on the tick thread, or at once on this thread
        for QUEUE_FULL.
        """
        self._raft_enqueue(REGULAR_COMMAND + payload, callback)

    def submit_barrier(self, callback: SubmitCallback) -> None:
        """Queue a no-op; SUCCESS means it committed in this leader's term (a read barrier)."""
        self._raft_enqueue(NO_OP_COMMAND, callback)

    @property
    def view(self) -> RaftView | None:
        """The state after the latest tick (None before the first one)."""
        return self._raft_view

    @property
    def journal(self) -> DurableJournal:
        """The durable journal (tick thread only, or after the tick thread stopped)."""
        assert self._raft_journal is not None
        return self._raft_journal

    @property
    def failure(self) -> BaseException | None:
        """Why this node stopped applying, if it did."""
        return self._raft_failure

    def leader_contact_age_s(self) -> float:
        """Seconds since an AppendEntries (or heartbeat) from the leader arrived; 0 while this
        node leads. Thread-safe (two attribute reads)."""
        if self._SyncObj__raftState == LEADER:
            return 0.0
        age: float = monotonic_time() - self.leader_contact_at
        return max(0.0, age)

    @property
    def transport(self) -> RaftTransport:
        """The transport (for its counters)."""
        transport: RaftTransport = self._SyncObj__transport
        return transport

    def _raft_enqueue(self, command: bytes, callback: SubmitCallback) -> None:
        # BlockingIOError: the wake-up pipe is full, so the tick thread has wake-ups pending
        # already; the command itself is queued.
        with contextlib.suppress(BlockingIOError):
            self._applyCommand(command, callback)

    # --- Tick ---------------------------------------------------------------------------------

    def _onTick(self, timeToWait: float = 0.0) -> None:
        if self._raft_failure is not None:
            time.sleep(timeToWait)  # fail-stop: behave like a crashed node
            return
        if self._SyncObj__needLoadDumpFile and self._SyncObj__transport.ready:
            self._raft_check_snapshot_on_start()
            if self._raft_failure is not None:
                return
        journal = self._raft_journal
        assert journal is not None
        started = time.monotonic()
        self._raft_tick_stalls.note_start(started)
        try:
            # Durability: the leader counts its own entries at the start of the tick (commit
            # index computation), so everything it appended must be on disk first.
            journal.flush()
            flushed = time.monotonic()
            super()._onTick(timeToWait)
            ticked = time.monotonic()
        except (OSError, RaftStorageError):  # pysyncobj logs it and ticks again
            self.storage_errors += 1
            raise
        if self._SyncObj__transport.ready and not self._SyncObj__needLoadDumpFile:
            self._raft_started = True
        self._raft_maybe_become_controller()
        self._raft_send_keepalives()
        self._raft_guard_rejoin()
        view = self._raft_make_view()
        self._raft_view = view
        self._raft_listener.on_tick(view)
        self._raft_tick_stalls.note_tick(flushed - started, ticked - flushed,
                                         time.monotonic() - ticked)

    def _SyncObj__onBecomeLeader(self) -> None:
        SyncObj._SyncObj__onBecomeLeader(self)
        # The no-op just appended may be counted in this same tick (a one-voter group).
        journal = self._raft_journal
        assert journal is not None
        journal.flush()

    def _checkCommandsToApply(self) -> None:
        if self._SyncObj__raftState == LEADER:
            super()._checkCommandsToApply()
            return
        # raftlog proposes only on the leader and never forwards a command: a forwarded command
        # from a deposed leader would reach the new one. Fail whatever is queued.
        commands = self._SyncObj__commandsQueue
        while True:
            try:
                _, callback = commands.get_nowait()
            except queue.Empty:
                return
            self._SyncObj__callErrCallback(FAIL_REASON.NOT_LEADER, callback)

    def _raft_maybe_become_controller(self) -> None:
        """As leader, propose ``BecomeController(term, node_id)`` until it applies (one in
        flight at a time; the request id is fixed per term, so a retry cannot apply twice)."""
        if self._SyncObj__raftState != LEADER or self._raft_observer_id is not None:
            return
        term = self._SyncObj__raftCurrentTerm
        image = self._raft_machine.image
        if image.controller_term >= term or self._raft_become_pending == term:
            return
        self._raft_become_pending = term

        def done(result: object, error: int) -> None:
            if error != FAIL_REASON.SUCCESS:
                if self._raft_become_pending == term:
                    self._raft_become_pending = None  # retry on a later tick if still leader
            elif isinstance(result, ApplyResult) and not result.ok:
                # Cannot happen while this node leads ``term``; do not retry in a loop.
                logger.error("BecomeController(%d) rejected: %s", term, result.message)

        request_id = f"become-controller-{self._raft_node_id}-{term}"
        command = Command(BecomeController(term, self._raft_node_id), term, request_id)
        self.submit(encode_command(command), done)

    def _raft_send_keepalives(self) -> None:
        interval = self._raft_keepalive_s
        if interval is None:
            return
        now = monotonic_time()
        if now < self._raft_next_keepalive:
            return
        self._raft_next_keepalive = now + interval
        transport = self._SyncObj__transport
        connected = self._SyncObj__connectedNodes
        for node in self._SyncObj__otherNodes | self._SyncObj__readonlyNodes:
            if node in connected:
                transport.send(node, {"type": KEEPALIVE_MESSAGE_TYPE})

    def _raft_make_view(self) -> RaftView:
        state = self._SyncObj__raftState
        leader = self._SyncObj__raftLeader
        journal = self._raft_journal
        assert journal is not None
        match_index: dict[str, int] = {}
        last_contact: dict[str, float] = {}
        if state == LEADER:
            now = monotonic_time()
            match_index = {str(node.id): i for node, i in self._SyncObj__raftMatchIndex.items()}
            last_contact = {
                str(node.id): max(0.0, now - t)
                for node, t in self._SyncObj__lastResponseTime.items()
            }
        transport = self._SyncObj__transport
        return RaftView(
            state=state,
            term=self._SyncObj__raftCurrentTerm,
            leader=None if leader is None else str(leader.id),
            commit_index=self._SyncObj__raftCommitIndex,
            last_applied=self._SyncObj__raftLastApplied,
            last_log_index=journal[-1][1],
            transport_ready=transport.ready,
            bind_failed=not transport.ready and transport._bindOverEvent.is_set(),
            started=self._raft_started,
            caught_up=self.isReady(),
            connected=frozenset(str(node.id) for node in self._SyncObj__connectedNodes),
            match_index=match_index,
            last_contact_s=last_contact,
            observers=tuple(sorted(str(node.id) for node in self._SyncObj__readonlyNodes)),
            journal_fsyncs=journal.fsync_count,
            snapshots_written=self._raft_snapshots.written,
            snapshots_installed=self._raft_snapshots.installed,
        )

    def _raft_on_state_changed(self, old_state: int, new_state: int) -> None:
        if old_state == LEADER:  # it heard from the leader (itself) until now
            self.leader_contact_at = monotonic_time()
        self._raft_listener.on_state_changed(old_state, new_state)

    def _raft_fail(self, error: BaseException) -> None:
        if self._raft_failure is None:
            self._raft_failure = error
            logger.critical("raft: %s; this node stops taking part in the quorum", error)
            self._raft_listener.on_failed(error)

    # --- Messages (8-A, 8-C, 8-D, 8-E) --------------------------------------------------------

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == KEEPALIVE_MESSAGE_TYPE:
            return
        if kind == PROBE_MESSAGE_TYPE:
            self._SyncObj__transport.send(node, {"type": PROBE_REPLY_MESSAGE_TYPE,
                                                 "last_index": self._SyncObj__getCurrentLogIndex()})
            return
        if kind == PROBE_REPLY_MESSAGE_TYPE:
            self._raft_on_probe_reply(node, message.get("last_index"))
            return
        if kind in ("request_vote", "timeout_now") and self._raft_rejoin is not None \
                and self._raft_rejoin.active:
            return  # a voter that may have lost its log grants no vote (raft_rejoin)
        if kind == "apply_command":
            # raftlog never forwards commands; refuse any that arrive.
            if "request_id" in message:
                self._SyncObj__transport.send(
                    node,
                    {
                        "type": "apply_command_response",
                        "request_id": message["request_id"],
                        "error": FAIL_REASON.REQUEST_DENIED,
                    },
                )
            return
        if kind == "append_entries" and message["term"] >= self._SyncObj__raftCurrentTerm:
            self._raft_on_append_entries(node, message)
            return
        SyncObj._SyncObj__onMessageReceived(self, node, message)

    def _raft_on_append_entries(self, node: Any, message: dict[str, Any]) -> None:
        """pysyncobj's follower AppendEntries handling, corrected (see the module docstring)."""
        term = message["term"]
        self.leader_contact_at = monotonic_time()
        if term > self._SyncObj__raftCurrentTerm:
            self._SyncObj__transferInProgress = False
        if not self._SyncObj__transferInProgress:
            self._SyncObj__raftElectionDeadline = (
                monotonic_time() + self._SyncObj__generateRaftTimeout()
            )
        if self._SyncObj__raftLeader != node:
            self._SyncObj__onLeaderChanged()
        self._SyncObj__raftLeader = node
        if term > self._SyncObj__raftCurrentTerm:
            self._SyncObj__setCurrentTerm(term, None)
        self._SyncObj__setState(FOLLOWER)
        leader_commit = message["commit_index"]
        self._SyncObj__leaderCommitIndex = leader_commit
        if "prevLogIdx" in message:
            verified = self._raft_append_entries(node, message)
            if verified is not None:
                self._raft_advance_commit(min(leader_commit, verified))
        elif isinstance(message.get("serialized"), tuple):
            complete = self._raft_snapshots.receive_chunk(message["serialized"])
            if complete is not None:
                self._raft_install_snapshot(node, complete)
        # else: ``serialized: None`` (the leader's serializer is busy) is a heartbeat only.
        self.journal.setRaftCommitIndex(self._SyncObj__raftCommitIndex)

    def _raft_append_entries(self, node: Any, message: dict[str, Any]) -> int | None:
        """Log matching and append; returns the last index this message verified, or None."""
        entries = message.get("entries", [])
        transmission = message.get("transmission")
        if transmission is not None:
            if transmission in ("start", "process"):
                if transmission == "start":
                    self._SyncObj__recvTransmission = message["data"]
                else:
                    self._SyncObj__recvTransmission += message["data"]
                self._SyncObj__sendNextNodeIdx(node, success=False, reset=False)
                return None
            if transmission != "finish":
                raise ValueError(f"unknown transmission {transmission!r}")
            data = self._SyncObj__recvTransmission + message["data"]
            self._SyncObj__recvTransmission = ""
            entries = [pysyncobj_pickle.loads(data)]
        prev_index = message["prevLogIdx"]
        prev_term = message["prevLogTerm"]
        ours = self._SyncObj__getEntries(prev_index)
        if not ours:
            self._SyncObj__sendNextNodeIdx(node, success=False, reset=True)
            return None
        if ours[0][2] != prev_term:
            self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=prev_index, success=False, reset=True)
            return None
        journal = self.journal
        for position, entry in enumerate(entries):
            existing = ours[position + 1] if position + 1 < len(ours) else None
            if existing is not None and existing[2] == entry[2]:
                continue  # 8-C: already have it (same index and term: same entry)
            if existing is not None:
                self._raft_truncate_from(entry[1])
            for new_entry in entries[position:]:
                journal.add(*new_entry)
            break
        # Durability: acknowledge only what is on disk.
        journal.flush()
        verified: int = prev_index + len(entries)
        self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=verified + 1, success=True)
        return verified

    def _raft_truncate_from(self, index: int) -> None:
        if index <= self._SyncObj__raftCommitIndex:
            # Raft never truncates committed entries; this would be a safety violation.
            self._raft_fail(RaftApplyError(f"asked to truncate committed entry {index}"))
            raise RaftApplyError(f"asked to truncate committed entry {index}")
        self._SyncObj__deleteEntriesFrom(index)

    def _raft_advance_commit(self, index: int) -> None:
        if index > self._SyncObj__raftCommitIndex:
            self._SyncObj__raftCommitIndex = index

    def _raft_install_snapshot(self, node: Any, data: bytes) -> None:
        try:
            snapshot = decode_snapshot(data)
        except RaftStorageError as exc:
            logger.error("raft: received snapshot is unusable (%s); asking for it again", exc)
            self._SyncObj__sendNextNodeIdx(node, success=False, reset=True)
            return
        last_index = snapshot.last[1]
        if last_index <= self._SyncObj__raftLastApplied:
            # 8-D: a re-sent snapshot we are already past; loading it would roll state back.
            self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=last_index + 1, success=True)
            return
        # Durable before the journal entries it replaces are dropped (by the load below).
        snapshots = self._raft_snapshots
        write_durably(snapshots.path, data)
        snapshots.loaded = False
        self._SyncObj__loadDumpFile(clearJournal=True)
        if not snapshots.loaded:
            logger.error("raft: could not load the received snapshot; asking for it again")
            self._SyncObj__sendNextNodeIdx(node, success=False, reset=True)
            return
        snapshots.installed += 1
        self.journal.flush()
        # A snapshot holds only committed entries.
        self._raft_advance_commit(last_index)
        self._raft_resolve_waiters(self._SyncObj__raftLastApplied)
        self._SyncObj__sendNextNodeIdx(node, success=True)

    def _raft_resolve_waiters(self, last_applied: int) -> None:
        """8-E: callbacks of entries a snapshot jumped past would never fire."""
        waiting = self._SyncObj__commandsWaitingCommit
        for index in sorted(i for i in waiting if i <= last_applied):
            for _term, callback in waiting.pop(index):
                if isinstance(callback, Submission):
                    callback.resolve_after_snapshot(index, last_applied, self._raft_machine)
                else:
                    callback(None, FAIL_REASON.UNKNOWN_OUTCOME)

    # --- Applying and snapshots ---------------------------------------------------------------

    def _SyncObj__doApplyCommand(self, command: bytes) -> object:
        if command[:1] != REGULAR_COMMAND:
            return SyncObj._SyncObj__doApplyCommand(self, command)
        index = self._SyncObj__raftLastApplied + 1
        try:
            decoded = decode_command(bytes(command[1:]))
            result = self._raft_machine.apply(decoded, index)
        except Exception as exc:
            # Deterministic apply failed: a newer node's record, or a bug. Skipping it would
            # diverge from the other nodes, so stop instead.
            error = RaftApplyError(f"cannot apply log entry {index}: {exc!r}")
            self._raft_fail(error)
            raise error from exc
        self._raft_listener.on_applied(self._raft_machine.image)
        return result

    def _raft_check_snapshot_on_start(self) -> None:
        """Before pysyncobj loads the snapshot on the first tick: refuse a damaged one (pysyncobj
        would log and carry on empty), and keep the journal tail after it (:func:`trim_journal`).
        """
        snapshots = self._raft_snapshots
        try:
            snapshot = snapshots.on_disk()
        except (RaftStorageError, OSError) as exc:
            self.storage_errors += 1
            self._raft_fail(RaftApplyError(f"snapshot {snapshots.path} is unusable: {exc}"))
            return
        if snapshot is not None:
            trim_journal(self.journal, snapshot)

    def _raft_create_journal(self, journal_file: str) -> DurableJournal:
        journal = DurableJournal(Path(journal_file), self._raft_snapshots.path)
        self._raft_journal = journal
        return journal


def make_syncobj(
    *,
    self_address: str | None,
    peer_addresses: Sequence[str],
    data_dir: Path,
    password: str,
    machine: MetadataStateMachine,
    node_id: int,
    settings: RaftSettings,
    bind_address: str | None = None,
    listener: RaftListener | None = None,
    auto_tick: bool = True,
) -> RaftSyncObj:
    """Build the conf for ``data_dir`` and construct a :class:`RaftSyncObj` (main thread)."""
    conf = build_conf(
        settings,
        journal_file=data_dir / JOURNAL_FILE_NAME,
        snapshot_file=data_dir / SNAPSHOT_FILE_NAME,
        password=password,
        bind_address=bind_address,
    )
    conf.autoTick = auto_tick
    return RaftSyncObj(
        self_address,
        peer_addresses,
        conf,
        machine=machine,
        node_id=node_id,
        listener=listener,
        keepalive_interval_s=settings.keepalive_interval_s,
    )
