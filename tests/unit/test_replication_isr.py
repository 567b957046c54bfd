"""LeaderState: follower positions, caught-up times, the maximal-ISR HW rule and ISR changes.
Pure: time is a number."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from raftlog.partition.replica_state import LeaderState

LAG_MS = 1000


def everyone(_: int) -> bool:
    return True


def leader(isr: tuple[int, ...] = (1, 2, 3), replicas: tuple[int, ...] = (1, 2, 3),
           epoch_start: int = 0, now: int = 0) -> LeaderState:
    return LeaderState(node_id=1, replicas=replicas, isr=isr, leader_epoch=4,
                       partition_epoch=10, epoch_start_offset=epoch_start, now_ms=now)


def test_caught_up_time_follows_kafka() -> None:
    state = leader(now=0)
    follower = state.followers[2]
    assert follower.last_caught_up_ms == 0, "ISR members start caught up (resetReplicaState)"
    # Fetching at the leader's end: caught up now.
    state.record_fetch(2, 100, 100, now_ms=50)
    assert follower.last_caught_up_ms == 50
    # Behind the leader's current end, but at least at its end as of the previous fetch:
    # caught up as of that previous fetch.
    state.record_fetch(2, 100, 120, now_ms=80)
    assert follower.last_caught_up_ms == 50
    state.record_fetch(2, 120, 150, now_ms=90)
    assert follower.last_caught_up_ms == 80
    # Falling further behind: no progress.
    state.record_fetch(2, 130, 200, now_ms=95)
    assert follower.last_caught_up_ms == 80
    assert not state.record_fetch(9, 0, 0, now_ms=100), "not a replica"


def test_hw_uses_the_maximal_isr() -> None:
    state = leader()
    state.record_fetch(2, 50, 100, now_ms=0)
    state.record_fetch(3, 80, 100, now_ms=0)
    assert state.high_watermark_candidate(100, 100, 0, LAG_MS, everyone) == 50
    # Shrinking 2 out: until the controller confirms, 2 still counts.
    state.begin_change((1, 3), now_ms=10)
    assert state.maximal_isr == (1, 2, 3)
    assert state.high_watermark_candidate(100, 100, 10, LAG_MS, everyone) == 50
    assert state.update_isr((1, 3), 11)
    assert state.pending is None
    # Out of the ISR, 2 still holds the HW while it counts as caught up (about to rejoin)...
    assert state.high_watermark_candidate(100, 100, 20, LAG_MS, everyone) == 50
    # ...but not once it has lagged for the lag time.
    assert state.high_watermark_candidate(100, 100, 5000, LAG_MS, everyone) == 80
    # The leader's own durable end bounds it too.
    assert state.high_watermark_candidate(60, 100, 5000, LAG_MS, everyone) == 60


def test_an_expanding_follower_counts_at_once() -> None:
    state = leader(isr=(1, 3))
    state.record_fetch(3, 100, 100, now_ms=0)
    state.record_fetch(2, 40, 100, now_ms=0)  # not caught up, not in the ISR: ignored
    assert state.high_watermark_candidate(100, 100, 5000, LAG_MS, everyone) == 100
    state.record_fetch(2, 100, 100, now_ms=5000)
    assert state.proposed_isr(100, 100, 5000, LAG_MS, everyone) == (1, 2, 3)
    state.begin_change((1, 2, 3), now_ms=5000)
    state.record_fetch(2, 100, 110, now_ms=5001)
    assert state.high_watermark_candidate(110, 110, 5001, LAG_MS, everyone) == 100


def test_a_caught_up_eligible_follower_about_to_join_holds_the_hw() -> None:
    state = leader(isr=(1, 3))
    state.record_fetch(3, 100, 100, now_ms=0)
    state.record_fetch(2, 90, 90, now_ms=0)  # caught up at 90, then the leader wrote more
    assert state.high_watermark_candidate(100, 100, 10, LAG_MS, everyone) == 90
    assert state.high_watermark_candidate(100, 100, 10, LAG_MS, lambda r: r != 2) == 100


def test_shrink_after_the_lag_time_then_expand() -> None:
    state = leader(now=0)
    state.record_fetch(2, 100, 100, now_ms=500)
    state.record_fetch(3, 100, 100, now_ms=500)
    assert state.proposed_isr(100, 100, 1400, LAG_MS, everyone) is None
    state.record_fetch(2, 120, 120, now_ms=1400)  # 3 stops fetching
    assert state.out_of_sync(120, 1600, LAG_MS) == [3]
    assert state.proposed_isr(120, 120, 1600, LAG_MS, everyone) == (1, 2)
    pending = state.begin_change((1, 2), now_ms=1600)
    assert not state.can_send_change(1700, 100, 30_000), "one change at a time"
    assert state.update_isr((1, 2), 11) and state.pending is None
    # 3 comes back: in sync once it reaches the HW and this epoch's start, and eligible.
    state.record_fetch(3, 110, 120, now_ms=2000)
    assert state.proposed_isr(120, 115, 2000, LAG_MS, everyone) is None
    state.record_fetch(3, 120, 120, now_ms=2100)
    assert state.proposed_isr(120, 115, 2100, LAG_MS, lambda r: r != 3) is None
    assert state.proposed_isr(120, 115, 2100, LAG_MS, everyone) == (1, 2, 3)
    assert pending.partition_epoch == 10


def test_an_isr_member_that_falls_below_the_hw_leaves_at_once() -> None:
    # A follower that found a corrupt batch reports its offset as its log end: it lacks
    # committed data and must not stay eligible to lead (LeaderFetcher._drop_corrupt).
    state = leader(now=0)
    state.record_fetch(2, 100, 100, now_ms=500)
    state.record_fetch(3, 100, 100, now_ms=500)
    assert state.proposed_isr(100, 100, 600, LAG_MS, everyone) is None
    state.record_fetch(3, 40, 100, now_ms=600)
    assert state.out_of_sync(100, 600, LAG_MS, high_watermark=100) == [3]
    assert state.out_of_sync(100, 600, LAG_MS) == [], "without the HW: the lag time only"
    assert state.proposed_isr(100, 100, 600, LAG_MS, everyone) == (1, 2)


def test_expansion_needs_the_epoch_start_offset() -> None:
    state = leader(isr=(1,), epoch_start=50)
    state.record_fetch(2, 40, 60, now_ms=0)
    assert state.proposed_isr(60, 30, 0, LAG_MS, everyone) is None
    state.record_fetch(2, 50, 60, now_ms=1)
    assert state.proposed_isr(60, 30, 1, LAG_MS, everyone) == (1, 2)


def test_failed_changes_keep_the_maximal_isr_until_resolved() -> None:
    state = leader(isr=(1, 2))
    first = state.begin_change((1, 2, 3), now_ms=0)
    # The RPC timed out: the controller may have applied it. 3 keeps counting for the HW.
    state.change_failed(first, now_ms=100, definitive=False)
    assert state.maximal_isr == (1, 2, 3)
    assert not state.can_send_change(150, 100, 30_000)
    assert state.can_send_change(200, 100, 30_000)
    # A retry for something else still keeps 3 in, until metadata says what happened.
    retry = state.begin_change((1,), now_ms=200)
    assert set(state.maximal_isr) == {1, 2, 3} and retry.ambiguous
    state.change_failed(retry, now_ms=250, definitive=True)
    assert set(state.maximal_isr) == {1, 2, 3}, "an earlier attempt is still in doubt"
    assert not state.update_isr((1, 2), 9), "older metadata is ignored"
    assert state.update_isr((1, 2, 3), 11)
    assert state.pending is None and state.maximal_isr == (1, 2, 3)
    # A definitive refusal with nothing in doubt reverts to the committed ISR.
    attempt = state.begin_change((1, 2), now_ms=300)
    state.change_failed(attempt, now_ms=310, definitive=True)
    assert state.pending is None and state.maximal_isr == (1, 2, 3)
    # Accepted without the new state: wait for metadata, or resend after the timeout.
    accepted = state.begin_change((1, 2), now_ms=400)
    state.change_accepted(accepted)
    assert not state.can_send_change(1000, 100, 30_000)
    assert state.can_send_change(30_400, 100, 30_000)


@settings(max_examples=200, deadline=None)
@given(fetches=st.lists(st.tuples(st.sampled_from([2, 3]), st.integers(0, 100)), max_size=20),
       local_end=st.integers(0, 100))
def test_hw_never_exceeds_an_isr_member(fetches: list[tuple[int, int]], local_end: int) -> None:
    state = leader()
    leader_end = 100
    for replica, offset in fetches:
        state.record_fetch(replica, offset, leader_end, now_ms=0)
    candidate = state.high_watermark_candidate(local_end, leader_end, 0, LAG_MS, everyone)
    assert candidate <= local_end
    for replica in (2, 3):
        assert candidate <= state.followers[replica].log_end_offset


def test_only_a_position_from_the_registered_broker_epoch_joins_the_isr() -> None:
    # KIP-903: a follower that registered again (epoch 31) is not added back on the log end
    # it fetched at under its previous epoch (4), only after a fetch in epoch 31.
    state = leader(isr=(1, 2))
    state.record_fetch(3, 60, 60, now_ms=0, broker_epoch=4)
    epochs = {2: 7, 3: 31}
    assert state.proposed_isr(60, 60, 1, LAG_MS, everyone, epochs.get) is None
    state.record_fetch(3, 60, 60, now_ms=2, broker_epoch=31)
    assert state.proposed_isr(60, 60, 3, LAG_MS, everyone, epochs.get) == (1, 2, 3)
