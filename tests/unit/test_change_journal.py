"""ChangeJournal: a reader learns exactly the partitions noted since its position, or that it
fell too far behind to know."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from raftlog.partition.change_journal import ChangeJournal

keys = st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 5))


@given(st.lists(keys, max_size=60), st.integers(1, 20), st.data())
def test_since_is_what_was_noted_after_the_position_or_none(
        noted: list[tuple[str, int]], capacity: int, data: st.DataObject) -> None:
    journal = ChangeJournal(capacity)
    for key in noted:
        journal.note(key)
    assert journal.seq == len(noted)
    position = data.draw(st.integers(0, len(noted)))
    answer = journal.since(position)
    if len(noted) - position > capacity:
        assert answer is None
    else:
        assert answer == set(noted[position:])


def test_a_reader_that_is_current_gets_nothing() -> None:
    journal = ChangeJournal(4)
    assert journal.since(0) == set()
    journal.note(("t", 0))
    assert journal.since(journal.seq) == set()
