"""ReplicaManager.apply_image_steps: only partitions whose state changed are looked at again,
and each one it handles is a step a caller can yield at (raftlog.replication.manager)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
import trio

import raftlog.broker.apis as apis_module
from raftlog.broker.apis import KafkaApis
from raftlog.config import ServerConfig
from raftlog.metadata.records import (
    AlterConfigs,
    CreateTopic,
    DeleteTopic,
    FenceBroker,
    PartitionChange,
)
from raftlog.metadata.state import RESOURCE_TYPE_TOPIC
from raftlog.metadata.testing import MachineDriver, make_topic_id
from raftlog.partition.manager import PartitionManager
from raftlog.quorum.interface import Quorum
from raftlog.replication.manager import ReplicaManager


def _steps(replicas: ReplicaManager, driver: MachineDriver) -> int:
    return sum(1 for _ in replicas.apply_image_steps(driver.machine.image))


def test_only_changed_partitions_are_handled_again(tmp_path: Path) -> None:
    driver = MachineDriver()
    driver.bootstrap((1, 2, 3))
    assert driver.apply(CreateTopic("t", make_topic_id(3), ((1, 2, 3),) * 3, ())).ok
    manager = PartitionManager(tmp_path, 1)
    replicas = ReplicaManager(manager)
    try:
        assert _steps(replicas, driver) == 3
        assert all(p.is_leader for p in manager.partitions.values())
        assert _steps(replicas, driver) == 0  # the same image: nothing to do
        # Partition 1 moves to broker 2: only it is handled, and it follows now.
        assert driver.apply(PartitionChange("t", 1, 2, (2, 3), 1, 1)).ok
        assert _steps(replicas, driver) == 1
        assert not manager.partitions[("t", 1)].is_leader
        assert manager.partitions[("t", 0)].is_leader
        # A broker change (eligibility for the ISR and the HW) looks at every partition.
        assert driver.apply(FenceBroker(3)).ok
        assert _steps(replicas, driver) == 3
        # A topic config change reaches the partitions without a role change.
        assert driver.apply(AlterConfigs(RESOURCE_TYPE_TOPIC, "t",
                                         (("min.insync.replicas", "2"),), ())).ok
        assert _steps(replicas, driver) == 0
        assert {p.min_insync_replicas for p in manager.partitions.values()} == {2}
        # A partition closed under it (deleted, then re-created) is not skipped.
        manager.remove_partition("t", 2)
        assert _steps(replicas, driver) == 1 and ("t", 2) in manager.partitions
    finally:
        manager.close()


def test_apply_image_runs_every_step(tmp_path: Path) -> None:
    driver = MachineDriver()
    driver.bootstrap((1, 2, 3))
    assert driver.apply(CreateTopic("t", make_topic_id(4), ((2, 1, 3),) * 2, ())).ok
    manager = PartitionManager(tmp_path, 1)
    replicas = ReplicaManager(manager)
    try:
        replicas.apply_image(driver.machine.image)
        assert sorted(manager.partitions) == [("t", 0), ("t", 1)]
        assert not any(p.is_leader for p in manager.partitions.values())
        assert _steps(replicas, driver) == 0
    finally:
        manager.close()


def test_a_sync_never_runs_inside_another(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass over an older image that resumed after a newer one had opened a new topic
    deleted that topic's partitions (seen in a 10,000-partition create: the controller's
    CreateTopics sync ran while its metadata watch's sync was between two steps)."""
    monkeypatch.setattr(apis_module, "SYNC_SLICE_S", 0.0)  # yield after every step
    driver = MachineDriver()
    driver.bootstrap((1, 2, 3))
    assert driver.apply(CreateTopic("old", make_topic_id(5), ((1, 2, 3),) * 20, ())).ok
    quorum = SimpleNamespace(image=driver.machine.image)
    manager = PartitionManager(tmp_path, 1)
    config = ServerConfig.from_properties({"node.id": "1", "log.dirs": str(tmp_path)})
    apis = KafkaApis(config, cast(Quorum, quorum), manager)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(apis.sync_partitions_cooperatively)  # the metadata watch's
            for _ in range(5):
                await trio.lowlevel.checkpoint()
            assert 0 < len(manager.partitions) < 20, "the first pass is between two steps"
            assert driver.apply(DeleteTopic("old", make_topic_id(5))).ok
            assert driver.apply(CreateTopic("new", make_topic_id(6), ((1, 2, 3),) * 2, ())).ok
            quorum.image = driver.machine.image
            await apis.topic_admin.sync_partitions()  # what CreateTopics awaits
        # Interleaved, the older pass re-opened "old" and then deleted "new" as unassigned.
        assert sorted(manager.partitions) == [("new", 0), ("new", 1)]

    try:
        trio.run(main)
    finally:
        manager.close()
