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

import bisect
import heapq
from collections import deque

import numpy as np
from numpy.typing import NDArray

from placement.algo.solver import lex_order, stable_argsort

I64 = NDArray[np.int64]


def choose_primaries(
    members: I64,
    load: I64,
    current: I64,
    row_key: NDArray[np.uint64],
    fleet_rank: I64 | None = None,
) -> I64:
    """The primary node of every row of ``members`` (rows × R' node indices).

    ``current[p]`` is the row's current primary or -1. ``fleet_rank`` (a distinct rank per
    node, :mod:`placement.algo.fleet`) replaces the node index as the tie-breaker of the rows
    without a kept primary: among members equally far below their bounds, the one leading
    fewest partitions in the other zones leads.
    """
    width = members.shape[1]
    lo = load // width
    hi = -(-load // width)
    return fewest_changes(
        members, _choose(members, lo, hi, current, row_key, fleet_rank), current, lo, hi
    )


def _choose(
    members: I64,
    lo: I64,
    hi: I64,
    current: I64,
    row_key: NDArray[np.uint64],
    fleet_rank: I64 | None,
) -> I64:
    """Sticky, then greedy, then balanced: primaries within bounds, few of them changed."""
    primary = _sticky(members, current, hi, row_key)
    open_rows = np.flatnonzero(primary < 0)
    if not open_rows.size:
        return _balanced(members, primary, lo, hi)
    # Row keys are distinct: the stable order of lex_order is argsort's only order.
    rows = open_rows[lex_order((), row_key[open_rows])]
    if fleet_rank is None:
        _greedy(members, primary, rows, lo, hi)
        return _balanced(members, primary, lo, hi)
    ranked = primary.copy()
    _greedy_ranked(members, ranked, rows, lo, hi, fleet_rank)
    ranked = _balanced(members, ranked, lo, hi)
    changed = np.count_nonzero(ranked != current)
    if changed == len(rows):  # only the open rows changed: no order can change fewer
        return ranked
    # The fleet only breaks ties: never more primaries changed than without it.
    _greedy(members, primary, rows, lo, hi)
    plain = _balanced(members, primary, lo, hi)
    return ranked if changed <= np.count_nonzero(plain != current) else plain


def _balanced(members: I64, primary: I64, lo: I64, hi: I64) -> I64:
    """``primary`` with every node's count brought within ``[lo, hi]`` (in place)."""
    count = np.bincount(primary, minlength=len(lo))
    if ((count > hi) | (count < lo)).any():
        _Balancer(members, primary, lo, hi).run()
    return primary


#: The searches for negative cycles stop once their member slots (rows × R' per search) add
#: up to this: about 0.1 s (P = 10,000 at R = 3 takes 20 searches after a join; a zone of
#: 65,536 × 3 at least 10). Work, not time, so the answer is the same on every machine.
CYCLE_WORK = 2_000_000


def fewest_changes(members: I64, primary: I64, current: I64, lo: I64, hi: I64) -> I64:
    """``primary`` (within bounds) changed along negative cycles until none is left: then no
    assignment of primaries to these members within the bounds keeps more current primaries.

    The primaries are a min-cost flow (row → member, cost −1 at the row's current primary;
    node ``i`` between ``lo[i]`` and ``hi[i]``), and a flow is optimal exactly when its residual
    graph has no negative cycle. On nodes: an edge ``a → b`` is a row that ``a`` leads and
    ``b`` is a member of, handed from ``a`` to ``b`` — cost +1 if ``a`` is its current primary,
    −1 if ``b`` is, else 0 (the cheapest such row per pair); the bounds close the other
    cycles: a path from a node above ``lo`` to a node below ``hi``. Bellman-Ford, vectorised
    over the edges, finds negative cycles (all those its predecessor graph holds at once), and
    once there are none, negative such paths (all of them that share no node); each moves at
    least one current primary back. The searches stop at :data:`CYCLE_WORK` (then the
    primaries are better, not proven best).
    """
    rows, width = members.shape
    searches = CYCLE_WORK // max(1, rows * width)
    if width < 2 or not searches:
        return primary
    n = len(lo)
    _direct_returns(members, primary, current, lo, hi)
    for _ in range(searches):
        moves = _improvements(members, primary, current, lo, hi, n)
        if moves is None:
            return primary
        for r, b in moves:
            primary[r] = b
    return primary


def _direct_returns(members: I64, primary: I64, current: I64, lo: I64, hi: I64) -> None:
    """The cycles of two edges, done first and in bulk: a row whose current primary is a
    member below ``hi`` goes back to it when its leader is above ``lo`` (in place)."""
    back = np.flatnonzero((primary != current) & (members == current[:, None]).any(axis=1))
    if not len(back):
        return
    count = np.bincount(primary, minlength=len(lo)).tolist()
    low, high = lo.tolist(), hi.tolist()
    for r, a, b in zip(back.tolist(), primary[back].tolist(), current[back].tolist(), strict=True):
        if count[b] < high[b] and count[a] > low[a]:
            primary[r] = b
            count[a] -= 1
            count[b] += 1


def _improvements(
    members: I64, primary: I64, current: I64, lo: I64, hi: I64, n: int
) -> list[tuple[int, int]] | None:
    """The (row, new leader) moves of negative cycles (or, when none is left, negative paths
    between the bounds) that share no node; None when there is none: ``primary`` keeps the
    most current primaries."""
    rows, width = members.shape
    here = np.repeat(primary, width - 1)
    other = members[members != primary[:, None]]
    if len(other) != len(here):  # a leader that is not a member: nothing to improve safely
        return None
    row = np.repeat(np.arange(rows), width - 1)
    cur = current[row]
    cost = (here == cur).astype(np.int64) - (other == cur)
    if not (cost < 0).any():
        return None  # no row can return to its current primary: no cycle or path costs < 0
    # The cheapest row per (from, to) pair, the first in row order on a tie: one sort of a key
    # packing pair, cost and row (a third of the time of a lexsort on two keys).
    key = ((here * n + other) * 3 + cost + 1) * rows + row
    key.sort()
    packed, row = np.divmod(key, rows)
    code, cost = np.divmod(packed, 3)
    first = np.ones(len(code), dtype=np.bool_)
    first[1:] = code[1:] != code[:-1]
    code, cost, row = code[first], cost[first] - 1, row[first]
    tails, heads = code // n, code % n
    tail_list, head_list, via = tails.tolist(), heads.tolist(), row.tolist()

    def moves_of(parents: list[int], start: int, stop: int) -> list[tuple[int, int]]:
        """The moves of the parent edges from ``start`` back to ``stop`` (or to a root)."""
        out: list[tuple[int, int]] = []
        v = start
        while True:
            e = parents[v]
            if e < 0:
                return out
            out.append((via[e], head_list[e]))
            v = tail_list[e]
            if v == stop:
                return out

    # Negative cycles among the nodes: Bellman-Ford from every node at once.
    dist, parents, cycles = _bellman_ford(np.zeros(n, dtype=np.int64), tails, heads, cost)
    if cycles:
        # The cycles share no vertex, so no row and no node's bound: all go at once.
        return [m for start in cycles for m in moves_of(parents, start, start)]
    if dist is None:
        return None
    # None left: negative paths from a node above ``lo`` (it may give a row) to a node below
    # ``hi`` (it may take one) — the cycles through the bounds.
    count = np.bincount(primary, minlength=n)
    start = np.where(count > lo, 0, _FAR)
    dist, parents, _ = _bellman_ford(start, tails, heads, cost)
    if dist is None:
        return None
    ends = np.flatnonzero((count < hi) & (dist < 0))
    ends = ends[np.lexsort((ends, dist[ends]))]  # the most negative first
    used: set[int] = set()
    moves: list[tuple[int, int]] = []
    for end in ends.tolist():
        path = [end]
        while parents[path[-1]] >= 0:
            path.append(tail_list[parents[path[-1]]])
        if used.isdisjoint(path):  # paths sharing no node change disjoint rows and bounds
            used.update(path)
            moves += moves_of(parents, end, -1)
    return moves or None


#: A distance no path reaches.
_FAR = 1 << 40


def _bellman_ford(
    dist: I64, tails: I64, heads: I64, costs: I64
) -> tuple[I64 | None, list[int], list[int]]:
    """Bellman-Ford from ``dist`` (in place), each round vectorised over the edges: every vertex
    takes its cheapest offer of the round (the lowest edge id on a tie). Returns the distances
    (None when ``len(dist)`` rounds did not settle them), the edge that last lowered each
    vertex (-1: none) and a vertex on each cycle of those edges. Such a cycle is negative:
    each such edge (u, v) has dist[v] ≥ dist[u] + cost, strictly for the successor of the
    cycle's most recently lowered vertex. The vertices of a cycle found are frozen (they make
    and take no more offers) and the search goes on while each round finds more, so one search
    finds many cycles."""
    n = len(dist)
    parent = np.full(n, -1, dtype=np.int64)
    by_head = np.argsort(heads, kind="stable")
    tail_list = tails.tolist()
    live = np.ones(n, dtype=np.bool_)
    cycles: list[int] = []
    frozen: set[int] = set()
    for _ in range(n):
        offer = dist[tails[by_head]] + costs[by_head]
        better = (offer < dist[heads[by_head]]) & live[tails[by_head]] & live[heads[by_head]]
        if not better.any():
            return dist, parent.tolist(), cycles
        edge, value = by_head[better], offer[better]
        pick = np.lexsort((edge, value, heads[edge]))
        edge, value = edge[pick], value[pick]
        head = heads[edge]
        first = np.ones(len(edge), dtype=np.bool_)
        first[1:] = head[1:] != head[:-1]
        dist[head[first]] = value[first]
        parent[head[first]] = edge[first]
        parents = parent.tolist()
        found = _parent_cycles(parents, tail_list, frozen)
        if cycles and not found:
            break  # the rounds after the first cycles find no more: stop with those
        for start in found:
            cycles.append(start)
            v = start
            while v not in frozen:
                frozen.add(v)
                live[v] = False
                v = tail_list[parents[v]]
    return (dist if cycles else None), parent.tolist(), cycles


def _parent_cycles(parent: list[int], tails: list[int], skip: set[int]) -> list[int]:
    """A vertex on each cycle of the graph ``v → tails[parent[v]]`` that avoids ``skip`` (one
    edge out of every vertex, so its cycles share no vertex)."""
    state = [2 if v in skip else 0 for v in range(len(parent))]  # 1: on the walk, 2: done
    found = []
    for s in range(len(parent)):
        if state[s]:
            continue
        walk = []
        v = s
        while v >= 0 and not state[v]:
            state[v] = 1
            walk.append(v)
            v = tails[parent[v]] if parent[v] >= 0 else -1
        if v >= 0 and state[v] == 1:
            found.append(v)
        for w in walk:
            state[w] = 2
    return found


def _sticky(members: I64, current: I64, hi: I64, row_key: NDArray[np.uint64]) -> I64:
    """Current primaries that are still members, at most ``hi`` per node (lowest row keys win)."""
    valid = members[:, 0] == current  # never true for -1 (no current primary)
    for column in range(1, members.shape[1]):
        valid |= members[:, column] == current
    lead = np.where(valid, current, -1)
    held = np.bincount(lead + 1, minlength=len(hi) + 1)[1:]  # bin 0: rows without one
    over = np.zeros(len(hi) + 1, dtype=np.bool_)  # over[-1]: rows without a valid primary
    over[:-1] = held > hi
    if not over.any():
        return lead
    # Only the nodes above ``hi`` need the row-key order; the others keep all their rows.
    taken = over[lead]
    primary = np.where(taken, -1, lead)
    rows = np.flatnonzero(taken)
    nodes = lead[rows]
    excess = np.bincount(nodes, minlength=len(hi)) - hi
    if FAST_STICKY and excess.max() <= 4:
        # Few rows too many per node: drop each node's largest row keys one at a time
        # (row keys are distinct, so "the hi smallest" is the same set).
        keys = row_key[rows]
        above = excess[nodes]
        drop = np.zeros(len(rows), dtype=np.bool_)
        for step in range(int(excess.max())):
            largest = np.zeros(len(hi), dtype=np.uint64)
            if step:
                live = ~drop
                np.maximum.at(largest, nodes[live], keys[live])
            else:
                np.maximum.at(largest, nodes, keys)
            drop |= (keys == largest[nodes]) & (above > step)
        primary[rows] = np.where(drop, -1, nodes)
        return primary
    order = lex_order((nodes,), row_key[rows])
    rows, nodes = rows[order], nodes[order]
    start = np.zeros(len(nodes), dtype=np.bool_)
    start[0] = True
    start[1:] = nodes[1:] != nodes[:-1]
    first = np.flatnonzero(start)
    within = np.arange(len(nodes)) - np.repeat(first, np.diff(np.append(first, len(nodes))))
    ok = within < hi[nodes]
    primary[rows[ok]] = nodes[ok]
    return primary


def _greedy(members: I64, primary: I64, rows: I64, lo: I64, hi: I64) -> None:
    """Each open row picks the member furthest below its bounds (ties: lowest index).

    A node's key is ``count − lo``, plus a large constant once it reaches ``hi``; it is kept
    per node and updated when the node's count changes. Members are sorted, so a strict
    comparison keeps the lowest index on ties.
    """
    count = np.bincount(primary[primary >= 0], minlength=len(lo)).tolist()
    lo_l, hi_l = lo.tolist(), hi.tolist()
    full = 1 << 40
    key = [
        c - low + (full if c >= high else 0) for c, low, high in zip(count, lo_l, hi_l, strict=True)
    ]
    chosen = []
    for row_members in members[rows].tolist():
        best, best_key = -1, full * 4
        for i in row_members:
            k = key[i]
            if k < best_key:
                best, best_key = i, k
        chosen.append(best)
        c = count[best] + 1
        count[best] = c
        key[best] = c - lo_l[best] + (full if c >= hi_l[best] else 0)
    primary[rows] = chosen


def _greedy_ranked(
    members: I64, primary: I64, rows: I64, lo_a: I64, hi_a: I64, fleet_rank: I64
) -> None:
    """:func:`_greedy` from the nodes' side, for a fleet rank.

    Each node first gets a *goal* in its bounds: ``lo``, and ``lo + 1`` for the nodes least
    loaded in the fleet (by ``fleet_rank``) while primaries are left over. Then the node with
    the lowest key — furthest below its goal, then least loaded in the fleet; a node at its
    goal only after every node below its own, a node at ``hi`` last — leads the one of its
    open rows that its co-members need least (a co-member below its goal with no other open
    row needs it most), its key is updated, and so on until every row has a primary. The
    bounds repair that follows (:class:`_Balancer`) fixes what the goals could not reach.
    """
    count = np.bincount(primary[primary >= 0], minlength=len(lo_a)).tolist()
    lo, hi, rank = lo_a.tolist(), hi_a.tolist(), fleet_rank.tolist()
    n, full = len(rank), 1 << 40
    goal = [max(low, c) for low, c in zip(lo, count, strict=True)]
    spare = len(rows) + sum(count) - sum(goal)
    for i in sorted(range(n), key=rank.__getitem__):
        if spare <= 0:
            break
        if goal[i] < hi[i]:
            goal[i] += 1
            spare -= 1

    def key_of(i: int, c: int) -> int:
        reached = (full if c >= goal[i] else 0) + (full if c >= hi[i] else 0)
        return int((c - goal[i] + reached) * n + rank[i])

    row_list = rows.tolist()
    row_of = members[rows].tolist()
    of_node: list[list[int]] = [[] for _ in range(n)]
    for position, row_members in enumerate(row_of):
        for i in row_members:
            of_node[i].append(position)
    key = [key_of(i, count[i]) if of_node[i] else 0 for i in range(n)]  # members of open rows
    chosen = [-1] * len(row_list)
    left = [len(rows_of_node) for rows_of_node in of_node]  # open rows per node
    last = full * 8 * n  # below every key: a member whose last open row this is
    heap = [(key[i], i) for i in range(n) if of_node[i]]
    heapq.heapify(heap)
    while heap:
        k, i = heapq.heappop(heap)
        if k != key[i]:
            continue  # a stale entry: the node's key changed since
        mine = [r for r in of_node[i] if chosen[r] < 0]
        of_node[i] = mine
        if not mine:
            continue  # every row of this node has a primary
        best = mine[0]
        if len(mine) > 1:
            # the open row whose other members need it least: a member below its goal with
            # no other open row needs it most, then the member with the lowest key
            best_need = -1 << 62
            for r in mine:
                need = min(
                    (
                        key[m] - (last if left[m] == 1 and count[m] < goal[m] else 0)
                        for m in row_of[r]
                        if m != i
                    ),
                    default=1 << 61,
                )
                if need > best_need:
                    best, best_need = r, need
        chosen[best] = i
        for m in row_of[best]:
            left[m] -= 1
        c = count[i] + 1
        count[i] = c
        key[i] = key_of(i, c)
        heapq.heappush(heap, (key[i], i))
    primary[rows] = chosen


#: Use the per-node maximum in :func:`_sticky` when few rows are too many (tests switch it off
#: to compare with the general path).
FAST_STICKY = True
#: In :meth:`_Balancer._shift`, test for the end of the path before deduplicating a scan.
FAST_END = True
#: Upper-fix searches expand each node as soon as it is reached (:meth:`_Balancer._give_by_level`;
#: tests switch it off to compare with the queue-based search).
FAST_LEVEL = True


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
        self._by_node: I64 | None = None
        self._starts: I64 | None = None
        self._scans = 0
        #: The rows each node leads, built by the first search that asks (:meth:`led`) and
        #: kept up to date by :meth:`_lead`, the only writer of ``primary`` from then on.
        self._led: list[set[int]] | None = None
        self._led_sorted: dict[int, I64] = {}  # led(node) until node gains or loses a row
        self._led_scans = 0

    def led(self, node: int) -> I64:
        """The rows ``node`` leads, in row order (an index: a scan of every row per expansion
        made long searches O(P) per node reached)."""
        if self._led is None:
            if self._led_scans < 64:  # a few searches: a scan is cheaper than the index
                self._led_scans += 1
                return np.flatnonzero(self.primary == node)
            by_lead = stable_argsort(self.primary, len(self.lo))
            counts = np.bincount(self.primary, minlength=len(self.lo))
            self._led = [set(part.tolist()) for part in np.split(by_lead, np.cumsum(counts)[:-1])]
        rows = self._led_sorted.get(node)
        if rows is None:
            rows = self._led_sorted[node] = np.asarray(sorted(self._led[node]), dtype=np.int64)
        return rows

    def _lead(self, row: int, node: int) -> None:
        """``node`` leads ``row`` from now on."""
        if self._led is not None:
            old = int(self.primary[row])
            self._led[old].discard(row)
            self._led[node].add(row)
            self._led_sorted.pop(old, None)
            self._led_sorted.pop(node, None)
        self.primary[row] = node

    def rows_of(self, node: int) -> I64:
        """The rows ``node`` is a member of, in row order.

        The first few calls scan the matrix; later ones build and use an index by node.
        """
        if self._by_node is None and self._scans < 8:
            self._scans += 1
            hit = self.members == node
            found = hit[:, 0].copy()
            for column in range(1, hit.shape[1]):
                found |= hit[:, column]
            return np.flatnonzero(found)
        if self._by_node is None or self._starts is None:
            flat = self.members.ravel()
            self._by_node = stable_argsort(flat, len(self.lo)) // self.members.shape[1]
            self._starts = np.zeros(len(self.lo) + 1, dtype=np.int64)
            np.cumsum(np.bincount(flat, minlength=len(self.lo)), out=self._starts[1:])
        rows: I64 = self._by_node[self._starts[node] : self._starts[node + 1]]
        return rows

    def run(self) -> None:
        over = np.flatnonzero(self.count > self.hi)
        if over.size:
            self._hand_all(over)
        for node in np.flatnonzero(self.count < self.lo).tolist():
            self._take_direct(node)
            while self.count[node] < self.lo[node]:
                self._shift(node, give=False)

    def _hand_all(self, over: I64) -> None:
        """The upper fix of every node of ``over`` in turn, with the short paths batched.

        Same choices as repeated :meth:`_shift` calls per node: while a path of length one
        exists, the search takes the first member below ``hi`` in the giver's rows (row order,
        then member order). Those (giver, row, member) candidates are listed once for all
        givers: a member at or above ``hi`` stays there while givers give, so the list only
        loses entries. When no such path is left, :meth:`_shift` searches longer ones; the
        list is patched for the rows they move.
        """
        count, hi = self.count.tolist(), self.hi.tolist()  # Python ints in the loop
        todo = over.tolist()
        queue = self._candidates(over)
        pending = set(todo)
        j = 0
        for start in todo:
            pending.discard(start)
            while j < len(queue) and queue[j][0] < start:
                j += 1
            given = -1
            while j < len(queue) and queue[j][0] == start and count[start] > hi[start]:
                _, row, other = queue[j]
                j += 1
                if row != given and count[other] < hi[other]:
                    self._lead(row, other)
                    count[other] += 1
                    count[start] -= 1
                    given = row
            if count[start] <= hi[start]:
                continue
            self.count[:] = count
            while self.count[start] > self.hi[start]:
                # A longer path moves rows between its nodes; a row it moves *into* a giver
                # holds no member below ``hi`` (the search would have stopped there), so only
                # the entries of rows moved *out of* a giver still to come must go.
                for row, old, _ in self._shift(start, give=True):
                    if old in pending:
                        at = bisect.bisect_left(queue, (old, row))
                        while at < len(queue) and queue[at][:2] == (old, row):
                            del queue[at]
            count = self.count.tolist()
        self.count[:] = count

    def _candidates(self, givers: I64) -> list[tuple[int, int, int]]:
        """(giver, row, member) for the rows of ``givers`` and their members below ``hi``.

        Sorted: by giver, then row, then member — the scan order of :meth:`_shift`.
        """
        primary = self.primary
        taker = self.count < self.hi
        giving = np.zeros(len(self.lo), dtype=np.bool_)
        giving[givers] = True
        near = taker[self.members]
        reach = near[:, 0].copy()
        for column in range(1, near.shape[1]):
            reach |= near[:, column]
        rows = np.flatnonzero(giving[primary] & reach)
        rows = rows[stable_argsort(primary[rows], len(self.lo))]
        owner = primary[rows]
        others = self.members[rows]
        ri, ci = np.nonzero(taker[others] & (others != owner[:, None]))
        return list(
            zip(owner[ri].tolist(), rows[ri].tolist(), others[ri, ci].tolist(), strict=True)
        )

    def _take_direct(self, start: int) -> None:
        """The paths of length one that :meth:`_shift` would find first for the lower fix.

        ``_shift(start, give=False)`` scans the rows ``start`` is a member of but does not lead,
        in row order, and takes the first whose primary is above ``lo``. A primary passed over
        stays at or below ``lo`` (taking only lowers counts), so one forward scan makes the
        same choices as repeated searches; when it runs out, ``_shift`` continues.
        """
        count, lo, primary = self.count, self.lo, self.primary
        rows = self.rows_of(start)
        rows = rows[primary[rows] != start]
        others = primary[rows]
        at = 0
        while count[start] < lo[start]:
            rest = others[at:]
            ok = count[rest] > lo[rest]
            k = int(ok.argmax()) if len(ok) else 0
            if not len(ok) or not ok[k]:
                return
            i = at + k
            self._lead(int(rows[i]), start)
            count[others[i]] -= 1
            count[start] += 1
            at = i + 1

    def _shift(self, start: int, give: bool) -> list[tuple[int, int, int]]:
        """BFS for one alternating path from ``start`` and apply it.

        Returns the changes as (row, previous primary, new primary).

        A node's neighbours are scanned in row order (members in index order when giving);
        the first one not reached yet that can end the path does. Each expansion is vectorised:
        the neighbours not reached yet, deduplicated keeping first occurrences, in scan order.
        """
        if give and FAST_END and FAST_LEVEL:
            return self._give_by_level(start)
        n_nodes = len(self.lo)
        reached = np.zeros(n_nodes, dtype=np.bool_)
        reached[start] = True
        via_row = np.full(n_nodes, -1, dtype=np.int64)
        via_node = np.full(n_nodes, -1, dtype=np.int64)
        # Counts do not change during the search: which nodes can end a path is fixed.
        ends = self.count < self.hi if give else self.count > self.lo
        queue: deque[int] = deque([start])
        while queue:
            node = queue.popleft()
            if give:
                rows = self.led(node)
                width = self.members.shape[1]
                others = self.members[rows].ravel()
                rows = np.repeat(rows, width)
            else:
                rows = self.rows_of(node)
                rows = rows[self.primary[rows] != node]
                others = self.primary[rows]
            fresh = ~reached[others]
            if FAST_END:
                # The first fresh entry that ends a path is its node's first occurrence: the
                # path is found without deduplicating the scan.
                end = fresh & ends[others]
                k = int(end.argmax()) if len(end) else 0
                if len(end) and end[k]:
                    via_row[others[k]], via_node[others[k]] = rows[k], node
                    return self._apply(via_row, via_node, int(others[k]), give)
            rows, others = rows[fresh], others[fresh]
            if not len(others):
                continue
            # First occurrences, in scan order.
            by_value = np.argsort(others, kind="stable")
            ordered = others[by_value]
            new = np.ones(len(ordered), dtype=np.bool_)
            new[1:] = ordered[1:] != ordered[:-1]
            first = np.sort(by_value[new])
            rows, others = rows[first], others[first]
            if not FAST_END:  # otherwise known: no fresh entry ends a path
                done = ends[others]
                k = int(done.argmax())
                if done[k]:
                    via_row[others[k]], via_node[others[k]] = rows[k], node
                    return self._apply(via_row, via_node, int(others[k]), give)
            reached[others] = True
            via_row[others], via_node[others] = rows, node
            queue.extend(others.tolist())
        raise AssertionError("placement primaries: no alternating path (infeasible bounds)")

    def _give_by_level(self, start: int) -> list[tuple[int, int, int]]:
        """:meth:`_shift` for the upper fix, expanding nodes as soon as they are reached.

        A node that can end the path never enters the search as an intermediate (its first
        occurrence ends it), so an expansion ends the search exactly when it holds such a node,
        whichever nodes were reached before. Nodes are expanded in the order of the BFS (first
        occurrence in the expansions of the previous level, in order), each as soon as it is
        found: usually the first node reached from ``start`` ends the search, and the rest of
        the start's expansion is never deduplicated.
        """
        members = self.members
        width = members.shape[1]
        ends = self.count < self.hi
        reached = {start}
        via: dict[int, tuple[int, int]] = {}

        def expand(node: int) -> tuple[I64, I64, int]:
            led = self.led(node)
            block = members[led].ravel()
            hit = ends[block]
            k = int(hit.argmax()) if len(hit) else 0
            return led, block, k if len(hit) and hit[k] else -1

        node = start
        led, block, k = expand(start)
        level = [(start, led, block)]
        while k < 0 and level:
            found: list[tuple[int, I64, I64]] = []
            for node, led, block in level:
                for at, other in enumerate(block.tolist()):
                    if other in reached:
                        continue
                    reached.add(other)
                    via[other] = (int(led[at // width]), node)
                    found_led, found_block, k = expand(other)
                    if k >= 0:
                        node, led, block = other, found_led, found_block
                        break
                    found.append((other, found_led, found_block))
                if k >= 0:
                    break
            level = found
        if k < 0:
            raise AssertionError("placement primaries: no alternating path (infeasible bounds)")
        end = int(block[k])
        via[end] = (int(led[k // width]), node)
        return self._apply_via(via, end)

    def _apply_via(self, via: dict[int, tuple[int, int]], end: int) -> list[tuple[int, int, int]]:
        """:meth:`_apply` of an upper-fix path recorded as ``via[node] = (row, parent)``."""
        node = end
        changes = []
        self.count[end] += 1
        while node in via:
            row, prev = via[node]
            self._lead(row, node)
            changes.append((row, prev, node))
            node = prev
        self.count[node] -= 1
        return changes

    def _apply(
        self, via_row: I64, via_node: I64, end: int, give: bool
    ) -> list[tuple[int, int, int]]:
        node = end
        changes = []
        self.count[end] += 1 if give else -1
        while True:
            row, prev = int(via_row[node]), int(via_node[node])
            if row < 0:
                break
            old, new = (prev, node) if give else (node, prev)
            self._lead(row, new)
            changes.append((row, old, new))
            node = prev
        self.count[node] += -1 if give else 1
        return changes
