"""A linear-time checker for producer streams: per partition, duplicates, reorderings and
lost writes (``--load saturate``).

Jepsen's Kafka checker (:mod:`jepsen.checker`) builds a dependency graph over every operation
and searches it for cycles; on the 100,000+ records of a saturating run that costs minutes.
The properties an idempotent producer promises are simpler and need one pass:

* ``duplicate``: one value stored at two (or more) offsets of a partition. Values are unique,
  so any second copy is a duplicate (the issue's "same record at offsets 18330 and 18345").
* ``reorder``: two values one producer (one client process: one producer instance, hence one
  producer id) sent to the same partition, in that order, stored in the opposite order (by
  their first offsets in the final reads, or in every read when there are none).
  An idempotent producer keeps send order within a partition, retries included.
* ``lost-write``: a value whose send was acknowledged (``ok``) and that no read found,
  although a read of its partition reached past the acknowledged offset. When the history
  has final reads (polls after the nemesis's ``heal``), they decide: a value they did not
  return although they read past its offset is lost even if an earlier poll saw it (a log
  rewritten under the readers, as after a wiped leader).
* ``inconsistent-offsets``: two different values read at the same offset of a partition.
* ``offset-mismatch``: a value acknowledged at one offset and read at another.
* ``unseen`` (not an error): acknowledged values past the last offset any read reached; the
  verdict is then ``"unknown"`` unless something invalid was found. Those acknowledged with
  no offset (librdkafka reports a batch answered ``DUPLICATE_SEQUENCE_NUMBER`` as delivered,
  offset unknown) and absent from the final reads are also listed as
  ``unseen-acked-without-offset``: lost, if the run's notes say the final reads reached every
  high watermark.

Everything is computed from ``ok`` send completions, the invocations of every send (send
order of each process) and every poll completion (``ok`` or ``info``; the final reads
included). Pure: no I/O.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from jepsen.history import NEMESIS, Op
from jepsen.ops import jsonable

BAD: Final = ("duplicate", "reorder", "lost-write", "inconsistent-offsets", "offset-mismatch")
EXAMPLES_MAX: Final = 20


@dataclass
class _Key:
    """What one partition holds and what was sent to it."""

    offsets_of: dict[Any, set[int]] = field(default_factory=lambda: defaultdict(set))
    value_at: dict[int, set[Any]] = field(default_factory=lambda: defaultdict(set))
    read_max: int = -1
    # what the final reads (every poll after the nemesis's ``heal``) returned
    final_values: set[Any] = field(default_factory=set)
    final_offsets_of: dict[Any, set[int]] = field(default_factory=lambda: defaultdict(set))
    final_max: int = -1
    acked: dict[Any, int | None] = field(default_factory=dict)
    # process -> values in the order that process sent them
    sent: dict[Any, list[Any]] = field(default_factory=lambda: defaultdict(list))


def _scan(ops: Iterable[Op]) -> dict[str, _Key]:
    keys: dict[str, _Key] = defaultdict(_Key)
    healed = False
    for op in ops:
        if op.process == NEMESIS and op.f == "heal":
            healed = True
        if not op.is_client:
            continue
        if op.f in ("send", "txn") and op.type == "invoke":
            for k, values in op.writes().items():
                keys[k].sent[op.process].extend(values)
        elif op.f in ("send", "txn") and op.type == "ok":
            for k, pairs in op.write_pairs().items():
                for offset, v in pairs:
                    keys[k].acked[v] = offset
        if op.f in ("poll", "txn") and op.type in ("ok", "info"):
            for k, pairs in op.read_pairs().items():
                state = keys[k]
                for offset, v in pairs:
                    if offset is None:
                        continue
                    state.offsets_of[v].add(offset)
                    state.value_at[offset].add(v)
                    state.read_max = max(state.read_max, offset)
                    if healed:
                        state.final_values.add(v)
                        state.final_offsets_of[v].add(offset)
                        state.final_max = max(state.final_max, offset)
    return keys


def analyze(ops: Iterable[Op]) -> dict[str, Any]:
    """``{"valid", "anomalies": {name: [examples]}, "anomaly_counts", "per_key", "stats"}``."""
    anomalies: dict[str, list[dict[str, Any]]] = {}
    counts: dict[str, int] = defaultdict(int)
    per_key: dict[str, dict[str, int]] = {}
    unseen_total = 0
    acked_total = 0

    def note(name: str, key: str, example: dict[str, Any]) -> None:
        counts[name] += 1
        per_key.setdefault(key, defaultdict(int))[name] += 1
        bucket = anomalies.setdefault(name, [])
        if len(bucket) < EXAMPLES_MAX:
            bucket.append({"key": key, **example})

    for k, s in sorted(_scan(ops).items()):
        acked_total += len(s.acked)
        for v, offsets in s.offsets_of.items():
            if len(offsets) > 1:
                o = sorted(offsets)
                note("duplicate", k, {"value": jsonable(v), "offsets": o,
                                      "distance": o[1] - o[0]})
        for at, held in s.value_at.items():
            if len(held) > 1:
                note("inconsistent-offsets", k, {"offset": at, "values": sorted(map(str, held))})
        for v, acked_at in s.acked.items():
            seen = s.offsets_of.get(v)
            if s.final_max >= 0 and v not in s.final_values and acked_at is not None \
                    and acked_at <= s.final_max:
                # Read before (perhaps), but gone from the log the final reads read.
                note("lost-write", k, {"value": jsonable(v), "acked_offset": acked_at,
                                       "final_read_max": s.final_max,
                                       "read_earlier_at": sorted(seen or ())})
            elif s.final_max >= 0 and v not in s.final_values:
                unseen_total += 1
                if acked_at is None:
                    # librdkafka reports a batch the broker answered DUPLICATE_SEQUENCE_NUMBER
                    # as delivered with no offset; absent from complete final reads, it is lost.
                    note("unseen-acked-without-offset", k, {"value": jsonable(v),
                                                            "final_read_max": s.final_max})
            elif seen:
                if acked_at is not None and acked_at not in seen:
                    note("offset-mismatch", k, {"value": jsonable(v), "acked_offset": acked_at,
                                                "read_offsets": sorted(seen)})
            elif acked_at is not None and acked_at <= s.read_max:
                note("lost-write", k, {"value": jsonable(v), "acked_offset": acked_at,
                                       "read_max": s.read_max})
            else:
                unseen_total += 1
        # Order as the final reads saw it when there are any (a log rewritten during the run
        # would otherwise mix offsets of two histories).
        stored = s.final_offsets_of if s.final_max >= 0 else s.offsets_of
        for process, in_order in s.sent.items():
            last_offset, last_value = -1, None
            for v in in_order:
                seen = stored.get(v)
                if not seen:
                    continue
                first = min(seen)
                if first < last_offset:
                    note("reorder", k, {"process": process, "earlier": jsonable(last_value),
                                        "earlier_offset": last_offset, "later": jsonable(v),
                                        "later_offset": first})
                last_offset, last_value = max(last_offset, first), v
    bad = [name for name in BAD if counts.get(name)]
    valid: bool | str = False if bad else ("unknown" if unseen_total else True)
    return {
        "valid": valid,
        "anomalies": anomalies,
        "anomaly_counts": dict(counts),
        "bad_anomaly_types": bad,
        "per_key": {k: dict(v) for k, v in sorted(per_key.items())},
        "stats": {"acknowledged": acked_total, "unseen": unseen_total},
    }
