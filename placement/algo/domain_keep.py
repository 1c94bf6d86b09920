"""The most current pairs an assignment with failure domains can keep, over both levels at once.

Level by level (design/placement.md, "Failure domains") each level keeps the most pairs *of its
own problem*: level 1 chooses (partition, domain) pairs without knowing which of them level 2
can keep. With ``D ≥ R'`` (at most one replica of a partition per domain) the pairs any
assignment meeting the targets can keep are bounded by a max flow over the current pairs only:

    source → partition p (cap R') → (p, domain d) (cap 1) → node i of d (cap 1, a current pair)
    node i → sink (cap a_i),  node i → hub_d (cap u_i − a_i),  hub_d → sink (cap e_d),
    hub_d → G (cap 1 when d may take the +1 of the domain totals),  G → sink (cap E)

``a_i`` is node ``i``'s floor at its domain's lower total ``T_d``, ``u_i`` its largest target at
``T_d`` or ``T_d + 1``, ``e_d = T_d − Σ a_i`` the units above the floors at ``T_d`` and ``E``
the domains that take ``T_d + 1``. Any assignment meeting the targets keeps a set of current
pairs that is a flow here (its loads are at least the floors ``a`` and its domains at most
``T_d`` or, for ``E`` of them, ``T_d + 1``), so the max flow bounds what any assignment keeps.
When the level-by-level result keeps that many, it is the most any assignment keeps; when it
keeps fewer, the flow's kept set, given to the levels as the current assignment, usually lets
them keep it all (:func:`placement.algo.place._solve_domains`).

Cheap first: the bound is also at most a cut — every partition's distinct current domains
(capped at ``R'``), or every node's current pairs into the sink side — and an ordinary change
(a join, a leave, an R change) meets one of those; only then is the network built.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np
from numpy.typing import NDArray

from placement.algo.network import Network, augment
from placement.algo.targets import Targets, weighted_targets

I64 = NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Bands:
    """The node and domain targets of the flow above, per node and per domain."""

    node_floor: I64  #: a_i
    node_room: I64  #: u_i − a_i
    spare: I64  #: e_d
    plus: NDArray[np.bool_]  #: d may take T_d + 1
    extra: int  #: E
    domains: Targets  #: the domain totals the bands were derived from


def bands(
    domains: Targets, node_weights: Sequence[Sequence[float]], members: Sequence[I64], n: int
) -> Bands:
    """The bands of ``n`` nodes, ``members[d]`` the nodes of domain ``d`` (weights alike)."""
    floor = np.zeros(n, dtype=np.int64)
    room = np.zeros(n, dtype=np.int64)
    spare = np.zeros(len(members), dtype=np.int64)
    alike = [len(set(w)) <= 1 for w in node_weights]
    if all(alike):
        # Equal weights inside every domain: T split into ⌊T/n⌋ and ⌈T/n⌉, for all at once.
        size = np.asarray([len(m) for m in members], dtype=np.int64)
        lows = domains.floor
        highs = lows + domains.eligible
        of = np.repeat(np.arange(len(members)), size)
        at = np.concatenate(members) if len(members) else np.zeros(0, dtype=np.int64)
        per = np.maximum(size, 1)
        base = lows // per
        upper = np.maximum(-(-lows // per), -(-highs // per))
        floor[at] = base[of]
        room[at] = (upper - base)[of]
        spare[:] = lows - base * size
        return Bands(floor, room, spare, domains.eligible.copy(), domains.extra, domains)
    for d, nodes in enumerate(members):
        low = int(domains.floor[d])
        _, at_low = weighted_targets(list(node_weights[d]), low, hi=[low] * len(nodes))
        upper = at_low.floor + at_low.eligible
        if domains.eligible[d]:
            high = low + 1
            _, at_high = weighted_targets(list(node_weights[d]), high, hi=[high] * len(nodes))
            upper = np.maximum(upper, at_high.floor + at_high.eligible)
        floor[nodes] = at_low.floor
        room[nodes] = upper - at_low.floor
        spare[d] = at_low.extra
    return Bands(floor, room, spare, domains.eligible.copy(), domains.extra, domains)


def cut_bound(
    width: int, cur_row: I64, cur_node: I64, of_node: I64, bands: Bands, n_domains: int
) -> int:
    """The smaller of two cuts of the flow: the partitions' side and the nodes' side."""
    code = np.unique(cur_row * n_domains + of_node[cur_node])
    per_row = np.unique(code // n_domains, return_counts=True)[1]
    by_rows = int(np.minimum(per_row, width).sum())
    held = np.bincount(cur_node, minlength=len(of_node))
    base = np.minimum(held, bands.node_floor)
    over = np.minimum(held - base, bands.node_room)
    wanted = np.bincount(of_node, weights=over, minlength=n_domains).astype(np.int64)
    to_hub = np.minimum(wanted, bands.spare)
    via_g = min(bands.extra, int(np.count_nonzero(bands.plus & (wanted > bands.spare))))
    by_nodes = int(base.sum() + to_hub.sum()) + via_g
    return min(by_rows, by_nodes)


def most_kept(
    width: int,
    cur_row: I64,
    cur_node: I64,
    of_node: I64,
    bands: Bands,
    n_domains: int,
    kept: NDArray[np.bool_],
) -> tuple[NDArray[np.bool_], NDArray[np.bool_]] | None:
    """Current pairs (a mask over ``cur_*``) that keep more than ``kept`` and as many as any
    assignment can, and the domains whose nodes keep more with them than the floors of the
    lower domain total allow (they need the ``+1``); None when ``kept`` already keeps that
    many (or is not a flow here, which a valid assignment never is)."""
    n = len(of_node)
    pd_code = cur_row * n_domains + of_node[cur_node]
    pd, pd_of_pair = np.unique(pd_code, return_inverse=True)
    rows, row_of_pd = np.unique(pd // n_domains, return_inverse=True)
    n_rows, n_pd = len(rows), len(pd)
    # Vertices: source, rows, (row, domain) pairs, nodes, hubs, G, sink.
    source = 0
    row_base, pd_base = 1, 1 + n_rows
    node_base = pd_base + n_pd
    hub_base = node_base + n
    g, sink = hub_base + n_domains, hub_base + n_domains + 1
    given = int(kept.sum())
    kept = _direct(width, cur_row, cur_node, pd_of_pair, bands.node_floor, kept)
    kept_pd = np.bincount(pd_of_pair[kept], minlength=n_pd)
    if (kept_pd > 1).any():
        return None
    kept_row = np.bincount(row_of_pd, weights=kept_pd, minlength=n_rows).astype(np.int64)
    held = np.bincount(cur_node[kept], minlength=n)
    base = np.minimum(held, bands.node_floor)
    over = held - base
    wanted = np.bincount(of_node, weights=over, minlength=n_domains).astype(np.int64)
    to_hub = np.minimum(wanted, bands.spare)
    via_g = wanted - to_hub
    if (over > bands.node_room).any() or (via_g > bands.plus).any() or via_g.sum() > bands.extra:
        return None
    nodes, doms = np.arange(n), np.arange(n_domains)
    has_floor, has_room = bands.node_floor > 0, bands.node_room > 0
    has_spare = bands.spare > 0
    plus_at = np.flatnonzero(bands.plus)
    # Edges in groups of (tail, head, capacity, flow); the pairs' group is the third.
    extra = 1 if bands.extra else 0
    groups = [
        _edges(source, row_base + np.arange(n_rows), width, kept_row),
        _edges(row_base + row_of_pd, pd_base + np.arange(n_pd), 1, kept_pd),
        _edges(pd_base + pd_of_pair, node_base + cur_node, 1, kept),
        _edges(node_base + nodes[has_floor], sink, bands.node_floor[has_floor], base[has_floor]),
        _edges(
            node_base + nodes[has_room],
            hub_base + of_node[has_room],
            bands.node_room[has_room],
            over[has_room],
        ),
        _edges(hub_base + doms[has_spare], sink, bands.spare[has_spare], to_hub[has_spare]),
        _edges(hub_base + plus_at, g, 1, via_g[plus_at]),
        _edges(np.full(extra, g), sink, bands.extra, int(via_g.sum())),
    ]
    tail, head, cap, flow = (np.concatenate([grp[k] for grp in groups]) for k in range(4))
    flow, added = augment(sink + 1, tail, head, cap, flow, source, sink)
    if not added and int(kept.sum()) == given:
        return None
    sizes = np.cumsum([len(grp[0]) for grp in groups])
    pair_flow = flow[sizes[1] : sizes[2]]
    plus = np.zeros(n_domains, dtype=np.bool_)
    plus[plus_at] = flow[sizes[5] : sizes[6]] > 0
    return pair_flow > 0, plus


#: The explicit joint solver (:func:`exact_small`) takes zones whose work — units of flow
#: (P · R', one shortest-path search each) × edges × choices of domains taking the ``+1`` —
#: is at most this (about a second of Python).
SMALL_WORK = 2_000_000


def exact_small(
    partitions: int,
    width: int,
    cur_row: I64,
    cur_node: I64,
    of_node: I64,
    domains: Targets,
    node_weights: Sequence[Sequence[float]],
    members: Sequence[I64],
) -> tuple[I64, I64] | None:
    """The assignment keeping the most current pairs over both levels at once, by a min-cost
    flow on the whole network (every partition to every node of every domain), for each choice
    of the domains that take the ``+1`` (each choice fixes every node's exact targets); None
    when the zone is too large for it (:data:`SMALL_WORK`)."""
    n, n_dom = len(of_node), len(members)
    eligible = np.flatnonzero(domains.eligible).tolist()
    size = partitions * (1 + n_dom + n) + 2 * n + n_dom
    if partitions * width * size * math.comb(len(eligible), domains.extra) > SMALL_WORK:
        return None
    choices = combinations(eligible, domains.extra)
    current = set(zip(cur_row.tolist(), cur_node.tolist(), strict=True))
    best: tuple[int, list[tuple[int, int]]] | None = None
    for plus in choices:
        totals = domains.floor.copy()
        totals[list(plus)] += 1
        # Vertices: source, rows, (row, domain), nodes, hubs, sink.
        pd_base = 1 + partitions
        node_base = pd_base + partitions * n_dom
        hub_base = node_base + n
        sink = hub_base + n_dom
        net = Network(sink + 1)
        edges: list[tuple[int, int, int]] = []
        for p in range(partitions):
            net.add(0, 1 + p, width)
            for d in range(n_dom):
                net.add(1 + p, pd_base + p * n_dom + d, 1)
                for i in members[d].tolist():
                    cost = -1 if (p, i) in current else 0
                    edges.append((net.add(pd_base + p * n_dom + d, node_base + i, 1, cost), p, i))
        for d in range(n_dom):
            total = int(totals[d])
            _, t = weighted_targets(list(node_weights[d]), total, hi=[total] * len(members[d]))
            for i, low, up in zip(
                members[d].tolist(), t.floor.tolist(), t.eligible.tolist(), strict=True
            ):
                if low:
                    net.add(node_base + i, sink, low)
                if up:
                    net.add(node_base + i, hub_base + d, 1)
            if t.extra:
                net.add(hub_base + d, sink, t.extra)
        if net.min_cost_flow(0, sink, partitions * width) != partitions * width:
            continue
        chosen = [(p, i) for e, p, i in edges if net.flow(e)]
        kept = sum((p, i) in current for p, i in chosen)
        if best is None or kept > best[0]:
            best = (kept, chosen)
    if best is None:
        return None
    rows = np.asarray([p for p, _ in best[1]], dtype=np.int64)
    nodes = np.asarray([i for _, i in best[1]], dtype=np.int64)
    return rows, nodes


def _edges(*columns: int | I64 | NDArray[np.bool_]) -> list[I64]:
    """A group of edges as columns of one length (scalars repeated), as int64."""
    arrays = [np.asarray(c, dtype=np.int64) for c in columns]
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    return [np.broadcast_to(a, shape) for a in arrays]


def _direct(
    width: int, cur_row: I64, cur_node: I64, pd_of_pair: I64, floor: I64, kept: NDArray[np.bool_]
) -> NDArray[np.bool_]:
    """``kept`` with the unused current pairs added that fit as they are — a partition below
    R' replicas, its domain free, the node below its floor (augmenting paths of length one,
    taken greedily so that the max flow starts closer to its end)."""
    unused = np.flatnonzero(~kept)
    if not len(unused):
        return kept
    kept = kept.copy()
    row_left = (width - np.bincount(cur_row[kept], minlength=int(cur_row.max()) + 1)).tolist()
    pd_used = np.bincount(pd_of_pair[kept], minlength=int(pd_of_pair.max()) + 1).tolist()
    room = (floor - np.bincount(cur_node[kept], minlength=len(floor))).tolist()
    rows, nodes, pds = (
        cur_row[unused].tolist(),
        cur_node[unused].tolist(),
        pd_of_pair[unused].tolist(),
    )
    for k, r, i, j in zip(unused.tolist(), rows, nodes, pds, strict=True):
        if row_left[r] > 0 and not pd_used[j] and room[i] > 0:
            kept[k] = True
            row_left[r] -= 1
            pd_used[j] = 1
            room[i] -= 1
    return kept
