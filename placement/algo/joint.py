"""Members chosen for their primaries too: among the member sets that keep the most current
pairs, one that lets the most current primaries stay (design/placement.md, "Primaries").

The core keeps the most current pairs; which of several equally good member sets it returns
decides what the primaries can keep. A row whose current primary lost its membership to a tie,
or whose primary's node is at its upper bound where another equally good set would raise that
bound, changes its primary for nothing. This step re-chooses the members on one min-cost
circulation over the rows, the nodes and their bands:

* row ``p`` sends its ``R'`` units to distinct nodes; a current pair costs ``−B`` (``B`` more
  than any count of primaries, so no kept pair is ever traded for primaries);
* the unit to ``p``'s current primary ``c`` may go through ``c``'s *kept-primary port* at a
  further cost of ``−1``; the port holds at most ``⌈ℓ_c/R'⌉`` units — the most primaries ``c``
  may lead at its load ``ℓ_c`` — and where ``c``'s ``+1`` replica raises that bound, the port's
  extra unit is that ``+1`` (a gadget: the ``+1`` slot is shared by the port and the node);
* node ``i`` ends within its band ``[lo_i, hi_i]``, and the total is fixed.

Starting from the core's members (a feasible circulation), negative cycles are cancelled until
none is left (Bellman-Ford): then no member set within the bands keeps more pairs, and none
keeps as many with more ports used. The ports relax the primaries' lower bounds, so the
primaries chosen afterwards (:func:`placement.algo.preferred.choose_primaries`) may keep fewer
than the ports promise; the caller keeps whichever member set changes fewer primaries. The
work (edge relaxations) is bounded by :data:`JOINT_WORK`: a larger zone keeps the core's
members, and its primaries are those of :mod:`placement.algo.preferred` alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from placement.algo.network import Network

I64 = NDArray[np.int64]

#: Edge relaxations the cycle searches may spend (about 0.2 s of Python); work, not time, so
#: the answer is the same on every machine. When it runs out, the members found so far are
#: kept (every cancelled cycle made them better, none worse).
JOINT_WORK = 2_000_000
#: Zones with more (row, node) edges than this are not tried: building the network alone
#: would cost more than the searches may.
JOINT_EDGES = 20_000


def primaries_bound(members: I64, current: I64, lo: I64, hi: I64) -> int:
    """The most current primaries any member set in the bands lets stay (see :func:`_may_gain`)."""
    rows, width = len(members), int(members.shape[1])
    led = np.bincount(current[current >= 0], minlength=len(hi))
    most = int(np.minimum(led, -(-hi // width)).sum())
    short = int(np.maximum(0, lo // width - led).sum())
    return min(most, rows - short)


def _may_gain(members: I64, primary: I64, current: I64, lo: I64, hi: I64) -> bool:
    """Whether other members could keep more current primaries, by two bounds that hold for
    every member set in the bands:

    * a node ``c`` leads at most ``⌈hi_c/R'⌉`` of the ``W_c`` rows it led before, and the
      rows it leads beyond those must cover the rest of its floor ``⌊lo_c/R'⌋``, so at most
      ``min(Σ min(W_c, ⌈hi_c/R'⌉), P − Σ max(0, ⌊lo_c/R'⌋ − W_c))`` primaries stay (the
      usual join: the new node's floor is what the others lose);
    * the ports (see the module) gain only where a row takes its current primary ``c`` back
      as a member while ``c``'s port has room, or where ``c``'s ``+1`` replica raises its
      bound ``⌈ℓ/R'⌉`` while more rows want it than that.
    """
    width = members.shape[1]
    n_nodes = len(hi)
    if np.count_nonzero(primary == current) >= primaries_bound(members, current, lo, hi):
        return False
    valid = current >= 0
    led = np.bincount(current[valid], minlength=n_nodes)
    load = np.bincount(members.ravel(), minlength=n_nodes)
    holds = valid & (members == current[:, None]).any(axis=1)
    wanted = np.bincount(current[holds], minlength=n_nodes)
    lost = led - wanted
    top = -(-load // width)
    raise_ = (load < hi) & (-(-(load + 1) // width) > top)
    return bool((((lost > 0) & (wanted < top)) | (raise_ & (wanted + lost > top))).any())


def members_for_primaries(
    members: I64,
    primary: I64,
    current: I64,
    cur_row: I64,
    cur_node: I64,
    lo: I64,
    hi: I64,
    domain: I64 | None = None,
) -> I64 | None:
    """Members (rows × R', each row sorted) keeping as many current pairs as ``members`` and
    the most current primaries the ports allow; None when nothing changes or the zone is
    beyond :data:`JOINT_EDGES`.

    ``domain[i]``, with failure domains (``D ≥ R'``): node ``i``'s domain; a row then takes at
    most one node per domain, and every domain keeps the total ``members`` give it (the bands
    are those of that total).

    ``primary`` is the primary chosen for ``members``, ``current[p]`` the row's current
    primary or -1, ``cur_row``/``cur_node`` the current pairs and ``[lo_i, hi_i]`` node
    ``i``'s load band (``hi_i ≤ lo_i + 1``; the loads of ``members`` are within it, and their
    primaries within ``⌊ℓ_i/R'⌋..⌈ℓ_i/R'⌉``).
    """
    rows, width = members.shape
    n_nodes = len(lo)
    back = (current >= 0) & (primary != current)
    if not back.any():
        return None
    if rows * n_nodes > JOINT_EDGES or not _may_gain(members, primary, current, lo, hi):
        return None
    n_dom = 0 if domain is None else int(domain.max()) + 1
    hub_base = 2 * rows + 3 * n_nodes
    dom_base = hub_base + rows * n_dom
    vertices = dom_base + n_dom + 1
    held = np.zeros((rows, n_nodes), dtype=np.bool_)
    held[cur_row, cur_node] = True
    big = rows + 1
    net = Network(vertices)
    g_base, node_base = rows, 2 * rows
    port_base, plus_base, sink = 2 * rows + n_nodes, 2 * rows + 2 * n_nodes, vertices - 1
    member = np.zeros((rows, n_nodes), dtype=np.bool_)
    member[np.arange(rows)[:, None], members] = True
    load = member.sum(axis=0)
    # Start with the ports as full as these members allow: the rows their current primaries
    # lead first, then the others holding their current primary, each port up to ⌈ℓ/R'⌉.
    room = (-(-load // width)).tolist()
    holds = (current >= 0) & member[np.arange(rows), np.maximum(current, 0)]
    routed = np.zeros(rows, dtype=np.bool_)
    for p in (
        np.flatnonzero(holds & (primary == current)).tolist()
        + np.flatnonzero(holds & (primary != current)).tolist()
    ):
        c = int(current[p])
        if room[c] > 0:
            room[c] -= 1
            routed[p] = True
    # Where a row's units leave from towards node i: the row, or its hub for i's domain.
    if domain is None:
        start = [[p] * n_nodes for p in range(rows)]
    else:
        of = domain.tolist()
        start = [[hub_base + p * n_dom + of[i] for i in range(n_nodes)] for p in range(rows)]
        in_domain = np.zeros((rows, n_dom), dtype=np.int64)
        np.add.at(in_domain, (np.repeat(np.arange(rows), width), domain[members.ravel()]), 1)
        for p in range(rows):
            for d in range(n_dom):
                net.add(p, hub_base + p * n_dom + d, 1, flow=int(in_domain[p, d]))
    row_edges: list[tuple[int, int, int]] = []  # (row, node, edge) of the direct edges
    through: list[int] = []  # per row: the edge row → its gadget, or -1
    via_port = np.zeros(n_nodes, dtype=np.int64)
    for p in range(rows):
        c = int(current[p])
        at = start[p]
        if c >= 0:
            has = bool(holds[p])
            kept = bool(routed[p])
            g = g_base + p
            through.append(net.add(at[c], g, 1, cost=-big, flow=int(has)))
            net.add(g, port_base + c, 1, cost=-1, flow=int(kept))
            net.add(g, node_base + c, 1, flow=int(has and not kept))
            via_port[c] += kept
        else:
            through.append(-1)
        for i in range(n_nodes):
            if i != c:
                cost = -big if held[p, i] else 0
                e = net.add(at[i], node_base + i, 1, cost=cost, flow=int(member[p, i]))
                row_edges.append((p, i, e))
    # Each node's units end in the sink, or in its domain, which holds its total.
    ends = [sink] * n_nodes if domain is None else [dom_base + d for d in domain.tolist()]
    if domain is not None:
        totals = np.bincount(domain, weights=load, minlength=n_dom).astype(np.int64).tolist()
        for d in range(n_dom):
            net.add(dom_base + d, sink, totals[d], flow=totals[d], low=totals[d])
    for i in range(n_nodes):
        low, high, now, ports = int(lo[i]), int(hi[i]), int(load[i]), int(via_port[i])
        node, port, plus = node_base + i, port_base + i, plus_base + i
        if high > low and low % width == 0:
            # The +1 replica raises the bound by one: the port's extra unit is that +1.
            fixed = low // width
            plus_port = int(now > low and ports > fixed)
            net.add(port, node, fixed, flow=ports - plus_port)
            net.add(port, plus, 1, flow=plus_port)
            net.add(node, plus, 1, flow=int(now > low) - plus_port)
            net.add(node, ends[i], low, flow=low, low=low)
            net.add(plus, ends[i], 1, flow=now - low)
        else:
            net.add(port, node, -(-low // width), flow=ports)
            net.add(node, ends[i], high, flow=now, low=low)
    if min(net.cap) < 0:  # a load or a primary count outside its band: not this step's input
        return None
    budget = [JOINT_WORK]
    changed = False
    while (cycle := net.negative_cycle(budget)) is not None:
        net.push_cycle(cycle)
        changed = True
    if not changed:
        return None
    out = np.zeros((rows, n_nodes), dtype=np.bool_)
    for p, i, e in row_edges:
        out[p, i] = net.flow(e) > 0
    for p in range(rows):
        if through[p] >= 0 and net.flow(through[p]) > 0:
            out[p, int(current[p])] = True
    if np.array_equal(out, member):  # only the ports' use changed
        return None
    result = np.nonzero(out)[1].reshape(rows, width)
    return result.astype(np.int64)


#: What :func:`exchanges` may spend: one unit per candidate change looked at, and the member
#: slots (rows × R') of the primaries chosen for each candidate that keeps the targets — a
#: zone of 12 × 3 may try about 1,000, one of 1,000 × 3 about 10 (at most about 0.2 s).
#: Work, not time: the same answer on every machine.
EXCHANGE_WORK = 50_000


def exchanges(
    members: I64,
    primary: I64,
    load: I64,
    current: I64,
    cur_row: I64,
    cur_node: I64,
    bound: int,
    choose: Callable[[I64, I64], I64],
    fits: Callable[[I64, int, int], bool],
    domain: I64 | None = None,
) -> tuple[I64, I64] | None:
    """Members changed one row at a time — a member moved to another node, or two rows
    swapping a member each — keeping the current pairs kept, the loads within their targets
    (``fits(loads, y, z)``: with one replica moved from ``y`` to ``z``) and every row's
    domains distinct, wherever that lets the primaries
    (``choose(members, loads)``) keep more current primaries; the members and primaries
    found, or None.

    What the ports cannot see: a node's floor of primaries, and (with failure domains) which
    domains take the ``+1`` of their totals. A node that must lead one row but is a member
    only of rows their current primaries still lead takes one of them; swapped into a row
    without a current primary to keep, it leads that one instead. Tried while fewer current
    primaries stay than ``bound`` (:func:`primaries_bound`), first on the rows whose current
    primary does not lead them, and within :data:`EXCHANGE_WORK`.
    """
    rows = len(members)
    best = int(np.count_nonzero(primary == current))
    if best >= bound or rows * len(load) > JOINT_EDGES:
        return None
    search = _Search(current, cur_row, cur_node, choose, fits, domain, EXCHANGE_WORK)
    found: tuple[I64, I64] | None = None
    while best < bound:
        blocked = (current >= 0) & (primary != current)
        # The rows whose current primary does not lead them first, then the others.
        order = np.flatnonzero(blocked).tolist() + np.flatnonzero(~blocked).tolist()
        step = search.first_better(members, load, order, best)
        if step is None:
            break
        members, load, primary = step
        best = int(np.count_nonzero(primary == current))
        found = (members, primary)
    return found


class _Search:
    """The neighbourhood of :func:`exchanges` and what it may spend: one unit per candidate
    looked at, ``rows × R'`` per candidate whose primaries are chosen."""

    def __init__(
        self,
        current: I64,
        cur_row: I64,
        cur_node: I64,
        choose: Callable[[I64, I64], I64],
        fits: Callable[[I64, int, int], bool],
        domain: I64 | None,
        budget: int,
    ) -> None:
        self.current = current
        self.held = {(int(p), int(i)) for p, i in zip(cur_row, cur_node, strict=True)}
        self.choose = choose
        self.fits = fits
        self.domain = None if domain is None else domain.tolist()
        self.budget = budget

    def first_better(
        self, members: I64, load: I64, order: list[int], best: int
    ) -> tuple[I64, I64, I64] | None:
        """The first change (rows in ``order``: a move of the row's, then swaps with every
        later row) whose primaries keep more than ``best``: members, loads and primaries; None
        when none does within the budget."""
        rows = [members[p].tolist() for p in range(len(members))]
        n_nodes = len(load)
        for at, p in enumerate(order):
            row_p = rows[p]
            self.budget -= len(row_p) * n_nodes
            if self.budget < 0:
                return None
            for y in row_p:
                for z in range(n_nodes):
                    if z in row_p or not self._distinct(row_p, y, z):
                        continue
                    if self._loses(p, y, z) > 0 or not self.fits(load, y, z):
                        continue
                    moved = load.copy()
                    moved[y] -= 1
                    moved[z] += 1
                    found = self._try(members, moved, best, ((p, y, z),))
                    if found is not False:
                        return found
            later = order[at + 1 :]
            self.budget -= len(later) * len(row_p) ** 2
            if self.budget < 0:
                return None
            for q in later:
                row_q = rows[q]
                for y in row_p:
                    if y in row_q:
                        continue
                    for z in row_q:
                        if z in row_p or not self._swaps(row_p, row_q, y, z):
                            continue
                        if self._loses(p, y, z) + self._loses(q, z, y) > 0:
                            continue  # a kept pair lost
                        found = self._try(members, load, best, ((p, y, z), (q, z, y)))
                        if found is not False:
                            return found
        return None

    def _distinct(self, row: list[int], y: int, z: int) -> bool:
        """Whether ``z`` may replace ``y`` in ``row`` with the row's domains still distinct."""
        dom = self.domain
        return dom is None or dom[z] == dom[y] or all(dom[n] != dom[z] for n in row)

    def _swaps(self, row_p: list[int], row_q: list[int], y: int, z: int) -> bool:
        """Whether ``y`` of ``row_p`` and ``z`` of ``row_q`` may trade places (loads and
        domain totals stay; both rows' domains must stay distinct)."""
        return self._distinct(row_p, y, z) and self._distinct(row_q, z, y)

    def _loses(self, p: int, y: int, z: int) -> int:
        """Kept pairs lost when row ``p`` trades ``y`` for ``z`` (-1: one more kept)."""
        return int((p, y) in self.held) - int((p, z) in self.held)

    def _try(
        self, members: I64, load: I64, best: int, changes: tuple[tuple[int, int, int], ...]
    ) -> tuple[I64, I64, I64] | Literal[False] | None:
        """The change's members, loads and primaries if they keep more than ``best``; False
        if not; None when the budget is spent."""
        self.budget -= members.size
        if self.budget < 0:
            return None
        trial = members.copy()
        for p, y, z in changes:
            row = trial[p].tolist()
            row[row.index(y)] = z
            trial[p] = sorted(row)
        chosen = self.choose(trial, load)
        if int(np.count_nonzero(chosen == self.current)) > best:
            return trial, load, chosen
        return False
