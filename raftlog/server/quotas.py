"""Client quota enforcement on the listener: what each response costs its client, and the
throttle (KIP-219). The rules are in ``quota_core`` (pure); this is the trio side.

The connection's ``ConnectionQuota`` sees each request twice: when its handler has run
(the reader) and when its response is ready (the writer).

* Produce records the request's size against ``producer_byte_rate`` and every request its
  handler time (the synchronous part, as a percentage of one thread) against
  ``request_percentage``, when handled; a consumer's Fetch (not a follower's) the record
  bytes of its response against ``consumer_byte_rate``, when the response is ready.
  Cluster members (brokers, the admin tools holding ``raft.secret``) and the SASL exchange
  are never recorded or throttled.
* The throttle time is the largest of them; it goes into the response's
  ``throttle_time_ms`` and, once the response is sent, the connection is muted for that
  long: no further request of it is handled (and, as its socket is not read, TCP pushes
  back) until the time is over. A request that earned a throttle holds later pipelined
  requests back until then, as Kafka's one request in progress per connection does.
  Clients that know KIP-219 (Produce v6+, Fetch v8+ and the other APIs) also back off
  themselves; to older Produce and Fetch versions the response is delayed instead, as
  Kafka does. Nothing is dropped: the produce was appended and the
  fetch returns what it read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

import trio

from raftlog.metadata.image import ClientQuotaImage, MetadataImage, QuotaEntity
from raftlog.metadata.quota_apply import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
)
from raftlog.metrics.recorders import Histogram
from raftlog.security.session import Session, is_cluster_user
from raftlog.server.quota_core import ClientQuotaCore, quota_index
from raftlog.server.request_stats import FETCH_CONSUMER

PRODUCE: Final = "Produce"
# KIP-219: the first versions whose clients throttle themselves; older ones get the response
# only once the throttle time is over.
_CLIENT_THROTTLES_FROM: Final = {PRODUCE: 6, FETCH_CONSUMER: 8}
_UNRECORDED: Final = frozenset(("SaslHandshake", "SaslAuthenticate"))
NS_PER_PERCENT_OF_SECOND: Final = 10_000_000  # 1% of one thread for one second


class QuotaSlot(Protocol):
    """What the listener's response slot offers (``raftlog.server.listener._Slot``)."""

    name: str
    version: int
    body: dict[str, Any] | None
    respond: bool
    size: int
    client_id: str | None
    start: int
    local: int


class QuotaStats:
    """Throttle times given, by quota key (the metrics read them, ``raftlog.observe``)."""

    def __init__(self) -> None:
        self.throttle_ms = {key: Histogram() for key in
                            (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)}


class QuotaEnforcer:
    """The node's quotas: the values from its metadata image, the rates, the throttle stats.

    Args:
        image: The current metadata image (its ``client_quotas``).
        clock: Milliseconds of a monotonic clock (trio's by default).
    """

    def __init__(self, image: Callable[[], MetadataImage], core: ClientQuotaCore | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self._image = image
        self.core = ClientQuotaCore() if core is None else core
        self._clock = clock or (lambda: trio.current_time() * 1000.0)
        self.stats = QuotaStats()
        self._quotas: tuple[ClientQuotaImage, ...] = ()
        self._index: Mapping[QuotaEntity, Mapping[str, float]] = {}

    def connection(self, session: Session) -> ConnectionQuota:
        return ConnectionQuota(self, session)

    def index(self) -> Mapping[QuotaEntity, Mapping[str, float]]:
        quotas = self._image().client_quotas
        if quotas is not self._quotas:
            self._quotas, self._index = quotas, quota_index(quotas)
        return self._index

    def _exempt(self, session: Session, slot: QuotaSlot) -> bool:
        return slot.name in _UNRECORDED or _is_cluster_member(session)

    def record_request(self, session: Session, slot: QuotaSlot) -> int:
        """Records what handling ``slot`` cost (its handler time; a Produce's bytes) and
        returns its throttle time (0: none)."""
        index = self.index()
        if not index or self._exempt(session, slot):
            return 0
        now_ms = self._clock()
        user, client_id = session.principal.name, slot.client_id or ""
        throttles = {REQUEST_PERCENTAGE: self.core.record(
            index, REQUEST_PERCENTAGE, user, client_id,
            (slot.local - slot.start) / NS_PER_PERCENT_OF_SECOND, now_ms)}
        if slot.name == PRODUCE:
            throttles[PRODUCER_BYTE_RATE] = self.core.record(
                index, PRODUCER_BYTE_RATE, user, client_id, slot.size, now_ms)
        return self._observe(throttles)

    def record_response(self, session: Session, slot: QuotaSlot) -> int:
        """Records what the response of ``slot`` costs (a consumer Fetch's record bytes) and
        returns its throttle time (0: none)."""
        index = self.index()
        if (slot.name != FETCH_CONSUMER or slot.body is None or not index
                or self._exempt(session, slot)):
            return 0
        return self._observe({CONSUMER_BYTE_RATE: self.core.record(
            index, CONSUMER_BYTE_RATE, session.principal.name, slot.client_id or "",
            fetched_bytes(slot.body), self._clock())})

    def _observe(self, throttles: dict[str, int]) -> int:
        for key, throttle in throttles.items():
            if throttle > 0:
                self.stats.throttle_ms[key].observe(throttle)
        return max(throttles.values())


class ConnectionQuota:
    """One connection's side: its mute and the throttle of the response being sent.

    Requests are pipelined (the reader handles the next one while earlier responses wait
    for replication), so a request whose handling earned a throttle holds the reader at once:
    no later request of the connection is handled until its response is sent and the throttle
    time has passed, as in Kafka, where a connection has one request in progress at a time.
    """

    def __init__(self, enforcer: QuotaEnforcer, session: Session) -> None:
        self._enforcer = enforcer
        self._session = session
        self._muted_until = 0.0  # trio time
        self._early: dict[int, int] = {}  # id(slot) -> the throttle its handling earned
        self._held = 0  # throttled requests whose response has not been sent yet
        self._released = trio.Event()
        self._pending_s = 0.0  # the mute that starts once the current response is sent
        self._releasing = False

    def dispatched(self, slot: QuotaSlot) -> None:
        """``slot``'s handler ran (the reader calls it right after the handler returns)."""
        throttle = self._enforcer.record_request(self._session, slot)
        if throttle > 0:
            self._early[id(slot)] = throttle
            self._held += 1

    async def wait_unmuted(self) -> None:
        """Returns once the connection is no longer muted (the reader calls it before
        handling each request)."""
        while self._held:
            await self._released.wait()
        if self._muted_until > trio.current_time():
            await trio.sleep_until(self._muted_until)

    async def account(self, slot: QuotaSlot) -> None:
        """Records the ready response of ``slot`` and sets its throttle time; delays it when
        its client does not throttle itself. The writer calls it, in request order."""
        early = self._early.pop(id(slot), 0)
        self._releasing = early > 0
        throttle = max(early, self._enforcer.record_response(self._session, slot))
        if throttle <= 0:
            return
        body = slot.body
        if body is not None and slot.respond and "throttle_time_ms" in body:
            body["throttle_time_ms"] = max(body["throttle_time_ms"], throttle)
        self_throttling = slot.version >= _CLIENT_THROTTLES_FROM.get(slot.name, 0)
        if slot.respond and self_throttling:
            self._pending_s = max(self._pending_s, throttle / 1000.0)
            return
        self._mute(throttle / 1000.0)
        self._release()
        if slot.respond:
            await trio.sleep_until(self._muted_until)

    def sent(self) -> None:
        """The response was sent: the mute it earned starts now."""
        if self._pending_s > 0:
            self._mute(self._pending_s)
            self._pending_s = 0.0
        self._release()

    def _release(self) -> None:
        if self._releasing:
            self._releasing = False
            self._held -= 1
            self._released.set()
            self._released = trio.Event()

    def _mute(self, seconds: float) -> None:
        self._muted_until = max(self._muted_until, trio.current_time() + seconds)


def _is_cluster_member(session: Session) -> bool:
    return session.authenticated and is_cluster_user(session.principal.name)


def fetched_bytes(body: Mapping[str, Any]) -> int:
    """The record bytes of a Fetch response body (a list of file regions, or bytes)."""
    total = 0
    for topic in body.get("responses") or ():
        for partition in topic.get("partitions") or ():
            records = partition.get("records")
            if isinstance(records, list):
                total += sum(region.size_bytes for region in records)
            elif records is not None:
                total += len(records)
    return total
