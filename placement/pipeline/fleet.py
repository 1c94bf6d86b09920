"""Fleet planning: the placement function applied to every zone of a snapshot (pure).

The same function serves the CLI's local engine and, later, the Spark engine, so both give
identical plans. The JSON shape is documented in design/formats.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from placement.algo.fleet import FleetLoad
from placement.algo.place import count_moves, place
from placement.core.model import Node, Peers
from placement.pipeline.snapshot import ZoneSnapshot


@dataclass(frozen=True, slots=True)
class ZonePlan:
    """The target of one zone and what reaching it costs."""

    name: str
    assignments: tuple[Peers, ...]
    moves: int
    load: Mapping[str, int]
    primaries: Mapping[str, int]
    domain_load: Mapping[str, int]


def plan_zone(
    zone: ZoneSnapshot, nodes: Sequence[Node], fleet: FleetLoad | None = None
) -> ZonePlan:
    """Places one zone starting from its stable assignment (``fleet``: the other zones' loads,
    the tie-breaker of :mod:`placement.algo.fleet`)."""
    result = place(zone.spec, nodes, zone.stable, fleet=fleet)
    # replicas and preferred primaries per eligible node, zeros included, in name order
    load, primaries = dict(result.loads), dict(result.primary_loads)
    domain_load: Counter[str] = Counter()
    attribute = zone.spec.failure_domain
    if attribute:
        by_name = {n.name: n for n in nodes}
        for name, count in load.items():
            domain_load[by_name[name].attributes.get(attribute, name)] += count
    return ZonePlan(
        name=zone.spec.name,
        assignments=result.assignments,
        moves=count_moves(zone.stable, result.assignments),
        load=load,
        primaries=primaries,
        domain_load=dict(sorted(domain_load.items())),
    )


def spread(load: Mapping[str, int]) -> int:
    """Most loaded minus least loaded (0 for no nodes)."""
    return max(load.values()) - min(load.values()) if load else 0


def zone_plan_json(plan: ZonePlan, assignments: Any = None) -> dict[str, Any]:
    """The zone's plan as JSON data; ``assignments`` stands in for the assignments' dict (the
    plan file's writer renders them itself: ``placement.pipeline.planning.zone_fragment``)."""
    return {
        "name": plan.name,
        "assignments": (
            {str(p): list(peers) for p, peers in enumerate(plan.assignments)}
            if assignments is None
            else assignments
        ),
        "summary": {
            "moves": plan.moves,
            "load": dict(plan.load),
            "primaries": dict(plan.primaries),
            "spread": spread(plan.load),
            "primary_spread": spread(plan.primaries),
            "domain_load": dict(plan.domain_load),
        },
    }
