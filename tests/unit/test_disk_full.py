"""A full (or failing) disk: the node stops accepting writes with a clear error and never
corrupts its log.

Errors are injected where the kernel reports them: ``os.write`` in ``raftlog.partition.files``
(every segment append, index file and checkpoint goes through its ``write_all``) takes only
the bytes that still fit, a short write, and then raises, as a filesystem filling up does;
``os.ftruncate`` in the segment module and ``os.fsync`` in the log module fail on demand.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio

import raftlog.partition.files
import raftlog.partition.log
import raftlog.partition.log_flush
import raftlog.partition.manager
import raftlog.partition.segment
from raftlog.broker.apis import KafkaApis
from raftlog.config import ServerConfig
from raftlog.metadata.image import MetadataImage
from raftlog.partition.batch import build_batch, decode_records
from raftlog.partition.epoch_cache import LEADER_EPOCH_CHECKPOINT
from raftlog.partition.errors import CorruptRecordError
from raftlog.partition.log import KafkaStorageError, LogConfig, PartitionLog
from raftlog.partition.manager import PartitionManager
from raftlog.partition.partition import now_ms
from raftlog.protocol import codec
from raftlog.protocol.codec import Api, RequestHeader
from raftlog.protocol.errors import ErrorCode
from raftlog.protocol.schemas import FETCH, PRODUCE
from raftlog.quorum.interface import Quorum
from raftlog.server.listener import RequestContext

T0 = 1_700_000_000_000
LOG_NAME = "raftlog.partition.log"
DISK_ERRORS = [errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO]


class FailingOs:
    """Stands in for the ``os`` module of one raftlog module: the listed functions fail with
    ``error``; ``write`` takes at most ``free_bytes`` in all (a short write, then the error);
    everything else is the real ``os``."""

    def __init__(self, error: int = errno.ENOSPC, free_bytes: int | None = None,
                 failing: tuple[str, ...] = ()) -> None:
        self.error = error
        self.free_bytes = free_bytes
        self.failing = set(failing)

    def _fail(self) -> OSError:
        return OSError(self.error, os.strerror(self.error))

    def write(self, fd: int, data: Any) -> int:
        return os.write(fd, self._allowed(data))

    def pwrite(self, fd: int, data: Any, position: int) -> int:
        return os.pwrite(fd, self._allowed(data), position)

    def _allowed(self, data: Any) -> Any:
        """What still fits of ``data`` (counted as written), or the error."""
        if "write" in self.failing:
            raise self._fail()
        if self.free_bytes is None:
            return data
        if self.free_bytes <= 0:
            raise self._fail()
        allowed = bytes(memoryview(data)[:self.free_bytes])
        self.free_bytes -= len(allowed)
        return allowed

    def __getattr__(self, name: str) -> Any:
        if name in self.failing:
            def fail(*args: Any, **kwargs: Any) -> Any:
                raise self._fail()
            return fail
        return getattr(os, name)


def disk_with(monkeypatch: pytest.MonkeyPatch, free_bytes: int, error: int = errno.ENOSPC
              ) -> FailingOs:
    """Every write of the partition package (segments, indexes, checkpoints) now shares
    ``free_bytes``; set ``free_bytes = None`` on the result to free the disk again."""
    fake = FailingOs(error, free_bytes)
    monkeypatch.setattr(raftlog.partition.files, "os", fake)
    return fake


def batch(start: int, count: int = 4, value_bytes: int = 100) -> bytes:
    return build_batch([(None, b"%06d" % (start + i) + b"v" * value_bytes, ())
                        for i in range(count)], timestamp_ms=T0)


def open_log(directory: Path, *, segment_bytes: int = 1 << 30,
             index_interval_bytes: int = 4096) -> PartitionLog:
    config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=index_interval_bytes)
    return PartitionLog.open(directory / "t-0", config, T0)


def flush(log: PartitionLog) -> None:
    ticket = log.begin_flush()
    if ticket is not None:
        ticket.run()
        log.complete_flush(ticket)


def stored(log: PartitionLog) -> bytes:
    with log.read(log.log_start_offset, 1 << 30, max_offset=log.log_end_offset) as result:
        return result.read_bytes()


def segment_bytes(log: PartitionLog) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(log.directory.glob("*.log")))


def errors_about(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.ERROR and name in r.getMessage()]


# --- the segment append ------------------------------------------------------------------------


@pytest.mark.parametrize("error", DISK_ERRORS, ids=[errno.errorcode[e] for e in DISK_ERRORS])
def test_failed_append_is_cut_off_and_refused_with_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    error: int,
) -> None:
    caplog.set_level(logging.INFO, logger=LOG_NAME)
    log = open_log(tmp_path)
    for start in (0, 4, 8):
        log.append(batch(start), leader_epoch=0, now_ms=T0)
    flush(log)
    before = stored(log)
    disk = disk_with(monkeypatch, free_bytes=len(batch(12)) // 2, error=error)

    with pytest.raises(KafkaStorageError) as refused:
        log.append(batch(12), leader_epoch=0, now_ms=T0)
    assert refused.value.error_code == ErrorCode.KAFKA_STORAGE_ERROR
    assert int(ErrorCode.KAFKA_STORAGE_ERROR) == 56
    assert errno.errorcode[error] in str(refused.value)
    # Half a batch reached the file and was cut off again: the log ends with its last batch.
    assert segment_bytes(log) == before == stored(log)
    assert log.log_end_offset == 12
    assert log.offline_reason is None
    # Still full: refused again, without another ERROR line.
    with pytest.raises(KafkaStorageError):
        log.append(batch(12), leader_epoch=0, now_ms=T0)
    [line] = errors_about(caplog, "t-0")
    assert errno.errorcode[error] in line and "offset 12" in line

    disk.free_bytes = None  # space freed
    info = log.append(batch(12), leader_epoch=0, now_ms=T0)
    assert (info.base_offset, info.last_offset) == (12, 15)
    assert "appends succeed again" in caplog.text
    flush(log)
    everything = stored(log)
    log.close()

    caplog.clear()
    reopened = open_log(tmp_path)
    assert reopened.log_end_offset == 16
    assert stored(reopened) == everything
    assert "dropping" not in caplog.text  # recovery found nothing to repair
    values = [r.value for r in decode_records(everything)]
    assert values == [b"%06d" % i + b"v" * 100 for i in range(16)]
    reopened.close()


def test_disk_full_while_rolling_keeps_the_active_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    size = len(batch(0))
    # Three batches fit a segment, the fourth rolls; every batch is indexed, so sealing
    # writes non-empty index files.
    segment_size = 3 * size + size // 2
    log = open_log(tmp_path, segment_bytes=segment_size, index_interval_bytes=0)
    for start in range(0, 24, 4):
        log.append(batch(start), leader_epoch=0, now_ms=T0)
    assert log.segment_base_offsets == [0, 12]
    for start in range(24, 36, 4):
        log.append(batch(start), leader_epoch=0, now_ms=T0)
    assert log.segment_base_offsets == [0, 12, 24]  # the active segment is full
    before = b"".join(read_segments(log))
    files = sorted(p.name for p in log.directory.iterdir())
    disk = disk_with(monkeypatch, free_bytes=0)

    with pytest.raises(KafkaStorageError, match="ENOSPC"):
        log.append(batch(36), leader_epoch=0, now_ms=T0)  # must roll: the seal fails
    assert log.segment_base_offsets == [0, 12, 24]
    assert log.log_end_offset == 36
    assert b"".join(read_segments(log)) == before
    leftovers = sorted(p.name for p in log.directory.iterdir())
    assert [name for name in leftovers if not name.endswith(".tmp")] == files  # no new segment
    assert len(errors_about(caplog, "t-0")) == 1

    disk.free_bytes = None
    log.append(batch(36), leader_epoch=0, now_ms=T0)
    assert log.segment_base_offsets == [0, 12, 24, 36]
    flush(log)
    everything = b"".join(read_segments(log))
    log.close()
    caplog.clear()
    caplog.set_level(logging.WARNING)
    reopened = open_log(tmp_path, segment_bytes=segment_size, index_interval_bytes=0)
    assert reopened.segment_base_offsets == [0, 12, 24, 36]
    assert reopened.log_end_offset == 40
    assert b"".join(read_segments(reopened)) == everything
    assert "recovering" not in caplog.text  # the rolled segments' indexes passed their checks
    assert not list(reopened.directory.glob("*.tmp"))  # the failed index write's leftover
    reopened.close()


def read_segments(log: PartitionLog) -> list[bytes]:
    out = []
    for base in log.segment_base_offsets:
        with log.read(max(base, log.log_start_offset), 1 << 30) as result:
            out.append(result.read_bytes())
    return out


def test_a_cut_off_that_fails_too_takes_the_log_offline_until_recovery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    log = open_log(tmp_path)
    for start in (0, 4):
        log.append(batch(start), leader_epoch=0, now_ms=T0)
    flush(log)
    before = stored(log)
    disk = disk_with(monkeypatch, free_bytes=50, error=errno.EIO)
    monkeypatch.setattr(raftlog.partition.segment, "os",
                        FailingOs(errno.EIO, failing=("ftruncate",)))
    with pytest.raises(KafkaStorageError):
        log.append(batch(8), leader_epoch=0, now_ms=T0)
    assert log.offline_reason is not None and "EIO" in log.offline_reason
    [line] = errors_about(caplog, "t-0")
    assert "offline" in line and "EIO" in line and "cutting off" in line
    # Torn bytes the log does not index, then only the preallocated (zero) tail.
    on_disk = segment_bytes(log)
    assert on_disk[:len(before)] == before
    assert on_disk[len(before):len(before) + 50].strip(b"\0")
    assert not on_disk[len(before) + 50:].strip(b"\0")

    # Even with the disk healthy again, nothing is appended after the torn bytes...
    disk.free_bytes = None
    monkeypatch.setattr(raftlog.partition.segment, "os", os)
    with pytest.raises(KafkaStorageError, match="offline"):
        log.append(batch(8), leader_epoch=0, now_ms=T0)
    with pytest.raises(KafkaStorageError, match="offline"):
        log.append_replicated(_at_offset(batch(8), 8), now_ms=T0)
    assert log.begin_flush() is None
    # ...and what was acknowledged is still served.
    assert stored(log) == before
    assert len(errors_about(caplog, "t-0")) == 1
    log.close()

    caplog.clear()
    caplog.set_level(logging.WARNING)
    reopened = open_log(tmp_path)  # recovery cuts the torn tail off
    assert f"bytes after position {len(before)}" in caplog.text  # a warning: not just zeros
    assert reopened.log_end_offset == 8
    assert stored(reopened) == before
    assert reopened.append(batch(8), leader_epoch=0, now_ms=T0).base_offset == 8
    reopened.close()


# --- leader-epoch checkpoint (a follower's first batch of a new epoch) -------------------------


def _at_offset(raw: bytes, base_offset: int, epoch: int = -1) -> bytes:
    """A batch as a leader stored it: offsets assigned, partitionLeaderEpoch set (neither is
    covered by the CRC)."""
    out = bytearray(raw)
    struct.pack_into(">q", out, 0, base_offset)
    struct.pack_into(">i", out, 12, epoch)
    return bytes(out)


def test_failed_epoch_checkpoint_write_leaves_no_stray_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = open_log(tmp_path)
    log.append_replicated(_at_offset(batch(0), 0, epoch=1), now_ms=T0)
    checkpoint = (log.directory / LEADER_EPOCH_CHECKPOINT).read_bytes()
    disk = disk_with(monkeypatch, free_bytes=0)
    with pytest.raises(KafkaStorageError):
        log.append_replicated(_at_offset(batch(4), 4, epoch=3), now_ms=T0)
    assert log.latest_epoch == 1
    assert log.log_end_offset == 4
    assert (log.directory / LEADER_EPOCH_CHECKPOINT).read_bytes() == checkpoint

    disk.free_bytes = None
    log.append_replicated(_at_offset(batch(4), 4, epoch=3), now_ms=T0)
    assert log.latest_epoch == 3
    assert log.end_offset_for_epoch(1) == (1, 4)
    assert b"3 4" in (log.directory / LEADER_EPOCH_CHECKPOINT).read_bytes()
    log.close()


# --- the broker: Produce answers KAFKA_STORAGE_ERROR, Fetch keeps serving ----------------------


def context(api: Api, version: int, body: dict[str, Any]) -> RequestContext:
    raw = codec.encode_bytes(api, version, body, is_request=True)
    decoded = codec.decode(api, version, raw, is_request=True)
    return RequestContext(api, RequestHeader(api.key, version, 1, "test"), decoded, "peer")


async def call(handler: Callable[[RequestContext], Any], ctx: RequestContext) -> Any:
    result = handler(ctx)
    if callable(result):
        result = await result()
    assert isinstance(result, dict)
    raw = codec.encode_bytes(ctx.api, ctx.header.api_version, result)
    return codec.decode(ctx.api, ctx.header.api_version, raw, is_request=False)


def produce_request(records: bytes, acks: int = -1, timeout_ms: int = 10_000
                    ) -> RequestContext:
    return context(PRODUCE, 8, {
        "transactional_id": None, "acks": acks, "timeout_ms": timeout_ms,
        "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": records}]}]})


def fetch_request(offset: int = 0) -> RequestContext:
    return context(FETCH, 11, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
        "isolation_level": 0, "topics": [{"topic": "t", "partitions": [{
            "partition": 0, "current_leader_epoch": -1, "fetch_offset": offset,
            "partition_max_bytes": 1 << 20}]}]})


def broker(tmp_path: Path) -> tuple[KafkaApis, PartitionManager]:
    config = ServerConfig.from_properties({"node.id": "1", "log.dirs": str(tmp_path)})
    manager = PartitionManager(tmp_path, node_id=1)
    manager.ensure_partition("t", 0, {}, leader_epoch=0)
    quorum = cast(Quorum, SimpleNamespace(image=MetadataImage()))
    return KafkaApis(config, quorum, manager), manager


async def fetched_values(apis: KafkaApis) -> list[bytes | None]:
    """Fetch from offset 0 (the body as the handler built it: records are file slices)."""
    body = apis.fetch_apis.fetch(fetch_request())
    assert isinstance(body, dict)
    result = body["responses"][0]["partitions"][0]
    assert result["error_code"] == 0
    pieces = result["records"]
    try:
        data = b"".join(piece.read_bytes() for piece in pieces)
    finally:
        for piece in pieces:
            piece.close()
    return [record.value for record in decode_records(data)]


async def test_produce_to_a_full_disk_gets_storage_error_and_reads_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    apis, manager = broker(tmp_path)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(manager.run_flusher)
        ok = await call(apis.produce_apis.produce, produce_request(batch(0)))
        assert ok.responses[0].partition_responses[0].error_code == 0
        disk = disk_with(monkeypatch, free_bytes=100)
        for _ in range(3):  # every attempt: an answer, never a closed connection
            refused = await call(apis.produce_apis.produce, produce_request(batch(4)))
            result = refused.responses[0].partition_responses[0]
            assert result.error_code == ErrorCode.KAFKA_STORAGE_ERROR
            assert "ENOSPC" in result.error_message
            assert result.base_offset == -1
        assert await fetched_values(apis) == [b"%06d" % i + b"v" * 100 for i in range(4)]
        assert len(errors_about(caplog, "t-0")) == 1
        disk.free_bytes = None
        again = await call(apis.produce_apis.produce, produce_request(batch(4)))
        assert again.responses[0].partition_responses[0].base_offset == 4
        assert len(await fetched_values(apis)) == 8
        nursery.cancel_scope.cancel()
    manager.close()


async def test_failed_fsync_takes_the_partition_offline_not_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    apis, manager = broker(tmp_path)
    manager.ensure_partition("other", 0, {}, leader_epoch=0)
    partition = manager.get("t", 0)
    assert partition is not None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(manager.run_flusher)
        ok = await call(apis.produce_apis.produce, produce_request(batch(0)))
        assert ok.responses[0].partition_responses[0].error_code == 0
        fsync = FailingOs(errno.EIO, failing=("fsync", "fdatasync"))
        monkeypatch.setattr(raftlog.partition.log_flush, "os", fsync)

        # acks=all waits for an fsync that fails: answered at once, not after the timeout.
        started = trio.current_time()
        failed = await call(apis.produce_apis.produce, produce_request(batch(4), timeout_ms=30_000))
        assert failed.responses[0].partition_responses[0].error_code == \
            ErrorCode.KAFKA_STORAGE_ERROR
        assert trio.current_time() - started < 10
        assert partition.log.offline_reason is not None
        assert partition.high_watermark == 4  # the unsynced batch is never exposed
        [line] = errors_about(caplog, "t-0")
        assert "fsync" in line and "EIO" in line and "offline" in line

        # The flusher is still running: other partitions keep committing.
        monkeypatch.setattr(raftlog.partition.log_flush, "os", os)
        other = manager.get("other", 0)
        assert other is not None
        info = other.log.append(batch(0), leader_epoch=0, now_ms=now_ms())
        manager.note_append(other)
        assert await other.wait_high_watermark(info.last_offset + 1, trio.current_time() + 10)

        refused = await call(apis.produce_apis.produce, produce_request(batch(8)))
        assert refused.responses[0].partition_responses[0].error_code == \
            ErrorCode.KAFKA_STORAGE_ERROR
        assert await fetched_values(apis) == [b"%06d" % i + b"v" * 100 for i in range(4)]
        assert len(errors_about(caplog, "t-0")) == 1
        nursery.cancel_scope.cancel()
    manager.close()


async def test_snapshot_and_retention_errors_do_not_stop_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    manager = PartitionManager(tmp_path, node_id=1)
    partition = manager.ensure_partition("t", 0, {}, leader_epoch=0)
    partition.log.append(batch(0), leader_epoch=0, now_ms=now_ms())

    def full(*args: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(raftlog.partition.manager, "_store_snapshot", full)
    await manager.snapshot_producers()  # logged, retried at the next round
    assert "producer-state snapshot" in caplog.text
    monkeypatch.setattr(partition.log, "enforce_retention", full)
    assert manager.enforce_retention() == 0
    assert "retention failed" in caplog.text
    manager.close()


def test_validation_errors_still_come_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    """A full disk does not mask a corrupt batch: the client's own error is more useful."""
    log = open_log(tmp_path)
    disk_with(monkeypatch, free_bytes=0)
    corrupt = bytearray(batch(0))
    corrupt[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        log.append(bytes(corrupt), leader_epoch=0, now_ms=T0)
    with pytest.raises(KafkaStorageError):
        log.append(batch(0), leader_epoch=0, now_ms=T0)
    log.close()
