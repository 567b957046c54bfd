"""The controller's trio shell: runs the pure :class:`ControllerCore` while this node leads.

``ControllerService.run`` waits until ``quorum.controller_ready`` (this node is the Raft leader
and its ``BecomeController`` for the term is applied), then runs one *active term*: a fresh
core, a reconciliation loop that proposes the core's records, and a watcher that cancels the
term the moment leadership is lost or the image moves to another controller term. Requests
from brokers (served by :mod:`raftlog.controller.rpcs`) call the ``register`` /
``heartbeat`` / ``alter_partitions`` / ``allocate_producer_ids`` methods, which raise
:class:`ControllerUnavailableError` with NOT_CONTROLLER when no term is active here.

Every proposal goes through ``quorum.propose``, which stamps the controller term; each carries
a request id ``ctl-<node>-<term>-<n>`` (retried once, with the same id, if the outcome of a
timed-out proposal is unknown), and the compare-and-set version the core chose. Every wait has a
timeout: proposals (``propose_timeout_s``), the reconciliation period, the leadership watch.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

import trio

from raftlog.config import ServerConfig
from raftlog.controller.batching import batch_partition_changes, split_outcome
from raftlog.controller.core import (
    AlterPartitionRequest,
    ConfigAlteration,
    ControllerCore,
    ControllerSettings,
    Heartbeat,
    HeartbeatReply,
    Proposal,
    Registration,
    plan_config_change,
)
from raftlog.controller.decisions import Decision
from raftlog.metadata import errors
from raftlog.metadata.errors import wire_error_code
from raftlog.metadata.image import NO_LEADER, MetadataImage, PartitionImage
from raftlog.metadata.placement import PlacementError
from raftlog.metadata.records import (
    FenceBroker,
    PartitionChange,
    PartitionChanges,
    ProducerIdBlock,
    Record,
    UnfenceBroker,
)
from raftlog.metadata.state import ApplyResult
from raftlog.metrics.recorders import Counter
from raftlog.quorum.interface import (
    NotControllerError,
    ProposalTimeoutError,
    Quorum,
    QuorumError,
    QuorumTimeoutError,
)

log = logging.getLogger(__name__)

PROPOSE_TIMEOUT_S_DEFAULT: Final = 5.0
LEADERSHIP_POLL_S: Final = 0.05
TICK_INTERVAL_MS_MIN: Final = 50
TICK_INTERVAL_MS_MAX: Final = 500
ALLOCATION_ATTEMPTS: Final = 3
# An AlterConfigs re-planned after losing a compare-and-set race (e.g. to a leader election,
# which also moves the topic's version) at most this often.
CONFIG_CAS_ATTEMPTS: Final = 5


class ControllerUnavailableError(Exception):
    """The request cannot be served here: NOT_CONTROLLER, or REQUEST_TIMED_OUT when the quorum
    did not commit in time. ``error_code`` is the Kafka code to answer with."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


def settings_from_config(config: ServerConfig) -> ControllerSettings:
    """The controller settings a node's ``server.properties`` asks for."""
    rebalance_ms = (
        config.leader_imbalance_check_interval_seconds * 1000
        if config.auto_leader_rebalance_enable
        else 0
    )
    return ControllerSettings(
        node_id=config.node_id,
        session_timeout_ms=config.broker_session_timeout_ms,
        rebalance_interval_ms=rebalance_ms,
        unclean_leader_election=config.unclean_leader_election_enable,
        cluster_id=config.cluster_id,
        disconnected_grace_ms=min(2 * config.broker_heartbeat_interval_ms,
                                  config.broker_session_timeout_ms),
    )


class ControllerStats:
    """Leader elections this node committed as controller (Kafka's ControllerStats
    LeaderElectionRateAndTimeMs count, UncleanLeaderElectionsPerSec), read by
    ``raftlog.observe``: a partition given a leader other than the one it had (a partition
    left without one is no election); unclean when the new leader was outside its ISR."""

    __slots__ = ("leader_elections", "unclean_leader_elections")

    def __init__(self) -> None:
        self.leader_elections = Counter()
        self.unclean_leader_elections = Counter()

    def count_election(self, before: MetadataImage, change: PartitionChange) -> None:
        """``change`` committed; ``before`` is the image it was planned on (the
        partition-epoch compare-and-set means it applied to exactly that state)."""
        previous = before.partition(change.topic, change.partition)
        if previous is None or change.leader in (NO_LEADER, previous.leader):
            return
        self.leader_elections.inc()
        if change.leader not in previous.isr:
            self.unclean_leader_elections.inc()


@dataclass(frozen=True, slots=True)
class AlterPartitionResult:
    """One partition's answer to AlterPartition: the error, and the state it now has."""

    error_code: int
    partition: PartitionImage | None = None


@dataclass(slots=True)
class _Term:
    """One active controller term on this node."""

    term: int
    core: ControllerCore
    wake: trio.Event = field(default_factory=trio.Event)
    allocation_lock: trio.Lock = field(default_factory=trio.Lock)


class ControllerService:
    """Runs the controller while this node is the ready controller. See the module docstring."""

    def __init__(
        self,
        quorum: Quorum,
        settings: ControllerSettings,
        *,
        propose_timeout_s: float = PROPOSE_TIMEOUT_S_DEFAULT,
        tick_interval_ms: int | None = None,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self._quorum = quorum
        self.settings = settings
        self._propose_timeout_s = propose_timeout_s
        if tick_interval_ms is None:
            tick_interval_ms = min(
                max(settings.session_timeout_ms // 10, TICK_INTERVAL_MS_MIN), TICK_INTERVAL_MS_MAX
            )
        self._tick_interval_s = tick_interval_ms / 1000
        self._clock = clock
        self._term: _Term | None = None
        self._request_ids = itertools.count(1)
        self.terms_served = 0
        self.stats = ControllerStats()

    # --- State ------------------------------------------------------------------------------

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    @property
    def active(self) -> bool:
        """Whether this node runs the controller right now."""
        return self._current() is not None

    @property
    def active_term(self) -> int | None:
        term = self._current()
        return None if term is None else term.term

    def _current(self) -> _Term | None:
        term = self._term
        if term is None or not self._quorum.controller_ready:
            return None
        if self._quorum.image.controller_term != term.term:
            return None
        return term

    def _require(self) -> _Term:
        term = self._current()
        if term is None:
            raise ControllerUnavailableError(
                errors.NOT_CONTROLLER, f"node {self.settings.node_id} is not the controller"
            )
        return term

    # --- The service task -------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve every term this node wins, forever (cancel to stop)."""
        task_status.started()
        while True:
            await self._wait_until_ready()
            image = self._quorum.image
            term = _Term(image.controller_term, ControllerCore(self.settings, image, self.now_ms()))
            self._term = term
            self.terms_served += 1
            log.info("node %d is the controller for term %d", self.settings.node_id, term.term)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._watch_leadership, term, nursery.cancel_scope)
                    nursery.start_soon(self._reconcile, term)
            finally:
                self._term = None
            log.info("node %d is no longer the controller (term %d)", self.settings.node_id,
                     term.term)

    async def _wait_until_ready(self) -> None:
        while not self._quorum.controller_ready:
            version = self._quorum.image.version
            with contextlib.suppress(QuorumTimeoutError):
                await self._quorum.wait_changed(version, timeout_s=LEADERSHIP_POLL_S * 4)

    async def _watch_leadership(self, term: _Term, scope: trio.CancelScope) -> None:
        while self._current() is term:
            version = self._quorum.image.version
            with contextlib.suppress(QuorumTimeoutError):
                await self._quorum.wait_changed(version, timeout_s=LEADERSHIP_POLL_S)
        scope.cancel()

    async def _reconcile(self, term: _Term) -> None:
        """Propose what the core's tick asks for, every tick interval or when woken."""
        while True:
            term.wake = trio.Event()
            image, now_ms = self._quorum.image, self.now_ms()
            term.core.note_unreachable(image, self._unreachable_voters(), now_ms)
            for proposal in batch_partition_changes(term.core.tick(image, now_ms)):
                try:
                    result = await self._propose(term, proposal)
                except ControllerUnavailableError as exc:
                    log.warning("controller proposal %s failed: %s", _describe(proposal), exc)
                    break
                for single, outcome in split_outcome(proposal, result):
                    _log_outcome(single, outcome)
                    if outcome.ok and isinstance(single.record, PartitionChange):
                        self.stats.count_election(image, single.record)
            with trio.move_on_after(self._tick_interval_s):
                await term.wake.wait()

    def _unreachable_voters(self) -> frozenset[int]:
        """Voters this node has no quorum connection to (fast failure detection)."""
        return frozenset(v.node_id for v in self._quorum.status().voters if not v.connected)

    def wake(self) -> None:
        """Run the reconciliation now (after a registration, unfence or shutdown request)."""
        term = self._term
        if term is not None:
            term.wake.set()

    async def _propose(self, term: _Term, proposal: Proposal) -> ApplyResult:
        if self._current() is not term:
            raise ControllerUnavailableError(errors.NOT_CONTROLLER, "leadership lost")
        request_id = f"ctl-{self.settings.node_id}-{term.term}-{next(self._request_ids)}"
        for attempt in range(2):
            try:
                return await self._quorum.propose(
                    proposal.record,
                    expected_version=proposal.expected_version,
                    request_id=request_id,
                    timeout_s=self._propose_timeout_s,
                )
            except NotControllerError as exc:
                raise ControllerUnavailableError(errors.NOT_CONTROLLER, str(exc)) from exc
            except ProposalTimeoutError as exc:
                # Outcome unknown: the same request id returns the first result if it applied.
                if not exc.outcome_unknown or attempt > 0 or self._current() is not term:
                    raise ControllerUnavailableError(errors.REQUEST_TIMED_OUT, str(exc)) from exc
            except QuorumError as exc:
                raise ControllerUnavailableError(errors.REQUEST_TIMED_OUT, str(exc)) from exc
        raise AssertionError("unreachable")

    # --- Requests from brokers --------------------------------------------------------------

    async def register(self, request: Registration) -> tuple[int, str | None, int]:
        """BrokerRegistration: returns (error code, message, broker epoch).

        Raises:
            ControllerUnavailableError: not the controller, or the quorum did not commit.
        """
        term = self._require()
        decision = term.core.register(self._quorum.image, request, self.now_ms())
        if not decision.ok:
            return decision.error_code, decision.message, -1
        # A new incarnation first leaves the ISRs and leaderships its predecessor held (one
        # entry for all of them), then registers (the last proposal is the registration).
        *leaves, registration = decision.proposals
        for leave in batch_partition_changes(leaves):
            left = await self._propose(term, leave)
            for single, outcome in split_outcome(leave, left):
                if not outcome.ok:
                    log.info("broker %d: leaving %s before its new incarnation registers: %s",
                             request.broker_id, single.record, outcome.message)
        result = await self._propose(term, registration)
        if not result.ok:
            return wire_error_code(result.error_code), result.message, -1
        assert isinstance(result.value, int)
        log.info("broker %d registered (incarnation %s, epoch %d)", request.broker_id,
                 request.incarnation_id, result.value)
        self.wake()
        return errors.NONE, None, result.value

    async def heartbeat(self, request: Heartbeat) -> HeartbeatReply:
        """BrokerHeartbeat.

        Raises:
            ControllerUnavailableError: not the controller, or the quorum did not commit.
        """
        term = self._require()
        decision = term.core.heartbeat(self._quorum.image, request, self.now_ms())
        if not decision.ok:
            return HeartbeatReply(decision.error_code)
        for proposal in batch_partition_changes(decision.proposals):
            for single, outcome in split_outcome(proposal, await self._propose(term, proposal)):
                _log_outcome(single, outcome)
        if decision.proposals or request.want_shut_down or request.want_fence:
            self.wake()
        return term.core.heartbeat_reply(self._quorum.image, request)

    async def alter_partitions(self, requests: list[AlterPartitionRequest]
                               ) -> list[AlterPartitionResult]:
        """Every partition of one AlterPartition request, decided on one image and committed
        in one Raft entry (``batching``); answers in request order. A partition named twice
        is decided on the image before the request, so its second change fails its
        partition-epoch check (the broker retries it).

        Raises:
            ControllerUnavailableError: not the controller, or the quorum did not commit.
        """
        term = self._require()
        image = self._quorum.image
        decisions = [term.core.alter_partition(image, request) for request in requests]
        proposals = [d.proposals[0] for d in decisions if d.ok and d.proposals]
        outcomes: dict[int, ApplyResult] = {}  # id(proposal) -> its result
        for batch in batch_partition_changes(proposals):
            for single, outcome in split_outcome(batch, await self._propose(term, batch)):
                outcomes[id(single.record)] = outcome
        return [self._alter_result(request, decision, outcomes)
                for request, decision in zip(requests, decisions, strict=True)]

    def _alter_result(self, request: AlterPartitionRequest, decision: Decision,
                      outcomes: Mapping[int, ApplyResult]) -> AlterPartitionResult:
        if not decision.ok or not decision.proposals:
            return AlterPartitionResult(decision.error_code, decision.partition)
        change = decision.proposals[0].record
        assert isinstance(change, PartitionChange)
        result = outcomes[id(change)]
        partition = self._quorum.image.partition(request.topic, request.partition)
        if not result.ok:
            return AlterPartitionResult(wire_error_code(result.error_code), partition)
        log.info("%s-%d ISR %s -> %s (AlterPartition from %d)", request.topic,
                 request.partition, list(decision.partition.isr) if decision.partition else "?",
                 list(change.isr), request.broker_id)
        return AlterPartitionResult(errors.NONE, _changed(partition, change))

    async def allocate_producer_ids(self, broker_id: int, broker_epoch: int) -> tuple[int, int]:
        """AllocateProducerIds: returns (first id, block length).

        Raises:
            ControllerUnavailableError: not the controller, the quorum did not commit, or the
                request was refused (``error_code`` says why).
        """
        term = self._require()
        with trio.move_on_after(self._propose_timeout_s * (ALLOCATION_ATTEMPTS + 1)):
            async with term.allocation_lock:
                return await self._allocate(term, broker_id, broker_epoch)
        raise ControllerUnavailableError(errors.REQUEST_TIMED_OUT, "allocation timed out")

    async def _allocate(self, term: _Term, broker_id: int, broker_epoch: int) -> tuple[int, int]:
        message = "no attempt"
        for _ in range(ALLOCATION_ATTEMPTS):
            decision = term.core.allocate_producer_ids(self._quorum.image, broker_id,
                                                       broker_epoch)
            if not decision.ok:
                raise ControllerUnavailableError(decision.error_code, decision.message or "")
            (proposal,) = decision.proposals
            assert isinstance(proposal.record, ProducerIdBlock)
            result = await self._propose(term, proposal)
            if result.ok:
                return proposal.record.next_block_start, proposal.record.block_size
            message = result.message or errors.error_name(result.error_code)
            if result.error_code != errors.STALE_METADATA_VERSION:
                raise ControllerUnavailableError(wire_error_code(result.error_code), message)
        raise ControllerUnavailableError(errors.REQUEST_TIMED_OUT, f"lost races: {message}")

    async def alter_configs(
        self, request: ConfigAlteration, defaults: Mapping[str, str], *, validate_only: bool
    ) -> tuple[int, str | None]:
        """One resource of AlterConfigs / IncrementalAlterConfigs: (Kafka error code, message).

        Planned by :func:`plan_config_change` on the current image and committed as one
        AlterConfigs record under compare-and-set on the resource's version; a lost race is
        re-planned on the newer image. ``validate_only`` plans and proposes nothing.

        Raises:
            ControllerUnavailableError: not the controller, or the quorum did not commit.
        """
        term = self._require()
        message = "no attempt"
        for _ in range(CONFIG_CAS_ATTEMPTS):
            decision = plan_config_change(self._quorum.image, request, defaults)
            if not decision.ok:
                return decision.error_code, decision.message
            if validate_only or not decision.proposals:
                return errors.NONE, None
            (proposal,) = decision.proposals
            result = await self._propose(term, proposal)
            if result.ok:
                log.info("configs of resource %d %r changed: %s", request.resource_type,
                         request.resource_name, proposal.record)
                return errors.NONE, None
            message = result.message or errors.error_name(result.error_code)
            if result.error_code != errors.STALE_METADATA_VERSION:
                return wire_error_code(result.error_code), message
        return errors.REQUEST_TIMED_OUT, f"The resource kept changing ({message}); retry."

    async def commit(self, record: Record) -> tuple[int, str | None]:
        """Propose one record decided outside the core (AlterUserScram: the admin handler
        checked it against the image; the state machine checks it again in log order).
        Returns (Kafka error code, message).

        Raises:
            ControllerUnavailableError: not the controller, or the quorum did not commit.
        """
        term = self._require()
        result = await self._propose(term, Proposal(record))
        if not result.ok:
            return wire_error_code(result.error_code), result.message
        return errors.NONE, None

    def place_replicas(
        self, topic: str, num_partitions: int, replication_factor: int
    ) -> tuple[tuple[int, ...], ...] | None:
        """Placement for a new topic over usable brokers; None if not the controller or the
        request cannot be placed (the admin handler then reports the error itself)."""
        term = self._current()
        if term is None:
            return None
        try:
            return term.core.place_replicas(
                self._quorum.image, self.now_ms(), topic, num_partitions, replication_factor
            )
        except PlacementError:
            return None


def _changed(partition: PartitionImage | None, change: PartitionChange) -> PartitionImage:
    """The partition as ``change`` left it (the image may have moved on since)."""
    if partition is not None and partition.partition_epoch == change.partition_epoch:
        return partition
    return PartitionImage(
        change.partition,
        () if partition is None else partition.replicas,
        change.isr,
        change.leader,
        change.leader_epoch,
        change.partition_epoch,
    )


def _describe(proposal: Proposal) -> str:
    record = proposal.record
    if isinstance(record, PartitionChanges):
        return f"PartitionChanges({len(record.changes)} partitions, {proposal.reason})"
    return repr(record)


def _log_outcome(proposal: Proposal, result: ApplyResult) -> None:
    record = proposal.record
    if not result.ok:
        log.info("controller proposal %s (%s) rejected: %s", record, proposal.reason,
                 result.message)
    elif isinstance(record, FenceBroker | UnfenceBroker):
        log.info("%s broker %d (%s)", "fenced" if isinstance(record, FenceBroker)
                 else "unfenced", record.node_id, proposal.reason)
    elif isinstance(record, PartitionChange):
        log.info("%s-%d: leader %d, ISR %s, leader epoch %d (%s)", record.topic,
                 record.partition, record.leader, list(record.isr), record.leader_epoch,
                 proposal.reason)

