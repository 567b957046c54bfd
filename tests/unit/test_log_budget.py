"""LogBudget: at most ``burst`` lines per period, then one line counting the rest.

Goal: a client retrying a refused request (or every producer retrying after a fault) costs a
counter, not a log line each time, and nothing is dropped silently. Method: a hand-moved clock.
"""

from __future__ import annotations

import logging

import pytest

from raftlog.log_budget import LogBudget


def test_a_burst_then_silence_then_a_count_of_what_was_dropped(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    logger = logging.getLogger("test.log_budget")
    budget = LogBudget(logger, "verdicts", burst=2, period_s=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="test.log_budget"):
        assert budget.log(logging.INFO, "line %d", 1)
        assert budget.log(logging.INFO, "line %d", 2)
        assert not budget.log(logging.INFO, "line %d", 3)
        now[0] += 9.9
        assert not budget.log(logging.INFO, "line %d", 4)
        assert budget.suppressed == 2
        now[0] += 0.1  # a new period
        assert budget.log(logging.INFO, "line %d", 5)
    assert [r.getMessage() for r in caplog.records] == [
        "line 1", "line 2", "2 more verdicts were not logged", "line 5"]
    assert budget.suppressed == 0
