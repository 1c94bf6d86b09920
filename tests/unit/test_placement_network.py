"""placement.algo.network: max flow equals the minimum cut (brute force over every cut of a
small random network), also when started from a feasible flow already on the edges — for the
explicit network and for the compiled ``augment`` alike."""

from __future__ import annotations

from itertools import product

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.algo.network import Network, augment

Edge = tuple[int, int, int]


def min_cut(n: int, edges: list[Edge]) -> int:
    best = None
    for side in product((0, 1), repeat=n - 2):
        source_side = {0} | {v + 1 for v, s in enumerate(side) if s == 0}
        cut = sum(c for u, v, c in edges if u in source_side and v not in source_side)
        best = cut if best is None else min(best, cut)
    assert best is not None
    return best


@st.composite
def networks(draw: st.DrawFn) -> tuple[int, list[Edge]]:
    n = draw(st.integers(2, 7))
    edges = draw(
        st.lists(
            st.tuples(st.integers(0, n - 1), st.integers(0, n - 1), st.integers(0, 4)).filter(
                lambda e: e[0] != e[1]
            ),
            max_size=18,
        )
    )
    return n, edges


@settings(max_examples=300, deadline=None)
@given(networks(), st.booleans())
def test_max_flow_is_the_min_cut(graph: tuple[int, list[Edge]], twice: bool) -> None:
    n, edges = graph
    sink = n - 1
    net = Network(n)
    ids = [net.add(u, v, c) for u, v, c in edges]
    first = net.max_flow(0, sink)
    if twice:  # rebuilt with that flow on the edges: nothing more to add
        again = Network(n)
        for (u, v, c), e in zip(edges, ids, strict=True):
            again.add(u, v, c, flow=net.flow(e))
        assert again.max_flow(0, sink) == 0
    assert first == min_cut(n, edges)
    for (_, _, c), e in zip(edges, ids, strict=True):
        assert 0 <= net.flow(e) <= c
    for x in range(1, sink):  # conservation
        inflow = sum(net.flow(e) for (u, v, _), e in zip(edges, ids, strict=True) if v == x)
        out = sum(net.flow(e) for (u, v, _), e in zip(edges, ids, strict=True) if u == x)
        assert inflow == out


@settings(max_examples=300, deadline=None)
@given(networks(), st.lists(st.integers(0, 4), min_size=18, max_size=18))
def test_augment_reaches_the_min_cut_from_any_feasible_flow(
    graph: tuple[int, list[Edge]], lower: list[int]
) -> None:
    """The compiled max flow on the residual network: started from a feasible flow (a maximum
    under capacities cut down at random), it adds exactly what the min cut leaves."""
    n, drawn = graph
    sink = n - 1
    seen: set[frozenset[int]] = set()
    edges = []
    for u, v, c in drawn:  # augment takes at most one edge between two vertices
        if frozenset((u, v)) not in seen:
            seen.add(frozenset((u, v)))
            edges.append((u, v, c))
    start = Network(n)
    ids = [start.add(u, v, min(c, cut)) for (u, v, c), cut in zip(edges, lower, strict=False)]
    value = start.max_flow(0, sink)
    tail, head, cap = (np.asarray([e[k] for e in edges], dtype=np.int64) for k in range(3))
    flow0 = np.asarray([start.flow(e) for e in ids], dtype=np.int64)
    flow, added = augment(n, tail, head, cap, flow0, 0, sink)
    assert value + added == min_cut(n, edges)
    assert ((flow >= 0) & (flow <= cap)).all()
    balance = np.zeros(n, dtype=np.int64)
    np.add.at(balance, tail, -flow)
    np.add.at(balance, head, flow)
    assert not balance[1:sink].any()
    assert balance[sink] == value + added


def test_augment_refuses_two_edges_between_the_same_vertices() -> None:
    one = np.asarray([0, 1], dtype=np.int64)
    with pytest.raises(ValueError, match="same two vertices"):
        augment(2, one, one[::-1].copy(), np.ones(2, np.int64), np.zeros(2, np.int64), 0, 1)


def test_augment_cancels_flow_it_was_given() -> None:
    """0 → 1 → 2 → 3 carries the given unit; the maximum (2) needs it cancelled on 1 → 2:
    0 → 1 → 3 and 0 → 2 → 3."""
    tail = np.asarray([0, 0, 1, 1, 2], dtype=np.int64)
    head = np.asarray([1, 2, 2, 3, 3], dtype=np.int64)
    flow, added = augment(
        4, tail, head, np.ones(5, np.int64), np.asarray([1, 0, 1, 0, 1], np.int64), 0, 3
    )
    assert added == 1
    assert flow.tolist() == [1, 1, 0, 1, 1]
