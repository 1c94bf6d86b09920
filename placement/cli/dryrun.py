"""A Plan RPC's answer (a dry run of ``zone alter`` or ``node drain``) as JSON and as text:
per zone the partitions that move, before and after, each node's replicas before and after and
the bytes to copy (design/control-plane.md, "Dry run")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from placement.cli.common import Output, api_call

if TYPE_CHECKING:
    import click
    from rich.console import Group

    from placement.v1 import driver_pb2


def plan_json(reply: driver_pb2.PlanReply) -> dict[str, Any]:
    return {
        "revision": reply.revision,
        "zones": [
            {
                "zone": z.zone,
                "replicas": z.config.replicas,
                "partitions": z.config.partitions,
                "moves": [
                    {
                        "partition": m.partition,
                        "before": list(m.before.names),
                        "after": list(m.after.names),
                        "bytes": m.bytes,
                    }
                    for m in z.moves
                ],
                "loads": [
                    {
                        "node": n.node,
                        "replicas_before": n.replicas_before,
                        "replicas_after": n.replicas_after,
                        "leases_handed_over": n.leases_handed_over,
                    }
                    for n in z.loads
                ],
                "replicas_added": z.replicas_added,
                "replicas_removed": z.replicas_removed,
                "bytes_to_move": z.bytes_to_move,
                "reshard": (
                    {
                        "source": z.reshard_source,
                        "target": z.reshard_target,
                        "bytes": z.reshard_bytes,
                    }
                    if z.reshard_target
                    else None
                ),
                "unplaceable": z.unplaceable or None,
                "notes": list(z.notes),
            }
            for z in reply.zones
        ],
    }


def _size(n: int) -> str:
    """``n`` bytes as ``zone status`` writes them (MB, 10^6)."""
    return f"{n / 1e6:.1f} MB"


def plan_view(plan: dict[str, Any], what: str, wide: bool = False) -> Group:
    """``plan`` (:func:`plan_json`) for people: a summary line per zone, its nodes' loads and
    the moves (every one with ``wide``, else the first 20)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    if not plan["zones"]:
        parts.append(Text(f"dry run: {what} moves nothing (revision {plan['revision']})"))
        return Group(*parts)
    parts.append(Text(f"dry run: {what} (as of revision {plan['revision']}; nothing was written)"))
    for z in plan["zones"]:
        if z["unplaceable"]:
            parts.append(Text(f"zone {z['zone']}: cannot be placed: {z['unplaceable']}"))
            continue
        parts.append(
            Text(
                f"zone {z['zone']}: {len(z['moves'])} partition(s) change, +{z['replicas_added']}"
                f" / -{z['replicas_removed']} replica(s), {_size(z['bytes_to_move'])} to copy"
            )
        )
        parts.extend(Text(f"  note: {note}") for note in z["notes"])
        loads = Table("node", "replicas before", "after", "leases handed over", box=None)
        for n in z["loads"]:
            if n["replicas_before"] or n["replicas_after"]:
                loads.add_row(
                    n["node"],
                    str(n["replicas_before"]),
                    str(n["replicas_after"]),
                    str(n["leases_handed_over"] or ""),
                )
        parts.append(loads)
        moves = z["moves"] if wide else z["moves"][:20]
        if moves:
            table = Table("partition", "before", "after", "bytes", box=None)
            for m in moves:
                table.add_row(
                    str(m["partition"]),
                    ",".join(m["before"]) or "(new)",
                    ",".join(m["after"]) or "(removed)",
                    _size(m["bytes"]),
                )
            parts.append(table)
        if len(z["moves"]) > len(moves):
            parts.append(Text(f"  … {len(z['moves']) - len(moves)} more (-o wide shows all)"))
    return Group(*parts)


def show_dry_run(
    ctx: click.Context, request: driver_pb2.PlanRequest, what: str, output: Output
) -> None:
    """Ask the driver for ``request``'s plan and print it in ``output``'s format."""
    plan = plan_json(api_call(ctx, "Plan", request))
    output.emit(plan, lambda wide: plan_view(plan, what, wide))
