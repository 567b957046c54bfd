"""LocalQuorum: the single-voter metadata log on disk, driven through trio.

Goal: committed metadata survives restarts, a torn or corrupt log tail is truncated (with a
warning) instead of failing startup, checkpoints replace the log without ever losing both, lost
or foreign data stops startup, concurrent proposals share fsyncs, and every wait is bounded.
Method: real files under tmp_path; faults are injected by editing the files between opens and by
wrapping the quorum's blocking write function.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pytest
import trio

from raftlog.metadata import errors
from raftlog.metadata.records import AlterConfigs, CreateTopic, FenceBroker, UnfenceBroker
from raftlog.metadata.state import RESOURCE_TYPE_TOPIC, MetadataStateMachine
from raftlog.metadata.testing import make_topic_id
from raftlog.quorum import logfile
from raftlog.quorum.interface import (
    ProposalTimeoutError,
    Quorum,
    QuorumBusyError,
    QuorumClosedError,
    QuorumFailedError,
    QuorumTimeoutError,
)
from raftlog.quorum.local import LocalNode, LocalQuorum
from raftlog.quorum.logfile import MetadataLogCorruptError

NODE: Final = LocalNode(node_id=1, host="127.0.0.1", port=9092)


def quorum(path: Path, *, node: LocalNode | None = NODE, **kwargs: int) -> LocalQuorum:
    return LocalQuorum(path, MetadataStateMachine(), node=node, **kwargs)


def log_path(path: Path) -> Path:
    return path / logfile.PARTITION_DIR_NAME / logfile.LOG_FILE_NAME


def checkpoints(path: Path) -> list[str]:
    return sorted(p.name for p in (path / logfile.PARTITION_DIR_NAME).glob("*.checkpoint"))


def create_topic(name: str, seed: int) -> CreateTopic:
    return CreateTopic(name, make_topic_id(seed), ((1,),), ())


async def create_topics(q: LocalQuorum, count: int, prefix: str = "t") -> None:
    for i in range(count):
        result = await q.propose(create_topic(f"{prefix}{i}", i))
        assert result.ok, result


def block_writes(q: LocalQuorum) -> threading.Event:
    """Make the quorum's log writes wait until the returned event is set."""
    release = threading.Event()
    write: Callable[..., None] = q._write_batch_sync

    def blocked(*args: object) -> None:
        assert release.wait(timeout=10), "test forgot to release the writer"
        write(*args)

    setattr(q, "_write_batch_sync", blocked)  # noqa: B010 (an instance attribute on purpose)
    return release


def append_to_log(path: Path, data: bytes) -> None:
    with open(log_path(path), "ab") as log:
        log.write(data)


# --- Startup, restart and replay ------------------------------------------------------------


async def test_open_registers_the_node_and_bumps_the_term_on_every_start(tmp_path: Path) -> None:
    async with quorum(tmp_path) as q:
        image = q.image
        assert (image.controller_term, image.controller_node_id) == (1, 1)
        broker = image.brokers[1]
        assert (broker.host, broker.port, broker.fenced) == ("127.0.0.1", 9092, False)
        first_incarnation = broker.incarnation_id
    async with quorum(tmp_path) as q:
        assert q.image.controller_term == 2
        assert q.image.brokers[1].incarnation_id != first_incarnation
        assert not q.image.brokers[1].fenced


async def test_committed_metadata_survives_restart(tmp_path: Path) -> None:
    async with quorum(tmp_path) as q:
        result = await q.propose(create_topic("orders", 1))
        assert result.ok and result.value == make_topic_id(1)
        assert "orders" in q.image.topics
        version = q.image.version
    async with quorum(tmp_path, node=None) as q:
        assert q.image.version == version
        assert q.image.topics["orders"].topic_id == make_topic_id(1)


async def test_quorum_satisfies_the_protocol(tmp_path: Path) -> None:
    q: Quorum = quorum(tmp_path)
    async with quorum(tmp_path / "other") as local:
        q = local
        assert (await q.propose(FenceBroker(1))).ok


async def test_rejections_and_cas_come_back_as_results(tmp_path: Path) -> None:
    async with quorum(tmp_path) as q:
        await create_topics(q, 1)
        again = await q.propose(create_topic("t0", 9))
        assert again.error_code == errors.TOPIC_ALREADY_EXISTS
        stale = q.image.topics["t0"].version - 1
        change = AlterConfigs(RESOURCE_TYPE_TOPIC, "t0", (("retention.ms", "1"),), ())
        result = await q.propose(change, expected_version=stale)
        assert result.error_code == errors.STALE_METADATA_VERSION
        assert (await q.propose(change, expected_version=q.image.version)).ok


async def test_retry_with_the_same_request_id_applies_once(tmp_path: Path) -> None:
    async with quorum(tmp_path) as q:
        first = await q.propose(create_topic("t", 1), request_id="retry-me")
        second = await q.propose(create_topic("t", 1), request_id="retry-me")
        assert first.ok and second == first
    async with quorum(tmp_path, node=None) as q:
        # The window is replayed too, so the retry still answers the same after a restart.
        assert (await q.propose(create_topic("t", 1), request_id="retry-me")) == first


# --- Torn and corrupt logs ------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda frame: frame[: len(frame) // 2], id="half-a-frame"),
        pytest.param(lambda frame: frame[:5], id="half-a-header"),
        pytest.param(lambda frame: b"\xde\xad\xbe\xef" * 9, id="garbage"),
        pytest.param(lambda frame: frame[:8] + b"X" + frame[9:], id="bad-crc"),
        pytest.param(lambda frame: b"\xff\xff\xff\xff" + frame[4:], id="huge-length"),
    ],
)
async def test_torn_tail_is_truncated_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[bytes], bytes]
) -> None:
    async with quorum(tmp_path) as q:
        await create_topics(q, 3)
        image = q.image
    good_size = log_path(tmp_path).stat().st_size
    frame = logfile.encode_frame(logfile.encode_entry(image.version + 1, b"\x00" * 40))
    append_to_log(tmp_path, damage(frame))
    with caplog.at_level(logging.WARNING, logger="raftlog.quorum.logfile"):
        async with quorum(tmp_path, node=None) as q:
            assert q.image == image
            assert log_path(tmp_path).stat().st_size == good_size
            assert (await q.propose(create_topic("after", 50))).ok
    assert any("truncating" in record.getMessage() for record in caplog.records)
    async with quorum(tmp_path, node=None) as q:
        assert "after" in q.image.topics and "t2" in q.image.topics


async def test_a_torn_first_frame_leaves_an_empty_log(tmp_path: Path) -> None:
    log = log_path(tmp_path)
    log.parent.mkdir(parents=True)
    log.write_bytes(b"\x00\x00\x00")
    async with quorum(tmp_path) as q:
        assert q.image.controller_term == 1


async def test_a_crc_valid_but_undecodable_frame_stops_startup(tmp_path: Path) -> None:
    async with quorum(tmp_path):
        pass
    append_to_log(tmp_path, logfile.encode_frame(b"not cbor \xff"))
    with pytest.raises(MetadataLogCorruptError, match="frame 3"):
        await quorum(tmp_path).open()


async def test_an_offset_gap_in_the_log_stops_startup(tmp_path: Path) -> None:
    async with quorum(tmp_path) as q:
        version = q.image.version
    append_to_log(tmp_path, logfile.encode_frame(logfile.encode_entry(version + 2, b"x")))
    with pytest.raises(MetadataLogCorruptError, match="follows"):
        await quorum(tmp_path).open()


# --- Checkpoints ----------------------------------------------------------------------------


async def test_checkpoint_replaces_the_log(tmp_path: Path) -> None:
    async with quorum(tmp_path, snapshot_interval_records=5) as q:
        await create_topics(q, 12)
        assert q.snapshot_count >= 2
        image = q.image
    assert len(checkpoints(tmp_path)) == 1  # Older checkpoints are deleted.
    frames = logfile.scan_frames(log_path(tmp_path).read_bytes()).payloads
    assert len(frames) < 5
    async with quorum(tmp_path, node=None, snapshot_interval_records=5) as q:
        assert q.image == image


async def test_crash_between_checkpoint_and_log_truncation_is_harmless(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Simulate the crash by never truncating: the log still holds what the checkpoint covers.
    monkeypatch.setattr(logfile.LogWriter, "truncate_all", lambda self: None)
    async with quorum(tmp_path, snapshot_interval_records=4) as q:
        await create_topics(q, 6)
        image = q.image
    assert checkpoints(tmp_path)
    async with quorum(tmp_path, node=None) as q:
        assert q.image == image


async def test_a_corrupt_checkpoint_falls_back_to_the_full_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(logfile.LogWriter, "truncate_all", lambda self: None)
    async with quorum(tmp_path, snapshot_interval_records=4) as q:
        await create_topics(q, 3)
        image = q.image
    (checkpoint,) = (tmp_path / logfile.PARTITION_DIR_NAME).glob("*.checkpoint")
    checkpoint.write_bytes(checkpoint.read_bytes()[:-3])
    async with quorum(tmp_path, node=None) as q:
        assert q.image == image
    assert any("corrupt" in record.getMessage() for record in caplog.records)


async def test_losing_the_checkpoint_after_truncation_stops_startup(tmp_path: Path) -> None:
    async with quorum(tmp_path, snapshot_interval_records=4) as q:
        await create_topics(q, 3)
    for name in checkpoints(tmp_path):
        (tmp_path / logfile.PARTITION_DIR_NAME / name).unlink()
    with pytest.raises(MetadataLogCorruptError, match="lost"):
        await quorum(tmp_path).open()


async def test_leftover_checkpoint_tmp_files_are_removed(tmp_path: Path) -> None:
    leftover = tmp_path / logfile.PARTITION_DIR_NAME / ("0" * 20 + ".checkpoint.tmp")
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"partial")
    async with quorum(tmp_path):
        assert not leftover.exists()


# --- Group commit, back-pressure, timeouts and failures -------------------------------------


async def test_concurrent_proposals_share_fsyncs(tmp_path: Path) -> None:
    proposals = 60
    async with quorum(tmp_path) as q:
        fsyncs_before = q.fsync_count
        results = {}

        async def propose(i: int) -> None:
            results[i] = await q.propose(create_topic(f"t{i}", i))

        async with trio.open_nursery() as nursery:
            for i in range(proposals):
                nursery.start_soon(propose, i)
        assert all(result.ok for result in results.values()) and len(results) == proposals
        fsyncs = q.fsync_count - fsyncs_before
        assert fsyncs <= 3, fsyncs
        assert len(q.image.topics) == proposals


async def test_a_full_pending_queue_raises_busy(tmp_path: Path) -> None:
    async with quorum(tmp_path, pending_max=2) as q:
        release = block_writes(q)
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(3):  # One in flight, two pending: the queue is full.
                    nursery.start_soon(q.propose, FenceBroker(1))
                    await trio.testing.wait_all_tasks_blocked()
                with pytest.raises(QuorumBusyError):
                    await q.propose(UnfenceBroker(1))
                release.set()
        finally:
            release.set()


async def test_timeouts_say_whether_the_outcome_is_known(tmp_path: Path) -> None:
    async with quorum(tmp_path) as q:
        release = block_writes(q)
        outcomes: dict[str, bool | None] = {}

        async def propose(name: str) -> None:
            try:
                await q.propose(FenceBroker(1), timeout_s=0.2)
                outcomes[name] = None
            except ProposalTimeoutError as exc:
                outcomes[name] = exc.outcome_unknown

        try:
            async with trio.open_nursery() as nursery:
                # Whichever of these runs first leads the batch; the other joins it.
                nursery.start_soon(propose, "first")
                nursery.start_soon(propose, "second")
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(propose, "queued")  # Still pending at its deadline.
                await trio.sleep(0.4)
                release.set()
        finally:
            release.set()
        # The leader's write is shielded: it finishes and is not reported as timed out. The
        # proposal that joined its batch timed out with an unknown outcome (it did apply).
        assert sorted(map(str, [outcomes["first"], outcomes["second"]])) == ["None", "True"]
        assert outcomes["queued"] is False
        assert q.image.brokers[1].fenced


async def test_wait_for_version_and_wait_changed(tmp_path: Path) -> None:
    async with quorum(tmp_path) as q:
        version = q.image.version
        with pytest.raises(QuorumTimeoutError):
            await q.wait_changed(version, timeout_s=0.01)
        assert (await q.wait_for_version(version, timeout_s=0.01)).version == version
        seen = []

        async def watch() -> None:
            seen.append(await q.wait_changed(version, timeout_s=5))
            seen.append(await q.wait_for_version(version + 2, timeout_s=5))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            await trio.testing.wait_all_tasks_blocked()
            await create_topics(q, 2)
        assert [image.version for image in seen] == [version + 1, version + 2]


async def test_a_failed_write_fails_the_quorum(tmp_path: Path) -> None:
    async with quorum(tmp_path) as q:
        writer = q._writer
        assert writer is not None

        def broken_append(data: bytes) -> None:
            raise OSError(28, "No space left on device")

        writer.append = broken_append  # type: ignore[method-assign]
        version = q.image.version
        with pytest.raises(QuorumFailedError, match="No space left"):
            await q.propose(FenceBroker(1))
        with pytest.raises(QuorumFailedError):
            await q.propose(FenceBroker(1))
        assert q.image.version == version


async def test_proposing_to_a_closed_quorum_fails(tmp_path: Path) -> None:
    q = quorum(tmp_path)
    with pytest.raises(QuorumClosedError):
        await q.propose(FenceBroker(1))
    await q.open()
    await q.aclose()
    with pytest.raises(QuorumClosedError):
        await q.propose(FenceBroker(1))
