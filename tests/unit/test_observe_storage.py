"""The storage metrics (raftlog/observe/storage.py) against real partitions on tmp_path.

Goal: what ``/metrics`` says about the node's logs matches the files, the group-commit fsync
histogram counts rounds that acknowledged produces, the compaction and retention counters
move when the cleaner and retention (and DeleteRecords) delete or rewrite segments, and a
scrape of 1,000 partitions stays cheap. Method: a real ``PartitionManager`` and
``LogCleaner`` in a ``NodeParts`` with a real ``LocalQuorum``, rendered by
``prometheus_client.generate_latest`` and parsed back with its text parser.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from raftlog.broker.apis import KafkaApis
from raftlog.config import ServerConfig
from raftlog.metadata.state import MetadataStateMachine
from raftlog.observe.parts import MetricsSettings, NodeParts
from raftlog.observe.storage import StorageCollector
from raftlog.partition.append import AppendOrigin
from raftlog.partition.batch import build_batch
from raftlog.partition.cleaner_service import CleanerSettings, LogCleaner
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import Partition, now_ms
from raftlog.quorum.interface import Quorum
from raftlog.quorum.local import LocalNode, LocalQuorum
from raftlog.replication.manager import ReplicaManager
from tests.segment_bytes import stored_bytes

WAIT_S = 60.0
# Durable acks (the default): a produce is acknowledged once a flush round fsynced it.
DURABLE = {"segment.bytes": "2000"}
DETAIL = MetricsSettings(partition_detail=True)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def node_parts(tmp_path: Path, quorum: Quorum, manager: PartitionManager,
               cleaner: LogCleaner) -> NodeParts:
    """A NodeParts of real parts (a broker-only view: no controller, groups or txn)."""
    config = ServerConfig.from_properties({"node.id": "1", "log.dirs": str(tmp_path)})
    replicas = ReplicaManager(manager)
    return NodeParts(config=config, quorum=quorum, manager=manager, cleaner=cleaner,
                     replicas=replicas, apis=KafkaApis(config, quorum, manager, replicas),
                     controller=None, groups=None, txn=None, ready=lambda: True)


@asynccontextmanager
async def storage_node(tmp_path: Path) -> AsyncIterator[tuple[NodeParts, PartitionManager]]:
    manager = PartitionManager(tmp_path / "data", node_id=1)
    cleaner = LogCleaner(manager, CleanerSettings())
    async with LocalQuorum(tmp_path / "meta", MetadataStateMachine(),
                           node=LocalNode(1, "127.0.0.1", 9092)) as quorum:
        try:
            yield node_parts(tmp_path, quorum, manager, cleaner), manager
        finally:
            manager.close()


def scrape(*collectors: Collector) -> Samples:
    """Every sample the collectors export, by (name, sorted labels)."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    text = generate_latest(registry).decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def batch(i: int, key: bytes | None = None, size: int = 100) -> bytes:
    return build_batch([(key, b"%06d" % i + b"v" * size, ())], timestamp_ms=now_ms())


async def produce(partition: Partition, records: bytes) -> int:
    """A client append, acknowledged (acks=all on a single replica) once fsynced."""
    result = partition.append(records, AppendOrigin.CLIENT)
    assert result.error == 0, result
    acked = await partition.wait_high_watermark(result.last_offset + 1,
                                                trio.current_time() + WAIT_S)
    assert acked
    return result.last_offset


def log_file_bytes(directory: Path) -> tuple[int, int]:
    """(bytes, count) of the batches in the segment data files of a partition directory: up
    to the first zero batch length, where an active segment's preallocated tail begins."""
    files = list(directory.glob("*.log"))
    return sum(len(stored_bytes(f.read_bytes())) for f in files), len(files)


FLUSH = "kafka_log_logflushstats_logflushrateandtimems"


async def test_flush_histogram_counts_rounds_that_acknowledged_produces(tmp_path: Path) -> None:
    async with storage_node(tmp_path) as (parts, manager), trio.open_nursery() as nursery:
        collector = StorageCollector(parts, MetricsSettings())
        partition = manager.ensure_partition("t", 0, DURABLE, leader_epoch=0)
        before = scrape(collector)
        assert value(before, FLUSH + "_count") == 0
        assert value(before, FLUSH + "_bucket", le="+Inf") == 0
        nursery.start_soon(manager.run_flusher)
        for i in range(5):
            await produce(partition, batch(i))
            samples = scrape(collector)
            # Every acknowledged produce waited for at least one more fsync round.
            assert value(samples, FLUSH + "_count") >= i + 1
        after = scrape(collector)
        rounds = value(after, FLUSH + "_count")
        assert value(after, FLUSH + "_bucket", le="+Inf") == rounds
        assert value(after, FLUSH + "_sum") > 0
        assert rounds == manager.stats.flush_ms.count <= manager.flush_rounds
        nursery.cancel_scope.cancel()


async def test_sizes_and_segments_match_the_files(tmp_path: Path) -> None:
    async with storage_node(tmp_path) as (parts, manager), trio.open_nursery() as nursery:
        nursery.start_soon(manager.run_flusher)
        partitions = [manager.ensure_partition("t", i, DURABLE, leader_epoch=0)
                      for i in range(3)]
        for i in range(40):  # 2000-byte segments: several per partition
            await produce(partitions[i % 3], batch(i))
        samples = scrape(StorageCollector(parts, DETAIL))
        total_bytes = total_segments = 0
        for partition in partitions:
            files_bytes, files = log_file_bytes(partition.log.directory)
            labels = {"topic": "t", "partition": str(partition.index)}
            assert value(samples, "kafka_log_log_size", **labels) == files_bytes
            assert value(samples, "kafka_log_log_numlogsegments", **labels) == files > 1
            assert value(samples, "kafka_log_log_logstartoffset", **labels) == 0
            end = value(samples, "kafka_log_log_logendoffset", **labels)
            assert end == partition.log.log_end_offset > 0
            assert value(samples, "kafka_cluster_partition_highwatermark", **labels) == end
            total_bytes += files_bytes
            total_segments += files
        assert value(samples, "raftlog_log_size_bytes") == total_bytes
        assert value(samples, "raftlog_log_segments") == total_segments
        # Without the opt-in, no per-partition family is exported.
        plain = scrape(StorageCollector(parts, MetricsSettings()))
        assert not [key for key in plain if key[0].startswith("kafka_log_log_")]
        assert value(plain, "raftlog_log_size_bytes") == total_bytes
        nursery.cancel_scope.cancel()


async def test_retention_and_delete_records_count_deleted_segments(tmp_path: Path) -> None:
    deleted = "raftlog_log_retention_deleted_segments_total"
    async with storage_node(tmp_path) as (parts, manager), trio.open_nursery() as nursery:
        nursery.start_soon(manager.run_flusher)
        collector = StorageCollector(parts, MetricsSettings())
        kept = manager.ensure_partition("kept", 0, {**DURABLE, "retention.bytes": "4000"},
                                        leader_epoch=0)
        trimmed = manager.ensure_partition("trimmed", 0, DURABLE, leader_epoch=0)
        for i in range(60):
            await produce(kept, batch(i))
            await produce(trimmed, batch(i))
        assert value(scrape(collector), deleted) == 0
        segments_before = kept.log.segment_count
        assert manager.enforce_retention() > 0  # size retention on "kept"
        by_retention = segments_before - kept.log.segment_count
        samples = scrape(collector)
        assert value(samples, deleted) == by_retention > 0
        # DeleteRecords: the log start moves into the last sealed segment.
        segments_before = trimmed.log.segment_count
        assert trimmed.move_log_start_offset(trimmed.log.segments[-2].base_offset + 1)
        by_delete_records = segments_before - trimmed.log.segment_count
        samples = scrape(collector)
        assert value(samples, deleted) == by_retention + by_delete_records
        assert by_delete_records > 0
        files_bytes = sum(log_file_bytes(p.log.directory)[0] for p in (kept, trimmed))
        assert value(samples, "raftlog_log_size_bytes") == files_bytes
        nursery.cancel_scope.cancel()


async def test_compaction_counts_passes_and_bytes_cleaned(tmp_path: Path) -> None:
    compacted = {"cleanup.policy": "compact", "segment.bytes": "1500",
                 "min.cleanable.dirty.ratio": "0.01"}
    async with storage_node(tmp_path) as (parts, manager), trio.open_nursery() as nursery:
        nursery.start_soon(manager.run_flusher)
        collector = StorageCollector(parts, MetricsSettings())
        partition = manager.ensure_partition("c", 0, compacted, leader_epoch=0)
        for i in range(200):
            await produce(partition, batch(i, key=b"key-%d" % (i % 5), size=20))
        before = scrape(collector)
        assert value(before, "raftlog_log_cleaner_runs_total") == 0
        assert value(before, "raftlog_log_cleaner_bytes_cleaned_total") == 0
        sealed_bytes = sum(s.size_bytes for s in partition.log.segments[:-1])
        assert await parts.cleaner.clean_all() == 1
        after = scrape(collector)
        assert value(after, "raftlog_log_cleaner_runs_total") == 1
        assert value(after, "raftlog_log_cleaner_bytes_cleaned_total") == sealed_bytes > 0
        files_bytes, files = log_file_bytes(partition.log.directory)
        assert value(after, "raftlog_log_size_bytes") == files_bytes < sealed_bytes
        assert value(after, "raftlog_log_segments") == files
        nursery.cancel_scope.cancel()


async def test_a_scrape_of_a_thousand_partitions_is_cheap(tmp_path: Path) -> None:
    async with storage_node(tmp_path) as (parts, manager):
        configs: Mapping[str, str] = {}
        for i in range(1000):
            partition = manager.ensure_partition(f"topic-{i % 50}", i // 50, configs,
                                                 leader_epoch=0)
            partition.log.append(batch(i), leader_epoch=0, now_ms=now_ms())
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StorageCollector(parts, DETAIL))
        plain = CollectorRegistry(auto_describe=False)
        plain.register(StorageCollector(parts, MetricsSettings()))
        timings = {}
        rounds = 20
        for name, target in (("totals", plain), ("per-partition detail", registry)):
            started = time.perf_counter()
            for _ in range(rounds):
                text = generate_latest(target)
            timings[name] = (time.perf_counter() - started) / rounds * 1000
        collector = StorageCollector(parts, DETAIL)
        started = time.perf_counter()
        for _ in range(rounds):
            list(collector.collect())
        timings["detail, collect() alone"] = (time.perf_counter() - started) / rounds * 1000
        print("scrape of 1,000 partitions: " + ", ".join(
            f"{name} {ms:.1f} ms" for name, ms in timings.items()))
        samples = scrape(StorageCollector(parts, DETAIL))
        assert value(samples, "raftlog_log_segments") == 1000
        assert len([k for k in samples if k[0] == "kafka_log_log_size"]) == 1000
        assert text
