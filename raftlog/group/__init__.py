"""Consumer groups: the group coordinator, committed offsets and ``__consumer_offsets``.

``install`` builds the node's group service and returns the handlers to merge into the
listener's table (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch,
DescribeGroups, ListGroups, DeleteGroups and FindCoordinator) and the tasks to start:
the service's and the end-offset refresher's that consumer-group lag needs for partitions
this node does not host (``raftlog.group.end_offsets``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from raftlog.client.connection import ClusterLogin
from raftlog.config import ServerConfig
from raftlog.group.end_offsets import RemoteEndOffsets
from raftlog.group.offsets_log import forwarded_topic_creation
from raftlog.group.service import GroupService
from raftlog.group.txn_offsets import TxnWriteVerifier
from raftlog.partition.manager import PartitionManager
from raftlog.quorum.interface import Quorum
from raftlog.server.find_coordinator import CoordinatorApis, CoordinatorLookup
from raftlog.server.listener import Handler

__all__ = ["GroupInstall", "install"]


@dataclass
class GroupInstall:
    service: GroupService
    coordinators: CoordinatorApis
    handlers: dict[int, Handler]
    # Started with ``nursery.start`` (each calls ``task_status.started()``).
    tasks: list[Callable[..., Awaitable[None]]]
    # High watermarks of partitions this node does not host (consumer-group lag).
    end_offsets: RemoteEndOffsets


def install(
    config: ServerConfig,
    quorum: Quorum,
    manager: PartitionManager,
    *,
    forward: Callable[..., Awaitable[Any]] | None = None,
    verify_txn_write: TxnWriteVerifier | None = None,
    transaction_lookup: CoordinatorLookup | None = None,
    login: ClusterLogin | None = None,
) -> GroupInstall:
    """``forward`` sends a request to the active controller (``ControllerChannel.call``):
    the offsets topic is created through it. ``verify_txn_write`` is the transaction
    check of TxnOffsetCommit (``raftlog.group.txn_offsets``). ``login`` is how the
    end-offset refresher connects to other brokers (ListOffsets is a client API: None
    connects without SASL, which the listener accepts)."""
    create_topic = None if forward is None else forwarded_topic_creation(forward)
    service = GroupService(config, quorum, manager, create_topic=create_topic,
                           verify_txn_write=verify_txn_write)
    coordinators = CoordinatorApis(service.locate, transaction_lookup)
    handlers = {**service.handlers(), **coordinators.handlers()}

    def committed_partitions() -> Iterator[tuple[str, int]]:
        for group in list(service.core.groups.values()):
            yield from list(group.offsets)

    end_offsets = RemoteEndOffsets(config.node_id, quorum, manager, committed_partitions,
                                   login=login)
    return GroupInstall(service, coordinators, handlers, [service.run, end_offsets.run],
                        end_offsets)
