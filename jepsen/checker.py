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

The parts, each its own module: :mod:`jepsen.anomalies` (names, options, what is allowed),
:mod:`jepsen.analysis` (version orders and the other indexes), :mod:`jepsen.key_checks`
(single-key anomalies), :mod:`jepsen.order_checks` (poll and send order) and
:mod:`jepsen.cycles` (the dependency graph and its cycles). This module runs them in order and
renders the result.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from jepsen.analysis import (
    Analysis,
    VersionOrder,
    build_version_orders,
    by_type,
    readers_by_value,
    writers_by_value,
)
from jepsen.anomalies import (
    ALWAYS_ALLOWED,
    ANOMALY_TYPES,
    CYCLE_SPECS,
    CYCLE_TYPES,
    CheckerOptions,
    Example,
    Validity,
    allowed_anomaly_types,
)
from jepsen.cycles import build_graph, find_cycles
from jepsen.graph import DiGraph, rel_names
from jepsen.history import History, read_jsonl
from jepsen.key_checks import (
    duplicates,
    g1a,
    lost_writes,
    precommitted_reads,
    unexpected_values,
    unseen_messages,
)
from jepsen.ops import READ_FS, TXN_FS, WRITE_FS, Op, jsonable
from jepsen.order_checks import internal_order, nonmonotonic_sends, poll_order

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
    rbt = by_type(ops, READ_FS, reads=True)
    wbt = by_type(ops, WRITE_FS, reads=False)
    orders, vo_errors, observations = build_version_orders(ops, rbt)
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
        writer_of=writers_by_value(ops),
        readers_of=readers_by_value(ops),
        observations=observations,
        graph=DiGraph(),
        explanations={},
        subscribe=subscribe,
    )
    a.add("duplicate", duplicates(a))
    int_poll_skip, int_nm_poll = internal_order(a, sends=False)
    int_send_skip, int_nm_send = internal_order(a, sends=True)
    a.add("int-poll-skip", int_poll_skip)
    a.add("int-nonmonotonic-poll", int_nm_poll)
    a.add("int-nonmonotonic-send", int_nm_send)
    a.add("int-send-skip", int_send_skip)
    a.add("inconsistent-offsets", vo_errors)
    a.add("precommitted-read", precommitted_reads(a))
    a.add("G1a", g1a(a))
    a.add("lost-write", lost_writes(a))
    poll_skip, nm_poll = poll_order(a)
    a.add("nonmonotonic-poll", nm_poll)
    a.add("nonmonotonic-send", nonmonotonic_sends(a))
    a.add("poll-skip", poll_skip)
    unseen, a.unseen = unseen_messages(a)
    a.add("unseen", unseen)
    a.add("unexpected", unexpected_values(a))
    build_graph(a)
    find_cycles(a)
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
