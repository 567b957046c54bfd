"""Replica placement: Kafka's rack-unaware assignment.

Goal: the pure helper matches Kafka's algorithm on its documented example, spreads leaders
round-robin, never repeats a broker within a partition, and reports impossible requests with the
Kafka error code the server should return.
"""

from __future__ import annotations

import collections

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlog.metadata import errors
from raftlog.metadata.placement import PlacementError, assign_replicas


def test_single_node_places_every_partition_on_it() -> None:
    assert assign_replicas(3, 1, [1], 0) == ((1,), (1,), (1,))


def test_matches_kafkas_fixed_start_index_example() -> None:
    # Kafka's AdminUtils comment: 5 brokers, 10 partitions, RF 3, start index 0.
    assignment = assign_replicas(10, 3, [0, 1, 2, 3, 4], 0)
    assert assignment[:5] == ((0, 1, 2), (1, 2, 3), (2, 3, 4), (3, 4, 0), (4, 0, 1))
    assert assignment[5:] == ((0, 2, 3), (1, 3, 4), (2, 4, 0), (3, 0, 1), (4, 1, 2))


def test_broker_order_does_not_matter() -> None:
    assert assign_replicas(6, 2, [3, 1, 2], 1) == assign_replicas(6, 2, [1, 2, 3], 1)


def test_first_partition_continues_the_round_robin() -> None:
    whole = assign_replicas(6, 2, [1, 2, 3], 0)
    assert assign_replicas(2, 2, [1, 2, 3], 0, first_partition=4) == whole[4:]


@given(
    st.integers(1, 40),
    st.sets(st.integers(0, 100), min_size=1, max_size=8),
    st.integers(0, 20),
    st.data(),
)
def test_placement_properties(
    partitions: int, brokers: set[int], start: int, data: st.DataObject
) -> None:
    replication_factor = data.draw(st.integers(1, len(brokers)))
    assignment = assign_replicas(partitions, replication_factor, sorted(brokers), start)
    assert len(assignment) == partitions
    for replicas in assignment:
        assert len(replicas) == len(set(replicas)) == replication_factor
        assert set(replicas) <= brokers
    leaders = collections.Counter(replicas[0] for replicas in assignment)
    assert max(leaders.values()) - min(leaders.get(b, 0) for b in brokers) <= 1


@pytest.mark.parametrize(
    ("partitions", "replication_factor", "brokers", "error_code"),
    [
        (0, 1, [1], errors.INVALID_PARTITIONS),
        (1, 0, [1], errors.INVALID_REPLICATION_FACTOR),
        (1, 2, [1], errors.INVALID_REPLICATION_FACTOR),
        (1, 1, [], errors.INVALID_REPLICATION_FACTOR),
    ],
)
def test_impossible_requests_carry_the_kafka_error(
    partitions: int, replication_factor: int, brokers: list[int], error_code: int
) -> None:
    with pytest.raises(PlacementError) as caught:
        assign_replicas(partitions, replication_factor, brokers, 0)
    assert caught.value.error_code == error_code
