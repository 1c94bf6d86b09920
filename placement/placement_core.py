"""The exact core of the placement function: keep the most current pairs, fill the rest.

Problem. Rows (partitions) ``p`` each need ``demand[p]`` distinct nodes. Node ``i`` must end with
its target load: ``floor[i]``, or ``floor[i] + 1`` for exactly ``extra`` of the eligible nodes
(:class:`~placement.placement_targets.Targets`). Among all such assignments, return one that
contains the most (row, node) pairs of the current assignment ``C`` — the fewest new pairs.

Why the answer is exact. The problem is a min-cost flow: source → row (capacity ``demand``) →
node (capacity 1; cost −1 on a pair of ``C``, 0 otherwise) → sink (capacity ``floor``), plus
node → hub (capacity 1 when eligible) → sink (capacity ``extra``). Every flow of value ``S = Σ
demand`` is a valid assignment and its cost is −(kept pairs). Successive shortest paths (SSP) are
exact: start from a flow that is min-cost for its value, augment along shortest paths.

1. *Keep* (:func:`_keep_current`): a maximum flow that uses pairs of ``C`` only — min-cost for its
   value because every unit costs −1. Greedy (drop from over-full rows, then shed from nodes above
   their target, choosing holes in distinct rows), certified maximal by a cheap test or completed
   by BFS augmenting paths (:func:`_maximize_keep`).
2. *Fill*: because step 1 is maximal, no augmenting path costs < 0, so every 0-cost path is a
   shortest one. A direct path row-with-hole → node-with-room is such a path, which makes the
   vectorised bulk fill (:func:`_bulk_fill`) an exact SSP phase; conflicts (a node twice in a row)
   are repaired by 0-cost swaps with other new pairs (:func:`_swap_repair`). Only when no 0-cost
   path of that shape exists do we run Bellman-Ford (SPFA) on the full residual graph
   (:func:`_shortest_augment`), which may break a kept pair when that is unavoidable.

Invariant at every step: the partial assignment is min-cost for its size, so the final one keeps
the maximum number of current pairs among all balanced assignments.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from placement.placement_hash import mix64
from placement.placement_targets import Targets

I64 = NDArray[np.int64]
Pairs = tuple[I64, I64]


@dataclass(frozen=True, slots=True)
class CoreProblem:
    """One instance of the core problem; indices are 0..rows-1 and 0..nodes-1.

    ``cur_row``/``cur_node`` are the valid current pairs (distinct, nodes eligible, rows in
    range); ``cur_first`` marks the pairs that are their row's current primary, which the core
    prefers to keep when it must drop something. Keys only break ties.
    """

    demand: I64
    targets: Targets
    cur_row: I64
    cur_node: I64
    cur_first: NDArray[np.bool_]
    row_key: NDArray[np.uint64]
    node_key: NDArray[np.uint64]

    @property
    def n_rows(self) -> int:
        return len(self.demand)

    @property
    def n_nodes(self) -> int:
        return len(self.targets.floor)


def solve(pb: CoreProblem) -> Pairs:
    """All (row, node) pairs of a balanced assignment with the fewest pairs outside ``C``."""
    keep, ceil = _keep_current(pb)
    kept_row, kept_node = pb.cur_row[keep], pb.cur_node[keep]
    holes = pb.demand - np.bincount(kept_row, minlength=pb.n_rows)
    free = pb.targets.floor + ceil - np.bincount(kept_node, minlength=pb.n_nodes)
    if not _keep_is_maximal(pb, keep, ceil, holes, free):
        state = _State(pb, kept_row, kept_node, ceil)
        _maximize_keep(state)
        kept_row, kept_node = state.pairs()
        ceil = np.asarray(state.ceil, dtype=np.bool_)
        holes = pb.demand - np.bincount(kept_row, minlength=pb.n_rows)
        free = pb.targets.floor + ceil - np.bincount(kept_node, minlength=pb.n_nodes)
    new_row, new_node = _bulk_fill(pb, holes, free)
    conflict = _conflicts(pb.n_nodes, kept_row, kept_node, new_row, new_node)
    if conflict.any():
        new_node, conflict = _swap_repair(pb, kept_row, kept_node, new_row, new_node, conflict)
    placed = ~conflict
    rows = np.concatenate([kept_row, new_row[placed]])
    nodes = np.concatenate([kept_node, new_node[placed]])
    if placed.all():
        return rows, nodes
    state = _State(pb, rows, nodes, ceil)
    open_rows = state.holes(np.unique(new_row[~placed]).tolist())
    while open_rows:
        if not _zero_augment(state, open_rows):
            _shortest_augment(state, open_rows)
        open_rows = state.holes(open_rows)
    return state.pairs()


# --- phase 1: keep -----------------------------------------------------------------------------


def _keep_current(pb: CoreProblem) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """Greedy keep: which current pairs stay, and which eligible nodes take ``floor + 1``."""
    keep = _truncate_rows(pb)
    load = np.bincount(pb.cur_node[keep], minlength=pb.n_nodes)
    ceil = _choose_ceil(pb, load)
    keep = _shed_nodes(pb, keep, pb.targets.floor + ceil)
    return keep, ceil


def _truncate_rows(pb: CoreProblem) -> NDArray[np.bool_]:
    """Rows with more current members than demanded drop the members on the fullest nodes.

    The current primary is dropped last, then the node furthest above its floor goes first.
    """
    keep = np.ones(len(pb.cur_row), dtype=np.bool_)
    count = np.bincount(pb.cur_row, minlength=pb.n_rows)
    over = np.flatnonzero(count > pb.demand)
    if over.size == 0:
        return keep
    over = over[np.argsort(pb.row_key[over], kind="stable")]
    order = np.argsort(pb.cur_row, kind="stable")
    starts = np.searchsorted(pb.cur_row[order], over)
    excess = (np.bincount(pb.cur_node, minlength=pb.n_nodes) - pb.targets.floor).tolist()
    nodes = pb.cur_node.tolist()
    first = pb.cur_first.tolist()
    node_key = pb.node_key.tolist()
    for row, start in zip(over.tolist(), starts.tolist(), strict=True):
        members = order[start : start + count[row]].tolist()
        members.sort(key=lambda k: (first[k], -excess[nodes[k]], node_key[nodes[k]]))
        for k in members[: count[row] - pb.demand[row]]:
            keep[k] = False
            excess[nodes[k]] -= 1
    return keep


def _choose_ceil(pb: CoreProblem, load: I64) -> NDArray[np.bool_]:
    """The ``extra`` eligible nodes holding most above their floor take ``floor + 1``.

    Giving ``+1`` to a node holding more than its floor costs no move; to any other node it
    costs one. Ranking by ``load − floor`` takes all the free ones first: minimal moves.
    """
    cand = np.flatnonzero(pb.targets.eligible)
    order = np.lexsort((pb.node_key[cand], pb.targets.floor[cand] - load[cand]))
    ceil = np.zeros(pb.n_nodes, dtype=np.bool_)
    ceil[cand[order[: pb.targets.extra]]] = True
    return ceil


def _shed_nodes(pb: CoreProblem, keep: NDArray[np.bool_], cap: I64) -> NDArray[np.bool_]:
    """Nodes above their target drop replicas where the fill can replace them without conflict.

    Preferred rows: no hole yet (a joining node can take all the holes), then rows that hold
    few of the nodes with room (they are the ones that will fill the holes), then non-primary.
    Nodes shed one after the other (in node-key order), each seeing the holes left by the
    previous ones. Vectorised: every node's choice is first computed against the initial holes
    (one global sort); a node's choice stays valid unless one of its chosen rows received a
    hole from an earlier node (holes only grow, so rows it did not choose only get worse), and
    only such nodes are recomputed, in order.
    """
    every = bool(keep.all())  # the usual case: no row was truncated (no gathers needed)
    kept = np.arange(len(keep)) if every else np.flatnonzero(keep)
    kept_node = pb.cur_node if every else pb.cur_node[kept]
    load = np.bincount(kept_node, minlength=pb.n_nodes)
    over = np.flatnonzero(load > cap)
    if over.size == 0:
        return keep
    keep = keep.copy()
    kept_row = pb.cur_row if every else pb.cur_row[kept]
    holes = pb.demand - np.bincount(kept_row, minlength=pb.n_rows)
    room = np.clip(cap - load, 0, None)
    if (room[load > 0] > 0).any():  # a node holding kept pairs has room
        kept_room = room[kept_node]
        blocked = np.bincount(kept_row, weights=kept_room, minlength=pb.n_rows).astype(np.int64)
    else:  # e.g. only a joining node has room: it holds nothing yet
        blocked = np.zeros(pb.n_rows, dtype=np.int64)
    over = over[np.argsort(pb.node_key[over], kind="stable")]
    shed = load[over] - cap[over]
    rank_of = np.full(pb.n_nodes, -1, dtype=np.int64)
    rank_of[over] = np.arange(len(over))
    group = rank_of[kept_node]
    # The shedding nodes' pairs, in row order; ``group`` = the node's rank in shedding order.
    if len(over) == int(np.count_nonzero(load)):  # every node holding pairs sheds (a join)
        seg, rows = kept, kept_row
    else:
        mine = group >= 0
        seg, group, rows = kept[mine], group[mine], kept_row[mine]
    over_key = pb.node_key[over]
    picked = None
    if FAST_SHED and not holes.any() and not blocked.any():  # e.g. a join: no hole, no room
        picked = _shed_by_tie(group, pb.cur_first[seg], pb.row_key[rows], over_key, shed)
    if picked is None:
        tie = mix64(pb.row_key[rows] ^ over_key[group])
        picked = smallest_per_group(
            group, (holes[rows], blocked[rows], pb.cur_first[seg]), tie, shed
        )
    keep[seg[picked]] = False
    chosen = rows[picked]
    bounds = np.concatenate(([0], np.cumsum(shed)))
    owner = np.repeat(np.arange(len(over)), shed)
    settled = -1
    while True:
        # The first node (after those settled) with a chosen row that an earlier node chose too.
        by_row = np.argsort(chosen, kind="stable")
        again_at = by_row[1:][chosen[by_row[1:]] == chosen[by_row[:-1]]]
        later = owner[again_at]
        later = later[later > settled]
        if not later.size:
            return keep
        g = int(later.min())
        lo, hi = int(bounds[g]), int(bounds[g + 1])
        now = holes + np.bincount(chosen[:lo], minlength=pb.n_rows)
        part = np.flatnonzero(group == g)
        seg_g, rows_g = seg[part], rows[part]
        tie_g = mix64(pb.row_key[rows_g] ^ over_key[g])
        redo = np.lexsort((tie_g, pb.cur_first[seg_g], blocked[rows_g], now[rows_g]))
        redo = redo[: shed[g]]
        keep[seg[picked[lo:hi]]] = True
        keep[seg_g[redo]] = False
        picked[lo:hi] = part[redo]
        chosen[lo:hi] = rows_g[redo]
        settled = g


#: Use :func:`_shed_by_tie` when it applies (tests switch it off to compare with the general path).
FAST_SHED = True


def _shed_by_tie(
    group: I64,
    first: NDArray[np.bool_],
    row_key: NDArray[np.uint64],
    over_key: NDArray[np.uint64],
    take: I64,
) -> I64 | None:
    """:func:`smallest_per_group` of :func:`_shed_nodes` when every row has no hole and no
    blocked slot (a join), or None when it cannot decide.

    The order is then (``first``, tie) in every group: when a group has at least ``take[g]``
    non-primary pairs, its choice is the ``take[g]`` of them with the smallest tie (ties broken
    by position). Only the non-primary pairs are hashed, only those below a per-group limit on
    the tie (about four times as many as needed) are sorted; None when a group falls short.
    """
    n_groups = len(take)
    candidates = np.flatnonzero(~first)
    mine = group[candidates]
    size = np.bincount(mine, minlength=n_groups)
    if (size < take).any():
        return None
    tie = mix64(row_key[candidates] ^ over_key[mine])
    share = 4.0 * take / np.maximum(size, 1) + 1 / 256
    limit = np.full(n_groups, np.iinfo(np.uint64).max, dtype=np.uint64)
    partial = share < 1
    limit[partial] = (share[partial] * 2.0**63).astype(np.uint64) * np.uint64(2)
    passing = tie < limit[mine]
    mine, tie, candidates = mine[passing], tie[passing], candidates[passing]
    sizes = np.bincount(mine, minlength=n_groups)
    if (sizes < take).any():
        return None
    order = lex_order((mine,), tie)
    rank = np.arange(len(order)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    ordered = order[rank < take[mine[order]]]
    result: I64 = candidates[ordered]
    return result


def smallest_per_group(
    group: I64,
    keys: Sequence[NDArray[np.int64] | NDArray[np.bool_]],
    tie: NDArray[np.uint64],
    take: I64,
) -> I64:
    """The first ``take[g]`` elements of every group ``g`` in the order (``keys``, ``tie``).

    Positions, group after group (``g`` ascending), each group in that order: the same as
    ``lex_order((group, *keys), tie)`` cut to the first ``take[g]`` of each group, for
    ``take[g]`` at most the group's size. When the keys are small non-negative integers (16
    bits together), rather than sorting everything: count each group's elements per key
    value to find the value class holding its ``take[g]``-th element; the classes below are
    taken whole, and from that class only elements with a small enough ``tie`` go to the
    sort — enough of them to be sure, or the whole class when too few pass.
    """
    n_groups = len(take)
    widths = [int(k.max()).bit_length() if len(k) else 0 for k in keys]
    bits = sum(widths)
    subset: I64 | None = None
    small = all(k.dtype == np.bool_ or not len(k) or int(k.min()) >= 0 for k in keys)
    if small and bits <= 16 and n_groups << bits <= 4 * len(group) + 4096:
        value = np.zeros(len(group), dtype=np.int64)
        for key, width in zip(keys, widths, strict=True):
            if width:
                value <<= width
                value |= key
        counts = np.bincount((group << bits) | value, minlength=n_groups << bits)
        counts = counts.reshape(n_groups, 1 << bits)
        every = np.arange(n_groups)
        total = counts.cumsum(axis=1)
        cut = (total < take[:, None]).sum(axis=1)  # the class of the take-th element
        need = take - np.where(cut > 0, total[every, np.maximum(cut - 1, 0)], 0)
        share = 4.0 * need / np.maximum(counts[every, cut], 1) + 1 / 256
        limit = np.full(n_groups, np.iinfo(np.uint64).max, dtype=np.uint64)
        partial = share < 1
        limit[partial] = (share[partial] * 2.0**63).astype(np.uint64) * np.uint64(2)
        boundary = value == cut[group]
        passing = boundary & (tie < limit[group])
        short = np.bincount(group[passing], minlength=n_groups) < need
        subset = np.flatnonzero((value < cut[group]) | passing | (boundary & short[group]))
    if subset is None:
        subset = np.arange(len(group))
    order = lex_order((group[subset], *(k[subset] for k in keys)), tie[subset])
    ordered = subset[order]
    sizes = np.bincount(group[subset], minlength=n_groups)
    rank = np.arange(len(ordered)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    result: I64 = ordered[rank < take[group[ordered]]]
    return result


def stable_argsort(values: I64, bound: int) -> I64:
    """``np.argsort(values, kind="stable")`` for values in ``[0, bound)``.

    numpy's stable sort of 64-bit integers is a timsort, slow on unordered data: small values
    are radix sorted as 16-bit integers instead; otherwise, when value and position fit in 64
    bits together, ``value · 2^k + position`` is sorted by value (distinct words, same order).
    """
    size = len(values)
    if bound <= 1 << 16:
        order: I64 = np.argsort(values.astype(np.uint16), kind="stable")
        return order
    position_bits = max(size - 1, 1).bit_length()
    if (bound - 1).bit_length() + position_bits <= 63:
        packed = values << position_bits
        packed |= np.arange(size, dtype=np.int64)
        packed.sort()
        packed &= (1 << position_bits) - 1
        return packed
    return np.argsort(values, kind="stable")


def lex_order(
    keys: Sequence[NDArray[np.int64] | NDArray[np.bool_]], tie: NDArray[np.uint64]
) -> I64:
    """``np.lexsort((tie, *reversed(keys)))``: by ``keys`` (most significant first), then ``tie``.

    Fast path: the keys (non-negative), the top bits of ``tie`` and the position are packed into
    one 64-bit word and sorted by value (numpy's vectorised sort is several times faster than
    ``lexsort`` or ``argsort``). Two entries whose packed words agree except for the position
    would need ``tie`` to decide: then, and only then, ``lexsort`` decides.
    """
    size = len(tie)
    if size < 2:
        return np.arange(size, dtype=np.int64)
    widths = []
    for key in keys:
        if key.dtype != np.bool_ and int(key.min()) < 0:
            widths = [64]
            break
        widths.append(int(key.max()).bit_length())
    position_bits = (size - 1).bit_length()
    tie_bits = 64 - sum(widths) - position_bits
    if tie_bits >= 20:
        packed = np.zeros(size, dtype=np.uint64)
        for key, width in zip(keys, widths, strict=True):
            if width:
                packed <<= np.uint64(width)
                packed |= key.astype(np.uint64)
        packed <<= np.uint64(tie_bits)
        packed |= tie >> np.uint64(64 - tie_bits)
        packed <<= np.uint64(position_bits)
        packed |= np.arange(size, dtype=np.uint64)
        packed.sort()
        high = packed >> np.uint64(position_bits)
        if not (high[1:] == high[:-1]).any():
            packed &= np.uint64((1 << position_bits) - 1)
            return packed.astype(np.int64)
    order: I64 = np.lexsort((tie, *keys[::-1]))
    return order


def _keep_is_maximal(
    pb: CoreProblem, keep: NDArray[np.bool_], ceil: NDArray[np.bool_], holes: I64, free: I64
) -> bool:
    """A sufficient test that no augmenting path over current pairs exists.

    Such a path starts at a row with a hole and an unused current pair and must end at a node
    with an unused current pair and room (or one that could take over a ``floor + 1`` slot from
    a node with room). No candidate end, or no candidate start, means the greedy keep is maximal.
    ``holes`` and ``free`` are the rows' missing members and the nodes' room after the keep.
    """
    unused = ~keep
    if not unused.any():
        return True
    if not (holes[pb.cur_row[unused]] > 0).any():
        return True
    ends = np.unique(pb.cur_node[unused])
    if (free[ends] > 0).any():
        return False
    takers = pb.targets.eligible[ends] & ~ceil[ends]
    return not (takers.any() and (ceil & (free > 0)).any())


# --- the mutable state used by the exact (rare) steps --------------------------------------------


class _State:
    """Rows' member sets and nodes' row sets, for augmenting-path searches.

    Vertices of the residual graph are numbered rows ``0..R-1``, nodes ``R..R+N-1``, hub ``R+N``.
    Hole and room are derived from the sets, so applying a path only edits memberships.
    """

    def __init__(self, pb: CoreProblem, rows: I64, nodes: I64, ceil: NDArray[np.bool_]) -> None:
        self.n_rows = pb.n_rows
        self.n_nodes = pb.n_nodes
        self.hub = self.n_rows + self.n_nodes
        self.demand: list[int] = pb.demand.tolist()
        self.floor: list[int] = pb.targets.floor.tolist()
        self.eligible: list[bool] = pb.targets.eligible.tolist()
        self.ceil: list[bool] = ceil.tolist()
        self.members: list[set[int]] = [set() for _ in range(self.n_rows)]
        self.rows_of: list[set[int]] = [set() for _ in range(self.n_nodes)]
        self.fresh_rows_of: list[set[int]] = [set() for _ in range(self.n_nodes)]
        self.cur: list[set[int]] = [set() for _ in range(self.n_rows)]
        for r, i in zip(pb.cur_row.tolist(), pb.cur_node.tolist(), strict=True):
            self.cur[r].add(i)
        for r, i in zip(rows.tolist(), nodes.tolist(), strict=True):
            self.add(r, i)

    def add(self, row: int, node: int) -> None:
        self.members[row].add(node)
        self.rows_of[node].add(row)
        if node not in self.cur[row]:
            self.fresh_rows_of[node].add(row)

    def remove(self, row: int, node: int) -> None:
        self.members[row].remove(node)
        self.rows_of[node].remove(row)
        self.fresh_rows_of[node].discard(row)

    def hole(self, row: int) -> int:
        return self.demand[row] - len(self.members[row])

    def room(self, node: int) -> int:
        return self.floor[node] + self.ceil[node] - len(self.rows_of[node])

    def holes(self, rows: list[int] | None = None) -> list[int]:
        """Rows (of ``rows``, default all) that still miss members."""
        return [r for r in (range(self.n_rows) if rows is None else rows) if self.hole(r) > 0]

    def pairs(self) -> Pairs:
        rows = [r for r in range(self.n_rows) for _ in self.members[r]]
        nodes = [i for r in range(self.n_rows) for i in sorted(self.members[r])]
        return np.asarray(rows, dtype=np.int64), np.asarray(nodes, dtype=np.int64)

    def apply(self, parent: list[int] | dict[int, int], end: int) -> None:
        """Augment along the path ``source row → … → end`` recorded in ``parent``."""
        nodes_lo, hub = self.n_rows, self.hub
        v = end
        while parent[v] != -1:
            u = parent[v]
            if u < nodes_lo:
                self.add(u, v - nodes_lo)
            elif u == hub:
                self.ceil[v - nodes_lo] = False
            elif v == hub:
                self.ceil[u - nodes_lo] = True
            else:
                self.remove(v, u - nodes_lo)
            v = u


def _maximize_keep(st: _State) -> None:
    """Augment from every row with a hole and an unused current pair until none succeeds.

    Kuhn's lemma (a vertex with no augmenting path never gets one later) makes one pass enough;
    the loop repeats while a pass made progress only as a safety net.
    """
    sources = [r for r in range(st.n_rows) if st.hole(r) > 0 and st.cur[r] - st.members[r]]
    progress = True
    while progress and sources:
        progress = False
        for r in sources:
            while st.hole(r) > 0 and _augment_keep(st, r):
                progress = True
        sources = [r for r in sources if st.hole(r) > 0]


def _augment_keep(st: _State, source: int) -> bool:
    """One BFS augmenting path from ``source`` over current pairs only; True when applied."""
    n_rows, hub = st.n_rows, st.hub
    parent: dict[int, int] = {source: -1}
    queue: deque[int] = deque([source])
    while queue:
        v = queue.popleft()
        if v < n_rows:
            for i in sorted(st.cur[v] - st.members[v]):
                u = n_rows + i
                if u not in parent:
                    parent[u] = v
                    if st.room(i) > 0:
                        st.apply(parent, u)
                        return True
                    queue.append(u)
        elif v < hub:
            _expand_node(st, v - n_rows, v, hub, st.rows_of, parent, queue)
        elif _expand_hub(st, n_rows, hub, parent, queue):
            return True
    return False


def _expand_node(
    st: _State,
    i: int,
    v: int,
    hub: int,
    rows_of: Sequence[Collection[int]],
    parent: dict[int, int],
    queue: deque[int],
) -> None:
    """BFS step from node ``i`` (vertex ``v``): to the hub if it may take a ``+1`` slot, and to
    every row it holds (``rows_of``), in row order."""
    if st.eligible[i] and not st.ceil[i] and hub not in parent:
        parent[hub] = v
        queue.append(hub)
    for r in sorted(rows_of[i]):
        if r not in parent:
            parent[r] = v
            queue.append(r)


def _expand_hub(
    st: _State, n_rows: int, hub: int, parent: dict[int, int], queue: deque[int]
) -> bool:
    """BFS step from the hub to the nodes holding ``+1``; applies the path and returns True at
    the first one with room."""
    for j in range(st.n_nodes):
        u = n_rows + j
        if st.ceil[j] and u not in parent:
            parent[u] = hub
            if st.room(j) > 0:
                st.apply(parent, u)
                return True
            queue.append(u)
    return False


# --- phase 2: fill -----------------------------------------------------------------------------


def _bulk_fill(pb: CoreProblem, holes: I64, free: I64) -> Pairs:
    """Holes laid out column by column, nodes' free slots laid out contiguously, zipped.

    Column ``j`` holds the rows with more than ``j`` holes, each column in its own hashed order,
    so that two nodes share few partitions (no node's partitions mirror another's, which would
    concentrate re-replication and make some later moves unavoidable). Nodes that must enter
    every such row go first and fill whole columns. A run of one node's slots can meet a row
    twice only where it crosses a column boundary; :func:`_swap_repair` fixes those.
    ``holes``/``free``: each row's missing members and each node's room after the keep.
    """
    total = int(holes.sum())
    if total != int(free.sum()) or (free < 0).any():
        raise AssertionError("placement core: holes and free slots disagree")
    if total == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    columns = []
    for depth in range(int(holes.max())):
        rows = np.flatnonzero(holes > depth)
        columns.append(rows[lex_order((), mix64(pb.row_key[rows], depth))])
    nodes = np.flatnonzero(free > 0)
    everywhere = free[nodes] == len(columns[0])
    nodes = nodes[np.lexsort((mix64(pb.node_key[nodes], total), ~everywhere))]
    slot_node = np.repeat(nodes, free[nodes])
    return np.concatenate(columns).astype(np.int64), slot_node.astype(np.int64)


def _conflicts(
    n_nodes: int, kept_row: I64, kept_node: I64, row: I64, node: I64
) -> NDArray[np.bool_]:
    """New slots whose node already holds the row (kept, or an earlier new slot)."""
    code = row * n_nodes + node
    kept = kept_row * n_nodes + kept_node
    if len(kept) > 1 and not (kept[1:] > kept[:-1]).all():
        kept = np.sort(kept)
    at = np.minimum(np.searchsorted(kept, code), max(len(kept) - 1, 0))
    clash = kept[at] == code if len(kept) else np.zeros(len(code), dtype=np.bool_)
    order = stable_argsort(code, max(n_nodes * (int(row.max()) + 1), 1) if len(row) else 1)
    ordered = code[order]
    dup = np.zeros(len(code), dtype=np.bool_)
    dup[order[1:]] = ordered[1:] == ordered[:-1]
    return clash | dup


def _swap_repair(
    pb: CoreProblem, kept_row: I64, kept_node: I64, row: I64, node: I64, pending: NDArray[np.bool_]
) -> tuple[I64, NDArray[np.bool_]]:
    """Place conflicting slots by swapping nodes with another new slot (a 0-cost path).

    Slot ``s`` wants ``(p, i)`` but ``i`` already holds ``p``; a placed new slot ``(q, k)`` with
    ``k ∉ p`` and ``i ∉ q`` becomes ``(p, k), (q, i)``: same loads, same number of new pairs.
    Returns the new nodes and the slots still unplaced (left to :func:`_shortest_augment`).
    """
    if len(kept_row) > 1 and not (kept_row[1:] >= kept_row[:-1]).all():
        by_row = np.argsort(kept_row, kind="stable")
        kept_row, kept_node = kept_row[by_row], kept_node[by_row]
    kept_ptr = np.zeros(pb.n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(kept_row, minlength=pb.n_rows), out=kept_ptr[1:])
    new_order = stable_argsort(row, pb.n_rows)
    new_ptr = np.zeros(pb.n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(row, minlength=pb.n_rows), out=new_ptr[1:])
    # A row's slots: its kept members first, then its new slots in slot order.
    column = np.empty(len(row), dtype=np.int64)
    sorted_row = row[new_order]
    column[new_order] = np.arange(len(row)) - new_ptr[sorted_row] + np.diff(kept_ptr)[sorted_row]
    result = np.where(pending, -1, node)
    cache: dict[int, list[int]] = {}

    def held(r: int) -> list[int]:
        if r not in cache:
            mine = new_order[new_ptr[r] : new_ptr[r + 1]]
            cache[r] = kept_node[kept_ptr[r] : kept_ptr[r + 1]].tolist() + result[mine].tolist()
        return cache[r]

    cur_ptr = np.zeros(pb.n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(pb.cur_row, minlength=pb.n_rows), out=cur_ptr[1:])
    todo = np.flatnonzero(pending).tolist()
    # Many conflicts mean many probes: Python lists are faster to probe than numpy scalars.
    bulk = len(todo) > 64
    slot_row: list[int] | I64 = row.tolist() if bulk else row
    slot_column: list[int] | I64 = column.tolist() if bulk else column
    open_: list[bool] | NDArray[np.bool_] = pending.tolist() if bulk else pending.copy()
    count = len(row)
    stride = _coprime_stride(count)
    for s in todo:
        p, i, ps = int(slot_row[s]), int(node[s]), int(slot_column[s])
        for step in range(1, count):
            t = (s + step * stride) % count
            q, qs = int(slot_row[t]), int(slot_column[t])
            k = held(q)[qs]
            if open_[t] or q == p or k == i or k in held(p) or i in held(q):
                continue
            if k in pb.cur_node[cur_ptr[q] : cur_ptr[q + 1]]:
                continue
            held(p)[ps], held(q)[qs] = k, i
            result[s], result[t] = k, i
            open_[s] = False
            break
    return result, np.asarray(open_, dtype=np.bool_)


def _zero_augment(st: _State, holes: list[int]) -> bool:
    """BFS for an augmenting path over 0-cost edges only; True when one was applied.

    0-cost edges: row → node that neither holds it nor held it before; node → row where it holds
    a new pair (leaving it keeps every current pair); the hub moves. Since no path is cheaper
    than 0 in phase 2 (see the module docstring), such a path is a shortest one. Nodes are
    scanned once overall (a row only looks at nodes not reached yet), so a search costs
    O(rows reached × R' + N) — unlike the full SPFA, which is O(rows × N) per pass.
    """
    n_rows, hub = st.n_rows, st.hub
    parent: dict[int, int] = dict.fromkeys(holes, -1)
    queue: deque[int] = deque(holes)
    unreached = list(range(st.n_nodes))
    while queue:
        v = queue.popleft()
        if v < n_rows:
            members, cur, left = st.members[v], st.cur[v], []
            for i in unreached:
                u = n_rows + i
                if u in parent:
                    continue
                if i in members or i in cur:
                    left.append(i)
                    continue
                parent[u] = v
                if st.room(i) > 0:
                    st.apply(parent, u)
                    return True
                queue.append(u)
            unreached = left
        elif v < hub:
            _expand_node(st, v - n_rows, v, hub, st.fresh_rows_of, parent, queue)
        elif _expand_hub(st, n_rows, hub, parent, queue):
            return True
    return False


def _coprime_stride(count: int) -> int:
    """A step near ``0.618·count`` that visits every slot: far from the run of the same node."""
    stride = max(1, int(count * 0.6180339887)) | 1
    while math.gcd(stride, count) != 1:
        stride += 2
    return stride


def _shortest_augment(st: _State, holes: list[int]) -> None:
    """One shortest augmenting path over the whole residual graph (SPFA), applied.

    Edges: row → node not in it (cost −1 if a current pair, else 0); node → row it is in
    (leaving it costs +1 if a current pair, else 0); node → hub when it may take ``floor + 1``;
    hub → node holding ``floor + 1``. Ends at a node with room. No negative cycle exists (the
    state is min-cost for its size), so SPFA terminates; a guard turns a bug into an error.
    """
    n_rows, n_nodes, hub = st.n_rows, st.n_nodes, st.hub
    size = hub + 1
    inf = 1 << 60
    dist = [inf] * size
    parent = [-1] * size
    queued = [False] * size
    pushes = [0] * size
    queue: deque[int] = deque()

    def relax(u: int, d: int, v: int) -> None:
        if d < dist[u]:
            dist[u] = d
            parent[u] = v
            if not queued[u]:
                pushes[u] += 1
                if pushes[u] > size + 1:
                    raise AssertionError("placement core: negative cycle in residual graph")
                queued[u] = True
                queue.append(u)

    for r in holes:
        dist[r] = 0
        queued[r] = True
        queue.append(r)
    while queue:
        v = queue.popleft()
        queued[v] = False
        d = dist[v]
        if v < n_rows:
            members, cur = st.members[v], st.cur[v]
            for i in range(n_nodes):
                if i not in members:
                    relax(n_rows + i, d - 1 if i in cur else d, v)
        elif v < hub:
            i = v - n_rows
            if st.eligible[i] and not st.ceil[i]:
                relax(hub, d, v)
            for r in sorted(st.rows_of[i]):
                relax(r, d + 1 if i in st.cur[r] else d, v)
        else:
            for j in range(n_nodes):
                if st.ceil[j]:
                    relax(n_rows + j, d, v)
    ends = [n_rows + i for i in range(n_nodes) if st.room(i) > 0 and dist[n_rows + i] < inf]
    if not ends:
        raise AssertionError("placement core: no augmenting path although holes remain")
    st.apply(parent, min(ends, key=lambda u: (dist[u], u)))
