"""The operation model of a Jepsen-style history, and its JSON Lines form.

A history is a totally ordered list of operations (jepsen.history README).
Every client call appears twice: an ``invoke`` when it starts, and a
completion when it ends, whose type says what is known about its effect:

========  =================================================================
type      meaning
========  =================================================================
invoke    the operation began
ok        it definitely took effect
fail      it definitely did not take effect
info      indeterminate (timeout, connection reset, crash): it may or may
          not have taken effect. A client process that gets ``info`` is
          considered crashed and never invokes again; the harness goes on
          under a fresh process id with a fresh client.
========  =================================================================

One JSON object per line. For example (``index`` and ``time`` left out here;
every line has them, e.g. ``{"index": 4, "time": 9900, ...}``)::

    {"type": "invoke", "process": 0, "f": "assign", "value": ["t-0", "t-1"],
     "seek_to_beginning": true}
    {"type": "ok", "process": 0, "f": "assign", "value": ["t-0", "t-1"]}
    {"type": "ok", "process": 1, "f": "subscribe", "value": ["t-0"]}
    {"type": "invoke", "process": 0, "f": "send", "value": [["send", "t-0", 17]]}
    {"type": "ok", "process": 0, "f": "send", "value": [["send", "t-0", [42, 17]]]}
    {"type": "invoke", "process": 2, "f": "poll", "value": [["poll"]], "poll_ms": 100}
    {"type": "ok", "process": 2, "f": "poll",
     "value": [["poll", {"t-0": [[41, 16], [42, 17]]}]],
     "rebalance_log": [{"keys": ["t-1"]}]}
    {"type": "invoke", "process": 3, "f": "txn", "value": [["poll"], ["send", "t-1", 18]]}
    {"type": "info", "process": 3, "f": "txn", "value": [["poll"], ["send", "t-1", 18]],
     "error": "timeout"}
    {"type": "fail", "process": 6, "f": "txn", "value": [["send", "t-1", [7, 19]]],
     "error": "aborted"}
    {"type": "info", "process": 4, "f": "crash", "value": null}
    {"type": "ok", "process": 5, "f": "debug-topic-partitions",
     "value": {"t-0": {"leader": 1}}}
    {"type": "info", "process": "nemesis", "f": "start-partition",
     "value": {"n1": ["n2", "n3"]}}

Fields:

* ``index``: position in the history, strictly increasing (assigned from the
  line position when absent).
* ``time``: nanoseconds since the start of the test.
* ``type``: ``invoke``/``ok``/``fail``/``info``.
* ``process``: an integer for client processes; ``"nemesis"`` (any string)
  for the fault injector, whose operations share the timeline.
* ``f``: ``send``, ``poll``, ``txn`` (micro-op lists, below), ``assign`` and
  ``subscribe`` (value: the list of keys), ``crash`` (completes ``info``,
  forcing a fresh client), ``debug-topic-partitions``, or any nemesis ``f``.
* ``value``: for ``send``/``poll``/``txn``, a list of micro-ops, as in
  Jepsen's Kafka workload:

  - ``["send", k, v]`` as invoked; completes as ``["send", k, [offset, v]]``
    (``offset`` is ``null`` when unknown, e.g. after a timeout; a completion
    may also keep the bare ``v``);
  - ``["poll"]`` as invoked; completes as
    ``["poll", {k: [[offset, v], ...], ...}]``.

  ``send`` ops hold only sends, ``poll`` ops only polls; ``txn`` mixes them.
* ``error`` (optional): why an operation failed or is indeterminate.
* anything else is kept verbatim in :attr:`Op.extra`. The checker reads
  ``rebalance_log`` (a list of ``{"keys": [k, ...]}``, the partitions
  assigned or revoked during the operation) and ``seek_to_beginning`` (on
  ``assign``). Jepsen's spellings ``rebalance-log`` and ``seek-to-beginning?``
  are accepted too.

Keys name topic-partitions (for example ``"jepsen-0"``). JSON object keys are
strings, so keys are normalised to ``str`` everywhere: a send to key ``3`` and a
poll of ``{"3": ...}`` refer to the same partition. Message values are JSON
scalars, unique per key (the harness never retries above the client);
lists are turned into tuples so that values are hashable.

One operation and its micro-ops are modelled in :mod:`jepsen.ops`; this module holds the
:class:`History` built from them, its JSON Lines form and a builder for tests.
"""

from __future__ import annotations

import json
import time as _time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, overload

from jepsen.ops import (
    NEMESIS,
    OP_TYPES,
    HistoryError,
    Key,
    MicroOp,
    Op,
    OpType,
    Poll,
    Process,
    Send,
    Value,
    freeze_value,
    jsonable,
    normalize_key,
)

__all__ = [
    "NEMESIS",
    "OP_TYPES",
    "History",
    "HistoryBuilder",
    "HistoryError",
    "HistoryWriter",
    "Key",
    "MicroOp",
    "Op",
    "OpType",
    "Poll",
    "Process",
    "Send",
    "Value",
    "dumps_op",
    "freeze_value",
    "jsonable",
    "loads_op",
    "normalize_key",
    "read_jsonl",
    "write_jsonl",
]


class History(Sequence[Op]):
    """A totally ordered list of operations, with invocations paired to completions.

    Indices must be strictly increasing; if no operation carries one
    (``index == -1`` everywhere) they are assigned from positions. Pairing is
    per process: a completion belongs to the latest open invocation of its
    process. With ``strict`` (the default) client operations must be well
    formed: no client process invokes twice without completing, every client
    completion has an invocation with the same ``f``, and no client process
    invokes again after an ``info`` completion. Nemesis operations may also be
    logged as lone completions (``info`` with no invocation). Invocations left
    open at the end are indeterminate.
    """

    def __init__(self, ops: Iterable[Op], *, strict: bool = True) -> None:
        self._ops: list[Op] = list(ops)
        if self._ops and all(op.index == -1 for op in self._ops):
            self._ops = [op.replace(index=i) for i, op in enumerate(self._ops)]
        last = -1
        for op in self._ops:
            if op.index <= last:
                raise HistoryError(
                    f"op indices must be strictly increasing: {op.index} after {last}"
                )
            last = op.index
        self._by_index: dict[int, Op] = {op.index: op for op in self._ops}
        self._pair: dict[int, int] = {}
        self._pair_up(strict)

    def _pair_up(self, strict: bool) -> None:
        open_: dict[Process, Op] = {}
        crashed: set[Process] = set()
        for op in self._ops:
            p = op.process
            if op.is_invoke:
                if p in open_ and strict and op.is_client:
                    raise HistoryError(
                        f"process {p!r} invoked op {op.index} while op "
                        f"{open_[p].index} is still open"
                    )
                if strict and op.is_client and p in crashed:
                    raise HistoryError(
                        f"process {p!r} invoked op {op.index} after an info completion; "
                        "a crashed process must be replaced by a fresh process id"
                    )
                open_[p] = op
                continue
            inv = open_.pop(p, None)
            if inv is None:
                if strict and op.is_client:
                    raise HistoryError(f"op {op.index} ({op.type}) of {p!r} has no invocation")
                continue
            if inv.f != op.f and strict:
                raise HistoryError(
                    f"op {op.index} completes f={op.f!r} but its invocation "
                    f"{inv.index} is f={inv.f!r}"
                )
            self._pair[inv.index] = op.index
            self._pair[op.index] = inv.index
            if op.is_info:
                crashed.add(p)

    @overload
    def __getitem__(self, i: int) -> Op: ...

    @overload
    def __getitem__(self, i: slice) -> list[Op]: ...

    def __getitem__(self, i: int | slice) -> Op | list[Op]:
        return self._ops[i]

    def __len__(self) -> int:
        return len(self._ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self._ops)

    @property
    def ops(self) -> list[Op]:
        return list(self._ops)

    def by_index(self, index: int) -> Op:
        """The operation with the given ``index``."""
        return self._by_index[index]

    def invocation(self, op: Op) -> Op | None:
        """The invocation of a completion (or the op itself if it is an invoke)."""
        if op.is_invoke:
            return op
        i = self._pair.get(op.index)
        return None if i is None else self._by_index[i]

    def completion(self, op: Op) -> Op | None:
        """The completion of an invocation (``None`` if it never completed)."""
        if not op.is_invoke:
            return op
        i = self._pair.get(op.index)
        return None if i is None else self._by_index[i]

    def pairs(self) -> list[tuple[Op, Op | None]]:
        """``(invocation, completion or None)`` for every invocation, in order."""
        return [(op, self.completion(op)) for op in self._ops if op.is_invoke]

    def client_ops(self) -> list[Op]:
        """Operations of client (integer) processes: nemesis ops removed."""
        return [op for op in self._ops if op.is_client]

    def nemesis_ops(self) -> list[Op]:
        return [op for op in self._ops if not op.is_client]

    def completions(self) -> list[Op]:
        return [op for op in self._ops if not op.is_invoke]

    def by_process(self) -> dict[Process, list[Op]]:
        out: dict[Process, list[Op]] = {}
        for op in self._ops:
            out.setdefault(op.process, []).append(op)
        return out


# -- JSON Lines ---------------------------------------------------------------


def dumps_op(op: Op) -> str:
    """One JSON line (without the newline) for an operation."""
    return json.dumps(op.to_dict(), separators=(", ", ": "))


def loads_op(line: str) -> Op:
    """Parse one JSON line."""
    try:
        d = json.loads(line)
    except json.JSONDecodeError as e:
        raise HistoryError(f"invalid JSON: {e}") from e
    return Op.from_dict(d)


def read_jsonl(source: str | Path | IO[str], *, strict: bool = True) -> History:
    """Read a ``history.jsonl`` (path or open text file); blank lines are skipped."""
    if isinstance(source, str | Path):
        with open(source, encoding="utf-8") as fh:
            return read_jsonl(fh, strict=strict)
    ops: list[Op] = []
    for lineno, line in enumerate(source, 1):
        if not line.strip():
            continue
        try:
            ops.append(loads_op(line))
        except HistoryError as e:
            raise HistoryError(f"line {lineno}: {e}") from e
    return History(ops, strict=strict)


def write_jsonl(dest: str | Path | IO[str], ops: Iterable[Op]) -> None:
    """Write operations as JSON Lines."""
    if isinstance(dest, str | Path):
        with open(dest, "w", encoding="utf-8") as fh:
            write_jsonl(fh, ops)
        return
    for op in ops:
        dest.write(dumps_op(op))
        dest.write("\n")


class HistoryWriter:
    """Appends operations to a ``history.jsonl`` as they happen.

    Assigns consecutive indices and, unless given, times in nanoseconds since
    the writer was opened (monotonic clock). Each line is flushed at once, so
    a crashed harness leaves a readable prefix.
    """

    def __init__(self, path: str | Path) -> None:
        self._fh: IO[str] = open(path, "w", encoding="utf-8")  # noqa: SIM115
        self._start = _time.monotonic_ns()
        self._next = 0

    @property
    def start_ns(self) -> int:
        """``time.monotonic_ns()`` when the history started: the origin of ``time``."""
        return self._start

    def append(
        self,
        type: OpType,
        process: Process,
        f: str,
        value: Any = None,
        *,
        time: int | None = None,
        error: Any = None,
        **extra: Any,
    ) -> Op:
        op = Op(
            type=type,
            f=f,
            process=process,
            value=value,
            time=_time.monotonic_ns() - self._start if time is None else time,
            index=self._next,
            error=error,
            extra=dict(extra),
        )
        self._next += 1
        self._fh.write(dumps_op(op) + "\n")
        self._fh.flush()
        return op

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class HistoryBuilder:
    """Builds histories by hand (tests, simulations).

    Indices are consecutive; times default to ``index * 1_000_000`` ns.
    """

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def add(
        self,
        type: OpType,
        process: Process,
        f: str,
        value: Any = None,
        *,
        time: int | None = None,
        error: Any = None,
        **extra: Any,
    ) -> Op:
        i = len(self.ops)
        op = Op(
            type=type,
            f=f,
            process=process,
            value=value,
            time=i * 1_000_000 if time is None else time,
            index=i,
            error=error,
            extra=dict(extra),
        )
        self.ops.append(op)
        return op

    def invoke(self, process: Process, f: str, value: Any = None, **kw: Any) -> Op:
        return self.add("invoke", process, f, value, **kw)

    def ok(self, process: Process, f: str, value: Any = None, **kw: Any) -> Op:
        return self.add("ok", process, f, value, **kw)

    def fail(self, process: Process, f: str, value: Any = None, **kw: Any) -> Op:
        return self.add("fail", process, f, value, **kw)

    def info(self, process: Process, f: str, value: Any = None, **kw: Any) -> Op:
        return self.add("info", process, f, value, **kw)

    def call(
        self,
        process: Process,
        f: str,
        value: Any,
        result: Any = None,
        type: OpType = "ok",
        **kw: Any,
    ) -> Op:
        """Invoke and at once complete an operation; returns the completion.

        ``result`` defaults to ``value``. Keyword arguments go to the completion.
        """
        self.add("invoke", process, f, value)
        return self.add(type, process, f, value if result is None else result, **kw)

    def history(self, *, strict: bool = True) -> History:
        return History(self.ops, strict=strict)
