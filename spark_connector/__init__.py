"""PySpark Structured Streaming connector for raftlog (Spark's Kafka source and sink options).

`spark.read[Stream].format("raftlog")` works without a registration call: the top-level module
`pyspark_raftlog` exposes `DefaultSource`, which PySpark finds on the first data-source lookup.
See spark_connector/README.md.
"""

from spark_connector.source import RaftLogDataSource

__all__ = ["RaftLogDataSource"]
