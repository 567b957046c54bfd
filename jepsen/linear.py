"""A small linearizability checker (Wing & Gong's search with Lowe's memoisation, as in
Knossos's ``wgl`` and porcupine), pure and independent of any I/O.

A history is a list of :class:`Call`: invocation and completion times, the operation and
argument, and the result, or ``None`` for an indeterminate (``info``) call, which may take
effect at any point after its invocation, or never. ``fail`` calls had no effect and are left
out by the caller. The search linearizes calls one at a time: a call may go next only if it
was invoked before every pending *definite* call completed; a definite call's result must
match the model's. Visited ``(set of linearized calls, model state)`` pairs are remembered,
so each configuration is explored once. The history is linearizable when every definite call
can be placed.

Checking each key (here: each topic) on its own is sound because linearizability is local
(Herlihy & Wing): a history is linearizable iff each object's sub-history is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Final

State = Hashable
Model = Callable[[State, str, Any], tuple[State, Any]]
SEARCH_BUDGET: Final = 2_000_000


@dataclass(frozen=True)
class Call:
    """One operation: ``result is None`` means indeterminate (``info``)."""

    id: int
    invoke_time: float
    complete_time: float  # math.inf for indeterminate calls
    f: str
    arg: Any
    result: Any

    @property
    def definite(self) -> bool:
        return self.result is not None


@dataclass(frozen=True)
class Verdict:
    valid: bool | None  # None: the search ran out of budget
    linearization: tuple[int, ...]  # a full one when valid, else the longest found
    stuck: tuple[int, ...]  # definite calls that could not be placed after that prefix
    explored: int


def check_linearizable(calls: Sequence[Call], model: Model, initial: State,
                       budget: int = SEARCH_BUDGET) -> Verdict:
    calls = sorted(calls, key=lambda c: (c.invoke_time, c.id))
    n = len(calls)
    definite_mask = 0
    for i, c in enumerate(calls):
        if c.definite:
            definite_mask |= 1 << i
    seen: set[tuple[int, State]] = set()
    best: tuple[int, ...] = ()
    explored = 0
    # Iterative DFS: stack of (mask, state, path).
    stack: list[tuple[int, State, tuple[int, ...]]] = [(0, initial, ())]
    while stack:
        mask, state, path = stack.pop()
        if mask & definite_mask == definite_mask:
            return Verdict(True, tuple(calls[i].id for i in path), (), explored)
        if (mask, state) in seen:
            continue
        seen.add((mask, state))
        explored += 1
        if explored > budget:
            return Verdict(None, tuple(calls[i].id for i in best), (), explored)
        if len(path) > len(best):
            best = path
        horizon = min((calls[i].complete_time for i in range(n)
                       if definite_mask >> i & 1 and not mask >> i & 1), default=math.inf)
        for i in range(n - 1, -1, -1):
            c = calls[i]
            if mask >> i & 1 or c.invoke_time > horizon:
                continue
            new_state, result = model(state, c.f, c.arg)
            if c.definite and result != c.result:
                continue
            stack.append((mask | 1 << i, new_state, (*path, i)))
    placed = 0
    for i in best:
        placed |= 1 << i
    stuck = tuple(calls[i].id for i in range(n) if definite_mask >> i & 1 and not placed >> i & 1)
    return Verdict(False, tuple(calls[i].id for i in best), stuck[:5], explored)


def topic_model(state: State, f: str, arg: Any) -> tuple[State, Any]:
    """One topic's partition count, or ``None`` when it does not exist.

    ``create n`` -> ``ok`` (now n partitions) or ``exists``; ``delete`` -> ``ok`` or
    ``unknown``; ``add-partitions n`` -> ``ok`` (now n), ``invalid`` (n is not more than
    now) or ``unknown``.
    """
    if f == "create":
        return (arg, "ok") if state is None else (state, "exists")
    if f == "delete":
        return (None, "unknown") if state is None else (None, "ok")
    if f == "add-partitions":
        if state is None:
            return None, "unknown"
        assert isinstance(state, int)
        return (state, "invalid") if arg <= state else (arg, "ok")
    raise ValueError(f"unknown topic operation {f!r}")
