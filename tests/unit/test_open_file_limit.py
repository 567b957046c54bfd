"""The node lifts its open-file limit: one fd per segment and per connection."""

from __future__ import annotations

import subprocess
import sys

from raftlog.node import OPEN_FILES_WANTED

PROBE = """
import resource
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 4096))
from raftlog.node import _raise_open_file_limit
_raise_open_file_limit()
print(*resource.getrlimit(resource.RLIMIT_NOFILE))
"""


# Whether this process may raise a hard limit (CAP_SYS_RESOURCE: not every root has it).
MAY_RAISE = """
import resource
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 4096))
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (8192, 8192))
except ValueError:
    print("no")
else:
    print("yes")
"""


def run_python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def test_the_soft_limit_goes_to_the_hard_one_and_the_hard_one_up_where_permitted() -> None:
    # A 20,000-fd hard limit ran out at 10,000 partitions (two fds per segment then):
    # a process with CAP_SYS_RESOURCE raises it, any other gets the hard limit it has.
    expected = OPEN_FILES_WANTED if run_python(MAY_RAISE) == "yes" else 4096
    assert [int(value) for value in run_python(PROBE).split()] == [expected, expected]
