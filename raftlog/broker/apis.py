"""The broker's client-facing request handlers, assembled: one object per concern, built
here from the node's configuration, quorum, partitions and replica manager.

* ``ProduceApis`` (Produce), ``FetchApis`` (Fetch), ``OffsetApis`` (ListOffsets,
  OffsetForLeaderEpoch), ``DeleteRecordsApis`` (DeleteRecords): the partitions here;
* ``TopicAdmin`` (CreateTopics, DeleteTopics, CreatePartitions), ``ConfigApis``
  (DescribeConfigs), ``MetadataApis`` (Metadata): the metadata image and the quorum.

Handlers run their synchronous part in request order on the connection's reader task and
return either a body or a coroutine function that finishes it (see ``raftlog.server.listener``).
They never raise for bad input: every expected failure is a Kafka error code in the body.
FindCoordinator is ``raftlog.server.find_coordinator``'s; the controller-facing APIs are
``raftlog.broker.controller_apis``'s, which wraps this object's admin and Metadata handlers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

import trio
import trio.lowlevel

from raftlog.broker.delete_records import DeleteRecordsApis
from raftlog.broker.describe_configs import ConfigApis, dynamic_broker_configs
from raftlog.broker.fetch import FetchApis
from raftlog.broker.metadata_apis import MetadataApis
from raftlog.broker.offsets import OffsetApis
from raftlog.broker.produce import ProduceApis, TxnProduceVerifier
from raftlog.broker.topic_admin import PARTITIONS_PER_REQUEST_MAX, TopicAdmin
from raftlog.config import ServerConfig
from raftlog.partition.manager import PartitionManager
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import API_VERSIONS
from raftlog.quorum.interface import Quorum
from raftlog.replication.manager import ReplicaManager
from raftlog.server.listener import Handler, HandlerResult, RequestContext, api_versions_body
from raftlog.server.sasl import ClusterActionGate

# How long a metadata sync runs before it lets other tasks run (heartbeats, fetches).
SYNC_SLICE_S: Final = 0.02

__all__ = ["PARTITIONS_PER_REQUEST_MAX", "KafkaApis"]


class KafkaApis:
    """The broker's handlers, bound to its configuration, quorum and partitions.

    ``replicas`` assigns partition roles from metadata and runs the follower fetchers; without
    one, a ReplicaManager with default settings and no AlterPartition callback is made (enough
    for a single node, where every partition has one replica and no fetcher is needed).
    ``gate`` admits replica requests (Fetch, OffsetForLeaderEpoch) from cluster members only.
    ``txn_produce_verifier`` checks transactional batches against their coordinator.
    ``metadata_caught_up`` says whether the replayed image is current (the node wires it to
    "my registration of this incarnation is in the image"); until then Metadata waits or
    says "retry".

    ``create_topics``, ``delete_topics``, ``create_partitions`` and ``metadata`` are what
    ``ControllerApis`` wraps.
    """

    def __init__(
        self,
        config: ServerConfig,
        quorum: Quorum,
        manager: PartitionManager,
        replicas: ReplicaManager | None = None,
        gate: ClusterActionGate | None = None,
        *,
        txn_produce_verifier: TxnProduceVerifier | None = None,
        metadata_caught_up: Callable[[], bool] = lambda: True,
    ) -> None:
        self.config = config
        self.quorum = quorum
        self.manager = manager
        # Replica fetches are cluster actions: only an authenticated broker, as itself.
        gate = ClusterActionGate() if gate is None else gate
        self.replicas = ReplicaManager(manager) if replicas is None else replicas
        self.produce_apis = ProduceApis(quorum, manager, txn_produce_verifier=txn_produce_verifier)
        self.fetch_apis = FetchApis(quorum, manager, self.replicas, gate)
        self.offset_apis = OffsetApis(quorum, manager, gate)
        self.delete_records_apis = DeleteRecordsApis(quorum, manager, self.replicas)
        # One sync at a time: two interleaved passes could apply an older image's partition
        # state after a newer one's.
        self._sync_lock = trio.Lock()
        self.topic_admin = TopicAdmin(config, quorum, self.sync_partitions_cooperatively)
        self.config_apis = ConfigApis(config, quorum)
        self.metadata_apis = MetadataApis(config, quorum, self.topic_admin.create_topic,
                                          metadata_caught_up)

    def handlers(self) -> dict[int, Handler]:
        table: dict[int, Callable[[RequestContext], HandlerResult]] = {
            API_VERSIONS.key: self.api_versions,
        }
        for part in (self.metadata_apis, self.produce_apis, self.fetch_apis, self.offset_apis,
                     self.topic_admin, self.config_apis, self.delete_records_apis):
            table.update(part.handlers())
        return dict(table)

    def api_versions(self, ctx: RequestContext) -> HandlerResult:
        return api_versions_body(ErrorCode.NONE, self.handlers())

    # -- what ControllerApis wraps -------------------------------------------------------------

    def create_topics(self, ctx: RequestContext) -> HandlerResult:
        return self.topic_admin.create_topics(ctx)

    def delete_topics(self, ctx: RequestContext) -> HandlerResult:
        return self.topic_admin.delete_topics(ctx)

    def create_partitions(self, ctx: RequestContext) -> HandlerResult:
        return self.topic_admin.create_partitions(ctx)

    def metadata(self, ctx: RequestContext) -> HandlerResult:
        return self.metadata_apis.metadata(ctx)

    # -- keeping local partitions in step with metadata --------------------------------------

    def sync_partitions(self) -> None:
        """Brings local partitions and their roles in step with the metadata image: opens
        logs for partitions assigned to this node, makes each leader or follower, and
        deletes those no longer assigned here (see ``ReplicaManager.apply_image``)."""
        for _ in self._sync_steps():
            pass

    async def sync_partitions_cooperatively(self) -> None:
        """``sync_partitions``, letting other tasks run every ``SYNC_SLICE_S``: a metadata
        change that moves a thousand partitions here (a restart, a fenced peer) must not hold
        the broker's heartbeat back until its session expires."""
        async with self._sync_lock:
            slice_start = trio.current_time()
            for _ in self._sync_steps():
                if trio.current_time() - slice_start >= SYNC_SLICE_S:
                    await trio.lowlevel.checkpoint()
                    slice_start = trio.current_time()

    def _sync_steps(self) -> Iterator[None]:
        dynamic = dynamic_broker_configs(self.quorum.image, self.config.node_id)
        return self.replicas.apply_image_steps(self.quorum.image,
                                               self.config.topic_defaults(dynamic))
