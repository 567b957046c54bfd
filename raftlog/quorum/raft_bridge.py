"""From pysyncobj's tick thread to trio: how results and new images cross over.

The tick thread must never block on trio nor call into it directly: :class:`TrioBridge` only
schedules work with ``TrioToken.run_sync_soon``, coalescing image hand-offs so that one pending
hand-off always carries the newest image. :class:`Waiter` is what a trio task awaits for one
submission's outcome (:func:`outcome` turns pysyncobj's error code into the quorum's exceptions);
:class:`Barrier` is the one shared read barrier of ``RaftQuorum.read_barrier``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Final

import trio
from pysyncobj.config import FAIL_REASON

from raftlog.metadata.image import MetadataImage
from raftlog.quorum.interface import (
    ProposalTimeoutError,
    QuorumBusyError,
    QuorumClosedError,
    QuorumError,
)
from raftlog.quorum.raft_events import RaftListener, Submission

# The error code of a submission still waiting when the quorum closed (not one of pysyncobj's).
CLOSED: Final = -1


class Waiter:
    """A submission waiting on the trio side."""

    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: object = None
        self.error: int | None = None

    def finish(self, result: object, error: int) -> None:
        """Record the outcome (the first one wins) and wake the waiting task.

        Runs on the trio thread, from ``run_sync_soon``, so it must not raise.
        """
        if self.done.is_set():
            return
        self.result = result
        self.error = error
        self.done.set()


def outcome(waiter: Waiter, what: str, not_controller: Callable[[str], Exception]) -> object:
    """The finished ``waiter``'s result, or the quorum error its pysyncobj error code means.

    Args:
        what: Names the submission in error messages ("proposal", "read barrier").
        not_controller: Builds the NotControllerError for a submission that cannot have applied.

    Raises:
        QuorumClosedError, QuorumBusyError, NotControllerError, ProposalTimeoutError (outcome
        unknown), QuorumError: as the error code says.
    """
    error = waiter.error
    if error == FAIL_REASON.SUCCESS:
        return waiter.result
    if error == CLOSED:
        raise QuorumClosedError("metadata quorum closed")
    if error == FAIL_REASON.QUEUE_FULL:
        raise QuorumBusyError("Raft command queue is full")
    if error in (
        FAIL_REASON.NOT_LEADER,
        FAIL_REASON.MISSING_LEADER,
        FAIL_REASON.DISCARDED,
        Submission.NOT_APPLIED,
    ):
        raise not_controller(f"{what} not committed: leadership was lost")
    if error in (FAIL_REASON.LEADER_CHANGED, FAIL_REASON.UNKNOWN_OUTCOME):
        raise ProposalTimeoutError(
            f"{what}: outcome unknown after a leader change", outcome_unknown=True
        )
    raise QuorumError(f"{what} failed in Raft with error {error}")


class Barrier:
    """A read barrier (a replicated no-op) that callers arriving before ``seq`` can share."""

    __slots__ = ("seq", "waiter")

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.waiter = Waiter()


class TrioBridge(RaftListener):
    """Tick thread -> trio. Every method runs on the tick thread and only schedules work.

    Args:
        token: The trio run that receives the work.
        publish: Called on the trio thread with the newest applied image.
        changed: Called on the trio thread when the Raft state changed.
        failed: Called on the trio thread when applying failed (the node stopped).
    """

    def __init__(
        self,
        token: trio.lowlevel.TrioToken,
        *,
        publish: Callable[[MetadataImage], None],
        changed: Callable[[], None],
        failed: Callable[[BaseException], None],
    ) -> None:
        self._token = token
        self._publish = publish
        self._changed = changed
        self._failed = failed
        self._lock = threading.Lock()
        self._next_image: MetadataImage | None = None
        self._image_scheduled = False

    def call_soon(self, fn: Callable[..., object], *args: object) -> None:
        """Run ``fn(*args)`` on the trio thread (dropped once trio has finished)."""
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(fn, *args)

    def latest_image(self) -> MetadataImage | None:
        """The newest image handed over, delivered or not (None before the first one)."""
        with self._lock:
            return self._next_image

    def on_applied(self, image: MetadataImage) -> None:
        # Coalesced: one pending hand-off carries the newest image.
        with self._lock:
            self._next_image = image
            if self._image_scheduled:
                return
            self._image_scheduled = True
        self.call_soon(self._deliver_image)

    def on_state_changed(self, old_state: int, new_state: int) -> None:
        self.call_soon(self._changed)

    def on_failed(self, error: BaseException) -> None:
        self.call_soon(self._failed, error)

    def _deliver_image(self) -> None:
        with self._lock:
            image = self._next_image
            self._image_scheduled = False
        if image is not None:
            self._publish(image)
