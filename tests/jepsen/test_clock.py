"""The node clock hook used by the clock nemesis (raftlog.clock): a process started with
RAFTLOG_CLOCK_OFFSET_FILE follows the offset written in that file, at run time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import time, trio
from pathlib import Path
from raftlog import clock
real = clock._real_time
async def main():
    async with trio.open_nursery() as n:
        n.start_soon(clock.follow_offset_file)
        await trio.sleep(0.5)
        print(round(time.time() - real()))
        Path(__import__("sys").argv[1]).write_text("-30")
        await trio.sleep(0.5)
        print(round(time.time() - real()), round(time.time_ns() / 1e9 - real()))
        n.cancel_scope.cancel()
trio.run(main)
"""


def test_clock_offset_follows_the_file(tmp_path: Path) -> None:
    offset_file = tmp_path / "clock-offset"
    offset_file.write_text("120.0\n")
    env = {**os.environ, "RAFTLOG_CLOCK_OFFSET_FILE": str(offset_file)}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(offset_file)], env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.split() == ["120", "-30", "-30"]


def test_without_the_variable_nothing_is_patched() -> None:
    script = ("import time, trio\nfrom raftlog import clock\n"
              "trio.run(clock.follow_offset_file)\nprint(time.time is clock._real_time)")
    env = {k: v for k, v in os.environ.items() if k != "RAFTLOG_CLOCK_OFFSET_FILE"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert out.strip() == "True"


def test_steady_wall_clock_moves_only_with_the_monotonic_clock() -> None:
    from raftlog.clock import SteadyWallClock

    wall = [1_700_000_000.0]
    mono = [50.0]
    clock = SteadyWallClock(wall_s=lambda: wall[0], monotonic_s=lambda: mono[0])
    assert clock.now_ms() == 1_700_000_000_000
    wall[0] += 3600  # a stepped wall clock changes nothing
    assert clock.now_ms() == 1_700_000_000_000
    mono[0] += 1.5
    assert clock.now_ms() == 1_700_000_001_500
