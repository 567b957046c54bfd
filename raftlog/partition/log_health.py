"""Storage failures of one log: the error clients see, and the offline state after a failure.

A log goes offline when the disk may differ from what the log knows (a failed fsync may have
dropped dirty pages; a partial append could not be cut off; a directory fsync failed after a
rename). From then on it takes no appends and attempts no fsync (a retried fsync can succeed
without the lost data) until a restart recovers it. Every part of the log that writes
(appends, flushes, retention, truncation, compaction swaps) consults and reports here.
"""

from __future__ import annotations

import errno
import logging

from raftlog.partition.errors import PartitionLogError
from raftlog.partition.log_flush import FlushState

__all__ = ["KafkaStorageError", "StorageHealth", "describe_os_error"]

logger = logging.getLogger(__name__)


class KafkaStorageError(PartitionLogError):
    """The disk refused a write (ENOSPC, EDQUOT, EFBIG, EIO...) or the log is offline after
    an earlier failure. Nothing of the refused append is in the log."""

    error_code = 56  # KAFKA_STORAGE_ERROR


def describe_os_error(error: OSError) -> str:
    """``[Errno 28] No space left on device (ENOSPC)``: the message and the errno's name."""
    name = errno.errorcode.get(error.errno, "?") if error.errno is not None else "?"
    return f"{error} ({name})"


class StorageHealth:
    """Whether the log named ``name`` (``<topic>-<partition>``) is offline, and why. Reads
    ``flush`` only to say, when it goes offline, which offsets stay readable."""

    def __init__(self, name: str, flush: FlushState) -> None:
        self._name = name
        self._flush = flush
        self._offline_reason: str | None = None

    @property
    def offline_reason(self) -> str | None:
        """Why the log takes no more appends or fsyncs until a restart, or None."""
        return self._offline_reason

    def mark_offline(self, operation: str, error: OSError, *, detail: str | None = None
                     ) -> None:
        """Take the log offline after a failure that may have left the disk differing from
        what the log knows (a failed fsync may have dropped dirty pages; a partial append
        could not be cut off). Appends raise KafkaStorageError and no fsync is attempted
        again (a retried fsync can succeed without the lost data); what is below the
        flushed offset stays readable. Opening the log again (a restart) runs recovery, which
        CRC-checks the tail and truncates anything torn. Logs one ERROR line."""
        if self._offline_reason is not None:
            return
        reason = f"{operation} failed: {describe_os_error(error)}"
        if detail:
            reason += f"; {detail}"
        self._offline_reason = reason
        logger.error(
            "partition %s: %s; the log is offline: appends are refused with "
            "KAFKA_STORAGE_ERROR until a restart recovers it; offsets below %d stay readable",
            self._name, reason, self._flush.flushed_offset,
        )

    def check_writable(self) -> None:
        """Raise KafkaStorageError while the log is offline."""
        if self._offline_reason is not None:
            raise KafkaStorageError(
                f"partition {self._name} is offline after an I/O error ({self._offline_reason});"
                " restart the node to recover it")

    def offline_error(self) -> KafkaStorageError:
        """The error to raise right after an I/O error took the log offline."""
        return KafkaStorageError(f"partition {self._name} is offline after an I/O error "
                                 f"({self._offline_reason})")
