"""Static registration of the `raftlog` PySpark data source.

PySpark 4.x scans the Python path of its workers for top-level modules named `pyspark_*`
(`pyspark/sql/worker/lookup_data_sources.py`: `pkgutil.iter_modules()`) on the first
data-source lookup of a session, and registers each one's `DefaultSource` under its `name()`.
That makes `spark.readStream.format("raftlog")` work with no `spark.dataSource.register()`
call, as long as this module is importable by the Python that runs Spark's workers
(PYSPARK_PYTHON).
"""

from spark_connector.source import RaftLogDataSource as DefaultSource

__all__ = ["DefaultSource"]
