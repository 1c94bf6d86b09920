"""The exact core of the placement function: keep the most current pairs, fill the rest.

Problem. Rows (partitions) ``p`` each need ``demand[p]`` distinct nodes. Node ``i`` must end with
its target load: ``floor[i]``, or ``floor[i] + 1`` for exactly ``extra`` of the eligible nodes
(:class:`~placement.algo.targets.Targets`). Among all such assignments, return one that
contains the most (row, node) pairs of the current assignment ``C`` — the fewest new pairs.

Why the answer is exact. The problem is a min-cost flow: source → row (capacity ``demand``) →
node (capacity 1; cost −1 on a pair of ``C``, 0 otherwise) → sink (capacity ``floor``), plus
node → hub (capacity 1 when eligible) → sink (capacity ``extra``). Every flow of value ``S = Σ
demand`` is a valid assignment and its cost is −(kept pairs). Successive shortest paths (SSP) are
exact: start from a flow that is min-cost for its value, augment along shortest paths.

1. *Keep* (:func:`_keep_current`): a maximum flow that uses pairs of ``C`` only — min-cost for its
   value because every unit costs −1. Greedy (drop from over-full rows, then shed from nodes above
   their target, choosing holes in distinct rows), certified maximal by a cheap test or completed
   by a compiled max flow started from it (:func:`_maximize_keep`).
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

import functools
import heapq
import math
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from placement.algo import network
from placement.algo.hashing import mix64
from placement.algo.targets import Targets

I64 = NDArray[np.int64]
Pairs = tuple[I64, I64]


@dataclass(frozen=True, slots=True)
class CoreProblem:
    """One instance of the core problem; indices are 0..rows-1 and 0..nodes-1.

    ``cur_row``/``cur_node`` are the valid current pairs (distinct, nodes eligible, rows in
    range); ``cur_first`` marks the pairs that are their row's current primary, which the core
    prefers to keep when it must drop something. Keys only break ties.

    Hints, never required (they save passes over the pairs): ``row_count`` is the number of
    current pairs of every row; ``slots``, when every row demands the same ``width``, is the
    position ``row · width + column`` of every current pair in a rows × width matrix (a row's
    pairs in ascending columns) — ``slots`` of length ``rows · width`` means every row is
    complete (``full_rows``).
    """

    demand: I64
    targets: Targets
    cur_row: I64
    cur_node: I64
    cur_first: NDArray[np.bool_]
    row_key: NDArray[np.uint64]
    node_key: NDArray[np.uint64]
    row_count: I64 | None = None
    slots: I64 | None = None
    #: The fleet tie-breaker (:mod:`placement.algo.fleet`): a distinct rank per node, lower
    #: first, that decides which of equally placed eligible nodes take ``floor + 1`` instead
    #: of ``node_key``. It never changes how many current pairs are kept.
    node_rank: I64 | None = None
    #: Which current pairs a node above its target sheds first (lowest first), for what a
    #: drop costs beyond this problem: at level 1 with failure domains, 0 where the pair's
    #: node inside the domain holds more than it can ever keep, 1 where it holds more than
    #: its floor, else 2 (:func:`placement.algo.place._drop_tiers`). Never changes how many
    #: pairs this problem keeps.
    cur_drop: I64 | None = None

    @property
    def n_rows(self) -> int:
        return len(self.demand)

    @property
    def n_nodes(self) -> int:
        return len(self.targets.floor)

    @property
    def full_rows(self) -> bool:
        """Every row has exactly ``demand`` current pairs (known from ``slots``)."""
        if self.slots is None or not len(self.demand):
            return False
        return len(self.slots) == self.n_rows * int(self.demand[0])

    def counts(self) -> I64:
        """Current pairs per row."""
        if self.row_count is not None:
            return self.row_count
        return np.bincount(self.cur_row, minlength=self.n_rows)


def solve(pb: CoreProblem) -> Pairs:
    """All (row, node) pairs of a balanced assignment with the fewest pairs outside ``C``."""
    keep, ceil = _keep_current(pb)
    budget = _probe_budget(pb)
    if budget is not None:
        try:
            return _fill(pb, keep, ceil, budget)
        except _Exhausted:
            by_class = _solve_classes(pb)
            if by_class is not None:
                return by_class
    return _fill(pb, keep, ceil)


class _Exhausted(Exception):
    """The swap repair used its probe budget (:func:`_probe_budget`)."""


#: Probes the swap repair may spend per conflict on average, on top of a fixed allowance,
#: before a problem with few nodes is handed to the class solver instead.
PROBES_PER_CONFLICT = 16
PROBES_BASE = 4096


def _probe_budget(pb: CoreProblem) -> int | None:
    """Probes per conflict the swap repair may make before the class solver takes over; None
    when the class solver does not take problems with this many nodes.

    With few nodes most probes fail (the probed row already holds the few candidates), and an
    adversarial current makes it O(conflicts × slots): minutes at P = 65,536 on the 4 virtual
    nodes of two racks. Ordinary problems use 1–6 probes per conflict.
    """
    from placement.algo.classes import MAX_NODES

    return None if pb.n_nodes > MAX_NODES else PROBES_PER_CONFLICT


def _keep_by_classes(pb: CoreProblem) -> tuple[I64, I64, NDArray[np.bool_]] | None:
    from placement.algo.classes import keep_by_classes  # it builds on this module

    return keep_by_classes(pb)


def _solve_classes(pb: CoreProblem) -> Pairs | None:
    from placement.algo.classes import solve_classes  # it builds on this module

    return solve_classes(pb)


def solve_rows(pb: CoreProblem, width: int) -> I64:
    """:func:`solve` as a matrix: row ``p`` lists its ``width`` nodes in index order.

    Every row must demand ``width`` nodes. With ``slots`` (where the current pairs sit in a
    rows × width matrix), the result is that matrix with the open positions (dropped pairs,
    missing members) taken by the new pairs, only the rows that changed being sorted again:
    the same matrix as sorting all pairs, without the passes over all of them.
    """
    keep, ceil = _keep_current(pb)
    budget = _probe_budget(pb)
    try:
        if FAST_ROWS and pb.slots is not None:
            matrix = _edit_rows(pb, pb.slots, keep, ceil, width, budget)
            if matrix is not None:
                return matrix
        pairs = _fill(pb, keep, ceil, budget)
    except _Exhausted:
        by_class = _solve_classes(pb)
        pairs = _fill(pb, keep, ceil) if by_class is None else by_class
    return members_matrix(pairs, pb.n_rows, width, pb.n_nodes)


def _edit_rows(
    pb: CoreProblem,
    slots: I64,
    keep: NDArray[np.bool_],
    ceil: NDArray[np.bool_],
    width: int,
    budget: int | None = None,
) -> I64 | None:
    """:func:`solve_rows` by editing the current rows: the steps of :func:`_fill` with row
    pointers instead of passes over the pairs; None when the keep is not proven maximal or a
    conflict is left after the swap repair (then :func:`_fill` decides)."""
    n_rows, n_nodes = pb.n_rows, pb.n_nodes
    dropped = np.flatnonzero(~keep)
    kept_count = pb.counts() - np.bincount(pb.cur_row[dropped], minlength=n_rows)
    holes = pb.demand - kept_count
    held = np.bincount(pb.cur_node, minlength=n_nodes)
    held -= np.bincount(pb.cur_node[dropped], minlength=n_nodes)
    free = pb.targets.floor + ceil - held
    if not _keep_is_maximal(pb, keep, ceil, holes, free, dropped):
        return None
    fillers = np.flatnonzero(free > 0)
    simple = FAST_FILL and (holes <= 1).all() and not held[fillers].any()
    single = simple and len(fillers) == 1 and free[fillers[0]] == holes.sum()
    if single and (free >= 0).all():
        # One node, holding nothing, takes every hole: the fill's order does not matter.
        new_row = np.flatnonzero(holes)
        new_node = np.full(len(new_row), fillers[0], dtype=np.int64)
    else:
        single = False
        new_row, new_node = _bulk_fill(pb, holes, free)
    if not simple:
        kept_row, kept_node = (
            (pb.cur_row, pb.cur_node) if not len(dropped) else (pb.cur_row[keep], pb.cur_node[keep])
        )
        kept_ptr = np.zeros(n_rows + 1, dtype=np.int64)
        np.cumsum(kept_count, out=kept_ptr[1:])
        conflict = _conflicts(n_nodes, kept_row, kept_node, new_row, new_node, kept_ptr)
        if conflict.any():
            new_node, conflict = _swap_repair(
                pb, kept_row, kept_node, new_row, new_node, conflict, kept_ptr, budget
            )
            if conflict.any():
                return None
    if len(slots) == n_rows * width:  # full rows: the open positions are the dropped pairs
        flat = pb.cur_node.copy()
        open_ = dropped
    else:
        flat = np.empty(n_rows * width, dtype=np.int64)
        flat[slots] = pb.cur_node
        taken = np.zeros(n_rows * width, dtype=np.bool_)
        taken[slots[keep] if len(dropped) else slots] = True
        open_ = np.flatnonzero(~taken)
    if len(open_) != len(new_row):
        raise AssertionError("placement: wrong number of replicas")
    if single:
        flat[open_] = fillers[0]
    elif len(open_):
        # Open positions are in row order; so are the new slots once sorted by row, and
        # every row has as many of each (its holes).
        flat[open_] = new_node[stable_argsort(new_row, n_rows)]
    matrix = flat.reshape(n_rows, width)
    touched = np.flatnonzero(holes)
    if len(touched):
        rows = np.sort(matrix[touched], axis=1)
        if width > 1 and (rows[:, 1:] == rows[:, :-1]).any():
            raise AssertionError("placement: a node twice in one partition")
        matrix[touched] = rows
    return matrix


def members_matrix(pairs: Pairs, partitions: int, width: int, n_nodes: int) -> I64:
    """Rows × width node indices, each row sorted (= name order)."""
    rows, nodes = pairs
    if len(rows) != partitions * width:
        raise AssertionError("placement: wrong number of replicas")
    if (np.bincount(rows, minlength=partitions) != width).any():
        raise AssertionError("placement: a partition with the wrong number of replicas")
    code = rows * n_nodes + nodes
    # Mostly sorted (kept pairs come sorted, then the few new ones): timsort merges the runs
    # in linear time; a fresh zone's random order is faster with the default sort.
    presorted = np.count_nonzero(code[1:] < code[:-1]) * 64 < len(code)
    code.sort(kind="stable" if presorted else None)
    if width > 1 and (code[1:] == code[:-1]).any():
        raise AssertionError("placement: a node twice in one partition")
    matrix: I64 = (code % n_nodes).reshape(partitions, width)
    return matrix


def _fill(
    pb: CoreProblem, keep: NDArray[np.bool_], ceil: NDArray[np.bool_], budget: int | None = None
) -> Pairs:
    """Phase 1 completed (:func:`_maximize_keep` when the greedy keep is not proven maximal),
    then phase 2: the pairs of :func:`solve`. ``budget``: see :func:`_swap_repair`."""
    kept_row, kept_node = pb.cur_row[keep], pb.cur_node[keep]
    holes = pb.demand - np.bincount(kept_row, minlength=pb.n_rows)
    held = np.bincount(kept_node, minlength=pb.n_nodes)
    free = pb.targets.floor + ceil - held
    if not _keep_is_maximal(pb, keep, ceil, holes, free):
        by_class = _keep_by_classes(pb)
        if by_class is not None:
            kept_row, kept_node, ceil = by_class
        else:
            kept_row, kept_node, ceil = _maximize_keep(pb, keep, ceil)
        holes = pb.demand - np.bincount(kept_row, minlength=pb.n_rows)
        held = np.bincount(kept_node, minlength=pb.n_nodes)
        free = pb.targets.floor + ceil - held
    new_row, new_node = _bulk_fill(pb, holes, free)
    if FAST_FILL and (holes <= 1).all() and not held[free > 0].any():
        # One column of holes (each row once) filled by nodes that keep nothing (a join):
        # no slot can meet a node already in its row.
        conflict = np.zeros(len(new_row), dtype=np.bool_)
    else:
        conflict = _conflicts(pb.n_nodes, kept_row, kept_node, new_row, new_node)
    if conflict.any():
        new_node, conflict = _swap_repair(
            pb, kept_row, kept_node, new_row, new_node, conflict, budget=budget
        )
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


def _maximize_keep(
    pb: CoreProblem, keep: NDArray[np.bool_], ceil: NDArray[np.bool_]
) -> tuple[I64, I64, NDArray[np.bool_]]:
    """Phase 1 completed: the greedy keep augmented to a maximum flow over current pairs only
    (the network of the module docstring without its new pairs), by :func:`network.augment`
    — compiled Dinic, started from the greedy keep, so it only adds the augmenting paths
    (thousands when an R change and a mass departure leave every row short). Returns the kept
    pairs and which nodes take ``floor + 1``."""
    n_rows, n = pb.n_rows, pb.n_nodes
    source, hub, sink = n_rows + n, n_rows + n + 1, n_rows + n + 2
    floor, eligible = pb.targets.floor, pb.targets.eligible
    load = np.bincount(pb.cur_node[keep], minlength=n)
    base = np.minimum(load, floor)
    over = load - base
    nodes = np.arange(n)
    has_floor = floor > 0
    groups = [
        (np.full(n_rows, source), np.arange(n_rows), pb.demand,
         np.bincount(pb.cur_row[keep], minlength=n_rows)),
        (pb.cur_row, n_rows + pb.cur_node, np.ones_like(pb.cur_row), keep.astype(np.int64)),
        (n_rows + nodes[has_floor], np.full(int(has_floor.sum()), sink), floor[has_floor],
         base[has_floor]),
        (n_rows + nodes[eligible], np.full(int(eligible.sum()), hub),
         np.ones(int(eligible.sum()), dtype=np.int64), over[eligible]),
        (np.asarray([hub]), np.asarray([sink]), np.asarray([pb.targets.extra]),
         np.asarray([int(over.sum())])),
    ]  # fmt: skip
    tail, head, cap, flow = (
        np.concatenate([np.asarray(g[k], dtype=np.int64) for g in groups]) for k in range(4)
    )
    flow, _ = network.augment(sink + 1, tail, head, cap, flow, source, sink)
    at = n_rows
    kept = flow[at : at + len(pb.cur_row)] > 0
    at += len(pb.cur_row) + int(has_floor.sum())
    ceil = np.zeros(n, dtype=np.bool_)
    ceil[nodes[eligible]] = flow[at : at + int(eligible.sum())] > 0
    return pb.cur_row[kept], pb.cur_node[kept], spare_ceil(pb, ceil)


def spare_ceil(pb: CoreProblem, ceil: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """``ceil`` (the nodes whose kept pairs use their ``+1``) with the ``+1`` slots left over
    given to the other eligible nodes in tie order (the fill may still move them through the
    hub, at no cost)."""
    open_ = np.flatnonzero(pb.targets.eligible & ~ceil)
    tie = pb.node_key if pb.node_rank is None else pb.node_rank
    left = pb.targets.extra - int(ceil.sum())
    ceil = ceil.copy()
    ceil[open_[np.argsort(tie[open_], kind="stable")[:left]]] = True
    return ceil


def _keep_current(pb: CoreProblem) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """Greedy keep: which current pairs stay, and which eligible nodes take ``floor + 1``."""
    keep = _truncate_rows(pb)
    every = bool(keep.all())
    load = np.bincount(pb.cur_node if every else pb.cur_node[keep], minlength=pb.n_nodes)
    ceil = _choose_ceil(pb, load)
    keep = _shed_nodes(pb, keep, pb.targets.floor + ceil, load if every else None)
    return keep, ceil


def _truncate_rows(pb: CoreProblem) -> NDArray[np.bool_]:
    """Rows with more current members than demanded drop the members on the fullest nodes.

    The current primary is dropped last, then the node furthest above its floor goes first.
    """
    keep = np.ones(len(pb.cur_row), dtype=np.bool_)
    if pb.full_rows:
        return keep
    count = pb.counts()
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
    A fleet rank replaces ``node_key`` among nodes equally far from their floor.
    """
    cand = np.flatnonzero(pb.targets.eligible)
    tie = pb.node_key if pb.node_rank is None else pb.node_rank
    order = np.lexsort((tie[cand], pb.targets.floor[cand] - load[cand]))
    ceil = np.zeros(pb.n_nodes, dtype=np.bool_)
    ceil[cand[order[: pb.targets.extra]]] = True
    return ceil


def _shed_nodes(
    pb: CoreProblem, keep: NDArray[np.bool_], cap: I64, all_load: I64 | None = None
) -> NDArray[np.bool_]:
    """Nodes above their target drop replicas where the fill can replace them without conflict.

    Preferred rows: no hole yet (a joining node can take all the holes), then rows that hold
    few of the nodes with room (they are the ones that will fill the holes), then non-primary.
    Nodes shed one after the other (in node-key order), each seeing the holes left by the
    previous ones. Vectorised: every node's choice is first computed against the initial holes
    (one global sort); a node's choice stays valid unless one of its chosen rows received a
    hole from an earlier node (holes only grow, so rows it did not choose only get worse), and
    only such nodes are recomputed, in order. ``all_load`` (optional): the load of all the
    current pairs, when ``keep`` keeps them all.
    """
    every = all_load is not None or bool(keep.all())  # the usual case: no gathers needed
    kept = _positions(len(keep)) if every else np.flatnonzero(keep)
    kept_node = pb.cur_node if every else pb.cur_node[kept]
    load = all_load if all_load is not None else np.bincount(kept_node, minlength=pb.n_nodes)
    over = np.flatnonzero(load > cap)
    if over.size == 0:
        return keep
    keep = keep.copy()
    kept_row = pb.cur_row if every else pb.cur_row[kept]
    if every:
        holes = pb.demand - pb.counts()
    else:
        holes = pb.demand - np.bincount(kept_row, minlength=pb.n_rows)
    room = np.maximum(cap - load, 0)
    if (room[load > 0] > 0).any():  # a node holding kept pairs has room
        kept_room = room[kept_node]
        blocked = np.bincount(kept_row, weights=kept_room, minlength=pb.n_rows).astype(np.int64)
    else:  # e.g. only a joining node has room: it holds nothing yet
        blocked = np.zeros(pb.n_rows, dtype=np.int64)
    over = over[np.argsort(pb.node_key[over], kind="stable")]
    shed = load[over] - cap[over]
    rank_of = np.full(pb.n_nodes, -1, dtype=np.int64)
    rank_of[over] = np.arange(len(over))
    # The shedding nodes' pairs, in row order: ``seg`` (positions in the current pairs),
    # ``nodes``, ``rows``; ``group`` = the node's rank in shedding order (computed when needed).
    if len(over) == int(np.count_nonzero(load)):  # every node holding pairs sheds (a join)
        seg, nodes, rows = kept, kept_node, kept_row
        first = pb.cur_first if every else pb.cur_first[seg]
    else:
        mine = rank_of[kept_node] >= 0
        seg, nodes, rows = kept[mine], kept_node[mine], kept_row[mine]
        first = pb.cur_first[seg]
    over_key = pb.node_key[over]
    picked = None
    # With :func:`_shed_by_tie`: every group's candidates in its order, beyond its choice.
    spare: tuple[I64, I64] | None = None
    drop = None if pb.cur_drop is None else pb.cur_drop[seg]
    if (
        FAST_SHED and drop is None and not holes.any() and not blocked.any()
    ):  # e.g. a join: no hole, no room
        found = _shed_by_tie(rank_of, nodes, first, rows, pb.row_key, over_key, shed)
        if found is not None:
            picked, spare = found[0], found[1:]
    if picked is None:
        group = rank_of[nodes]
        tie = mix64(pb.row_key[rows] ^ over_key[group])
        keys: tuple[NDArray[np.int64] | NDArray[np.bool_], ...] = (
            (holes[rows], blocked[rows], first)
            if drop is None
            else (drop, holes[rows], blocked[rows], first)
        )
        picked = smallest_per_group(group, keys, tie, shed)
    keep[seg[picked]] = False
    chosen = rows[picked]
    bounds = np.concatenate(([0], np.cumsum(shed))).tolist()
    owner = np.repeat(np.arange(len(over)), shed)
    # Nodes are settled in order; a node must choose again when one of its rows was chosen by
    # an earlier node (in its final choice). Only such nodes are visited: first those sharing
    # a row in the initial choices, then the later choosers of rows a node chose again (a
    # later node still holds its initial choice when it is reached).
    by_row = np.argsort(chosen, kind="stable")  # positions follow the nodes' order
    sorted_rows = chosen[by_row]
    again = by_row[1:][sorted_rows[1:] == sorted_rows[:-1]]
    visit = sorted(set(owner[again].tolist()))
    taken = np.zeros(pb.n_rows, dtype=np.int64)  # rows chosen by the nodes before ``done``
    mark = np.zeros(pb.n_rows, dtype=np.bool_)
    done = 0
    of_node: tuple[I64, I64] | None = None  # the shedding pairs by node, once needed
    while visit:
        g = heapq.heappop(visit)
        if g <= done and done:  # queued twice (g ≥ 1: a later owner of a shared row)
            continue
        np.add.at(taken, chosen[bounds[done] : bounds[g]], 1)
        done = g
        lo, hi = bounds[g], bounds[g + 1]
        before = chosen[lo:hi].copy()
        if not taken[before].any():
            continue
        if spare is not None:
            # No hole, no room anywhere at first, so the node's order is (holes now, primary
            # last, tie): its first rows without a hole now among its candidates (the
            # non-primary rows below its tie limit, in tie order) decide when there are enough.
            order, starts = spare
            cand = order[starts[g] : starts[g + 1]]
            ready = cand[taken[rows[cand]] == 0]
            if len(ready) >= shed[g]:
                keep[seg[picked[lo:hi]]] = True
                picked[lo:hi] = ready[: shed[g]]
                keep[seg[picked[lo:hi]]] = False
                chosen[lo:hi] = rows[picked[lo:hi]]
                _visit_later(visit, chosen[lo:hi], before, sorted_rows, by_row, owner, g, mark)
                continue
        if of_node is None:
            by_node = np.argsort(rank_of[nodes], kind="stable")
            of_node = by_node, np.searchsorted(rank_of[nodes][by_node], np.arange(len(over) + 1))
        part = of_node[0][of_node[1][g] : of_node[1][g + 1]]
        seg_g, rows_g = seg[part], rows[part]
        # The holes of a row once the node's predecessors have shed: its initial holes plus
        # the times they chose it.
        now_g = holes[rows_g] + taken[rows_g]
        tie_g = mix64(pb.row_key[rows_g] ^ over_key[g])
        order_keys = [tie_g, pb.cur_first[seg_g], blocked[rows_g], now_g]
        if pb.cur_drop is not None:
            order_keys.append(pb.cur_drop[seg_g])
        redo = np.lexsort(order_keys)
        redo = redo[: shed[g]]
        keep[seg[picked[lo:hi]]] = True
        keep[seg_g[redo]] = False
        picked[lo:hi] = part[redo]
        chosen[lo:hi] = rows_g[redo]
        _visit_later(visit, chosen[lo:hi], before, sorted_rows, by_row, owner, g, mark)
    return keep


def _visit_later(
    visit: list[int],
    now: I64,
    before: I64,
    sorted_rows: I64,
    by_row: I64,
    owner: I64,
    g: int,
    mark: NDArray[np.bool_],
) -> None:
    """Queue the nodes after ``g`` whose initial choice holds a row ``g`` newly chose
    (``mark``: a scratch flag per row, all False)."""
    mark[before] = True
    new = now[~mark[now]]
    mark[before] = False
    if not len(new):
        return
    left = np.searchsorted(sorted_rows, new)
    right = np.searchsorted(sorted_rows, new, "right")
    spans = [by_row[a:b] for a, b in zip(left.tolist(), right.tolist(), strict=True) if b > a]
    if not spans:
        return
    later = owner[np.concatenate(spans)]
    for h in np.unique(later[later > g]).tolist():
        heapq.heappush(visit, h)


@functools.lru_cache(maxsize=4)
def _positions(size: int) -> I64:
    """``np.arange(size)``, cached and read-only."""
    positions = np.arange(size, dtype=np.int64)
    positions.flags.writeable = False
    return positions


#: Skip :func:`_conflicts` when no conflict is possible (tests switch it off to compare).
FAST_FILL = True
#: Build :func:`solve_rows`'s matrix by editing complete current rows (tests switch it off).
FAST_ROWS = True
#: Use :func:`_shed_by_tie` when it applies (tests switch it off to compare with the general path).
FAST_SHED = True


def _shed_by_tie(
    rank_of: I64,
    nodes: I64,
    first: NDArray[np.bool_],
    rows: I64,
    row_key: NDArray[np.uint64],
    over_key: NDArray[np.uint64],
    take: I64,
) -> tuple[I64, I64, I64] | None:
    """:func:`smallest_per_group` of :func:`_shed_nodes` when every row has no hole and no
    blocked slot (a join), or None when it cannot decide; then every group's candidates in
    its order and where each group starts among them (group ``g``'s are
    ``order[starts[g]:starts[g + 1]]``).

    The pairs are given by ``nodes``, ``first`` and ``rows``; a pair's group is
    ``rank_of[node]`` (every given pair belongs to a shedding node).
    The order is then (``first``, tie) in every group: when a group has at least ``take[g]``
    non-primary pairs, its choice is the ``take[g]`` of them with the smallest tie (ties broken
    by position). Only the non-primary pairs are hashed, only those below a per-group limit on
    the tie (about four times as many as needed) are sorted; None when a group falls short.
    """
    n_groups = len(take)
    candidates = np.flatnonzero(~first)
    mine = rank_of[nodes[candidates]]
    size = np.bincount(mine, minlength=n_groups)
    if (size < take).any():
        return None
    tie = row_key[rows[candidates]]
    tie ^= over_key[mine]
    mix64(tie, out=tie)
    share = 4.0 * take / np.maximum(size, 1) + 1 / 256
    limit = np.full(n_groups, np.iinfo(np.uint64).max, dtype=np.uint64)
    partial = share < 1
    limit[partial] = (share[partial] * 2.0**63).astype(np.uint64) * np.uint64(2)
    passing = np.flatnonzero(tie < limit[mine])  # few: gathers beat boolean masks
    mine, tie, candidates = mine[passing], tie[passing], candidates[passing]
    sizes = np.bincount(mine, minlength=n_groups)
    if (sizes < take).any():
        return None
    order = lex_order((mine,), tie)
    starts = np.zeros(n_groups + 1, dtype=np.int64)
    np.cumsum(sizes, out=starts[1:])
    rank = np.arange(len(order)) - np.repeat(starts[:-1], sizes)
    ordered = order[rank < take[mine[order]]]
    result: I64 = candidates[ordered]
    return result, candidates[order], starts


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
    pb: CoreProblem,
    keep: NDArray[np.bool_],
    ceil: NDArray[np.bool_],
    holes: I64,
    free: I64,
    unused: I64 | None = None,
) -> bool:
    """A sufficient test that no augmenting path over current pairs exists.

    Such a path starts at a row with a hole and an unused current pair and must end at a node
    with an unused current pair and room (or one that could take over a ``floor + 1`` slot from
    a node with room). No candidate end, or no candidate start, means the greedy keep is maximal.
    ``holes`` and ``free`` are the rows' missing members and the nodes' room after the keep;
    ``unused`` (optional) lists the current pairs not kept (``np.flatnonzero(~keep)``).
    """
    if unused is None:
        unused = np.flatnonzero(~keep)
    if not len(unused):
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
    n_nodes: int,
    kept_row: I64,
    kept_node: I64,
    row: I64,
    node: I64,
    kept_ptr: I64 | None = None,
) -> NDArray[np.bool_]:
    """New slots whose node already holds the row (kept, or an earlier new slot).

    ``kept_ptr`` (optional): the kept pairs are grouped by row, row ``p``'s at
    ``kept_ptr[p]:kept_ptr[p + 1]``; each new slot is then checked against its row only.
    """
    code = row * n_nodes + node
    if kept_ptr is not None:
        start = kept_ptr[row]
        count = kept_ptr[row + 1] - start
        clash = np.zeros(len(code), dtype=np.bool_)
        last = max(len(kept_node) - 1, 0)
        for j in range(int(count.max()) if len(count) and len(kept_node) else 0):
            clash |= (j < count) & (kept_node[np.minimum(start + j, last)] == node)
    else:
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
    pb: CoreProblem,
    kept_row: I64,
    kept_node: I64,
    row: I64,
    node: I64,
    pending: NDArray[np.bool_],
    kept_ptr: I64 | None = None,
    budget: int | None = None,
) -> tuple[I64, NDArray[np.bool_]]:
    """Place conflicting slots by swapping nodes with another new slot (a 0-cost path).

    ``budget``: raise :class:`_Exhausted` once more than ``PROBES_BASE + budget × k`` probes
    were spent on the first ``k`` conflicts (None: no limit).

    Slot ``s`` wants ``(p, i)`` but ``i`` already holds ``p``; a placed new slot ``(q, k)`` with
    ``k ∉ p`` and ``i ∉ q`` becomes ``(p, k), (q, i)``: same loads, same number of new pairs.
    Returns the new nodes and the slots still unplaced (left to :func:`_shortest_augment`).
    ``kept_ptr`` (optional): the kept pairs are sorted by row, row ``p``'s at
    ``kept_ptr[p]:kept_ptr[p + 1]``.
    """
    if kept_ptr is None:
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
    np.cumsum(pb.counts(), out=cur_ptr[1:])
    todo = np.flatnonzero(pending).tolist()
    # Many conflicts mean many probes: Python lists are faster to probe than numpy scalars.
    bulk = len(todo) > 64
    slot_row: list[int] | I64 = row.tolist() if bulk else row
    slot_column: list[int] | I64 = column.tolist() if bulk else column
    open_: list[bool] | NDArray[np.bool_] = pending.tolist() if bulk else pending.copy()
    count = len(row)
    stride = _coprime_stride(count)
    probes = 0
    for done, s in enumerate(todo):
        # The budget holds at every step, not only in total: a hopeless repair (every probe
        # failing) stops after a few thousand probes instead of conflicts × budget of them.
        if budget is not None and probes > PROBES_BASE + budget * done:
            raise _Exhausted
        p, i, ps = int(slot_row[s]), int(node[s]), int(slot_column[s])
        step = 0
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
        probes += step
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
