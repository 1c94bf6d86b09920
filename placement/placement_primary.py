"""Preferred primaries: one member per partition, each node within 1 of its primary target.

Target. Node ``i`` holding ``ℓ_i`` replicas of a zone with ``R'`` replicas per partition leads
``ℓ_i / R'`` partitions on average; the count is kept in ``[⌊ℓ_i/R'⌋, ⌈ℓ_i/R'⌉]``. This is always
achievable: "every member leads with probability 1/R'" is a fractional solution with exactly these
node totals, and flow integrality rounds it to an integral one within floor/ceil. With equal loads
(±1) the counts are ±1 across nodes; with weights or failure domains they follow the loads.

Stickiness. A current primary that is still a member stays primary unless its node is already
at its upper bound. Repairs use shortest alternating paths, so they change few primaries.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from numpy.typing import NDArray

I64 = NDArray[np.int64]


def choose_primaries(members: I64, load: I64, current: I64, row_key: NDArray[np.uint64]) -> I64:
    """The primary node of every row of ``members`` (rows × R' node indices).

    ``current[p]`` is the row's current primary or -1.
    """
    width = members.shape[1]
    lo = load // width
    hi = -(-load // width)
    primary = _sticky(members, current, hi, row_key)
    open_rows = np.flatnonzero(primary < 0)
    if open_rows.size:
        _greedy(members, primary, open_rows[np.argsort(row_key[open_rows])], lo, hi)
    count = np.bincount(primary, minlength=len(load))
    if ((count > hi) | (count < lo)).any():
        _Balancer(members, primary, lo, hi).run()
    return primary


def _sticky(members: I64, current: I64, hi: I64, row_key: NDArray[np.uint64]) -> I64:
    """Current primaries that are still members, at most ``hi`` per node (lowest row keys win)."""
    primary = np.full(len(members), -1, dtype=np.int64)
    valid = (current >= 0) & (members == current[:, None]).any(axis=1)
    rows = np.flatnonzero(valid)
    if rows.size == 0:
        return primary
    nodes = current[rows]
    order = np.lexsort((row_key[rows], nodes))
    rows, nodes = rows[order], nodes[order]
    group_start = np.searchsorted(nodes, nodes, side="left")
    within = np.arange(len(nodes)) - group_start
    ok = within < hi[nodes]
    primary[rows[ok]] = nodes[ok]
    return primary


def _greedy(members: I64, primary: I64, rows: I64, lo: I64, hi: I64) -> None:
    """Each open row picks the member furthest below its bounds (ties: lowest index).

    Members are sorted, so a strict comparison keeps the lowest index on ties.
    """
    count = np.bincount(primary[primary >= 0], minlength=len(lo)).tolist()
    lo_l, hi_l = lo.tolist(), hi.tolist()
    full = 1 << 40
    chosen = []
    for row_members in members[rows].tolist():
        best, best_key = -1, full * 2
        for i in row_members:
            key = count[i] - lo_l[i] + (full if count[i] >= hi_l[i] else 0)
            if key < best_key:
                best, best_key = i, key
        chosen.append(best)
        count[best] += 1
    primary[rows] = chosen


class _Balancer:
    """Moves primaries along alternating paths until every node is within its bounds.

    Upper fix: a node above ``hi`` hands one of its rows to a co-member, who hands one on, … until
    a node below ``hi`` takes it. Lower fix: symmetric, ending at a node above ``lo``. Both exist
    whenever the bounds are feasible (they are, see the module docstring); intermediate nodes keep
    their counts, so one fix never breaks another.
    """

    def __init__(self, members: I64, primary: I64, lo: I64, hi: I64) -> None:
        self.members = members
        self.primary = primary
        self.lo = lo
        self.hi = hi
        self.count = np.bincount(primary, minlength=len(lo))
        flat = members.ravel()
        order = np.argsort(flat, kind="stable")
        self.by_node = order // members.shape[1]
        self.starts = np.searchsorted(flat[order], np.arange(len(lo) + 1))

    def rows_of(self, node: int) -> I64:
        rows: I64 = self.by_node[self.starts[node] : self.starts[node + 1]]
        return rows

    def run(self) -> None:
        for node in np.flatnonzero(self.count > self.hi).tolist():
            while self.count[node] > self.hi[node]:
                self._shift(node, give=True)
        for node in np.flatnonzero(self.count < self.lo).tolist():
            while self.count[node] < self.lo[node]:
                self._shift(node, give=False)

    def _shift(self, start: int, give: bool) -> None:
        """BFS for one alternating path from ``start`` and apply it."""
        parent: dict[int, tuple[int, int]] = {start: (-1, -1)}
        queue: deque[int] = deque([start])
        while queue:
            node = queue.popleft()
            rows = self.rows_of(node)
            if give:
                rows = rows[self.primary[rows] == node]
                nexts = [(r, w) for r in rows.tolist() for w in self.members[r].tolist()]
            else:
                rows = rows[self.primary[rows] != node]
                nexts = list(zip(rows.tolist(), self.primary[rows].tolist(), strict=True))
            for row, other in nexts:
                if other in parent:
                    continue
                parent[other] = (row, node)
                done = (
                    self.count[other] < self.hi[other]
                    if give
                    else self.count[other] > self.lo[other]
                )
                if done:
                    self._apply(parent, other, give)
                    return
                queue.append(other)
        raise AssertionError("placement primaries: no alternating path (infeasible bounds)")

    def _apply(self, parent: dict[int, tuple[int, int]], end: int, give: bool) -> None:
        node = end
        self.count[end] += 1 if give else -1
        while True:
            row, prev = parent[node]
            if row < 0:
                break
            self.primary[row] = node if give else prev
            node = prev
        self.count[node] += -1 if give else 1
