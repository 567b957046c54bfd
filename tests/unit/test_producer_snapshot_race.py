"""A producer-state snapshot written while the log is truncated under it must not survive.

The periodic snapshot is encoded on the node's loop at the log end O and written by a worker
thread. A follower that truncates its log below O meanwhile deletes the snapshots above the
truncation point, but the one being written lands afterwards. Once the log grows past O again,
a reload (a restart, or a truncation that needs one) starts from that stale file: it remembers
batches the log no longer holds, so the new leader answers a producer's retry of such a batch
as a duplicate (librdkafka: delivered) although it is in no replica, an acknowledged write
lost (issue 19's hunt, kill-two). The test holds the worker thread at the write, truncates on
the loop, then lets the write finish, grows the log, reloads, and asks about the retry.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import trio

import raftlog.partition.manager
from raftlog.partition.append import AppendOrigin
from raftlog.partition.batch import build_batch
from raftlog.partition.manager import PartitionManager
from raftlog.partition.producer_snapshot import list_snapshots
from raftlog.partition.producer_state import headers_in

pytestmark = pytest.mark.trio

T0 = 1_700_000_000_000
RETRIED_PRODUCER = 7
OTHER_PRODUCER = 8


def replicated(base_offset: int, producer_id: int, base_sequence: int, count: int = 2) -> bytes:
    """A leader's batch as a follower stores it (real base offset)."""
    return build_batch([(None, b"v%d" % (base_sequence + i), ()) for i in range(count)],
                       base_offset=base_offset, timestamp_ms=T0, producer_id=producer_id,
                       producer_epoch=0, base_sequence=base_sequence)


async def test_a_truncation_during_a_snapshot_write_voids_the_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    manager = PartitionManager(tmp_path, node_id=1)
    partition = manager.ensure_partition("t", 0, {}, leader_epoch=0)
    partition.append(replicated(0, RETRIED_PRODUCER, 0), AppendOrigin.REPLICATION)
    partition.append(replicated(2, RETRIED_PRODUCER, 2), AppendOrigin.REPLICATION)
    assert partition.log.log_end_offset == 4

    entered, release = threading.Event(), threading.Event()
    store = raftlog.partition.manager._store_snapshot

    def held_store(*args: Any) -> None:
        entered.set()
        assert release.wait(30), "the test never released the snapshot write"
        store(*args)

    monkeypatch.setattr(raftlog.partition.manager, "_store_snapshot", held_store)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(manager.snapshot_producers)  # encodes the state at offset 4
        assert await trio.to_thread.run_sync(entered.wait, 30), "no snapshot write started"
        # The follower's divergent tail goes (the second batch never reached the new leader).
        assert partition.truncate_to(2) == 2
        release.set()
    # The new leader's log continues with another producer's batch, past the old end.
    partition.append(replicated(2, OTHER_PRODUCER, 0, count=4), AppendOrigin.REPLICATION)
    assert partition.log.log_end_offset == 6

    assert [o for o in list_snapshots(partition.log.directory) if o > 2] == [], \
        "a snapshot of the truncated tail was left on disk"
    partition.load_producers()  # what a restart does
    [retry] = list(headers_in(replicated(0, RETRIED_PRODUCER, 2)))
    check = partition.producers.check_append(retry)
    assert check.duplicate is None, \
        f"the retry of a batch no replica holds was answered as a duplicate: {check.duplicate}"
    assert check.ok, "the retried batch continues the producer's sequence and must be written"
    manager.close()
