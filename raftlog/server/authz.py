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

from raftlog.log_budget import LOG_BURST_DEFAULT, LOG_PERIOD_S_DEFAULT, LogBudget
from raftlog.server.listener import RequestContext

log = logging.getLogger(__name__)


class Refusals:
    def __init__(self, burst: int = LOG_BURST_DEFAULT, period_s: float = LOG_PERIOD_S_DEFAULT,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.by_api: Counter[str] = Counter()
        self._lines = LogBudget(log, "authorization refusals", burst=burst, period_s=period_s,
                                clock=clock)

    @property
    def count(self) -> int:
        return sum(self.by_api.values())

    def refused(self, ctx: RequestContext, missing: str) -> None:
        """Counts one refusal of ``ctx`` for lack of ``missing`` and maybe logs it."""
        self.by_api[ctx.api.name] += 1
        self._lines.log(logging.WARNING, "refused %s from %s (%s): no %s", ctx.api.name,
                        ctx.peer, ctx.session.principal, missing)
