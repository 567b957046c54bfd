"""The `raftlog` data source: Spark's Kafka source and sink, over confluent-kafka.

Where things run (see /work/shared/reference/spark-python-datasource.md, section 4):

- `RaftLogDataSource.schema()` runs on the driver at `load()`: it validates every option and
  checks that the cluster answers and the subscribed topics exist, so bad input fails before
  a query starts.
- `RaftLogBatchReader.partitions()` runs on the driver at planning; the stream reader's offset
  methods run in one long-lived driver-side Python process per query run.
- `read()` runs on executors, on *another*, pickled instance of the reader: it uses only the
  frozen settings and the `OffsetRange` it is given, and opens its own consumer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

import spark_connector.offsets as off
from spark_connector.cluster import Cluster
from spark_connector.errors import RaftLogDataLossError, RaftLogOptionError
from spark_connector.options import (
    EARLIEST,
    LATEST,
    OffsetBound,
    SourceOptions,
    TopicPartition,
    check_batch_read,
    check_stream_read,
    parse_sink_options,
    parse_source_options,
)
from spark_connector.read import ReadSettings, read_range
from spark_connector.schema import source_schema
from spark_connector.sink import (
    RaftLogBatchWriter,
    RaftLogStreamWriter,
    check_sink_schema,
    check_stream_sink,
)

log = logging.getLogger("spark_connector")


class RaftLogDataSource(DataSource):
    """`spark.read[Stream].format("raftlog")` and `df.write[Stream].format("raftlog")`."""

    @classmethod
    def name(cls) -> str:
        return "raftlog"

    def schema(self) -> StructType:
        # Called on the driver by load() (not for writes): the earliest point to reject bad
        # options, an unreachable cluster or a missing topic.
        source = parse_source_options(self.options)
        with _cluster(source) as cluster:
            cluster.partitions(source.subscription, strict=True, fail_fast=True)
        return source_schema(source.include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        source = parse_source_options(self.options)
        check_batch_read(source)
        _check_schema(schema, source)
        return RaftLogBatchReader(source)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        source = parse_source_options(self.options)
        check_stream_read(source)
        _check_schema(schema, source)
        return RaftLogStreamReader(source)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        sink = parse_sink_options(self.options)
        check_sink_schema(schema, sink, overwrite)
        sink.resolve_guarantee(streaming=False)  # exactly_once is refused for batch writes
        with Cluster(sink.client) as cluster:  # before any task runs: reachable? valid config?
            cluster.check_producer_config()
            cluster.topics(fail_fast=True)
        return RaftLogBatchWriter(sink, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        # Called twice per micro-batch (reference, section 4): options and schema only, no
        # network round trip; the executors report an unreachable cluster by its address.
        sink = parse_sink_options(self.options)
        check_sink_schema(schema, sink, overwrite)
        check_stream_sink(sink)
        return RaftLogStreamWriter(sink, schema)


def _cluster(source: SourceOptions) -> Cluster:
    return Cluster(source.client, source.isolation_level, source.group_id_prefix)


def _check_schema(schema: StructType, source: SourceOptions) -> None:
    expected = source_schema(source.include_headers)
    if schema is not None and schema != expected:
        raise RaftLogOptionError(
            "schema", "the raftlog source has a fixed schema and does not accept a"
            f" user-specified one: expected {expected.simpleString()}, got"
            f" {schema.simpleString()}")


# -- resolving bounds against the log ---------------------------------------------------------


def resolve_bound(cluster: Cluster, bound: OffsetBound, tps: list[TopicPartition], *,
                  is_start: bool, timestamp_strategy: str = "error") -> dict[TopicPartition, int]:
    """Concrete offsets for `tps` from earliest / latest / JSON offsets / timestamps."""
    if bound.kind == "earliest":
        return cluster.earliest(tps)
    if bound.kind == "latest":
        return cluster.latest(tps)
    if bound.kind in ("offsets", "timestamps"):
        given = bound.offset_map()
        if set(given) != set(tps):
            # Spark's rule: name every partition the subscription covers, and no other.
            missing, extra = sorted(set(tps) - set(given)), sorted(set(given) - set(tps))
            parts = []
            if missing:
                parts.append(f"missing {off.describe(missing)}")
            if extra:
                parts.append(f"not subscribed or not existing: {off.describe(extra)}")
            raise RaftLogOptionError(
                bound.option, "must give an offset for every subscribed partition and no"
                " other (-2 = earliest, -1 = latest): " + "; ".join(parts))
    if bound.kind == "offsets":
        given = bound.offset_map()
        result = dict(given)
        result.update(cluster.list_offsets({tp: v for tp, v in given.items()
                                            if v in (EARLIEST, LATEST)}))
        explicit = sorted(tp for tp, v in given.items() if v >= 0)
        for tp, until in cluster.latest(explicit).items():
            if given[tp] > until:
                raise RaftLogOptionError(
                    bound.option, f"offset {given[tp]} of {tp[0]}-{tp[1]} is beyond the end of"
                    f" its log ({until})")
        return result
    stamps = (bound.offset_map() if bound.kind == "timestamps"
              else {tp: bound.timestamp for tp in tps})
    found = cluster.list_offsets(stamps)
    missing = [tp for tp, offset in found.items() if offset < 0]
    if missing:
        if is_start and timestamp_strategy == "error":
            raise RaftLogOptionError(
                bound.option, f"no record at or after the timestamp in {off.describe(missing)};"
                " set 'startingOffsetsByTimestampStrategy' to 'latest' to start those"
                " partitions at their latest offset instead")
        found.update(cluster.latest(missing))  # Spark: no such record -> latest
    return found


def _read(settings: ReadSettings, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, off.OffsetRange):
        # Spark substitutes InputPartition(None) when partitions() returned [] (nothing to
        # read): yield nothing.
        return iter(())
    return read_range(settings, partition)


# -- batch ----------------------------------------------------------------------------------


class RaftLogBatchReader(DataSourceReader):
    """`spark.read`: one input partition per topic-partition, [start, end) resolved once."""

    def __init__(self, source: SourceOptions) -> None:
        self.source = source
        self.settings = ReadSettings.from_options(source)

    def partitions(self) -> list[InputPartition]:
        source = self.source
        with _cluster(source) as cluster:
            tps = cluster.partitions(source.subscription, strict=True)
            start_bound = source.starting or OffsetBound("startingOffsets", "earliest")
            end_bound = source.ending or OffsetBound("endingOffsets", "latest")
            start = resolve_bound(cluster, start_bound, tps, is_start=True,
                                  timestamp_strategy=source.timestamp_strategy)
            end = resolve_bound(cluster, end_bound, tps, is_start=False)
        bad = [tp for tp in tps if start[tp] > end[tp]]
        if bad:
            tp = bad[0]
            raise RaftLogOptionError(
                start_bound.option, f"{tp[0]}-{tp[1]} would start at offset {start[tp]}, after"
                f" its end {end[tp]} ({end_bound.option})")
        return list(off.ranges(start, end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.settings, partition)


# -- streaming ------------------------------------------------------------------------------


class RaftLogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream`. Offsets are canonical JSON maps (see spark_connector.offsets)."""

    def __init__(self, source: SourceOptions) -> None:
        self.source = source
        self.settings = ReadSettings.from_options(source)
        self._cluster: Cluster | None = None
        self._initial: off.OffsetJson | None = None
        self._target: dict[TopicPartition, int] | None = None  # Trigger.AvailableNow's end
        self._latest_seen: dict[TopicPartition, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The instance that runs read() is pickled at planning: ship no client, no state.
        state = dict(self.__dict__)
        state["_cluster"] = None
        return state

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            self._cluster = _cluster(self.source)
        return self._cluster

    def initialOffset(self) -> off.OffsetJson:
        # Called twice in a query's first run (reference, pitfall 4): resolve once, so that
        # 'latest' cannot move between the two calls.
        if self._initial is None:
            tps = self.cluster.partitions(self.source.subscription, strict=True)
            bound = self.source.starting or OffsetBound("startingOffsets", "latest")
            start = resolve_bound(self.cluster, bound, tps, is_start=True,
                                  timestamp_strategy=self.source.timestamp_strategy)
            if self._target is not None:
                # prepareForTriggerAvailableNow() ran first: its end must not be before a
                # start resolved after it (data may have arrived in between).
                for tp, offset in start.items():
                    self._target[tp] = max(self._target.get(tp, offset), offset)
            self._initial = off.to_json(start)
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        # Under Trigger.AvailableNow Spark passes this default to latestOffset, so
        # maxOffsetsPerTrigger splits an availableNow run into several micro-batches.
        limit = self.source.max_offsets_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._fetch_latest()

    def _fetch_latest(self) -> dict[TopicPartition, int]:
        tps = self.cluster.partitions(self.source.subscription, strict=False)
        latest = self.cluster.latest(tps)
        self._latest_seen = latest
        return latest

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> off.OffsetJson:
        begin = off.from_json(start)
        if self._target is not None:  # Trigger.AvailableNow: the end fixed when it began
            latest = dict(self._target)
        else:
            latest = self._fetch_latest()
            for _ in range(3):  # a lower offset can be a stale answer: ask again (as Spark)
                if not any(latest.get(tp, until) < until for tp, until in begin.items()):
                    break
                time.sleep(0.2)
                latest = self._fetch_latest()
        fail = self.source.fail_on_data_loss
        for tp in sorted(set(begin) - set(latest)):
            if fail:
                raise RaftLogDataLossError(
                    f"{tp[0]}-{tp[1]} (at offset {begin[tp]}) no longer exists (topic deleted?)")
            log.warning("raftlog: %s-%s disappeared; dropping it from the query", *tp)
        for tp, until in sorted(latest.items()):
            since = begin.get(tp)
            if since is not None and until < since:
                # Offsets went back: topic re-created or log truncated. Without
                # failOnDataLoss, continue from the new end, as Spark's Kafka source does
                # (partitions() plans nothing for a range whose end is before its start).
                if fail:
                    raise RaftLogDataLossError(
                        f"the latest offset of {tp[0]}-{tp[1]} went back from {since} to"
                        f" {until} (topic re-created or log truncated?)")
                log.warning("raftlog: %s-%s went back from %s to %s; records lost", tp[0],
                            tp[1], since, until)
        return off.to_json(self._limit(limit, begin, latest))

    @staticmethod
    def _limit(limit: ReadLimit, begin: dict[TopicPartition, int],
               latest: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        if isinstance(limit, ReadMaxRows):
            return off.rate_limit(limit.max_rows, begin, latest)
        if not isinstance(limit, ReadAllAvailable):
            raise RaftLogOptionError("maxOffsetsPerTrigger",
                                     f"read limit {limit!r} is not supported by raftlog")
        return latest

    def reportLatestOffset(self) -> off.OffsetJson | None:
        return off.to_json(self._latest_seen) if self._latest_seen is not None else None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        return list(off.ranges(off.from_json(start), off.from_json(end)))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.settings, partition)

    def commit(self, end: dict[str, Any]) -> None:
        # Spark has checkpointed everything up to `end`. Nothing to do: offsets live in the
        # checkpoint, never in a consumer group (there is none to commit to yet). Note this
        # call lags one batch behind (reference, section 4).
        return None

    def stop(self) -> None:
        # Rarely called by Spark 4.3 (pitfall 5); the process is killed instead.
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None
