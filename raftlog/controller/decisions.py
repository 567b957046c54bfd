"""The controller core's vocabulary for answers: a :class:`Proposal` (a record to propose
under compare-and-set) and a :class:`Decision` (an error, or the proposals a request needs),
with the Kafka error codes the controller answers with that the state machine never produces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from raftlog.metadata import errors
from raftlog.metadata.image import PartitionImage
from raftlog.metadata.records import Record
from raftlog.protocol.errors import ErrorCode

# Kafka error codes the controller answers with that the state machine never produces.
NOT_LEADER_OR_FOLLOWER: Final = int(ErrorCode.NOT_LEADER_OR_FOLLOWER)
OPERATION_NOT_ATTEMPTED: Final = int(ErrorCode.OPERATION_NOT_ATTEMPTED)
STALE_BROKER_EPOCH: Final = int(ErrorCode.STALE_BROKER_EPOCH)
DUPLICATE_BROKER_REGISTRATION: Final = int(ErrorCode.DUPLICATE_BROKER_REGISTRATION)
INCONSISTENT_CLUSTER_ID: Final = int(ErrorCode.INCONSISTENT_CLUSTER_ID)


@dataclass(frozen=True, slots=True)
class Proposal:
    """A record to propose, with the compare-and-set version to propose it under."""

    record: Record
    expected_version: int | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Decision:
    """The core's answer to one request: an error, or records to propose (maybe none).

    ``partition`` is the current state of the partition an AlterPartition named, so a no-op
    request can be answered without proposing anything.
    """

    error_code: int = errors.NONE
    message: str | None = None
    proposals: tuple[Proposal, ...] = ()
    partition: PartitionImage | None = None

    @property
    def ok(self) -> bool:
        return self.error_code == errors.NONE


def rejected(error_code: int, message: str, partition: PartitionImage | None = None) -> Decision:
    """A Decision refusing the request with ``error_code`` (never NONE)."""
    assert error_code != errors.NONE
    return Decision(error_code, message, (), partition)
