"""What the Kafka listener records about each request and connection (docs/metrics.md,
"Requests"): a plain recorder the listener owns and updates on the trio thread, read by
``raftlog.observe.requests`` at scrape time.

Per request, five instants in ``time.perf_counter_ns`` (the listener stores them on the
request's slot, so recording allocates nothing but the first-seen keys):

* ``read``: the frame is fully read;
* ``start``: the handler is called (after decoding);
* ``local``: the handler's synchronous part returned;
* ``ready``: the response body exists (``local`` unless the handler deferred: waiting for
  replication, a long-poll fetch, a quorum commit);
* ``taken``: the writer takes the response (it waits behind earlier responses meanwhile);
* ``sent``: the response is encoded and sent.

A request is counted when its response is sent (or, without a response, when the writer
passes it), as Kafka counts in ``updateRequestMetrics``; a connection that breaks first
loses its in-flight requests' figures.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from raftlog.metrics.recorders import Histogram
from raftlog.protocol.declarations import Struct

NS_PER_MS: Final = 1_000_000.0
FETCH: Final = "Fetch"
FETCH_CONSUMER: Final = "FetchConsumer"
FETCH_FOLLOWER: Final = "FetchFollower"


class ApiStats:
    """One request name's count, error codes and stage times (milliseconds)."""

    __slots__ = ("errors", "local", "remote", "request_queue", "requests", "response_queue",
                 "response_send", "total")

    def __init__(self) -> None:
        self.requests = 0
        # error code -> occurrences in responses (several per response: one per partition...)
        self.errors: dict[int, int] = {}
        self.request_queue = Histogram()
        self.local = Histogram()
        self.remote = Histogram()
        self.response_queue = Histogram()
        self.response_send = Histogram()
        self.total = Histogram()


class RequestStats:
    """Request and connection figures of one node's Kafka listeners."""

    __slots__ = ("_apis", "connections", "connections_created")

    def __init__(self) -> None:
        self._apis: dict[str, ApiStats] = {}
        # listener name -> open connections / connections accepted so far.
        self.connections: dict[str, int] = {}
        self.connections_created: dict[str, int] = {}

    def connection_opened(self, listener: str) -> None:
        self.connections[listener] = self.connections.get(listener, 0) + 1
        self.connections_created[listener] = self.connections_created.get(listener, 0) + 1

    def connection_closed(self, listener: str) -> None:
        self.connections[listener] -= 1

    def record(
        self, name: str, body: Any, read: int, start: int, local: int, ready: int, taken: int,
        sent: int,
    ) -> None:
        """One completed request (``body``: its response body, or None without one); the
        instants are ``perf_counter_ns`` values, in the order the module docstring gives."""
        stats = self._apis.get(name)
        if stats is None:
            stats = self._apis[name] = ApiStats()
        stats.requests += 1
        if body is not None:
            count_error_codes(body, stats.errors)
        stats.request_queue.observe((start - read) / NS_PER_MS)
        stats.local.observe((local - start) / NS_PER_MS)
        stats.remote.observe((ready - local) / NS_PER_MS)
        stats.response_queue.observe((taken - ready) / NS_PER_MS)
        stats.response_send.observe((sent - taken) / NS_PER_MS)
        stats.total.observe((sent - read) / NS_PER_MS)

    def apis(self) -> Iterator[tuple[str, ApiStats]]:
        """(request name, its figures); a copy, so a scrape never sees the dict change."""
        return iter(list(self._apis.items()))


def request_name(api_name: str, body: Struct) -> str:
    """Kafka's request label: the API name, with Fetch split by who fetches (a follower's
    Fetch carries its broker id as ``replica_id``, or, from v15, in ``replica_state``)."""
    if api_name != FETCH:
        return api_name
    replica_id = body.get("replica_id", -1)
    if replica_id < 0:
        state = body.get("replica_state")
        if state is not None:
            replica_id = state.get("replica_id", -1)
    return FETCH_FOLLOWER if replica_id >= 0 else FETCH_CONSUMER


def count_error_codes(body: Any, counts: dict[int, int]) -> None:
    """Adds every ``error_code`` in a response body (nested dicts, Structs, lists) to
    ``counts``. Records (bytes or file regions) are never looked into, and a list is walked
    only when it holds structs (Kafka's arrays are homogeneous). Exact type checks, not
    isinstance: this runs once per response."""
    values = vars(body) if type(body) is Struct else body
    code = values.get("error_code")
    if code is not None:
        counts[code] = counts.get(code, 0) + 1
    for key, value in values.items():
        kind = type(value)
        if kind is list or kind is tuple:
            if value:
                first = type(value[0])
                if first is dict or first is Struct:
                    for item in value:
                        count_error_codes(item, counts)
        elif (kind is dict or kind is Struct) and key != "records":
            count_error_codes(value, counts)
