"""Declarative schemas of the consumer-group APIs (FindCoordinator lives in ``schemas.py``).

Same conventions as :mod:`raftlog.protocol.schemas`: snake_case of Kafka's message JSON names,
only the fields of the versions implemented here (the ranges of kafka-compatibility.md §2.3),
cross-checked against ``shared/kafka-protocol/message`` by ``tests/unit/test_schemas.py``.

The listener's lookup table, ``api_table.APIS_BY_KEY``, includes these APIs.
"""

from __future__ import annotations

from raftlog.protocol.codec import Api
from raftlog.protocol.codec import Field as F

JOIN_GROUP = Api(
    key=11,
    name="JoinGroup",
    min_version=0,
    max_version=5,
    flexible="6+",
    request=[
        F("group_id", "string"),
        F("session_timeout_ms", "int32"),
        F("rebalance_timeout_ms", "int32", "1+", default=-1),
        F("member_id", "string"),
        F("group_instance_id", "string", "5+", nullable="5+"),
        F("protocol_type", "string"),
        F("protocols", [F("name", "string"), F("metadata", "bytes")]),
    ],
    response=[
        F("throttle_time_ms", "int32", "2+"),
        F("error_code", "int16"),
        F("generation_id", "int32", default=-1),
        F("protocol_name", "string"),
        F("leader", "string"),
        F("member_id", "string"),
        F(
            "members",
            [
                F("member_id", "string"),
                F("group_instance_id", "string", "5+", nullable="5+"),
                F("metadata", "bytes"),
            ],
        ),
    ],
)

SYNC_GROUP = Api(
    key=14,
    name="SyncGroup",
    min_version=0,
    max_version=3,
    flexible="4+",
    request=[
        F("group_id", "string"),
        F("generation_id", "int32"),
        F("member_id", "string"),
        F("group_instance_id", "string", "3+", nullable="3+"),
        F("assignments", [F("member_id", "string"), F("assignment", "bytes")]),
    ],
    response=[
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16"),
        F("assignment", "bytes"),
    ],
)

HEARTBEAT = Api(
    key=12,
    name="Heartbeat",
    min_version=0,
    max_version=3,
    flexible="4+",
    request=[
        F("group_id", "string"),
        F("generation_id", "int32"),
        F("member_id", "string"),
        F("group_instance_id", "string", "3+", nullable="3+"),
    ],
    response=[F("throttle_time_ms", "int32", "1+"), F("error_code", "int16")],
)

LEAVE_GROUP = Api(
    key=13,
    name="LeaveGroup",
    min_version=0,
    max_version=3,
    flexible="4+",
    request=[
        F("group_id", "string"),
        F("member_id", "string", "0-2"),
        F(
            "members",
            [
                F("member_id", "string", "3+"),
                F("group_instance_id", "string", "3+", nullable="3+"),
            ],
            "3+",
        ),
    ],
    response=[
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16"),
        F(
            "members",
            [
                F("member_id", "string", "3+"),
                F("group_instance_id", "string", "3+", nullable="3+"),
                F("error_code", "int16", "3+"),
            ],
            "3+",
        ),
    ],
)

OFFSET_COMMIT = Api(
    key=8,
    name="OffsetCommit",
    min_version=0,
    max_version=7,
    flexible="8+",
    request=[
        F("group_id", "string"),
        F("generation_id_or_member_epoch", "int32", "1+", default=-1),
        F("member_id", "string", "1+"),
        F("group_instance_id", "string", "7+", nullable="7+"),
        F("retention_time_ms", "int64", "2-4", default=-1),
        F(
            "topics",
            [
                F("name", "string"),
                F(
                    "partitions",
                    [
                        F("partition_index", "int32"),
                        F("committed_offset", "int64"),
                        F("committed_leader_epoch", "int32", "6+", default=-1),
                        F("commit_timestamp", "int64", "1", default=-1),
                        F("committed_metadata", "string", nullable="0+"),
                    ],
                ),
            ],
        ),
    ],
    response=[
        F("throttle_time_ms", "int32", "3+"),
        F(
            "topics",
            [
                F("name", "string"),
                F("partitions", [F("partition_index", "int32"), F("error_code", "int16")]),
            ],
        ),
    ],
)

OFFSET_FETCH = Api(
    key=9,
    name="OffsetFetch",
    min_version=1,
    max_version=7,
    flexible="6+",
    request=[
        F("group_id", "string"),
        F(
            "topics",
            [F("name", "string"), F("partition_indexes", "[]int32")],
            nullable="2+",
        ),
        F("require_stable", "bool", "7+", default=False),
    ],
    response=[
        F("throttle_time_ms", "int32", "3+"),
        F(
            "topics",
            [
                F("name", "string"),
                F(
                    "partitions",
                    [
                        F("partition_index", "int32"),
                        F("committed_offset", "int64"),
                        F("committed_leader_epoch", "int32", "5+", default=-1),
                        F("metadata", "string", nullable="0+"),
                        F("error_code", "int16"),
                    ],
                ),
            ],
        ),
        F("error_code", "int16", "2+", default=0),
    ],
)

DESCRIBE_GROUPS = Api(
    key=15,
    name="DescribeGroups",
    min_version=0,
    max_version=4,
    flexible="5+",
    request=[
        F("groups", "[]string"),
        F("include_authorized_operations", "bool", "3+", default=False),
    ],
    response=[
        F("throttle_time_ms", "int32", "1+"),
        F(
            "groups",
            [
                F("error_code", "int16"),
                F("group_id", "string"),
                F("group_state", "string"),
                F("protocol_type", "string"),
                F("protocol_data", "string"),
                F(
                    "members",
                    [
                        F("member_id", "string"),
                        F("group_instance_id", "string", "4+", nullable="4+"),
                        F("client_id", "string"),
                        F("client_host", "string"),
                        F("member_metadata", "bytes"),
                        F("member_assignment", "bytes"),
                    ],
                ),
                F("authorized_operations", "int32", "3+", default=-(2**31)),
            ],
        ),
    ],
)

LIST_GROUPS = Api(
    key=16,
    name="ListGroups",
    min_version=0,
    max_version=2,
    flexible="3+",
    request=[],
    response=[
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16"),
        F("groups", [F("group_id", "string"), F("protocol_type", "string")]),
    ],
)

DELETE_GROUPS = Api(
    key=42,
    name="DeleteGroups",
    min_version=0,
    max_version=1,
    flexible="2+",
    request=[F("groups_names", "[]string")],
    response=[
        F("throttle_time_ms", "int32"),
        F("results", [F("group_id", "string"), F("error_code", "int16")]),
    ],
)

GROUP_APIS: tuple[Api, ...] = (
    JOIN_GROUP,
    SYNC_GROUP,
    HEARTBEAT,
    LEAVE_GROUP,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    DESCRIBE_GROUPS,
    LIST_GROUPS,
    DELETE_GROUPS,
)
