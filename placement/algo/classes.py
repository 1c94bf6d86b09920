"""The core problem solved exactly on row classes, for problems with few nodes.

Rows with the same demand, the same current nodes and the same current primary are
interchangeable: whatever an assignment gives one of them it could give another. So the core's
min-cost flow (:mod:`placement.algo.solver`) can be solved on *classes* instead of rows —

    source → class c (cap n_c · demand_c) → node i (cap n_c; cost −K if i is a current node
    of c, −K − 1 if it is c's current primary, else 0) → sink (cap floor_i),
    node i → hub (cap 1 when eligible; cost = i's tie rank) → sink (cap extra)

— whose size depends on the number of distinct current rows, not on P. ``K`` exceeds every
primary bonus and tie cost together, so the cheapest flow keeps the most current pairs first,
then the most current primaries among them, then gives ``floor + 1`` to the best ranked nodes.

Back to rows: class ``c`` sends ``f_ci ≤ n_c`` to node ``i`` and ``Σ_i f_ci = n_c · demand_c``.
Laying each node's ``f_ci`` slots out one after another and dealing slot ``s`` to the class's
row ``s mod n_c`` gives every row ``demand_c`` slots, and a node at most one slot per row (its
slots are consecutive and fewer than ``n_c + 1``). Every row of a class holds the same current
nodes and the same current primary, so every such dealing keeps the same pairs and primaries.

Used where the row-level solver is slowest: few nodes and many conflicting rows — level 1 of a
zone with fewer failure domains than replicas, whose "nodes" are a handful of virtual nodes
(design/placement.md, "Failure domains"). ``None`` means the class network is too large and the
row-level solver decides.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from placement.algo.network import Network
from placement.algo.solver import CoreProblem, Pairs, spare_ceil

I64 = NDArray[np.int64]

#: Largest node count solved on classes (the class key holds a bit per node).
MAX_NODES = 24
#: Largest class network (classes × nodes edges) solved here; larger ones go to the row solver.
MAX_EDGES = 4_000


def solve_classes(pb: CoreProblem) -> Pairs | None:
    """The pairs of :func:`placement.algo.solver.solve` computed on row classes; None when the
    problem has too many nodes or classes for it (the caller then solves it row by row)."""
    n_rows, n = pb.n_rows, pb.n_nodes
    if n > MAX_NODES or n_rows == 0:
        return None
    bits = np.zeros(n_rows, dtype=np.int64)
    np.bitwise_or.at(bits, pb.cur_row, np.left_shift(1, pb.cur_node))
    primary = np.full(n_rows, n, dtype=np.int64)
    primary[pb.cur_row[pb.cur_first]] = pb.cur_node[pb.cur_first]
    code = (pb.demand * (n + 1) + primary) << n | bits
    # Rows in tie order (row key), so that each class's rows are dealt in that order.
    by_key = np.argsort(pb.row_key, kind="stable")
    codes, first, inverse, sizes = np.unique(
        code[by_key], return_index=True, return_inverse=True, return_counts=True
    )
    k = len(codes)
    if k * n > MAX_EDGES:
        return None
    class_bits = (codes & ((1 << n) - 1)).tolist()
    class_primary = ((codes >> n) % (n + 1)).tolist()
    class_demand = pb.demand[by_key[first]].tolist()
    flow = _class_flow(pb, class_bits, class_primary, class_demand, sizes.tolist())
    if flow is None:
        return None
    # Each class's rows, in row-key order.
    order = np.argsort(inverse, kind="stable")
    rows_by_class = np.split(by_key[order], np.cumsum(sizes)[:-1])
    out_rows: list[I64] = []
    out_nodes: list[I64] = []
    for c in range(k):
        rows = rows_by_class[c]
        counts = flow[c]
        slots = np.repeat(np.arange(n, dtype=np.int64), counts)
        out_rows.append(rows[np.arange(len(slots)) % len(rows)])
        out_nodes.append(slots)
    return np.concatenate(out_rows), np.concatenate(out_nodes)


def _class_flow(
    pb: CoreProblem,
    class_bits: list[int],
    class_primary: list[int],
    class_demand: list[int],
    sizes: list[int],
) -> list[list[int]] | None:
    """Per class, how many of its rows each node takes (the min-cost flow above); None if no
    flow meets the targets (never for targets of design/placement.md; the row solver then
    decides and says why)."""
    n, k = pb.n_nodes, len(sizes)
    # Dense ranks 0..n-1 (a fleet or cordon rank may be zone-wide): the costs below rely on
    # every tie cost being below n.
    source_rank = pb.node_key if pb.node_rank is None else pb.node_rank
    tie = np.argsort(np.argsort(source_rank, kind="stable"), kind="stable").tolist()
    bonus = n * n + 1  # above every sum of tie costs (at most n hub units of cost < n)
    keep = bonus * (pb.n_rows + 1)  # above every sum of primary bonuses and tie costs
    net = Network(k + n + 3)
    source, hub, sink = k + n, k + n + 1, k + n + 2
    class_edges: list[list[int]] = []
    for c in range(k):
        net.add(source, c, sizes[c] * class_demand[c], 0)
        edges = []
        for i in range(n):
            cost = 0
            if class_bits[c] >> i & 1:
                cost = -keep - (bonus if i == class_primary[c] else 0)
            edges.append(net.add(c, k + i, sizes[c], cost))
        class_edges.append(edges)
    floor = pb.targets.floor.tolist()
    eligible = pb.targets.eligible.tolist()
    for i in range(n):
        if floor[i]:
            net.add(k + i, sink, floor[i], 0)
        if eligible[i]:
            net.add(k + i, hub, 1, tie[i])
    if pb.targets.extra:
        net.add(hub, sink, pb.targets.extra, 0)
    need = int(pb.demand.sum())
    if net.min_cost_flow(source, sink, need) != need:
        return None
    return [[net.flow(e) for e in edges] for edges in class_edges]


#: The keep is aggregated when rows fall into at most this share of classes.
KEEP_CLASS_SHARE = 0.25


def unique_rows(table: I64) -> tuple[I64, I64, I64]:
    """``np.unique(table, axis=0, return_inverse=True, return_counts=True)`` with a flat
    inverse, the same arrays (rows in lexicographic order): one ``lexsort`` of the columns and
    a compare of neighbours, about 5× faster than NumPy's sort of the rows as structured
    records — the keep of a weighted domain level spent a tenth of its time there."""
    if not len(table):
        empty = np.zeros(0, dtype=np.int64)
        return table.copy(), empty, empty
    order = np.lexsort(table.T[::-1])
    ordered = table[order]
    starts = np.empty(len(ordered), dtype=np.bool_)
    starts[0] = True
    np.any(ordered[1:] != ordered[:-1], axis=1, out=starts[1:])
    group = np.cumsum(starts) - 1
    inverse = np.empty(len(ordered), dtype=np.int64)
    inverse[order] = group
    return ordered[starts], inverse, np.bincount(group).astype(np.int64)


def keep_by_classes(pb: CoreProblem) -> tuple[I64, I64, NDArray[np.bool_]] | None:
    """Phase 1 of the core (a maximum flow over current pairs only) on row classes: rows with
    the same demand, current nodes and current primary are one class (the primary's edge is
    searched first, so it is kept where the flow leaves a choice — not guaranteed: the flow
    has no costs), and the class keeps ``f_ci ≤
    n_c`` of its rows on node ``i`` — dealt round its rows as in :func:`solve_classes`, so no
    row keeps more than its demand. Any maximum keep is min-cost for its value (every unit
    costs −1), so the fill that follows stays exact. Returns the kept pairs (rows, nodes) and
    which nodes take ``floor + 1``; None unless the rows fall into few classes (structured
    currents — blocks, stripes — whose augmenting paths are long chains row by row)."""
    n_rows, n = pb.n_rows, pb.n_nodes
    if not len(pb.cur_row):
        return None
    order = np.lexsort((pb.cur_node, pb.cur_row))
    rows_sorted, nodes_sorted = pb.cur_row[order], pb.cur_node[order]
    count = np.bincount(rows_sorted, minlength=n_rows)
    width = int(count.max())
    table = np.full((n_rows, width + 2), -1, dtype=np.int64)
    table[:, 0] = pb.demand
    table[pb.cur_row[pb.cur_first], -1] = pb.cur_node[pb.cur_first]  # the current primary
    starts = np.concatenate(([0], np.cumsum(count)[:-1]))
    column = np.arange(len(rows_sorted)) - starts[rows_sorted]
    table[rows_sorted, 1 + column] = nodes_sorted
    by_key = np.argsort(pb.row_key, kind="stable")
    classes, inverse, sizes = unique_rows(table[by_key])
    k = len(classes)
    if k > KEEP_CLASS_SHARE * n_rows:
        return None
    source, hub, sink = k + n, k + n + 1, k + n + 2
    net = Network(k + n + 3)
    edges: list[list[tuple[int, int]]] = []
    for c in range(k):
        demand = int(classes[c, 0])
        held = [int(i) for i in classes[c, 1:-1] if i >= 0]
        lead = int(classes[c, -1])
        if lead >= 0:  # the primary's edge first: the searches try it before the others
            held.remove(lead)
            held.insert(0, lead)
        net.add(source, c, int(sizes[c]) * min(demand, len(held)))
        edges.append([(i, net.add(c, k + i, int(sizes[c]))) for i in held])
    floor = pb.targets.floor.tolist()
    eligible = pb.targets.eligible.tolist()
    hub_edges: dict[int, int] = {}
    for i in range(n):
        if floor[i]:
            net.add(k + i, sink, floor[i])
        if eligible[i]:
            hub_edges[i] = net.add(k + i, hub, 1)
    if pb.targets.extra:
        net.add(hub, sink, pb.targets.extra)
    net.max_flow(source, sink)
    class_rows = np.split(by_key[np.argsort(inverse, kind="stable")], np.cumsum(sizes)[:-1])
    out_rows: list[I64] = []
    out_nodes: list[I64] = []
    for c in range(k):
        flows = sorted((i, net.flow(e)) for i, e in edges[c])
        slots = np.repeat(np.asarray([i for i, _ in flows], dtype=np.int64), [f for _, f in flows])
        rows = class_rows[c]
        out_rows.append(rows[np.arange(len(slots)) % len(rows)])
        out_nodes.append(slots)
    ceil = np.zeros(n, dtype=np.bool_)
    for i, e in hub_edges.items():
        ceil[i] = net.flow(e) > 0
    return np.concatenate(out_rows), np.concatenate(out_nodes), spare_ceil(pb, ceil)
