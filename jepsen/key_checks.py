"""The Kafka checker's single-key checks (kafka.clj step 2 and 5): ``duplicate``, ``G1a``,
``precommitted-read``, ``lost-write``, ``unseen`` and ``unexpected``, each a function of the
:class:`~jepsen.analysis.Analysis` returning its examples.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from jepsen.analysis import Analysis, must_have_committed
from jepsen.anomalies import Example
from jepsen.ops import READ_FS, TXN_FS, Key, Op, Value, sort_key


def duplicates(a: Analysis) -> list[Example]:
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


def g1a(a: Analysis) -> list[Example]:
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


def precommitted_reads(a: Analysis) -> list[Example]:
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


def lost_writes(a: Analysis) -> list[Example]:
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
                if writer is None or not must_have_committed(a.reads_by_type, writer):
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


def unseen_messages(a: Analysis) -> tuple[list[Example], dict[str, Any] | None]:
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


def unexpected_values(a: Analysis) -> list[Example]:
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
