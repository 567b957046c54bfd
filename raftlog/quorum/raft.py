"""``RaftQuorum``: the metadata quorum replicated by Raft (pysyncobj), bridged to trio.

Same :class:`~raftlog.quorum.interface.Quorum` interface as ``LocalQuorum``; use it as
``async with RaftQuorum.from_config(config) as quorum:`` from ``trio.run`` in the main thread.

Threads. pysyncobj runs its own tick thread (``autoTick``): it does the networking, appends and
fsyncs the journal, applies committed entries to the state machine and fires callbacks. Nothing
here blocks trio on Raft or calls Raft synchronously from the tick thread: proposals are queued
with a callback, and the tick thread hands results back with ``TrioToken.run_sync_soon``. Applying
builds a new immutable image; the trio side swaps one reference and wakes waiters, exactly like
``LocalQuorum`` (an image is published before the result of the command that produced it).

Controller. When this node becomes Raft leader its tick thread proposes
``BecomeController(term=raft term, node_id)``. ``controller_ready`` is true only while this node is
leader *and* that record for the current term is applied; ``propose`` raises
:class:`~raftlog.quorum.interface.NotControllerError` everywhere else. Every command carries the
controller term, and the state machine rejects a command from an older term (NOT_CONTROLLER): a
deposed leader that still believes it leads cannot change the image.

Reads. ``image`` is a local read: possibly stale on followers and observers, and on a deposed
leader until it learns about the new one. :meth:`RaftQuorum.read_barrier` gives a linearizable
read on the ready controller (a replicated no-op; concurrent readers share one), and refuses on
any other node. The corrections that make the barrier safe are in ``raft_syncobj``.

Voters come from ``controller.quorum.voters``; a voter binds its own entry (its CONTROLLER
listener). ``process.roles=broker`` nodes join as non-voting observers (pysyncobj's read-only
nodes) and only follow the log. A shared secret (``raft.secret``) is required: it authenticates
and encrypts every Raft message (without it pysyncobj unpickles anyone's bytes).

Data: ``<metadata.log.dir>/__cluster_metadata-0/`` holds ``raft.journal`` (+ ``.meta``),
``raft.snapshot`` and ``meta.properties`` (cluster and node id, checked on every start).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import re
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import trio
from pysyncobj.config import FAIL_REASON

from raftlog.config import QuorumVoter, ServerConfig
from raftlog.metadata.image import MetadataImage
from raftlog.metadata.records import BecomeController, Command, Record, encode_command
from raftlog.metadata.state import ApplyResult, MetadataStateMachine
from raftlog.quorum import logfile
from raftlog.quorum.interface import (
    PROPOSE_TIMEOUT_S_DEFAULT,
    NotControllerError,
    ObserverStatus,
    ProposalTimeoutError,
    QuorumBusyError,
    QuorumClosedError,
    QuorumError,
    QuorumFailedError,
    QuorumStatus,
    QuorumTimeoutError,
    VoterStatus,
)
from raftlog.quorum.local import PENDING_MAX_DEFAULT
from raftlog.quorum.raft_events import CANDIDATE, LEADER, RaftListener, RaftView, Submission
from raftlog.quorum.raft_settings import RaftSettings
from raftlog.quorum.raft_storage import (
    MetaPropertiesError,
    RaftStorageError,
    check_meta_properties,
)
from raftlog.quorum.raft_syncobj import RaftSyncObj, make_syncobj
from raftlog.quorum.raft_transport import OBSERVER_PREFIX, RAFT_COMMAND_MAX_BYTES

__all__ = ["RaftConfigError", "RaftQuorum", "RaftSettings"]

logger = logging.getLogger(__name__)

OPEN_TIMEOUT_S: Final = 30.0
CLOSE_TIMEOUT_S: Final = 10.0
# Why 10 ms: only used while waiting for startup or for a condition the tick thread does not
# announce (catching up); never on the proposal path.
POLL_INTERVAL_S: Final = 0.01
_OBSERVER_NODE: Final = re.compile(re.escape(OBSERVER_PREFIX) + r"(\d+)#\d+")
_CLOSED: Final = -1


class RaftConfigError(QuorumError):
    """The node cannot start: missing secret, bad voters, or a data directory that belongs to
    another cluster or node."""


class _Waiter:
    """A submission waiting on the trio side."""

    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: object = None
        self.error: int | None = None


class _Barrier:
    __slots__ = ("seq", "waiter")

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.waiter = _Waiter()


class _Bridge(RaftListener):
    """Tick thread -> trio. Every method runs on the tick thread and only schedules work."""

    def __init__(self, quorum: RaftQuorum, token: trio.lowlevel.TrioToken) -> None:
        self._quorum = quorum
        self._token = token
        self._lock = threading.Lock()
        self._next_image: MetadataImage | None = None
        self._image_scheduled = False

    def call_soon(self, fn: Callable[..., object], *args: object) -> None:
        """Run ``fn(*args)`` on the trio thread (dropped once trio has finished)."""
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(fn, *args)

    def on_applied(self, image: MetadataImage) -> None:
        # Coalesced: one pending hand-off carries the newest image.
        with self._lock:
            self._next_image = image
            if self._image_scheduled:
                return
            self._image_scheduled = True
        self.call_soon(self._deliver_image)

    def on_state_changed(self, old_state: int, new_state: int) -> None:
        self.call_soon(self._quorum._on_raft_event)

    def on_failed(self, error: BaseException) -> None:
        self.call_soon(self._quorum._on_failed, error)

    def _deliver_image(self) -> None:
        with self._lock:
            image = self._next_image
            self._image_scheduled = False
        if image is not None:
            self._quorum._publish(image)


class RaftQuorum:
    """The Raft metadata quorum. See the module docstring.

    Args:
        node_id: This node's ``node.id``.
        voters: ``controller.quorum.voters``.
        metadata_dir: ``metadata.log.dir`` (the data lives in ``__cluster_metadata-0/``).
        secret: ``raft.secret``; required.
        is_voter: Whether ``process.roles`` includes ``controller`` (else an observer).
        bind_host: Interface the Raft port binds (default: the host of this node's voter entry).
        cluster_id: ``cluster.id``; None accepts the stored one (or makes one on first start).
        settings: Raft timing (see :class:`RaftSettings`).
        pending_max: Proposals allowed to wait at once (QuorumBusyError beyond).

    Raises:
        RaftConfigError: no secret, or the voters do not match the role.
    """

    def __init__(
        self,
        *,
        node_id: int,
        voters: Sequence[QuorumVoter],
        metadata_dir: Path,
        secret: str | None,
        is_voter: bool = True,
        bind_host: str | None = None,
        cluster_id: str | None = None,
        settings: RaftSettings | None = None,
        pending_max: int = PENDING_MAX_DEFAULT,
    ) -> None:
        if not secret:
            raise RaftConfigError(
                "raft.secret (or raft.secret.file) is required for a Raft metadata quorum: "
                "it authenticates every Raft message"
            )
        if not voters:
            raise RaftConfigError("controller.quorum.voters lists no voter")
        by_address = {f"{voter.host}:{voter.port}": voter.node_id for voter in voters}
        own = [voter for voter in voters if voter.node_id == node_id]
        if is_voter and not own:
            raise RaftConfigError(f"node.id {node_id} is not in controller.quorum.voters")
        if not is_voter and own:
            raise RaftConfigError(
                f"node.id {node_id} is a voter but process.roles has no controller"
            )
        assert pending_max >= 1
        self._node_id = node_id
        self._voters = tuple(voters)
        self._voter_ids_by_address = by_address
        self._self_address = f"{own[0].host}:{own[0].port}" if own else None
        self._bind_address = (
            None
            if not own
            else f"{bind_host if bind_host is not None else own[0].host}:{own[0].port}"
        )
        self._partition_dir = Path(metadata_dir) / logfile.PARTITION_DIR_NAME
        self._secret = secret
        self._configured_cluster_id = cluster_id
        self._cluster_id: str | None = None
        self._settings = settings if settings is not None else RaftSettings()
        self._pending_max = pending_max
        self._machine = MetadataStateMachine()
        self._image = self._machine.image
        self._changed = trio.Event()
        self._waiters: set[_Waiter] = set()
        self._barrier: _Barrier | None = None
        self._barrier_next_seq = 0
        self._sync: RaftSyncObj | None = None
        self._bridge: _Bridge | None = None
        self._failure: QuorumFailedError | None = None
        self._opened = False
        self._closed = False

    @classmethod
    def from_config(
        cls, config: ServerConfig, *, settings: RaftSettings | None = None
    ) -> RaftQuorum:
        """Build from the server config: voters, role, secret, cluster id, data directory.

        A voter's Raft port is its CONTROLLER listener, which must match its voter entry.

        Raises:
            RaftConfigError: see the constructor; or the listener and voter entry disagree.
        """
        bind_host = None
        if config.is_controller:
            own = [v for v in config.controller_quorum_voters if v.node_id == config.node_id]
            host, port = config.listener(config.controller_listener_names[0])
            if own and port != own[0].port:
                raise RaftConfigError(
                    f"the {config.controller_listener_names[0]} listener port {port} differs "
                    f"from this node's controller.quorum.voters entry port {own[0].port}"
                )
            bind_host = host
        quorum = cls(
            node_id=config.node_id,
            voters=config.controller_quorum_voters,
            metadata_dir=config.metadata_log_dir,
            secret=config.raft_secret,
            is_voter=config.is_controller,
            bind_host=bind_host,
            cluster_id=config.cluster_id,
            settings=settings,
        )
        if config.cluster_id is None:
            # Each node would make one up: one cluster reporting three ClusterIds, which
            # librdkafka takes for three clusters.
            raise RaftConfigError(
                "cluster.id is required for a multi-node (Raft) cluster: set the same value on"
                " every node (`raftlog cluster up` does; a node that ran before keeps the one"
                " in its meta.properties)"
            )
        return quorum

    # --- Lifecycle --------------------------------------------------------------------------

    async def __aenter__(self) -> RaftQuorum:
        try:
            await self.open()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def open(self) -> None:
        """Check the data directory, start Raft, and replay the local log and snapshot.

        Does not wait for the other voters: the image may be behind until this node has caught
        up (:meth:`wait_caught_up`).

        Raises:
            RaftConfigError: the data directory belongs to another cluster or node, or holds a
                single-voter log.
            QuorumError: the Raft port cannot be bound, or startup did not finish in time.
            QuorumFailedError: the local log or snapshot cannot be applied.
        """
        assert not self._opened and not self._closed, "open() is called once"
        self._opened = True
        if threading.current_thread() is not threading.main_thread():
            # pysyncobj's tick thread exits when the thread that built it exits.
            raise QuorumError("RaftQuorum must be opened from trio.run in the main thread")
        self._cluster_id = await trio.to_thread.run_sync(self._prepare_dir_sync)
        self._bridge = _Bridge(self, trio.lowlevel.current_trio_token())
        # Built here, in the main thread, synchronously: it reads the journal and derives the
        # key from the secret (tens of milliseconds, once).
        try:
            self._sync = self._make_syncobj()
        except RaftStorageError as exc:
            raise QuorumFailedError(f"the Raft journal cannot be read: {exc}") from exc
        with trio.move_on_after(OPEN_TIMEOUT_S):
            while True:
                view = self._sync.view
                if self._sync.failure is not None:
                    raise QuorumFailedError(f"metadata replay failed: {self._sync.failure}")
                if view is not None and view.bind_failed:
                    raise QuorumError(f"cannot bind the Raft port {self._bind_address}")
                if view is not None and view.started:
                    break
                await trio.sleep(POLL_INTERVAL_S)
            self._publish(self._machine_image_after_start())
            logger.info(
                "raft quorum open: node %d (%s), cluster %s, %d voters, metadata version %d",
                self._node_id, "voter" if self.is_voter else "observer", self._cluster_id,
                len(self._voters), self._image.version,
            )  # fmt: skip
            return
        raise QuorumError(f"Raft did not start within {OPEN_TIMEOUT_S} s")

    async def aclose(self) -> None:
        """Stop Raft (releasing the port); waiting and later calls fail with QuorumClosedError."""
        if self._closed:
            return
        self._closed = True
        sync = self._sync
        if sync is not None:
            sync.destroy()
            thread = sync._SyncObj__thread
            with trio.CancelScope(shield=True):
                if thread is not None:
                    await trio.to_thread.run_sync(thread.join, CLOSE_TIMEOUT_S)
            if thread is not None and thread.is_alive():
                logger.error("raft tick thread did not stop within %s s", CLOSE_TIMEOUT_S)
            else:
                _close_wakeup_pipe(sync)
        for waiter in list(self._waiters):
            self._finish(waiter, None, _CLOSED)
        self._waiters.clear()
        self._changed.set()

    # --- The Quorum interface ---------------------------------------------------------------

    @property
    def image(self) -> MetadataImage:
        """The latest applied image (a local read: see :meth:`read_barrier`)."""
        return self._image

    @property
    def controller_ready(self) -> bool:
        """Raft leader now, with ``BecomeController`` for the current Raft term applied."""
        sync = self._sync
        if sync is None or self._closed or self._failure is not None or not self.is_voter:
            return False
        image = self._image
        return bool(
            sync._isLeader()
            and image.controller_node_id == self._node_id
            and image.controller_term == sync.raftCurrentTerm
            and sync.tick_thread_alive()
        )

    @property
    def leader_node_id(self) -> int | None:
        """The Raft leader this node believes in (possibly stale), or None."""
        sync = self._sync
        if sync is None or self._closed:
            return None
        leader = sync._getLeader()
        return None if leader is None else self._voter_ids_by_address.get(str(leader.id))

    async def propose(
        self,
        record: Record,
        *,
        expected_version: int | None = None,
        request_id: str | None = None,
        timeout_s: float = PROPOSE_TIMEOUT_S_DEFAULT,
    ) -> ApplyResult:
        """Replicate ``record`` under the current controller term; return the apply result.

        The result can still be NOT_CONTROLLER if leadership moved after the check (the state
        machine fences the old term); the image is unchanged then.

        Raises:
            NotControllerError: this node is not the ready controller, or lost leadership
                before the command committed (it was not applied).
            QuorumBusyError: too many proposals are waiting, or Raft's queue is full.
            ProposalTimeoutError: no outcome within ``timeout_s``, or the outcome cannot be known
                (``outcome_unknown=True``): retry with the same ``request_id``.
            QuorumClosedError, QuorumFailedError: the quorum cannot take writes.
            RecordFormatError: ``record`` has fields of the wrong type.
            QuorumError: the encoded command is over ``RAFT_COMMAND_MAX_BYTES``.
        """
        sync = self._check_open()
        if isinstance(record, BecomeController):
            raise QuorumError("BecomeController is proposed by the Raft quorum itself")
        if not self.controller_ready:
            raise self._not_controller("cannot propose")
        if len(self._waiters) >= self._pending_max:
            raise QuorumBusyError(f"{len(self._waiters)} metadata proposals already waiting")
        request_id = request_id or uuid.uuid4().hex
        command = Command(record, self._image.controller_term, request_id, expected_version)
        payload = encode_command(command)
        if len(payload) > RAFT_COMMAND_MAX_BYTES:
            # Peers refuse Raft messages over a cap sized for commands up to this limit.
            raise QuorumError(
                f"metadata command of {len(payload)} bytes is over the Raft limit of "
                f"{RAFT_COMMAND_MAX_BYTES} bytes"
            )
        waiter, submission = self._new_submission(request_id)
        self._waiters.add(waiter)
        try:
            sync.submit(payload, submission)
            with trio.move_on_after(timeout_s):
                await waiter.done.wait()
        finally:
            self._waiters.discard(waiter)
        if not waiter.done.is_set():
            raise ProposalTimeoutError(
                f"proposal not committed within {timeout_s} s; it may still apply",
                outcome_unknown=True,
            )
        result = self._outcome(waiter, "proposal")
        assert isinstance(result, ApplyResult), result
        return result

    async def read_barrier(self, timeout_s: float = PROPOSE_TIMEOUT_S_DEFAULT) -> MetadataImage:
        """A linearizable read: the image after a no-op committed in this controller's term.

        Reflects every command acknowledged (by any controller) before the call. Concurrent
        callers share one barrier; a caller only joins a barrier submitted after it arrived.

        Raises:
            NotControllerError: not the ready controller, or leadership was lost meanwhile.
            QuorumTimeoutError: the barrier did not commit within ``timeout_s``.
        """
        sync = self._check_open()
        if not self.controller_ready:
            raise self._not_controller("linearizable reads are served by the controller only")
        needed = self._barrier_next_seq
        barrier: _Barrier | None = None
        with trio.move_on_after(timeout_s):
            while True:
                barrier = self._barrier
                if barrier is None:
                    barrier = self._start_barrier(sync)
                await barrier.waiter.done.wait()
                if barrier.seq >= needed:
                    break
        if barrier is None or not barrier.waiter.done.is_set():
            raise QuorumTimeoutError(f"read barrier did not commit within {timeout_s} s")
        self._outcome(barrier.waiter, "read barrier")
        return self._image

    async def wait_for_version(self, version: int, timeout_s: float) -> MetadataImage:
        """Wait until ``image.version >= version``.

        Raises:
            QuorumTimeoutError: not reached within ``timeout_s``.
        """
        return await self._wait_until(lambda: self._image.version >= version, timeout_s)

    async def wait_changed(self, since_version: int, timeout_s: float) -> MetadataImage:
        """Wait until ``image.version > since_version`` and return the latest image.

        Raises:
            QuorumTimeoutError: nothing changed within ``timeout_s``.
        """
        return await self._wait_until(lambda: self._image.version > since_version, timeout_s)

    def status(self) -> QuorumStatus:
        """Voters, observers, leader, term, commit/applied index, per-voter lag (from the
        state after the tick thread's latest tick)."""
        sync = self._sync
        view = None if sync is None else sync.view
        image = self._image
        if view is None:
            return QuorumStatus(
                self._node_id, "observer" if not self.is_voter else "follower", None, 0,
                image.controller_term, image.controller_node_id, False, 0, 0, 0, image.version,
                tuple(VoterStatus(v.node_id, f"{v.host}:{v.port}", False) for v in self._voters),
            )  # fmt: skip
        leading = view.state == LEADER
        voters = tuple(self._voter_status(voter, view, leading) for voter in self._voters)
        observers: tuple[ObserverStatus, ...] = ()
        if leading:
            observers = tuple(self._observer_status(key, view) for key in view.observers)
        return QuorumStatus(
            node_id=self._node_id,
            role=_role_name(view.state, self.is_voter),
            leader_node_id=None
            if view.leader is None
            else self._voter_ids_by_address.get(view.leader),
            term=view.term,
            controller_term=image.controller_term,
            controller_node_id=image.controller_node_id,
            controller_ready=self.controller_ready,
            commit_index=view.commit_index,
            last_applied=view.last_applied,
            last_log_index=view.last_log_index,
            metadata_version=image.version,
            voters=voters,
            observers=observers,
        )

    # --- Extras -------------------------------------------------------------------------------

    @property
    def node_id(self) -> int:
        """This node's id."""
        return self._node_id

    @property
    def is_voter(self) -> bool:
        """False for a non-voting observer (``process.roles=broker``)."""
        return self._self_address is not None

    @property
    def cluster_id(self) -> str | None:
        """The cluster id from ``meta.properties`` (None before :meth:`open`)."""
        return self._cluster_id

    @property
    def caught_up(self) -> bool:
        """Whether this node has applied everything the leader had committed when it joined."""
        sync = self._sync
        view = None if sync is None else sync.view
        return view is not None and view.caught_up

    @property
    def syncobj(self) -> RaftSyncObj:
        """The underlying pysyncobj object (diagnostics and tests)."""
        assert self._sync is not None, "not open"
        return self._sync

    async def wait_controller_ready(self, timeout_s: float) -> MetadataImage:
        """Wait until this node is the ready controller.

        Raises:
            QuorumTimeoutError: it did not become controller within ``timeout_s``.
        """
        return await self._wait_until(lambda: self.controller_ready, timeout_s)

    async def wait_caught_up(self, timeout_s: float) -> MetadataImage:
        """Wait until :attr:`caught_up` (polled: the tick thread does not announce it).

        Raises:
            QuorumTimeoutError: not caught up within ``timeout_s``.
        """
        with trio.move_on_after(timeout_s):
            while not self.caught_up:
                self._check_open()
                await trio.sleep(POLL_INTERVAL_S)
            return self._image
        raise QuorumTimeoutError(f"not caught up with the leader within {timeout_s} s")

    # --- Internals ------------------------------------------------------------------------------

    def _make_syncobj(self) -> RaftSyncObj:
        return make_syncobj(
            self_address=self._self_address,
            peer_addresses=[a for a in self._voter_ids_by_address if a != self._self_address],
            data_dir=self._partition_dir,
            password=self._secret,
            machine=self._machine,
            node_id=self._node_id,
            settings=self._settings,
            bind_address=self._bind_address,
            listener=self._bridge,
        )

    def _prepare_dir_sync(self) -> str:
        self._partition_dir.mkdir(parents=True, exist_ok=True)
        local_log = self._partition_dir / logfile.LOG_FILE_NAME
        has_local = (local_log.exists() and local_log.stat().st_size > 0) or any(
            self._partition_dir.glob("*" + logfile.CHECKPOINT_SUFFIX)
        )
        if has_local:
            raise RaftConfigError(
                f"{self._partition_dir} holds a single-voter (LocalQuorum) metadata log; a Raft "
                "quorum cannot adopt it: start from an empty metadata.log.dir"
            )
        try:
            meta = check_meta_properties(
                self._partition_dir, self._configured_cluster_id, self._node_id, _new_cluster_id
            )
        except MetaPropertiesError as exc:
            raise RaftConfigError(str(exc)) from exc
        return meta.cluster_id

    def _machine_image_after_start(self) -> MetadataImage:
        # The tick thread has finished its first full tick; the bridge may still hold the
        # image hand-off, so take the newest one it has seen.
        bridge = self._bridge
        assert bridge is not None
        with bridge._lock:
            image = bridge._next_image
        return image if image is not None else self._image

    def _check_open(self) -> RaftSyncObj:
        if self._failure is not None:
            raise self._failure
        if self._closed or self._sync is None:
            raise QuorumClosedError("metadata quorum is not open")
        return self._sync

    def _not_controller(self, what: str) -> NotControllerError:
        leader = self.leader_node_id
        return NotControllerError(
            f"node {self._node_id} is not the ready controller ({what}); "
            f"Raft leader: {leader if leader is not None else 'unknown'}",
            leader_node_id=leader,
        )

    def _new_submission(self, request_id: str | None) -> tuple[_Waiter, Submission]:
        waiter = _Waiter()
        bridge = self._bridge
        assert bridge is not None

        def on_done(result: object, error: int) -> None:  # tick thread (or trio: QUEUE_FULL)
            bridge.call_soon(self._finish, waiter, result, error)

        return waiter, Submission(request_id, on_done)

    def _start_barrier(self, sync: RaftSyncObj) -> _Barrier:
        barrier = _Barrier(self._barrier_next_seq)
        self._barrier_next_seq += 1
        self._barrier = barrier
        bridge = self._bridge
        assert bridge is not None

        def on_done(result: object, error: int) -> None:
            bridge.call_soon(self._finish_barrier, barrier, error)

        sync.submit_barrier(Submission(None, on_done))
        return barrier

    def _finish_barrier(self, barrier: _Barrier, error: int) -> None:
        if self._barrier is barrier:
            self._barrier = None
        self._finish(barrier.waiter, None, error)

    def _finish(self, waiter: _Waiter, result: object, error: int) -> None:
        # trio thread; runs from run_sync_soon, so it must not raise.
        if waiter.done.is_set():
            return
        waiter.result = result
        waiter.error = error
        waiter.done.set()

    def _outcome(self, waiter: _Waiter, what: str) -> object:
        error = waiter.error
        if error == FAIL_REASON.SUCCESS:
            return waiter.result
        if error == _CLOSED:
            raise QuorumClosedError("metadata quorum closed")
        if error == FAIL_REASON.QUEUE_FULL:
            raise QuorumBusyError("Raft command queue is full")
        if error in (
            FAIL_REASON.NOT_LEADER,
            FAIL_REASON.MISSING_LEADER,
            FAIL_REASON.DISCARDED,
            Submission.NOT_APPLIED,
        ):
            raise self._not_controller(f"{what} not committed: leadership was lost")
        if error in (FAIL_REASON.LEADER_CHANGED, FAIL_REASON.UNKNOWN_OUTCOME):
            raise ProposalTimeoutError(
                f"{what}: outcome unknown after a leader change", outcome_unknown=True
            )
        raise QuorumError(f"{what} failed in Raft with error {error}")

    def _publish(self, image: MetadataImage) -> None:
        # trio thread; runs from run_sync_soon, so it must not raise.
        if image.version < self._image.version:
            logger.error("raft: not publishing image %d older than %d", image.version,
                         self._image.version)  # fmt: skip
            return
        self._image = image
        self._on_raft_event()

    def _on_raft_event(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _on_failed(self, error: BaseException) -> None:
        self._failure = QuorumFailedError(f"metadata apply failed: {error}")
        for waiter in list(self._waiters):
            self._finish(waiter, None, FAIL_REASON.UNKNOWN_OUTCOME)
        self._on_raft_event()

    async def _wait_until(self, reached: Callable[[], bool], timeout_s: float) -> MetadataImage:
        with trio.move_on_after(timeout_s):
            while not reached():
                self._check_open()
                await self._changed.wait()
            return self._image
        raise QuorumTimeoutError(f"metadata did not change as awaited within {timeout_s} s")

    @staticmethod
    def _observer_status(key: str, view: RaftView) -> ObserverStatus:
        match = view.match_index.get(key)
        lag = None if match is None else view.last_log_index - match
        return ObserverStatus(_observer_node_id(key), match, lag)

    def _voter_status(self, voter: QuorumVoter, view: RaftView, leading: bool) -> VoterStatus:
        address = f"{voter.host}:{voter.port}"
        is_self = address == self._self_address
        match: int | None = None
        contact: float | None = None
        if leading:
            match = view.last_log_index if is_self else view.match_index.get(address)
            contact = 0.0 if is_self else view.last_contact_s.get(address)
        return VoterStatus(
            node_id=voter.node_id,
            address=address,
            connected=is_self or address in view.connected,
            match_index=match,
            lag=None if match is None else view.last_log_index - match,
            last_contact_s=contact,
        )


def _role_name(state: int, is_voter: bool) -> str:
    if not is_voter:
        return "observer"
    return {LEADER: "leader", CANDIDATE: "candidate"}.get(state, "follower")


def _observer_node_id(key: str) -> int | None:
    match = _OBSERVER_NODE.fullmatch(key)
    return None if match is None else int(match.group(1))


def _new_cluster_id() -> str:
    # Kafka's format: a random UUID in URL-safe base64 without padding (22 characters).
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def _close_wakeup_pipe(sync: Any) -> None:
    # pysyncobj never closes its wake-up pipe; after the tick thread stopped it is unused.
    notifier = getattr(sync, "_SyncObj__pipeNotifier", None)
    for name in ("_PipeNotifier__pipeR", "_PipeNotifier__pipeW"):
        fd = getattr(notifier, name, None)
        if isinstance(fd, int):
            with contextlib.suppress(OSError):
                os.close(fd)
