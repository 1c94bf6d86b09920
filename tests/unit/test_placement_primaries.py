"""preferred.fewest_changes: the primaries keep as many current primaries as any choice within
the bounds can, for the given members — checked against a min-cost flow
(placement.algo.network) on random member matrices with arbitrary current primaries, and
against a linear program (HiGHS) on zones of 9,000 member slots."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.algo import preferred
from placement.algo.hashing import mix64
from placement.algo.network import Network
from placement.algo.preferred import choose_primaries


@st.composite
def zones(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    n = draw(st.integers(2, 7))
    width = draw(st.integers(1, min(n, 4)))
    rows = draw(st.integers(1, 30))
    members = np.asarray(
        [sorted(draw(st.permutations(range(n)))[:width]) for _ in range(rows)], dtype=np.int64
    )
    current = np.asarray([draw(st.integers(-1, n - 1)) for _ in range(rows)], dtype=np.int64)
    return members, current


def most_kept(members: np.ndarray, current: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> int:
    rows, _ = members.shape
    n = len(lo)
    source, sink, hub = rows + n, rows + n + 1, rows + n + 2
    net = Network(rows + n + 3)
    for r in range(rows):
        net.add(source, r, 1)
        for i in members[r].tolist():
            net.add(r, rows + i, 1, -1 if i == current[r] else 0)
    for i in range(n):
        if lo[i]:
            net.add(rows + i, sink, int(lo[i]))
        if hi[i] > lo[i]:
            net.add(rows + i, hub, int(hi[i] - lo[i]))
    net.add(hub, sink, rows - int(lo.sum()))
    assert net.min_cost_flow(source, sink, rows) == rows
    return sum(net.flow(e) for e in range(0, len(net.to), 2) if net.cost[e] == -1)


def _loads_and_keys(members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each node's replicas and the rows' tie keys of a zone of member rows."""
    load = np.bincount(members.ravel(), minlength=int(members.max()) + 1)
    return load, mix64(np.arange(members.shape[0], dtype=np.uint64), 5)


@settings(max_examples=400, deadline=None)
@given(zones())
def test_primaries_keep_the_most_current_primaries_the_bounds_allow(
    zone: tuple[np.ndarray, np.ndarray],
) -> None:
    members, current = zone
    width = members.shape[1]
    load, key = _loads_and_keys(members)
    n = len(load)
    lo, hi = load // width, -(-load // width)
    primary = choose_primaries(members, load, current, key)
    assert ((members == primary[:, None]).any(axis=1)).all()
    count = np.bincount(primary, minlength=n)
    assert ((count >= lo) & (count <= hi)).all()
    kept = int(np.count_nonzero(primary == current))
    assert kept == most_kept(members, current, lo, hi)


@settings(max_examples=100, deadline=None)
@given(zones())
def test_the_cycle_check_only_adds_kept_primaries(
    zone: tuple[np.ndarray, np.ndarray],
) -> None:
    """The check only ever adds kept primaries to the greedy's."""
    members, current = zone
    load, key = _loads_and_keys(members)
    with_check = np.count_nonzero(choose_primaries(members, load, current, key) == current)
    assert with_check >= _kept_without_search(members, load, current, key)


def _kept_without_search(
    members: np.ndarray, load: np.ndarray, current: np.ndarray, key: np.ndarray
) -> int:
    """The current primaries kept by the greedy alone (no search for negative cycles)."""
    work = preferred.CYCLE_WORK
    try:
        preferred.CYCLE_WORK = 0
        return int(np.count_nonzero(choose_primaries(members, load, current, key) == current))
    finally:
        preferred.CYCLE_WORK = work


def _most_kept_by_lp(
    members: np.ndarray, current: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> int:
    """:func:`most_kept` for zones too large for the Python min-cost flow: the same flow as a
    linear program, solved by HiGHS through SciPy (its matrix is totally unimodular, so the
    simplex optimum is integral)."""
    from scipy.optimize import linprog
    from scipy.sparse import csr_array, vstack

    rows, width = members.shape
    slots = rows * width
    row = np.repeat(np.arange(rows), width)
    node = members.ravel()
    by_row = csr_array((np.ones(slots), (row, np.arange(slots))), shape=(rows, slots))
    by_node = csr_array((np.ones(slots), (node, np.arange(slots))), shape=(len(lo), slots))
    result = linprog(
        -(node == current[row]).astype(float),
        A_ub=vstack([by_node, -by_node]),
        b_ub=np.concatenate([hi, -lo]).astype(float),
        A_eq=by_row,
        b_eq=np.ones(rows),
        bounds=(0, 1),
        method="highs-ds",
    )
    assert result.status == 0
    return round(-result.fun)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_zone_above_six_thousand_slots_keeps_the_most_current_primaries(seed: int) -> None:
    """Zones of any size are searched, within a work bound: 3,000 rows × 3 on 40 nodes (a
    join's new node, a departed one, a fifth of the rows' primaries elsewhere) keep as many
    current primaries as the linear program's optimum — the greedy alone keeps fewer."""
    rng = np.random.default_rng(seed)
    rows, width, n = 3000, 3, 40
    members = np.sort(np.stack([rng.choice(n, width, replace=False) for _ in range(rows)]), axis=1)
    current = members[np.arange(rows), rng.integers(0, width, rows)]
    moved = rng.random(rows) < 0.2
    current[moved] = rng.integers(-1, n + 1, int(moved.sum()))
    load, key = _loads_and_keys(members)
    lo, hi = load // width, -(-load // width)
    primary = choose_primaries(members, load, current, key)
    count = np.bincount(primary, minlength=n)
    assert ((count >= lo) & (count <= hi)).all()
    best = _most_kept_by_lp(members, current, lo, hi)
    assert int(np.count_nonzero(primary == current)) == best
    assert _kept_without_search(members, load, current, key) < best
