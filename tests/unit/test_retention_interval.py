"""log.retention.check.interval.ms: parsed and validated as Kafka does (atLeast(1)), and the
partition manager's retention loop runs on it (raftlog's default stays 30 s, see
raftlog.config)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
import trio.testing

from raftlog.config import LOG_RETENTION_CHECK_INTERVAL_MS_DEFAULT, ConfigError, ServerConfig
from raftlog.partition.batch import build_batch
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import now_ms

HOUR_MS = 3_600_000


def _config(**props: str) -> ServerConfig:
    return ServerConfig.from_properties({"node.id": "1", **props})


def test_property_is_read_with_kafkas_name(caplog: pytest.LogCaptureFixture) -> None:
    assert _config().log_retention_check_interval_ms == 30_000
    assert PartitionManager(Path(), node_id=1).retention_check_interval_ms == 30_000
    with caplog.at_level(logging.INFO):
        configured = _config(**{"log.retention.check.interval.ms": "200"})
    assert configured.log_retention_check_interval_ms == 200
    assert "log.retention.check.interval.ms" not in caplog.text, "no 'has no effect' line"


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_invalid_interval_is_refused(value: str) -> None:
    with pytest.raises(ConfigError, match=r"log\.retention\.check\.interval\.ms"):
        _config(**{"log.retention.check.interval.ms": value})


def _manager_with_expired_segments(directory: Path, interval_ms: int | None) -> PartitionManager:
    manager = PartitionManager(directory, node_id=1)
    if interval_ms is not None:
        manager.retention_check_interval_ms = interval_ms
    configs = {"segment.bytes": "1024", "retention.ms": "60000"}
    partition = manager.ensure_partition("t", 0, configs, leader_epoch=0)
    old_ms = now_ms() - HOUR_MS  # every record is past retention.ms already
    for i in range(6):
        batch = build_batch([(None, b"x" * 400, ())], timestamp_ms=old_ms + i)
        partition.log.append(batch, leader_epoch=0, now_ms=now_ms())
    assert len(partition.log.segment_base_offsets) >= 3
    partition.high_watermark = partition.log.log_end_offset  # retention stops at the HW
    assert partition.log.log_start_offset == 0
    return manager


async def _start_offset_after(manager: PartitionManager, wait_s: float) -> int:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(manager.run_retention)
        await trio.sleep(wait_s)
        nursery.cancel_scope.cancel()
    partition = manager.get("t", 0)
    assert partition is not None
    return partition.log.log_start_offset


async def test_retention_runs_on_the_configured_interval(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    manager = _manager_with_expired_segments(tmp_path, interval_ms=200)
    assert await _start_offset_after(manager, 1.0) > 0, "expired segments deleted within 1 s"
    manager.close()


async def test_default_interval_waits_longer(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    manager = _manager_with_expired_segments(tmp_path, interval_ms=None)
    assert await _start_offset_after(manager, 1.0) == 0, "nothing before the first 30 s check"
    assert await _start_offset_after(manager, LOG_RETENTION_CHECK_INTERVAL_MS_DEFAULT / 1000 + 1
                                     ) > 0
    manager.close()
