"""What pysyncobj's tick thread hands the trio side: state views, events and proposal callbacks.

:class:`RaftView` is rebuilt after every tick, :class:`RaftListener` receives apply and state
events on the tick thread, and :class:`Submission` is the callback of one proposal that can still
tell its outcome after a snapshot jumped past it (finding 8-E). None of these touch pysyncobj's
internals; :class:`~raftlog.quorum.raft_syncobj.RaftSyncObj` produces them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from pysyncobj.config import FAIL_REASON

from raftlog.metadata.image import MetadataImage
from raftlog.metadata.state import REQUEST_WINDOW_MAX, MetadataStateMachine

# pysyncobj's _RAFT_STATE values.
FOLLOWER: Final = 0
CANDIDATE: Final = 1
LEADER: Final = 2


@dataclass(frozen=True, slots=True)
class RaftView:
    """An immutable picture of the Raft state, rebuilt by the tick thread after every tick.

    Node keys are Raft addresses (``host:port``) for voters and ``readonly:<node id>#<n>`` for
    observers.
    """

    state: int
    term: int
    leader: str | None
    commit_index: int
    last_applied: int
    last_log_index: int
    transport_ready: bool
    bind_failed: bool
    started: bool
    caught_up: bool
    connected: frozenset[str]
    match_index: Mapping[str, int] = field(default_factory=dict)
    last_contact_s: Mapping[str, float] = field(default_factory=dict)
    observers: tuple[str, ...] = ()
    journal_fsyncs: int = 0
    snapshots_written: int = 0
    snapshots_installed: int = 0


class RaftListener:
    """Receives events on the tick thread. Implementations must return quickly and never call
    Raft synchronously (they run inside the tick). The base class ignores everything."""

    def on_applied(self, image: MetadataImage) -> None:
        """A new image was applied (or restored from a snapshot)."""

    def on_state_changed(self, old_state: int, new_state: int) -> None:
        """FOLLOWER/CANDIDATE/LEADER changed."""

    def on_tick(self, view: RaftView) -> None:
        """A tick finished; ``view`` is the new state."""

    def on_failed(self, error: BaseException) -> None:
        """Applying failed; this node stopped taking part in Raft."""


SubmitCallback = Callable[[object, int], None]


class Submission:
    """A pysyncobj callback ``(result, error)`` that knows its command's request id, so that a
    snapshot jumping past it (8-E) can still tell whether it applied.

    ``on_done(result, error)`` gets pysyncobj's FAIL_REASON code, or :data:`NOT_APPLIED` when
    the request-id window proves the command was not applied.
    """

    NOT_APPLIED: Final = 100

    __slots__ = ("_called", "_lock", "on_done", "request_id")

    def __init__(self, request_id: str | None, on_done: SubmitCallback) -> None:
        self.request_id = request_id
        self.on_done = on_done
        self._called = False
        self._lock = threading.Lock()

    def __call__(self, result: object, error: int) -> None:
        with self._lock:
            if self._called:
                return
            self._called = True
        self.on_done(result, error)

    def resolve_after_snapshot(
        self, index: int, last_applied: int, machine: MetadataStateMachine
    ) -> None:
        """The entry at ``index`` was covered by a snapshot ending at ``last_applied``."""
        if self.request_id is not None:
            for request_id, result in reversed(machine.recent_requests):
                if request_id == self.request_id:
                    self(result, FAIL_REASON.SUCCESS)
                    return
            if last_applied - index < REQUEST_WINDOW_MAX:
                # Had it applied at or after ``index``, fewer than REQUEST_WINDOW_MAX commands
                # since would still hold it in the window.
                self(None, Submission.NOT_APPLIED)
                return
        self(None, FAIL_REASON.UNKNOWN_OUTCOME)
