"""Declarative schemas of the Kafka APIs this broker serves, per version range.

Field names are the snake_case of the names in Kafka's message JSON and version strings use
its notation; ``tests/unit/test_schemas.py`` cross-checks every implemented version against
``../shared/kafka-protocol/message/*.json`` when that directory is present. Only fields that
exist in the versions implemented here are declared.
"""

from __future__ import annotations

from raftlog.protocol.codec import Api
from raftlog.protocol.codec import Field as F

API_VERSIONS = Api(
    key=18,
    name="ApiVersions",
    min_version=0,
    max_version=3,
    flexible="3+",
    request=[
        F("client_software_name", "string", "3+"),
        F("client_software_version", "string", "3+"),
    ],
    response=[
        F("error_code", "int16"),
        F(
            "api_keys",
            [F("api_key", "int16"), F("min_version", "int16"), F("max_version", "int16")],
        ),
        F("throttle_time_ms", "int32", "1+"),
        F(
            "supported_features",
            [
                F("name", "string", "3+"),
                F("min_version", "int16", "3+"),
                F("max_version", "int16", "3+"),
            ],
            "3+",
            tag=0,
            tagged="3+",
        ),
        F("finalized_features_epoch", "int64", "3+", tag=1, tagged="3+", default=-1),
        F(
            "finalized_features",
            [
                F("name", "string", "3+"),
                F("max_version_level", "int16", "3+"),
                F("min_version_level", "int16", "3+"),
            ],
            "3+",
            tag=2,
            tagged="3+",
        ),
        F("zk_migration_ready", "bool", "3+", tag=3, tagged="3+", default=False),
    ],
)

METADATA = Api(
    key=3,
    name="Metadata",
    min_version=0,
    max_version=12,
    flexible="9+",
    request=[
        F("topics", [F("topic_id", "uuid", "10+"), F("name", "string", nullable="10+")],
          nullable="1+"),
        F("allow_auto_topic_creation", "bool", "4+", default=True),
        F("include_cluster_authorized_operations", "bool", "8-10"),
        F("include_topic_authorized_operations", "bool", "8+"),
    ],
    response=[
        F("throttle_time_ms", "int32", "3+"),
        F(
            "brokers",
            [
                F("node_id", "int32"),
                F("host", "string"),
                F("port", "int32"),
                F("rack", "string", "1+", nullable="1+"),
            ],
        ),
        F("cluster_id", "string", "2+", nullable="2+"),
        F("controller_id", "int32", "1+", default=-1),
        F(
            "topics",
            [
                F("error_code", "int16"),
                F("name", "string", nullable="12+"),
                F("topic_id", "uuid", "10+"),
                F("is_internal", "bool", "1+", default=False),
                F(
                    "partitions",
                    [
                        F("error_code", "int16"),
                        F("partition_index", "int32"),
                        F("leader_id", "int32"),
                        F("leader_epoch", "int32", "7+", default=-1),
                        F("replica_nodes", "[]int32"),
                        F("isr_nodes", "[]int32"),
                        F("offline_replicas", "[]int32", "5+"),
                    ],
                ),
                F("topic_authorized_operations", "int32", "8+", default=-(2**31)),
            ],
        ),
        F("cluster_authorized_operations", "int32", "8-10", default=-(2**31)),
    ],
)

PRODUCE = Api(
    key=0,
    name="Produce",
    min_version=0,
    max_version=8,
    flexible="9+",
    rejected=frozenset({0, 1, 2}),
    request=[
        F("transactional_id", "string", "3+", nullable="3+"),
        F("acks", "int16"),
        F("timeout_ms", "int32"),
        F(
            "topic_data",
            [
                F("name", "string"),
                F(
                    "partition_data",
                    [F("index", "int32"), F("records", "records", nullable="0+")],
                ),
            ],
        ),
    ],
    response=[
        F(
            "responses",
            [
                F("name", "string"),
                F(
                    "partition_responses",
                    [
                        F("index", "int32"),
                        F("error_code", "int16"),
                        F("base_offset", "int64"),
                        F("log_append_time_ms", "int64", "2+", default=-1),
                        F("log_start_offset", "int64", "5+", default=-1),
                        F(
                            "record_errors",
                            [
                                F("batch_index", "int32", "8+"),
                                F("batch_index_error_message", "string", "8+", nullable="8+"),
                            ],
                            "8+",
                        ),
                        F("error_message", "string", "8+", nullable="8+"),
                    ],
                ),
            ],
        ),
        F("throttle_time_ms", "int32", "1+", default=0),
    ],
)

FETCH = Api(
    key=1,
    name="Fetch",
    min_version=4,
    max_version=11,
    flexible="12+",
    request=[
        F("replica_id", "int32", "0-14", default=-1),
        F("max_wait_ms", "int32"),
        F("min_bytes", "int32"),
        F("max_bytes", "int32", "3+", default=0x7FFFFFFF),
        F("isolation_level", "int8", "4+", default=0),
        F("session_id", "int32", "7+", default=0),
        F("session_epoch", "int32", "7+", default=-1),
        F(
            "topics",
            [
                F("topic", "string", "0-12"),
                F(
                    "partitions",
                    [
                        F("partition", "int32"),
                        F("current_leader_epoch", "int32", "9+", default=-1),
                        F("fetch_offset", "int64"),
                        F("log_start_offset", "int64", "5+", default=-1),
                        F("partition_max_bytes", "int32"),
                    ],
                ),
            ],
        ),
        F(
            "forgotten_topics_data",
            [F("topic", "string", "7-12"), F("partitions", "[]int32", "7+")],
            "7+",
        ),
        F("rack_id", "string", "11+", default=""),
    ],
    response=[
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16", "7+"),
        F("session_id", "int32", "7+", default=0),
        F(
            "responses",
            [
                F("topic", "string", "0-12"),
                F(
                    "partitions",
                    [
                        F("partition_index", "int32"),
                        F("error_code", "int16"),
                        F("high_watermark", "int64"),
                        F("last_stable_offset", "int64", "4+", default=-1),
                        F("log_start_offset", "int64", "5+", default=-1),
                        F(
                            "aborted_transactions",
                            [F("producer_id", "int64", "4+"), F("first_offset", "int64", "4+")],
                            "4+",
                            nullable="4+",
                        ),
                        F("preferred_read_replica", "int32", "11+", default=-1),
                        F("records", "records", nullable="0+"),
                    ],
                ),
            ],
        ),
    ],
)

LIST_OFFSETS = Api(
    key=2,
    name="ListOffsets",
    min_version=1,
    max_version=7,  # v6 is the flexible encoding, v7 adds timestamp -3 (KIP-734); same fields
    flexible="6+",
    request=[
        F("replica_id", "int32"),
        F("isolation_level", "int8", "2+"),
        F(
            "topics",
            [
                F("name", "string"),
                F(
                    "partitions",
                    [
                        F("partition_index", "int32"),
                        F("current_leader_epoch", "int32", "4+", default=-1),
                        F("timestamp", "int64"),
                        F("max_num_offsets", "int32", "0", default=1),
                    ],
                ),
            ],
        ),
    ],
    response=[
        F("throttle_time_ms", "int32", "2+"),
        F(
            "topics",
            [
                F("name", "string"),
                F(
                    "partitions",
                    [
                        F("partition_index", "int32"),
                        F("error_code", "int16"),
                        F("old_style_offsets", "[]int64", "0"),
                        F("timestamp", "int64", "1+", default=-1),
                        F("offset", "int64", "1+", default=-1),
                        F("leader_epoch", "int32", "4+", default=-1),
                    ],
                ),
            ],
        ),
    ],
)

CREATE_TOPICS = Api(
    key=19,
    name="CreateTopics",
    min_version=0,
    max_version=4,
    flexible="5+",
    request=[
        F(
            "topics",
            [
                F("name", "string"),
                F("num_partitions", "int32"),
                F("replication_factor", "int16"),
                F("assignments", [F("partition_index", "int32"), F("broker_ids", "[]int32")]),
                F("configs", [F("name", "string"), F("value", "string", nullable="0+")]),
            ],
        ),
        F("timeout_ms", "int32", default=60000),
        F("validate_only", "bool", "1+", default=False),
    ],
    response=[
        F("throttle_time_ms", "int32", "2+"),
        F(
            "topics",
            [
                F("name", "string"),
                F("error_code", "int16"),
                F("error_message", "string", "1+", nullable="0+"),
            ],
        ),
    ],
)

DELETE_TOPICS = Api(
    key=20,
    name="DeleteTopics",
    min_version=0,
    max_version=3,
    flexible="4+",
    request=[
        F("topic_names", "[]string", "0-5"),
        F("timeout_ms", "int32"),
    ],
    response=[
        F("throttle_time_ms", "int32", "1+"),
        F("responses", [F("name", "string"), F("error_code", "int16")]),
    ],
)

CREATE_PARTITIONS = Api(
    key=37,
    name="CreatePartitions",
    min_version=0,
    max_version=1,
    flexible="2+",
    request=[
        F(
            "topics",
            [
                F("name", "string"),
                F("count", "int32"),
                F("assignments", [F("broker_ids", "[]int32")], nullable="0+"),
            ],
        ),
        F("timeout_ms", "int32"),
        F("validate_only", "bool"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F(
            "results",
            [
                F("name", "string"),
                F("error_code", "int16"),
                F("error_message", "string", nullable="0+"),
            ],
        ),
    ],
)

DESCRIBE_CONFIGS = Api(
    key=32,
    name="DescribeConfigs",
    min_version=0,
    max_version=2,
    flexible="4+",
    request=[
        F(
            "resources",
            [
                F("resource_type", "int8"),
                F("resource_name", "string"),
                F("configuration_keys", "[]string", nullable="0+"),
            ],
        ),
        F("include_synonyms", "bool", "1+", default=False),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F(
            "results",
            [
                F("error_code", "int16"),
                F("error_message", "string", nullable="0+"),
                F("resource_type", "int8"),
                F("resource_name", "string"),
                F(
                    "configs",
                    [
                        F("name", "string"),
                        F("value", "string", nullable="0+"),
                        F("read_only", "bool"),
                        F("is_default", "bool", "0"),
                        F("config_source", "int8", "1+", default=-1),
                        F("is_sensitive", "bool"),
                        F(
                            "synonyms",
                            [
                                F("name", "string", "1+"),
                                F("value", "string", "1+", nullable="0+"),
                                F("source", "int8", "1+"),
                            ],
                            "1+",
                        ),
                    ],
                ),
            ],
        ),
    ],
)

OFFSET_FOR_LEADER_EPOCH = Api(
    key=23,
    name="OffsetForLeaderEpoch",
    min_version=2,
    max_version=3,
    flexible="4+",
    request=[
        F("replica_id", "int32", "3+", default=-2),
        F(
            "topics",
            [
                F("topic", "string"),
                F(
                    "partitions",
                    [
                        F("partition", "int32"),
                        F("current_leader_epoch", "int32", "2+", default=-1),
                        F("leader_epoch", "int32"),
                    ],
                ),
            ],
        ),
    ],
    response=[
        F("throttle_time_ms", "int32", "2+"),
        F(
            "topics",
            [
                F("topic", "string"),
                F(
                    "partitions",
                    [
                        F("error_code", "int16"),
                        F("partition", "int32"),
                        F("leader_epoch", "int32", "1+", default=-1),
                        F("end_offset", "int64", default=-1),
                    ],
                ),
            ],
        ),
    ],
)

INIT_PRODUCER_ID = Api(
    key=22,
    name="InitProducerId",
    min_version=0,
    max_version=4,
    flexible="2+",
    request=[
        F("transactional_id", "string", nullable="0+"),
        F("transaction_timeout_ms", "int32"),
        F("producer_id", "int64", "3+", default=-1),
        F("producer_epoch", "int16", "3+", default=-1),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("producer_id", "int64", default=-1),
        F("producer_epoch", "int16"),
    ],
)

FIND_COORDINATOR = Api(
    key=10,
    name="FindCoordinator",
    min_version=0,
    max_version=2,
    flexible="3+",
    request=[
        F("key", "string", "0-3"),
        F("key_type", "int8", "1+", default=0),
    ],
    response=[
        F("throttle_time_ms", "int32", "1+"),
        F("error_code", "int16", "0-3"),
        F("error_message", "string", "1-3", nullable="1-3"),
        F("node_id", "int32", "0-3"),
        F("host", "string", "0-3"),
        F("port", "int32", "0-3"),
    ],
)

# -- Broker-to-controller APIs (KRaft's own), served on the Kafka listener, not advertised ------

BROKER_REGISTRATION = Api(
    key=62,
    name="BrokerRegistration",
    min_version=0,
    max_version=0,
    flexible="0+",
    internal=True,
    request=[
        F("broker_id", "int32"),
        F("cluster_id", "string"),
        F("incarnation_id", "uuid"),
        F(
            "listeners",
            [
                F("name", "string"),
                F("host", "string"),
                F("port", "uint16"),
                F("security_protocol", "int16"),
            ],
        ),
        F(
            "features",
            [
                F("name", "string"),
                F("min_supported_version", "int16"),
                F("max_supported_version", "int16"),
            ],
        ),
        F("rack", "string", nullable="0+"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("broker_epoch", "int64", default=-1),
    ],
)

BROKER_HEARTBEAT = Api(
    key=63,
    name="BrokerHeartbeat",
    min_version=0,
    max_version=0,
    flexible="0+",
    internal=True,
    request=[
        F("broker_id", "int32"),
        F("broker_epoch", "int64", default=-1),
        F("current_metadata_offset", "int64"),
        F("want_fence", "bool"),
        F("want_shut_down", "bool"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("is_caught_up", "bool", default=False),
        F("is_fenced", "bool", default=True),
        F("should_shut_down", "bool"),
    ],
)

ALTER_PARTITION = Api(
    key=56,
    name="AlterPartition",
    min_version=0,
    max_version=1,
    flexible="0+",
    internal=True,
    request=[
        F("broker_id", "int32"),
        F("broker_epoch", "int64", default=-1),
        F(
            "topics",
            [
                F("topic_name", "string", "0-1"),
                F(
                    "partitions",
                    [
                        F("partition_index", "int32"),
                        F("leader_epoch", "int32"),
                        F("new_isr", "[]int32", "0-2"),
                        F("leader_recovery_state", "int8", "1+", default=0),
                        F("partition_epoch", "int32"),
                    ],
                ),
            ],
        ),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F(
            "topics",
            [
                F("topic_name", "string", "0-1"),
                F(
                    "partitions",
                    [
                        F("partition_index", "int32"),
                        F("error_code", "int16"),
                        F("leader_id", "int32"),
                        F("leader_epoch", "int32"),
                        F("isr", "[]int32"),
                        F("leader_recovery_state", "int8", "1+", default=0),
                        F("partition_epoch", "int32"),
                    ],
                ),
            ],
        ),
    ],
)

ALLOCATE_PRODUCER_IDS = Api(
    key=67,
    name="AllocateProducerIds",
    min_version=0,
    max_version=0,
    flexible="0+",
    internal=True,
    request=[F("broker_id", "int32"), F("broker_epoch", "int64", default=-1)],
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("producer_id_start", "int64"),
        F("producer_id_len", "int32"),
    ],
)

# KIP-590: a broker that is not the controller forwards an admin request (AlterConfigs,
# IncrementalAlterConfigs, auto-creation's CreateTopics) wrapped in an Envelope; only an
# Envelope counts as forwarded, and the controller never forwards one again.
ENVELOPE = Api(
    key=58,
    name="Envelope",
    min_version=0,
    max_version=0,
    flexible="0+",
    internal=True,
    request=[
        F("request_data", "bytes"),  # the embedded request header and body
        F("request_principal", "bytes", nullable="0+"),
        F("client_host_address", "bytes"),  # the original client's IP address bytes
    ],
    response=[
        F("response_data", "bytes", nullable="0+", default=None),  # header and body
        F("error_code", "int16"),
    ],
)

_REPLICA_STATE = [
    F("replica_id", "int32"),
    F("log_end_offset", "int64"),
    F("last_fetch_timestamp", "int64", "1+", default=-1),
    F("last_caught_up_timestamp", "int64", "1+", default=-1),
]

DESCRIBE_QUORUM = Api(
    key=55,
    name="DescribeQuorum",
    min_version=0,
    max_version=1,
    flexible="0+",
    internal=True,
    request=[
        F("topics", [F("topic_name", "string"), F("partitions", [F("partition_index", "int32")])])
    ],
    response=[
        F("error_code", "int16"),
        F(
            "topics",
            [
                F("topic_name", "string"),
                F(
                    "partitions",
                    [
                        F("partition_index", "int32"),
                        F("error_code", "int16"),
                        F("leader_id", "int32"),
                        F("leader_epoch", "int32"),
                        F("high_watermark", "int64"),
                        F("current_voters", list(_REPLICA_STATE)),
                        F("observers", list(_REPLICA_STATE)),
                    ],
                ),
            ],
        ),
    ],
)

# AlterConfigs (33) and IncrementalAlterConfigs (44): same shape; the incremental one names an
# operation per key (SET 0, DELETE 1, APPEND 2, SUBTRACT 3). Served by
# raftlog.broker.controller_apis (forwarded to the controller from any node).
# IncrementalAlterConfigs v1 is its flexible version.
_ALTER_CONFIGS_RESPONSE = [
    F("throttle_time_ms", "int32"),
    F(
        "responses",
        [
            F("error_code", "int16"),
            F("error_message", "string", nullable="0+"),
            F("resource_type", "int8"),
            F("resource_name", "string"),
        ],
    ),
]

ALTER_CONFIGS = Api(
    key=33,
    name="AlterConfigs",
    min_version=0,
    max_version=2,
    flexible="2+",
    request=[
        F(
            "resources",
            [
                F("resource_type", "int8"),
                F("resource_name", "string"),
                F("configs", [F("name", "string"), F("value", "string", nullable="0+")]),
            ],
        ),
        F("validate_only", "bool"),
    ],
    response=list(_ALTER_CONFIGS_RESPONSE),
)

INCREMENTAL_ALTER_CONFIGS = Api(
    key=44,
    name="IncrementalAlterConfigs",
    min_version=0,
    max_version=1,
    flexible="1+",
    request=[
        F(
            "resources",
            [
                F("resource_type", "int8"),
                F("resource_name", "string"),
                F(
                    "configs",
                    [
                        F("name", "string"),
                        F("config_operation", "int8"),
                        F("value", "string", nullable="0+"),
                    ],
                ),
            ],
        ),
        F("validate_only", "bool"),
    ],
    response=list(_ALTER_CONFIGS_RESPONSE),
)

# DeleteRecords (21): advance partitions' log start offsets (kafka-delete-records.sh,
# AdminClient.delete_records). Served by the partition leader (DeleteRecordsApis.delete_records).
DELETE_RECORDS = Api(
    key=21,
    name="DeleteRecords",
    min_version=0,
    max_version=2,
    flexible="2+",
    request=[
        F(
            "topics",
            [
                F("name", "string"),
                F("partitions", [F("partition_index", "int32"), F("offset", "int64")]),
            ],
        ),
        F("timeout_ms", "int32"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F(
            "topics",
            [
                F("name", "string"),
                F(
                    "partitions",
                    [
                        F("partition_index", "int32"),
                        F("low_watermark", "int64"),
                        F("error_code", "int16"),
                    ],
                ),
            ],
        ),
    ],
)

ALL_APIS: tuple[Api, ...] = (
    PRODUCE,
    FETCH,
    LIST_OFFSETS,
    METADATA,
    API_VERSIONS,
    CREATE_TOPICS,
    DELETE_TOPICS,
    DESCRIBE_CONFIGS,
    CREATE_PARTITIONS,
    OFFSET_FOR_LEADER_EPOCH,
    INIT_PRODUCER_ID,
    FIND_COORDINATOR,
    BROKER_REGISTRATION,
    BROKER_HEARTBEAT,
    ALTER_PARTITION,
    ALLOCATE_PRODUCER_IDS,
    ENVELOPE,
    DESCRIBE_QUORUM,
    ALTER_CONFIGS,
    INCREMENTAL_ALTER_CONFIGS,
    DELETE_RECORDS,
)
