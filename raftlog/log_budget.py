"""Log lines about what peers or clients do, without letting them flood the log.

A client retrying in a loop, or a fault that makes every producer retry at once, must cost a
counter, not a log line each time. ``LogBudget`` writes at most ``burst`` lines per
``period_s`` and then, at the start of the next period, one line saying how many it dropped.
Plain synchronous code (any layer may use it); the clock is injectable for tests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

LOG_BURST_DEFAULT: Final = 20
LOG_PERIOD_S_DEFAULT: Final = 10.0


class LogBudget:
    def __init__(self, logger: logging.Logger, what: str, *, burst: int = LOG_BURST_DEFAULT,
                 period_s: float = LOG_PERIOD_S_DEFAULT,
                 clock: Callable[[], float] = time.monotonic) -> None:
        assert burst >= 1 and period_s > 0
        self._logger, self._what = logger, what
        self._burst, self._period_s, self._clock = burst, period_s, clock
        self._window_start = -period_s
        self._logged = 0
        self.suppressed = 0

    def log(self, level: int, message: str, *args: object) -> bool:
        """Log ``message % args`` at ``level`` if the budget allows; True if it was written."""
        now = self._clock()
        if now - self._window_start >= self._period_s:
            if self.suppressed:
                self._logger.log(level, "%d more %s were not logged", self.suppressed,
                                 self._what)
            self._window_start, self._logged, self.suppressed = now, 0, 0
        if self._logged >= self._burst:
            self.suppressed += 1
            return False
        self._logged += 1
        self._logger.log(level, message, *args)
        return True
