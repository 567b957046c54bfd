"""Error codes returned by the metadata state machine.

Codes below 1000 are Kafka's own (``clients/.../protocol/Errors.java``) so the server can put them
on the wire unchanged. Codes from 1000 up are internal to raftlog: they never go on the wire as-is,
and :func:`wire_error_code` says what a client should see instead.
"""

from __future__ import annotations

from typing import Final

NONE: Final = 0
UNKNOWN_TOPIC_OR_PARTITION: Final = 3
INVALID_TOPIC_EXCEPTION: Final = 17
TOPIC_ALREADY_EXISTS: Final = 36
INVALID_PARTITIONS: Final = 37
INVALID_REPLICATION_FACTOR: Final = 38
INVALID_REPLICA_ASSIGNMENT: Final = 39
INVALID_CONFIG: Final = 40
NOT_CONTROLLER: Final = 41
INVALID_REQUEST: Final = 42
REQUEST_TIMED_OUT: Final = 7
FENCED_LEADER_EPOCH: Final = 74
INVALID_UPDATE_VERSION: Final = 95
UNKNOWN_TOPIC_ID: Final = 100
BROKER_ID_NOT_REGISTERED: Final = 102
INELIGIBLE_REPLICA: Final = 107

# Internal: the command carried ``expected_version`` and the resource it targets changed after that
# version (compare-and-set failed in log order). The proposer should re-read the image and retry;
# a client must never see 1000, so the server maps it with ``wire_error_code``.
STALE_METADATA_VERSION: Final = 1000

INTERNAL_ERROR_CODE_MIN: Final = 1000

# Why REQUEST_TIMED_OUT: it is retriable in every client, and a lost CAS race is exactly
# "try again", while NOT_CONTROLLER would make clients refresh metadata for no reason.
_WIRE_CODE_BY_INTERNAL_CODE: Final = {STALE_METADATA_VERSION: REQUEST_TIMED_OUT}

ERROR_NAMES: Final = {
    NONE: "NONE",
    UNKNOWN_TOPIC_OR_PARTITION: "UNKNOWN_TOPIC_OR_PARTITION",
    REQUEST_TIMED_OUT: "REQUEST_TIMED_OUT",
    INVALID_TOPIC_EXCEPTION: "INVALID_TOPIC_EXCEPTION",
    TOPIC_ALREADY_EXISTS: "TOPIC_ALREADY_EXISTS",
    INVALID_PARTITIONS: "INVALID_PARTITIONS",
    INVALID_REPLICATION_FACTOR: "INVALID_REPLICATION_FACTOR",
    INVALID_REPLICA_ASSIGNMENT: "INVALID_REPLICA_ASSIGNMENT",
    INVALID_CONFIG: "INVALID_CONFIG",
    NOT_CONTROLLER: "NOT_CONTROLLER",
    INVALID_REQUEST: "INVALID_REQUEST",
    FENCED_LEADER_EPOCH: "FENCED_LEADER_EPOCH",
    INVALID_UPDATE_VERSION: "INVALID_UPDATE_VERSION",
    UNKNOWN_TOPIC_ID: "UNKNOWN_TOPIC_ID",
    BROKER_ID_NOT_REGISTERED: "BROKER_ID_NOT_REGISTERED",
    INELIGIBLE_REPLICA: "INELIGIBLE_REPLICA",
    STALE_METADATA_VERSION: "STALE_METADATA_VERSION",
}


def wire_error_code(error_code: int) -> int:
    """Return the Kafka error code a client should see for ``error_code``."""
    if error_code < INTERNAL_ERROR_CODE_MIN:
        return error_code
    return _WIRE_CODE_BY_INTERNAL_CODE[error_code]


def error_name(error_code: int) -> str:
    """Return the symbolic name of ``error_code`` (for logs and test messages)."""
    return ERROR_NAMES.get(error_code, f"ERROR_{error_code}")
