"""A full disk, for real: a broker whose ``log.dirs`` is a 2 MiB tmpfs.

Producing until the filesystem is full must get KAFKA_STORAGE_ERROR (56) for the partition,
with the broker alive, its connection open, one ERROR line naming the partition and the errno,
and every acknowledged record still readable. Once space is freed, writes succeed again at the
next offset, and a restart finds an intact log.

Needs ``mount -t tmpfs`` (root); skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from raftlog.client.connection import KafkaConnection
from raftlog.partition.batch import build_batch
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import PRODUCE
from tests.integration.conftest import BrokerProcess
from tests.integration.helpers import (
    check_batches,
    create_topic,
    decode_batches,
    fetch_raw,
    start_broker,
    unique_topic,
)

FILESYSTEM_BYTES = 2 << 20
FILLER_BYTES = 512 << 10  # deleted to free space again
RECORD_BYTES = 4000
RECORDS_PER_BATCH = 8  # ~32 KB batches: the disk fills after a few dozen
PRODUCE_ATTEMPTS_MAX = 500
KAFKA_STORAGE_ERROR = 56
FULL_FOR_S = 6.0  # longer than replica.high.watermark.checkpoint.interval.ms (5 s)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs mounted at ``tmp_path/data`` (the broker's log.dirs)."""
    mount_point = tmp_path / "data"
    mount_point.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FILESYSTEM_BYTES}", "tmpfs",
                        str(mount_point)], check=True, capture_output=True, text=True,
                       timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {detail}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False, capture_output=True,
                       timeout=30)


async def _produce(port: int, topic: str, records: bytes) -> tuple[int, int]:
    async with await KafkaConnection.connect("127.0.0.1", port, timeout_s=5) as connection:
        response = await connection.request(PRODUCE, {
            "transactional_id": None, "acks": -1, "timeout_ms": 10_000,
            "topic_data": [{"name": topic, "partition_data": [
                {"index": 0, "records": records}]}]}, timeout_s=20)
    result = response.responses[0].partition_responses[0]
    return int(result.error_code), int(result.base_offset)


def produce(broker: BrokerProcess, topic: str, values: list[bytes]) -> tuple[int, int]:
    """One acks=all batch of ``values``: (error code, base offset)."""
    batch = build_batch([(None, value, ()) for value in values])
    result: tuple[int, int] = trio.run(_produce, broker.port, topic, batch)
    return result


def numbered(start: int) -> list[bytes]:
    return [b"%08d" % (start + i) + b"x" * (RECORD_BYTES - 8) for i in range(RECORDS_PER_BATCH)]


def stored_values(broker: BrokerProcess, topic: str) -> list[bytes | None]:
    batches = fetch_raw(broker.bootstrap, topic, 0)
    check_batches(batches)  # CRC-32C, structure, contiguous offsets from 0
    return [record.value for record in decode_batches(batches)]


def test_full_disk_refuses_writes_with_storage_error_and_keeps_the_log(
    small_disk: Path, tmp_path: Path,
) -> None:
    broker = BrokerProcess(tmp_path)  # log.dirs = tmp_path/data, the tmpfs
    start_broker(broker)
    try:
        topic = unique_topic("disk-full")
        # Small segments, so the disk also fills while a roll writes index files.
        create_topic(broker.bootstrap, topic, configs={"segment.bytes": str(256 << 10)})
        filler = small_disk / "filler"
        filler.write_bytes(b"\0" * FILLER_BYTES)

        acknowledged: list[bytes] = []
        error = 0
        for _ in range(PRODUCE_ATTEMPTS_MAX):
            values = numbered(len(acknowledged))
            error, base_offset = produce(broker, topic, values)
            if error:
                break
            assert base_offset == len(acknowledged)
            acknowledged.extend(values)
        assert error == KAFKA_STORAGE_ERROR, f"produce ended with {ErrorCode(error).name}"
        assert acknowledged, "the disk was full before the first batch"

        # Still full: every attempt gets the same clear answer, the node stays up, also
        # past a round of its periodic writers (the high-watermark checkpoint, every 5 s).
        deadline = time.monotonic() + FULL_FOR_S
        attempts = 0
        while time.monotonic() < deadline or attempts < 3:
            assert produce(broker, topic, numbered(len(acknowledged)))[0] == KAFKA_STORAGE_ERROR
            attempts += 1
            time.sleep(0.25)
        assert broker.alive()
        assert stored_values(broker, topic) == acknowledged

        log_text = broker.log_path.read_text(errors="replace")
        assert "Traceback" not in log_text
        errors = [line for line in log_text.splitlines()
                  if " ERROR " in line and f"{topic}-0" in line]
        assert len(errors) == 1, errors
        assert re.search(r"ENOSPC|Errno 28", errors[0]), errors[0]

        # Space freed: writes succeed again, right after the last acknowledged offset.
        filler.unlink()
        values = numbered(len(acknowledged))
        assert produce(broker, topic, values) == (0, len(acknowledged))
        acknowledged.extend(values)
        assert stored_values(broker, topic) == acknowledged

        # A restart finds an intact log: nothing dropped by recovery, nothing lost.
        assert broker.stop() == 0
        start_broker(broker)
        assert stored_values(broker, topic) == acknowledged
        restarted_log = broker.log_path.read_text(errors="replace")
        assert "dropping" not in restarted_log
        assert "Traceback" not in restarted_log
        print(f"\n{len(acknowledged)} records acknowledged; full at "
              f"{sum(os.path.getsize(p) for p in small_disk.rglob('*.log'))} log bytes; "
              f"error line: {errors[0]}")
    finally:
        broker.stop()
