"""Schemas of the transaction APIs (KIP-98, KIP-447, KIP-664), same conventions as
``schemas.py``: snake_case of Kafka's message JSON, cross-checked by
``tests/unit/test_schemas.py``.

Ranges follow ``shared/reference/kafka-compatibility.md`` §2.3: AddPartitionsToTxn 0-3 for
clients; v4 (the broker-to-broker batched form with VerifyOnly, KIP-890 part 1) is decoded and
served for partition leaders but never advertised (``raftlog.txn.apis.install`` caps the
advertised range at 3), AddOffsetsToTxn 0-3, EndTxn 0-3 (never 5, KIP-890
part 2), TxnOffsetCommit 0-3; the operator APIs DescribeProducers 0, DescribeTransactions 0,
ListTransactions 0-1. WriteTxnMarkers is internal (coordinator -> partition leaders),
served but not advertised.
"""

from __future__ import annotations

from raftlog.protocol.codec import Api
from raftlog.protocol.codec import Field as F

_TOPIC_PARTITIONS = [F("name", "string"), F("partitions", "[]int32")]
_TOPIC_RESULTS = [
    F("name", "string"),
    F("results_by_partition", [F("partition_index", "int32"), F("partition_error_code", "int16")]),
]

ADD_PARTITIONS_TO_TXN = Api(
    key=24,
    name="AddPartitionsToTxn",
    min_version=0,
    max_version=4,
    flexible="3+",
    request=[
        F(
            "transactions",
            [
                F("transactional_id", "string"),
                F("producer_id", "int64"),
                F("producer_epoch", "int16"),
                F("verify_only", "bool", default=False),
                F("topics", _TOPIC_PARTITIONS),
            ],
            "4+",
        ),
        F("v3_and_below_transactional_id", "string", "0-3"),
        F("v3_and_below_producer_id", "int64", "0-3"),
        F("v3_and_below_producer_epoch", "int16", "0-3"),
        F("v3_and_below_topics", _TOPIC_PARTITIONS, "0-3"),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16", "4+"),
        F(
            "results_by_transaction",
            [F("transactional_id", "string"), F("topic_results", _TOPIC_RESULTS)],
            "4+",
        ),
        F("results_by_topic_v3_and_below", _TOPIC_RESULTS, "0-3"),
    ],
    advertised_max_version=3,  # v4+ (verify_only, KIP-890) is broker-to-broker only
)

ADD_OFFSETS_TO_TXN = Api(
    key=25,
    name="AddOffsetsToTxn",
    min_version=0,
    max_version=3,
    flexible="3+",
    request=[
        F("transactional_id", "string"),
        F("producer_id", "int64"),
        F("producer_epoch", "int16"),
        F("group_id", "string"),
    ],
    response=[F("throttle_time_ms", "int32"), F("error_code", "int16")],
)

END_TXN = Api(
    key=26,
    name="EndTxn",
    min_version=0,
    max_version=3,
    flexible="3+",
    request=[
        F("transactional_id", "string"),
        F("producer_id", "int64"),
        F("producer_epoch", "int16"),
        F("committed", "bool"),
    ],
    response=[F("throttle_time_ms", "int32"), F("error_code", "int16")],
)

WRITE_TXN_MARKERS = Api(
    key=27,
    name="WriteTxnMarkers",
    min_version=0,
    max_version=1,
    flexible="1+",
    internal=True,
    request=[
        F(
            "markers",
            [
                F("producer_id", "int64"),
                F("producer_epoch", "int16"),
                F("transaction_result", "bool"),
                F("topics", [F("name", "string"), F("partition_indexes", "[]int32")]),
                F("coordinator_epoch", "int32"),
            ],
        ),
    ],
    response=[
        F(
            "markers",
            [
                F("producer_id", "int64"),
                F(
                    "topics",
                    [
                        F("name", "string"),
                        F("partitions",
                          [F("partition_index", "int32"), F("error_code", "int16")]),
                    ],
                ),
            ],
        ),
    ],
)

TXN_OFFSET_COMMIT = Api(
    key=28,
    name="TxnOffsetCommit",
    min_version=0,
    max_version=3,
    flexible="3+",
    request=[
        F("transactional_id", "string"),
        F("group_id", "string"),
        F("producer_id", "int64"),
        F("producer_epoch", "int16"),
        F("generation_id", "int32", "3+", default=-1),
        F("member_id", "string", "3+", default=""),
        F("group_instance_id", "string", "3+", nullable="3+"),
        F(
            "topics",
            [
                F("name", "string"),
                F(
                    "partitions",
                    [
                        F("partition_index", "int32"),
                        F("committed_offset", "int64"),
                        F("committed_leader_epoch", "int32", "2+", default=-1),
                        F("committed_metadata", "string", nullable="0+"),
                    ],
                ),
            ],
        ),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F(
            "topics",
            [
                F("name", "string"),
                F("partitions", [F("partition_index", "int32"), F("error_code", "int16")]),
            ],
        ),
    ],
)

DESCRIBE_PRODUCERS = Api(
    key=61,
    name="DescribeProducers",
    min_version=0,
    max_version=0,
    flexible="0+",
    request=[F("topics", [F("name", "string"), F("partition_indexes", "[]int32")])],
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
                        F("error_code", "int16"),
                        F("error_message", "string", nullable="0+"),
                        F(
                            "active_producers",
                            [
                                F("producer_id", "int64"),
                                F("producer_epoch", "int32"),
                                F("last_sequence", "int32", default=-1),
                                F("last_timestamp", "int64", default=-1),
                                F("coordinator_epoch", "int32"),
                                F("current_txn_start_offset", "int64", default=-1),
                            ],
                        ),
                    ],
                ),
            ],
        ),
    ],
)

DESCRIBE_TRANSACTIONS = Api(
    key=65,
    name="DescribeTransactions",
    min_version=0,
    max_version=0,
    flexible="0+",
    request=[F("transactional_ids", "[]string")],
    response=[
        F("throttle_time_ms", "int32"),
        F(
            "transaction_states",
            [
                F("error_code", "int16"),
                F("transactional_id", "string"),
                F("transaction_state", "string"),
                F("transaction_timeout_ms", "int32"),
                F("transaction_start_time_ms", "int64"),
                F("producer_id", "int64"),
                F("producer_epoch", "int16"),
                F("topics", [F("topic", "string"), F("partitions", "[]int32")]),
            ],
        ),
    ],
)

LIST_TRANSACTIONS = Api(
    key=66,
    name="ListTransactions",
    min_version=0,
    max_version=1,
    flexible="0+",
    request=[
        F("state_filters", "[]string"),
        F("producer_id_filters", "[]int64"),
        F("duration_filter", "int64", "1+", default=-1),
    ],
    response=[
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("unknown_state_filters", "[]string"),
        F(
            "transaction_states",
            [
                F("transactional_id", "string"),
                F("producer_id", "int64"),
                F("transaction_state", "string"),
            ],
        ),
    ],
)

TXN_APIS: tuple[Api, ...] = (
    ADD_PARTITIONS_TO_TXN,
    ADD_OFFSETS_TO_TXN,
    END_TXN,
    WRITE_TXN_MARKERS,
    TXN_OFFSET_COMMIT,
    DESCRIBE_PRODUCERS,
    DESCRIBE_TRANSACTIONS,
    LIST_TRANSACTIONS,
)
