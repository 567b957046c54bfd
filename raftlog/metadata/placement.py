"""Replica placement: Kafka's rack-unaware assignment, as a pure function.

Reference: ``AdminUtils.assignReplicasToBrokersRackUnaware`` (Kafka). The first replica of
partition ``p`` goes to broker ``(p + start_index) % n``, so leaders go round-robin; the followers
are shifted by an amount that grows every ``n`` partitions, so followers spread out too. The
proposer picks ``start_index`` (Kafka picks it at random); the state machine only sees the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from raftlog.metadata import errors

REPLICATION_FACTOR_MAX: Final = 32767  # Kafka's replication factor is an int16.


class PlacementError(ValueError):
    """The placement request cannot be satisfied; ``error_code`` is the Kafka error to return."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


def assign_replicas(
    num_partitions: int,
    replication_factor: int,
    live_broker_ids: Sequence[int],
    start_index: int,
    *,
    first_partition: int = 0,
) -> tuple[tuple[int, ...], ...]:
    """Return one replica list per partition; the first replica of each list is the leader.

    Args:
        num_partitions: How many partitions to place (>= 1).
        replication_factor: Replicas per partition (1 .. number of live brokers).
        live_broker_ids: Candidate brokers; sorted here so the result does not depend on order.
        start_index: Fixed start offset into the sorted broker list (>= 0).
        first_partition: Id of the first partition placed; CreatePartitions passes the current
            partition count so new partitions continue the round-robin where the old ones stopped.

    Raises:
        PlacementError: INVALID_PARTITIONS or INVALID_REPLICATION_FACTOR.
    """
    brokers = sorted(set(live_broker_ids))
    _check_placement_arguments(
        num_partitions, replication_factor, len(brokers), start_index, first_partition
    )
    broker_count = len(brokers)
    assignment: list[tuple[int, ...]] = []
    for partition in range(first_partition, first_partition + num_partitions):
        # Kafka bumps the shift every broker_count partitions; computing it from the partition
        # id (rather than counting from first_partition) lets CreatePartitions continue exactly.
        replica_shift = start_index + partition // broker_count
        first_index = (partition + start_index) % broker_count
        replicas = [brokers[first_index]]
        for replica in range(replication_factor - 1):
            shift = 1 + (replica_shift + replica) % (broker_count - 1)
            replicas.append(brokers[(first_index + shift) % broker_count])
        assert len(set(replicas)) == replication_factor, replicas
        assignment.append(tuple(replicas))
    assert len(assignment) == num_partitions
    return tuple(assignment)


def _check_placement_arguments(
    num_partitions: int,
    replication_factor: int,
    broker_count: int,
    start_index: int,
    first_partition: int,
) -> None:
    if num_partitions < 1:
        raise PlacementError(errors.INVALID_PARTITIONS, "number of partitions must be at least 1")
    if not 1 <= replication_factor <= REPLICATION_FACTOR_MAX:
        raise PlacementError(
            errors.INVALID_REPLICATION_FACTOR, "replication factor must be at least 1"
        )
    if replication_factor > broker_count:
        raise PlacementError(
            errors.INVALID_REPLICATION_FACTOR,
            f"replication factor {replication_factor} is larger than the "
            f"{broker_count} available broker(s)",
        )
    if start_index < 0:
        raise ValueError(f"start_index must be >= 0, got {start_index}")
    if first_partition < 0:
        raise ValueError(f"first_partition must be >= 0, got {first_partition}")
