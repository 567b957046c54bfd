"""The power-loss fault's file system: a real LazyFS mount (skipped where `make lazyfs` has not
built it or /dev/fuse is unusable, e.g. on CI) drops exactly the writes that were not fsynced.
About a second."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jepsen.lazyfs import LazyFsSet, check_available, is_mounted

BINARY, REASON = check_available(os.environ)
pytestmark = pytest.mark.skipif(BINARY is None, reason=f"LazyFS unavailable: {REASON}")


def _write(path: Path, data: bytes, fsync: bool, mode: str = "wb") -> None:
    with path.open(mode) as f:
        f.write(data)
        f.flush()
        if fsync:
            os.fsync(f.fileno())


def test_clear_cache_drops_unsynced_writes_and_keeps_synced_ones(tmp_path: Path) -> None:
    assert BINARY is not None
    data = tmp_path / "node-1" / "data"
    data.mkdir(parents=True)
    (data / "before.txt").write_bytes(b"already there")  # moves under the mount
    mounts = LazyFsSet.mount(BINARY, {1: data}, tmp_path / "lazyfs")
    try:
        assert is_mounted(data)
        assert (data / "before.txt").read_bytes() == b"already there"
        _write(data / "synced", b"A" * 10_000, fsync=True)
        _write(data / "synced", b"B" * 5_000, fsync=False, mode="ab")
        _write(data / "unsynced", b"C" * 8_000, fsync=False)
        assert (data / "synced").stat().st_size == 15_000
        mounts.clear_cache(1)
        assert (data / "synced").read_bytes() == b"A" * 10_000
        assert (data / "unsynced").read_bytes() == b""  # created, its data never fsynced
        mounts.clear_cache(1)  # twice: each request is confirmed
        assert mounts.mounts[1].clears == 2
    finally:
        problems = mounts.unmount_all()
    assert problems == []
    assert not is_mounted(data)
    assert mounts.mounts[1].process is not None
    assert mounts.mounts[1].process.poll() is not None  # the LazyFS process ended
    # What was fsynced is in the directory below the mount.
    root = tmp_path / "node-1" / "data.lazyfs-root"
    assert (root / "synced").read_bytes() == b"A" * 10_000
    assert (root / "before.txt").read_bytes() == b"already there"
