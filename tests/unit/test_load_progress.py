"""The progress line of a long partition-log load (raftlog.replication.load_progress)."""

from __future__ import annotations

from raftlog.replication.load_progress import LoadProgress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_quick_load_says_nothing() -> None:
    clock = Clock()
    progress = LoadProgress(lambda: 3, clock, interval_s=5)
    for _ in range(3):
        clock.now += 0.1
        assert progress.note_opened() is None
    assert progress.finished() is None


def test_a_long_load_reports_every_interval_and_at_the_end() -> None:
    clock = Clock()
    progress = LoadProgress(lambda: 1000, clock, interval_s=5)
    lines = []
    for _ in range(1000):
        clock.now += 0.012  # 12 s in all
        if (line := progress.note_opened()) is not None:
            lines.append(line)
    assert len(lines) == 2, lines
    assert lines[0].startswith("loading partition logs: 417 opened of 1000 assigned here, 5.0")
    assert progress.finished() == "loaded 1000 partition logs in 12.0 s"


def test_a_long_sync_that_opened_nothing_says_nothing() -> None:
    clock = Clock()
    progress = LoadProgress(lambda: 0, clock, interval_s=5)
    clock.now += 60
    assert progress.finished() is None
