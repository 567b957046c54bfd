"""The Kafka checker's order checks (kafka.clj step 3): inside one operation
(``int-poll-skip``, ``int-nonmonotonic-poll``, ``int-send-skip``, ``int-nonmonotonic-send``)
and across a process's operations (``poll-skip``, ``nonmonotonic-poll``,
``nonmonotonic-send``), measured in the dense indices of each key's version order.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from jepsen.analysis import Analysis, VersionOrder
from jepsen.anomalies import Example
from jepsen.ops import READ_FS, SUBSCRIPTION_FS, WRITE_FS, Key, Op, Process, Value


def _delta(vo: VersionOrder | None, v1: Value, v2: Value) -> tuple[int, int | None, int | None]:
    """Index distance from ``v1`` to ``v2``; 1 (no error) when either is unknown."""
    if vo is None:
        return 1, None, None
    i1 = vo.by_value.get(v1)
    i2 = vo.by_value.get(v2)
    if i1 is None or i2 is None:
        return 1, i1, i2
    return i2 - i1, i1, i2


def internal_order(a: Analysis, sends: bool) -> tuple[list[Example], list[Example]]:
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


def poll_order(a: Analysis) -> tuple[list[Example], list[Example]]:
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


def nonmonotonic_sends(a: Analysis) -> list[Example]:
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
