"""Typed errors raised by the partition log for bad input or bad disk contents.

Each error carries the Kafka error code the server should put in its response, so the
server never has to map exception types itself. Our own bugs are ``assert`` failures, not
these classes.
"""

from __future__ import annotations

__all__ = [
    "CorruptRecordError",
    "InvalidRecordError",
    "OffsetOutOfRangeError",
    "PartitionLogError",
    "RecordTooLargeError",
    "UnexpectedOffsetError",
    "UnsupportedCompressionError",
]


class PartitionLogError(Exception):
    """Base class: a request or the data on disk could not be handled."""

    # UNKNOWN_SERVER_ERROR; every subclass overrides it with its specific code.
    error_code: int = -1


class CorruptRecordError(PartitionLogError):
    """A batch failed a structural check: length, magic, CRC or truncation."""

    error_code = 2  # CORRUPT_MESSAGE


class InvalidRecordError(PartitionLogError):
    """A well-formed batch that the broker refuses: bad record count, control batch, empty."""

    error_code = 87  # INVALID_RECORD


class RecordTooLargeError(PartitionLogError):
    """A batch is larger than the topic's ``max.message.bytes``."""

    error_code = 10  # MESSAGE_TOO_LARGE


class OffsetOutOfRangeError(PartitionLogError):
    """A read or lookup asked for an offset outside [log_start_offset, log_end_offset]."""

    error_code = 1  # OFFSET_OUT_OF_RANGE


class UnsupportedCompressionError(PartitionLogError):
    """Record decoding was asked to look inside a compressed batch."""

    error_code = 76  # UNSUPPORTED_COMPRESSION_TYPE


class UnexpectedOffsetError(PartitionLogError):
    """Replicated batches that do not continue the log at its end offset, or have gaps."""

    error_code = -1  # UNKNOWN_SERVER_ERROR: only followers append replicated batches
