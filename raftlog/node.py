"""A raftlog node: one trio nursery owning the quorum, the controller, the partitions and the
Kafka listener.

Start-up order matters: the metadata quorum replays its log first (so topics are known), the
partitions this node hosts are opened and recovered from that image, and only then does the
Kafka listener accept clients. Then the controller service (it acts only while this node is
the ready controller), the broker lifecycle (registration and heartbeats), the replica manager
(follower fetchers, ISR changes) and the producer-id manager start. With ``metrics.listener``
set, the metrics and health endpoint (``raftlog.observe``) starts right after the Kafka
listener; the listener records its requests in ``request_stats`` whether or not it does.

The quorum is a ``LocalQuorum`` when ``controller.quorum.voters`` names only this node (a
single combined node: its log is committed by one fsync and it registers and unfences itself
when it opens), else a ``RaftQuorum``. Both are driven through the same ``Quorum`` protocol.

Shutdown (SIGINT/SIGTERM) is a *controlled shutdown* when another broker can take over: the
broker heartbeats ``want_shut_down`` until the controller has moved its leaderships away and
fenced it (bounded by ``CONTROLLED_SHUTDOWN_TIMEOUT_S``); then the nursery is cancelled and logs
are closed. A second signal skips the wait.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import resource
import signal
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Final

import trio

from raftlog.broker.acl_guards import guard_handlers
from raftlog.broker.acl_guards_coordinators import build_authorizer, guards
from raftlog.broker.apis import KafkaApis
from raftlog.broker.controller_apis import ControllerApis
from raftlog.broker.lifecycle import (
    CONTROLLED_SHUTDOWN_TIMEOUT_S,
    BrokerLifecycle,
    ControllerChannel,
)
from raftlog.client.connection import ClusterLogin
from raftlog.client.tls import node_client_context
from raftlog.clock import follow_offset_file as follow_clock_offset_file
from raftlog.config import ConfigError, ServerConfig
from raftlog.config.tls import TLS_PROTOCOLS
from raftlog.controller.rpcs import ControllerRpcs
from raftlog.controller.scram_bootstrap import bootstrap_when_controller, read_bootstrap
from raftlog.controller.service import ControllerService, settings_from_config
from raftlog.gc_freezer import gc_freezer
from raftlog.group import GroupInstall
from raftlog.group import install as install_groups
from raftlog.metadata.image import BrokerEndpoint, MetadataImage
from raftlog.metadata.state import MetadataStateMachine
from raftlog.observe.http import MetricsServer, endpoint_url
from raftlog.observe.parts import NodeParts
from raftlog.observe.registry import build_registry, metrics_settings
from raftlog.observe.runtime import LoopMonitor
from raftlog.partition.append_trace import TraceStats
from raftlog.partition.cleaner_service import CleanerSettings, LogCleaner
from raftlog.partition.manager import PartitionManager
from raftlog.partition.scrubber import LogScrubber
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import API_VERSIONS
from raftlog.quorum.interface import Quorum, QuorumTimeoutError
from raftlog.quorum.local import LocalNode, LocalQuorum
from raftlog.replication.manager import ReplicaManager
from raftlog.replication.settings import ReplicationSettings
from raftlog.security.session import ClusterCredentials, broker_user
from raftlog.server.advertise import for_listener, listener_addresses
from raftlog.server.authz import Refusals
from raftlog.server.listener import (
    Handler,
    HandlerResult,
    ListenerLimits,
    RequestContext,
    api_versions_body,
    serve_listener,
)
from raftlog.server.quota_core import ClientQuotaCore
from raftlog.server.quotas import QuotaEnforcer
from raftlog.server.request_memory import RequestMemory
from raftlog.server.request_stats import RequestStats
from raftlog.server.sasl import (
    ClusterActionGate,
    SaslApis,
    broker_epoch_extension,
    build_authenticators,
)
from raftlog.server.tls import build_tls_listener
from raftlog.txn.apis import TxnApis, build_coordinator
from raftlog.txn.coordinator_service import PendingOffsets, TxnSettings
from raftlog.txn.init_producer_id import ProducerApis
from raftlog.txn.producer_ids import ProducerIdManager

log = logging.getLogger(__name__)
METADATA_WATCH_TIMEOUT_S: Final = 1.0


async def _log_trace_summaries(stats: TraceStats, interval_ms: int) -> None:
    """trace.produce.enable: one line of stage percentiles per interval with traffic."""
    while True:
        await trio.sleep(interval_ms / 1000)
        line = stats.take_summary()
        if line is not None:
            log.info("produce trace: %s", line)


def uses_local_quorum(config: ServerConfig) -> bool:
    """Whether ``config`` describes a single combined node (its own and only voter)."""
    voters = config.controller_quorum_voters
    return config.is_controller and len(voters) == 1 and voters[0].node_id == config.node_id


class Node:
    """Owns every long-lived task of one raftlog process."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        # Registrations are checked against the configured cluster id only: a Raft node
        # without ``cluster.id`` makes up its own on first start (see ``RaftQuorum``).
        self._configured = config
        self.data_dir = Path(config.log_dirs[0])
        self.manager = PartitionManager(
            self.data_dir, config.node_id,
            retention_check_interval_ms=config.log_retention_check_interval_ms,
            producer_id_expiration_ms=config.producer_id_expiration_ms,
            producer_id_expiration_check_interval_ms=(
                config.producer_id_expiration_check_interval_ms),
            trace_stats=TraceStats() if config.trace_produce_enable else None)
        self.cleaner = LogCleaner(self.manager, CleanerSettings(
            enable=config.log_cleaner_enable, backoff_ms=config.log_cleaner_backoff_ms,
            dedupe_buffer_bytes=config.log_cleaner_dedupe_buffer_size))
        self.scrubber = LogScrubber(self.manager, config.log_scrub_bytes_per_second)
        self.kafka_port: int | None = None  # the inter-broker listener's bound port
        self.listener_ports: dict[str, int] = {}  # every Kafka listener's bound port, by name
        # SSL listeners' contexts, built now: a key or CA that cannot be loaded stops the
        # start-up with a ConfigError naming the property.
        self._tls = {settings.listener: build_tls_listener(settings) for settings in config.tls}
        # The node's own connections to its peers speak TLS when their inter-broker listener
        # does (SSL, SASL_SSL): verified with its truststore, its keystore as client cert.
        inter_broker = config.tls_of(config.inter_broker_listener_name)
        self._peer_tls = None if inter_broker is None else node_client_context(inter_broker)
        self.metrics_port: int | None = None  # the bound metrics.listener port, when set
        self.request_stats = RequestStats()  # what the Kafka listener records (metrics)
        self.quotas: QuotaEnforcer | None = None  # client quotas (raftlog.server.quotas)
        self.quorum: Quorum | None = None
        self.controller: ControllerService | None = None
        self.lifecycle: BrokerLifecycle | None = None
        self.replicas: ReplicaManager | None = None
        self.groups: GroupInstall | None = None
        # What the metrics collectors read (raftlog.observe); set once the parts are wired.
        self.parts: NodeParts | None = None

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        _raise_open_file_limit()
        async with self._open_quorum() as quorum:
            self.quorum = quorum
            await self._serve(quorum, task_status)

    @contextlib.asynccontextmanager
    async def _open_quorum(self) -> AsyncIterator[Quorum]:
        config = self.config
        if uses_local_quorum(config):
            advertised_host, advertised_port = config.advertised_listener()
            node = LocalNode(config.node_id, advertised_host, advertised_port,
                             endpoints=_endpoints(config))
            async with LocalQuorum(config.metadata_log_dir, MetadataStateMachine(),
                                   node=node) as local:
                yield local
            return
        from raftlog.quorum.raft import RaftQuorum  # pysyncobj only when clustered

        async with RaftQuorum.from_config(config) as raft:
            if raft.cluster_id is not None and raft.cluster_id != config.cluster_id:
                # meta.properties holds the cluster id (made on first start if not configured).
                self.config = dataclasses.replace(config, cluster_id=raft.cluster_id)
            yield raft

    async def _serve(self, quorum: Quorum, task_status: trio.TaskStatus[int]) -> None:
        config = self.config
        _check_sasl_listeners(config)
        is_broker = "broker" in config.process_roles
        credentials = ClusterCredentials(config.raft_secret) if config.raft_secret else None
        incarnation_id = _local_incarnation(quorum, config.node_id) or uuid.uuid4().hex
        login = None if credentials is None else ClusterLogin(
            credentials, broker_user(config.node_id),
            extensions=lambda: broker_epoch_extension(quorum.image, config.node_id,
                                              incarnation_id),
            tls=self._peer_tls)
        # ACLs (authorizer.class.name): one authorizer for ClusterAction and every API.
        authorizer = build_authorizer(config.authorizer, lambda: quorum.image)
        refusals = Refusals()
        gate = ClusterActionGate(authorizer, refusals)
        channel = ControllerChannel(config.node_id, quorum, login=login)
        heartbeat_channel = ControllerChannel(config.node_id, quorum, login=login)
        lifecycle = BrokerLifecycle(
            self._configured, quorum, channel, heartbeat_channel=heartbeat_channel,
            advertised=config.advertised_listener(),
            incarnation_id=incarnation_id,
            endpoints=lambda: [(listener.name, *self._advertised(listener.name))
                               for listener in config.advertised_listeners],
        )  # fmt: skip
        replicas = ReplicaManager(
            self.manager,
            settings=ReplicationSettings(
                replica_lag_time_max_ms=config.replica_lag_time_max_ms,
                fetch_max_bytes=config.replica_fetch_max_bytes,
                fetch_response_max_bytes=config.replica_fetch_response_max_bytes,
                fetch_wait_max_ms=config.replica_fetch_wait_max_ms,
                fetch_min_bytes=config.replica_fetch_min_bytes,
            ),
            alter_isr=lifecycle.alter_isr,
            # Lead nothing until this incarnation is registered and unfenced: the image
            # replayed at start-up is stale (see ReplicaManager._may_lead).
            incarnation_id=lifecycle.incarnation_id,
            login=login,
        )
        producer_ids = ProducerIdManager(lifecycle.allocate_block)
        # --- transactions (raftlog.txn) and consumer groups (raftlog.group) need each other:
        # the groups get the coordinator's TxnOffsetCommit verifier and its FindCoordinator
        # lookup; the coordinator's markers complete the groups' offsets in
        # transactions. The coordinator is built first and reaches the group service, built
        # below, through _GroupPendingOffsets.
        groups: GroupInstall
        txn_service = build_coordinator(
            config.node_id, quorum, self.manager, producer_ids, channel.call,
            TxnSettings.from_config(config), login=login,
            pending_offsets=_GroupPendingOffsets(lambda: groups.service.txn_offsets))
        apis = KafkaApis(
            config, quorum, self.manager, replicas, gate=gate,
            txn_produce_verifier=txn_service.verify_transactional_produce,
            metadata_caught_up=lambda: _registered_in_image(quorum, lifecycle, is_broker))
        controller = ControllerService(quorum, settings_from_config(self._configured))
        controller_rpcs = ControllerRpcs(config, quorum, controller)
        controller_apis = ControllerApis(config, quorum, controller, apis, forward=channel.call)
        groups = install_groups(config, quorum, self.manager, forward=channel.call,
                                verify_txn_write=txn_service.verify_transactional_produce,
                                transaction_lookup=txn_service.locate)
        self.groups = groups
        txn_apis = TxnApis(txn_service, gate)
        producer_apis = ProducerApis(producer_ids, transactional_init=txn_apis.init_producer_id)
        sasl_apis = SaslApis(credentials, build_authenticators(
            config.sasl, credentials, lambda: quorum.image))
        self.quotas = QuotaEnforcer(lambda: quorum.image, ClientQuotaCore(
            config.quota_window_num, config.quota_window_size_seconds))
        handlers = _merge_handlers(
            apis.handlers(), producer_apis.handlers(), controller_rpcs.handlers(),
            controller_apis.handlers(),
            groups.handlers, txn_apis.handlers(), sasl_apis.handlers(),
        )
        for each in (channel, heartbeat_channel):
            each.set_local_handlers({**controller_rpcs.handlers(), **controller_apis.handlers()})
        self.controller, self.lifecycle, self.replicas = controller, lifecycle, replicas
        self.parts = NodeParts(
            config=config, quorum=quorum, manager=self.manager, cleaner=self.cleaner,
            replicas=replicas, apis=apis, controller=controller if config.is_controller else None,
            groups=groups if is_broker else None, txn=txn_service if is_broker else None,
            ready=lambda: not not_ready_reasons(quorum, lifecycle, config),
            sasl=sasl_apis, refusals=refusals, quotas=self.quotas)
        self.manager.purge_leftover_deletions()
        apis.sync_partitions()
        limits = ListenerLimits(
            request_bytes_max=config.socket_request_max_bytes,
            idle_ms_max=config.connections_max_idle_ms,
            queued_request_bytes_max=config.queued_max_request_bytes,
        )
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.manager.run_flusher)
                nursery.start_soon(self.manager.run_retention)
                nursery.start_soon(self.manager.run_producer_expiration)
                nursery.start_soon(self.cleaner.run)  # log compaction
                nursery.start_soon(self.scrubber.run)  # CRC checks of segments from disk
                if self.manager.trace_stats is not None:
                    nursery.start_soon(_log_trace_summaries, self.manager.trace_stats,
                                       config.trace_produce_summary_interval_ms)
                await nursery.start(replicas.run)
                nursery.start_soon(_follow_metadata, quorum, apis)
                served = guard_handlers(gate.wrap(handlers), guards(), authorizer, refusals,
                                        lambda: quorum.image)
                kafka_port = await self._start_listeners(nursery, served, limits,
                                                         lambda: quorum.image)
                if config.metrics_listener is not None:
                    await self._start_metrics(nursery, config.metrics_listener,
                                              lambda: not_ready_reasons(quorum, lifecycle, config))
                if config.is_controller:
                    await nursery.start(controller.run)
                    bootstrap = read_bootstrap(config.metadata_log_dir)  # raftlog format
                    if bootstrap is not None:
                        nursery.start_soon(bootstrap_when_controller, quorum, controller,
                                           bootstrap)
                if is_broker:
                    await nursery.start(lifecycle.run)
                    await nursery.start(producer_ids.run)
                    await nursery.start(txn_service.run)  # transactions (raftlog.txn)
                    for task in groups.tasks:  # consumer groups (raftlog.group)
                        await nursery.start(task)
                log.info("node %d ready: Kafka on %s (%s quorum)", config.node_id,
                         ", ".join(f"{name}:{port}" for name, port in self.listener_ports.items()),
                         type(quorum).__name__)
                task_status.started(kafka_port)
        finally:
            with trio.CancelScope(shield=True):
                await channel.aclose()
                await heartbeat_channel.aclose()
            self.manager.close()
            log.info("node %d stopped", config.node_id)

    async def _start_listeners(self, nursery: trio.Nursery, handlers: dict[int, Handler],
                               limits: ListenerLimits, image: Callable[[], MetadataImage]
                               ) -> int:
        """Every listener but the controller's (that one is the Raft transport), each with its
        protocol; they share one request-memory budget and the node's request stats."""
        config = self.config
        memory = RequestMemory(limits.queued_request_bytes_max)
        for listener in config.listeners:
            name = listener.name
            if name in config.controller_listener_names:
                continue
            # Metadata and FindCoordinator name every broker by its endpoint on this
            # listener (raftlog.server.advertise).
            served = for_listener(handlers, listener_addresses(
                name, config.node_id, image, functools.partial(self._advertised, name)))
            self.listener_ports[name] = await nursery.start(functools.partial(
                serve_listener, listener.host, listener.port, served, limits,
                self.request_stats, listener=listener.name, tls=self._tls.get(listener.name),
                memory=memory, sasl_required=name in config.sasl.sasl_listeners,
                quotas=self.quotas))
        if not self.listener_ports:
            raise ConfigError("listeners", "the node needs a Kafka listener besides the"
                              " controller's")
        port = self.listener_ports.get(
            config.inter_broker_listener_name, next(iter(self.listener_ports.values())))
        self.kafka_port = port
        return port

    def _advertised(self, name: str) -> tuple[str, int]:
        host, port = self.config.advertised_listener(name)
        return host, port or self.listener_ports.get(name, 0)

    async def _start_metrics(self, nursery: trio.Nursery, address: tuple[str, int],
                             ready: Callable[[], list[str]]) -> None:
        """The metrics and health endpoint on ``metrics.listener``, and the loop monitor."""
        assert self.parts is not None
        loop_monitor = LoopMonitor()
        registry = build_registry(self.parts, metrics_settings(self.config), self.request_stats,
                                  loop_monitor)
        await nursery.start(loop_monitor.run)
        self.metrics_port = await MetricsServer(registry, ready).start(nursery, *address)
        log.info("metrics on %s/metrics", endpoint_url(address[0], self.metrics_port))

    async def controlled_shutdown(self, timeout_s: float = CONTROLLED_SHUTDOWN_TIMEOUT_S) -> None:
        """Move this broker's leaderships away before stopping (no-op when nobody can take
        them, e.g. a single node). Bounded by ``timeout_s``."""
        lifecycle = self.lifecycle
        if lifecycle is not None:
            await lifecycle.controlled_shutdown(timeout_s)


def _endpoints(config: ServerConfig) -> tuple[BrokerEndpoint, ...]:
    """The advertised listeners a broker registers, by name (one on port 0, whose port is not
    known before it is bound, is left out: a node answers for itself on every listener)."""
    return tuple(sorted(
        (BrokerEndpoint(listener.name, listener.host, listener.port,
                        config.protocol_of(listener.name))
         for listener in config.advertised_listeners if listener.port != 0),
        key=lambda endpoint: endpoint.name))


def _local_incarnation(quorum: Quorum, node_id: int) -> str | None:
    """A ``LocalQuorum`` registered this node when it opened: adopt that incarnation, so the
    lifecycle's registration is a no-op instead of a re-registration that fences the node."""
    if not isinstance(quorum, LocalQuorum):
        return None
    broker = quorum.image.brokers.get(node_id)
    return None if broker is None else broker.incarnation_id


def _registered_in_image(quorum: Quorum, lifecycle: BrokerLifecycle, is_broker: bool) -> bool:
    """Whether the image has replayed at least up to this incarnation's registration, which
    the quorum committed after everything this node knew before it restarted."""
    if not is_broker:
        return True
    me = quorum.image.brokers.get(lifecycle.node_id)
    return me is not None and me.incarnation_id == lifecycle.incarnation_id


def not_ready_reasons(quorum: Quorum, lifecycle: BrokerLifecycle,
                      config: ServerConfig) -> list[str]:
    """Why the node is not ready (``/health/ready``), empty once it is: a broker must be
    registered, caught up to that registration and unfenced; a controller-only node must know
    the quorum's leader."""
    if "broker" not in config.process_roles:
        return [] if quorum.leader_node_id is not None else ["no metadata quorum leader known"]
    me = quorum.image.brokers.get(lifecycle.node_id)
    if me is None:
        return ["not registered"]
    if me.incarnation_id != lifecycle.incarnation_id:
        return ["metadata not caught up to this incarnation's registration"]
    return ["fenced"] if me.fenced else []


class _GroupPendingOffsets:
    """The transaction coordinator's ``PendingOffsets``: the group service's, looked up on
    each call, because the coordinator is built before the group service (which needs the
    coordinator's verifiers through the broker handlers)."""

    def __init__(self, resolve: Callable[[], PendingOffsets]) -> None:
        self._resolve = resolve

    def complete(self, producer_id: int, index: int, commit: bool) -> None:
        self._resolve().complete(producer_id, index, commit)

    def has_pending(self, group: str, tp: tuple[str, int] | None = None) -> bool:
        return self._resolve().has_pending(group, tp)


def _check_sasl_listeners(config: ServerConfig) -> None:
    """A SASL_PLAINTEXT or SASL_SSL inter-broker listener needs raft.secret: the node's own
    connections (registration, replica fetches, markers) log in with it; so does an SSL one
    between several nodes."""
    name = config.inter_broker_listener_name
    several = len(config.controller_quorum_voters) > 1 or not config.is_controller
    tls = config.protocol_of(name) in TLS_PROTOCOLS
    if (name in config.sasl.sasl_listeners or (tls and several)) and not config.raft_secret:
        raise ConfigError("listeners", f"the {config.protocol_of(name)} listener {name} carries"
                          " the nodes' own connections and needs raft.secret (or raft.secret.file)")


def _merge_handlers(*tables: dict[int, Handler]) -> dict[int, Handler]:
    """One handler table (later tables win) whose ApiVersions advertises all of it."""
    merged: dict[int, Handler] = {}
    for table in tables:
        merged.update(table)

    def api_versions(request: RequestContext) -> HandlerResult:
        return api_versions_body(ErrorCode.NONE, merged)

    merged[API_VERSIONS.key] = api_versions
    return merged


# Kafka's documentation recommends at least 100,000 file descriptors per broker; Linux's
# fs.nr_open is 1,048,576 by default, so a privileged process can have this many.
OPEN_FILES_WANTED: Final = 100_000


def _raise_open_file_limit() -> None:
    """Each segment holds a file descriptor and each connection one: lift the soft limit to
    the hard one, and the hard one to OPEN_FILES_WANTED where the process may (root, or
    CAP_SYS_RESOURCE), as Kafka's operators set ``nofile`` to 100,000 or more."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < OPEN_FILES_WANTED:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES_WANTED, OPEN_FILES_WANTED))
        except (ValueError, OSError):  # not permitted, or over fs.nr_open
            pass
        else:
            hard = OPEN_FILES_WANTED
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        log.info("open-file limit raised from %d to %d", soft, hard)


async def _follow_metadata(quorum: Quorum, apis: KafkaApis) -> None:
    """Keeps local partitions (and their leader/follower roles) in step with the metadata."""
    version = quorum.image.version
    while True:
        try:
            image = await quorum.wait_changed(version, timeout_s=METADATA_WATCH_TIMEOUT_S)
        except QuorumTimeoutError:
            continue
        version = image.version
        await apis.sync_partitions_cooperatively()


async def run_until_signalled(config: ServerConfig) -> None:
    """Runs a node until SIGINT or SIGTERM, then shuts it down (controlled, then cancelled)."""
    node = Node(config)
    # The process's long-lived heap out of the collector's full walks (raftlog.gc_freezer).
    with gc_freezer():
        await _run_node_until_signalled(node)


async def _run_node_until_signalled(node: Node) -> None:
    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            nursery.start_soon(node.run)
            # Jepsen clock faults (raftlog.clock): no-op unless RAFTLOG_CLOCK_OFFSET_FILE is set.
            nursery.start_soon(follow_clock_offset_file)
            stopping = False
            async for signum in signals:
                if stopping:
                    log.info("received %s again: stopping now", signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    break
                stopping = True
                log.info("received %s: shutting down", signal.Signals(signum).name)
                nursery.start_soon(_stop, node, nursery.cancel_scope)


async def _stop(node: Node, scope: trio.CancelScope) -> None:
    try:
        with trio.move_on_after(CONTROLLED_SHUTDOWN_TIMEOUT_S + 1):
            await node.controlled_shutdown()
    finally:
        scope.cancel()
