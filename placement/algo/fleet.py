"""The fleet tie-breaker: the other zones' loads decide among equally good ±1 targets.

Zones are placed one at a time, each balanced ±1 on its own nodes. Which nodes of a zone take
the ``+1`` (and which lead one partition more) is free wherever the choice moves nothing: left
to a hash, those choices add up across a fleet (2,000 zones gave nodes 148 replicas apart).
:func:`~placement.algo.place.place` takes a :class:`FleetLoad` — each node's replicas and
preferred primaries in the *other* zones — and gives those free choices to the least loaded
nodes (replicas per unit of weight; a failure domain's nodes summed). It never changes a
zone's targets, its kept pairs (the number of moves) or its per-node bands
(design/placement.md, "Fleet-wide balance").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
from numpy.typing import NDArray

I64 = NDArray[np.int64]
F64 = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class FleetLoad:
    """Replicas and preferred primaries per node name in the other zones (absent: 0)."""

    replicas: Mapping[str, int] = field(default_factory=dict)
    primaries: Mapping[str, int] = field(default_factory=dict)


def per_weight(counts: Mapping[str, int], names: Sequence[str], weights: Sequence[float]) -> F64:
    """``counts[name] / weight`` per node, in the order of ``names``."""
    get = counts.get
    loads = np.fromiter((get(name, 0) for name in names), dtype=np.float64, count=len(names))
    return loads / np.asarray(weights, dtype=np.float64)


def rank(load: F64, tie: NDArray[np.uint64], then: F64 | None = None) -> I64:
    """A distinct rank per element, lowest ``load`` first, then lowest ``then`` (if given),
    then ``tie``."""
    order = np.lexsort((tie, load) if then is None else (tie, then, load))
    out = np.empty(len(order), dtype=np.int64)
    out[order] = np.arange(len(order), dtype=np.int64)
    return out


def zone_loads(assignments: Iterable[Sequence[str]]) -> tuple[Counter[str], Counter[str]]:
    """Replicas and preferred primaries (the first member) per node of one zone's rows."""
    rows = [peers for peers in assignments if peers]
    return Counter(chain.from_iterable(rows)), Counter(peers[0] for peers in rows)


class FleetTally:
    """The fleet's loads while its zones are placed one after another, in name order: it
    starts as every zone's current loads; :meth:`others` is a zone's feed (the fleet without
    the zone), :meth:`placed` swaps a zone's current loads for its new ones. Zones placed
    earlier thus count with their new assignment, later ones with their current one — the
    same feed in the driver's pass and in both pipeline engines (design/placement.md,
    "Fleet-wide balance")."""

    def __init__(self) -> None:
        self.replicas: Counter[str] = Counter()
        self.primaries: Counter[str] = Counter()

    def add(self, replicas: Mapping[str, int], primaries: Mapping[str, int]) -> None:
        self.replicas.update(replicas)
        self.primaries.update(primaries)

    def others(self, replicas: Mapping[str, int], primaries: Mapping[str, int]) -> FleetLoad:
        """The feed of a zone whose current loads are ``replicas`` and ``primaries``."""
        fleet_replicas, fleet_primaries = self.replicas.copy(), self.primaries.copy()
        fleet_replicas.subtract(replicas)
        fleet_primaries.subtract(primaries)
        return FleetLoad(fleet_replicas, fleet_primaries)

    def placed(
        self,
        before: tuple[Mapping[str, int], Mapping[str, int]],
        after: tuple[Mapping[str, int], Mapping[str, int]],
    ) -> None:
        """A zone's loads went from ``before`` to ``after`` (replicas, primaries)."""
        self.replicas.subtract(before[0])
        self.primaries.subtract(before[1])
        self.add(*after)
