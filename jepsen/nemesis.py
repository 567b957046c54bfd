"""Faults: a pure schedule (:func:`plan`, :func:`grudge`) and the I/O that applies it
(:class:`Nemesis`).

Fault kinds and their targets:

* ``kill``: SIGKILL, restarted when the fault stops. Targets ``one`` (a random node),
  ``minority``, ``quorum-leader`` (the Raft metadata leader), ``partition-leader`` (the leader
  of a random partition of the workload's topic).
* ``pause``: SIGSTOP, SIGCONT when the fault stops. Same targets.
* ``partition`` (namespaces only): ``halves`` (random bisection: majority | minority),
  ``one`` (isolate a random node), ``quorum-leader``, ``partition-leader`` (isolate that
  node), ``bridge`` (two halves that cannot talk and one node that talks to both).
  Healed when the fault stops.
* ``clock``: step one node's wall clock by a random offset (see :mod:`raftlog.clock`); the
  offset goes back to 0 when the fault stops.
* ``power-loss`` (LazyFS only, :mod:`jepsen.faults_power`): SIGKILL, drop every write not yet
  fsynced, restart when the fault stops. Targets ``one``, ``minority``, ``majority``, ``all``.
  ``all`` includes it only where LazyFS is available.

* ``kill-two``, ``kill-burst``, ``wipe-disk``: see :mod:`jepsen.faults_harsh`.

``--nemesis`` takes ``none``, one kind, a comma-separated list, ``all`` (kill, pause,
partition and clock, one or two kinds at a time) or ``harsh`` (kill, kill-two, kill-burst).
Every start and stop is recorded in the history as a ``nemesis`` operation: an ``invoke``
with the planned fault and an ``info`` completion with the nodes it actually hit.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from jepsen import faults_harsh
from jepsen.db import Cluster
from jepsen.faults_power import POWER_LOSS, POWER_TARGETS, apply_power_loss, power_victims
from jepsen.net import Grudge, Net
from jepsen.workloads import Recorder

KINDS: Final = ("kill", "pause", "partition", "clock", POWER_LOSS)
# What ``all`` means: the same on every machine (power-loss needs LazyFS, the harsh kinds are
# ``harsh``), so campaigns stay comparable across machines and with older ones.
ALL_KINDS: Final = ("kill", "pause", "partition", "clock")
PROCESS_TARGETS: Final = ("one", "minority", "quorum-leader", "partition-leader")
PARTITION_TARGETS: Final = ("halves", "one", "quorum-leader", "partition-leader", "bridge")
CLOCK_OFFSETS_S: Final = (-300.0, -60.0, -5.0, 5.0, 60.0, 300.0)
NEMESIS: Final = "nemesis"


@dataclass(frozen=True)
class Fault:
    kind: str
    target: str
    offset_s: float = 0.0

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "target": self.target}
        if self.kind in ("clock", "wipe-disk"):
            d["offset_s"] = self.offset_s
        return d


@dataclass(frozen=True)
class Step:
    at_s: float
    action: Literal["start", "stop"]
    faults: tuple[Fault, ...]


def parse_kinds(nemesis: str, network: bool) -> tuple[str, ...]:
    """``none`` / ``all`` / ``harsh`` / ``kill,partition`` -> the fault kinds to use."""
    if nemesis in ("", "none"):
        return ()
    kinds = ALL_KINDS if nemesis == "all" else tuple(k.strip() for k in nemesis.split(","))
    kinds = tuple(dict.fromkeys(x for k in kinds for x in faults_harsh.ALIASES.get(k, (k,))))
    known = (*KINDS, *faults_harsh.HARSH_KINDS)
    unknown = [k for k in kinds if k not in known]
    if unknown:
        raise ValueError(f"unknown nemesis {unknown[0]!r}; choose from none, all, "
                         + ", ".join((*faults_harsh.ALIASES, *known)))
    if not network:
        kinds = tuple(k for k in kinds if k != "partition")
    return kinds


def plan(kinds: Sequence[str], rng: random.Random, time_limit_s: float, interval_s: float,
         *, together_max: int = 1) -> list[Step]:
    """Alternate quiet periods and faults of ``interval_s`` (jittered) until the time limit;
    up to ``together_max`` faults of different kinds at once."""
    steps: list[Step] = []
    if not kinds:
        return steps
    t = interval_s * rng.uniform(0.4, 0.8)
    while t < time_limit_s - 1.0:
        count = rng.randint(1, min(together_max, len(kinds)))
        chosen = rng.sample(list(kinds), count)
        faults = tuple(_fault(kind, rng) for kind in chosen)
        end = min(t + interval_s * rng.uniform(0.7, 1.3), time_limit_s)
        steps.append(Step(t, "start", faults))
        steps.append(Step(end, "stop", faults))
        t = end + interval_s * rng.uniform(0.4, 0.8)
    return steps


def _fault(kind: str, rng: random.Random) -> Fault:
    if kind in faults_harsh.HARSH_KINDS:
        return Fault(kind, *faults_harsh.harsh_target(kind, rng))
    if kind == "partition":
        return Fault(kind, rng.choice(PARTITION_TARGETS))
    if kind == "clock":
        return Fault(kind, "one", rng.choice(CLOCK_OFFSETS_S))
    if kind == POWER_LOSS:
        return Fault(kind, rng.choice(POWER_TARGETS))
    return Fault(kind, rng.choice(PROCESS_TARGETS))


def complete_grudge(components: Sequence[Sequence[int]]) -> dict[int, frozenset[int]]:
    """Every node drops packets from every node outside its component
    (``jepsen.nemesis/complete-grudge``)."""
    everyone = {n for c in components for n in c}
    return {n: frozenset(everyone - set(c)) for c in components for n in c}


def bridge_grudge(nodes: Sequence[int]) -> dict[int, frozenset[int]]:
    """Two halves that cannot talk, joined by one node that talks to both (``bridge``)."""
    mid = len(nodes) // 2
    left, bridge, right = list(nodes[:mid]), nodes[mid], list(nodes[mid + 1:])
    grudge = {n: frozenset(right) for n in left}
    grudge.update({n: frozenset(left) for n in right})
    grudge[bridge] = frozenset()
    return grudge


def grudge(target: str, nodes: Sequence[int], rng: random.Random,
           leader: int | None) -> dict[int, frozenset[int]]:
    """The grudge for a partition target; ``leader`` is the quorum or partition leader."""
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    if target == "halves":
        half = len(shuffled) // 2
        return complete_grudge([shuffled[:half], shuffled[half:]])
    if target == "bridge":
        return bridge_grudge(shuffled)
    victim = leader if target in ("quorum-leader", "partition-leader") and leader else \
        shuffled[0]
    return complete_grudge([[victim], [n for n in nodes if n != victim]])


@dataclass
class Nemesis:
    """Applies faults to the cluster and the network, recording each in the history."""

    cluster: Cluster
    net: Net
    recorder: Recorder
    rng: random.Random
    topic: str | None
    active: dict[Fault, list[int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def active_summary(self) -> str:
        with self._lock:
            parts = [f"{f.kind}:{f.target}" + "".join(f" n{n}" for n in nodes)
                     for f, nodes in self.active.items()]
        return ", ".join(parts) or "-"

    def _leader(self, target: str) -> int | None:
        if target == "partition-leader" and self.topic is not None:
            leaders = [n for n in self.cluster.partition_leaders(self.topic).values() if n > 0]
            if leaders:
                return self.rng.choice(leaders)
        if target in ("quorum-leader", "partition-leader"):
            return self.cluster.quorum_leader()
        return None

    def _victims(self, target: str) -> list[int]:
        nodes = self.cluster.node_ids
        leader = self._leader(target)
        if leader is not None and leader in nodes:
            return [leader]
        if target == "minority":
            return sorted(self.rng.sample(nodes, (len(nodes) - 1) // 2))
        return [self.rng.choice(nodes)]

    def start(self, fault: Fault) -> None:
        self.recorder.invoke(NEMESIS, f"start-{fault.kind}", fault.describe())
        try:
            value, nodes = self._apply(fault)
        except Exception as exc:  # a fault that could not be applied is still recorded
            self.recorder.complete("info", NEMESIS, f"start-{fault.kind}", fault.describe(),
                                   error=f"{type(exc).__name__}: {exc}")
            return
        with self._lock:
            self.active[fault] = nodes
        self.recorder.complete("info", NEMESIS, f"start-{fault.kind}", value)

    def _apply(self, fault: Fault) -> tuple[dict[str, Any], list[int]]:
        if fault.kind == "partition":
            leader = self._leader(fault.target)
            g: Grudge = grudge(fault.target, self.cluster.node_ids, self.rng, leader)
            self.net.partition(g)
            cut = sorted(n for n, drops in g.items() if drops)
            return {**fault.describe(), "grudge": {str(n): sorted(d) for n, d in g.items()}}, cut
        if fault.kind in faults_harsh.HARSH_KINDS:
            return faults_harsh.apply(fault.kind, fault.target, fault.offset_s, self.cluster,
                                      self.rng, self._victims)
        if fault.kind == POWER_LOSS:
            mounts = self.cluster.lazyfs
            if mounts is None:
                raise RuntimeError("power-loss needs the data directories on LazyFS")
            victims = power_victims(fault.target, self.cluster.node_ids, self.rng)
            done = apply_power_loss(victims, lambda n: self.cluster.nodes[n].kill(),
                                    mounts.clear_cache)
            return {**fault.describe(), **done}, victims
        victims = self._victims(fault.target)
        for n in victims:
            node = self.cluster.nodes[n]
            if fault.kind == "kill":
                node.kill()
            elif fault.kind == "pause":
                node.pause()
            elif fault.kind == "clock":
                node.set_clock_offset_s(fault.offset_s)
        return {**fault.describe(), "nodes": victims}, victims

    def stop(self, fault: Fault) -> None:
        with self._lock:
            nodes = self.active.pop(fault, None)
        if nodes is None:
            return
        self.recorder.invoke(NEMESIS, f"stop-{fault.kind}", fault.describe())
        error = None
        try:
            self._undo(fault.kind, nodes)
        except Exception as exc:  # recorded; heal_all retries at the end
            error = f"{type(exc).__name__}: {exc}"
        self.recorder.complete("info", NEMESIS, f"stop-{fault.kind}",
                               {**fault.describe(), "nodes": nodes}, error=error)

    def _undo(self, kind: str, nodes: list[int]) -> None:
        if kind == "partition":
            self.net.heal()
            return
        if kind in faults_harsh.HARSH_KINDS:
            faults_harsh.undo(self.cluster, nodes)
            return
        for n in nodes:
            node = self.cluster.nodes[n]
            if kind in ("kill", POWER_LOSS):
                node.start()
            elif kind == "pause":
                node.resume()
            elif kind == "clock":
                node.set_clock_offset_s(0.0)

    def heal_all(self) -> None:
        """Jepsen's final generator: stop every fault, whatever state it is in."""
        for fault in list(self.active):
            self.stop(fault)
        self.recorder.invoke(NEMESIS, "heal", None)
        self.net.heal()
        for node in self.cluster.nodes.values():
            node.resume()
            node.set_clock_offset_s(0.0)
            if not node.alive():
                node.start()
        self.recorder.complete("info", NEMESIS, "heal", {"nodes": self.cluster.node_ids})
