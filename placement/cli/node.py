"""``placectl node``: drain, undrain and status of one node (design/control-plane.md, "Drain").

``drain NODE`` asks the leader to drain it — its primary leases are handed over at once, then
its replicas move away, make-before-break — and follows it until the node holds nothing (a
progress line per change), then says it may be stopped; ``--no-wait`` returns at once.
``undrain NODE`` takes the mark away. ``status NODE`` shows what it still holds. Each takes
``--json``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import click

from placement.cli.common import api_call, api_client, echo_json, json_option, run
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
        "revision": s.revision,
    }


def _line(s: dict[str, Any]) -> str:
    state = "draining" if s["draining"] else "stopping" if s["stopping"] else "active"
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
    """Drain, undrain and inspect a node."""


@node.command("drain")
@click.argument("name")
@click.option("--no-wait", is_flag=True, help="Return once the drain is recorded.")
@click.option(
    "--timeout", type=float, default=600.0, show_default=True, help="Seconds to wait for it."
)
@json_option
@click.pass_context
def drain(ctx: click.Context, name: str, no_wait: bool, timeout: float, as_json: bool) -> None:
    """Drain node NAME: leases first, then replicas move away; waits until it holds nothing."""
    from placement.v1 import driver_pb2

    if timeout <= 0:
        raise InvalidInput("--timeout", f"{timeout} is not positive", "e.g. 600")
    status = api_call(ctx, "DrainNode", driver_pb2.DrainNodeRequest(node=name, drain=True))
    if no_wait or status.safe_to_stop:
        _show(node_status_json(status), as_json)
        return
    run(_follow(ctx, name, timeout, as_json))


async def _follow(ctx: click.Context, name: str, within: float, as_json: bool) -> None:
    import asyncio

    from placement.v1 import driver_pb2

    request = driver_pb2.GetNodeStatusRequest(node=name)
    deadline = time.monotonic() + within
    last: dict[str, Any] | None = None
    async with api_client(ctx) as client:
        while True:
            found = await client.call(lambda s, t: s.GetNodeStatus(request, timeout=t))
            status = node_status_json(found)
            shown = {k: v for k, v in status.items() if k != "revision"}
            if last != shown:
                _show(status, as_json)
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
@json_option
@click.pass_context
def undrain(ctx: click.Context, name: str, as_json: bool) -> None:
    """Take node NAME's drain mark away: it takes replicas and leases again."""
    from placement.v1 import driver_pb2

    status = api_call(ctx, "DrainNode", driver_pb2.DrainNodeRequest(node=name, drain=False))
    _show(node_status_json(status), as_json)


@node.command("status")
@click.argument("name")
@json_option
@click.pass_context
def status(ctx: click.Context, name: str, as_json: bool) -> None:
    """What node NAME holds, and whether it may be stopped."""
    from placement.v1 import driver_pb2

    found = api_call(ctx, "GetNodeStatus", driver_pb2.GetNodeStatusRequest(node=name))
    _show(node_status_json(found), as_json)


def _show(status: dict[str, Any], as_json: bool) -> None:
    if as_json:
        echo_json(status)
    else:
        click.echo(_line(status))
