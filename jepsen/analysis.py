"""The Kafka checker's intermediate structures (kafka.clj step 1 and the indexes every later
step reads): per-key :class:`VersionOrder` s built from committed sends and all polls, the
writer and readers of each value, and the :class:`Analysis` that collects findings.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from jepsen.anomalies import CheckerOptions, Example
from jepsen.graph import DiGraph
from jepsen.history import History
from jepsen.ops import TXN_FS, Key, Op, Send, Value, sort_key


@dataclass
class VersionOrder:
    """The log of one key (kafka.clj ``version-orders``).

    ``log`` maps offsets to the values seen there; ``offsets`` are its sorted
    keys, and dense index ``i`` stands for ``offsets[i]``. ``by_index`` picks
    one value per index (the least, when an offset is inconsistent);
    ``by_value`` maps values to their (last) index.
    """

    log: dict[int, set[Value]]
    offsets: list[int] = field(default_factory=list)
    by_index: list[Value] = field(default_factory=list)
    by_value: dict[Value, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.offsets = sorted(self.log)
        self.by_index = [min(self.log[o], key=sort_key) for o in self.offsets]
        self.by_value = {v: i for i, v in enumerate(self.by_index)}

    def sorted_values(self, i: int) -> list[Value]:
        return sorted(self.log[self.offsets[i]], key=sort_key)

    def value_first_index(self) -> dict[Value, int]:
        """kafka.clj ``log->value->first-index``."""
        first: dict[Value, int] = {}
        for i in range(len(self.offsets)):
            for v in self.sorted_values(i):
                first.setdefault(v, i)
        return first

    def last_index_values(self) -> list[list[Value]]:
        """kafka.clj ``log->last-index->values``: index -> values last seen there."""
        last: dict[Value, int] = {}
        for i in range(len(self.offsets)):
            for v in self.sorted_values(i):
                last[v] = i
        out: list[list[Value]] = [[] for _ in self.offsets]
        for v, i in last.items():
            out[i].append(v)
        for vs in out:
            vs.sort(key=sort_key)
        return out


TypeMap: TypeAlias = dict[str, dict[Key, set[Value]]]


def by_type(ops: Iterable[Op], fs: frozenset[str], reads: bool) -> TypeMap:
    """Per completion type, the values each key got from ``ops`` of ``fs`` (reads or writes)."""
    out: TypeMap = {}
    for op in ops:
        if op.is_invoke or op.f not in fs:
            continue
        per_key = out.setdefault(op.type, {})
        for k, vs in (op.reads() if reads else op.writes()).items():
            per_key.setdefault(k, set()).update(vs)
    return out


def must_have_committed(reads_by_type: TypeMap, op: Op) -> bool:
    """kafka.clj ``must-have-committed?``: ``ok``, or ``info`` with a send that an
    ``ok`` operation read."""
    if op.is_ok:
        return True
    if not op.is_info:
        return False
    ok = reads_by_type.get("ok", {})
    return any(v in ok.get(k, ()) for k, vs in op.writes().items() for v in vs)


@dataclass
class Analysis:
    """Intermediate structures and raw findings (examples hold :class:`Op`s)."""

    history: History
    options: CheckerOptions
    ops: list[Op]
    reads_by_type: TypeMap
    writes_by_type: TypeMap
    version_orders: dict[Key, VersionOrder]
    writer_of: dict[Key, dict[Value, Op]]
    readers_of: dict[Key, dict[Value, list[Op]]]
    observations: dict[Key, dict[int, list[Op]]]
    graph: DiGraph
    explanations: dict[tuple[int, int], dict[str, dict[str, Any]]]
    errors: dict[str, list[Example]] = field(default_factory=dict)
    unseen: dict[str, Any] | None = None
    unknown_reasons: list[dict[str, Any]] = field(default_factory=list)
    subscribe: bool = False

    def add(self, name: str, examples: Sequence[Example]) -> None:
        if examples:
            self.errors.setdefault(name, []).extend(examples)


def build_version_orders(
    ops: Sequence[Op], rbt: TypeMap
) -> tuple[dict[Key, VersionOrder], list[Example], dict[Key, dict[int, list[Op]]]]:
    """kafka.clj ``version-orders``: logs from committed sends and all polls;
    an offset holding two values is an ``inconsistent-offsets`` error."""
    logs: dict[Key, dict[int, set[Value]]] = {}
    seen_by: dict[Key, dict[int, list[Op]]] = {}

    def note(k: Key, o: int, v: Value, op: Op) -> None:
        logs.setdefault(k, {}).setdefault(o, set()).add(v)
        ops_at = seen_by.setdefault(k, {}).setdefault(o, [])
        if not ops_at or ops_at[-1] is not op:
            ops_at.append(op)

    for op in ops:
        if op.is_invoke or op.f not in TXN_FS:
            continue
        committed = must_have_committed(rbt, op)
        for m in op.mops:
            if isinstance(m, Send):
                if committed and m.offset is not None:
                    note(m.key, m.offset, m.value, op)
            elif m.reads is not None:
                for k, pairs in m.reads.items():
                    for o, v in pairs:
                        if o is not None:
                            note(k, o, v, op)
    orders = {k: VersionOrder(log) for k, log in logs.items()}
    errors: list[Example] = []
    for k in sorted(orders):
        vo = orders[k]
        for i, o in enumerate(vo.offsets):
            if len(vo.log[o]) > 1:
                errors.append(
                    {
                        "key": k,
                        "offset": o,
                        "index": i,
                        "values": vo.sorted_values(i),
                        "ops": seen_by[k][o][:8],
                    }
                )
    return orders, errors, seen_by


def writers_by_value(ops: Sequence[Op]) -> dict[Key, dict[Value, Op]]:
    """kafka.clj ``writer-of``: key -> value -> the completion that sent it."""
    out: dict[Key, dict[Value, Op]] = {}
    for op in ops:
        if op.is_invoke:
            continue
        for k, vs in op.writes().items():
            for v in vs:
                out.setdefault(k, {})[v] = op
    return out


def readers_by_value(ops: Sequence[Op]) -> dict[Key, dict[Value, list[Op]]]:
    """kafka.clj ``readers-of``: key -> value -> completions that polled it."""
    out: dict[Key, dict[Value, list[Op]]] = {}
    for op in ops:
        if op.is_invoke:
            continue
        for k, vs in op.reads().items():
            for v in vs:
                readers = out.setdefault(k, {}).setdefault(v, [])
                if not readers or readers[-1] is not op:
                    readers.append(op)
    return out
