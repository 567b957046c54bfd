"""The Raft tick-stall warning (raftlog.quorum.tick_stalls)."""

from __future__ import annotations

import logging

import pytest

from raftlog.quorum.tick_stalls import TickStalls


def test_gaps_beyond_the_threshold_are_counted_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    stalls = TickStalls(threshold_s=0.175)
    assert stalls.note_start(10.0) is None  # the first tick has no gap
    stalls.note_tick(0.001, 0.05, 0.0)
    assert stalls.note_start(10.06) is None
    stalls.note_tick(0.0, 0.3, 0.002)
    gap = stalls.note_start(10.4)
    assert gap == pytest.approx(0.34)
    assert stalls.count == 1 and stalls.longest_s == pytest.approx(0.34)
    assert "stalled 340 ms" in caplog.text and "pysyncobj 300 ms" in caplog.text
