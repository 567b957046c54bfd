"""The controller's decisions as a pure core: events and a clock in, records to propose out.

In the style of etcd/raft's ``Node``: nothing here does I/O, sleeps or reads a clock. The trio
shell (:mod:`raftlog.controller.service`) feeds it the latest
:class:`~raftlog.metadata.image.MetadataImage`, the requests brokers send and the time in
milliseconds, and proposes the returned :class:`Proposal` s through the quorum one by one. The
state machine validates every record again in log order, so a decision made on an image that
is stale by the time it commits is rejected there (partition-epoch and broker-version
compare-and-set), never applied twice.

The only state the core keeps is what KRaft's controller keeps outside the log:

* **Leases.** A broker is alive while its last heartbeat is younger than
  ``broker.session.timeout.ms``. A new controller knows no heartbeats, so it grants every
  registered broker one full session from the moment it takes over; the same grace is given
  when the controller itself was paused for longer than half a session (it could not have
  received heartbeats meanwhile, so expiring them would punish the brokers for its own stall;
  see ``_observe``).
* **Controlled shutdowns** in progress (KRaft writes a record for these; here a broker keeps
  asking in every heartbeat, so a new controller learns it again within one interval).

Leadership is computed as a *reconciliation*, not as a reaction to single events: every
:meth:`ControllerCore.tick` derives each partition's desired leader and ISR from the image and
the set of *usable* brokers (registered, unfenced, lease valid, not shutting down) and returns
the changes needed. A controller that died halfway through a series of proposals therefore
leaves nothing behind that the next one does not repair.

Election rules (``unclean.leader.election.enable=false``):

* unusable brokers leave the ISR, except that the ISR never becomes empty: if no member is
  usable it is kept as it is and the leader becomes -1, so any of them can come back and lead;
* a leader that is unusable or no longer in the ISR is replaced by the first replica (in
  preference order) that is in the ISR and usable; none → -1 (offline);
* every leader change bumps ``leader_epoch``; every change bumps ``partition_epoch``. An ISR-only
  change keeps the leader epoch, so the leader's AlterPartition requests stay valid;
* preferred-leader rebalancing moves leadership back to the first replica once it is usable
  and in the ISR.

This module holds the core itself (leases, requests, placement, reconciliation); the election
rules are in :mod:`raftlog.controller.elections`, config-change planning in
:mod:`raftlog.controller.config_changes`, and the Proposal/Decision answer types in
:mod:`raftlog.controller.decisions`.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Final

from raftlog.controller.config_changes import (
    CONFIG_OP_APPEND,
    CONFIG_OP_DELETE,
    CONFIG_OP_SET,
    CONFIG_OP_SUBTRACT,
    CONFIG_RESOURCE_BROKER,
    CONFIG_RESOURCE_TOPIC,
    ConfigAlteration,
    ConfigOp,
    plan_config_change,
)
from raftlog.controller.decisions import (
    DUPLICATE_BROKER_REGISTRATION,
    INCONSISTENT_CLUSTER_ID,
    NOT_LEADER_OR_FOLLOWER,
    OPERATION_NOT_ATTEMPTED,
    STALE_BROKER_EPOCH,
    Decision,
    Proposal,
    rejected,
)
from raftlog.controller.elections import (
    all_partitions,
    elect,
    plan_partition,
    plan_partition_changes,
)
from raftlog.metadata import errors
from raftlog.metadata.image import BrokerEndpoint, BrokerImage, MetadataImage
from raftlog.metadata.placement import assign_replicas
from raftlog.metadata.records import (
    FenceBroker,
    PartitionChange,
    ProducerIdBlock,
    RegisterBroker,
    UnfenceBroker,
)

# The controller's interface: the core, its request and answer types, and the planning
# functions and codes its callers use (defined in the modules named above).
__all__ = [
    "ANY_BROKER_EPOCH",
    "CONFIG_OP_APPEND",
    "CONFIG_OP_DELETE",
    "CONFIG_OP_SET",
    "CONFIG_OP_SUBTRACT",
    "CONFIG_RESOURCE_BROKER",
    "CONFIG_RESOURCE_TOPIC",
    "DUPLICATE_BROKER_REGISTRATION",
    "INCONSISTENT_CLUSTER_ID",
    "NOT_LEADER_OR_FOLLOWER",
    "OPERATION_NOT_ATTEMPTED",
    "PRODUCER_ID_BLOCK_SIZE",
    "STALE_BROKER_EPOCH",
    "AlterPartitionRequest",
    "ConfigAlteration",
    "ConfigOp",
    "ControllerCore",
    "ControllerSettings",
    "Decision",
    "Heartbeat",
    "HeartbeatReply",
    "Proposal",
    "Registration",
    "elect",
    "plan_config_change",
    "plan_partition",
    "plan_partition_changes",
]

PRODUCER_ID_BLOCK_SIZE: Final = 1000
# Any broker epoch: AlterPartition/AllocateProducerIds senders that do not know theirs.
ANY_BROKER_EPOCH: Final = -1


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """The controller's knobs (Kafka's property names in the attribute docs).

    Attributes:
        node_id: This controller's node id.
        session_timeout_ms: ``broker.session.timeout.ms``.
        rebalance_interval_ms: ``leader.imbalance.check.interval.seconds`` in ms; 0 disables
            preferred-leader rebalancing (``auto.leader.rebalance.enable=false``).
        unclean_leader_election: ``unclean.leader.election.enable``, the default for topics
            that do not set it.
        cluster_id: Registrations naming another cluster id are refused; None accepts any.
        producer_id_block_size: Producer ids per AllocateProducerIds block.
        disconnected_grace_ms: How long a broker keeps its lease without heartbeats once the
            controller's quorum link to it drops (a killed process closes its sockets at
            once); at most the session. The node sets twice ``broker.heartbeat.interval.ms``.
    """

    node_id: int
    session_timeout_ms: int = 9000
    rebalance_interval_ms: int = 5000
    unclean_leader_election: bool = False
    cluster_id: str | None = None
    producer_id_block_size: int = PRODUCER_ID_BLOCK_SIZE
    disconnected_grace_ms: int = 9000

    def __post_init__(self) -> None:
        assert self.session_timeout_ms > 0
        assert self.disconnected_grace_ms > 0
        assert self.rebalance_interval_ms >= 0
        assert self.producer_id_block_size > 0


@dataclass(frozen=True, slots=True)
class Registration:
    """A BrokerRegistration request."""

    broker_id: int
    incarnation_id: str
    host: str
    port: int
    rack: str | None = None
    cluster_id: str | None = None
    endpoints: tuple[BrokerEndpoint, ...] = ()  # every listener the broker registered


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A BrokerHeartbeat request."""

    broker_id: int
    broker_epoch: int
    current_metadata_offset: int
    want_fence: bool = False
    want_shut_down: bool = False


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    """What a BrokerHeartbeat response says."""

    error_code: int
    is_caught_up: bool = False
    is_fenced: bool = True
    should_shut_down: bool = False


@dataclass(frozen=True, slots=True)
class AlterPartitionRequest:
    """One partition of an AlterPartition request from its leader."""

    broker_id: int
    broker_epoch: int
    topic: str
    partition: int
    leader_epoch: int
    new_isr: tuple[int, ...]
    partition_epoch: int


@dataclass(slots=True)
class _Lease:
    broker_epoch: int
    expires_ms: int


class ControllerCore:
    """Broker liveness and partition leadership decisions for one controller term.

    Create one when this node becomes the ready controller; throw it away when leadership is
    lost (a new term starts from a fresh core, which is exactly KRaft's behaviour).
    Not thread-safe; all methods are synchronous and take the current image and time.
    """

    def __init__(self, settings: ControllerSettings, image: MetadataImage, now_ms: int) -> None:
        self.settings = settings
        self._leases: dict[int, _Lease] = {}
        self._shutting_down: dict[int, int] = {}  # node id -> broker epoch that asked
        self._unreachable: frozenset[int] = frozenset()  # quorum links down at the last look
        self._last_seen_ms = now_ms
        self._next_rebalance_ms = now_ms + settings.rebalance_interval_ms
        # The image and usable brokers of the last plan that changed nothing (see ``tick``).
        self._settled: tuple[MetadataImage, frozenset[int]] | None = None
        self._grant_sessions(image, now_ms)

    # --- Liveness ---------------------------------------------------------------------------

    def _grant_sessions(self, image: MetadataImage, now_ms: int) -> None:
        expires = now_ms + self.settings.session_timeout_ms
        for broker in image.brokers.values():
            self._leases[broker.node_id] = _Lease(broker.epoch, expires)

    def _observe(self, image: MetadataImage, now_ms: int) -> None:
        """Note that the controller is running at ``now_ms``. A gap of more than half a session
        since it last ran (a paused process, a stalled loop: no tick and no request got
        through) means nobody could reach it, so every broker gets a fresh session instead of
        being fenced for the controller's own silence. Requests handled while the
        reconciliation is busy proposing count as running."""
        if now_ms - self._last_seen_ms > self.settings.session_timeout_ms // 2:
            self._grant_sessions(image, now_ms)
        self._last_seen_ms = max(self._last_seen_ms, now_ms)

    def note_unreachable(self, image: MetadataImage, unreachable: frozenset[int],
                         now_ms: int) -> None:
        """Shorten the lease of each broker whose quorum link just went down to
        ``disconnected_grace_ms``. Only the edge counts: a live broker that keeps heartbeating
        over its Kafka listener renews a full session, so a long-broken quorum link never
        fences it. A new controller sees every link that is already down as an edge, which is
        what keeps the fresh sessions it grants on takeover from covering a dead old
        controller for a whole session."""
        newly = unreachable - self._unreachable
        self._unreachable = unreachable
        grace_ms = min(self.settings.disconnected_grace_ms, self.settings.session_timeout_ms)
        for node_id in sorted(newly):
            broker = image.brokers.get(node_id)
            if broker is None or broker.fenced:
                continue
            lease = self._lease(broker, now_ms)
            lease.expires_ms = min(lease.expires_ms, now_ms + grace_ms)

    def _lease(self, broker: BrokerImage, now_ms: int) -> _Lease:
        """The lease of ``broker``'s current incarnation; a new incarnation starts a session."""
        lease = self._leases.get(broker.node_id)
        if lease is None or lease.broker_epoch != broker.epoch:
            lease = _Lease(broker.epoch, now_ms + self.settings.session_timeout_ms)
            self._leases[broker.node_id] = lease
            self._shutting_down.pop(broker.node_id, None)
        return lease

    def is_alive(self, image: MetadataImage, node_id: int, now_ms: int) -> bool:
        """Whether ``node_id`` is registered and its session has not expired."""
        broker = image.brokers.get(node_id)
        return broker is not None and self._lease(broker, now_ms).expires_ms > now_ms

    def usable_brokers(self, image: MetadataImage, now_ms: int) -> frozenset[int]:
        """Brokers that may lead partitions and join ISRs: registered, unfenced, alive and
        not shutting down."""
        return frozenset(
            broker.node_id
            for broker in image.brokers.values()
            if not broker.fenced
            and self._lease(broker, now_ms).expires_ms > now_ms
            and self._shutting_down.get(broker.node_id) != broker.epoch
        )

    def is_shutting_down(self, node_id: int) -> bool:
        return node_id in self._shutting_down

    # --- Requests ---------------------------------------------------------------------------

    def register(self, image: MetadataImage, request: Registration, now_ms: int) -> Decision:
        """BrokerRegistration: a new incarnation is registered (fenced until it catches up)."""
        self._observe(image, now_ms)
        expected = self.settings.cluster_id
        if expected is not None and request.cluster_id and request.cluster_id != expected:
            return rejected(
                INCONSISTENT_CLUSTER_ID,
                f"broker {request.broker_id} is in cluster {request.cluster_id!r}, "
                f"this is {expected!r}",
            )
        existing = image.brokers.get(request.broker_id)
        if (
            existing is not None
            and existing.incarnation_id != request.incarnation_id
            and not existing.fenced
            and self._lease(existing, now_ms).expires_ms > now_ms
            and (existing.host, existing.port) != (request.host, request.port)
        ):
            # Two live processes with one node.id; the old session must end (or the old
            # incarnation shut down cleanly, which fences it) before a new one may register.
            # A new incarnation listening on the old one's very host:port proves the old
            # process gone (two processes cannot hold one port), so a restart after a crash
            # re-registers at once instead of waiting out the old session.
            return rejected(
                DUPLICATE_BROKER_REGISTRATION,
                f"broker {request.broker_id} is registered with another incarnation whose "
                f"session is still valid",
            )
        record = RegisterBroker(
            request.broker_id, request.host, request.port, request.rack, request.incarnation_id,
            request.endpoints,
        )
        registration = Proposal(record, None, "registration")
        if existing is None or existing.incarnation_id == request.incarnation_id:
            return Decision(proposals=(registration,))
        # A new incarnation: whatever the old one held may be gone (a replaced disk, a wiped
        # data directory) or short of what it acknowledged. As Kafka fences the previous
        # incarnation, it leaves every ISR and leadership first; it rejoins an ISR only when a
        # leader sees it caught up. Otherwise a node back with an empty log before its old
        # session ended would lead at the same epoch and its followers would truncate to it.
        usable = self.usable_brokers(image, now_ms) - {request.broker_id}
        leaves = tuple(
            Proposal(change, None, "new incarnation")
            for change in plan_partition_changes(
                image, usable, default_unclean=self.settings.unclean_leader_election)
            if _holds(image, change, request.broker_id)
        )
        return Decision(proposals=(*leaves, registration))

    def heartbeat(self, image: MetadataImage, request: Heartbeat, now_ms: int) -> Decision:
        """BrokerHeartbeat: renews the session; may unfence, fence or start a shutdown.

        Leadership moves for a fence or shutdown come from the next :meth:`tick`, which the
        shell runs right after proposing these records.
        """
        self._observe(image, now_ms)
        broker = image.brokers.get(request.broker_id)
        if broker is None:
            return rejected(
                errors.BROKER_ID_NOT_REGISTERED, f"broker {request.broker_id} is not registered"
            )
        if request.broker_epoch != broker.epoch:
            return rejected(
                STALE_BROKER_EPOCH,
                f"broker epoch {request.broker_epoch}, current is {broker.epoch}",
            )
        lease = self._lease(broker, now_ms)
        if request.want_fence and not request.want_shut_down:
            # The broker asks to be fenced (e.g. it fell behind): end its session now.
            lease.expires_ms = min(lease.expires_ms, now_ms)
            return Decision()
        lease.expires_ms = now_ms + self.settings.session_timeout_ms
        if request.want_shut_down:
            self._shutting_down[broker.node_id] = broker.epoch
            return Decision()
        if broker.fenced and self._caught_up(broker, request):
            unfence = Proposal(UnfenceBroker(broker.node_id), broker.version, "caught up")
            return Decision(proposals=(unfence,))
        return Decision()

    @staticmethod
    def _caught_up(broker: BrokerImage, request: Heartbeat) -> bool:
        # ``broker.version`` is the offset that last changed the registration (its
        # RegisterBroker or FenceBroker): a broker that has applied it has seen its own fencing
        # and everything before it.
        return request.current_metadata_offset >= broker.version

    def heartbeat_reply(self, image: MetadataImage, request: Heartbeat) -> HeartbeatReply:
        """The response to a heartbeat, from the image after its proposals were applied."""
        broker = image.brokers.get(request.broker_id)
        if broker is None:
            return HeartbeatReply(errors.BROKER_ID_NOT_REGISTERED)
        if broker.epoch != request.broker_epoch:
            return HeartbeatReply(STALE_BROKER_EPOCH)
        should_shut_down = (
            request.want_shut_down
            and self._shutting_down.get(broker.node_id) == broker.epoch
            and broker.fenced
            and not any(p.leader == broker.node_id for p in all_partitions(image))
        )
        return HeartbeatReply(
            errors.NONE,
            is_caught_up=not broker.fenced or self._caught_up(broker, request),
            is_fenced=broker.fenced,
            should_shut_down=should_shut_down,
        )

    def alter_partition(self, image: MetadataImage, request: AlterPartitionRequest) -> Decision:
        """AlterPartition from a partition leader: an ISR change under compare-and-set.

        Validation follows Kafka's ``ReplicationControlManager.validateAlterPartitionData``.
        """
        broker = image.brokers.get(request.broker_id)
        if broker is None:
            return rejected(
                errors.BROKER_ID_NOT_REGISTERED, f"broker {request.broker_id} is not registered"
            )
        if request.broker_epoch not in (ANY_BROKER_EPOCH, broker.epoch):
            return rejected(
                STALE_BROKER_EPOCH, f"broker epoch {request.broker_epoch}, current {broker.epoch}"
            )
        current = image.partition(request.topic, request.partition)
        name = f"{request.topic}-{request.partition}"
        if current is None:
            return rejected(errors.UNKNOWN_TOPIC_OR_PARTITION, f"{name} does not exist")
        if (
            request.leader_epoch > current.leader_epoch
            or request.partition_epoch > current.partition_epoch
        ):
            # The leader has seen a newer state than ours: we are probably a deposed controller.
            return rejected(errors.NOT_CONTROLLER, f"{name}: request is newer than us", current)
        if request.leader_epoch < current.leader_epoch:
            return rejected(
                errors.FENCED_LEADER_EPOCH,
                f"{name}: leader epoch {request.leader_epoch}, current {current.leader_epoch}",
                current,
            )
        if request.broker_id != current.leader:
            return rejected(
                errors.INVALID_REQUEST,
                f"{name}: broker {request.broker_id} is not the leader ({current.leader})",
                current,
            )
        if request.partition_epoch < current.partition_epoch:
            return rejected(
                errors.INVALID_UPDATE_VERSION,
                f"{name}: partition epoch {request.partition_epoch}, "
                f"current {current.partition_epoch}",
                current,
            )
        new_isr = request.new_isr
        if len(set(new_isr)) != len(new_isr) or not set(new_isr) <= set(current.replicas):
            return rejected(
                errors.INVALID_REQUEST, f"{name}: ISR {list(new_isr)} is not a set of replicas",
                current,
            )
        resigning = current.leader not in new_isr
        if resigning and (not new_isr or not set(new_isr) <= set(current.isr)):
            # raftlog's extension: a leader whose log holds a corrupt batch leaves the ISR so
            # that a member with a good copy leads (Kafka refuses any ISR without the leader).
            return rejected(
                errors.INVALID_REQUEST, f"{name}: ISR {list(new_isr)} leaves out the leader "
                "and is not a non-empty part of the current ISR", current,
            )
        ineligible = sorted(
            r for r in new_isr
            if r not in image.brokers or image.brokers[r].fenced or r in self._shutting_down
        )
        if ineligible:
            return rejected(
                OPERATION_NOT_ATTEMPTED,
                f"{name}: replicas {ineligible} are fenced, shutting down or unregistered",
                current,
            )
        # A request for the ISR already committed is a leader settling a change whose outcome
        # it does not know. It is still committed as a new partition epoch: this core decides
        # from the committed image, so an earlier proposal of the same leader based on this
        # epoch may still be in flight, and the bump makes it fail its compare-and-set instead
        # of landing after we answered (the leader would then count a stale ISR for the HW).
        leader, leader_epoch = current.leader, current.leader_epoch
        if resigning:  # the first remaining member in preference order leads, a new epoch
            leader = next(r for r in current.replicas if r in new_isr)
            leader_epoch += 1
        change = PartitionChange(
            request.topic, request.partition, leader, new_isr,
            leader_epoch, current.partition_epoch + 1,
        )  # fmt: skip
        reason = "AlterPartition (the leader resigns)" if resigning else "AlterPartition"
        return Decision(proposals=(Proposal(change, None, reason),), partition=current)

    def allocate_producer_ids(
        self, image: MetadataImage, broker_id: int, broker_epoch: int
    ) -> Decision:
        """AllocateProducerIds: the next block of producer ids for ``broker_id``."""
        broker = image.brokers.get(broker_id)
        if broker is None:
            return rejected(errors.BROKER_ID_NOT_REGISTERED, f"broker {broker_id} unregistered")
        if broker_epoch not in (ANY_BROKER_EPOCH, broker.epoch):
            return rejected(STALE_BROKER_EPOCH, f"broker epoch {broker_epoch}, current "
                                                 f"{broker.epoch}")
        block = ProducerIdBlock(image.next_producer_id, self.settings.producer_id_block_size,
                                broker_id)
        return Decision(proposals=(Proposal(block, None, "AllocateProducerIds"),))

    # --- Placement --------------------------------------------------------------------------

    def place_replicas(
        self,
        image: MetadataImage,
        now_ms: int,
        topic: str,
        num_partitions: int,
        replication_factor: int,
        *,
        first_partition: int = 0,
    ) -> tuple[tuple[int, ...], ...]:
        """Kafka's rack-unaware placement over the usable brokers.

        The start index (Kafka picks it at random) is a hash of the topic name, so leaders of
        single-partition topics spread over the brokers and a retried request places alike.

        Raises:
            PlacementError: too few usable brokers, or bad counts.
        """
        brokers = sorted(self.usable_brokers(image, now_ms))
        start = zlib.crc32(topic.encode()) % len(brokers) if brokers else 0
        return assign_replicas(
            num_partitions, replication_factor, brokers, start, first_partition=first_partition
        )

    # --- Reconciliation ---------------------------------------------------------------------

    def tick(self, image: MetadataImage, now_ms: int) -> list[Proposal]:
        """Everything that should change now: partition moves first, then fences.

        Kafka's order: a fenced broker's partitions are moved in the same batch as its
        FenceBroker, partitions first. Here each record commits on its own, and whatever
        is still missing after a crash is found again by the next controller's tick.
        """
        self._observe(image, now_ms)
        for node_id in [n for n in self._leases if n not in image.brokers]:
            del self._leases[node_id]
            self._shutting_down.pop(node_id, None)
        usable = self.usable_brokers(image, now_ms)
        rebalance = self.settings.rebalance_interval_ms > 0 and now_ms >= self._next_rebalance_ms
        if rebalance:
            self._next_rebalance_ms = now_ms + self.settings.rebalance_interval_ms
        proposals = [Proposal(change, None, "reconcile")
                     for change in self._plan(image, frozenset(usable), rebalance)]
        for broker in sorted(image.brokers.values(), key=lambda b: b.node_id):
            if not broker.fenced and broker.node_id not in usable:
                reason = "shutting down" if self.is_shutting_down(broker.node_id) else "expired"
                proposals.append(Proposal(FenceBroker(broker.node_id), broker.version, reason))
        return proposals

    def _plan(self, image: MetadataImage, usable: frozenset[int],
              rebalance: bool) -> list[PartitionChange]:
        """``plan_partition_changes``, a pure function of these arguments: after a plan that
        changed nothing, the same image and brokers change nothing again. A plan looks at
        every partition (about 50 ms at 10,000) and the tick runs several times a second."""
        settled = self._settled
        if not rebalance and settled is not None and settled[0] is image and \
                settled[1] == usable:
            return []
        planned = plan_partition_changes(image, usable, preferred=rebalance,
                                         default_unclean=self.settings.unclean_leader_election)
        self._settled = (image, usable) if not planned and not rebalance else None
        return planned


def _holds(image: MetadataImage, change: PartitionChange, broker_id: int) -> bool:
    """Whether ``broker_id`` leads or is in the ISR of the partition ``change`` changes."""
    topic = image.topics.get(change.topic)
    if topic is None or not 0 <= change.partition < len(topic.partitions):
        return False
    partition = topic.partitions[change.partition]
    return partition.leader == broker_id or broker_id in partition.isr
