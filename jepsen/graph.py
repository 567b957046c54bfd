"""A small dependency graph and cycle finder (Tarjan SCC + BFS cycle search).

Vertices are operation indices; each edge carries a bitmask of the
relationships that order its endpoints (Elle's ``ww``, ``wr``, ``process`` and
``realtime``; an edge may carry several). Cycle search follows Elle
(``elle.txn``): strongly connected components first, then, inside one
component, a breadth-first search for a short cycle using only *allowed*
relationships and containing, for each *required* set, at least one edge
with a relationship in that set.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterator, Sequence
from typing import Final

__all__ = [
    "ALL",
    "PROCESS",
    "REALTIME",
    "REL_NAMES",
    "WR",
    "WW",
    "CycleSearchTimeout",
    "DiGraph",
    "find_cycle",
    "rel_names",
    "strongly_connected_components",
]

WW: Final = 1
WR: Final = 2
PROCESS: Final = 4
REALTIME: Final = 8
ALL: Final = WW | WR | PROCESS | REALTIME

REL_NAMES: Final[dict[int, str]] = {WW: "ww", WR: "wr", PROCESS: "process", REALTIME: "realtime"}


def rel_names(rels: int) -> list[str]:
    """Names of the relationships in a bitmask, in the order ww, wr, process, realtime."""
    return [name for bit, name in REL_NAMES.items() if rels & bit]


class CycleSearchTimeout(Exception):
    """The cycle search exceeded its work budget (Elle's ``:cycle-search-timeout``)."""


class DiGraph:
    """A directed graph over integers with relationship bitmasks on the edges."""

    def __init__(self) -> None:
        self._succ: dict[int, dict[int, int]] = {}

    def link(self, a: int, b: int, rel: int) -> None:
        """Add relationship(s) ``rel`` to the edge ``a -> b``; self-edges are ignored."""
        if a == b:
            return
        out = self._succ.setdefault(a, {})
        out[b] = out.get(b, 0) | rel
        self._succ.setdefault(b, {})

    def rels(self, a: int, b: int) -> int:
        """The relationship bitmask of ``a -> b`` (0 if there is no edge)."""
        return self._succ.get(a, {}).get(b, 0)

    def nodes(self) -> list[int]:
        return sorted(self._succ)

    def successors(self, a: int, mask: int = ALL) -> Iterator[tuple[int, int]]:
        """``(b, rels & mask)`` for every edge ``a -> b`` with a relationship in ``mask``."""
        for b, r in self._succ.get(a, {}).items():
            if r & mask:
                yield b, r & mask

    def edges(self, mask: int = ALL) -> Iterator[tuple[int, int, int]]:
        for a, out in self._succ.items():
            for b, r in out.items():
                if r & mask:
                    yield a, b, r & mask

    def edge_count(self, mask: int = ALL) -> int:
        return sum(1 for _ in self.edges(mask))

    def __len__(self) -> int:
        return len(self._succ)

    def __contains__(self, a: object) -> bool:
        return a in self._succ


def strongly_connected_components(
    g: DiGraph, mask: int = ALL, within: Collection[int] | None = None
) -> list[list[int]]:
    """Non-trivial SCCs (two or more vertices) of ``g`` restricted to edges in ``mask``
    and, optionally, to the vertices ``within``. Iterative Tarjan; each component
    and the list are sorted, so the result is deterministic."""
    inside = None if within is None else set(within)
    nodes = g.nodes() if inside is None else sorted(inside)

    def succs(v: int) -> list[int]:
        return sorted(w for w, _ in g.successors(v, mask) if inside is None or w in inside)

    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    out: list[list[int]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work: list[tuple[int, Iterator[int]]] = [(root, iter(succs(root)))]
        while work:
            v, it = work[-1]
            descended = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(succs(w))))
                    descended = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if descended:
                continue
            work.pop()
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
            if low[v] == index[v]:
                comp: list[int] = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    out.sort()
    return out


def _bfs(
    g: DiGraph,
    members: set[int],
    allowed: int,
    required: Sequence[int],
    start: int,
    start_bits: int,
    goal: int,
    budget: list[int],
) -> list[int] | None:
    """Shortest path start -> goal inside ``members`` over allowed edges, such that
    the bits of ``required`` satisfied along the way (plus ``start_bits``) are all
    set on arrival. ``budget[0]`` is decremented per expanded state."""
    full = (1 << len(required)) - 1
    first = (start, start_bits)
    parents: dict[tuple[int, int], tuple[int, int] | None] = {first: None}
    queue: deque[tuple[int, int]] = deque([first])
    while queue:
        state = queue.popleft()
        budget[0] -= 1
        if budget[0] < 0:
            raise CycleSearchTimeout
        node, bits = state
        if node == goal and bits == full:
            path: list[int] = []
            cur: tuple[int, int] | None = state
            while cur is not None:
                path.append(cur[0])
                cur = parents[cur]
            path.reverse()
            return path
        for w, rels in sorted(g.successors(node, allowed)):
            if w not in members:
                continue
            nbits = bits
            for i, req in enumerate(required):
                if rels & req:
                    nbits |= 1 << i
            nxt = (w, nbits)
            if nxt not in parents:
                parents[nxt] = state
                queue.append(nxt)
    return None


def find_cycle(
    g: DiGraph,
    nodes: Collection[int],
    allowed: int,
    required: Sequence[int] = (),
    budget: int = 1_000_000,
) -> list[int] | None:
    """Find a cycle among ``nodes`` using only edges with a relationship in
    ``allowed`` and, for every mask in ``required``, at least one edge with a
    relationship in that mask.

    Returns the cycle as a closed vertex list ``[a, b, ..., a]``, or ``None``.
    Raises :class:`CycleSearchTimeout` after ``budget`` BFS state expansions.
    """
    left = [budget]
    for comp in strongly_connected_components(g, allowed, nodes):
        members = set(comp)
        if not required:
            start = comp[0]
            for w, _ in sorted(g.successors(start, allowed)):
                if w in members:
                    path = _bfs(g, members, allowed, (), w, 0, start, left)
                    if path is not None:
                        return [start, *path]
            continue  # pragma: no cover - an SCC member always lies on a cycle
        first, rest = required[0], required[1:]
        for u in comp:
            for v, rels in sorted(g.successors(u, allowed)):
                if v not in members or not rels & first:
                    continue
                bits = 0
                for i, req in enumerate(rest):
                    if rels & req:
                        bits |= 1 << i
                path = _bfs(g, members, allowed, rest, v, bits, u, left)
                if path is not None:
                    return [u, *path]
    return None
