"""``placectl zone``: create, alter, drop, get, list and status (``--watch`` follows it).

Every command talks to the drivers named by the global ``--endpoint`` (any instance; the client
fails over between them). Every command takes ``-o json|yaml|table|wide`` (``--json``): one JSON
or YAML document of what the driver answered (``status --watch -o json``: one per line);
``wide`` adds the config revision and re-shard attempt to the zone table and the counts behind
the state to ``status``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from placement.cli.common import (
    NoBars,
    Output,
    api_call,
    api_client,
    output_option,
    pairs_text,
    run,
    stacked,
)
from placement.cli.dryrun import show_dry_run
from placement.core.limits import MAX_PARTITIONS, MAX_REPLICAS
from placement.core.model import DEFAULT_MIN_IN_SYNC, parse_pairs
from placement.core.zonespec import check_count, check_min_in_sync
from placement.errors import InvalidInput

if TYPE_CHECKING:
    from rich.table import Table

    from placement.v1 import driver_pb2


def zone_config(
    *,
    partitions: int | None,
    replicas: int | None,
    selector: Sequence[str],
    failure_domain: str | None,
    scale_up_delay: float | None,
    scale_down_delay: float | None,
    min_in_sync: int | None = None,
) -> tuple[driver_pb2.ZoneConfig, list[str]]:
    """The ZoneConfig and the names of the fields given (for AlterZone's ``update_fields``)."""
    from placement.v1 import driver_pb2

    config = driver_pb2.ZoneConfig()
    given: list[str] = []
    if partitions is not None:
        config.partitions = check_count(partitions, MAX_PARTITIONS, "--partitions")
        given.append("partitions")
    if replicas is not None:
        config.replicas = check_count(replicas, MAX_REPLICAS, "--replicas")
        given.append("replicas")
    if selector:
        config.node_selector.update(parse_pairs(selector, "--node-selector"))
        given.append("node_selector")
    if failure_domain is not None:
        config.failure_domain = failure_domain
        given.append("failure_domain")
    if scale_up_delay is not None:
        config.scale_up_delay_seconds = scale_up_delay
        given.append("scale_up_delay")
    if scale_down_delay is not None:
        config.scale_down_delay_seconds = scale_down_delay
        given.append("scale_down_delay")
    if min_in_sync is not None:
        config.min_in_sync = check_min_in_sync(min_in_sync, "--min-in-sync") or 0
        given.append("min_in_sync")
    return config, given


def zone_json(zone: driver_pb2.Zone) -> dict[str, Any]:
    c = zone.config
    return {
        "name": zone.name,
        "partitions": c.partitions,
        "replicas": c.replicas,
        "node_selector": dict(sorted(c.node_selector.items())),
        "failure_domain": c.failure_domain or None,
        "scale_up_delay": c.scale_up_delay_seconds,
        "scale_down_delay": c.scale_down_delay_seconds,
        "min_in_sync": c.min_in_sync or None,
        "effective_min_in_sync": _effective_min_in_sync(c),
        "revision": zone.revision,
        "layout": _layout_json(zone),
    }


def _layout_json(zone: driver_pb2.Zone) -> dict[str, Any] | None:
    """The layout in force (design/resharding.md); None until the leader wrote the first."""
    if not zone.HasField("layout"):
        return None
    layout = zone.layout
    r = layout.reshard if layout.HasField("reshard") else None
    return {
        "generation": layout.generation,
        "partitions": layout.partitions,
        "reshard": None
        if r is None
        else {"attempt": r.attempt, "source": r.source, "target": r.target, "phase": r.phase},
    }


def _layout_text(zone: driver_pb2.Zone) -> str:
    found = _layout_json(zone)
    if found is None:
        return "-"
    text = f"{found['partitions']} (gen {found['generation']})"
    r = found["reshard"]
    if r is not None:
        text += f", {r['source']} → {r['target']}: {r['phase']}"
    return text


def _effective_min_in_sync(c: driver_pb2.ZoneConfig) -> int:
    """What the replicas apply (``model.effective_min_in_sync``) for a config from the API."""
    return min(c.min_in_sync or DEFAULT_MIN_IN_SYNC, c.replicas)


def _min_in_sync_text(c: driver_pb2.ZoneConfig) -> str:
    effective = _effective_min_in_sync(c)
    return str(effective) if c.min_in_sync else f"{effective} (default)"


def status_json(status: driver_pb2.ZoneStatus) -> dict[str, Any]:
    from placement.v1 import driver_pb2

    names = {
        driver_pb2.READY: "READY",
        driver_pb2.HOLDDOWN: "HOLDDOWN",
        driver_pb2.REBALANCING: "REBALANCING",
        driver_pb2.RESHARDING: "RESHARDING",
        driver_pb2.NO_LEADER: "NO_LEADER",
    }
    found = {
        "name": status.name,
        "state": names.get(status.state, "UNKNOWN"),
        "partitions_total": status.partitions_total,
        "partitions_done": status.partitions_done,
        "holddown_remaining_seconds": status.holddown_remaining_seconds,
        "revision": status.revision,
        "eligible_nodes": status.eligible_nodes,
        "under_replicated": status.under_replicated,
        "partitions_off_target": status.partitions_off_target,
        "details": list(status.details),
    }
    if status.state == driver_pb2.REBALANCING:
        found["bytes_to_move"] = status.bytes_to_move
        found["eta_seconds"] = status.eta_seconds
    if status.HasField("reshard"):
        r = status.reshard
        found["reshard"] = {
            "attempt": r.attempt,
            "source": r.source,
            "target": r.target,
            "phase": r.phase,
            "keys_copied": status.keys_copied,
            "bytes_copied": status.bytes_copied,
            "bytes_to_copy": status.bytes_to_copy,
            "eta_seconds": status.eta_seconds,
        }
    return found


@click.group()
def zone() -> None:
    """Create, change, drop and look at zones."""


def _zone_options(required: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return stacked(
        click.option("--partitions", type=int, required=required, help="Partition count."),
        click.option("--replicas", type=int, required=required, help="Replicas per partition."),
        click.option(
            "--node-selector",
            "selector",
            multiple=True,
            metavar="K=V",
            help="Only nodes with this attribute (repeatable).",
        ),
        click.option("--failure-domain", help="Attribute to spread replicas over (e.g. rack)."),
        click.option("--scale-up-delay", type=float, help="Seconds before a new node counts."),
        click.option(
            "--scale-down-delay", type=float, help="Seconds before a gone node is replaced."
        ),
        click.option(
            "--min-in-sync",
            type=int,
            help=(
                f"Fewest in-sync replicas a primary accepts writes with (1..{MAX_REPLICAS};"
                " default 2, at most --replicas)."
            ),
        ),
    )


def _zone_line(z: driver_pb2.Zone, verb: str) -> str:
    c = z.config
    return (
        f"zone {z.name} {verb}: partitions={c.partitions} replicas={c.replicas} "
        f"selector={pairs_text(c.node_selector)} failure-domain={c.failure_domain or '-'} "
        f"scale-up-delay={c.scale_up_delay_seconds:g}s "
        f"scale-down-delay={c.scale_down_delay_seconds:g}s "
        f"min-in-sync={_min_in_sync_text(c)} (revision {z.revision})"
    )


@zone.command("create")
@click.argument("name")
@_zone_options(required=True)
@output_option
@click.pass_context
def zone_create(ctx: click.Context, /, name: str, output: Output, **options: Any) -> None:
    """Create zone NAME."""
    from placement.v1 import driver_pb2

    config, _ = zone_config(**options)
    request = driver_pb2.CreateZoneRequest(name=name, config=config)
    created = api_call(ctx, "CreateZone", request)
    output.emit(zone_json(created), lambda wide: _zone_line(created, "created"))


@zone.command("alter")
@click.argument("name")
@_zone_options(required=False)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Show what the change would move (the leader's own plan); change nothing.",
)
@output_option
@click.pass_context
def zone_alter(
    ctx: click.Context, /, name: str, dry_run: bool, output: Output, **options: Any
) -> None:
    """Change the given settings of zone NAME (others stay as they are)."""
    from placement.v1 import driver_pb2

    config, given = zone_config(**options)
    if not given:
        raise InvalidInput("zone alter", "no setting given", "pass e.g. --replicas 5")
    request = driver_pb2.AlterZoneRequest(name=name, config=config, update_fields=given)
    if dry_run:
        show_dry_run(ctx, driver_pb2.PlanRequest(alter_zone=request), f"zone alter {name}", output)
        return
    altered = api_call(ctx, "AlterZone", request)
    output.emit(zone_json(altered), lambda wide: _zone_line(altered, "altered"))


@zone.command("drop")
@click.argument("name")
@output_option
@click.pass_context
def zone_drop(ctx: click.Context, name: str, output: Output) -> None:
    """Drop zone NAME and all its assignments."""
    from placement.v1 import driver_pb2

    request = driver_pb2.DropZoneRequest(name=name)
    api_call(ctx, "DropZone", request)
    output.emit({"name": name, "dropped": True}, lambda wide: f"zone {name} dropped")


@zone.command("get")
@click.argument("name")
@output_option
@click.pass_context
def zone_get(ctx: click.Context, name: str, output: Output) -> None:
    """Show zone NAME's configuration."""
    from placement.v1 import driver_pb2

    request = driver_pb2.GetZoneRequest(name=name)
    z = api_call(ctx, "GetZone", request)
    output.emit(zone_json(z), lambda wide: zone_table([z], wide))


def zone_table(zones: Sequence[driver_pb2.Zone], wide: bool = False) -> Table:
    """The zones as a table; ``wide`` adds the config's revision and the re-shard attempt."""
    from rich.table import Table

    columns = ["zone", "partitions", "in force", "replicas", "selector", "domain", "delays"]
    columns += ["min ISR", *(["revision", "reshard attempt"] if wide else [])]
    table = Table(
        *columns,
        caption=(
            "in force: the data layout keys are routed by (generation; a re-shard in progress); "
            "domain: failure domain; delays: scale-up / scale-down; min ISR: fewest in-sync "
            "replicas a primary accepts writes with (* = the default: 2, at most replicas)"
        ),
    )
    for z in zones:
        c = z.config
        row = [
            z.name,
            str(c.partitions),
            _layout_text(z),
            str(c.replicas),
            pairs_text(c.node_selector),
            c.failure_domain or "-",
            f"{c.scale_up_delay_seconds:g}s / {c.scale_down_delay_seconds:g}s",
            str(_effective_min_in_sync(c)) + ("" if c.min_in_sync else "*"),
        ]
        if wide:
            reshard = (_layout_json(z) or {}).get("reshard")
            row += [str(z.revision), str(reshard["attempt"]) if reshard else "-"]
        table.add_row(*row)
    return table


@zone.command("list")
@output_option
@click.pass_context
def zone_list(ctx: click.Context, output: Output) -> None:
    """List every zone."""
    from placement.v1 import driver_pb2

    request = driver_pb2.ListZonesRequest()
    found = api_call(ctx, "ListZones", request)
    zones = list(found.zones)
    output.emit({"zones": [zone_json(z) for z in zones]}, lambda wide: zone_table(zones, wide))


@zone.command("status")
@click.argument("name")
@click.option("--watch", is_flag=True, help="Follow the status until READY (Ctrl-C stops).")
@click.option("--interval", type=float, default=1.0, show_default=True, help="Poll seconds.")
@output_option
@click.pass_context
def zone_status(
    ctx: click.Context, name: str, watch: bool, interval: float, output: Output
) -> None:
    """Show zone NAME's status: READY, HOLDDOWN, REBALANCING, RESHARDING or NO_LEADER, with
    progress, ETA and why (one line per reason). --watch: a progress bar on a terminal, else a
    status each time it changes (-o json: one JSON object per line)."""
    from placement.v1 import driver_pb2

    if interval <= 0:
        raise InvalidInput("--interval", f"{interval} is not positive", "e.g. 1")
    # Linearizable: a status asked right after a change (`zone alter ... && zone status`)
    # reflects it, whichever driver answers (design/control-plane.md, "Reads from memory").
    request = driver_pb2.GetZoneRequest(name=name, read=driver_pb2.ReadOptions(linearizable=True))
    if not watch:
        status = status_json(api_call(ctx, "GetZoneStatus", request))
        output.emit(status, lambda wide: status_text(status, wide))
        return
    try:
        run(_watch_status(ctx, request, interval, output))
    except KeyboardInterrupt:
        sys.exit(130)


def status_text(s: Mapping[str, Any], wide: bool = False) -> str:
    """The status line and one line per reason; ``wide`` adds the counts behind the state."""
    text = _status_line(s)
    if wide:
        text += (
            f"\n  eligible nodes {s['eligible_nodes']}, partitions off target"
            f" {s['partitions_off_target']}, under-replicated"
            f" {'yes' if s['under_replicated'] else 'no'}, revision {s['revision']}"
        )
    return text


def _status_line(s: Mapping[str, Any]) -> str:
    line = (
        f"zone {s['name']}: {s['state']} "
        f"({s['partitions_done']}/{s['partitions_total']} partitions stable)"
    )
    if s["state"] == "HOLDDOWN":
        line += f", membership change applies in {s['holddown_remaining_seconds']:.1f}s"
    if s["state"] == "REBALANCING":
        line += f", {s['bytes_to_move'] / 1e6:.1f} MB to move"
        if s["eta_seconds"]:
            line += f", about {s['eta_seconds']:.0f}s left"
    r = s.get("reshard")
    if r is not None:
        line += (
            f", re-sharding {r['source']} → {r['target']} partitions, phase {r['phase']}:"
            f" {r['keys_copied']} keys, {r['bytes_copied'] / 1e6:.1f} of"
            f" ~{r['bytes_to_copy'] / 1e6:.1f} MB copied"
        )
        if r["eta_seconds"]:
            line += f", about {r['eta_seconds']:.0f}s left"
    return "\n".join([line, *(f"  {d}" for d in s.get("details", ()))])


def _eta_text(s: Mapping[str, Any]) -> str:
    """The progress bar's last column: the ETA and what is left, or why it waits."""
    eta = s.get("eta_seconds") or (s.get("reshard") or {}).get("eta_seconds") or 0
    if s["state"] == "REBALANCING":
        left = f"{s['bytes_to_move'] / 1e6:.1f} MB left"
        return f"ETA {eta:.0f}s, {left}" if eta else left
    if s["state"] == "RESHARDING" and eta:
        return f"ETA {eta:.0f}s"
    if s["state"] == "HOLDDOWN":
        return f"applies in {s['holddown_remaining_seconds']:.0f}s"
    if s["state"] == "NO_LEADER":
        return "no leader"
    return ""


async def _watch_status(
    ctx: click.Context, request: driver_pb2.GetZoneRequest, interval: float, output: Output
) -> None:
    """Until READY: a bar on a terminal (then the last status), else every change printed."""
    import asyncio

    async with api_client(ctx) as client:
        with output.progress() as bars:
            last: dict[str, Any] | None = None
            task = bars.add_task(request.name, total=None)
            printing = isinstance(bars, NoBars)
            while True:
                status = status_json(
                    await client.read(lambda s, t: s.GetZoneStatus(request, timeout=t))
                )
                if printing and status != last:
                    output.emit(status, functools.partial(status_text, status), stream=True)
                last = status
                bars.update(
                    task,
                    description=f"{status['name']} {status['state']}",
                    completed=status["partitions_done"],
                    total=status["partitions_total"],
                    detail=_eta_text(status),
                )
                if status["state"] == "READY":
                    break
                await asyncio.sleep(interval)
    if not printing:
        click.echo(status_text(status, output.wide))
