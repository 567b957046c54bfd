"""Storage metrics: log sizes and segments, group-commit fsyncs, compaction and retention.

Read at scrape time from the ``PartitionManager`` (its partitions' logs, whose sizes are
tracked in memory: no I/O here), its ``StorageStats`` (fsync rounds, deleted segments) and
the ``LogCleaner``'s counters. With ``metrics.partition.detail.enable`` every partition also
gets Kafka's per-log gauges (``kafka_log_log_*``) and its high watermark.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from raftlog.observe import families
from raftlog.observe.parts import MetricsSettings, NodeParts

_PARTITION_LABELS = ("topic", "partition")


class StorageCollector:
    """The rows of docs/metrics.md, "Storage"."""

    def __init__(self, parts: NodeParts, settings: MetricsSettings) -> None:
        self._parts = parts
        self._settings = settings

    def collect(self) -> Iterator[Metric]:
        manager = self._parts.manager
        detail = self._settings.partition_detail
        size = GaugeMetricFamily("kafka_log_log_size", "Bytes of one partition's log",
                                 labels=_PARTITION_LABELS)
        segments = GaugeMetricFamily("kafka_log_log_numlogsegments",
                                     "Segments of one partition's log", labels=_PARTITION_LABELS)
        start = GaugeMetricFamily("kafka_log_log_logstartoffset",
                                  "Log start offset of one partition",
                                  labels=_PARTITION_LABELS)
        end = GaugeMetricFamily("kafka_log_log_logendoffset",
                                "Log end offset of one partition", labels=_PARTITION_LABELS)
        high_watermark = GaugeMetricFamily("kafka_cluster_partition_highwatermark",
                                           "High watermark of one partition",
                                           labels=_PARTITION_LABELS)
        total_bytes = 0
        total_segments = 0
        # Nothing yields inside the loop, so the dict cannot change under it.
        for (topic, index), partition in manager.partitions.items():
            if partition.deleted:
                continue
            log = partition.log
            log_bytes = log.size_bytes
            log_segments = log.segment_count
            total_bytes += log_bytes
            total_segments += log_segments
            if detail:
                labels = (topic, str(index))
                size.add_metric(labels, log_bytes)
                segments.add_metric(labels, log_segments)
                start.add_metric(labels, log.log_start_offset)
                end.add_metric(labels, log.log_end_offset)
                high_watermark.add_metric(labels, partition.high_watermark)
        yield families.gauge("raftlog_log_size_bytes",
                             "Bytes of all partition logs on this node", total_bytes)
        yield families.gauge("raftlog_log_segments",
                             "Segments of all partition logs on this node", total_segments)
        stats = manager.stats
        yield families.histogram(
            "kafka_log_logflushstats_logflushrateandtimems",
            "One group-commit fsync round, in milliseconds (the rate is its count)",
            stats.flush_ms)
        cleaner = self._parts.cleaner
        yield families.counter("raftlog_log_cleaner_runs",
                               "Compaction passes that cleaned a log", cleaner.passes)
        yield families.counter("raftlog_log_cleaner_bytes_cleaned",
                               "Bytes of segments compaction rewrote", cleaner.bytes_cleaned)
        yield families.counter("raftlog_log_retention_deleted_segments",
                               "Segments deleted by retention or DeleteRecords",
                               stats.deleted_segments)
        yield families.counter("raftlog_log_corrupt_batches",
                               "Batches whose CRC failed on read or scrub (never served)",
                               stats.corrupt_batches)
        yield families.counter("raftlog_log_scrubbed_bytes",
                               "Segment bytes the background scrub CRC-checked",
                               stats.scrubbed_bytes)
        if detail:
            yield from (size, segments, start, end, high_watermark)
