"""What the collectors read: the node's parts, handed over by ``node.py`` once built."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from raftlog.broker.apis import KafkaApis
from raftlog.config import ServerConfig
from raftlog.controller.service import ControllerService
from raftlog.group import GroupInstall
from raftlog.partition.cleaner_service import LogCleaner
from raftlog.partition.manager import PartitionManager
from raftlog.quorum.interface import Quorum
from raftlog.replication.manager import ReplicaManager
from raftlog.server.authz import Refusals
from raftlog.server.quotas import QuotaEnforcer
from raftlog.server.sasl import SaslApis
from raftlog.txn.coordinator_service import TxnCoordinatorService


@dataclass(frozen=True)
class MetricsSettings:
    """The ``metrics.*`` properties that shape what is exported (cardinality opt-ins)."""

    # metrics.partition.detail.enable: per-partition log size, segments, offsets, follower lag.
    partition_detail: bool = False
    # metrics.consumer.group.lag.partition.enable: lag per group, topic and partition
    # (otherwise per group only, as a sum and a max).
    group_lag_per_partition: bool = False


@dataclass(frozen=True)
class NodeParts:
    """Every part a collector may read. Built by ``Node`` after it wires the parts; a part a
    node does not run (a controller-only node has no groups) is None."""

    config: ServerConfig
    quorum: Quorum
    manager: PartitionManager
    cleaner: LogCleaner
    replicas: ReplicaManager
    apis: KafkaApis  # produce/fetch handlers: bytes in/out, purgatories
    controller: ControllerService | None
    groups: GroupInstall | None
    txn: TxnCoordinatorService | None
    # Whether this node is registered, caught up with the metadata and unfenced (readiness).
    ready: Callable[[], bool]
    # Authentication and authorization outcomes (None on a node built without them).
    sasl: SaslApis | None = None
    refusals: Refusals | None = None
    quotas: QuotaEnforcer | None = None  # client quota throttling (raftlog.server.quotas)
