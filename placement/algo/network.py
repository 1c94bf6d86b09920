"""A small explicit flow network: min-cost flow and max flow, for the exact steps that are
easier stated as a graph than as the core solver's implicit one (design/placement.md).

Edges are stored in pairs (an edge and its residual twin, ids ``e`` and ``e ^ 1``), so the flow
on edge ``e`` is the twin's capacity. Integer capacities and costs; integral results.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from numpy.typing import NDArray

I64 = NDArray[np.int64]

#: Modules imported only when they are needed (:func:`augment`); whatever runs placement
#: must be able to import them too (Spark executors: placement/pipeline/ship_env.py).
LAZY_IMPORTS = ("scipy.sparse", "scipy.sparse.csgraph")

#: Distance of a vertex no path reaches (above every path's cost).
_UNREACHED = 1 << 62


class Network:
    """A directed network on vertices ``0..vertices-1``."""

    def __init__(self, vertices: int) -> None:
        self.head: list[list[int]] = [[] for _ in range(vertices)]
        self.to: list[int] = []
        self.cap: list[int] = []
        self.cost: list[int] = []

    def add(self, u: int, v: int, cap: int, cost: int = 0, flow: int = 0, low: int = 0) -> int:
        """An edge ``u → v`` (and its residual twin) already carrying ``flow``, which must stay
        within ``[low, cap]``; its id."""
        e = len(self.to)
        self.to += [v, u]
        self.cap += [cap - flow, flow - low]
        self.cost += [cost, -cost]
        self.head[u].append(e)
        self.head[v].append(e + 1)
        return e

    def flow(self, e: int) -> int:
        return self.cap[e ^ 1]

    def push(self, e: int, units: int) -> None:
        self.cap[e] -= units
        self.cap[e ^ 1] += units

    def negative_cycle(self, budget: list[int]) -> list[int] | None:
        """The edges of one negative cycle of the residual graph, or None when there is none
        (or ``budget[0]``, the relaxations left, runs out: then ``budget[0] < 0``).

        Bellman-Ford from every vertex at once (all at distance 0), each round relaxing only
        the edges out of the vertices the round before improved; after every round the
        parent graph is searched for a cycle — any cycle there is negative — so a cycle is
        found as soon as it forms, not after ``n`` rounds."""
        size = len(self.head)
        to, cap, cost, head = self.to, self.cap, self.cost, self.head
        dist = [0] * size
        parent = [-1] * size
        active = list(range(size))
        for _ in range(size):
            improved: list[int] = []
            seen = [False] * size
            for u in active:
                edges = head[u]
                budget[0] -= len(edges)
                # The relaxation of min_cost_flow, written out in both: a shared method
                # called per vertex cost them a quarter more (a 2,000-vertex flow: 7.3 → 9.2 s).
                du = dist[u]
                for e in edges:
                    if cap[e] > 0:
                        v = to[e]
                        dv = du + cost[e]
                        if dv < dist[v]:
                            dist[v] = dv
                            parent[v] = e
                            if not seen[v]:
                                seen[v] = True
                                improved.append(v)
            if budget[0] < 0 or not improved:
                return None
            cycle = self._parent_cycle(parent, improved)
            if cycle is not None:
                return cycle
            active = improved
        return None

    def _parent_cycle(self, parent: list[int], starts: list[int]) -> list[int] | None:
        """A cycle of the parent graph reached from ``starts`` (its edges), or None; O(n)."""
        stamp = [-1] * len(self.head)
        to = self.to
        for k, v in enumerate(starts):
            while v >= 0 and stamp[v] < 0:
                stamp[v] = k
                e = parent[v]
                v = to[e ^ 1] if e >= 0 else -1
            if v >= 0 and stamp[v] == k:  # back on this walk's own path: a cycle
                cycle = []
                u = v
                while True:
                    e = parent[u]
                    cycle.append(e)
                    u = to[e ^ 1]
                    if u == v:
                        return cycle
        return None

    def push_cycle(self, cycle: list[int]) -> None:
        """As many units as the cycle's residual capacities allow, around it."""
        units = min(self.cap[e] for e in cycle)
        for e in cycle:
            self.push(e, units)

    def min_cost_flow(self, source: int, sink: int, need: int) -> int:
        """Send up to ``need`` more units at least cost — successive shortest paths with SPFA
        (Bellman-Ford with a queue), which accepts negative costs; the flow already on the
        edges must be min-cost for its value (none is). Returns the units sent."""
        sent = 0
        size = len(self.head)
        to, cap, cost, head = self.to, self.cap, self.cost, self.head
        while sent < need:
            dist = [_UNREACHED] * size
            via = [-1] * size
            queued = [False] * size
            dist[source] = 0
            queue = deque([source])
            while queue:
                u = queue.popleft()
                queued[u] = False
                # Written out, as in negative_cycle (a shared method: a quarter slower).
                du = dist[u]
                for e in head[u]:
                    if cap[e] > 0:
                        v = to[e]
                        dv = du + cost[e]
                        if dv < dist[v]:
                            dist[v] = dv
                            via[v] = e
                            if not queued[v]:
                                queued[v] = True
                                queue.append(v)
            if dist[sink] == _UNREACHED:
                return sent
            units = need - sent
            v = sink
            while v != source:
                e = via[v]
                units = min(units, cap[e])
                v = to[e ^ 1]
            v = sink
            while v != source:
                e = via[v]
                self.push(e, units)
                v = to[e ^ 1]
            sent += units
        return sent

    def max_flow(self, source: int, sink: int) -> int:
        """Augment the flow on the edges to a maximum (Dinic: BFS levels, then blocking flows
        by depth-first search with a current-edge pointer per vertex); returns the units
        added."""
        added = 0
        to, cap, head = self.to, self.cap, self.head
        size = len(head)
        while True:
            level = [-1] * size
            level[source] = 0
            queue = deque([source])
            while queue and level[sink] < 0:
                u = queue.popleft()
                for e in head[u]:
                    v = to[e]
                    if cap[e] > 0 and level[v] < 0:
                        level[v] = level[u] + 1
                        queue.append(v)
            if level[sink] < 0:
                return added
            at = [0] * size
            while True:
                units = self._blocking(source, sink, level, at)
                if not units:
                    break
                added += units
        return added

    def _blocking(self, source: int, sink: int, level: list[int], at: list[int]) -> int:
        """One augmenting path of the level graph (iterative DFS); the units it carried."""
        to, cap, head = self.to, self.cap, self.head
        path: list[int] = []  # edge ids
        u = source
        while True:
            if u == sink:
                units = min(cap[e] for e in path)
                for e in path:
                    self.push(e, units)
                return units
            edges = head[u]
            k = at[u]
            while k < len(edges):
                e = edges[k]
                v = to[e]
                if cap[e] > 0 and level[v] == level[u] + 1:
                    break
                k += 1
            at[u] = k
            if k < len(edges):
                path.append(edges[k])
                u = to[edges[k]]
                continue
            if u == source:
                return 0
            level[u] = -1  # a dead end for the rest of the phase
            e = path.pop()
            u = to[e ^ 1]
            at[u] += 1


def augment(
    vertices: int, tail: I64, head: I64, cap: I64, flow: I64, source: int, sink: int
) -> tuple[I64, int]:
    """A flow (``flow`` on the edges ``tail → head`` of capacity ``cap``) augmented to a
    maximum, for networks too large for :class:`Network` (hundreds of thousands of edges):
    SciPy's compiled Dinic (``scipy.sparse.csgraph.maximum_flow``) on the residual network —
    each edge's unused capacity forward and its flow backward — so the given flow is kept and
    only augmenting paths are added. No two edges may join the same two vertices, in either
    direction (their residuals would merge). Returns the flow per edge and the units added."""
    from scipy.sparse import csr_array  # ~0.25 s: only when a bound needs it
    from scipy.sparse.csgraph import maximum_flow

    if not len(tail):
        return flow.copy(), 0
    residual = csr_array(
        (
            np.concatenate((cap - flow, flow)).astype(np.int32),
            (np.concatenate((tail, head)), np.concatenate((head, tail))),
        ),
        shape=(vertices, vertices),
    )
    if residual.nnz != 2 * len(tail):
        raise ValueError("augment: two edges join the same two vertices")
    result = maximum_flow(residual, source, sink, method="dinic")
    # The result is antisymmetric: the net units sent tail → head in the residual network.
    sent = np.asarray(result.flow[tail, head], dtype=np.int64).reshape(-1)
    return flow + sent, int(result.flow_value)
