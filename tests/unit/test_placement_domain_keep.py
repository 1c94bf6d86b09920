"""placement.algo.domain_keep: the joint bound over domains and nodes.

On random small zones with failure domains (``D ≥ R'``): the max flow found from nothing and
the one found from the levels' kept pairs (after the direct additions) keep the same number of
current pairs; ``None`` comes back only when the given pairs already keep that many; the
cheap cuts are never below the flow; and what place() keeps never exceeds it.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from test_placement_mip import random_case

from placement.algo import domain_keep
from placement.algo.place import _Context, _Domains, _solve_domains
from placement.algo.targets import weighted_targets


@pytest.mark.parametrize("seed", range(6))
def test_the_bound_from_nothing_and_from_the_levels_agree(seed: int) -> None:
    rng = random.Random(500 + seed)
    checked = 0
    for _ in range(80):
        zone, nodes, current = random_case(rng, domains=True)
        eligible = sorted((n for n in nodes if n.matches(zone.node_selector)), key=lambda n: n.name)
        if not eligible:
            continue
        ctx = _Context.build(zone, eligible, current, frozenset(), None)
        dom = _Domains.build(ctx, "rack")
        n_dom = len(dom.labels)
        if n_dom < ctx.width or not len(ctx.cur_row):
            continue
        _, targets = weighted_targets(dom.weights, ctx.total, hi=[ctx.partitions] * n_dom)
        limits = domain_keep.bands(targets, dom.node_weights, dom.nodes, len(ctx.names))
        args = (ctx.width, ctx.cur_row, ctx.cur_node, dom.of_node, limits, n_dom)
        none = np.zeros(len(ctx.cur_row), dtype=np.bool_)
        found = domain_keep.most_kept(*args, none)
        best = 0 if found is None else int(found[0].sum())
        assert domain_keep.cut_bound(*args) >= best
        pairs = _solve_domains(ctx, "rack")
        width = len(ctx.names)
        chosen = np.zeros(ctx.partitions * width, dtype=np.bool_)
        chosen[pairs[0] * width + pairs[1]] = True
        kept = chosen[ctx.cur_row * width + ctx.cur_node]
        assert int(kept.sum()) <= best
        again = domain_keep.most_kept(*args, kept)
        if again is None:
            assert int(kept.sum()) == best
        else:
            assert int(again[0].sum()) == best
        checked += 1
    assert checked >= 30
