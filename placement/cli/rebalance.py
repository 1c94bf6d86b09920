"""``placectl rebalance``: cancel one partition's rebalance or a zone's re-sharding, pause and
resume all driving. Each takes ``-o json|yaml|table|wide`` (``--json``): what the leader answered.
"""

from __future__ import annotations

import sys

import click

from placement.cli.common import Output, api_call, output_option


@click.group()
def rebalance() -> None:
    """Cancel, pause and resume rebalancing."""


@rebalance.command("cancel")
@click.argument("zone_name", metavar="ZONE")
@click.argument("partition", type=click.IntRange(min=0), required=False)
@output_option
@click.pass_context
def rebalance_cancel(
    ctx: click.Context, zone_name: str, partition: int | None, output: Output
) -> None:
    """Cancel the rebalance in progress of PARTITION of ZONE (its replicas return to stable);
    without PARTITION, abort ZONE's re-sharding (it keeps its old partition count)."""
    from placement.v1 import common_pb2, driver_pb2

    if partition is None:
        reply = api_call(ctx, "CancelReshard", driver_pb2.CancelReshardRequest(zone=zone_name))
    else:
        request = common_pb2.PartitionRef(zone=zone_name, partition=partition)
        reply = api_call(ctx, "CancelRebalance", request)
    output.emit(
        {
            "zone": zone_name,
            "partition": partition,
            "accepted": reply.accepted,
            "detail": reply.detail,
        },
        lambda wide: f"{'cancelled' if reply.accepted else 'not cancelled'}: {reply.detail}",
    )
    if not reply.accepted:
        sys.exit(1)


@rebalance.command("pause")
@output_option
@click.pass_context
def rebalance_pause(ctx: click.Context, output: Output) -> None:
    """Pause all driving (no new moves start; in-flight ones finish)."""
    from placement.v1 import driver_pb2

    reply = api_call(ctx, "PauseRebalancing", driver_pb2.PauseRequest())
    output.emit({"paused": reply.paused}, lambda wide: "rebalancing paused")


@rebalance.command("resume")
@output_option
@click.pass_context
def rebalance_resume(ctx: click.Context, output: Output) -> None:
    """Resume driving after a pause."""
    from placement.v1 import driver_pb2

    reply = api_call(ctx, "ResumeRebalancing", driver_pb2.PauseRequest())
    output.emit({"paused": reply.paused}, lambda wide: "rebalancing resumed")
