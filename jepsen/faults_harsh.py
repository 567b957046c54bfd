"""Harder faults: ``kill-two``, ``kill-burst`` and ``wipe-disk`` (used by
:class:`jepsen.nemesis.Nemesis`).

* ``kill-two``: SIGKILL two nodes at once (both signals sent before either is reaped);
  restarted when the fault stops. On 3 nodes with ``min.insync.replicas=2`` every write
  stalls until a node is back.
* ``kill-burst``: kill a node, 1-2 s later restart it and at once kill another, ... 3 to 5
  kills; every node is running again when the burst ends (each restarted node has had no time
  to catch up before the next is killed). The burst runs when the fault starts; its stop only
  makes sure every node it hit is running.
* ``wipe-disk``: SIGKILL one node (``one``, ``quorum-leader`` or ``partition-leader``),
  delete its whole data directory (``log.dirs``, which is also ``metadata.log.dir``: the
  partition logs and ``__cluster_metadata-0/`` with the Raft journal, snapshot and
  ``meta.properties``), and restart it with the same ``node.id``: at once (half of the
  faults: back within the 1.5 s broker session, so the controller may never see it gone) or
  when the fault stops (a machine replaced after a while). What was deleted (files, bytes)
  and which restart are recorded.

The choices (:func:`burst_plan`, :func:`pick_two`, :func:`harsh_fault`) are pure and seeded;
:func:`apply` and :func:`undo` are the I/O.
"""

from __future__ import annotations

import contextlib
import random
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final

from jepsen.db import Cluster, NodeProcess
from jepsen.history import NEMESIS, Op

HARSH_KINDS: Final = ("kill-two", "kill-burst", "wipe-disk")
#: ``--nemesis harsh``: every way of killing; ``all`` stays as it was (campaigns comparable).
ALIASES: Final[dict[str, tuple[str, ...]]] = {"harsh": ("kill", "kill-two", "kill-burst")}
BURST_KILLS: Final = (3, 5)
BURST_DOWN_S: Final = (1.0, 2.0)
WIPE_TARGETS: Final = ("one", "quorum-leader", "partition-leader")
WIPE_RESTART_AT_ONCE: Final = 0.0
DATA_DIR: Final = "data"
WIPE_LOG_LINES: Final = 40
START_MARKER: Final = re.compile(r"^--- jepsen: start #(\d+) at ([0-9.]+)")
WIPE_LOG_PATTERN: Final = re.compile(
    r"WARNING|ERROR|CRITICAL|Traceback|leader|truncat|ISR|meta\.properties|vote|term|"
    r"snapshot|journal|epoch|catch|fenced|ready", re.IGNORECASE)


def harsh_target(kind: str, rng: random.Random) -> tuple[str, float]:
    """The planned ``(target, offset_s)`` of a harsh fault kind. For ``wipe-disk``,
    ``offset_s`` 0 restarts the node at once (before the controller notices it was gone,
    ``WIPE_RESTART_AT_ONCE``), 1 when the fault stops (a machine replaced after a while)."""
    if kind == "kill-two":
        return "two", 0.0
    if kind == "kill-burst":
        return "burst", 0.0
    if kind == "wipe-disk":
        return rng.choice(WIPE_TARGETS), float(rng.randint(0, 1))
    raise ValueError(f"not a harsh fault: {kind!r}")


def pick_two(nodes: Sequence[int], rng: random.Random) -> list[int]:
    """Two distinct nodes (all of them when there are fewer)."""
    return sorted(rng.sample(list(nodes), min(2, len(nodes))))


def burst_plan(nodes: Sequence[int], rng: random.Random) -> list[tuple[int, float]]:
    """``[(node, seconds down), ...]``: 3-5 kills, never the same node twice in a row."""
    steps: list[tuple[int, float]] = []
    previous: int | None = None
    for _ in range(rng.randint(*BURST_KILLS)):
        choices = [n for n in nodes if n != previous] or list(nodes)
        node = rng.choice(choices)
        steps.append((node, round(rng.uniform(*BURST_DOWN_S), 3)))
        previous = node
    return steps


def data_dir(node: NodeProcess) -> Path:
    """``log.dirs`` (= ``metadata.log.dir``) of a harness node."""
    return node.directory / DATA_DIR


def _usage(path: Path) -> tuple[int, int]:
    files = size = 0
    for p in path.rglob("*"):
        with contextlib.suppress(OSError):
            if p.is_file():
                files += 1
                size += p.stat().st_size
    return files, size


def kill_together(nodes: Sequence[NodeProcess]) -> None:
    """SIGKILL every node before reaping any (they die at the same instant)."""
    for node in nodes:
        if node.process is not None and node.process.poll() is None:
            with contextlib.suppress(OSError):
                node.process.send_signal(signal.SIGKILL)
    for node in nodes:
        node.kill()  # reaps


def wipe(node: NodeProcess) -> dict[str, Any]:
    """Kill ``node`` and delete its data directory; what was there."""
    node.kill()
    path = data_dir(node)
    files, size = _usage(path)
    shutil.rmtree(path, ignore_errors=True)
    return {"wiped": str(path), "files": files, "bytes": size, "at": round(time.time(), 3)}


def apply(kind: str, target: str, offset_s: float, cluster: Cluster, rng: random.Random,
          victims: Callable[[str], list[int]],
          sleep: Callable[[float], None] = time.sleep) -> tuple[dict[str, Any], list[int]]:
    """Start a harsh fault: ``(recorded value, nodes to restart when it stops)``.
    ``victims(target)`` resolves ``one``/``quorum-leader``/``partition-leader``."""
    if kind == "kill-two":
        hit = pick_two(cluster.node_ids, rng)
        kill_together([cluster.nodes[n] for n in hit])
        return {"kind": kind, "target": target, "nodes": hit}, hit
    if kind == "kill-burst":
        done: list[dict[str, Any]] = []
        for n, down_s in burst_plan(cluster.node_ids, rng):
            node = cluster.nodes[n]
            node.kill()
            done.append({"node": n, "down_s": down_s, "killed_at": round(time.time(), 3)})
            sleep(down_s)
            node.start()
        nodes = sorted({d["node"] for d in done})
        return {"kind": kind, "target": target, "nodes": nodes, "burst": done}, nodes
    if kind == "wipe-disk":
        hit = victims(target)[:1]
        wiped = [{"node": n, **wipe(cluster.nodes[n])} for n in hit]
        at_once = offset_s == WIPE_RESTART_AT_ONCE
        if at_once:
            for n in hit:
                cluster.nodes[n].start()
        return {"kind": kind, "target": target, "nodes": hit, "wiped": wiped,
                "restart": "at-once" if at_once else "at-stop"}, hit
    raise ValueError(f"not a harsh fault: {kind!r}")


def wiped_starts(history: Iterable[Op]) -> list[tuple[int, float]]:
    """``(node, wall time of the wipe)`` for every wipe the nemesis recorded."""
    out = []
    for op in history:
        if op.process == NEMESIS and op.f == "start-wipe-disk" and op.type == "info" \
                and isinstance(op.value, dict):
            for w in op.value.get("wiped", []):
                out.append((int(w["node"]), float(w.get("at", 0.0))))
    return out


def restart_lines(log_text: str, after: float, limit: int = WIPE_LOG_LINES) -> list[str]:
    """The first ``limit`` lines worth reading of the first start after ``after``: the
    harness's start marker, then warnings, errors and what the node says about leadership,
    truncation, the ISR and its Raft state (pure: text in, lines out)."""
    lines = log_text.splitlines()
    start = None
    for i, line in enumerate(lines):
        m = START_MARKER.match(line)
        if m and float(m.group(2)) >= after:
            start = i
            break
    if start is None:
        return []
    picked = [lines[start]]
    for line in lines[start + 1:]:
        if START_MARKER.match(line) or len(picked) >= limit:
            break
        if WIPE_LOG_PATTERN.search(line):
            picked.append(line)
    return picked


def wipe_report(directory: Path, history: Iterable[Op]) -> list[dict[str, Any]]:
    """For each wipe: the node, when, and its log lines after the restart (``nN.log``)."""
    report = []
    for node, at in wiped_starts(history):
        path = directory / f"n{node}.log"
        text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
        report.append({"node": node, "at": at, "restart_log": restart_lines(text, at)})
    return report


def undo(cluster: Cluster, nodes: Sequence[int]) -> None:
    """Restart every node the fault left down (same ``node.id``, same config)."""
    for n in nodes:
        node = cluster.nodes[n]
        if not node.alive():
            node.start()
