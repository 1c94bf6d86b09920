"""An exact oracle for the placement function: its targets as a MIP, solved by HiGHS (highspy).

A development dependency only (tests and bench/placement_oracle_bench.py), never the product's.
For one small zone the model has a binary ``x[p, i]`` per (partition, eligible node):

* every partition gets ``R' = min(R, N)`` distinct nodes;
* loads meet the targets of design/placement.md, "Targets": without failure domains node ``i``
  holds ``⌊s_i⌋`` or ``⌈s_i⌉`` of the water-filled weighted share ``s_i`` (capped at P); with
  ``D ≥ R'`` domains a partition has at most one replica per domain, domain ``d`` holds ``T_d ∈
  {⌊S_d⌋, ⌈S_d⌉}`` (its water-filled share), and node ``i`` of ``d`` ``⌊s_i(T_d)⌋`` or
  ``⌈s_i(T_d)⌉`` of the water-fill of ``T_d`` inside the domain (capped at ``T_d``, the rows the
  domain takes) — both choices of ``T_d`` modelled with one binary per domain;
* maximise the current pairs kept; then, with that many kept, minimise the primary changes (a
  partition whose current primary — its first member, still eligible — does not lead it), node
  ``i`` leading ``⌊ℓ_i/R'⌋..⌈ℓ_i/R'⌉`` partitions (linear: ``R'·lead − R' + 1 ≤ ℓ ≤ R'·lead +
  R' − 1``).

``D < R'`` (every partition spans every domain, node targets follow the multiplicities) is not
modelled: :func:`optimum` returns None for it. The shares come from the tests' own brute-force
water-fill (``test_placement_oracles.shares``), not from the code under test.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import highspy
from test_placement_oracles import domain_of, eligible_nodes, shares

from placement.core.model import Node, ZoneSpec


@dataclass(frozen=True)
class Optimum:
    kept: int
    primary_changes: int


def floor_ceil(share: Fraction) -> tuple[int, int]:
    low = share.numerator // share.denominator
    return low, low + (share.denominator != 1)


def valid_pairs(
    zone: ZoneSpec, eligible: Sequence[str], current: Mapping[int, Sequence[str]]
) -> tuple[set[tuple[int, str]], dict[int, str]]:
    """The current pairs placement keeps track of, and each partition's current primary."""
    names = set(eligible)
    pairs = {(p, n) for p, peers in current.items() if 0 <= p < zone.partitions for n in peers} & {
        (p, n) for p in range(zone.partitions) for n in names
    }
    primary = {
        p: peers[0]
        for p, peers in current.items()
        if 0 <= p < zone.partitions and peers and peers[0] in names
    }
    return pairs, primary


def kept_and_changes(
    zone: ZoneSpec,
    nodes: Sequence[Node],
    current: Mapping[int, Sequence[str]],
    assignments: Sequence[Sequence[str]],
) -> Optimum:
    """What an output keeps of ``current`` and how many current primaries it changes."""
    eligible = [n.name for n in eligible_nodes(zone, nodes)]
    pairs, primary = valid_pairs(zone, eligible, current)
    kept = sum((p, n) in pairs for p, peers in enumerate(assignments) for n in peers)
    changes = sum(assignments[p][0] != node for p, node in primary.items())
    return Optimum(kept, changes)


def optimum(
    zone: ZoneSpec, nodes: Sequence[Node], current: Mapping[int, Sequence[str]]
) -> Optimum | None:
    """The most current pairs any assignment meeting the targets keeps, and the fewest primary
    changes among those; None when the zone has fewer domains than ``R'``."""
    eligible = eligible_nodes(zone, nodes)
    names = [n.name for n in eligible]
    p_count, n_count = zone.partitions, len(eligible)
    width = min(zone.replicas, n_count)
    total = p_count * width
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    x = {(p, i): h.addBinary() for p in range(p_count) for i in range(n_count)}
    for p in range(p_count):
        h.addConstr(sum(x[p, i] for i in range(n_count)) == width)
    load = [sum(x[p, i] for p in range(p_count)) for i in range(n_count)]
    if zone.failure_domain is None:
        node_shares = shares([n.weight for n in eligible], total, [p_count] * n_count)
        for i, share in enumerate(node_shares):
            low, high = floor_ceil(share)
            h.addConstr(load[i] >= low)
            h.addConstr(load[i] <= high)
    else:
        labels = sorted({domain_of(n, zone.failure_domain) for n in eligible})
        if len(labels) < width:
            return None
        members = {
            d: [i for i, n in enumerate(eligible) if domain_of(n, zone.failure_domain) == d]
            for d in labels
        }
        weights = [sum(eligible[i].weight for i in members[d]) for d in labels]
        domain_shares = shares(weights, total, [p_count] * len(labels))
        extra = []
        for d, share in zip(labels, domain_shares, strict=True):
            inside = members[d]
            for p in range(p_count):
                h.addConstr(sum(x[p, i] for i in inside) <= 1)
            low, high = floor_ceil(share)
            z = h.addBinary() if high > low else None
            if z is not None:
                extra.append(z)
            domain_load = sum(load[i] for i in inside)
            h.addConstr(domain_load == (low + z if z is not None else low))
            wd = [eligible[i].weight for i in inside]
            at_low = shares(wd, low, [low] * len(inside))
            at_high = shares(wd, high, [high] * len(inside)) if z is not None else at_low
            for i, s0, s1 in zip(inside, at_low, at_high, strict=True):
                (lo0, hi0), (lo1, hi1) = floor_ceil(s0), floor_ceil(s1)
                if z is None:
                    h.addConstr(load[i] >= lo0)
                    h.addConstr(load[i] <= hi0)
                else:
                    h.addConstr(load[i] >= lo0 + (lo1 - lo0) * z)
                    h.addConstr(load[i] <= hi0 + (hi1 - hi0) * z)
        if extra:
            h.addConstr(sum(extra) == total - sum(floor_ceil(s)[0] for s in domain_shares))
    pairs, primary = valid_pairs(zone, names, current)
    index = {n: i for i, n in enumerate(names)}
    keep = sum(x[p, index[n]] for p, n in pairs) if pairs else 0
    if pairs:
        h.maximize(keep)
    else:
        h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        raise AssertionError(f"oracle: model not solved ({h.getModelStatus()})")
    best = round(h.getObjectiveValue()) if pairs else 0
    # Stage 2: primaries, with the kept pairs held at their maximum.
    if pairs:
        h.addConstr(keep >= best)
    y = {(p, i): h.addBinary() for p in range(p_count) for i in range(n_count)}
    for p in range(p_count):
        h.addConstr(sum(y[p, i] for i in range(n_count)) == 1)
        for i in range(n_count):
            h.addConstr(y[p, i] <= x[p, i])
    for i in range(n_count):
        lead = sum(y[p, i] for p in range(p_count))
        h.addConstr(width * lead - width + 1 <= load[i])
        h.addConstr(load[i] <= width * lead + width - 1)
    if primary:
        h.minimize(sum(1 - y[p, index[n]] for p, n in primary.items()))
    else:
        h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        raise AssertionError(f"oracle: primary model not solved ({h.getModelStatus()})")
    changes = round(h.getObjectiveValue()) if primary else 0
    return Optimum(best, changes)
