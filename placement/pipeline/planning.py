"""The fleet plan's pure core, shared by the local and the Spark engine.

Per zone, :func:`plan_zone_input` runs :func:`placement.pipeline.fleet.plan_zone` (hence
:func:`placement.algo.place.place`, the driver's function) and adds what the plan costs: bytes to
move and the load before. :func:`zone_fragment` renders one zone's JSON text, and
:meth:`FleetTotals.summary` the fleet totals from summed counters, so both engines write
byte-identical files however the work was split (design/formats.md, "Plan").
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from placement.core.model import Node, Peers, ZoneSpec
from placement.pipeline.fleet import ZonePlan, plan_zone, spread, zone_plan_json
from placement.pipeline.snapshot import ZoneSnapshot

#: Kinds of per-node / per-domain counters a zone contributes to the fleet summary.
LOAD, LOAD_BEFORE, DOMAIN, DOMAIN_BEFORE = "load", "load_before", "domain", "domain_before"
COUNTER_KINDS = (LOAD, LOAD_BEFORE, DOMAIN, DOMAIN_BEFORE)


@dataclass(frozen=True, slots=True)
class ZoneInput:
    """One zone as the planner needs it: its (what-if) spec, the current stable assignment and
    the partitions' sizes in bytes (absent = unknown = 0)."""

    spec: ZoneSpec
    stable: Mapping[int, Peers]
    sizes: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ZoneResult:
    """A zone's plan, what it costs, and the balance before it."""

    plan: ZonePlan
    bytes_to_move: int
    load_before: Mapping[str, int]
    domain_load_before: Mapping[str, int]
    failure_domain: str | None

    def counters(self) -> dict[str, dict[str, int]]:
        """This zone's contribution to the fleet counters; domain keys are ``attribute=value``."""
        prefix = f"{self.failure_domain}=" if self.failure_domain else ""
        return {
            LOAD: dict(self.plan.load),
            LOAD_BEFORE: dict(self.load_before),
            DOMAIN: {prefix + k: v for k, v in self.plan.domain_load.items()},
            DOMAIN_BEFORE: {prefix + k: v for k, v in self.domain_load_before.items()},
        }


def partition_size(replica_sizes: Iterable[int]) -> int:
    """A partition's size: the largest size any of its replicas reports (0 when none does)."""
    return max(replica_sizes, default=0)


def bytes_to_move(
    stable: Mapping[int, Peers], target: Sequence[Peers], sizes: Mapping[int, int]
) -> int:
    """Sum over new (partition, node) pairs of the partition's size."""
    total = 0
    for partition, peers in enumerate(target):
        before = set(stable.get(partition, ()))
        total += sizes.get(partition, 0) * sum(1 for n in set(peers) if n not in before)
    return total


def load_before(
    stable: Mapping[int, Peers], nodes: Sequence[Node], spec: ZoneSpec
) -> dict[str, int]:
    """Replicas per node in ``stable``: every node it names plus every eligible node (at 0)."""
    load: Counter[str] = Counter(
        dict.fromkeys((n.name for n in nodes if n.matches(spec.node_selector)), 0)
    )
    for peers in stable.values():
        load.update(peers)
    return dict(sorted(load.items()))


def domain_load(
    load: Mapping[str, int], nodes: Sequence[Node], attribute: str | None
) -> dict[str, int]:
    """Replicas per failure-domain value; a node lacking the attribute (or gone) is its own."""
    if not attribute:
        return {}
    by_name = {n.name: n for n in nodes}
    out: Counter[str] = Counter()
    for name, count in load.items():
        node = by_name.get(name)
        out[node.attributes.get(attribute, name) if node else name] += count
    return dict(sorted(out.items()))


def plan_zone_input(zone: ZoneInput, nodes: Sequence[Node]) -> ZoneResult:
    """Plans one zone with the driver's placement function and prices the plan."""
    plan = plan_zone(ZoneSnapshot(zone.spec, zone.stable), nodes)
    before = load_before(zone.stable, nodes, zone.spec)
    return ZoneResult(
        plan=plan,
        bytes_to_move=bytes_to_move(zone.stable, plan.assignments, zone.sizes),
        load_before=before,
        domain_load_before=domain_load(before, nodes, zone.spec.failure_domain),
        failure_domain=zone.spec.failure_domain,
    )


def zone_json(result: ZoneResult) -> dict[str, Any]:
    """``placement.pipeline.fleet.zone_plan_json`` plus the summary fields this pipeline adds."""
    out = zone_plan_json(result.plan)
    out["summary"].update(
        {
            "bytes_to_move": result.bytes_to_move,
            "load_before": dict(result.load_before),
            "spread_before": spread(result.load_before),
            "domain_load_before": dict(result.domain_load_before),
        }
    )
    return out


def _indent(text: str, by: str) -> str:
    return "\n".join(by + line for line in text.split("\n"))


def zone_fragment(result: ZoneResult) -> str:
    """The zone's text exactly as ``json.dump(plan, indent=1)`` prints it inside ``"zones"``."""
    return _indent(json.dumps(zone_json(result), indent=1), "  ")


@dataclass(slots=True)
class FleetTotals:
    """Running fleet totals; the local engine adds zones, the Spark engine sums in Spark."""

    zones: int = 0
    moves: int = 0
    bytes_to_move: int = 0
    counters: dict[str, Counter[str]] = field(
        default_factory=lambda: {kind: Counter() for kind in COUNTER_KINDS}
    )

    def add(self, result: ZoneResult) -> None:
        self.zones += 1
        self.moves += result.plan.moves
        self.bytes_to_move += result.bytes_to_move
        for kind, values in result.counters().items():
            self.counters[kind].update(values)

    def summary(self) -> dict[str, Any]:
        """The plan file's fleet ``summary``: totals, per-node and per-domain load before/after."""
        load = dict(sorted(self.counters[LOAD].items()))
        before = dict(sorted(self.counters[LOAD_BEFORE].items()))
        return {
            "zones": self.zones,
            "moves": self.moves,
            "load": load,
            "spread": spread(load),
            "bytes_to_move": self.bytes_to_move,
            "load_before": before,
            "spread_before": spread(before),
            "domain_load": dict(sorted(self.counters[DOMAIN].items())),
            "domain_load_before": dict(sorted(self.counters[DOMAIN_BEFORE].items())),
        }


def plan_text_parts(
    fragments: Iterable[str], summary: Callable[[], Mapping[str, Any]]
) -> Iterator[str]:
    """The plan file as text pieces: equal to ``json.dump({"zones": [...], "summary": ...},
    indent=1)`` plus a newline, without holding every zone at once; ``summary`` is called after
    the last fragment (the totals are complete only then)."""
    yield '{\n "zones": ['
    first = True
    for fragment in fragments:
        yield ("\n" if first else ",\n") + fragment
        first = False
    yield "]" if first else "\n ]"
    yield ',\n "summary": ' + _indent(json.dumps(dict(summary()), indent=1), " ").lstrip(" ")
    yield "\n}\n"
