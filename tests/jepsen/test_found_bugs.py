"""Reproductions of raftlog bugs the harness found, as small deterministic tests.

CreatePartitions is not a compare-and-set (found by the metadata workload, campaign of
2026-11-21, e.g. ``python -m jepsen test --workload metadata --nemesis pause --seed 100
--time-limit 20 --interval 4 --rate 40``: two concurrent ``add-partitions 5`` both ``ok``).
The handler (``raftlog/broker/apis.py`` ``_add_partitions``) turns the requested count into a
list of *new* partitions against its current image, and the state machine
(``raftlog/metadata/state.py`` ``_create_partitions``) appends them without checking the
count they were computed from, so two concurrent CreatePartitions(count=5) on a 1-partition
topic both succeed and leave 9 partitions. Kafka's controller answers the second one with
INVALID_PARTITIONS. Fixed: the handler proposes CreatePartitions as a compare-and-set on the
topic's version and re-checks the count against the newer image when the topic changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from jepsen.db import Cluster
from jepsen.net import LoopbackNet
from raftlog.client.connection import KafkaConnection
from raftlog.protocol.schemas import CREATE_PARTITIONS, CREATE_TOPICS, METADATA


async def _request(address: tuple[str, int], api: Any, body: dict[str, Any]) -> Any:
    async with await KafkaConnection.connect(*address) as conn:
        return await conn.request(api, body, timeout_s=15)


async def _concurrent_create_partitions(cluster: Cluster) -> tuple[list[int], int]:
    md = await _request(cluster.nodes[1].address, METADATA,
                        {"topics": [], "allow_auto_topic_creation": False})
    controller = {b.node_id: (b.host, b.port) for b in md.brokers}[md.controller_id]
    await _request(controller, CREATE_TOPICS, {
        "topics": [{"name": "grow", "num_partitions": 1, "replication_factor": 3,
                    "assignments": [], "configs": []}], "timeout_ms": 10_000})
    codes: list[int] = []

    async def grow() -> None:
        r = await _request(controller, CREATE_PARTITIONS, {
            "topics": [{"name": "grow", "count": 5, "assignments": None}],
            "timeout_ms": 10_000, "validate_only": False})
        codes.append(int(r.results[0].error_code))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(grow)
        nursery.start_soon(grow)
    md = await _request(controller, METADATA, {"topics": [{"name": "grow"}],
                                               "allow_auto_topic_creation": False})
    return sorted(codes), len(md.topics[0].partitions)


def test_concurrent_create_partitions_to_the_same_count(tmp_path: Path) -> None:
    cluster = Cluster.create(tmp_path / "cluster", 3, LoopbackNet())
    try:
        cluster.start_all()
        cluster.wait_ready()
        codes, partitions = trio.run(_concurrent_create_partitions, cluster)
    finally:
        cluster.stop_all()
    assert partitions == 5, f"error codes {codes}, {partitions} partitions"
    assert codes == [0, 37]  # NONE, INVALID_PARTITIONS
