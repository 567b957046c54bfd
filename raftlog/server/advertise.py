"""Answers per listener: a client is told the addresses of the listener it connected on.

Brokers register every listener (``BrokerImage.endpoints``), as KRaft does, and Kafka answers
Metadata and FindCoordinator with the endpoints of the listener the request came in on: a
client on the SSL listener is sent to SSL ports, one on the PLAINTEXT listener to PLAINTEXT
ports. A broker that lacks that listener is left out of Metadata's brokers (a partition it
leads reads LEADER_NOT_AVAILABLE with no leader), and as a coordinator it reads
COORDINATOR_NOT_AVAILABLE. This node always gives its own address for the listener (a
listener on port 0 knows its port once bound). A broker registered before endpoints were
recorded answers every listener with its one address.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Final

from raftlog.metadata.image import MetadataImage
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import FIND_COORDINATOR, METADATA
from raftlog.server.listener import Body, Handler, HandlerResult, RequestContext

# node id -> (host, port) on the listener, or None when that broker lacks it.
AddressOf = Callable[[int], tuple[str, int] | None]
_LEADER_NOT_AVAILABLE: Final = int(ErrorCode.LEADER_NOT_AVAILABLE)


def listener_addresses(listener: str, node_id: int, image: Callable[[], MetadataImage],
                       own: Callable[[], tuple[str, int]]) -> AddressOf:
    """Where each broker is on ``listener``: ``own()`` for this node, the registered endpoint
    of every other one."""

    def address_of(broker_id: int) -> tuple[str, int] | None:
        if broker_id == node_id:
            return own()
        broker = image().brokers.get(broker_id)
        return None if broker is None else broker.endpoint(listener)

    return address_of


def for_listener(handlers: dict[int, Handler], address_of: AddressOf) -> dict[int, Handler]:
    """``handlers`` whose Metadata and FindCoordinator answers give ``address_of``'s
    addresses."""
    wrapped = dict(handlers)
    rewrites: dict[int, Callable[[Body, AddressOf], None]] = {
        METADATA.key: rewrite_metadata, FIND_COORDINATOR.key: rewrite_coordinator}
    for key, rewrite in rewrites.items():
        inner = handlers.get(key)
        if inner is not None:
            wrapped[key] = _rewriting(inner, functools.partial(_apply, rewrite, address_of))
    return wrapped


def _apply(rewrite: Callable[[Body, AddressOf], None], address_of: AddressOf,
           body: Body) -> None:
    rewrite(body, address_of)


def _rewriting(inner: Handler, rewrite: Callable[[Body], None]) -> Handler:
    def handler(request: RequestContext) -> HandlerResult:
        result = inner(request)
        if result is None:
            return None
        if isinstance(result, dict):
            rewrite(result)
            return result
        deferred = result

        async def finish() -> Body | None:
            body = await deferred()
            if body is not None:
                rewrite(body)
            return body

        return finish

    return handler


def rewrite_metadata(body: Body, address_of: AddressOf) -> None:
    """Brokers get their address on the listener; those without it are left out, and the
    partitions they lead read LEADER_NOT_AVAILABLE (Kafka's answer)."""
    kept = []
    missing = set()
    for broker in body.get("brokers", ()):
        address = address_of(broker["node_id"])
        if address is None:
            missing.add(broker["node_id"])
            continue
        broker["host"], broker["port"] = address
        kept.append(broker)
    body["brokers"] = kept
    if not missing:
        return
    for topic in body.get("topics", ()):
        for partition in topic.get("partitions", ()):
            if partition.get("leader_id") in missing and not partition.get("error_code"):
                partition["error_code"] = _LEADER_NOT_AVAILABLE
                partition["leader_id"] = -1


def rewrite_coordinator(body: Body, address_of: AddressOf) -> None:
    _rewrite_coordinator_entry(body, address_of)
    for coordinator in body.get("coordinators", None) or ():
        _rewrite_coordinator_entry(coordinator, address_of)


def _rewrite_coordinator_entry(entry: dict[str, Any], address_of: AddressOf) -> None:
    if entry.get("error_code") or entry.get("node_id", -1) < 0 or "host" not in entry:
        return
    address = address_of(entry["node_id"])
    if address is None:
        entry.update(error_code=int(ErrorCode.COORDINATOR_NOT_AVAILABLE), node_id=-1, host="",
                     port=-1)
        return
    entry["host"], entry["port"] = address
