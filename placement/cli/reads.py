"""``placectl assignments`` and ``placectl nodes``: what the drivers hold, as tables or
``-o json|yaml`` (``--json``). ``-o wide`` adds the primary lease's expiry to the assignments, and
each node's drain state and what it holds to the nodes."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from placement.cli.common import (
    Output,
    api_call,
    api_client,
    output_option,
    pairs_text,
    run,
)
from placement.errors import InvalidInput

if TYPE_CHECKING:
    from rich.table import Table

    from placement.api.client import PlacementClient
    from placement.v1 import driver_pb2


def assignment_json(a: driver_pb2.PartitionAssignment) -> dict[str, Any]:
    return {
        "partition": a.partition,
        "stable": list(a.stable.names),
        "pending": list(a.pending.names) if a.has_pending else None,
        "planned": list(a.planned.names) if a.has_planned else None,
        "primary": a.primary or None,
        "primary_lease_expiry_unix_ms": a.primary_lease_expiry_unix_ms or None,
    }


def node_json(n: driver_pb2.Node) -> dict[str, Any]:
    return {
        "name": n.name,
        "address": n.address,
        "attributes": dict(sorted(n.attributes.items())),
        "weight": n.weight,
    }


def _peers(names: Sequence[str] | None) -> str:
    return ",".join(names) if names else "-"


def lease_text(expiry_unix_ms: int | None, now: float | None = None) -> str:
    """A primary lease's expiry as ``in 4.2s`` / ``expired 1.0s ago``, or ``-`` without one."""
    if not expiry_unix_ms:
        return "-"
    left = expiry_unix_ms / 1000 - (time.time() if now is None else now)
    return f"in {left:.1f}s" if left >= 0 else f"expired {-left:.1f}s ago"


def assignments_table(found: Sequence[Mapping[str, Any]], wide: bool = False) -> Table:
    """``assignment_json`` rows as a table; ``wide`` adds when the primary's lease expires."""
    from rich.table import Table

    table = Table("partition", "stable", "pending", "planned", "primary")
    if wide:
        table.add_column("lease expires")
    for a in found:
        row = [
            str(a["partition"]),
            _peers(a["stable"]),
            _peers(a["pending"]),
            _peers(a["planned"]),
            a["primary"] or "-",
        ]
        table.add_row(*row, *([lease_text(a["primary_lease_expiry_unix_ms"])] if wide else []))
    return table


def nodes_table(
    found: Sequence[Mapping[str, Any]],
    statuses: Mapping[str, Mapping[str, Any]] | None = None,
) -> Table:
    """``node_json`` rows as a table; with ``statuses`` (``-o wide``: ``node_status_json`` by
    node) also each node's drain state, replicas and primary leases."""
    from rich.table import Table

    from placement.cli.node import node_state

    table = Table("node", "address", "attributes", "weight")
    if statuses is not None:
        for column in ("state", "replicas", "primaries"):
            table.add_column(column)
    for n in found:
        row = [n["name"], n["address"], pairs_text(n["attributes"]), f"{n['weight']:g}"]
        if statuses is not None:
            s = statuses.get(n["name"])
            if s is None:
                row += ["-", "-", "-"]
            else:
                row += [node_state(s), str(s["replicas"]), str(s["primaries"])]
        table.add_row(*row)
    return table


@click.command("assignments")
@click.argument("zone_name", metavar="ZONE")
@click.option("--partition", type=click.IntRange(min=0), help="Only this partition.")
@click.option(
    "--watch",
    is_flag=True,
    help="After the table, print every change (assignment or primary) as it happens; Ctrl-C stops.",
)
@click.option(
    "--from-revision",
    type=click.IntRange(min=1),
    default=None,
    help="With --watch: no table; every change after this etcd revision (resume a watch).",
)
@output_option
@click.pass_context
def assignments(
    ctx: click.Context,
    zone_name: str,
    partition: int | None,
    watch: bool,
    from_revision: int | None,
    output: Output,
) -> None:
    """Stable, pending, planned and primary of every partition of ZONE (--watch: and then every
    change, a line each; -o json: one JSON object per line)."""

    if from_revision is not None and not watch:
        raise InvalidInput("--from-revision", "needs --watch", "add --watch")
    if watch:
        try:
            run(_watch(ctx, zone_name, partition, from_revision, output))
        except KeyboardInterrupt:
            sys.exit(130)
        return

    async def fetch() -> tuple[int, list[driver_pb2.PartitionAssignment]]:
        async with api_client(ctx) as client:
            return await _all(client, zone_name, partition)

    revision, found = run(fetch())
    rows = [assignment_json(a) for a in found]
    output.emit(
        {"zone": zone_name, "revision": revision, "partitions": rows},
        lambda wide: assignments_table(rows, wide),
    )


@click.command("nodes")
@output_option
@click.pass_context
def nodes(ctx: click.Context, output: Output) -> None:
    """Registered nodes (agents), their addresses and attributes (-o wide: and each one's drain
    state, replicas and primary leases)."""
    from placement.v1 import driver_pb2

    request = driver_pb2.ListNodesRequest()
    found = [node_json(n) for n in api_call(ctx, "ListNodes", request).nodes]
    statuses = run(_node_statuses(ctx, [n["name"] for n in found])) if output.wide else None
    output.emit({"nodes": found}, lambda wide: nodes_table(found, statuses))


async def _node_statuses(ctx: click.Context, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``node_status_json`` of every node in ``names``, asked at once."""
    import asyncio

    from placement.cli.node import node_status_json
    from placement.v1 import driver_pb2

    async with api_client(ctx) as client:

        async def one(name: str) -> dict[str, Any]:
            request = driver_pb2.GetNodeStatusRequest(node=name)
            return node_status_json(
                await client.read(lambda s, t: s.GetNodeStatus(request, timeout=t))
            )

        found = await asyncio.gather(*(one(name) for name in names))
    return {s["node"]: s for s in found}


async def _all(
    client: PlacementClient, zone: str, partition: int | None
) -> tuple[int, list[driver_pb2.PartitionAssignment]]:
    """Every page of the zone's assignments: ``(revision of the first page, assignments)``."""
    from placement.v1 import driver_pb2

    found: list[driver_pb2.PartitionAssignment] = []
    token = ""
    revision = 0
    while True:
        request = driver_pb2.GetAssignmentsRequest(zone=zone, page_token=token)
        if partition is not None:
            request.partition = partition
        page = await client.read(
            lambda s, t, r=request: s.GetAssignments(r, timeout=t)  # type: ignore[misc]
        )
        found.extend(page.assignments)
        revision = revision or page.revision
        token = page.next_page_token
        if not token:
            return revision, found


def change_line(change: Mapping[str, Any], wide: bool = False) -> str:
    """One change of a watch (``revision`` + ``assignment_json``) as a line; ``wide`` adds the
    primary lease's expiry."""
    line = f"revision {change['revision']} partition {change['partition']}: stable "
    line += _peers(change["stable"])
    if change["pending"] is not None:
        line += f" pending {_peers(change['pending'])}"
    if change["planned"] is not None:
        line += f" planned {_peers(change['planned'])}"
    line += f" primary {change['primary'] or '-'}"
    if wide:
        line += f" lease {lease_text(change['primary_lease_expiry_unix_ms'])}"
    return line


async def _watch(
    ctx: click.Context, zone: str, partition: int | None, from_revision: int | None, output: Output
) -> None:
    """The current assignments (unless resuming), then every change after them, a line each."""

    def emit(revision: int, a: driver_pb2.PartitionAssignment) -> None:
        change = {"revision": revision, **assignment_json(a)}
        output.emit(change, functools.partial(change_line, change), stream=True)

    async with api_client(ctx) as client:
        revision = from_revision or 0
        if from_revision is None:
            revision, found = await _all(client, zone, partition)
            for a in found:
                emit(revision, a)
        async for event in client.watch_assignments(zone, revision):
            a = event.assignment
            if partition is not None and a.partition != partition:
                continue
            emit(event.revision, a)
