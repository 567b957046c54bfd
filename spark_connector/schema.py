"""The fixed schemas: Spark's Kafka source columns, and what the sink accepts."""

from __future__ import annotations

from functools import cache

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()),
                                     StructField("value", BinaryType())]))


@cache
def source_schema(include_headers: bool) -> StructType:
    """Spark's Kafka source schema; `headers` only with includeHeaders=true, as in Spark."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", HEADERS_TYPE))
    return StructType(fields)


@cache
def source_arrow_schema(include_headers: bool) -> pa.Schema:
    """Exactly what Spark checks a returned RecordBatch against (pitfall 11 in the reference:
    int32 for INT, int64 for LONG, timestamp[us, tz=UTC] for TIMESTAMP)."""
    return to_arrow_schema(source_schema(include_headers), timezone="UTC")


# Sink columns: name -> accepted Spark types (as Spark's Kafka sink).
SINK_COLUMNS: dict[str, tuple[DataType, ...]] = {
    "key": (StringType(), BinaryType()),
    "value": (StringType(), BinaryType()),
    "topic": (StringType(),),
    "partition": (IntegerType(),),
    "headers": (HEADERS_TYPE,),
}
