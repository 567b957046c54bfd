"""What ``Partition.append`` is told and what it answers: the one way bytes enter a partition.

Kafka funnels every write into ``UnifiedLog.append`` with an ``AppendOrigin``; so does raftlog
(``raftlog.partition.partition.Partition.append``). The origin decides the checks:

* ``CLIENT``: a producer's batches (Produce). Validated, refused without keys on a compacted
  topic, checked against producer state (duplicates, sequences, epochs), no control batches.
* ``COORDINATOR``: records the group and transaction coordinators write themselves (offsets,
  group metadata, transaction state, transactional offsets) and the COMMIT/ABORT markers of
  transactions: control batches are allowed, a marker is checked against the producer's epoch
  and coordinator epoch, data batches are not sequence-checked (they carry no sequence).
* ``REPLICATION``: a follower appending its leader's batches exactly as stored; no check but
  the log's own (the leader checked), producer state replayed from them.

Pure data: no I/O, no trio.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from raftlog.protocol.errors import ErrorCode

__all__ = ["AppendOrigin", "AppendResult"]


class AppendOrigin(enum.Enum):
    """Who is appending (Kafka's ``AppendOrigin``)."""

    CLIENT = "client"
    COORDINATOR = "coordinator"
    REPLICATION = "replication"


@dataclass(frozen=True, slots=True)
class AppendResult:
    """The outcome of one ``Partition.append``.

    ``error`` is NONE when the records are in the log (or, ``duplicate``, were already: a
    retried batch answered with its original offsets, nothing written). Then the caller waits
    for offset ``end_offset`` to be replicated or fsynced under ``leadership_generation``, the
    leadership the append happened in. Otherwise nothing was written and ``message`` says why.
    Storage and validation failures are raised instead (``PartitionLogError``, ``OSError``):
    each caller maps them to its own API's error.
    """

    error: int = ErrorCode.NONE
    message: str = ""
    base_offset: int = -1
    last_offset: int = -1
    log_append_time_ms: int = -1  # -1 unless the topic uses LogAppendTime
    duplicate: bool = False
    leadership_generation: int = 0

    @property
    def end_offset(self) -> int:
        """The offset the high watermark (or the flushed offset) must reach."""
        return self.last_offset + 1

    @classmethod
    def refused(cls, error: int, message: str) -> AppendResult:
        return cls(error=error, message=message)
