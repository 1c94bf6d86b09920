"""``placectl node``: drain, undrain, cordon, uncordon and status of one node
(design/control-plane.md, "Drain" and "Cordon").

``drain NODE`` asks the leader to drain it — its primary leases are handed over at once, then
its replicas move away, make-before-break — and follows it until the node holds nothing (a
progress line per change), then says it may be stopped; ``--no-wait`` returns at once.
``undrain NODE`` takes the mark away. ``cordon NODE`` marks it to take no new replicas (it keeps
what it holds); ``uncordon NODE`` takes that mark away. ``status NODE`` shows what it still
holds. Each takes
``-o json|yaml|table|wide`` (``--json``): what the driver answered (``drain``: one per change);
``wide`` adds the revision.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

from placement.cli.common import Output, api_call, api_client, output_option, run
from placement.cli.dryrun import show_dry_run
from placement.errors import InvalidInput, StoreUnavailable

if TYPE_CHECKING:
    from placement.v1 import driver_pb2


def node_status_json(s: driver_pb2.NodeStatus) -> dict[str, Any]:
    return {
        "node": s.node,
        "registered": s.registered,
        "draining": s.draining,
        "stopping": s.stopping,
        "replicas": s.replicas,
        "primaries": s.primaries,
        "safe_to_stop": s.safe_to_stop,
        "cordoned": s.cordoned,
        "revision": s.revision,
    }


def node_text(s: dict[str, Any], wide: bool = False) -> str:
    """The node's state in a line; ``wide`` adds the revision it was read at."""
    return _line(s) + (f" (revision {s['revision']})" if wide else "")


def node_state(s: Mapping[str, Any]) -> str:
    """draining, stopping or active; ``, cordoned`` when it takes no new replicas."""
    state = "draining" if s["draining"] else "stopping" if s["stopping"] else "active"
    return state + (", cordoned" if s["cordoned"] else "")


def _line(s: dict[str, Any]) -> str:
    state = node_state(s)
    if s["cordoned"]:
        state += " (takes no new replicas)"
    if not s["registered"]:
        state += ", not registered"
    line = (
        f"node {s['node']}: {state}; {s['replicas']} replica(s), {s['primaries']} primary lease(s)"
    )
    if s["safe_to_stop"]:
        line += "; it holds nothing: its agent may be stopped"
    return line


@click.group()
def node() -> None:
    """Drain, undrain, cordon, uncordon and inspect a node."""


@node.command("drain")
@click.argument("name")
@click.option("--no-wait", is_flag=True, help="Return once the drain is recorded.")
@click.option(
    "--timeout", type=float, default=600.0, show_default=True, help="Seconds to wait for it."
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Show what the drain would move (the leader's own plan); change nothing.",
)
@output_option
@click.pass_context
def drain(
    ctx: click.Context, name: str, no_wait: bool, timeout: float, dry_run: bool, output: Output
) -> None:
    """Drain node NAME: leases first, then replicas move away; waits until it holds nothing
    (a line per change; -o json: one JSON object per line)."""
    from placement.v1 import driver_pb2

    if timeout <= 0:
        raise InvalidInput("--timeout", f"{timeout} is not positive", "e.g. 600")
    if dry_run:
        show_dry_run(ctx, driver_pb2.PlanRequest(drain_node=name), f"node drain {name}", output)
        return
    status = api_call(ctx, "DrainNode", driver_pb2.DrainNodeRequest(node=name, drain=True))
    if no_wait or status.safe_to_stop:
        _show(node_status_json(status), output)
        return
    run(_follow(ctx, name, timeout, output))


async def _follow(ctx: click.Context, name: str, within: float, output: Output) -> None:
    import asyncio

    from placement.v1 import driver_pb2

    request = driver_pb2.GetNodeStatusRequest(node=name)
    deadline = time.monotonic() + within
    last: dict[str, Any] | None = None
    async with api_client(ctx) as client:
        while True:
            found = await client.read(lambda s, t: s.GetNodeStatus(request, timeout=t))
            status = node_status_json(found)
            shown = {k: v for k, v in status.items() if k != "revision"}
            if last != shown:
                _show(status, output, stream=True)
                last = shown
            if status["safe_to_stop"]:
                return
            if time.monotonic() > deadline:
                raise StoreUnavailable(
                    f"node {name} still holds {status['replicas']} replica(s) and"
                    f" {status['primaries']} lease(s) after {within:g}s; see placectl zone"
                    " status for what blocks the moves"
                )
            await asyncio.sleep(0.5)


@node.command("undrain")
@click.argument("name")
@output_option
@click.pass_context
def undrain(ctx: click.Context, name: str, output: Output) -> None:
    """Take node NAME's drain mark away: it takes replicas and leases again."""
    from placement.v1 import driver_pb2

    status = api_call(ctx, "DrainNode", driver_pb2.DrainNodeRequest(node=name, drain=False))
    _show(node_status_json(status), output)


@node.command("cordon")
@click.argument("name")
@output_option
@click.pass_context
def cordon(ctx: click.Context, name: str, output: Output) -> None:
    """Cordon node NAME: it keeps the replicas it holds and takes no new ones."""
    _set_cordon(ctx, name, True, output)


@node.command("uncordon")
@click.argument("name")
@output_option
@click.pass_context
def uncordon(ctx: click.Context, name: str, output: Output) -> None:
    """Take node NAME's cordon mark away: it takes new replicas again (the zones rebalance onto
    it)."""
    _set_cordon(ctx, name, False, output)


def _set_cordon(ctx: click.Context, name: str, on: bool, output: Output) -> None:
    from placement.v1 import driver_pb2

    request = driver_pb2.CordonNodeRequest(node=name, cordon=on)
    _show(node_status_json(api_call(ctx, "CordonNode", request)), output)


@node.command("status")
@click.argument("name")
@output_option
@click.pass_context
def status(ctx: click.Context, name: str, output: Output) -> None:
    """What node NAME holds, and whether it may be stopped."""
    from placement.v1 import driver_pb2

    found = api_call(ctx, "GetNodeStatus", driver_pb2.GetNodeStatusRequest(node=name))
    _show(node_status_json(found), output)


def _show(status: dict[str, Any], output: Output, *, stream: bool = False) -> None:
    output.emit(status, functools.partial(node_text, status), stream=stream)
