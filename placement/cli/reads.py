"""``placectl assignments`` and ``placectl nodes``: what the drivers hold, as tables or
``--json``."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from placement.cli.common import (
    api_call,
    api_client,
    console,
    echo_json,
    json_option,
    pairs_text,
    run,
)
from placement.errors import InvalidInput

if TYPE_CHECKING:
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
@json_option
@click.pass_context
def assignments(
    ctx: click.Context,
    zone_name: str,
    partition: int | None,
    watch: bool,
    from_revision: int | None,
    as_json: bool,
) -> None:
    """Stable, pending, planned and primary of every partition of ZONE (--watch: and then every
    change; with --json one JSON line per change)."""

    if from_revision is not None and not watch:
        raise InvalidInput("--from-revision", "needs --watch", "add --watch")
    if watch:
        try:
            run(_watch(ctx, zone_name, partition, from_revision, as_json))
        except KeyboardInterrupt:
            sys.exit(130)
        return

    async def fetch() -> tuple[int, list[driver_pb2.PartitionAssignment]]:
        async with api_client(ctx) as client:
            return await _all(client, zone_name, partition)

    revision, found = run(fetch())
    if as_json:
        echo_json(
            {
                "zone": zone_name,
                "revision": revision,
                "partitions": [assignment_json(a) for a in found],
            }
        )
        return
    from rich.table import Table

    table = Table("partition", "stable", "pending", "planned", "primary")
    for a in found:
        table.add_row(
            str(a.partition),
            _peers(a.stable.names),
            _peers(a.pending.names) if a.has_pending else "-",
            _peers(a.planned.names) if a.has_planned else "-",
            a.primary or "-",
        )
    console().print(table)


@click.command("nodes")
@json_option
@click.pass_context
def nodes(ctx: click.Context, as_json: bool) -> None:
    """Registered nodes (agents), their addresses and attributes."""
    from placement.v1 import driver_pb2

    request = driver_pb2.ListNodesRequest()
    found = api_call(ctx, "ListNodes", request)
    if as_json:
        echo_json({"nodes": [node_json(n) for n in found.nodes]})
        return
    from rich.table import Table

    table = Table("node", "address", "attributes", "weight")
    for n in found.nodes:
        table.add_row(n.name, n.address, pairs_text(n.attributes), f"{n.weight:g}")
    console().print(table)


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
        page = await client.call(
            lambda s, t, r=request: s.GetAssignments(r, timeout=t)  # type: ignore[misc]
        )
        found.extend(page.assignments)
        revision = revision or page.revision
        token = page.next_page_token
        if not token:
            return revision, found


def _change_line(revision: int, a: driver_pb2.PartitionAssignment) -> str:
    line = f"revision {revision} partition {a.partition}: stable {_peers(a.stable.names)}"
    if a.has_pending:
        line += f" pending {_peers(a.pending.names)}"
    if a.has_planned:
        line += f" planned {_peers(a.planned.names)}"
    return line + f" primary {a.primary or '-'}"


async def _watch(
    ctx: click.Context, zone: str, partition: int | None, from_revision: int | None, as_json: bool
) -> None:
    """The current assignments (unless resuming), then every change after them, a line each."""
    async with api_client(ctx) as client:
        revision = from_revision or 0
        if from_revision is None:
            revision, found = await _all(client, zone, partition)
            for a in found:
                if as_json:
                    echo_json({"revision": revision, **assignment_json(a)})
                else:
                    click.echo(_change_line(revision, a))
        async for event in client.watch_assignments(zone, revision):
            a = event.assignment
            if partition is not None and a.partition != partition:
                continue
            if as_json:
                echo_json({"revision": event.revision, **assignment_json(a)})
            else:
                click.echo(_change_line(event.revision, a))
