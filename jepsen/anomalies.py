"""What the Kafka checker can find and which findings a history may have: the anomaly names
(in kafka.clj's order), the cycle anomalies with the relationships each allows and requires,
the :class:`CheckerOptions`, and kafka.clj's ``allowed-error-types``. See
:mod:`jepsen.checker` for the analysis as a whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

from jepsen.graph import PROCESS, REALTIME, WR, WW

Validity: TypeAlias = bool | Literal["unknown"]
Example: TypeAlias = dict[str, Any]

#: Cycle anomalies in search order, with (allowed relationships, required
#: relationship sets), after elle.txn's ``cycle-anomaly-specs``.
CYCLE_SPECS: Final[dict[str, tuple[int, tuple[int, ...]]]] = {
    "G0": (WW, ()),
    "G1c": (WW | WR, (WR,)),
    "G0-process": (WW | PROCESS, (PROCESS,)),
    "G1c-process": (WW | WR | PROCESS, (WR, PROCESS)),
    "G0-realtime": (WW | REALTIME, (REALTIME,)),
    "G1c-realtime": (WW | WR | REALTIME, (WR, REALTIME)),
}
CYCLE_TYPES: Final = tuple(CYCLE_SPECS)

#: Once a cycle of one type is found in a component, these are not searched
#: for there (transitive closure of elle.consistency-model's implications).
IMPLIED: Final[dict[str, frozenset[str]]] = {
    "G0": frozenset({"G1c", "G0-process", "G1c-process", "G0-realtime", "G1c-realtime"}),
    "G1c": frozenset({"G1c-process", "G1c-realtime"}),
    "G0-process": frozenset({"G1c-process", "G0-realtime", "G1c-realtime"}),
    "G1c-process": frozenset({"G1c-realtime"}),
    "G0-realtime": frozenset({"G1c-realtime"}),
    "G1c-realtime": frozenset(),
}

#: Every anomaly name this checker can report, in kafka.clj's order.
ANOMALY_TYPES: Final = (
    "duplicate",
    "int-poll-skip",
    "int-nonmonotonic-poll",
    "int-nonmonotonic-send",
    "int-send-skip",
    "inconsistent-offsets",
    "precommitted-read",
    "G1a",
    "lost-write",
    "nonmonotonic-poll",
    "nonmonotonic-send",
    "poll-skip",
    "unseen",
    "unexpected",
    *CYCLE_TYPES,
)

#: kafka.clj ``allowed-error-types``: allowed whatever the options.
ALWAYS_ALLOWED: Final = frozenset({"int-send-skip", "G0", "G0-process", "G0-realtime"})


@dataclass(frozen=True)
class CheckerOptions:
    """Options of :func:`check`.

    ``ww_deps``: infer write-write edges from offsets (Jepsen ``--ww-deps``,
    default on); also allows the ``G1c`` family. ``sub_via``: how consumers
    got their partitions (``{"assign"}``, ``{"subscribe"}`` or both); ``None``
    infers it from the history (any completed ``subscribe``). ``strict_unseen``:
    any unseen message is invalid, as in kafka.clj. ``allowed``: extra anomaly
    names to tolerate (Jepsen's ``--ignore-queue-errors``). ``max_examples``:
    examples kept per anomaly. ``cycle_search_budget``: BFS states per cycle
    search before giving up with ``"unknown"``.
    """

    ww_deps: bool = True
    sub_via: frozenset[str] | None = None
    strict_unseen: bool = False
    allowed: frozenset[str] = frozenset()
    max_examples: int = 32
    cycle_search_budget: int = 1_000_000


def allowed_anomaly_types(*, subscribe: bool, ww_deps: bool) -> frozenset[str]:
    """kafka.clj ``allowed-error-types``."""
    allowed = set(ALWAYS_ALLOWED)
    if subscribe:
        allowed |= {"poll-skip", "nonmonotonic-poll"}
    if ww_deps:
        allowed |= {"G1c", "G1c-process", "G1c-realtime"}
    return frozenset(allowed)
