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
   domain every partition must span whose nodes are all cordoned). It then takes first a row
   it held beyond its share, then the cordoned node with the fewest pairs.
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
    pin_row, pin_node = _pins(pb, cordoned)
    pinned = np.bincount(pin_row, minlength=pb.n_rows)
    rest = pb.demand - pinned
    others = np.flatnonzero(~cordoned)
    forced_row, forced_node = _forced(pb, cordoned, pin_row, pin_node, rest, len(others))
    rest -= np.bincount(forced_row, minlength=pb.n_rows)
    rows = np.flatnonzero(rest > 0)
    if not len(rows):
        return np.concatenate([pin_row, forced_row]), np.concatenate([pin_node, forced_node])
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
        )
    )
    return (
        np.concatenate([pin_row, forced_row, rows[sub_row]]),
        np.concatenate([pin_node, forced_node, others[sub_node]]),
    )


def _pins(pb: CoreProblem, cordoned: NDArray[np.bool_]) -> Pairs:
    """Rule 1: the current pairs the cordoned nodes keep, node by node in key order."""
    upper = pb.targets.floor + pb.targets.eligible
    pinned = np.zeros(pb.n_rows, dtype=np.int64)
    out_rows: list[I64] = []
    out_nodes: list[I64] = []
    chosen = np.flatnonzero(cordoned)
    for c in chosen[np.argsort(pb.node_key[chosen], kind="stable")].tolist():
        held = np.flatnonzero(pb.cur_node == c)
        rows = pb.cur_row[held]
        tie = mix64(pb.row_key[rows] ^ pb.node_key[c])
        rows = rows[np.lexsort((tie, ~pb.cur_first[held]))]
        rows = rows[pinned[rows] < pb.demand[rows]][: int(upper[c])]
        pinned[rows] += 1
        out_rows.append(rows)
        out_nodes.append(np.full(len(rows), c, dtype=np.int64))
    empty = np.zeros(0, dtype=np.int64)
    return np.concatenate([empty, *out_rows]), np.concatenate([empty, *out_nodes])


def _forced(
    pb: CoreProblem,
    cordoned: NDArray[np.bool_],
    pin_row: I64,
    pin_node: I64,
    rest: I64,
    others: int,
) -> Pairs:
    """Rule 3: cordoned members for the rows that need more than the ``others`` nodes."""
    short = np.flatnonzero(rest > others).tolist()
    if not short:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    load = np.bincount(pin_node, minlength=pb.n_nodes)
    key = pb.node_key.tolist()
    candidates = np.flatnonzero(cordoned).tolist()
    out_rows: list[int] = []
    out_nodes: list[int] = []
    for r in short:
        members = set(pin_node[pin_row == r].tolist())
        held = set(pb.cur_node[pb.cur_row == r].tolist())
        order = sorted(
            (c for c in candidates if c not in members),
            key=lambda c: (c not in held, int(load[c]), key[c]),
        )
        need = int(rest[r]) - others
        if need > len(order):
            raise AssertionError("placement: a partition demands more members than nodes")
        for c in order[:need]:
            out_rows.append(r)
            out_nodes.append(c)
            load[c] += 1
    return np.asarray(out_rows, dtype=np.int64), np.asarray(out_nodes, dtype=np.int64)
