"""Workloads: what the clients do, and how their history is checked.

A workload has a pure side (:meth:`Workload.next_op` draws the next operation from a seeded
``random.Random``; :meth:`Workload.check` judges a history) and an I/O side (its clients,
which call a real Kafka client library and report an :class:`Outcome`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from jepsen.history import History, Op, OpType
from raftlog.client.connection import PLAINTEXT, Security


@dataclass
class Outcome:
    """How an operation completed: ``ok``, ``fail`` (no effect) or ``info`` (unknown)."""

    type: OpType
    value: Any
    error: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


class Recorder(Protocol):
    """The history being written (thread-safe)."""

    def invoke(self, process: int | str, f: str, value: Any, **extra: Any) -> Op: ...

    def complete(self, type: OpType, process: int | str, f: str, value: Any,
                 error: Any = None, **extra: Any) -> Op: ...

    def new_process(self) -> int: ...


@dataclass(frozen=True)
class ClusterView:
    """What clients need to know about the cluster."""

    bootstrap: str
    node_addresses: dict[int, tuple[str, int]]
    replication_factor: int
    unsafe: bool
    run_id: str
    # A secured cluster (``--secure``): librdkafka properties every client adds, and the
    # project client's TLS context and login.
    client_config: Mapping[str, str] = field(default_factory=dict)
    security: Security = PLAINTEXT
    # ``--client-debug``: librdkafka's eos and msg debug contexts of every producer go here.
    client_log: Path | None = None


class Client(Protocol):
    """One client process's connection(s); discarded after an ``info`` outcome."""

    def open(self, recorder: Recorder, process: int) -> None: ...

    def invoke(self, f: str, value: Any) -> Outcome: ...

    def close(self) -> None: ...


class Workload(Protocol):
    name: str

    def setup(self, view: ClusterView) -> None:
        """Create topics etc. before the clients start."""

    def new_client(self, view: ClusterView, process: int, rng: random.Random,
                   worker: int) -> Client: ...

    def next_op(self, rng: random.Random, next_value: Callable[[], int]) -> tuple[str, Any]:
        """The next operation ``(f, value)`` (pure: depends only on ``rng``)."""

    def final_reads(self, view: ClusterView, recorder: Recorder, deadline_s: float
                    ) -> str | None:
        """Jepsen's final generator: read everything back after healing; a note when the
        reads could not finish (recorded in the results), else ``None``."""

    def check(self, history: History) -> dict[str, Any]:
        """``{"valid": ..., "anomalies": {...}, "stats": {...}, ...}``."""

    def keys(self) -> Sequence[str]: ...
