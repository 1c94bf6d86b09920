"""Exact load targets: weighted water-filling with per-node bounds, then floor/ceil rounding.

The real-valued share of node ``i`` is ``t_i = clamp(λ·w_i, lo_i, hi_i)`` with the one ``λ`` that
makes ``Σ t_i == total``. Bounds come from the problem (a node holds at most one replica of a
partition, so ``hi_i = P``; a failure domain that every partition must span has ``lo = P``).
Arithmetic is done in :class:`~fractions.Fraction` so that no float rounding decides who gets
the extra replica.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True, slots=True)
class Targets:
    """Integer targets: node ``i`` ends with ``floor[i]``, or ``floor[i] + 1`` if ``eligible[i]``.

    Exactly ``extra`` nodes take the ``+ 1``, so the targets sum to the total. Every integer load
    vector within 1 of the real shares (and summing to the total) is of this form.
    """

    floor: NDArray[np.int64]
    eligible: NDArray[np.bool_]
    extra: int

    @staticmethod
    def exact(loads: Sequence[int]) -> Targets:
        """Targets that allow exactly ``loads`` and nothing else."""
        return Targets(
            np.asarray(loads, dtype=np.int64), np.zeros(len(loads), dtype=np.bool_), extra=0
        )


def water_fill(
    weights: Sequence[Fraction], lo: Sequence[int], hi: Sequence[int], total: int
) -> list[Fraction]:
    """Shares ``clamp(λ·w_i, lo_i, hi_i)`` summing to ``total`` (needs ``Σlo ≤ total ≤ Σhi``).

    A sweep over the breakpoints ``lo_i/w_i`` and ``hi_i/w_i``: O(n log n), exact.
    """
    n = len(weights)
    if not sum(lo) <= total <= sum(hi):
        raise ValueError("water_fill: total outside [Σlo, Σhi]")
    if len(set(weights)) <= 1 and len(set(lo)) <= 1 and len(set(hi)) <= 1:
        share = Fraction(total, n)
        return [min(max(share, Fraction(lo[0])), Fraction(hi[0]))] * n
    lam = _fill_level(weights, lo, hi, total)
    shares = [
        Fraction(hi[i])
        if lam is None
        else min(max(lam * weights[i], Fraction(lo[i])), Fraction(hi[i]))
        for i in range(n)
    ]
    if sum(shares) != total:
        raise AssertionError("water_fill: shares do not sum to the total")
    return shares


def _fill_level(
    weights: Sequence[Fraction], lo: Sequence[int], hi: Sequence[int], total: int
) -> Fraction | None:
    """The level λ of :func:`water_fill`; ``None`` when every node sits at its upper bound."""
    base = Fraction(sum(lo))
    if base == total:
        return Fraction(0)
    events: list[tuple[Fraction, int, int]] = []
    for i, w in enumerate(weights):
        events.append((lo[i] / w, 0, i))
        events.append((hi[i] / w, 1, i))
    events.sort()
    slope = Fraction(0)
    for level, kind, i in events:
        if base + slope * level >= total:
            return (total - base) / slope
        if kind == 0:
            base -= lo[i]
            slope += weights[i]
        else:
            base += hi[i]
            slope -= weights[i]
    return None


def round_shares(shares: Sequence[Fraction], total: int) -> Targets:
    """Floor/ceil targets of real shares summing to ``total``."""
    floor = [s.numerator // s.denominator for s in shares]
    eligible = [s.denominator != 1 for s in shares]
    return Targets(
        np.asarray(floor, dtype=np.int64),
        np.asarray(eligible, dtype=np.bool_),
        extra=total - sum(floor),
    )


def weighted_targets(
    weights: Sequence[float], total: int, hi: Sequence[int], lo: Sequence[int] | None = None
) -> tuple[list[Fraction], Targets]:
    """Water-filled shares of ``total`` by weight within ``[lo, hi]``, and their integer targets."""
    n = len(weights)
    lows = lo if lo is not None else [0] * n
    if n and weights.count(weights[0]) == n and lows.count(lows[0]) == n and hi.count(hi[0]) == n:
        # Equal weights and bounds (the usual zone): :func:`water_fill` gives everyone the same
        # share; computed once instead of per node.
        if not n * lows[0] <= total <= n * hi[0]:
            raise ValueError("water_fill: total outside [Σlo, Σhi]")
        share = min(max(Fraction(total, n), Fraction(lows[0])), Fraction(hi[0]))
        floor = share.numerator // share.denominator
        targets = Targets(
            np.full(n, floor, dtype=np.int64),
            np.full(n, share.denominator != 1, dtype=np.bool_),
            extra=total - n * floor,
        )
        return [share] * n, targets
    shares, floors, eligible, extra = _water_filled(tuple(weights), total, tuple(hi), tuple(lows))
    targets = Targets(
        np.asarray(floors, dtype=np.int64), np.asarray(eligible, dtype=np.bool_), extra=extra
    )
    return list(shares), targets


@functools.lru_cache(maxsize=256)
def _water_filled(
    weights: tuple[float, ...], total: int, hi: tuple[int, ...], lo: tuple[int, ...]
) -> tuple[tuple[Fraction, ...], tuple[int, ...], tuple[bool, ...], int]:
    """:func:`water_fill` and :func:`round_shares` of float weights, memoised (a pure
    function): the zones of a fleet share their nodes, hence these exact computations."""
    shares = water_fill([Fraction(w) for w in weights], lo, hi, total)
    floor = tuple(s.numerator // s.denominator for s in shares)
    eligible = tuple(s.denominator != 1 for s in shares)
    return tuple(shares), floor, eligible, total - sum(floor)


def demand_targets(weights: Sequence[float], demand: NDArray[np.int64]) -> Targets:
    """Targets of nodes sharing rows that need ``demand[p]`` distinct nodes each (a failure
    domain's share of its partitions, level 2 of design/placement.md).

    The shares are the weighted water-fill over the load vectors such rows can realise: by
    Gale–Ryser, ``x`` is realisable iff every ``k`` nodes hold at most
    ``g(k) = Σ_p min(demand[p], k)`` (a node at most one replica per row: ``g(1)`` = the rows)
    and all of them ``g(n)``. When the plain water-fill capped at the row count satisfies that —
    every row of demand ≤ 1, and nearly every other case — it is returned unchanged. Otherwise
    (a heavy node would need more rows than the demands allow it, e.g. demands of 1 and 3 with
    weights 10, 10, 1: the light node must be in every row of 3) the lexicographically optimal
    base of that polymatroid (Fujishige's decomposition) replaces it: the set ``K`` of heaviest
    nodes with the smallest ``g(|K|)/W(K)`` gets ``w_i·g(|K|)/W(K)``, the rest share what
    remains the same way. The box ``[⌊x⌋, ⌈x⌉]`` around a realisable ``x`` holds an integral
    realisable vector (an integral polymatroid), so the core's flow always fills these
    targets."""
    n = len(weights)
    total = int(demand.sum())
    rows = len(demand)
    shares, targets = weighted_targets(weights, total, hi=[rows] * n)
    if n == 0 or int(demand.max(initial=0)) <= 1:
        return targets
    at_least = np.bincount(demand, minlength=n + 1)[::-1].cumsum()[::-1]  # rows with demand >= j
    g = [0, *np.cumsum(at_least[1 : n + 1]).tolist()]
    order = sorted(range(n), key=lambda i: -weights[i])  # stable: ties in index order
    prefix = Fraction(0)
    for k, i in enumerate(order, start=1):
        prefix += shares[i]
        if prefix > g[k]:
            break
    else:
        return targets  # realisable as it is
    exact = [Fraction(w) for w in weights]
    out = [Fraction(0)] * n
    start = 0
    while start < n:
        best_k, best = 0, Fraction(0)
        heavy = Fraction(0)
        for k in range(1, n - start + 1):
            heavy += exact[order[start + k - 1]]
            ratio = (g[start + k] - g[start]) / heavy
            if best_k == 0 or ratio <= best:
                best_k, best = k, ratio
        for i in order[start : start + best_k]:
            out[i] = exact[i] * best
        start += best_k
    return round_shares(out, total)
