"""Cordoned nodes in the placement core: they keep what they hold and take nothing new.

An operator cordons a node (``placectl node cordon``; design/control-plane.md, "Cordon"): it
stays eligible and keeps its replicas, but no partition gains it as a new member. In the
core's terms (:mod:`placement.algo.solver`) a cordoned node ``c`` has no edge row → ``c``
except from the rows it holds now. :func:`solve_cordoned` realises that without touching the
core: it *pins* the pairs the cordoned nodes keep, then solves the rest of the rows — each
demanding what the pins leave — over the nodes that are not cordoned, with the same exact
core. Rules (design/placement.md, "Cordoned nodes"):

1. A cordoned node keeps at most its upper share (``floor + 1`` where it may take one, else
   ``floor``) of its current pairs: the row it leads first, then in hash order; a row never
   gets more pins than it demands.
2. The other nodes share the remaining demand by weight, within 1 of their realisable share
   (:func:`~placement.algo.targets.demand_targets`), keeping the most current pairs among
   assignments with those loads (the core's guarantee, on the reduced problem).
3. A cordoned node takes a new pair only when nothing else can: a row needs more members than
   the non-cordoned nodes number (e.g. ``R`` of ``N`` nodes with one cordoned, or a failure
   domain every partition must span whose nodes are all cordoned). Those rows are decided
   first: the cordoned nodes holding the row (in hash order), then the cordoned nodes with the
   fewest such pairs; they count against the node's share in rule 1. Holders first makes the
   output, fed back, a fixed point.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from placement.algo.hashing import mix64
from placement.algo.solver import CoreProblem, Pairs, solve
from placement.algo.targets import demand_targets

I64 = NDArray[np.int64]


def solve_cordoned(pb: CoreProblem, weights: Sequence[float], cordoned: NDArray[np.bool_]) -> Pairs:
    """The pairs of ``pb`` (whose targets are every node's share as if none were cordoned)
    with the nodes marked in ``cordoned`` taking no new row, by the rules above."""
    others = np.flatnonzero(~cordoned)
    forced_row, forced_node = _forced(pb, cordoned, len(others))
    pin_row, pin_node = _pins(pb, cordoned, forced_row, forced_node)
    rest = pb.demand - np.bincount(forced_row, minlength=pb.n_rows)
    rest -= np.bincount(pin_row, minlength=pb.n_rows)
    rows = np.flatnonzero(rest > 0)
    if not len(rows):
        return np.concatenate([forced_row, pin_row]), np.concatenate([forced_node, pin_node])
    row_at = np.full(pb.n_rows, -1, dtype=np.int64)
    row_at[rows] = np.arange(len(rows))
    node_at = np.full(pb.n_nodes, -1, dtype=np.int64)
    node_at[others] = np.arange(len(others))
    # The current pairs of the other nodes in the rows left; (row, node) order is kept because
    # both renumberings are increasing.
    mine = (node_at[pb.cur_node] >= 0) & (row_at[pb.cur_row] >= 0)
    demand = rest[rows]
    sub_row, sub_node = solve(
        CoreProblem(
            demand=demand,
            targets=demand_targets([weights[i] for i in others.tolist()], demand),
            cur_row=row_at[pb.cur_row[mine]],
            cur_node=node_at[pb.cur_node[mine]],
            cur_first=pb.cur_first[mine],
            row_key=pb.row_key[rows],
            node_key=pb.node_key[others],
            node_rank=None if pb.node_rank is None else pb.node_rank[others],
        )
    )
    return (
        np.concatenate([forced_row, pin_row, rows[sub_row]]),
        np.concatenate([forced_node, pin_node, others[sub_node]]),
    )


def _tie(pb: CoreProblem, rows: I64, node: int) -> NDArray[np.uint64]:
    return mix64(pb.row_key[rows] ^ pb.node_key[node])


def _forced(pb: CoreProblem, cordoned: NDArray[np.bool_], others: int) -> Pairs:
    """Rule 3, decided first: the cordoned members of the rows that need more than the
    ``others`` nodes — holders of the row first (in hash order), then the cordoned nodes with
    the fewest forced pairs. Holders first makes a forced pair stay where it is next time."""
    short = np.flatnonzero(pb.demand > others)
    if not len(short):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    candidates = np.flatnonzero(cordoned).tolist()
    load = dict.fromkeys(candidates, 0)
    key = pb.node_key.tolist()
    # Each short row's current pairs (``cur_row`` is sorted), their cordoned holders ranked by
    # the row-node hash — all hashed at once.
    if len(pb.cur_row) > 1 and (pb.cur_row[1:] < pb.cur_row[:-1]).any():
        raise AssertionError("placement: current pairs not sorted by row")
    start = np.searchsorted(pb.cur_row, short).tolist()
    stop = np.searchsorted(pb.cur_row, short, side="right").tolist()
    tie = mix64(pb.row_key[pb.cur_row] ^ pb.node_key[pb.cur_node]).tolist()
    nodes = pb.cur_node.tolist()
    need_of = (pb.demand[short] - others).tolist()
    out_rows: list[int] = []
    out_nodes: list[int] = []
    for r, lo, hi, need in zip(short.tolist(), start, stop, need_of, strict=True):
        held = sorted((tie[k], nodes[k]) for k in range(lo, hi) if cordoned[nodes[k]])
        chosen = [c for _, c in held[:need]]
        if len(chosen) < need:
            mine = set(chosen)
            rest = sorted((c for c in candidates if c not in mine), key=lambda c: (load[c], key[c]))
            chosen += rest[: need - len(chosen)]
        if len(chosen) < need:
            raise AssertionError("placement: a partition demands more members than nodes")
        for c in chosen:
            out_rows.append(r)
            out_nodes.append(c)
            load[c] += 1
    return np.asarray(out_rows, dtype=np.int64), np.asarray(out_nodes, dtype=np.int64)


def _pins(pb: CoreProblem, cordoned: NDArray[np.bool_], forced_row: I64, forced_node: I64) -> Pairs:
    """Rule 1: the current pairs the cordoned nodes keep besides the forced ones, node by node
    in key order, each up to its upper share (its forced pairs counted)."""
    upper = pb.targets.floor + pb.targets.eligible
    upper -= np.bincount(forced_node, minlength=pb.n_nodes)
    pinned = np.bincount(forced_row, minlength=pb.n_rows)
    out_rows: list[I64] = []
    out_nodes: list[I64] = []
    chosen = np.flatnonzero(cordoned)
    for c in chosen[np.argsort(pb.node_key[chosen], kind="stable")].tolist():
        if upper[c] <= 0:
            continue
        held = np.flatnonzero(pb.cur_node == c)
        rows = pb.cur_row[held]
        rows = rows[np.lexsort((_tie(pb, rows, c), ~pb.cur_first[held]))]
        if len(forced_row):
            rows = rows[~np.isin(rows, forced_row[forced_node == c])]
        rows = rows[pinned[rows] < pb.demand[rows]][: int(upper[c])]
        pinned[rows] += 1
        out_rows.append(rows)
        out_nodes.append(np.full(len(rows), c, dtype=np.int64))
    empty = np.zeros(0, dtype=np.int64)
    return np.concatenate([empty, *out_rows]), np.concatenate([empty, *out_nodes])
