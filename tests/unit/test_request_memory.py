"""queued.max.request.bytes: grants in order, back-pressure, the overdraft lane, cancellation."""

from __future__ import annotations

import trio
import trio.testing

from raftlog.server.request_memory import FrameLease, RequestMemory


async def _grow_in_task(nursery: trio.Nursery, lease: FrameLease, nbytes: int) -> trio.Event:
    """Starts ``lease.grow(nbytes)``; the event is set once it was granted."""
    granted = trio.Event()

    async def grow() -> None:
        await lease.grow(nbytes)
        granted.set()

    nursery.start_soon(grow)
    await trio.testing.wait_all_tasks_blocked()
    return granted


async def test_grants_within_the_budget_at_once_and_counts_them() -> None:
    memory = RequestMemory(100)
    a, b = memory.lease(), memory.lease()
    await a.grow(60)
    await b.grow(40)
    assert (memory.used, a.held, b.held) == (100, 60, 40)
    a.shrink(10)
    assert (memory.used, a.held) == (90, 50)
    a.release()
    a.release()  # harmless twice
    assert (memory.used, a.held) == (40, 0)


async def test_a_reader_short_of_memory_waits_until_some_is_given_back() -> None:
    memory = RequestMemory(100)
    holder, lane, waiter = memory.lease(), memory.lease(), memory.lease()
    await holder.grow(90)
    await lane.grow(20)  # short: takes the overdraft lane
    assert memory.used == 110
    async with trio.open_nursery() as nursery:
        granted = await _grow_in_task(nursery, waiter, 20)
        assert not granted.is_set() and memory.waiting == 1  # the lane is taken
        await lane.grow(1000)  # the lane's frame goes on, past the budget
        assert memory.used == 1110
        holder.release()  # 1020 still used: over the budget, and the lane is busy
        await trio.testing.wait_all_tasks_blocked()
        assert not granted.is_set()
        lane.release()  # the lane is free and the budget has room again
        await granted.wait()
    assert (memory.used, waiter.held, memory.waiting) == (20, 20, 0)


async def test_grants_are_first_come_first_served() -> None:
    memory = RequestMemory(100)
    holder, lane = memory.lease(), memory.lease()
    await holder.grow(100)
    await lane.grow(1)  # occupies the lane so the others queue
    big, small = memory.lease(), memory.lease()
    async with trio.open_nursery() as nursery:
        big_granted = await _grow_in_task(nursery, big, 80)
        small_granted = await _grow_in_task(nursery, small, 10)
        holder.shrink(50)  # room for the small one, but the big one asked first
        await trio.testing.wait_all_tasks_blocked()
        assert not big_granted.is_set() and not small_granted.is_set()
        holder.release()
        await big_granted.wait()
        await small_granted.wait()
    assert memory.used == 91


async def test_readers_holding_part_of_a_frame_never_wait_for_each_other() -> None:
    """Two half-read frames that each need more than is left: one finishes in the lane."""
    memory = RequestMemory(100)
    a, b = memory.lease(), memory.lease()
    await a.grow(50)
    await b.grow(50)
    with trio.fail_after(1):
        await a.grow(50)  # short, the lane is free: granted past the budget
    async with trio.open_nursery() as nursery:
        b_granted = await _grow_in_task(nursery, b, 50)
        assert not b_granted.is_set()
        a.release()  # a's frame was handled
        await b_granted.wait()
    assert memory.used == 100


async def test_a_frame_larger_than_the_whole_budget_is_served() -> None:
    memory = RequestMemory(100)
    lease = memory.lease()
    with trio.fail_after(1):
        await lease.grow(60)
        await lease.grow(1000)
    lease.release()
    assert memory.used == 0


async def test_a_cancelled_waiter_leaves_the_queue_and_lets_the_next_in() -> None:
    memory = RequestMemory(100)
    holder, lane = memory.lease(), memory.lease()
    await holder.grow(100)
    await lane.grow(1)
    first, second = memory.lease(), memory.lease()
    scope = trio.CancelScope()

    async def first_grows() -> None:
        with scope:  # a reader's timeout, or its connection closing
            await first.grow(100)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first_grows)
        await trio.testing.wait_all_tasks_blocked()
        second_granted = await _grow_in_task(nursery, second, 10)
        holder.release()  # 1 used: room for the second, not for the first
        await trio.testing.wait_all_tasks_blocked()
        assert not second_granted.is_set() and memory.waiting == 2
        scope.cancel()
        await second_granted.wait()
    assert (memory.waiting, first.held, memory.used) == (0, 0, 11)


async def test_zero_or_negative_means_unbounded_as_in_kafka() -> None:
    for capacity in (0, -1):
        memory = RequestMemory(capacity)
        lease = memory.lease()
        with trio.fail_after(1):
            for _ in range(10):
                await lease.grow(1 << 30)
        assert memory.used == 10 << 30
