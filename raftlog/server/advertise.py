"""Answers per listener: a client is told the address of the listener it connected on.

Kafka advertises every broker per listener name, so a client on the SSL listener is sent to
SSL ports. raftlog's brokers register one endpoint, their inter-broker listener's, in the
metadata log. On any other listener this node therefore puts its own advertised address for
that listener into Metadata and FindCoordinator answers, in place of its registered one. Other
brokers' entries stay their registered (inter-broker) endpoints: a cluster whose clients use a
listener other than the inter-broker one needs every listener registered, which raftlog does
not do yet.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from raftlog.protocol.schemas import FIND_COORDINATOR, METADATA
from raftlog.server.listener import Body, Handler, HandlerResult, RequestContext


def for_listener(handlers: dict[int, Handler], node_id: int,
                 address: Callable[[], tuple[str, int]]) -> dict[int, Handler]:
    """``handlers`` whose Metadata and FindCoordinator answers give this node's ``address()``
    (a call: a listener on port 0 knows its port only once bound)."""
    wrapped = dict(handlers)
    rewrites: dict[int, Callable[[Body, int, tuple[str, int]], None]] = {
        METADATA.key: _rewrite_metadata, FIND_COORDINATOR.key: _rewrite_coordinator}
    for key, rewrite in rewrites.items():
        inner = handlers.get(key)
        if inner is not None:
            wrapped[key] = _rewriting(inner, functools.partial(_apply, rewrite, node_id, address))
    return wrapped


def _apply(rewrite: Callable[[Body, int, tuple[str, int]], None], node_id: int,
           address: Callable[[], tuple[str, int]], body: Body) -> None:
    rewrite(body, node_id, address())


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


def _rewrite_metadata(body: Body, node_id: int, address: tuple[str, int]) -> None:
    for broker in body.get("brokers", ()):
        _rewrite_entry(broker, node_id, address)


def _rewrite_coordinator(body: Body, node_id: int, address: tuple[str, int]) -> None:
    _rewrite_entry(body, node_id, address)
    for coordinator in body.get("coordinators", None) or ():
        _rewrite_entry(coordinator, node_id, address)


def _rewrite_entry(entry: dict[str, Any], node_id: int, address: tuple[str, int]) -> None:
    if entry.get("node_id") == node_id and "host" in entry:
        entry["host"], entry["port"] = address
