"""FindCoordinator (10): where a group's or a transactional id's coordinator is.

* key_type 0 (group): the leader of the group's ``__consumer_offsets`` partition
  (:meth:`raftlog.group.service.GroupService.locate`).
* key_type 1 (transaction): the transaction coordinator's lookup
  (:meth:`raftlog.txn.coordinator_service.TxnCoordinatorService.locate`), given to the
  constructor; without one, COORDINATOR_NOT_AVAILABLE.

This is the node's only FindCoordinator handler: both coordinators answer through it.

A lookup is synchronous and returns a :class:`CoordinatorLocation`; one that must first
create its internal topic starts that in the background and answers
COORDINATOR_NOT_AVAILABLE meanwhile (clients retry), as Kafka does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import FIND_COORDINATOR
from raftlog.server.listener import Handler, HandlerResult, RequestContext


@dataclass(frozen=True)
class CoordinatorLocation:
    """A FindCoordinator answer: the coordinator's broker, or why there is none."""

    error_code: int
    node_id: int = -1
    host: str = ""
    port: int = -1
    message: str | None = None


KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1

CoordinatorLookup = Callable[[str], CoordinatorLocation]


class CoordinatorApis:
    """FindCoordinator, answered by the group and transaction coordinators' lookups."""

    def __init__(self, group_lookup: CoordinatorLookup,
                 transaction_lookup: CoordinatorLookup | None = None) -> None:
        self.group_lookup = group_lookup
        self.transaction_lookup = transaction_lookup

    def handlers(self) -> dict[int, Handler]:
        table: dict[int, Callable[[RequestContext], HandlerResult]] = {
            FIND_COORDINATOR.key: self.find_coordinator,
        }
        return dict(table)

    def find_coordinator(self, ctx: RequestContext) -> HandlerResult:
        request = ctx.body
        key_type = request.key_type if ctx.header.api_version >= 1 else KEY_TYPE_GROUP
        if key_type == KEY_TYPE_GROUP:
            location = self.group_lookup(request.key)
        elif key_type == KEY_TYPE_TRANSACTION and self.transaction_lookup is not None:
            location = self.transaction_lookup(request.key)
        elif key_type == KEY_TYPE_TRANSACTION:
            location = CoordinatorLocation(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                           message="no transaction coordinator")
        else:
            location = CoordinatorLocation(ErrorCode.INVALID_REQUEST,
                                           message=f"unknown key type {key_type}")
        return {"throttle_time_ms": 0, "error_code": location.error_code,
                "error_message": location.message, "node_id": location.node_id,
                "host": location.host, "port": location.port}
