"""Which partitions moved (log end, high watermark, role) since a point: what a long poll must
read again when it wakes.

Why: every append or high-watermark move wakes every waiting Fetch. A follower's session names
every partition it follows from this leader, and each wake-up re-read all of them: at 10,000
partitions, thousands of partition reads per append, most of the leader's CPU during a
produce to every partition or a restart's ISR rejoin. With this journal an incremental
session's long poll re-reads only the partitions that moved. Bounded: a reader that fell
further behind than ``capacity`` entries is told so and reads everything, as before.
Plain synchronous code; owned by ``PartitionManager``.
"""

from __future__ import annotations

from collections import deque
from typing import Final

__all__ = ["CHANGE_JOURNAL_CAPACITY", "ChangeJournal"]

Key = tuple[str, int]

CHANGE_JOURNAL_CAPACITY: Final = 8192


class ChangeJournal:
    """Sequence-numbered partition keys, the newest ``capacity`` of them."""

    def __init__(self, capacity: int = CHANGE_JOURNAL_CAPACITY) -> None:
        assert capacity >= 1
        self.seq = 0  # the number of the newest entry (0: none yet)
        self._entries: deque[tuple[int, Key]] = deque(maxlen=capacity)

    def note(self, key: Key) -> None:
        self.seq += 1
        self._entries.append((self.seq, key))

    def since(self, seq: int) -> set[Key] | None:
        """The keys noted after ``seq`` (a ``seq`` read earlier), or None when some of them
        are no longer held (the caller must assume that everything moved)."""
        assert 0 <= seq <= self.seq
        if seq == self.seq:
            return set()
        if self._entries[0][0] > seq + 1:
            return None
        keys: set[Key] = set()
        for number, key in reversed(self._entries):
            if number <= seq:
                break
            keys.add(key)
        return keys
