"""Refused requests, counted and logged without flooding the log.

Every authorization refusal (the ClusterAction gate, every ACL check of the broker's APIs)
goes through one ``Refusals``: it counts them per API (for the metrics) and logs a WARNING
naming the API, the peer, the principal and what was missing, at most ``burst`` lines per
``period_s`` (then one line saying how many were not logged). A client retrying a denied
request in a loop costs a counter increment, not a log line each time.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Final

from raftlog.server.listener import RequestContext

log = logging.getLogger(__name__)

LOG_BURST: Final = 20
LOG_PERIOD_S: Final = 10.0


class Refusals:
    def __init__(self, burst: int = LOG_BURST, period_s: float = LOG_PERIOD_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.by_api: Counter[str] = Counter()
        self._burst, self._period_s, self._clock = burst, period_s, clock
        self._window_start = -period_s
        self._logged = 0
        self._suppressed = 0

    @property
    def count(self) -> int:
        return sum(self.by_api.values())

    def refused(self, ctx: RequestContext, missing: str) -> None:
        """Counts one refusal of ``ctx`` for lack of ``missing`` and maybe logs it."""
        self.by_api[ctx.api.name] += 1
        now = self._clock()
        if now - self._window_start >= self._period_s:
            if self._suppressed:
                log.warning("%d more authorization refusals were not logged",
                            self._suppressed)
            self._window_start, self._logged, self._suppressed = now, 0, 0
        if self._logged >= self._burst:
            self._suppressed += 1
            return
        self._logged += 1
        log.warning("refused %s from %s (%s): no %s", ctx.api.name, ctx.peer,
                    ctx.session.principal, missing)
