"""raftlog.gc_freezer: full collections stop walking the long-lived heap, and cycles among
frozen objects are still reclaimed after a thaw."""

from __future__ import annotations

import gc
import weakref

from raftlog.gc_freezer import FreezePolicy, GcAction, gc_freezer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Node:
    """An object that can take part in a reference cycle."""

    def __init__(self) -> None:
        self.other: Node | None = None


def make_cycle() -> weakref.ref[Node]:
    first, second = Node(), Node()
    first.other, second.other = second, first
    return weakref.ref(first)


def test_the_policy_freezes_until_the_interval_ends_then_lets_one_collection_walk_all() -> None:
    policy = FreezePolicy(thaw_interval_s=60.0, now=0.0)
    assert policy.full_collection_done(1.0) is GcAction.FREEZE
    assert policy.full_collection_done(59.9) is GcAction.FREEZE
    assert policy.full_collection_done(60.0) is GcAction.THAW
    # The collection after the thaw walked everything: freeze again, a new interval starts.
    assert policy.full_collection_done(61.0) is GcAction.FREEZE
    assert policy.full_collection_done(120.0) is GcAction.FREEZE
    assert policy.full_collection_done(121.0) is GcAction.THAW
    assert (policy.freezes, policy.thaws) == (4, 2)


def test_survivors_of_a_full_collection_are_frozen_and_unfrozen_on_exit() -> None:
    kept = [Node() for _ in range(1000)]
    with gc_freezer(thaw_interval_s=600.0) as policy:
        gc.collect()
        assert gc.get_freeze_count() >= len(kept)
        assert policy.freezes == 1
        # Young objects are still collected normally: only survivors of the walk are frozen.
        young = make_cycle()
        gc.collect()
        assert young() is None
    assert gc.get_freeze_count() == 0
    assert kept


def test_a_cycle_that_dies_while_frozen_is_reclaimed_after_the_thaw() -> None:
    clock = Clock()
    with gc_freezer(thaw_interval_s=600.0, clock=clock) as policy:
        cycle = make_cycle()
        strong = cycle()
        gc.collect()  # walks it, then freezes it
        del strong
        gc.collect()
        assert cycle() is not None, "a frozen cycle is not walked before the thaw"
        clock.now += 600.0
        gc.collect()  # the collection that ends the interval thaws at its end
        assert policy.thaws == 1 and gc.get_freeze_count() == 0
        gc.collect()  # walks everything
        assert cycle() is None
        assert gc.get_freeze_count() > 0, "frozen again after the walk of everything"


def test_a_young_collection_changes_nothing() -> None:
    with gc_freezer() as policy:
        gc.collect(0)
        gc.collect(1)
        assert policy.freezes == 0 and gc.get_freeze_count() == 0
