"""One operation of a Jepsen-style history and its micro-ops: :class:`Op` with its type,
process, function and value, the :class:`Send` and :class:`Poll` micro-ops of ``send``,
``poll`` and ``txn`` operations, and how values and keys are normalised. The format as a
whole (fields, examples, the JSON Lines form) is described in :mod:`jepsen.history`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

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
