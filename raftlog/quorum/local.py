"""``LocalQuorum``: the metadata quorum in its single-voter form (no Raft).

With one voter, a command is committed once its frame is written and fsynced: one voter is a
majority. ``LocalQuorum`` is the trio edge around the pure state machine: it appends proposals to
the log file in batches that share one fsync (group commit), applies them in log order, publishes
the new image by swapping one reference, and wakes waiters. The Raft milestone replaces it with a
``RaftQuorum`` offering the same :class:`~raftlog.quorum.interface.Quorum` interface.

Every wait has a timeout. A proposal that times out after it was handed to the log has an
unknown outcome (it may still apply); retry it with the same ``request_id`` and the state machine
returns the first result instead of applying it twice.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

import trio

from raftlog.metadata.image import BrokerEndpoint, MetadataImage
from raftlog.metadata.records import (
    BecomeController,
    Command,
    Record,
    RegisterBroker,
    UnfenceBroker,
    decode_command,
    encode_command,
)
from raftlog.metadata.state import ApplyResult, MetadataStateMachine
from raftlog.metrics.recorders import Counter
from raftlog.quorum import logfile
from raftlog.quorum.interface import (
    PROPOSE_TIMEOUT_S_DEFAULT,
    ProposalTimeoutError,
    QuorumBusyError,
    QuorumClosedError,
    QuorumError,
    QuorumFailedError,
    QuorumStatus,
    QuorumTimeoutError,
    VoterStatus,
)

logger = logging.getLogger(__name__)

SNAPSHOT_INTERVAL_RECORDS_DEFAULT: Final = 10_000
PENDING_MAX_DEFAULT: Final = 1024


@dataclass(frozen=True, slots=True)
class LocalNode:
    """The node a ``LocalQuorum`` registers on open.

    ``host``/``port`` are the advertised client endpoint; pass the bound port, not 0.
    """

    node_id: int
    host: str
    port: int
    rack: str | None = None
    endpoints: tuple[BrokerEndpoint, ...] = ()  # every listener (RegisterBroker's)


class _Proposal:
    """One proposal waiting for, or done with, its commit."""

    __slots__ = ("error", "payload", "result")

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.result: ApplyResult | None = None
        self.error: QuorumError | None = None

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None

    def outcome(self) -> ApplyResult:
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


class LocalQuorum:
    """A one-voter quorum over a local, fsynced log file. See the module docstring.

    Use as ``async with LocalQuorum(path, MetadataStateMachine(), node=...) as quorum:``.
    With ``node`` set, opening bumps the controller term (previous + 1) and registers and
    unfences that node. Without it, opening only replays (useful for inspection tools).

    Attributes:
        fsync_count: Log fsyncs so far (one per committed batch).
        snapshot_count: Checkpoints written so far.
    """

    def __init__(
        self,
        metadata_dir: Path,
        state_machine: MetadataStateMachine,
        *,
        node: LocalNode | None = None,
        snapshot_interval_records: int = SNAPSHOT_INTERVAL_RECORDS_DEFAULT,
        pending_max: int = PENDING_MAX_DEFAULT,
    ) -> None:
        assert snapshot_interval_records >= 1
        assert pending_max >= 1
        self._partition_dir = Path(metadata_dir) / logfile.PARTITION_DIR_NAME
        self._state_machine = state_machine
        self._node = node
        self._snapshot_interval_records = snapshot_interval_records
        self._pending_max = pending_max
        self._image = state_machine.image
        self._commit_lock = trio.Lock()
        self._pending: list[_Proposal] = []
        self._changed = trio.Event()
        self._writer: logfile.LogWriter | None = None
        self._next_offset = 0
        self._snapshot_version = -1
        self._failure: QuorumFailedError | None = None
        self._closed = False
        self.fsync_count = 0
        self.snapshot_count = 0
        self._proposal_timeouts = Counter()
        self._storage_errors = Counter()  # failed commits (fail-stop) and checkpoints

    # --- Lifecycle --------------------------------------------------------------------------

    async def __aenter__(self) -> LocalQuorum:
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
        """Replay the checkpoint and log, then (with ``node``) start a new controller term.

        Raises:
            MetadataLogCorruptError: the log is damaged beyond a torn tail.
            QuorumError: self-registration was rejected.
        """
        assert self._writer is None and not self._closed, "open() is called once"
        assert self._state_machine.image.version == -1, "replay needs a fresh state machine"
        await trio.to_thread.run_sync(self._recover_sync)
        self._publish()
        async with self._commit_lock:
            await self._maybe_compact()
        if self._node is not None:
            await self._start_term(self._node)

    async def aclose(self) -> None:
        """Close the log; waiting and later proposals fail with ``QuorumClosedError``."""
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            async with self._commit_lock:
                if self._writer is not None:
                    self._writer.close()
        self._fail_pending(QuorumClosedError("metadata quorum closed"))

    # --- The Quorum interface ---------------------------------------------------------------

    @property
    def image(self) -> MetadataImage:
        """The latest applied image."""
        return self._image

    @property
    def controller_ready(self) -> bool:
        """Always True while open: the single voter is the controller."""
        return self._writer is not None and not self._closed and self._failure is None

    @property
    def leader_node_id(self) -> int | None:
        """This node's id (None when opened without ``node``)."""
        return None if self._node is None else self._node.node_id

    def status(self) -> QuorumStatus:
        """A one-voter status: this node leads, and everything written is committed."""
        version = self._image.version
        node_id = -1 if self._node is None else self._node.node_id
        voters = (
            ()
            if self._node is None
            else (VoterStatus(node_id, f"{self._node.host}:{self._node.port}", True, version, 0),)
        )
        return QuorumStatus(
            node_id=node_id,
            role="leader",
            leader_node_id=self.leader_node_id,
            term=self._image.controller_term,
            controller_term=self._image.controller_term,
            controller_node_id=self._image.controller_node_id,
            controller_ready=self.controller_ready,
            commit_index=version,
            last_applied=version,
            last_log_index=version,
            metadata_version=version,
            voters=voters,
        )

    def leader_contact_age_s(self) -> float:
        """Always 0: this node is the only voter, hence the leader."""
        return 0.0

    def error_counts(self) -> Mapping[str, int]:
        """Proposal timeouts and storage errors (there is no transport)."""
        return {"proposal_timeout": self._proposal_timeouts.value, "transport": 0,
                "storage": self._storage_errors.value}

    async def propose(
        self,
        record: Record,
        *,
        expected_version: int | None = None,
        request_id: str | None = None,
        timeout_s: float = PROPOSE_TIMEOUT_S_DEFAULT,
    ) -> ApplyResult:
        """Append ``record`` to the log, fsync, apply, and return the result.

        Concurrent proposals share one write and one fsync.

        Raises:
            QuorumBusyError: ``pending_max`` proposals are already waiting.
            ProposalTimeoutError: not committed within ``timeout_s``.
            QuorumClosedError, QuorumFailedError: the quorum cannot take writes.
            RecordFormatError: ``record`` has fields of the wrong type.
        """
        self._check_writable()
        if len(self._pending) >= self._pending_max:
            raise QuorumBusyError(f"{len(self._pending)} metadata proposals already waiting")
        proposal = _Proposal(self._encode(record, expected_version, request_id))
        self._pending.append(proposal)
        try:
            with trio.fail_after(timeout_s):
                while not proposal.done:
                    async with self._commit_lock:
                        if not proposal.done:
                            await self._commit_pending()
        except trio.TooSlowError:
            self._withdraw_or_raise(proposal, timeout_s)
        return proposal.outcome()

    async def wait_for_version(self, version: int, timeout_s: float) -> MetadataImage:
        """Wait until ``image.version >= version``.

        Raises:
            QuorumTimeoutError: not reached within ``timeout_s``.
        """
        return await self._wait_until(lambda: self._image.version >= version, timeout_s)

    async def wait_changed(self, since_version: int, timeout_s: float) -> MetadataImage:
        """Wait until ``image.version > since_version`` and return the latest image.

        Intermediate images are skipped: a slow watcher always gets the newest one.

        Raises:
            QuorumTimeoutError: nothing changed within ``timeout_s``.
        """
        return await self._wait_until(lambda: self._image.version > since_version, timeout_s)

    # --- Proposing and committing -----------------------------------------------------------

    def _encode(
        self, record: Record, expected_version: int | None, request_id: str | None
    ) -> bytes:
        # BecomeController carries its own new term; everything else the current one.
        term = record.term if isinstance(record, BecomeController) else self._image.controller_term
        command = Command(record, term, request_id or uuid.uuid4().hex, expected_version)
        return encode_command(command)

    def _check_writable(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._closed or self._writer is None:
            raise QuorumClosedError("metadata quorum is not open")

    def _withdraw_or_raise(self, proposal: _Proposal, timeout_s: float) -> None:
        if proposal.done:
            return
        self._proposal_timeouts.inc()
        if proposal in self._pending:
            self._pending.remove(proposal)
            raise ProposalTimeoutError(
                f"proposal not committed within {timeout_s} s; withdrawn", outcome_unknown=False
            )
        raise ProposalTimeoutError(
            f"proposal not committed within {timeout_s} s; it may still apply",
            outcome_unknown=True,
        )

    async def _commit_pending(self) -> None:
        """Write, fsync and apply every pending proposal as one batch (lock held)."""
        assert self._commit_lock.locked()
        batch, self._pending = self._pending, []
        assert batch, "the caller's own proposal is pending"
        try:
            self._check_writable()
        except QuorumError as exc:
            self._fail(batch, exc)
            return
        # Shielded: once frames may be on disk, they must be applied before anyone else runs.
        with trio.CancelScope(shield=True):
            try:
                first_offset = self._next_offset
                await trio.to_thread.run_sync(self._write_batch_sync, batch, first_offset)
                self._apply_batch(batch, first_offset)
            except BaseException as exc:
                # A failed write or fsync leaves the file in an unknown state (and after a failed
                # fsync the page cache may lie), so stop taking writes; a restart replays the log.
                self._storage_errors.inc()
                self._failure = QuorumFailedError(f"metadata log commit failed: {exc!r}")
                self._fail(batch, self._failure)
                raise self._failure from exc
            await self._maybe_compact()

    def _write_batch_sync(self, batch: list[_Proposal], first_offset: int) -> None:
        writer = self._writer
        assert writer is not None
        frames = [
            logfile.encode_frame(logfile.encode_entry(first_offset + i, proposal.payload))
            for i, proposal in enumerate(batch)
        ]
        writer.append(b"".join(frames))
        self.fsync_count += 1

    def _apply_batch(self, batch: list[_Proposal], first_offset: int) -> None:
        # Apply what the log holds (decoded from the bytes), exactly as a replay will.
        for i, proposal in enumerate(batch):
            command = decode_command(proposal.payload)
            proposal.result = self._state_machine.apply(command, first_offset + i)
        self._next_offset = first_offset + len(batch)
        assert self._state_machine.image.version == self._next_offset - 1
        self._publish()

    def _fail(self, batch: list[_Proposal], error: QuorumError) -> None:
        for proposal in batch:
            if not proposal.done:
                proposal.error = error

    def _fail_pending(self, error: QuorumError) -> None:
        batch, self._pending = self._pending, []
        self._fail(batch, error)

    def _publish(self) -> None:
        self._image = self._state_machine.image
        self._changed.set()
        self._changed = trio.Event()

    async def _wait_until(self, reached: Callable[[], bool], timeout_s: float) -> MetadataImage:
        with trio.move_on_after(timeout_s):
            while not reached():
                await self._changed.wait()
            return self._image
        raise QuorumTimeoutError(f"metadata did not change as awaited within {timeout_s} s")

    # --- Recovery, checkpoints and the controller term --------------------------------------

    def _recover_sync(self) -> None:
        recovered = logfile.recover(self._partition_dir)
        if recovered.snapshot is not None:
            self._state_machine.restore(recovered.snapshot)
            if self._state_machine.image.version != recovered.snapshot_version:
                raise logfile.MetadataLogCorruptError(
                    f"checkpoint {recovered.snapshot_version} holds an image at version "
                    f"{self._state_machine.image.version}"
                )
        for offset, command in recovered.entries:
            self._state_machine.apply(decode_command(command), offset)
        self._snapshot_version = recovered.snapshot_version
        self._next_offset = self._state_machine.image.version + 1
        self._writer = logfile.LogWriter(self._partition_dir)
        logger.info(
            "metadata replayed: checkpoint at %d, %d log records, version %d",
            recovered.snapshot_version, len(recovered.entries), self._next_offset - 1,
        )  # fmt: skip

    async def _maybe_compact(self) -> None:
        """Checkpoint and empty the log once it holds ``snapshot_interval_records`` records."""
        assert self._commit_lock.locked()
        log_records = self._next_offset - (self._snapshot_version + 1)
        if log_records < self._snapshot_interval_records:
            return
        version = self._next_offset - 1
        with trio.CancelScope(shield=True):
            try:
                await trio.to_thread.run_sync(self._compact_sync, version)
            except OSError:
                # The log still holds everything; try again after the next batch.
                self._storage_errors.inc()
                logger.exception("metadata checkpoint at %d failed; keeping the log", version)
                return
        self._snapshot_version = version
        self.snapshot_count += 1

    def _compact_sync(self, version: int) -> None:
        # Safe off the trio thread: the commit lock is held, so nothing applies meanwhile.
        snapshot = self._state_machine.snapshot()
        assert self._state_machine.image.version == version
        # Order matters: the checkpoint is durable before the log it replaces is emptied, so a
        # crash at any point leaves either the old log or the new checkpoint (or both).
        logfile.write_checkpoint(self._partition_dir, version, snapshot)
        writer = self._writer
        assert writer is not None
        writer.truncate_all()
        logfile.remove_checkpoints_before(self._partition_dir, version)

    async def _start_term(self, node: LocalNode) -> None:
        term = self._image.controller_term + 1
        records: tuple[Record, ...] = (
            BecomeController(term, node.node_id),
            RegisterBroker(node.node_id, node.host, node.port, node.rack, uuid.uuid4().hex,
                           node.endpoints),
            UnfenceBroker(node.node_id),
        )
        for record in records:
            result = await self.propose(record)
            if not result.ok:
                raise QuorumError(f"{type(record).__name__} rejected: {result.message}")
        assert self._image.controller_term == term
