"""``placectl`` operator commands: zones, status, assignments, nodes, rebalance control, inspect,
``agent run`` and ``up``.

Every API command talks to the drivers named by the global ``--endpoint`` (any instance; the
client fails over between them). Read commands take ``--json`` after their arguments and then
print one JSON document (``zone status --watch --json``: one per line). Errors are one line on
stderr: exit 2 for bad input (``INVALID_ARGUMENT``, ``NOT_FOUND``, ``ALREADY_EXISTS``, a bad
flag), 1 when no driver or etcd answers; never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
import grpc
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from placement.api.client import ApiError, PlacementClient, parse_endpoints
from placement.core.limits import MAX_REPLICAS
from placement.core.model import DEFAULT_MIN_IN_SYNC
from placement.errors import InvalidInput, PlacementError, StoreUnavailable
from placement.v1 import common_pb2, driver_pb2

T = TypeVar("T")

#: Status codes that mean "your input is wrong" (exit 2); anything else is exit 1.
BAD_INPUT = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)
#: Seconds a command keeps retrying unavailable drivers before it gives up (exit 1).
CLI_DEADLINE = 5.0
STATE_NAMES = {
    driver_pb2.READY: "READY",
    driver_pb2.HOLDDOWN: "HOLDDOWN",
    driver_pb2.REBALANCING: "REBALANCING",
}


# -- pure helpers (unit-tested) ----------------------------------------------------------------


def parse_pairs(items: Sequence[str], option: str) -> dict[str, str]:
    """``["k=v", ...]`` -> dict; raises InvalidInput naming ``option`` on bad syntax/duplicates."""
    result: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise InvalidInput(option, f"{item!r} is not KEY=VALUE", "e.g. rack=r1")
        if key in result:
            raise InvalidInput(option, f"key {key!r} given twice", "give each key once")
        result[key] = value
    return result


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
    config = driver_pb2.ZoneConfig()
    given: list[str] = []
    if partitions is not None:
        config.partitions = _non_negative(partitions, "--partitions")
        given.append("partitions")
    if replicas is not None:
        config.replicas = _non_negative(replicas, "--replicas")
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
        if not 1 <= min_in_sync <= MAX_REPLICAS:
            raise InvalidInput(
                "--min-in-sync",
                f"{min_in_sync} is out of range",
                f"use 1..{MAX_REPLICAS} (the default is 2, at most --replicas)",
            )
        config.min_in_sync = min_in_sync
        given.append("min_in_sync")
    return config, given


def _non_negative(value: int, option: str) -> int:
    if value < 0:
        raise InvalidInput(option, f"{value} is negative", "use a count >= 1")
    return value


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
    }


def _effective_min_in_sync(c: driver_pb2.ZoneConfig) -> int:
    """What the replicas apply (``model.effective_min_in_sync``) for a config from the API."""
    return min(c.min_in_sync or DEFAULT_MIN_IN_SYNC, c.replicas)


def _min_in_sync_text(c: driver_pb2.ZoneConfig) -> str:
    effective = _effective_min_in_sync(c)
    return str(effective) if c.min_in_sync else f"{effective} (default)"


def status_json(status: driver_pb2.ZoneStatus) -> dict[str, Any]:
    return {
        "name": status.name,
        "state": STATE_NAMES.get(status.state, "UNKNOWN"),
        "partitions_total": status.partitions_total,
        "partitions_done": status.partitions_done,
        "holddown_remaining_seconds": status.holddown_remaining_seconds,
        "revision": status.revision,
    }


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


# -- running -----------------------------------------------------------------------------------


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"placectl: error: {message}", err=True)
    sys.exit(code)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro``; map errors to one line and the exit code (2 bad input, 1 unavailable)."""
    try:
        return asyncio.run(coro)
    except ApiError as e:
        _fail(e.detail or e.code.name.lower(), 2 if e.code in BAD_INPUT else 1)
    except InvalidInput as e:
        _fail(str(e), 2)
    except StoreUnavailable as e:
        _fail(str(e), 1)
    except PlacementError as e:
        _fail(str(e), 1)


def _endpoints(ctx: click.Context) -> list[str]:
    obj = ctx.find_root().obj or {}
    endpoints: list[str] = obj.get("endpoints", [])
    return list(parse_endpoints(endpoints))


async def _call(ctx: click.Context, method: Callable[[Any, float], Awaitable[T]]) -> T:
    async with PlacementClient(_endpoints(ctx), deadline=CLI_DEADLINE) as client:
        return await client.call(method)


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, sort_keys=True))


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _peers(names: Sequence[str] | None) -> str:
    return ",".join(names) if names else "-"


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


# -- zone --------------------------------------------------------------------------------------


@click.group()
def zone() -> None:
    """Create, change, drop and look at zones."""


def _zone_options(required: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def apply(f: Callable[..., Any]) -> Callable[..., Any]:
        options = [
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
        ]
        for option in reversed(options):
            f = option(f)
        return f

    return apply


def _print_zone(z: driver_pb2.Zone, verb: str) -> None:
    c = z.config
    selector = ",".join(f"{k}={v}" for k, v in sorted(c.node_selector.items())) or "-"
    click.echo(
        f"zone {z.name} {verb}: partitions={c.partitions} replicas={c.replicas} "
        f"selector={selector} failure-domain={c.failure_domain or '-'} "
        f"scale-up-delay={c.scale_up_delay_seconds:g}s "
        f"scale-down-delay={c.scale_down_delay_seconds:g}s "
        f"min-in-sync={_min_in_sync_text(c)} (revision {z.revision})"
    )


@zone.command("create")
@click.argument("name")
@_zone_options(required=True)
@click.pass_context
def zone_create(ctx: click.Context, /, name: str, **options: Any) -> None:
    """Create zone NAME."""
    config, _ = zone_config(**options)
    request = driver_pb2.CreateZoneRequest(name=name, config=config)
    created = run(_call(ctx, lambda s, t: s.CreateZone(request, timeout=t)))
    _print_zone(created, "created")


@zone.command("alter")
@click.argument("name")
@_zone_options(required=False)
@click.pass_context
def zone_alter(ctx: click.Context, /, name: str, **options: Any) -> None:
    """Change the given settings of zone NAME (others stay as they are)."""
    config, given = zone_config(**options)
    if not given:
        raise InvalidInput("zone alter", "no setting given", "pass e.g. --replicas 5")
    request = driver_pb2.AlterZoneRequest(name=name, config=config, update_fields=given)
    altered = run(_call(ctx, lambda s, t: s.AlterZone(request, timeout=t)))
    _print_zone(altered, "altered")


@zone.command("drop")
@click.argument("name")
@click.pass_context
def zone_drop(ctx: click.Context, name: str) -> None:
    """Drop zone NAME and all its assignments."""
    request = driver_pb2.DropZoneRequest(name=name)
    run(_call(ctx, lambda s, t: s.DropZone(request, timeout=t)))
    click.echo(f"zone {name} dropped")


@zone.command("get")
@click.argument("name")
@json_option
@click.pass_context
def zone_get(ctx: click.Context, name: str, as_json: bool) -> None:
    """Show zone NAME's configuration."""
    request = driver_pb2.GetZoneRequest(name=name)
    z = run(_call(ctx, lambda s, t: s.GetZone(request, timeout=t)))
    if as_json:
        _echo_json(zone_json(z))
    else:
        _zone_table([z])


def _zone_table(zones: Sequence[driver_pb2.Zone]) -> None:
    table = Table(
        "zone",
        "partitions",
        "replicas",
        "selector",
        "domain",
        "delays",
        "min ISR",
        caption=(
            "domain: failure domain; delays: scale-up / scale-down; min ISR: fewest in-sync "
            "replicas a primary accepts writes with (* = the default: 2, at most replicas)"
        ),
    )
    for z in zones:
        c = z.config
        table.add_row(
            z.name,
            str(c.partitions),
            str(c.replicas),
            ",".join(f"{k}={v}" for k, v in sorted(c.node_selector.items())) or "-",
            c.failure_domain or "-",
            f"{c.scale_up_delay_seconds:g}s / {c.scale_down_delay_seconds:g}s",
            str(_effective_min_in_sync(c)) + ("" if c.min_in_sync else "*"),
        )
    _console().print(table)


@zone.command("list")
@json_option
@click.pass_context
def zone_list(ctx: click.Context, as_json: bool) -> None:
    """List every zone."""
    request = driver_pb2.ListZonesRequest()
    found = run(_call(ctx, lambda s, t: s.ListZones(request, timeout=t)))
    if as_json:
        _echo_json({"zones": [zone_json(z) for z in found.zones]})
    else:
        _zone_table(list(found.zones))


@zone.command("status")
@click.argument("name")
@click.option("--watch", is_flag=True, help="Follow the status until READY (Ctrl-C stops).")
@click.option("--interval", type=float, default=1.0, show_default=True, help="Poll seconds.")
@json_option
@click.pass_context
def zone_status(ctx: click.Context, name: str, watch: bool, interval: float, as_json: bool) -> None:
    """Show zone NAME's status: READY, HOLDDOWN or REBALANCING, with progress."""
    if interval <= 0:
        raise InvalidInput("--interval", f"{interval} is not positive", "e.g. 1")
    request = driver_pb2.GetZoneRequest(name=name)
    if not watch:
        status = run(_call(ctx, lambda s, t: s.GetZoneStatus(request, timeout=t)))
        if as_json:
            _echo_json(status_json(status))
        else:
            click.echo(_status_line(status_json(status)))
        return
    try:
        run(_watch_status(ctx, request, interval, as_json))
    except KeyboardInterrupt:
        sys.exit(130)


def _status_line(s: Mapping[str, Any]) -> str:
    line = (
        f"zone {s['name']}: {s['state']} "
        f"({s['partitions_done']}/{s['partitions_total']} partitions stable)"
    )
    if s["state"] == "HOLDDOWN":
        line += f", membership change applies in {s['holddown_remaining_seconds']:.1f}s"
    return line


async def _watch_status(
    ctx: click.Context, request: driver_pb2.GetZoneRequest, interval: float, as_json: bool
) -> None:
    async with PlacementClient(_endpoints(ctx), deadline=CLI_DEADLINE) as client:
        last: dict[str, Any] | None = None
        if as_json:
            while True:
                status = status_json(
                    await client.call(lambda s, t: s.GetZoneStatus(request, timeout=t))
                )
                if status != last:
                    _echo_json(status)
                    last = status
                if status["state"] == "READY":
                    return
                await asyncio.sleep(interval)
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=False,
        ) as progress:
            task = progress.add_task(request.name, total=None)
            while True:
                status = status_json(
                    await client.call(lambda s, t: s.GetZoneStatus(request, timeout=t))
                )
                progress.update(
                    task,
                    description=f"{status['name']} {status['state']}",
                    completed=status["partitions_done"],
                    total=status["partitions_total"],
                )
                if status["state"] == "READY":
                    break
                await asyncio.sleep(interval)
        click.echo(_status_line(status))


# -- assignments, nodes ------------------------------------------------------------------------


@click.command("assignments")
@click.argument("zone_name", metavar="ZONE")
@click.option("--partition", type=click.IntRange(min=0), help="Only this partition.")
@json_option
@click.pass_context
def assignments(ctx: click.Context, zone_name: str, partition: int | None, as_json: bool) -> None:
    """Stable, pending, planned and primary of every partition of ZONE."""

    async def fetch() -> tuple[int, list[driver_pb2.PartitionAssignment]]:
        found: list[driver_pb2.PartitionAssignment] = []
        token = ""
        revision = 0
        async with PlacementClient(_endpoints(ctx), deadline=CLI_DEADLINE) as client:
            while True:
                request = driver_pb2.GetAssignmentsRequest(zone=zone_name, page_token=token)
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

    revision, found = run(fetch())
    if as_json:
        _echo_json(
            {
                "zone": zone_name,
                "revision": revision,
                "partitions": [assignment_json(a) for a in found],
            }
        )
        return
    table = Table("partition", "stable", "pending", "planned", "primary")
    for a in found:
        table.add_row(
            str(a.partition),
            _peers(a.stable.names),
            _peers(a.pending.names) if a.has_pending else "-",
            _peers(a.planned.names) if a.has_planned else "-",
            a.primary or "-",
        )
    _console().print(table)


@click.command("nodes")
@json_option
@click.pass_context
def nodes(ctx: click.Context, as_json: bool) -> None:
    """Registered nodes (agents), their addresses and attributes."""
    request = driver_pb2.ListNodesRequest()
    found = run(_call(ctx, lambda s, t: s.ListNodes(request, timeout=t)))
    if as_json:
        _echo_json({"nodes": [node_json(n) for n in found.nodes]})
        return
    table = Table("node", "address", "attributes", "weight")
    for n in found.nodes:
        attributes = ",".join(f"{k}={v}" for k, v in sorted(n.attributes.items())) or "-"
        table.add_row(n.name, n.address, attributes, f"{n.weight:g}")
    _console().print(table)


# -- rebalance ---------------------------------------------------------------------------------


@click.group()
def rebalance() -> None:
    """Cancel, pause and resume rebalancing."""


@rebalance.command("cancel")
@click.argument("zone_name", metavar="ZONE")
@click.argument("partition", type=click.IntRange(min=0))
@click.pass_context
def rebalance_cancel(ctx: click.Context, zone_name: str, partition: int) -> None:
    """Cancel the rebalance in progress of PARTITION of ZONE (its replicas return to stable)."""
    request = common_pb2.PartitionRef(zone=zone_name, partition=partition)
    reply = run(_call(ctx, lambda s, t: s.CancelRebalance(request, timeout=t)))
    click.echo(f"{'cancelled' if reply.accepted else 'not cancelled'}: {reply.detail}")
    if not reply.accepted:
        sys.exit(1)


@rebalance.command("pause")
@click.pass_context
def rebalance_pause(ctx: click.Context) -> None:
    """Pause all driving (no new moves start; in-flight ones finish)."""
    run(_call(ctx, lambda s, t: s.PauseRebalancing(driver_pb2.PauseRequest(), timeout=t)))
    click.echo("rebalancing paused")


@rebalance.command("resume")
@click.pass_context
def rebalance_resume(ctx: click.Context) -> None:
    """Resume driving after a pause."""
    run(_call(ctx, lambda s, t: s.ResumeRebalancing(driver_pb2.PauseRequest(), timeout=t)))
    click.echo("rebalancing resumed")


# -- inspect -----------------------------------------------------------------------------------


def decode_entry(kind: str, field: str | None, raw: bytes) -> Any:
    """A stored value as JSON-able data (``{"corrupt": reason, "raw": ...}`` if undecodable)."""
    from dataclasses import asdict, is_dataclass

    from placement.metastore import codec

    decoders: dict[str, Callable[[bytes], Any]] = {
        "zones": codec.decode_zone_spec,
        "nodes": codec.decode_node,
        "datanodes": codec.decode_datanodes,
        "primary": codec.decode_primary,
        "control": codec.decode_control,
        "progress": codec.decode_report,
        "isr": codec.decode_isr,
        "sizes": codec.decode_size,
    }
    assign: dict[str | None, Callable[[bytes], Any]] = {
        "stable": codec.decode_assignment,
        "pending": codec.decode_assignment,
        "planned": codec.decode_assignment,
        "cancel": codec.decode_cancel,
        "trigger": codec.decode_trigger,
    }
    decode = assign.get(field) if kind == "assign" else decoders.get(kind)
    if decode is None:
        try:
            return json.loads(raw)
        except ValueError:
            return {"raw": raw.decode("utf-8", "backslashreplace")}
    value = decode(raw)
    if isinstance(value, codec.Corrupt):
        return {"corrupt": value.reason, "raw": raw.decode("utf-8", "backslashreplace")}
    return _plain(asdict(value)) if is_dataclass(value) and not isinstance(value, type) else value


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    return value


@click.command("inspect")
@click.option("--etcd", "etcd_endpoints", required=True, help="etcd HOST:PORT[,...]")
@click.option("--prefix", default="/placement", show_default=True, help="Metastore key prefix.")
@json_option
def inspect(etcd_endpoints: str, prefix: str, as_json: bool) -> None:
    """Decode every metastore key under the prefix (read-only)."""
    from placement.metastore.etcd import EtcdClient
    from placement.metastore.keys import KeySpace

    keys = KeySpace(prefix)

    async def read() -> tuple[int, list[dict[str, Any]]]:
        async with EtcdClient(etcd_endpoints, call_timeout=3.0) as client:
            found = await client.list_prefix(f"{prefix}/".encode())
        rows = []
        for kv in found.kvs:
            parsed = keys.parse(kv.key)
            kind = parsed.kind.value if parsed is not None else "unknown"
            field = parsed.field.value if parsed is not None and parsed.field else None
            rows.append(
                {
                    "key": kv.key.decode("utf-8", "backslashreplace"),
                    "kind": kind,
                    "mod_revision": kv.mod_revision,
                    "lease": kv.lease,
                    "value": decode_entry(kind, field, kv.value),
                }
            )
        return found.revision, rows

    revision, rows = run(read())
    if as_json:
        _echo_json({"prefix": prefix, "revision": revision, "keys": rows})
        return
    table = Table("key", "mod rev", "value", title=f"{prefix} at revision {revision}")
    for row in rows:
        table.add_row(
            row["key"], str(row["mod_revision"]), json.dumps(row["value"], sort_keys=True)
        )
    _console().print(table)


# -- agent -------------------------------------------------------------------------------------


@click.group()
def agent() -> None:
    """Replica agents."""


@agent.command("run")
@click.option("--etcd", "etcd_endpoints", required=True, help="etcd HOST:PORT[,...]")
@click.option("--node", required=True, help="This node's name.")
@click.option("--listen", required=True, help="HOST:PORT to serve on (port 0 = any free).")
@click.option("--data-dir", required=True, type=click.Path(path_type=Path, file_okay=False))
@click.option("--prefix", default="/placement", show_default=True, help="Metastore key prefix.")
@click.option("--attribute", multiple=True, metavar="K=V", help="Node attribute (repeatable).")
@click.option("--lease-ttl", type=click.IntRange(min=2), default=5, show_default=True)
@click.option(
    "--catch-up-mbps",
    type=click.FloatRange(min=0),
    default=64.0,
    show_default=True,
    help="Catch-up bandwidth of this agent in MB/s (0 = unlimited).",
)
@click.option(
    "--isr-timeout",
    type=click.FloatRange(min=0.2),
    default=3.0,
    show_default=True,
    help="Seconds a replica may stay silent before its primary drops it from the in-sync set.",
)
def agent_run(
    etcd_endpoints: str,
    node: str,
    listen: str,
    data_dir: Path,
    prefix: str,
    attribute: tuple[str, ...],
    lease_ttl: int,
    catch_up_mbps: float,
    isr_timeout: float,
) -> None:
    """Run a replica agent that registers NODE in etcd (until SIGTERM/SIGINT)."""
    import logging

    from replica.data.plane import DataConfig
    from replica.server import serve

    attributes = parse_pairs(attribute, "--attribute")
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    code = run(
        serve(
            node,
            listen,
            data_dir,
            etcd=etcd_endpoints,
            prefix=prefix,
            attributes=attributes,
            lease_ttl=lease_ttl,
            data_config=DataConfig(
                isr_timeout=isr_timeout, catch_up_bytes_per_s=catch_up_mbps * 1e6
            ),
        )
    )
    sys.exit(code)


# -- up ----------------------------------------------------------------------------------------


@click.command("up")
@click.option("--nodes", "n_nodes", type=click.IntRange(1, 64), default=3, show_default=True)
@click.option("--drivers", type=click.IntRange(1, 9), default=2, show_default=True)
@click.option("--etcd", "etcd_endpoints", help="Use this etcd instead of starting one.")
@click.option("--data-dir", type=click.Path(path_type=Path, file_okay=False), help="State dir.")
@click.option(
    "--api-port",
    type=click.IntRange(0, 65535),
    default=7400,
    show_default=True,
    help="Port of the first driver's API (the CLI's default endpoint); 0 = any free.",
)
@click.option("--prefix", default="/placement", show_default=True, help="Metastore key prefix.")
@click.option("--no-status", is_flag=True, help="Print endpoints, then wait (no live table).")
def up(
    n_nodes: int,
    drivers: int,
    etcd_endpoints: str | None,
    data_dir: Path | None,
    api_port: int,
    prefix: str,
    no_status: bool,
) -> None:
    """Start a local cluster (etcd, drivers, agents, a demo zone) until Ctrl-C/SIGTERM."""
    from placement.local.cluster import UpOptions, run_up

    code = run_up(
        UpOptions(
            nodes=n_nodes,
            drivers=drivers,
            etcd=etcd_endpoints,
            data_dir=data_dir,
            api_port=api_port,
            live=not no_status,
            prefix=prefix,
        )
    )
    sys.exit(code)


COMMANDS: tuple[click.Command, ...] = (
    zone,
    assignments,
    nodes,
    rebalance,
    inspect,
    agent,
    up,
)
