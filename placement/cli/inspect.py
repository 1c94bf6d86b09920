"""``placectl inspect``: decode every metastore key under a prefix, straight from etcd
(read-only). ``-o wide`` adds each key's kind and lease; ``-o json|yaml`` the same data."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from placement.cli.common import Output, output_option, run
from placement.security.credentials import EtcdCredentials
from placement.security.flags import etcd_flags

if TYPE_CHECKING:
    from rich.table import Table


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
@output_option
@etcd_flags
def inspect(
    etcd_endpoints: str, prefix: str, output: Output, etcd_credentials: EtcdCredentials
) -> None:
    """Decode every metastore key under the prefix (read-only)."""
    from placement.metastore.etcd import EtcdClient
    from placement.metastore.keys import KeySpace

    keys = KeySpace(prefix)

    async def read() -> tuple[int, list[dict[str, Any]]]:
        async with EtcdClient(
            etcd_endpoints, call_timeout=3.0, credentials=etcd_credentials
        ) as client:
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
    output.emit(
        {"prefix": prefix, "revision": revision, "keys": rows},
        lambda wide: keys_table(prefix, revision, rows, wide),
    )


def keys_table(
    prefix: str, revision: int, rows: Sequence[Mapping[str, Any]], wide: bool = False
) -> Table:
    """The decoded keys as a table; ``wide`` adds each key's kind and lease."""
    from rich.table import Table

    columns = ["key", *(["kind"] if wide else []), "mod rev", *(["lease"] if wide else [])]
    table = Table(*columns, "value", title=f"{prefix} at revision {revision}")
    for row in rows:
        lease = [str(row["lease"] or "-")] if wide else []
        kind = [row["kind"]] if wide else []
        value = json.dumps(row["value"], sort_keys=True)
        table.add_row(row["key"], *kind, str(row["mod_revision"]), *lease, value)
    return table
