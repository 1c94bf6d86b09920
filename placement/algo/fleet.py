"""The fleet tie-breaker: the other zones' loads decide among equally good ±1 targets.

Zones are placed one at a time, each balanced ±1 on its own nodes. Which nodes of a zone take
the ``+1`` (and which lead one partition more) is free wherever the choice moves nothing: left
to a hash, those choices add up across a fleet (2,000 zones gave nodes 148 replicas apart).
:func:`~placement.algo.place.place` takes a :class:`FleetLoad` — each node's replicas and
preferred primaries in the *other* zones — and gives those free choices to the least loaded
nodes (replicas per unit of weight; a failure domain's nodes summed). It never changes a
zone's targets or its per-node bands, nor the number of moves without failure domains; with
them it never adds one (design/placement.md, "Fleet-wide balance").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, repeat

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
    if isinstance(counts, NodeCounts):
        loads = counts.gather(names).astype(np.float64)
    else:
        get = counts.get
        loads = np.fromiter((get(name, 0) for name in names), dtype=np.float64, count=len(names))
    return loads / np.asarray(weights, dtype=np.float64)


class NodeCounts(Mapping[str, int]):
    """Counts per node name as an array over a shared name index (:class:`FleetTally`'s):
    a zone's feed is one array copy, and :func:`per_weight` gathers it without a lookup loop
    in Python."""

    def __init__(self, index: Mapping[str, int], values: I64) -> None:
        self._index, self._values = index, values

    def gather(self, names: Sequence[str]) -> I64:
        """The counts of ``names`` (0 for a name not indexed)."""
        slots = np.fromiter(map(self._index.get, names, repeat(-1)), np.int64, len(names))
        inside = (slots >= 0) & (slots < len(self._values))
        out = np.zeros(len(names), dtype=np.int64)
        out[inside] = self._values[slots[inside]]
        return out

    def __getitem__(self, name: str) -> int:
        slot = self._index.get(name, -1)
        if not 0 <= slot < len(self._values):
            raise KeyError(name)
        return int(self._values[slot])

    def __iter__(self) -> Iterator[str]:
        return (name for name, slot in self._index.items() if slot < len(self._values))

    def __len__(self) -> int:
        return sum(1 for _ in self)


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
    "Fleet-wide balance"). Kept as arrays over a name index (a zone costs a few array
    operations, not a Python loop per node)."""

    def __init__(self) -> None:
        self._index: dict[str, int] = {}
        #: the names of the last mapping and their slots (zones over the same nodes repeat them)
        self._last: tuple[list[str], I64] = ([], np.zeros(0, dtype=np.int64))
        self._replicas = np.zeros(0, dtype=np.int64)
        self._primaries = np.zeros(0, dtype=np.int64)

    def _vector(self, counts: Mapping[str, int]) -> tuple[I64, I64]:
        """``counts`` as (slots, values), new names indexed (the arrays grown)."""
        if isinstance(counts, NodeCounts):
            counts = dict(counts.items())
        names = list(counts)
        if names == self._last[0]:
            return self._last[1], np.fromiter(counts.values(), np.int64, len(names))
        slots = np.fromiter(map(self._index.get, names, repeat(-1)), np.int64, len(names))
        if (slots < 0).any():
            for k in np.flatnonzero(slots < 0).tolist():
                slots[k] = self._index.setdefault(names[k], len(self._index))
            grow = len(self._index) - len(self._replicas)
            self._replicas = np.concatenate([self._replicas, np.zeros(grow, dtype=np.int64)])
            self._primaries = np.concatenate([self._primaries, np.zeros(grow, dtype=np.int64)])
        self._last = (names, slots)
        return slots, np.fromiter(counts.values(), np.int64, len(names))

    def add(self, replicas: Mapping[str, int], primaries: Mapping[str, int], sign: int = 1) -> None:
        for target, counts in ((0, replicas), (1, primaries)):
            slots, values = self._vector(counts)
            array = self._replicas if target == 0 else self._primaries
            np.add.at(array, slots, sign * values)

    def others(self, replicas: Mapping[str, int], primaries: Mapping[str, int]) -> FleetLoad:
        """The feed of a zone whose current loads are ``replicas`` and ``primaries``."""
        r_slots, r_values = self._vector(replicas)
        p_slots, p_values = self._vector(primaries)
        fleet_replicas, fleet_primaries = self._replicas.copy(), self._primaries.copy()
        np.subtract.at(fleet_replicas, r_slots, r_values)
        np.subtract.at(fleet_primaries, p_slots, p_values)
        return FleetLoad(
            NodeCounts(self._index, fleet_replicas), NodeCounts(self._index, fleet_primaries)
        )

    def placed(
        self,
        before: tuple[Mapping[str, int], Mapping[str, int]],
        after: tuple[Mapping[str, int], Mapping[str, int]],
    ) -> None:
        """A zone's loads went from ``before`` to ``after`` (replicas, primaries)."""
        self.add(*before, -1)
        self.add(*after)

    def copy(self) -> FleetTally:
        out = FleetTally()
        out._index = dict(self._index)
        out._replicas, out._primaries = self._replicas.copy(), self._primaries.copy()
        return out
