"""What librdkafka's own debug lines (``--client-debug``, the run's ``clients.log``) say about
records the checker cannot place.

librdkafka reports a record as delivered without an offset when it *infers* delivery: a later
batch of the same producer and partition succeeded while this one had failed with an unknown
outcome, so it "implicitly acks" it (``IMPLICITACK``). If the broker accepted the later batch
without the earlier one (a producer it had no state for, KIP-360), those records are in no
log. The stream check calls them ``unseen-acked-without-offset``; this module finds the client's
lines for them, so a run's results say where the acknowledgement came from. Pure text parsing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

__all__ = ["EXAMPLES_MAX", "implicit_acks", "implicit_acks_in"]

EXAMPLES_MAX: Final = 10
_IMPLICIT: Final = re.compile(
    r"^(?P<time>\S+ \S+) IMPLICITACK \[(?P<client>[^\]]+)\].*?: (?P<topic>\S+) "
    r"\[(?P<partition>\d+)\] (?P<count>\d+) message\(s\) implicitly acked .*?"
    r"\(msgids (?P<first>\d+)\.\.(?P<last>\d+)")


def implicit_acks(lines: Iterable[str]) -> dict[str, Any]:
    """``{"messages": total, "events": n, "examples": [...]}`` for the IMPLICITACK lines."""
    messages = events = 0
    examples: list[dict[str, Any]] = []
    for line in lines:
        match = _IMPLICIT.match(line)
        if match is None:
            continue
        events += 1
        messages += int(match["count"])
        if len(examples) < EXAMPLES_MAX:
            examples.append({"time": match["time"], "client": match["client"],
                             "topic": match["topic"], "partition": int(match["partition"]),
                             "messages": int(match["count"]),
                             "msgids": [int(match["first"]), int(match["last"])]})
    return {"messages": messages, "events": events, "examples": examples}


def implicit_acks_in(path: Path) -> dict[str, Any] | None:
    """``implicit_acks`` of a ``clients.log``; None if there is none or it names none."""
    if not path.exists():
        return None
    with path.open(encoding="utf-8", errors="replace") as lines:
        found = implicit_acks(lines)
    return found if found["events"] else None
