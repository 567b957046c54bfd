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
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from raftlog.config import (
    BROKER_DYNAMIC_CONFIG_KEYS,
    TOPIC_CONFIG_KEYS,
    parse_list,
    validate_broker_dynamic_config,
    validate_topic_config,
)
from raftlog.metadata import errors
from raftlog.metadata.image import NO_LEADER, BrokerImage, MetadataImage, PartitionImage
from raftlog.metadata.placement import assign_replicas
from raftlog.metadata.records import (
    AlterConfigs,
    FenceBroker,
    PartitionChange,
    ProducerIdBlock,
    Record,
    RegisterBroker,
    UnfenceBroker,
)
from raftlog.protocol.internal_topics import cleanup_policy_refusal

# Kafka error codes the controller answers with that the state machine never produces.
NOT_LEADER_OR_FOLLOWER: Final = 6
OPERATION_NOT_ATTEMPTED: Final = 55
STALE_BROKER_EPOCH: Final = 77
DUPLICATE_BROKER_REGISTRATION: Final = 101
INCONSISTENT_CLUSTER_ID: Final = 104

PRODUCER_ID_BLOCK_SIZE: Final = 1000
# Any broker epoch: AlterPartition/AllocateProducerIds senders that do not know theirs.
ANY_BROKER_EPOCH: Final = -1
UNCLEAN_ELECTION_CONFIG: Final = "unclean.leader.election.enable"


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
class Proposal:
    """A record to propose, with the compare-and-set version to propose it under."""

    record: Record
    expected_version: int | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Registration:
    """A BrokerRegistration request."""

    broker_id: int
    incarnation_id: str
    host: str
    port: int
    rack: str | None = None
    cluster_id: str | None = None


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


@dataclass(frozen=True, slots=True)
class Decision:
    """The core's answer to one request: an error, or records to propose (maybe none).

    ``partition`` is the current state of the partition an AlterPartition named, so a no-op
    request can be answered without proposing anything.
    """

    error_code: int = errors.NONE
    message: str | None = None
    proposals: tuple[Proposal, ...] = ()
    partition: PartitionImage | None = None

    @property
    def ok(self) -> bool:
        return self.error_code == errors.NONE


@dataclass(slots=True)
class _Lease:
    broker_epoch: int
    expires_ms: int


def _rejected(error_code: int, message: str, partition: PartitionImage | None = None) -> Decision:
    assert error_code != errors.NONE
    return Decision(error_code, message, (), partition)


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
            return _rejected(
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
            return _rejected(
                DUPLICATE_BROKER_REGISTRATION,
                f"broker {request.broker_id} is registered with another incarnation whose "
                f"session is still valid",
            )
        record = RegisterBroker(
            request.broker_id, request.host, request.port, request.rack, request.incarnation_id
        )
        return Decision(proposals=(Proposal(record, None, "registration"),))

    def heartbeat(self, image: MetadataImage, request: Heartbeat, now_ms: int) -> Decision:
        """BrokerHeartbeat: renews the session; may unfence, fence or start a shutdown.

        Leadership moves for a fence or shutdown come from the next :meth:`tick`, which the
        shell runs right after proposing these records.
        """
        self._observe(image, now_ms)
        broker = image.brokers.get(request.broker_id)
        if broker is None:
            return _rejected(
                errors.BROKER_ID_NOT_REGISTERED, f"broker {request.broker_id} is not registered"
            )
        if request.broker_epoch != broker.epoch:
            return _rejected(
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
            and not any(p.leader == broker.node_id for p in _all_partitions(image))
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
            return _rejected(
                errors.BROKER_ID_NOT_REGISTERED, f"broker {request.broker_id} is not registered"
            )
        if request.broker_epoch not in (ANY_BROKER_EPOCH, broker.epoch):
            return _rejected(
                STALE_BROKER_EPOCH, f"broker epoch {request.broker_epoch}, current {broker.epoch}"
            )
        current = image.partition(request.topic, request.partition)
        name = f"{request.topic}-{request.partition}"
        if current is None:
            return _rejected(errors.UNKNOWN_TOPIC_OR_PARTITION, f"{name} does not exist")
        if (
            request.leader_epoch > current.leader_epoch
            or request.partition_epoch > current.partition_epoch
        ):
            # The leader has seen a newer state than ours: we are probably a deposed controller.
            return _rejected(errors.NOT_CONTROLLER, f"{name}: request is newer than us", current)
        if request.leader_epoch < current.leader_epoch:
            return _rejected(
                errors.FENCED_LEADER_EPOCH,
                f"{name}: leader epoch {request.leader_epoch}, current {current.leader_epoch}",
                current,
            )
        if request.broker_id != current.leader:
            return _rejected(
                errors.INVALID_REQUEST,
                f"{name}: broker {request.broker_id} is not the leader ({current.leader})",
                current,
            )
        if request.partition_epoch < current.partition_epoch:
            return _rejected(
                errors.INVALID_UPDATE_VERSION,
                f"{name}: partition epoch {request.partition_epoch}, "
                f"current {current.partition_epoch}",
                current,
            )
        new_isr = request.new_isr
        if len(set(new_isr)) != len(new_isr) or not set(new_isr) <= set(current.replicas):
            return _rejected(
                errors.INVALID_REQUEST, f"{name}: ISR {list(new_isr)} is not a set of replicas",
                current,
            )
        if current.leader not in new_isr:
            return _rejected(
                errors.INVALID_REQUEST, f"{name}: ISR {list(new_isr)} leaves out the leader",
                current,
            )
        ineligible = sorted(
            r for r in new_isr
            if r not in image.brokers or image.brokers[r].fenced or r in self._shutting_down
        )
        if ineligible:
            return _rejected(
                OPERATION_NOT_ATTEMPTED,
                f"{name}: replicas {ineligible} are fenced, shutting down or unregistered",
                current,
            )
        if new_isr == current.isr:
            return Decision(partition=current)
        change = PartitionChange(
            request.topic, request.partition, current.leader, new_isr,
            current.leader_epoch, current.partition_epoch + 1,
        )  # fmt: skip
        return Decision(proposals=(Proposal(change, None, "AlterPartition"),), partition=current)

    def allocate_producer_ids(
        self, image: MetadataImage, broker_id: int, broker_epoch: int
    ) -> Decision:
        """AllocateProducerIds: the next block of producer ids for ``broker_id``."""
        broker = image.brokers.get(broker_id)
        if broker is None:
            return _rejected(errors.BROKER_ID_NOT_REGISTERED, f"broker {broker_id} unregistered")
        if broker_epoch not in (ANY_BROKER_EPOCH, broker.epoch):
            return _rejected(STALE_BROKER_EPOCH, f"broker epoch {broker_epoch}, current "
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
        proposals = [
            Proposal(change, None, "reconcile")
            for change in plan_partition_changes(
                image, usable, preferred=rebalance,
                default_unclean=self.settings.unclean_leader_election,
            )
        ]  # fmt: skip
        for broker in sorted(image.brokers.values(), key=lambda b: b.node_id):
            if not broker.fenced and broker.node_id not in usable:
                reason = "shutting down" if self.is_shutting_down(broker.node_id) else "expired"
                proposals.append(Proposal(FenceBroker(broker.node_id), broker.version, reason))
        return proposals


# --- Pure election rules --------------------------------------------------------------------


def _all_partitions(image: MetadataImage) -> Iterable[PartitionImage]:
    for topic in image.topics.values():
        yield from topic.partitions


def plan_partition_changes(
    image: MetadataImage,
    usable: frozenset[int],
    *,
    preferred: bool = False,
    default_unclean: bool = False,
) -> list[PartitionChange]:
    """The PartitionChange records that bring every partition in line with ``usable``.

    Topics in name order, partitions in index order, so the result is deterministic.
    """
    changes = []
    for name in sorted(image.topics):
        topic = image.topics[name]
        unclean = _unclean_enabled(topic.configs.get(UNCLEAN_ELECTION_CONFIG), default_unclean)
        for partition in topic.partitions:
            change = plan_partition(name, partition, usable, preferred=preferred, unclean=unclean)
            if change is not None:
                changes.append(change)
    return changes


def _unclean_enabled(value: str | None, default: bool) -> bool:
    if value is None:
        return default
    return value.strip().lower() == "true"


def plan_partition(
    topic: str,
    partition: PartitionImage,
    usable: frozenset[int],
    *,
    preferred: bool = False,
    unclean: bool = False,
) -> PartitionChange | None:
    """The change ``partition`` needs given the usable brokers, or None if it is fine."""
    leader, isr = elect(partition, usable, preferred=preferred, unclean=unclean)
    if leader == partition.leader and isr == partition.isr:
        return None
    leader_epoch = partition.leader_epoch + (1 if leader != partition.leader else 0)
    return PartitionChange(
        topic, partition.partition, leader, isr, leader_epoch, partition.partition_epoch + 1
    )


def elect(
    partition: PartitionImage,
    usable: frozenset[int],
    *,
    preferred: bool = False,
    unclean: bool = False,
) -> tuple[int, tuple[int, ...]]:
    """The leader and ISR ``partition`` should have. See the module docstring for the rules."""
    isr = tuple(r for r in partition.isr if r in usable) or partition.isr
    leader = partition.leader
    if leader == NO_LEADER or leader not in usable or leader not in isr:
        leader = _first(partition.replicas, lambda r: r in isr and r in usable)
        if leader == NO_LEADER and unclean:
            leader = _first(partition.replicas, lambda r: r in usable)
            if leader != NO_LEADER:
                isr = (leader,)  # Unclean: the new leader's log is the truth now.
    elif preferred:
        first = partition.replicas[0]
        if first != leader and first in isr and first in usable:
            leader = first
    return leader, isr


def _first(replicas: Sequence[int], wanted: Callable[[int], bool]) -> int:
    for replica in replicas:
        if wanted(replica):
            return replica
    return NO_LEADER


# --- Config changes: AlterConfigs (33), IncrementalAlterConfigs (44) ------------------------

# Kafka's ConfigResource.Type and AlterConfigOp.OpType codes.
CONFIG_RESOURCE_TOPIC: Final = 2
CONFIG_RESOURCE_BROKER: Final = 4
CONFIG_OP_SET: Final = 0
CONFIG_OP_DELETE: Final = 1
CONFIG_OP_APPEND: Final = 2
CONFIG_OP_SUBTRACT: Final = 3
# Topic configs whose ConfigDef type is LIST: the only ones APPEND/SUBTRACT may touch (Kafka's
# ConfigurationControlManager refuses the others with INVALID_CONFIG).
LIST_TOPIC_CONFIGS: Final = frozenset({
    "cleanup.policy",
    "follower.replication.throttled.replicas",
    "leader.replication.throttled.replicas",
})


@dataclass(frozen=True, slots=True)
class ConfigOp:
    """One key of an alter request; AlterConfigs (33) sends every key as a SET."""

    name: str
    operation: int
    value: str | None


@dataclass(frozen=True, slots=True)
class ConfigAlteration:
    """One resource of an AlterConfigs / IncrementalAlterConfigs request.

    ``incremental`` False is AlterConfigs (33): the keys given become the resource's whole set
    of dynamic configs, every other override is deleted (Kafka's legacy semantics).
    """

    resource_type: int
    resource_name: str
    ops: tuple[ConfigOp, ...]
    incremental: bool


def plan_config_change(
    image: MetadataImage, request: ConfigAlteration, defaults: Mapping[str, str]
) -> Decision:
    """Validate ``request`` against ``image`` and return the AlterConfigs record it needs.

    ``defaults`` are the effective topic-level defaults (what APPEND/SUBTRACT start from when a
    topic has no override, as Kafka does). The proposal carries the resource's version for
    compare-and-set, so a concurrent change makes the state machine refuse it (STALE) and the
    caller re-plans from the newer image. No proposal: nothing would change.
    """
    if request.resource_type == CONFIG_RESOURCE_TOPIC:
        topic = image.topics.get(request.resource_name)
        if topic is None:
            return _rejected(errors.UNKNOWN_TOPIC_OR_PARTITION,
                             f"Topic '{request.resource_name}' does not exist.")
        current, version = dict(topic.configs), topic.version
    elif request.resource_type == CONFIG_RESOURCE_BROKER:
        name = request.resource_name
        if name and not (name.isascii() and name.isdigit()):
            return _rejected(errors.INVALID_REQUEST,
                             f"Broker resource name {name!r} is neither '' nor a node id.")
        resource = image.broker_configs.get(name)
        current = {} if resource is None else dict(resource.configs)
        version = -1 if resource is None else resource.version
    else:
        return _rejected(errors.INVALID_REQUEST,
                         f"Unsupported config resource type {request.resource_type}.")
    try:
        wanted = _apply_config_ops(request, current, defaults)
    except _ConfigRefused as refused:
        return _rejected(refused.error_code, str(refused))
    if request.resource_type == CONFIG_RESOURCE_TOPIC:
        # The effective policy: an override, else the topic default it would fall back to.
        policy = wanted.get("cleanup.policy", defaults.get("cleanup.policy"))
        problem = cleanup_policy_refusal(request.resource_name, policy)
        if problem is not None:
            return _rejected(errors.INVALID_CONFIG, problem)
    delete = tuple(sorted(set(current) - set(wanted)))
    changed = tuple(sorted((k, v) for k, v in wanted.items() if current.get(k) != v))
    if not delete and not changed:
        return Decision()
    record = AlterConfigs(request.resource_type, request.resource_name, changed, delete)
    return Decision(proposals=(Proposal(record, version, "AlterConfigs"),))


class _ConfigRefused(Exception):
    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


def _apply_config_ops(
    request: ConfigAlteration, current: Mapping[str, str], defaults: Mapping[str, str]
) -> dict[str, str]:
    """The resource's dynamic configs after ``request``, every value validated.

    Raises:
        _ConfigRefused: INVALID_REQUEST (duplicate key, null value, bad operation) or
            INVALID_CONFIG (unknown name, bad value, APPEND/SUBTRACT on a non-list config).
    """
    is_topic = request.resource_type == CONFIG_RESOURCE_TOPIC
    known = TOPIC_CONFIG_KEYS if is_topic else BROKER_DYNAMIC_CONFIG_KEYS
    names = [op.name for op in request.ops]
    if len(set(names)) != len(names):
        raise _ConfigRefused(errors.INVALID_REQUEST, "Error due to duplicate config keys.")
    result = dict(current) if request.incremental else {}
    for op in request.ops:
        if op.name not in known:
            kind = "topic config" if is_topic else "dynamic broker config"
            raise _ConfigRefused(errors.INVALID_CONFIG, f"Unknown {kind} name: {op.name}")
        if op.operation == CONFIG_OP_DELETE:
            result.pop(op.name, None)
            continue
        if op.operation not in (CONFIG_OP_SET, CONFIG_OP_APPEND, CONFIG_OP_SUBTRACT):
            raise _ConfigRefused(errors.INVALID_REQUEST,
                                 f"Unknown config operation {op.operation} for {op.name}.")
        if op.value is None:
            raise _ConfigRefused(errors.INVALID_REQUEST, f"Null value not supported for: {op.name}")
        if op.operation == CONFIG_OP_SET:
            result[op.name] = op.value
        else:
            result[op.name] = _list_op(op, result.get(op.name, defaults.get(op.name)), is_topic)
    for key, value in sorted(result.items()):
        if key in current and current[key] == value:
            continue  # unchanged, even if the validation rules have tightened since
        problem = (validate_topic_config(key, value) if is_topic
                   else validate_broker_dynamic_config(key, value))
        if problem is not None:
            raise _ConfigRefused(errors.INVALID_CONFIG, problem)
    return result


def _list_op(op: ConfigOp, base: str | None, is_topic: bool) -> str:
    """APPEND adds the items of ``op.value`` not yet in ``base``; SUBTRACT removes them."""
    if not is_topic or op.name not in LIST_TOPIC_CONFIGS:
        verb = "append to" if op.operation == CONFIG_OP_APPEND else "subtract from"
        raise _ConfigRefused(errors.INVALID_CONFIG,
                             f"Can't {verb} key {op.name} because its type is not LIST.")
    assert op.value is not None
    items = list(parse_list(base or ""))
    change = parse_list(op.value)
    if op.operation == CONFIG_OP_APPEND:
        items += [item for item in change if item not in items]
    else:
        items = [item for item in items if item not in change]
    return ",".join(items)
