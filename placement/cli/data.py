"""``placectl data`` (put, get, delete, scan through the routing client) and ``placectl workload``
(recorded writers and the checker).

Keys and values are UTF-8 text, or hex with ``--hex`` (then output is hex too). Output: ``get``
prints the value alone; ``scan`` prints ``KEY<TAB>VALUE`` lines; ``--json`` prints one JSON
document. Exit codes: 0 done; 1 ``get`` of an absent key (nothing on stdout, "not found" on
stderr), no primary or driver answered in time, or ``workload check`` found a violation; 2 bad
input (one line naming the argument). ``delete`` of an absent key is not an error (exit 0, it says
so). Registered on ``placectl`` by its one import at the bottom of ``placement/cli.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from placement.api.client import parse_endpoints
from placement.cli.main import cli
from placement.cli.ops import json_option, run
from placement.data.client import DataClient
from placement.data.partitioning import validate_key, validate_value
from placement.data.workload import check_workload, run_writers
from placement.errors import InvalidInput

T = TypeVar("T")

hex_option = click.option(
    "--hex", "as_hex", is_flag=True, help="Keys and values are hex (binary data), in and out."
)


# -- pure helpers (unit-tested) ----------------------------------------------------------------


def decode_arg(text: str, name: str, as_hex: bool) -> bytes:
    """A command-line KEY/VALUE/--prefix as bytes; InvalidInput naming ``name`` when not hex."""
    if not as_hex:
        return text.encode("utf-8", "surrogateescape")
    try:
        return bytes.fromhex(text)
    except ValueError as e:
        raise InvalidInput(name, f"{text!r} is not hex", "e.g. 6b6579, or drop --hex") from e


def show(raw: bytes, as_hex: bool) -> str:
    return raw.hex() if as_hex else raw.decode("utf-8", "backslashreplace")


def parse_key(text: str, as_hex: bool) -> bytes:
    return validate_key(decode_arg(text, "KEY", as_hex), "KEY")


# -- running -----------------------------------------------------------------------------------


def _endpoints(ctx: click.Context) -> tuple[str, ...]:
    obj = ctx.find_root().obj or {}
    return parse_endpoints(obj.get("endpoints", []))


def _with_client(
    ctx: click.Context, body: Callable[[DataClient], Awaitable[T]], deadline: float = 15.0
) -> T:
    if not deadline > 0:
        raise InvalidInput("--deadline", f"{deadline} is not positive", "seconds, e.g. 15")

    async def go() -> T:
        async with DataClient(_endpoints(ctx), deadline=deadline) as client:
            return await body(client)

    return run(go())


def _echo_json(data: Any) -> None:
    click.echo(json.dumps(data, sort_keys=True))


deadline_option = click.option(
    "--deadline",
    type=float,
    default=15.0,
    show_default=True,
    help="Seconds to keep retrying an unavailable partition before giving up (exit 1).",
)


# -- data --------------------------------------------------------------------------------------


@cli.group("data")
def data() -> None:
    """Read and write keys of a zone (routed to each partition's primary)."""


@data.command("put")
@click.argument("zone")
@click.argument("key")
@click.argument("value")
@hex_option
@deadline_option
@json_option
@click.pass_context
def data_put(
    ctx: click.Context,
    zone: str,
    key: str,
    value: str,
    as_hex: bool,
    deadline: float,
    as_json: bool,
) -> None:
    """Write VALUE under KEY in ZONE (acknowledged once every in-sync replica persisted it)."""
    raw_key = parse_key(key, as_hex)
    raw_value = validate_value(decode_arg(value, "VALUE", as_hex), "VALUE")
    result = _with_client(ctx, lambda c: c.put(zone, raw_key, raw_value), deadline)
    if as_json:
        _echo_json({"key": key, "index": result.index, "lease_epoch": result.lease_epoch})
    else:
        click.echo(f"put {key}: index {result.index}, lease epoch {result.lease_epoch}")


@data.command("get")
@click.argument("zone")
@click.argument("key")
@hex_option
@deadline_option
@json_option
@click.pass_context
def data_get(
    ctx: click.Context, zone: str, key: str, as_hex: bool, deadline: float, as_json: bool
) -> None:
    """Print KEY's value in ZONE; exit 1 (and "not found" on stderr) when absent."""
    raw_key = parse_key(key, as_hex)
    value = _with_client(ctx, lambda c: c.get(zone, raw_key), deadline)
    if value is None:
        click.echo(f"placectl: not found: {key} in zone {zone}", err=True)
        sys.exit(1)
    if as_json:
        _echo_json({"key": key, "value": show(value, as_hex)})
    else:
        click.echo(show(value, as_hex))


@data.command("delete")
@click.argument("zone")
@click.argument("key")
@hex_option
@deadline_option
@json_option
@click.pass_context
def data_delete(
    ctx: click.Context, zone: str, key: str, as_hex: bool, deadline: float, as_json: bool
) -> None:
    """Delete KEY from ZONE (exit 0 also when it did not exist)."""
    raw_key = parse_key(key, as_hex)
    result = _with_client(ctx, lambda c: c.delete_with_result(zone, raw_key), deadline)
    if as_json:
        _echo_json(
            {
                "key": key,
                "existed": result.existed,
                "index": result.index,
                "lease_epoch": result.lease_epoch,
            }
        )
    else:
        click.echo(f"deleted {key}" if result.existed else f"{key} did not exist")


@data.command("scan")
@click.argument("zone")
@click.option("--prefix", default="", help="Only keys starting with this.")
@hex_option
@deadline_option
@json_option
@click.pass_context
def data_scan(
    ctx: click.Context, zone: str, prefix: str, as_hex: bool, deadline: float, as_json: bool
) -> None:
    """Every key of ZONE (all partitions, in key order) with its value."""
    raw_prefix = decode_arg(prefix, "--prefix", as_hex)

    async def scan(client: DataClient) -> int:
        items: list[dict[str, str]] = []
        async for k, v in client.scan(zone, raw_prefix):
            if as_json:
                items.append({"key": show(k, as_hex), "value": show(v, as_hex)})
            else:
                click.echo(f"{show(k, as_hex)}\t{show(v, as_hex)}")
        if as_json:
            _echo_json({"zone": zone, "prefix": prefix, "count": len(items), "items": items})
        return len(items)

    _with_client(ctx, scan, deadline)


# -- workload ----------------------------------------------------------------------------------


@cli.group("workload")
def workload() -> None:
    """Recorded writers, and the checker that no acknowledged write was lost."""


@workload.command("run")
@click.option("--zone", required=True, help="Zone to write to.")
@click.option("--writers", type=int, default=8, show_default=True, help="Concurrent writers.")
@click.option(
    "--keys-per-writer", type=int, default=50, show_default=True, help="Keys each writer owns."
)
@click.option("--duration", type=float, default=30.0, show_default=True, help="Seconds to run.")
@click.option(
    "--record",
    "record_path",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="JSONL record of every attempt and outcome (overwritten).",
)
@click.option(
    "--delete-ratio", type=float, default=0.1, show_default=True, help="Share of deletes (0..1)."
)
@click.option("--seed", type=int, help="Seed of the writers' key and op choices.")
@json_option
@click.pass_context
def workload_run(
    ctx: click.Context,
    zone: str,
    writers: int,
    keys_per_writer: int,
    duration: float,
    record_path: Path,
    delete_ratio: float,
    seed: int | None,
    as_json: bool,
) -> None:
    """Run writers against ZONE for --duration seconds (Ctrl-C/SIGTERM stop early), recording
    every write to --record; prints acks, failures and latency."""
    if not record_path.parent.is_dir():
        raise InvalidInput("--record", f"directory {record_path.parent} does not exist", "")

    async def body(client: DataClient) -> Any:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            return await run_writers(
                client,
                zone,
                writers,
                keys_per_writer,
                duration,
                record_path,
                stop,
                delete_ratio=delete_ratio,
                seed=seed,
            )
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(ValueError, RuntimeError):
                    loop.remove_signal_handler(sig)

    stats = _with_client(ctx, body)
    if as_json:
        _echo_json({"zone": zone, "record": str(record_path), **stats.as_json()})
        return
    failures = ", ".join(f"{k} {v}" for k, v in sorted(stats.failures.items())) or "none"
    click.echo(
        f"run {stats.run} on {zone}: {stats.acked}/{stats.attempted} writes acknowledged in "
        f"{stats.elapsed:.1f}s ({stats.throughput:.0f}/s), failures: {failures}; "
        f"latency p50 {stats.p50 * 1000:.1f} ms, p99 {stats.p99 * 1000:.1f} ms -> {record_path}"
    )


@workload.command("check")
@click.option("--zone", required=True, help="Zone the record was written to.")
@click.option(
    "--record",
    "record_path",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="The JSONL record `workload run` wrote.",
)
@click.option(
    "--settle",
    type=float,
    default=10.0,
    show_default=True,
    help="Seconds to re-read replicas while they disagree (catch-up in progress).",
)
@json_option
@click.pass_context
def workload_check(
    ctx: click.Context, zone: str, record_path: Path, settle: float, as_json: bool
) -> None:
    """Check ZONE against a record: the API and every stable replica hold every acknowledged
    write, and replicas agree. Exit 1 on any violation."""
    if not settle >= 0:
        raise InvalidInput("--settle", f"{settle} is negative", "seconds, e.g. 10")
    result = _with_client(ctx, lambda c: check_workload(c, zone, record_path, settle=settle))
    if as_json:
        _echo_json(result.as_json())
    else:
        click.echo(
            f"{'OK' if result.ok else 'FAILED'}: zone {zone} run {result.run}: "
            f"{result.acked_writes}/{result.attempted_writes} writes acknowledged over "
            f"{result.keys} keys; lost {result.lost}, wrong {result.wrong}; replicas: "
            f"{result.replicas_checked} checked in {result.partitions_checked} partitions, "
            f"divergent {result.divergent_replicas}, lost {result.replica_lost}, "
            f"wrong {result.replica_wrong}, unreadable {result.unreachable_replicas}"
        )
        for example in result.examples:
            click.echo(f"  {example}")
    if not result.ok:
        sys.exit(1)
