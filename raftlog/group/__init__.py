"""Consumer groups: the group coordinator, committed offsets and ``__consumer_offsets``.

``install`` builds the node's group service and returns the handlers to merge into the
listener's table (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch,
DescribeGroups, ListGroups, DeleteGroups and FindCoordinator) and the tasks to start.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from raftlog.broker.apis import KafkaApis
from raftlog.config import ServerConfig
from raftlog.group.service import OFFSETS_TOPIC, OFFSETS_TOPIC_PARTITIONS, GroupService
from raftlog.partition.manager import PartitionManager
from raftlog.quorum.interface import Quorum
from raftlog.server.find_coordinator import CoordinatorApis, CoordinatorLookup
from raftlog.server.listener import Handler

__all__ = ["OFFSETS_TOPIC", "OFFSETS_TOPIC_PARTITIONS", "GroupInstall", "install"]


@dataclass
class GroupInstall:
    service: GroupService
    coordinators: CoordinatorApis
    handlers: dict[int, Handler]
    # Started with ``nursery.start`` (each calls ``task_status.started()``).
    tasks: list[Callable[..., Awaitable[None]]]


def install(
    config: ServerConfig,
    quorum: Quorum,
    manager: PartitionManager,
    apis: KafkaApis,
    *,
    forward: Callable[..., Awaitable[Any]] | None = None,
    transaction_lookup: CoordinatorLookup | None = None,
) -> GroupInstall:
    service = GroupService(config, quorum, manager, apis, forward=forward)
    coordinators = CoordinatorApis(service.locate, transaction_lookup)
    handlers = {**service.handlers(), **coordinators.handlers()}
    return GroupInstall(service, coordinators, handlers, [service.run])
