"""The pure parts of the power-loss nemesis: fault planning, victims, the order of kill and
clear-cache, LazyFS's config and command lines, and the mount table parsing that finds the
mounts of a dead harness."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from jepsen.faults_power import (
    POWER_LOSS,
    POWER_TARGETS,
    apply_power_loss,
    power_victims,
    wants_power_loss,
)
from jepsen.lazyfs import (
    CLEAR_CACHE,
    FSNAME_PREFIX,
    MountEntry,
    config_text,
    find_binary,
    mount_command,
    parse_mountinfo,
    stale_mounts,
    unmount_commands,
)
from jepsen.nemesis import parse_kinds, plan


def test_parse_kinds_with_power_loss() -> None:
    assert parse_kinds("power-loss", True) == (POWER_LOSS,)
    assert parse_kinds("kill,power-loss", False) == ("kill", POWER_LOSS)
    # `all` means the same on every machine: power loss is named explicitly.
    assert POWER_LOSS not in parse_kinds("all", True)
    assert wants_power_loss("kill, power-loss") and not wants_power_loss("all")


def test_plan_gives_power_loss_faults_a_power_target() -> None:
    steps = plan((POWER_LOSS,), random.Random(3), 120.0, 4.0)
    faults = [f for s in steps for f in s.faults]
    assert faults and all(f.kind == POWER_LOSS for f in faults)
    assert {f.target for f in faults} <= set(POWER_TARGETS)
    assert len({f.target for f in faults}) >= 3  # the targets vary
    assert faults[0].describe() == {"kind": POWER_LOSS, "target": faults[0].target}


@pytest.mark.parametrize(("target", "count3", "count5"),
                         [("one", 1, 1), ("minority", 1, 2), ("majority", 2, 3), ("all", 3, 5)])
def test_power_victims(target: str, count3: int, count5: int) -> None:
    for nodes, count in (([1, 2, 3], count3), ([1, 2, 3, 4, 5], count5)):
        victims = power_victims(target, nodes, random.Random(7))
        assert len(victims) == count and victims == sorted(set(victims))
        assert set(victims) <= set(nodes)
    with pytest.raises(ValueError, match="unknown power-loss target"):
        power_victims("rack", [1, 2, 3], random.Random(1))


def test_power_loss_kills_every_victim_before_clearing_any_cache() -> None:
    events: list[tuple[str, int]] = []

    def clear(n: int) -> None:
        events.append(("clear", n))
        if n == 2:
            raise OSError("fifo gone")

    done = apply_power_loss([1, 2, 3], lambda n: events.append(("kill", n)), clear)
    assert events == [("kill", 1), ("kill", 2), ("kill", 3),
                      ("clear", 1), ("clear", 2), ("clear", 3)]
    # A cache that could not be cleared is recorded, the others are still cleared.
    assert done == {"nodes": [1, 2, 3], "cleared": [1, 3],
                    "errors": {"2": "OSError: fifo gone"}}


def test_config_text_never_writes_back_without_fsync(tmp_path: Path) -> None:
    text = config_text(tmp_path / "f.fifo", tmp_path / "done.fifo", tmp_path / "lazyfs.log")
    assert f'fifo_path="{tmp_path / "f.fifo"}"' in text
    assert f'fifo_path_completed="{tmp_path / "done.fifo"}"' in text
    assert "apply_eviction=false" in text
    assert '[cache.simple]\ncustom_size="512mb"' in text
    assert CLEAR_CACHE == "lazyfs::clear-cache"


def test_mount_and_unmount_commands() -> None:
    command = mount_command(Path("/b/lazyfs"), Path("/r/node-1/data"),
                            Path("/r/node-1/data.lazyfs-root"), "lazyfs.toml",
                            f"{FSNAME_PREFIX}42")
    assert command == ["/b/lazyfs", "/r/node-1/data", "--config-path", "lazyfs.toml",
                       "-o", "allow_other,modules=subdir,subdir=/r/node-1/data.lazyfs-root,"
                       "fsname=jepsen-lazyfs-42", "-f"]
    assert len(command) <= 10  # LazyFS's main keeps at most 10 arguments
    assert unmount_commands(Path("/m")) == [["fusermount3", "-u", "/m"],
                                            ["fusermount3", "-uz", "/m"]]


MOUNTINFO = (
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
    "90 22 0:50 / /tmp/store/q\\040x/node-1/data rw,nosuid,nodev shared:40 - fuse.lazyfs "
    "jepsen-lazyfs-100 rw,user_id=0,group_id=0,allow_other\n"
    "91 22 0:51 / /tmp/store/q/node-2/data rw shared:41 - fuse.lazyfs jepsen-lazyfs-200 rw\n"
    "92 22 0:52 / /mnt/other rw shared:42 - fuse.bindfs bindfs rw\n"
    "garbage line\n"
)


def test_parse_mountinfo_and_find_the_mounts_of_a_dead_harness() -> None:
    entries = parse_mountinfo(MOUNTINFO)
    assert entries[0] == MountEntry("/", "ext4", "/dev/vda")
    assert entries[1] == MountEntry("/tmp/store/q x/node-1/data", "fuse.lazyfs",
                                    "jepsen-lazyfs-100")
    assert len(entries) == 4
    assert stale_mounts(entries, lambda pid: pid == 200) == ["/tmp/store/q x/node-1/data"]
    assert stale_mounts(entries, lambda pid: True) == []


def test_find_binary(tmp_path: Path) -> None:
    binary = tmp_path / "lazyfs"
    assert find_binary({"RAFTLOG_LAZYFS": str(binary)}) is None
    binary.write_text("#!/bin/sh\n")
    assert find_binary({"RAFTLOG_LAZYFS": str(binary)}) is None  # not executable
    binary.chmod(0o755)
    assert find_binary({"RAFTLOG_LAZYFS": str(binary)}) == binary
    built = tmp_path / "prefix" / "src/lazyfs/build/lazyfs"
    built.parent.mkdir(parents=True)
    built.write_text("")
    built.chmod(0o755)
    assert find_binary({}, prefix=tmp_path / "prefix") == built
