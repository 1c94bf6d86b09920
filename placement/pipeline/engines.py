"""The local engine, and what both engines share: one zone in, rows of results out (pure).

:func:`zone_rows` is the unit of work: the Spark engine runs it inside ``applyInArrow`` (one
call per zone, as :func:`zone_rows_and_counters`, which keeps the counters as one mapping per
kind), the local engine in a loop. Its rows carry the zone's JSON fragment and its
contribution to the fleet totals, or the error that stops the plan; :func:`totals_from_sums`
turns the rows summed per kind (and key) back into the fleet totals.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from placement.algo.fleet import FleetTally, zone_loads
from placement.core.model import Node
from placement.errors import InvalidInput
from placement.pipeline.inputs import PlanInput, PlannedZone, local_zone_inputs
from placement.pipeline.planning import (
    COUNTER_KINDS,
    FleetTotals,
    ZoneInput,
    ZoneResult,
    plan_zone_input,
    zone_fragment,
)

#: Row kinds besides the counter kinds: the zone itself (value = moves), its bytes, an error.
ZONE, BYTES, ERROR = "zone", "bytes", "error"
#: A re-sharded zone (value 1), one without sizes (value 1), its keys and bytes to move.
RESHARD, RESHARD_UNSIZED, RESHARD_KEYS, RESHARD_BYTES = (
    "reshard",
    "reshard_unsized",
    "reshard_keys",
    "reshard_bytes",
)
#: Kinds summed over the whole fleet (their key does not count); the counter kinds sum per key.
FLEET_KINDS = (ZONE, BYTES, RESHARD, RESHARD_UNSIZED, RESHARD_KEYS, RESHARD_BYTES)


@dataclass(frozen=True, slots=True)
class ResultRow:
    """One output row of a zone: ``kind`` is ZONE, BYTES, ERROR or a counter kind."""

    zone_index: int
    kind: str
    key: str
    value: int
    fragment: str | None = None


def zone_rows(
    zone: PlannedZone, make_input: Callable[[], ZoneInput], nodes: Sequence[Node]
) -> list[ResultRow]:
    """Plans one zone; bad input becomes one ERROR row (Spark cannot raise our errors across)."""
    rows, counters = zone_rows_and_counters(zone, make_input, nodes)
    counted = [
        ResultRow(zone.index, kind, key, value)
        for kind, values in counters.items()
        for key, value in values.items()
    ]
    return rows[:2] + counted + rows[2:]


def zone_rows_and_counters(
    zone: PlannedZone,
    make_input: Callable[[], ZoneInput],
    nodes: Sequence[Node],
    tally: FleetTally | None = None,
) -> tuple[list[ResultRow], dict[str, dict[str, int]]]:
    """:func:`zone_rows` with the counter rows left as the zone's counters (kind -> key ->
    value), which the Spark engine sends as one row of arrays per kind (thousands of nodes
    make thousands of counter rows per zone)."""
    try:
        result = plan_zone_input(make_input(), nodes, tally)
    except InvalidInput as e:
        return [ResultRow(zone.index, ERROR, zone.spec.name, 0, str(e))], {}
    i = zone.index
    rows = [
        ResultRow(i, ZONE, zone.spec.name, result.plan.moves, zone_fragment(result)),
        ResultRow(i, BYTES, zone.spec.name, result.bytes_to_move),
    ]
    r = result.reshard
    if r is not None:
        rows.append(ResultRow(i, RESHARD, zone.spec.name, 1))
        if r.keys is None or r.bytes is None:
            rows.append(ResultRow(i, RESHARD_UNSIZED, zone.spec.name, 1))
        else:
            rows.append(ResultRow(i, RESHARD_KEYS, zone.spec.name, r.keys))
            rows.append(ResultRow(i, RESHARD_BYTES, zone.spec.name, r.bytes))
    return rows, result.counters()


def totals_from_sums(sums: Iterable[tuple[str, str, int, int]]) -> FleetTotals:
    """The fleet totals from rows summed by ``(kind, key)`` — the key blank for
    :data:`FLEET_KINDS` —, given as ``(kind, key, sum of values, number of rows)``: what the
    Spark engine's group-by returns. Other kinds (errors) are ignored."""
    totals = FleetTotals()
    for kind, key, value, n in sums:
        if kind == ZONE:
            totals.zones, totals.moves = n, value
        elif kind == BYTES:
            totals.bytes_to_move = value
        elif kind == RESHARD:
            totals.reshard_zones = value
        elif kind == RESHARD_UNSIZED:
            totals.reshard_unsized = value
        elif kind == RESHARD_KEYS:
            totals.reshard_keys = value
        elif kind == RESHARD_BYTES:
            totals.reshard_bytes = value
        elif kind in COUNTER_KINDS:
            totals.counters[kind].update({key: value})
    return totals


def plan_local(plan_input: PlanInput, totals: FleetTotals) -> Iterator[str]:
    """The local engine: zone fragments in output order; ``totals`` is filled as they are
    consumed, and complete once the iterator is exhausted. Raises the first zone's error (in
    output order, as the Spark engine).

    Zones are placed in name order with the fleet's tally (:func:`fleet_order`), each fragment
    written as soon as every zone before it in output order is placed."""
    inputs: list[ZoneInput] = []
    try:
        inputs.extend(zone_in for _zone, zone_in in local_zone_inputs(plan_input))
    except InvalidInput:
        # a zone's rows are invalid: an earlier zone's error comes first (as on Spark)
        for zone_in in inputs:
            plan_zone_input(zone_in, plan_input.nodes)
        raise
    owns = [zone_loads(zone_in.stable.values()) for zone_in in inputs]
    tally = FleetTally()
    for own in owns:
        tally.add(*own)
    pending = dict(enumerate(inputs))
    del inputs
    done: dict[int, ZoneResult | InvalidInput] = {}
    written = 0
    for i in fleet_order([z.spec.name for z in plan_input.zones]):
        try:
            done[i] = plan_zone_input(pending.pop(i), plan_input.nodes, tally, owns[i])
        except InvalidInput as e:
            done[i] = e
        while written in done:
            result = done.pop(written)
            if isinstance(result, InvalidInput):
                # the first error in output order (a later one in name order was placed first)
                raise result
            totals.add(result)
            written += 1
            yield zone_fragment(result)


def fleet_order(names: Sequence[str]) -> list[int]:
    """The positions of ``names`` in the order zones are placed with the fleet's tally: by
    name (the driver's order too)."""
    return sorted(range(len(names)), key=names.__getitem__)
