"""``placectl data``: put, get, delete and scan keys of a zone through the routing client.

Keys and values are UTF-8 text, or hex with ``--hex`` (then output is hex too). Output: ``get``
prints the value alone; ``scan`` prints ``KEY<TAB>VALUE`` lines; ``-o json|yaml`` (``--json``)
prints one JSON or YAML document (``wide`` is the same as ``table`` here). Exit codes: 0 done;
1 ``get`` of an absent key (nothing on stdout, "not found" on stderr), no primary or driver
answered in time, or ``workload check`` found a violation; 2 bad input (one line naming the
argument). ``delete`` of an absent key is not an error (exit 0, it says so).
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import click

from placement.cli.common import Output, endpoints, output_option, run, stacked, tls
from placement.data.partitioning import validate_key, validate_value
from placement.errors import InvalidInput

if TYPE_CHECKING:
    from placement.data.client import DataClient

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


def with_data_client(
    ctx: click.Context, body: Callable[[DataClient], Awaitable[T]], deadline: float = 15.0
) -> T:
    """Runs ``body`` with a routing client of the drivers named by ``--endpoint``."""
    from placement.data.client import DataClient

    if not deadline > 0:
        raise InvalidInput("--deadline", f"{deadline} is not positive", "seconds, e.g. 15")

    async def go() -> T:
        async with DataClient(endpoints(ctx), deadline=deadline, tls=tls(ctx)) as client:
            return await body(client)

    return run(go())


deadline_option = click.option(
    "--deadline",
    type=float,
    default=15.0,
    show_default=True,
    help="Seconds to keep retrying an unavailable partition before giving up (exit 1).",
)


# -- data --------------------------------------------------------------------------------------


@click.group("data")
def data() -> None:
    """Read and write keys of a zone (routed to each partition's primary)."""


def data_command(
    name: str, *arguments: Callable[[Callable[..., None]], Callable[..., None]]
) -> Callable[[Callable[..., None]], click.Command]:
    """``placectl data NAME ZONE ARGUMENTS... [--hex] [--deadline S] [-o FORMAT]``."""
    options = stacked(
        click.argument("zone"),
        *arguments,
        hex_option,
        deadline_option,
        output_option,
        click.pass_context,
    )
    return lambda f: data.command(name)(options(f))


@data_command("put", click.argument("key"), click.argument("value"))
def data_put(
    ctx: click.Context,
    zone: str,
    key: str,
    value: str,
    as_hex: bool,
    deadline: float,
    output: Output,
) -> None:
    """Write VALUE under KEY in ZONE (acknowledged once every in-sync replica persisted it)."""
    raw_key = parse_key(key, as_hex)
    raw_value = validate_value(decode_arg(value, "VALUE", as_hex), "VALUE")
    result = with_data_client(ctx, lambda c: c.put(zone, raw_key, raw_value), deadline)
    output.emit(
        {"key": key, "index": result.index, "lease_epoch": result.lease_epoch},
        lambda wide: f"put {key}: index {result.index}, lease epoch {result.lease_epoch}",
    )


@data_command("get", click.argument("key"))
def data_get(
    ctx: click.Context, zone: str, key: str, as_hex: bool, deadline: float, output: Output
) -> None:
    """Print KEY's value in ZONE; exit 1 (and "not found" on stderr) when absent."""
    raw_key = parse_key(key, as_hex)
    value = with_data_client(ctx, lambda c: c.get(zone, raw_key), deadline)
    if value is None:
        click.echo(f"placectl: not found: {key} in zone {zone}", err=True)
        sys.exit(1)
    shown = show(value, as_hex)
    output.emit({"key": key, "value": shown}, lambda wide: shown)


@data_command("delete", click.argument("key"))
def data_delete(
    ctx: click.Context, zone: str, key: str, as_hex: bool, deadline: float, output: Output
) -> None:
    """Delete KEY from ZONE (exit 0 also when it did not exist)."""
    raw_key = parse_key(key, as_hex)
    result = with_data_client(ctx, lambda c: c.delete_with_result(zone, raw_key), deadline)
    output.emit(
        {
            "key": key,
            "existed": result.existed,
            "index": result.index,
            "lease_epoch": result.lease_epoch,
        },
        lambda wide: f"deleted {key}" if result.existed else f"{key} did not exist",
    )


@data_command("scan", click.option("--prefix", default="", help="Only keys starting with this."))
def data_scan(
    ctx: click.Context, zone: str, prefix: str, as_hex: bool, deadline: float, output: Output
) -> None:
    """Every key of ZONE (all partitions, in key order) with its value (table: KEY<TAB>VALUE
    lines as they arrive; -o json|yaml: one document once the scan is done)."""
    raw_prefix = decode_arg(prefix, "--prefix", as_hex)

    async def scan(client: DataClient) -> int:
        items: list[dict[str, str]] = []
        async for k, v in client.scan(zone, raw_prefix):
            if output.structured:
                items.append({"key": show(k, as_hex), "value": show(v, as_hex)})
            else:
                click.echo(f"{show(k, as_hex)}\t{show(v, as_hex)}")
        if output.structured:
            found = {"zone": zone, "prefix": prefix, "count": len(items), "items": items}
            output.emit(found, lambda wide: "")
        return len(items)

    with_data_client(ctx, scan, deadline)
