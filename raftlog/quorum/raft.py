"""``RaftQuorum``: the metadata quorum replicated by Raft (pysyncobj), bridged to trio.

Same :class:`~raftlog.quorum.interface.Quorum` interface as ``LocalQuorum``; use it as
``async with RaftQuorum.from_config(config) as quorum:`` from ``trio.run`` in the main thread.

Threads. pysyncobj runs its own tick thread (``autoTick``): it does the networking, appends and
fsyncs the journal, applies committed entries to the state machine and fires callbacks. Nothing
here blocks trio on Raft or calls Raft synchronously from the tick thread: proposals are queued
with a callback, and the tick thread hands results back with ``TrioToken.run_sync_soon``
(:mod:`raftlog.quorum.raft_bridge`). Applying builds a new immutable image; the trio side swaps
one reference and wakes waiters, exactly like ``LocalQuorum`` (an image is published before the
result of the command that produced it).

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

Voters come from ``controller.quorum.voters`` (:mod:`raftlog.quorum.raft_membership`); a voter
binds its own entry (its CONTROLLER listener). ``process.roles=broker`` nodes join as non-voting
observers (pysyncobj's read-only nodes) and only follow the log. A shared secret (``raft.secret``)
is required: it authenticates and encrypts every Raft message (without it pysyncobj unpickles
anyone's bytes).

Data: ``<metadata.log.dir>/__cluster_metadata-0/`` holds ``raft.journal`` (+ ``.meta``),
``raft.snapshot`` and ``meta.properties`` (cluster and node id, checked on every start).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import trio
from pysyncobj.config import FAIL_REASON

from raftlog.config import QuorumVoter, ServerConfig
from raftlog.metadata.image import MetadataImage
from raftlog.metadata.records import BecomeController, Command, Record, encode_command
from raftlog.metadata.state import ApplyResult, MetadataStateMachine
from raftlog.metrics.recorders import Counter
from raftlog.quorum import logfile
from raftlog.quorum.interface import (
    PROPOSE_TIMEOUT_S_DEFAULT,
    NotControllerError,
    ProposalTimeoutError,
    QuorumBusyError,
    QuorumClosedError,
    QuorumError,
    QuorumFailedError,
    QuorumStatus,
    QuorumTimeoutError,
)
from raftlog.quorum.local import PENDING_MAX_DEFAULT
from raftlog.quorum.raft_bridge import CLOSED, Barrier, TrioBridge, Waiter, outcome
from raftlog.quorum.raft_events import Submission
from raftlog.quorum.raft_membership import RaftConfigError, RaftMembership
from raftlog.quorum.raft_settings import RaftSettings
from raftlog.quorum.raft_storage import (
    MetaPropertiesError,
    RaftStorageError,
    prepare_data_dir,
)
from raftlog.quorum.raft_syncobj import RaftSyncObj, make_syncobj
from raftlog.quorum.raft_transport import RAFT_COMMAND_MAX_BYTES

__all__ = ["RaftConfigError", "RaftQuorum", "RaftSettings"]

logger = logging.getLogger(__name__)

OPEN_TIMEOUT_S: Final = 30.0
CLOSE_TIMEOUT_S: Final = 10.0
# Why 10 ms: only used while waiting for startup or for a condition the tick thread does not
# announce (catching up); never on the proposal path.
POLL_INTERVAL_S: Final = 0.01


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
        self._members = RaftMembership.resolve(
            node_id, voters, is_voter=is_voter, bind_host=bind_host
        )
        assert pending_max >= 1
        self._node_id = node_id
        self._partition_dir = Path(metadata_dir) / logfile.PARTITION_DIR_NAME
        self._secret = secret
        self._configured_cluster_id = cluster_id
        self._cluster_id: str | None = None
        self._settings = settings if settings is not None else RaftSettings()
        self._pending_max = pending_max
        self._machine = MetadataStateMachine()
        self._image = self._machine.image
        self._changed = trio.Event()
        self._waiters: set[Waiter] = set()
        self._barrier: Barrier | None = None
        self._barrier_next_seq = 0
        self._sync: RaftSyncObj | None = None
        self._bridge: TrioBridge | None = None
        self._failure: QuorumFailedError | None = None
        self._proposal_timeouts = Counter()  # proposals and barriers (trio thread only)
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
        self._bridge = TrioBridge(
            trio.lowlevel.current_trio_token(),
            publish=self._publish, changed=self._on_raft_event, failed=self._on_failed,
        )
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
                    raise QuorumError(f"cannot bind the Raft port {self._members.bind_address}")
                if view is not None and view.started:
                    break
                await trio.sleep(POLL_INTERVAL_S)
            self._publish(self._machine_image_after_start())
            logger.info(
                "raft quorum open: node %d (%s), cluster %s, %d voters, metadata version %d",
                self._node_id, "voter" if self.is_voter else "observer", self._cluster_id,
                len(self._members.voters), self._image.version,
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
            waiter.finish(None, CLOSED)
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
        return None if leader is None else self._members.voter_id(str(leader.id))

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
        try:
            if not waiter.done.is_set():
                raise ProposalTimeoutError(
                    f"proposal not committed within {timeout_s} s; it may still apply",
                    outcome_unknown=True,
                )
            result = outcome(waiter, "proposal", self._not_controller)
        except QuorumTimeoutError:
            self._proposal_timeouts.inc()
            raise
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
        barrier: Barrier | None = None
        with trio.move_on_after(timeout_s):
            while True:
                barrier = self._barrier
                if barrier is None:
                    barrier = self._start_barrier(sync)
                await barrier.waiter.done.wait()
                if barrier.seq >= needed:
                    break
        if barrier is None or not barrier.waiter.done.is_set():
            self._proposal_timeouts.inc()
            raise QuorumTimeoutError(f"read barrier did not commit within {timeout_s} s")
        outcome(barrier.waiter, "read barrier", self._not_controller)
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
        return self._members.status(view, self._image, self.controller_ready)

    def leader_contact_age_s(self) -> float:
        """Seconds since the Raft leader was last heard from (0 on the leader)."""
        sync = self._sync
        return 0.0 if sync is None else sync.leader_contact_age_s()

    def error_counts(self) -> Mapping[str, int]:
        """Timed-out proposals/barriers, refused or lost links, failed journal writes."""
        sync = self._sync
        return {
            "proposal_timeout": self._proposal_timeouts.value,
            "transport": 0 if sync is None else sync.transport.error_count,
            "storage": 0 if sync is None else sync.storage_errors,
        }

    # --- Extras -------------------------------------------------------------------------------

    @property
    def node_id(self) -> int:
        """This node's id."""
        return self._node_id

    @property
    def is_voter(self) -> bool:
        """False for a non-voting observer (``process.roles=broker``)."""
        return self._members.is_voter

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
            self_address=self._members.self_address,
            peer_addresses=self._members.peer_addresses,
            data_dir=self._partition_dir,
            password=self._secret,
            machine=self._machine,
            node_id=self._node_id,
            settings=self._settings,
            bind_address=self._members.bind_address,
            listener=self._bridge,
        )

    def _prepare_dir_sync(self) -> str:
        try:
            return prepare_data_dir(
                self._partition_dir, self._configured_cluster_id, self._node_id
            )
        except MetaPropertiesError as exc:
            raise RaftConfigError(str(exc)) from exc

    def _machine_image_after_start(self) -> MetadataImage:
        # The tick thread has finished its first full tick; the bridge may still hold the
        # image hand-off, so take the newest one it has seen.
        bridge = self._bridge
        assert bridge is not None
        image = bridge.latest_image()
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

    def _new_submission(self, request_id: str | None) -> tuple[Waiter, Submission]:
        waiter = Waiter()
        bridge = self._bridge
        assert bridge is not None

        def on_done(result: object, error: int) -> None:  # tick thread (or trio: QUEUE_FULL)
            bridge.call_soon(waiter.finish, result, error)

        return waiter, Submission(request_id, on_done)

    def _start_barrier(self, sync: RaftSyncObj) -> Barrier:
        barrier = Barrier(self._barrier_next_seq)
        self._barrier_next_seq += 1
        self._barrier = barrier
        bridge = self._bridge
        assert bridge is not None

        def on_done(result: object, error: int) -> None:
            bridge.call_soon(self._finish_barrier, barrier, error)

        sync.submit_barrier(Submission(None, on_done))
        return barrier

    def _finish_barrier(self, barrier: Barrier, error: int) -> None:
        if self._barrier is barrier:
            self._barrier = None
        barrier.waiter.finish(None, error)

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
            waiter.finish(None, FAIL_REASON.UNKNOWN_OUTCOME)
        self._on_raft_event()

    async def _wait_until(self, reached: Callable[[], bool], timeout_s: float) -> MetadataImage:
        with trio.move_on_after(timeout_s):
            while not reached():
                self._check_open()
                await self._changed.wait()
            return self._image
        raise QuorumTimeoutError(f"metadata did not change as awaited within {timeout_s} s")


def _close_wakeup_pipe(sync: Any) -> None:
    # pysyncobj never closes its wake-up pipe; after the tick thread stopped it is unused.
    notifier = getattr(sync, "_SyncObj__pipeNotifier", None)
    for name in ("_PipeNotifier__pipeR", "_PipeNotifier__pipeW"):
        fd = getattr(notifier, name, None)
        if isinstance(fd, int):
            with contextlib.suppress(OSError):
                os.close(fd)
