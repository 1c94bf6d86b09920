"""placement.algo.network: max flow equals the minimum cut (brute force over every cut of a
small random network), also when started from a feasible flow already on the edges."""

from __future__ import annotations

from itertools import product

from hypothesis import given, settings
from hypothesis import strategies as st

from placement.algo.network import Network

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
