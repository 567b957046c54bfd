"""Error codes returned by the metadata state machine.

Codes below 1000 are Kafka's own, taken from :class:`raftlog.protocol.errors.ErrorCode` (the
one table of Kafka codes) so the server can put them on the wire unchanged. Codes from 1000 up
are internal to raftlog: they never go on the wire as-is, and :func:`wire_error_code` says what
a client should see instead.
"""

from __future__ import annotations

from typing import Final

from raftlog.protocol.errors import ErrorCode

# The Kafka codes the state machine returns, as plain ints, from the one table of Kafka codes.
NONE: Final = int(ErrorCode.NONE)
UNKNOWN_TOPIC_OR_PARTITION: Final = int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
INVALID_TOPIC_EXCEPTION: Final = int(ErrorCode.INVALID_TOPIC_EXCEPTION)
TOPIC_ALREADY_EXISTS: Final = int(ErrorCode.TOPIC_ALREADY_EXISTS)
INVALID_PARTITIONS: Final = int(ErrorCode.INVALID_PARTITIONS)
INVALID_REPLICATION_FACTOR: Final = int(ErrorCode.INVALID_REPLICATION_FACTOR)
INVALID_REPLICA_ASSIGNMENT: Final = int(ErrorCode.INVALID_REPLICA_ASSIGNMENT)
INVALID_CONFIG: Final = int(ErrorCode.INVALID_CONFIG)
NOT_CONTROLLER: Final = int(ErrorCode.NOT_CONTROLLER)
INVALID_REQUEST: Final = int(ErrorCode.INVALID_REQUEST)
REQUEST_TIMED_OUT: Final = int(ErrorCode.REQUEST_TIMED_OUT)
FENCED_LEADER_EPOCH: Final = int(ErrorCode.FENCED_LEADER_EPOCH)
INVALID_UPDATE_VERSION: Final = int(ErrorCode.INVALID_UPDATE_VERSION)
UNKNOWN_TOPIC_ID: Final = int(ErrorCode.UNKNOWN_TOPIC_ID)
BROKER_ID_NOT_REGISTERED: Final = int(ErrorCode.BROKER_ID_NOT_REGISTERED)
INELIGIBLE_REPLICA: Final = int(ErrorCode.INELIGIBLE_REPLICA)
RESOURCE_NOT_FOUND: Final = int(ErrorCode.RESOURCE_NOT_FOUND)
UNACCEPTABLE_CREDENTIAL: Final = int(ErrorCode.UNACCEPTABLE_CREDENTIAL)
UNSUPPORTED_SASL_MECHANISM: Final = int(ErrorCode.UNSUPPORTED_SASL_MECHANISM)

# Internal: the command carried ``expected_version`` and the resource it targets changed after that
# version (compare-and-set failed in log order). The proposer should re-read the image and retry;
# a client must never see 1000, so the server maps it with ``wire_error_code``.
STALE_METADATA_VERSION: Final = 1000

INTERNAL_ERROR_CODE_MIN: Final = 1000

# Why REQUEST_TIMED_OUT: it is retriable in every client, and a lost CAS race is exactly
# "try again", while NOT_CONTROLLER would make clients refresh metadata for no reason.
_WIRE_CODE_BY_INTERNAL_CODE: Final = {STALE_METADATA_VERSION: REQUEST_TIMED_OUT}

# error_name names these (the Kafka codes above) and the internal ones.
_KAFKA_CODES_NAMED: Final = (
    NONE, UNKNOWN_TOPIC_OR_PARTITION, REQUEST_TIMED_OUT, INVALID_TOPIC_EXCEPTION,
    TOPIC_ALREADY_EXISTS, INVALID_PARTITIONS, INVALID_REPLICATION_FACTOR,
    INVALID_REPLICA_ASSIGNMENT, INVALID_CONFIG, NOT_CONTROLLER, INVALID_REQUEST,
    FENCED_LEADER_EPOCH, INVALID_UPDATE_VERSION, UNKNOWN_TOPIC_ID, BROKER_ID_NOT_REGISTERED,
    INELIGIBLE_REPLICA, RESOURCE_NOT_FOUND, UNACCEPTABLE_CREDENTIAL, UNSUPPORTED_SASL_MECHANISM,
)
ERROR_NAMES: Final = {
    **{code: ErrorCode(code).name for code in _KAFKA_CODES_NAMED},
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
