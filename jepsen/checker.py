"""A Python port of Jepsen's Kafka checker (``jepsen.tests.kafka``).

This follows ``jepsen/src/jepsen/tests/kafka.clj`` (jepsen-io/jepsen, HEAD
``c4c7473d``) and the cycle classification of Elle (``elle.txn``); function
docstrings name the Clojure function they follow. The code is our own: only
the semantics carry over.

Entry points: :func:`check` (history in, JSON-ready result dict out),
:func:`analyze` (the intermediate structures, with :class:`~jepsen.history.Op`
objects in the examples, for tests) and :func:`check_file` /
``python -m jepsen.checker history.jsonl [results.json]``.

The analysis (the numbered steps of kafka.clj's docstring):

1. **Version orders** per key from the offsets of sends whose writer must have
   committed and of *all* polls (``ok``, ``info`` and ``fail`` alike: a
   read-committed consumer must return only safe data whether or not its
   transaction commits). Offsets may be sparse (transaction markers take up
   offsets), so each key gets dense *indices*.
2. **Single-key checks**: ``inconsistent-offsets``, ``duplicate``, ``G1a``,
   ``lost-write``, ``unseen`` (plus ``unexpected``, see below).
3. **Order checks** per process and inside one operation: ``poll-skip``,
   ``nonmonotonic-poll``, ``nonmonotonic-send`` and the ``int-*`` variants.
4. **Dependency graph** over send/poll/txn completions: ``ww`` (with
   ``ww_deps``), ``wr``, ``process`` and ``realtime`` edges; cycles are
   classified as ``G0``/``G1c`` with ``-process``/``-realtime`` variants.
5. ``precommitted-read``.

Validity follows kafka.clj's ``allowed-error-types``: ``int-send-skip`` and
the ``G0`` family are always allowed (Kafka transactions have no write
isolation); ``poll-skip`` and ``nonmonotonic-poll`` are allowed when consumers
``subscribe`` (rebalances move them); the ``G1c`` family is allowed with
``ww_deps`` (the default, as in Jepsen's Redpanda suite), because without
write isolation ``T1 <ww T2 <wr T1`` is expected. Every other anomaly makes
the history invalid.

Deliberate differences from kafka.clj, each documented where it happens:

* ``unexpected``: a polled value that no operation ever sent. kafka.clj
  throws (``:no-writer-of-value``); we report it as an illegal anomaly.
* ``unseen`` is split into *covered* messages (some ``ok`` poll of the key
  reached or passed the message's offset) and *uncovered* ones (no poll got
  that far, so "lost" and "late" cannot be told apart). Covered unseen
  messages make the history invalid; uncovered ones make it ``"unknown"``
  unless ``strict_unseen=True``, which restores kafka.clj's rule (any
  unseen message is invalid).
* ``valid`` is ``"unknown"`` when nothing can be judged (no ``ok``
  send/poll/txn at all; Elle's ``:empty-transaction-graph``) or a cycle
  search ran out of budget (Elle's ``:cycle-search-timeout``).
* An ``assign`` with ``seek_to_beginning`` forgets the process's positions
  (kafka.clj keeps them; its final polls always follow a client crash, so
  the case does not arise there).
* A poll result listing a key with no records does not count as a read of
  that key for ``poll-skip``/``nonmonotonic-poll``.
* ``inconsistent-offsets`` and ``duplicate`` examples also name the
  operations that saw the offset or value.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, TypeAlias

from jepsen.graph import (
    PROCESS,
    REALTIME,
    WR,
    WW,
    CycleSearchTimeout,
    DiGraph,
    find_cycle,
    rel_names,
    strongly_connected_components,
)
from jepsen.history import (
    READ_FS,
    SUBSCRIPTION_FS,
    TXN_FS,
    WRITE_FS,
    History,
    Key,
    Op,
    Process,
    Send,
    Value,
    jsonable,
    read_jsonl,
    sort_key,
)

__all__ = [
    "ALWAYS_ALLOWED",
    "ANOMALY_TYPES",
    "CYCLE_TYPES",
    "Analysis",
    "CheckerOptions",
    "Validity",
    "VersionOrder",
    "allowed_anomaly_types",
    "analyze",
    "check",
    "check_file",
    "main",
]

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
_IMPLIED: Final[dict[str, frozenset[str]]] = {
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


# -- version orders -------------------------------------------------------------


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


def _by_type(ops: Iterable[Op], fs: frozenset[str], reads: bool) -> TypeMap:
    out: TypeMap = {}
    for op in ops:
        if op.is_invoke or op.f not in fs:
            continue
        per_key = out.setdefault(op.type, {})
        for k, vs in (op.reads() if reads else op.writes()).items():
            per_key.setdefault(k, set()).update(vs)
    return out


def _must_have_committed(reads_by_type: TypeMap, op: Op) -> bool:
    """kafka.clj ``must-have-committed?``: ``ok``, or ``info`` with a send that an
    ``ok`` operation read."""
    if op.is_ok:
        return True
    if not op.is_info:
        return False
    ok = reads_by_type.get("ok", {})
    return any(v in ok.get(k, ()) for k, vs in op.writes().items() for v in vs)


# -- the analysis -----------------------------------------------------------------


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


def _version_orders(
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
        committed = _must_have_committed(rbt, op)
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


def _writer_of(ops: Sequence[Op]) -> dict[Key, dict[Value, Op]]:
    """kafka.clj ``writer-of``: key -> value -> the completion that sent it."""
    out: dict[Key, dict[Value, Op]] = {}
    for op in ops:
        if op.is_invoke:
            continue
        for k, vs in op.writes().items():
            for v in vs:
                out.setdefault(k, {})[v] = op
    return out


def _readers_of(ops: Sequence[Op]) -> dict[Key, dict[Value, list[Op]]]:
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


def _duplicates(a: Analysis) -> list[Example]:
    """kafka.clj ``duplicate-cases``: one value at more than one offset of a key."""
    out: list[Example] = []
    for k in sorted(a.version_orders):
        vo = a.version_orders[k]
        counts: Counter[Value] = Counter()
        for o in vo.offsets:
            counts.update(vo.log[o])
        for v in sorted(counts, key=sort_key):
            if counts[v] > 1:
                offsets = [o for o in vo.offsets if v in vo.log[o]]
                ops: list[Op] = []
                for o in offsets:
                    for op in a.observations[k][o]:
                        if (v in op.reads().get(k, ()) or v in op.writes().get(k, ())) and all(
                            op is not x for x in ops
                        ):
                            ops.append(op)
                out.append(
                    {"key": k, "value": v, "count": counts[v], "offsets": offsets, "ops": ops[:8]}
                )
    return out


def _g1a(a: Analysis) -> list[Example]:
    """kafka.clj ``g1a-cases``: an ``ok`` poll/txn read a value whose send ``fail``ed."""
    failed = a.writes_by_type.get("fail", {})
    out: list[Example] = []
    for op in a.ops:
        if not op.is_ok or op.f not in READ_FS:
            continue
        for k, vs in op.reads().items():
            for v in dict.fromkeys(vs):
                if v in failed.get(k, ()):
                    out.append(
                        {"key": k, "value": v, "writer": a.writer_of[k].get(v), "reader": op}
                    )
    return out


def _precommitted_reads(a: Analysis) -> list[Example]:
    """kafka.clj ``precommitted-read-cases``: an operation polled a value it sent
    itself (consumers must never see uncommitted records). One example per op."""
    out: list[Example] = []
    for op in a.ops:
        if op.is_invoke:
            continue
        reads = op.reads()
        for k, ws in op.writes().items():
            bad = set(ws) & set(reads.get(k, ()))
            if bad:
                out.append({"op": op, "key": k, "value": min(bad, key=sort_key)})
                break
    return out


def _lost_writes(a: Analysis) -> list[Example]:
    """kafka.clj ``lost-write-cases``.

    For each key, the bound is the highest of the *first* indices of the values
    ``ok`` operations polled; every value whose *last* index is at or below the
    bound should have been polled. Those that were not, and whose writer must
    have committed, are lost. (The first/last split keeps inconsistent offsets
    and duplicates from hiding a loss.) Values nobody sent are skipped here;
    they are reported as ``unexpected``.
    """
    out: list[Example] = []
    ok_reads = a.reads_by_type.get("ok", {})
    for k in sorted(ok_reads):
        vs = ok_reads[k]
        vo = a.version_orders.get(k)
        if vo is None:
            continue
        first = vo.value_first_index()
        last = vo.last_index_values()
        bound = max((first[v] for v in vs if v in first), default=-1)
        if bound < 0:
            continue
        bound_value = max((v for v in vs if v in first), key=lambda v: (first[v], sort_key(v)))
        max_read = next((op for op in a.readers_of[k].get(bound_value, []) if op.is_ok), None)
        for i in range(bound + 1):
            for v in last[i]:
                if v in vs:
                    continue
                writer = a.writer_of.get(k, {}).get(v)
                if writer is None or not _must_have_committed(a.reads_by_type, writer):
                    continue
                out.append(
                    {
                        "key": k,
                        "value": v,
                        "index": first[v],
                        "offset": vo.offsets[first[v]],
                        "max_read_index": bound,
                        "max_read_offset": vo.offsets[bound],
                        "writer": writer,
                        "max_read": max_read,
                    }
                )
    return out


def _delta(vo: VersionOrder | None, v1: Value, v2: Value) -> tuple[int, int | None, int | None]:
    """Index distance from ``v1`` to ``v2``; 1 (no error) when either is unknown."""
    if vo is None:
        return 1, None, None
    i1 = vo.by_value.get(v1)
    i2 = vo.by_value.get(v2)
    if i1 is None or i2 is None:
        return 1, i1, i2
    return i2 - i1, i1, i2


def _internal_order(a: Analysis, sends: bool) -> tuple[list[Example], list[Example]]:
    """kafka.clj ``int-poll-skip+nonmonotonic-cases`` (``sends=False``) and
    ``int-send-skip+nonmonotonic-cases`` (``sends=True``).

    Inside one operation, successive values of a key (across all its poll, or
    all its send, micro-ops) must be adjacent in the version order: a gap over
    known indices is a skip, a step back or a repeat is nonmonotonic. For
    polls, keys in the operation's ``rebalance_log`` are exempt.
    """
    skips: list[Example] = []
    nonmono: list[Example] = []
    for op in a.ops:
        if op.is_invoke:
            continue
        exempt = frozenset() if sends else op.rebalance_keys()
        for k, vs in (op.writes() if sends else op.reads()).items():
            if k in exempt:
                continue
            vo = a.version_orders.get(k)
            for v1, v2 in itertools.pairwise(vs):
                delta, i1, i2 = _delta(vo, v1, v2)
                if delta > 1 and vo is not None and i1 is not None and i2 is not None:
                    skips.append(
                        {
                            "key": k,
                            "values": [v1, v2],
                            "delta": delta,
                            "skipped": vo.by_index[i1 + 1 : i2],
                            "op": op,
                        }
                    )
                elif delta < 1:
                    nonmono.append({"key": k, "values": [v1, v2], "delta": delta, "op": op})
    return skips, nonmono


def _client_processes(ops: Sequence[Op]) -> dict[Process, list[Op]]:
    out: dict[Process, list[Op]] = {}
    for op in ops:
        out.setdefault(op.process, []).append(op)
    return out


def _poll_order(a: Analysis) -> tuple[list[Example], list[Example]]:
    """kafka.clj ``poll-skip+nonmonotonic-cases``.

    Per process, the first value an operation polls from a key must directly
    follow the last value the process's previous ``ok`` poll of that key
    returned (``fail``/``info`` polls are checked but do not move the
    position: an aborted transaction rewinds its consumer). A gap over known
    indices is a ``poll-skip``; going back or repeating is a
    ``nonmonotonic-poll``. A completed ``assign``/``subscribe`` keeps only the
    positions of keys it still names (all are forgotten on
    ``seek_to_beginning``).
    """
    skips: list[Example] = []
    nonmono: list[Example] = []
    for ops in _client_processes(a.ops).values():
        last_reads: dict[Key, Op] = {}
        for op in ops:
            if op.is_invoke:
                continue
            if op.f in SUBSCRIPTION_FS:
                if op.is_ok or op.is_info:
                    keys = op.subscription_keys()
                    if op.seek_to_beginning:
                        last_reads = {}
                    else:
                        last_reads = {k: o for k, o in last_reads.items() if k in keys}
                continue
            if op.f not in READ_FS:
                continue
            reads = {k: vs for k, vs in op.reads().items() if vs}
            for k, vs in reads.items():
                prev = last_reads.get(k)
                if prev is None:
                    continue
                vo = a.version_orders.get(k)
                v1 = prev.reads()[k][-1]
                v2 = vs[0]
                delta, i1, i2 = _delta(vo, v1, v2)
                if delta > 1 and vo is not None and i1 is not None and i2 is not None:
                    skips.append(
                        {
                            "key": k,
                            "values": [v1, v2],
                            "delta": delta,
                            "skipped": vo.by_index[i1 + 1 : i2],
                            "ops": [prev, op],
                        }
                    )
                elif delta < 1:
                    nonmono.append(
                        {"key": k, "values": [v1, v2], "delta": delta, "ops": [prev, op]}
                    )
            if op.is_ok:
                for k in reads:
                    last_reads[k] = op
    return skips, nonmono


def _nonmonotonic_sends(a: Analysis) -> list[Example]:
    """kafka.clj ``nonmonotonic-send-cases``: per process, over ``ok``/``info``
    operations, the first value an operation sends to a key must not land at or
    before the last value the process's previous send to that key landed.
    (A completed ``assign``/``subscribe`` keeps only the keys it names, as in
    kafka.clj.)"""
    out: list[Example] = []
    for ops in _client_processes(a.ops).values():
        last_sends: dict[Key, Op] = {}
        for op in ops:
            if not (op.is_ok or op.is_info):
                continue
            if op.f in SUBSCRIPTION_FS:
                keys = op.subscription_keys()
                last_sends = {k: o for k, o in last_sends.items() if k in keys}
                continue
            if op.f not in WRITE_FS:
                continue
            writes = op.writes()
            for k, vs in writes.items():
                prev = last_sends.get(k)
                if prev is None:
                    continue
                v1 = prev.writes()[k][-1]
                delta, _, _ = _delta(a.version_orders.get(k), v1, vs[0])
                if delta < 1:
                    out.append({"key": k, "values": [v1, vs[0]], "delta": delta, "ops": [prev, op]})
            for k in writes:
                last_sends[k] = op
    return out


def _unseen(a: Analysis) -> tuple[list[Example], dict[str, Any] | None]:
    """kafka.clj ``unseen``: values sent by ``ok`` operations that no ``ok``
    operation ever polled, as of the end of the history.

    Each message is *covered* when its offset is known and some ``ok`` poll of
    its key reached that offset or beyond, so a reader should have returned
    it; otherwise we cannot tell lost from late.
    """
    sent: dict[Key, dict[Value, Op]] = {}
    polled: dict[Key, set[Value]] = {}
    max_polled: dict[Key, int] = {}
    last_time: int | None = None
    for op in a.ops:
        if not op.is_ok or op.f not in TXN_FS:
            continue
        last_time = op.time
        for k, vs in op.writes().items():
            for v in vs:
                sent.setdefault(k, {})[v] = op
        for k, pairs in op.read_pairs().items():
            for o, v in pairs:
                polled.setdefault(k, set()).add(v)
                if o is not None:
                    max_polled[k] = max(max_polled.get(k, -1), o)
    examples: list[Example] = []
    counts: dict[Key, int] = {}
    for k in sorted(sent):
        seen = polled.get(k, set())
        for v, writer in sent[k].items():
            if v in seen:
                continue
            counts[k] = counts.get(k, 0) + 1
            offset = next((o for o, w in writer.write_pairs()[k] if w == v), None)
            top = max_polled.get(k)
            covered = offset is not None and top is not None and offset <= top
            examples.append(
                {
                    "key": k,
                    "value": v,
                    "offset": offset,
                    "max_polled_offset": top,
                    "covered": covered,
                    "writer": writer,
                }
            )
    if not examples:
        return [], None
    covered_n = sum(1 for e in examples if e["covered"])
    summary = {
        "time": last_time,
        "unseen": counts,
        "covered": covered_n,
        "uncovered": len(examples) - covered_n,
    }
    return examples, summary


def _unexpected(a: Analysis) -> list[Example]:
    """Polled values that no operation ever sent (kafka.clj throws
    ``:no-writer-of-value`` here; we report them)."""
    out: list[Example] = []
    for k in sorted(a.readers_of):
        writers = a.writer_of.get(k, {})
        for v in sorted(a.readers_of[k], key=sort_key):
            if v not in writers:
                readers = a.readers_of[k][v]
                out.append({"key": k, "value": v, "reader": readers[0], "readers": len(readers)})
    return out


# -- dependency graph and cycles ------------------------------------------------------


def _build_graph(
    a: Analysis,
) -> None:
    """kafka.clj ``ww-graph`` and ``wr-graph`` plus Elle's process and realtime
    graphs, over completions of send/poll/txn operations.

    * ``ww``: the writer of the value right before ``v2`` in the version order
      precedes the writer of ``v2`` (only with ``ww_deps``).
    * ``wr``: the writer of a value precedes every operation that polled it.
    * ``process``: successive ``ok`` operations of one process.
    * ``realtime``: an ``ok`` operation precedes every operation invoked after
      it completed (a transitive reduction, as Elle's ``realtime-graph``).
    """
    g = a.graph
    ex = a.explanations

    def link(x: Op, y: Op, rel: int, name: str, why: dict[str, Any]) -> None:
        if x is y:
            return
        g.link(x.index, y.index, rel)
        ex.setdefault((x.index, y.index), {}).setdefault(name, why)

    if a.options.ww_deps:
        for k in sorted(a.writer_of):
            vo = a.version_orders.get(k)
            if vo is None:
                continue
            for v2, op2 in a.writer_of[k].items():
                i2 = vo.by_value.get(v2)
                if i2 is None or i2 == 0:
                    continue
                v1 = vo.by_index[i2 - 1]
                op1 = a.writer_of[k].get(v1)
                if op1 is not None:
                    link(op1, op2, WW, "ww", {"key": k, "value": v1, "value'": v2})
    for k in sorted(a.readers_of):
        for v, readers in a.readers_of[k].items():
            writer = a.writer_of.get(k, {}).get(v)
            if writer is None:
                continue
            for r in readers:
                link(writer, r, WR, "wr", {"key": k, "value": v})

    txn_ops = [op for op in a.ops if op.f in TXN_FS]
    last_ok: dict[Process, Op] = {}
    for op in txn_ops:
        if op.is_ok:
            prev = last_ok.get(op.process)
            if prev is not None:
                link(prev, op, PROCESS, "process", {"process": op.process})
            last_ok[op.process] = op

    # Elle's realtime-graph: buffer completed oks; link each to the completion
    # of every later invocation; an ok drops from the buffer the oks it is
    # already known to follow.
    buffer: dict[int, Op] = {}
    rt_preds: dict[int, set[int]] = {}
    for op in txn_ops:
        if op.is_invoke:
            done = a.history.completion(op)
            if done is None:
                continue
            for b in buffer.values():
                link(
                    b,
                    done,
                    REALTIME,
                    "realtime",
                    {"completed": b.index, "invoked": op.index},
                )
                if b is not done:
                    rt_preds.setdefault(done.index, set()).add(b.index)
        elif op.is_ok:
            for i in rt_preds.get(op.index, ()):
                buffer.pop(i, None)
            buffer[op.index] = op


def _explain_cycle(a: Analysis, name: str, cycle: list[int], allowed: int) -> Example:
    steps: list[dict[str, Any]] = []
    for x, y in itertools.pairwise(cycle):
        rels = rel_names(a.graph.rels(x, y) & allowed)
        why = a.explanations.get((x, y), {})
        steps.append(
            {
                "from": x,
                "to": y,
                "type": rels[0],
                "rels": rels,
                "why": {r: why[r] for r in rels if r in why},
            }
        )
    return {
        "type": name,
        "cycle": [a.history.by_index(i) for i in cycle],
        "steps": steps,
    }


def _cycles(a: Analysis) -> None:
    """Elle's ``cycles``: per SCC of the whole graph, search each cycle type in
    order (``G0``, ``G1c``, then ``-process`` and ``-realtime`` variants),
    skipping types implied by one already found there.

    ``G0``: ``ww`` edges only. ``G1c``: ``ww``/``wr`` with at least one
    ``wr``. ``X-process``/``X-realtime``: X plus at least one
    ``process``/``realtime`` edge.
    """
    for comp in strongly_connected_components(a.graph):
        skip: set[str] = set()
        for name, (allowed, required) in CYCLE_SPECS.items():
            if name in skip:
                continue
            try:
                cycle = find_cycle(
                    a.graph, comp, allowed, required, budget=a.options.cycle_search_budget
                )
            except CycleSearchTimeout:
                a.unknown_reasons.append(
                    {"type": "cycle-search-timeout", "anomaly": name, "scc_size": len(comp)}
                )
                continue
            if cycle is not None:
                a.add(name, [_explain_cycle(a, name, cycle, allowed)])
                skip |= _IMPLIED[name]


# -- entry points --------------------------------------------------------------------


def analyze(
    history: History | Iterable[Op], options: CheckerOptions | None = None, **kw: Any
) -> Analysis:
    """Run every analysis; ``kw`` overrides fields of ``options``.

    Findings land in :attr:`Analysis.errors` with :class:`Op` objects in the
    examples; :func:`check` renders them.
    """
    opts = options or CheckerOptions()
    if kw:
        opts = CheckerOptions(**{**opts.__dict__, **kw})
    h = history if isinstance(history, History) else History(history)
    ops = h.client_ops()
    rbt = _by_type(ops, READ_FS, reads=True)
    wbt = _by_type(ops, WRITE_FS, reads=False)
    orders, vo_errors, observations = _version_orders(ops, rbt)
    if opts.sub_via is not None:
        subscribe = "subscribe" in opts.sub_via
    else:
        subscribe = any(op.f == "subscribe" and (op.is_ok or op.is_info) for op in ops)
    a = Analysis(
        history=h,
        options=opts,
        ops=ops,
        reads_by_type=rbt,
        writes_by_type=wbt,
        version_orders=orders,
        writer_of=_writer_of(ops),
        readers_of=_readers_of(ops),
        observations=observations,
        graph=DiGraph(),
        explanations={},
        subscribe=subscribe,
    )
    a.add("duplicate", _duplicates(a))
    int_poll_skip, int_nm_poll = _internal_order(a, sends=False)
    int_send_skip, int_nm_send = _internal_order(a, sends=True)
    a.add("int-poll-skip", int_poll_skip)
    a.add("int-nonmonotonic-poll", int_nm_poll)
    a.add("int-nonmonotonic-send", int_nm_send)
    a.add("int-send-skip", int_send_skip)
    a.add("inconsistent-offsets", vo_errors)
    a.add("precommitted-read", _precommitted_reads(a))
    a.add("G1a", _g1a(a))
    a.add("lost-write", _lost_writes(a))
    poll_skip, nm_poll = _poll_order(a)
    a.add("nonmonotonic-poll", nm_poll)
    a.add("nonmonotonic-send", _nonmonotonic_sends(a))
    a.add("poll-skip", poll_skip)
    unseen, a.unseen = _unseen(a)
    a.add("unseen", unseen)
    a.add("unexpected", _unexpected(a))
    _build_graph(a)
    _cycles(a)
    if not any(op.is_ok and op.f in TXN_FS for op in ops):
        a.unknown_reasons.append({"type": "empty-transaction-graph"})
    return a


def _render(x: Any) -> Any:
    if isinstance(x, Op):
        return x.to_dict()
    if isinstance(x, Mapping):
        return {str(k): _render(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_render(v) for v in x]
    return jsonable(x)


_SORTS: Final[dict[str, tuple[str, bool]]] = {
    # kafka.clj condense-error: (field, descending)
    "duplicate": ("count", True),
    "inconsistent-offsets": ("values", True),
    "int-nonmonotonic-poll": ("delta", False),
    "int-nonmonotonic-send": ("delta", False),
    "nonmonotonic-poll": ("delta", False),
    "nonmonotonic-send": ("delta", False),
    "int-poll-skip": ("delta", True),
    "int-send-skip": ("delta", True),
    "poll-skip": ("delta", True),
}


def _condense(name: str, examples: list[Example], limit: int) -> list[Example]:
    if name in _SORTS:
        fld, desc = _SORTS[name]

        def key(e: Example) -> int:
            x = e[fld]
            return len(x) if isinstance(x, list) else int(x)

        examples = sorted(examples, key=key, reverse=desc)
    elif name in CYCLE_SPECS:
        examples = sorted(examples, key=lambda e: len(e["cycle"]))
    elif name == "unseen":
        examples = sorted(examples, key=lambda e: not e["covered"])
    return examples[:limit]


def _stats(a: Analysis) -> dict[str, Any]:
    by_f: dict[str, dict[str, int]] = {}
    for op in a.ops:
        row = by_f.setdefault(op.f, {"invoke": 0, "ok": 0, "fail": 0, "info": 0})
        row[op.type] += 1
    acked = {(k, v) for k, vs in a.writes_by_type.get("ok", {}).items() for v in vs}
    indeterminate = {(k, v) for k, vs in a.writes_by_type.get("info", {}).items() for v in vs}
    failed = {(k, v) for k, vs in a.writes_by_type.get("fail", {}).items() for v in vs}
    observed = {(k, v) for k, d in a.readers_of.items() for v in d}
    rels = Counter(name for _, _, r in a.graph.edges() for name in rel_names(r))
    causes = []
    for op in a.ops:
        if op.is_info and op.f in TXN_FS and op.error is not None and op.error not in causes:
            causes.append(op.error)
    return {
        "ops": len(a.history),
        "client_ops": len(a.ops),
        "nemesis_ops": len(a.history) - len(a.ops),
        "by_f": by_f,
        "keys": len(a.version_orders),
        "max_offsets": {k: vo.offsets[-1] for k, vo in sorted(a.version_orders.items())},
        "queue": {
            "acknowledged": len(acked),
            "indeterminate": len(indeterminate),
            "failed": len(failed),
            "observed": len(observed),
            "acknowledged_unobserved": len(acked - observed),
            "recovered": len(indeterminate & observed),
        },
        "graph": {"nodes": len(a.graph), "edges": dict(sorted(rels.items()))},
        "subscribe": a.subscribe,
        "ww_deps": a.options.ww_deps,
        "info_txn_causes": causes[:32],
    }


def result(a: Analysis) -> dict[str, Any]:
    """Render an :class:`Analysis` into the ``results.json`` document."""
    opts = a.options
    allowed = allowed_anomaly_types(subscribe=a.subscribe, ww_deps=opts.ww_deps) | opts.allowed
    present = [n for n in ANOMALY_TYPES if n in a.errors]
    bad: list[str] = []
    unknown = list(a.unknown_reasons)
    for n in present:
        if n in allowed:
            continue
        if n == "unseen" and not opts.strict_unseen and a.unseen and not a.unseen["covered"]:
            unknown.append({"type": "unseen-uncovered", "count": a.unseen["uncovered"]})
            continue
        bad.append(n)
    valid: Validity = False if bad else ("unknown" if unknown else True)
    return {
        "valid": valid,
        "anomaly_types": present,
        "bad_anomaly_types": bad,
        "allowed_anomaly_types": [n for n in present if n in allowed],
        "unknown_reasons": _render(unknown),
        "anomalies": {n: _render(_condense(n, a.errors[n], opts.max_examples)) for n in present},
        "anomaly_counts": {n: len(a.errors[n]) for n in present},
        "unseen": _render(a.unseen),
        "stats": _render(_stats(a)),
    }


def check(
    history: History | Iterable[Op], options: CheckerOptions | None = None, **kw: Any
) -> dict[str, Any]:
    """Check a history; returns a JSON-ready dict::

        {"valid": True | False | "unknown",
         "anomalies": {name: [example, ...]},   # at most max_examples each
         "anomaly_counts": {name: n}, "anomaly_types": [...],
         "bad_anomaly_types": [...], "allowed_anomaly_types": [...],
         "unknown_reasons": [...], "unseen": {...} | None, "stats": {...}}

    Examples name operations as their JSON objects (``Op.to_dict``).
    """
    return result(analyze(history, options, **kw))


def check_file(
    history_path: str | Path,
    results_path: str | Path | None = None,
    options: CheckerOptions | None = None,
    **kw: Any,
) -> dict[str, Any]:
    """Check a ``history.jsonl``; write ``results.json`` if a path is given."""
    res = check(read_jsonl(history_path), options, **kw)
    if results_path is not None:
        Path(results_path).write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    return res


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m jepsen.checker HISTORY.jsonl [RESULTS.json] [--no-ww-deps]
    [--subscribe] [--strict-unseen]``; exit status 0 valid, 1 invalid, 2 unknown."""
    args = list(sys.argv[1:] if argv is None else argv)
    flags = {a for a in args if a.startswith("--")}
    paths = [a for a in args if not a.startswith("--")]
    known = {"--no-ww-deps", "--subscribe", "--strict-unseen"}
    if not 1 <= len(paths) <= 2 or flags - known:
        print(main.__doc__, file=sys.stderr)
        return 64
    opts = CheckerOptions(
        ww_deps="--no-ww-deps" not in flags,
        sub_via=frozenset({"subscribe"}) if "--subscribe" in flags else None,
        strict_unseen="--strict-unseen" in flags,
    )
    res = check_file(paths[0], paths[1] if len(paths) > 1 else None, opts)
    print(json.dumps({k: res[k] for k in ("valid", "anomaly_counts", "unknown_reasons")}))
    return {True: 0, False: 1}.get(res["valid"], 2)


if __name__ == "__main__":
    raise SystemExit(main())
