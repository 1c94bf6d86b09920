"""Fleet-wide balance: zones placed one after another, with and without the fleet tie-breaker.

Issue 15, item 5; design/placement.md, "Fleet-wide balance". The fleet of the pipeline bench
(``bench/pipeline_bench.py``: 2,000 zones × 512 partitions × 3 replicas on 1,000 nodes in 10
racks, failure domain ``rack``) is built by placing its zones fresh one after another, then
``n0000`` leaves and every zone is placed again from its assignment. ``plain`` places each
zone alone (the hash breaks ties); ``fleet`` gives each zone the other zones' loads
(:class:`placement.algo.fleet.FleetLoad`: the zones placed so far, and for the leave the others'
current loads). Reports the fleet's replica and preferred-primary spread per node after each
step, the moves of the leave, and the time spent in ``place`` (the leave's check below not
counted). Each zone's moves are also checked against the
plain placement of the same current assignment (the tie-breaker must not add one).

    .venv/bin/python bench/fleet_balance_bench.py [--zones 2000] [--partitions 512]
        [--nodes 1000] [--racks 10] [--out bench/results/fleet_balance.md]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from run_info import run_section, uptime

from placement.algo.fleet import FleetLoad
from placement.algo.place import Placement, count_moves, place
from placement.algo.targets import weighted_targets
from placement.core.model import Node, ZoneSpec

ROOT = Path(__file__).resolve().parent.parent


def spread(counts: Counter[str], nodes: Sequence[Node]) -> int:
    values = [counts[n.name] for n in nodes]
    return max(values) - min(values)


def leave_bound(zones: list[ZoneSpec], placed: list[Placement], nodes: list[Node]) -> int:
    """The least replica spread any placement of the leave can reach while every zone keeps
    its targets and its fewest moves (the tie-breaker's own constraint).

    A zone's fewest moves keep every pair not on the departed node: its rack ``r`` keeps
    ``rem_r`` replicas, so its new total is at least ``max(⌊S'_r⌋, min(rem_r, ⌈S'_r⌉))`` of
    its water-filled share ``S'_r`` without the node. Summed over the zones, ``r``'s nodes
    hold at least that, the other racks' nodes at most the rest: the fleet's most loaded node
    holds at least ``⌈LB / |r|⌉`` and its least loaded at most ``⌊(total − LB) / rest⌋``.
    """
    gone = nodes[0]
    attribute = zones[0].failure_domain
    assert attribute is not None
    rack = gone.attributes[attribute]
    left = nodes[1:]
    in_rack = {n.name for n in left if n.attributes.get(attribute) == rack}
    racks = sorted({n.attributes[attribute] for n in left})
    weights = [sum(n.weight for n in left if n.attributes[attribute] == d) for d in racks]
    forced = total = 0
    for zone, before in zip(zones, placed, strict=True):
        width = min(zone.replicas, len(left))
        _, targets = weighted_targets(
            weights, zone.partitions * width, [zone.partitions] * len(racks)
        )
        at = racks.index(rack)
        floor = int(targets.floor[at])
        ceil = floor + int(targets.eligible[at])
        rem = sum(before.loads.get(n, 0) for n in in_rack)
        forced += max(floor, min(rem, ceil))
        total += zone.partitions * width
    rest = len(left) - len(in_rack)
    return -(-forced // len(in_rack)) - (total - forced) // rest


def run(mode: str, zones: list[ZoneSpec], nodes: list[Node]) -> dict[str, float]:
    fleet = mode == "fleet"
    replicas: Counter[str] = Counter()
    primaries: Counter[str] = Counter()
    placed: list[Placement] = []
    started = time.perf_counter()
    for zone in zones:
        result = place(zone, nodes, fleet=FleetLoad(replicas, primaries) if fleet else None)
        replicas.update(result.loads)
        primaries.update(result.primary_loads)
        placed.append(result)
    out = {
        "create_s": time.perf_counter() - started,
        "create_spread": spread(replicas, nodes),
        "create_primary_spread": spread(primaries, nodes),
    }
    bound = leave_bound(zones, placed, nodes)
    left = nodes[1:]
    moves = 0
    took = 0.0
    for zone, before in zip(zones, placed, strict=True):
        current = dict(enumerate(before.assignments))
        replicas.subtract(before.loads)
        primaries.subtract(before.primary_loads)
        started = time.perf_counter()
        result = place(zone, left, current, fleet=FleetLoad(replicas, primaries) if fleet else None)
        took += time.perf_counter() - started
        moved = count_moves(current, result.assignments)
        if fleet and moved > count_moves(current, place(zone, left, current).assignments):
            sys.exit(f"{zone.name}: the fleet tie-breaker added a move")
        moves += moved
        replicas.update(result.loads)
        primaries.update(result.primary_loads)
    del replicas[nodes[0].name], primaries[nodes[0].name]
    out |= {
        "leave_s": took,
        "leave_moves": moves,
        "leave_spread": spread(replicas, left),
        "leave_primary_spread": spread(primaries, left),
        "leave_bound": bound,
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zones", type=int, default=2000)
    parser.add_argument("--partitions", type=int, default=512)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--racks", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/fleet_balance.md")
    args = parser.parse_args()
    nodes = [Node(f"n{i:04d}", {"rack": f"r{i % args.racks}"}) for i in range(args.nodes)]
    zones = [
        ZoneSpec(f"zone{z:04d}", args.partitions, args.replicas, failure_domain="rack")
        for z in range(args.zones)
    ]
    started, load = time.time(), [uptime()]
    results = {mode: run(mode, zones, nodes) for mode in ("plain", "fleet")}
    load.append(uptime())
    lines = [
        "# Fleet-wide balance: zones placed with and without the fleet tie-breaker",
        "",
        f"`{' '.join(['python', *sys.argv])}`: {args.zones} zones × {args.partitions} × "
        f"{args.replicas} on {args.nodes} nodes in {args.racks} racks (failure domain `rack`), "
        "created one after another, then `n0000` leaves and every zone is placed again. Spread ="
        " most minus least per node over the whole fleet.",
        "",
        "| | create: replicas spread | primaries spread | time | leave: moves |"
        " replicas spread | least possible | primaries spread | time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, r in results.items():
        lines.append(
            f"| {mode} | {r['create_spread']:.0f} | {r['create_primary_spread']:.0f} |"
            f" {r['create_s']:.1f} s | {r['leave_moves']:.0f} | {r['leave_spread']:.0f} |"
            f" {r['leave_bound']:.0f} | {r['leave_primary_spread']:.0f} | {r['leave_s']:.1f} s |"
        )
    lines += [
        "",
        "'least possible' (`leave_bound`): the smallest replica spread any placement of the"
        " leave can have while every zone keeps its targets and its fewest moves — the"
        " departed node's rack keeps every replica its other nodes hold, so it ends at least"
        " `max(⌊S'⌋, min(kept, ⌈S'⌉))` per zone of its new share `S'`; summed, its nodes' mean"
        " exceeds the other racks'.",
        "",
        *run_section(started, load, "start / end"),
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
