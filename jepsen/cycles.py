"""The dependency graph over send/poll/txn completions (``ww``, ``wr``, ``process`` and
``realtime`` edges) and Elle's cycle search over it, classifying cycles as ``G0``/``G1c`` and
their ``-process``/``-realtime`` variants (kafka.clj step 4).
"""

from __future__ import annotations

import itertools
from typing import Any

from jepsen.analysis import Analysis
from jepsen.anomalies import CYCLE_SPECS, IMPLIED, Example
from jepsen.graph import (
    PROCESS,
    REALTIME,
    WR,
    WW,
    CycleSearchTimeout,
    find_cycle,
    rel_names,
    strongly_connected_components,
)
from jepsen.ops import TXN_FS, Op, Process


def build_graph(
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


def find_cycles(a: Analysis) -> None:
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
                skip |= IMPLIED[name]
