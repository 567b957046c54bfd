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
"""

from __future__ import annotations

import dataclasses
import json
import time as _time
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final, Literal, TypeAlias, overload

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

OpType: TypeAlias = Literal["invoke", "ok", "fail", "info"]
Process: TypeAlias = int | str
Key: TypeAlias = str
Value: TypeAlias = Hashable

OP_TYPES: Final[tuple[OpType, ...]] = ("invoke", "ok", "fail", "info")
NEMESIS: Final = "nemesis"

#: Operations whose value is a list of micro-ops.
TXN_FS: Final = frozenset({"send", "poll", "txn"})
#: Operations whose sends count as writes (Jepsen's ``op-writes``).
WRITE_FS: Final = frozenset({"send", "txn"})
#: Operations whose polls count as reads (Jepsen's ``op-reads``).
READ_FS: Final = frozenset({"poll", "txn"})
#: Operations that replace a consumer's assignment.
SUBSCRIPTION_FS: Final = frozenset({"assign", "subscribe"})

_CORE_FIELDS: Final = frozenset({"index", "time", "type", "process", "f", "value", "error"})
_REBALANCE_FIELDS: Final = ("rebalance_log", "rebalance-log")
_SEEK_FIELDS: Final = ("seek_to_beginning", "seek-to-beginning?", "seek-to-beginning")


class HistoryError(ValueError):
    """A malformed operation or history."""


def normalize_key(k: object) -> Key:
    """Return the canonical (string) form of a topic-partition key."""
    if isinstance(k, bool) or not isinstance(k, int | str):
        raise HistoryError(f"key must be a string or an integer, not {k!r}")
    return str(k)


def freeze_value(v: object) -> Value:
    """Return a hashable form of a message value (lists become tuples)."""
    if isinstance(v, list | tuple):
        return tuple(freeze_value(x) for x in v)
    if isinstance(v, dict):
        raise HistoryError(f"message values must be JSON scalars, not {v!r}")
    if not isinstance(v, Hashable):
        raise HistoryError(f"message values must be JSON scalars, not {v!r}")
    return v


def jsonable(x: Any) -> Any:
    """Convert tuples, sets and frozensets (recursively) into JSON lists."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    if isinstance(x, set | frozenset):
        return [jsonable(v) for v in sorted(x, key=sort_key)]
    return x


def sort_key(v: object) -> tuple[int, float, str]:
    """A total order over message values of mixed types (numbers first)."""
    if isinstance(v, bool):
        return (1, float(v), "")
    if isinstance(v, int | float):
        return (0, float(v), "")
    if v is None:
        return (2, 0.0, "")
    return (3, 0.0, repr(v) if not isinstance(v, str) else v)


@dataclass(frozen=True, slots=True)
class Send:
    """``["send", key, value]`` or, completed, ``["send", key, [offset, value]]``."""

    key: Key
    value: Value
    offset: int | None = None

    def to_json(self, completed: bool) -> list[Any]:
        v = jsonable(self.value)
        return ["send", self.key, [self.offset, v] if completed else v]


@dataclass(frozen=True, slots=True)
class Poll:
    """``["poll"]`` or, completed, ``["poll", {key: [[offset, value], ...]}]``."""

    reads: Mapping[Key, tuple[tuple[int | None, Value], ...]] | None = None

    def to_json(self) -> list[Any]:
        if self.reads is None:
            return ["poll"]
        return ["poll", {k: [[o, jsonable(v)] for o, v in ps] for k, ps in self.reads.items()}]


MicroOp: TypeAlias = Send | Poll


def _offset(o: object) -> int | None:
    if o is None:
        return None
    if isinstance(o, bool) or not isinstance(o, int):
        raise HistoryError(f"offset must be an integer or null, not {o!r}")
    return o


def _parse_mop(m: object) -> MicroOp:
    if not isinstance(m, list | tuple) or not m:
        raise HistoryError(f"micro-op must be a non-empty list, not {m!r}")
    f = m[0]
    if f == "send":
        if len(m) != 3:
            raise HistoryError(f"send micro-op needs [send, key, value]: {m!r}")
        k = normalize_key(m[1])
        v = m[2]
        if isinstance(v, list | tuple) and len(v) == 2:
            return Send(k, freeze_value(v[1]), _offset(v[0]))
        return Send(k, freeze_value(v), None)
    if f == "poll":
        if len(m) == 1 or m[1] is None:
            return Poll(None)
        if len(m) != 2 or not isinstance(m[1], Mapping):
            raise HistoryError(f"poll micro-op needs [poll, {{key: pairs}}]: {m!r}")
        reads: dict[Key, tuple[tuple[int | None, Value], ...]] = {}
        for k, pairs in m[1].items():
            if not isinstance(pairs, list | tuple):
                raise HistoryError(f"poll of {k!r} must be a list of [offset, value]: {m!r}")
            ps: list[tuple[int | None, Value]] = []
            for p in pairs:
                if not isinstance(p, list | tuple) or len(p) != 2:
                    raise HistoryError(f"polled record must be [offset, value]: {p!r}")
                ps.append((_offset(p[0]), freeze_value(p[1])))
            nk = normalize_key(k)
            reads[nk] = reads.get(nk, ()) + tuple(ps)
        return Poll(reads)
    raise HistoryError(f"unknown micro-op {f!r} in {m!r}")


def parse_mops(value: object) -> tuple[MicroOp, ...]:
    """Parse a send/poll/txn value (a list of micro-ops)."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise HistoryError(f"send/poll/txn value must be a list of micro-ops, not {value!r}")
    return tuple(_parse_mop(m) for m in value)


@dataclass(eq=False)
class Op:
    """One operation of a history. Compared by identity, not by value."""

    type: OpType
    f: str
    process: Process
    value: Any = None
    time: int = 0
    index: int = -1
    error: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    _mops: tuple[MicroOp, ...] = field(init=False, repr=False, default=())
    _writes: dict[Key, list[Value]] = field(init=False, repr=False, default_factory=dict)
    _write_pairs: dict[Key, list[tuple[int | None, Value]]] = field(
        init=False, repr=False, default_factory=dict
    )
    _reads: dict[Key, list[Value]] = field(init=False, repr=False, default_factory=dict)
    _read_pairs: dict[Key, list[tuple[int | None, Value]]] = field(
        init=False, repr=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        if self.type not in OP_TYPES:
            raise HistoryError(f"op type must be one of {OP_TYPES}, not {self.type!r}")
        if not isinstance(self.f, str) or not self.f:
            raise HistoryError(f"op f must be a non-empty string, not {self.f!r}")
        if isinstance(self.process, bool) or not isinstance(self.process, int | str):
            raise HistoryError(f"op process must be an int or a string, not {self.process!r}")
        if isinstance(self.time, bool) or not isinstance(self.time, int):
            raise HistoryError(f"op time must be integer nanoseconds, not {self.time!r}")
        if isinstance(self.index, bool) or not isinstance(self.index, int):
            raise HistoryError(f"op index must be an integer, not {self.index!r}")
        if self.f in TXN_FS:
            self._mops = parse_mops(self.value)
        self._writes = {}
        self._write_pairs = {}
        self._reads = {}
        self._read_pairs = {}
        for m in self._mops:
            if isinstance(m, Send):
                if self.f in WRITE_FS:
                    self._writes.setdefault(m.key, []).append(m.value)
                    self._write_pairs.setdefault(m.key, []).append((m.offset, m.value))
            elif m.reads is not None and self.f in READ_FS:
                for k, pairs in m.reads.items():
                    self._reads.setdefault(k, []).extend(v for _, v in pairs)
                    self._read_pairs.setdefault(k, []).extend(pairs)

    # -- classification -----------------------------------------------------

    @property
    def is_client(self) -> bool:
        """Client processes are integers (Jepsen's ``client-op?``)."""
        return isinstance(self.process, int)

    @property
    def is_invoke(self) -> bool:
        return self.type == "invoke"

    @property
    def is_ok(self) -> bool:
        return self.type == "ok"

    @property
    def is_fail(self) -> bool:
        return self.type == "fail"

    @property
    def is_info(self) -> bool:
        return self.type == "info"

    # -- micro-ops ----------------------------------------------------------

    @property
    def mops(self) -> tuple[MicroOp, ...]:
        """The parsed micro-ops of a send/poll/txn operation (else empty)."""
        return self._mops

    def writes(self) -> dict[Key, list[Value]]:
        """Key -> values sent, in order (send/txn ops only; Jepsen's ``op-writes``)."""
        return self._writes

    def write_pairs(self) -> dict[Key, list[tuple[int | None, Value]]]:
        """Key -> ``(offset, value)`` sent; ``offset`` may be ``None``."""
        return self._write_pairs

    def reads(self) -> dict[Key, list[Value]]:
        """Key -> values polled, in order (poll/txn ops only; Jepsen's ``op-reads``)."""
        return self._reads

    def read_pairs(self) -> dict[Key, list[tuple[int | None, Value]]]:
        """Key -> ``(offset, value)`` polled, in order."""
        return self._read_pairs

    def subscription_keys(self) -> frozenset[Key]:
        """Keys named by an assign/subscribe operation."""
        if self.f not in SUBSCRIPTION_FS or not isinstance(self.value, list | tuple):
            return frozenset()
        return frozenset(normalize_key(k) for k in self.value)

    def rebalance_keys(self) -> frozenset[Key]:
        """Keys assigned or revoked during this operation (``rebalance_log``)."""
        log: object = None
        for name in _REBALANCE_FIELDS:
            if name in self.extra:
                log = self.extra[name]
                break
        if not isinstance(log, list | tuple):
            return frozenset()
        keys: set[Key] = set()
        for event in log:
            if isinstance(event, Mapping):
                ks = event.get("keys", ())
                if isinstance(ks, list | tuple):
                    keys.update(normalize_key(k) for k in ks)
        return frozenset(keys)

    @property
    def seek_to_beginning(self) -> bool:
        return any(bool(self.extra.get(name)) for name in _SEEK_FIELDS)

    # -- serialisation ------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The JSON object for this operation."""
        d: dict[str, Any] = {
            "index": self.index,
            "time": self.time,
            "type": self.type,
            "process": self.process,
            "f": self.f,
            "value": jsonable(self.value),
        }
        if self.error is not None:
            d["error"] = jsonable(self.error)
        for k, v in self.extra.items():
            d[k] = jsonable(v)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Op:
        """Build an operation from its JSON object."""
        if not isinstance(d, Mapping):
            raise HistoryError(f"operation must be a JSON object, not {d!r}")
        for name in ("type", "f", "process"):
            if name not in d:
                raise HistoryError(f"operation lacks {name!r}: {dict(d)!r}")
        index = d.get("index")
        return cls(
            type=d["type"],
            f=d["f"],
            process=d["process"],
            value=d.get("value"),
            time=d.get("time", 0),
            index=-1 if index is None else index,
            error=d.get("error"),
            extra={k: v for k, v in d.items() if k not in _CORE_FIELDS},
        )

    def replace(self, **changes: Any) -> Op:
        """A copy with some fields changed (micro-ops are re-parsed)."""
        return dataclasses.replace(self, **changes)


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
