"""``placectl pipeline export``: the cluster's placement state and assignment history -> Parquet.

The snapshot tables (nodes, zones, assignments, primaries, sizes) are read at **one** etcd
revision; the history is every event on the assignment keys etcd still retains (from its
compaction point up to now, :func:`~.etcd.read_history`). Converting keys and values to
rows is pure (:func:`snapshot_tables`, :func:`history_rows`); undecodable values become rows with
null payload (``peers``) or are skipped, never a crash.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from placement.core.model import ZoneSpec
from placement.metastore.codec import (
    Assignment,
    NodeRecord,
    PrimaryLease,
    ReplicaSize,
    decode_assignment,
    decode_cancel,
    decode_node,
    decode_primary,
    decode_size,
    decode_zone_spec,
    term_until,
)
from placement.metastore.etcd import EtcdClient, read_history
from placement.metastore.keys import AssignField, KeyKind, KeySpace, ParsedKey, prefix_range_end
from placement.metastore.kv import EventKind, KeyValue, WatchEvent
from placement.pipeline.outputs import atomic_directory
from placement.pipeline.schemas import TABLES
from placement.security.credentials import EtcdCredentials

#: Rows per Parquet row group: small enough that Spark splits a big table over its tasks.
ROW_GROUP_SIZE = 65_536

_PEER_FIELDS = (AssignField.STABLE, AssignField.PENDING, AssignField.PLANNED)

#: Told each step of an export once it is done: ``(what was done, steps done, steps in all)``.
Progress = Callable[[str, int, int], None]
#: The snapshot's key ranges, read in this order at one revision.
_SNAPSHOT_RANGES = ("zones", "nodes", "assignments", "primaries", "sizes")
#: Steps of an export: each snapshot range, the history, each table written.
EXPORT_STEPS = len(_SNAPSHOT_RANGES) + 1 + len(TABLES)


def _no_progress(what: str, done: int, total: int) -> None:
    return None


@dataclass(frozen=True, slots=True)
class ExportSummary:
    revision: int
    history_from: int
    history_to: int
    rows: dict[str, int]


def _assignment(raw: bytes, field: AssignField) -> Assignment | None:
    if field not in _PEER_FIELDS:
        return None
    value = decode_assignment(raw)
    return value if isinstance(value, Assignment) else None


def _plain(value: Any) -> Any:
    """A value as Parquet takes it: mappings as dicts, tuples as lists."""
    if isinstance(value, Mapping):
        return dict(value)
    return list(value) if isinstance(value, tuple) else value


def _row(table: str, columns: Mapping[str, Any], value: object | None) -> dict[str, Any]:
    """A row of ``table``: ``columns`` (taken from the key), every other column of its schema
    from ``value``'s attribute of the same name (null when ``value`` is None)."""
    row = dict(columns)
    for name in TABLES[table].names:
        if name not in row:
            row[name] = None if value is None else _plain(getattr(value, name))
    return row


def _snapshot_row(
    parsed: ParsedKey, kv: KeyValue, terms: Mapping[str, int]
) -> tuple[str, dict[str, Any]] | None:
    """The table and row of one key of the snapshot, or None (another key, or undecodable); a
    primary lease's ``expiry`` is when it ends with its holder's term (``terms``: node ->
    until)."""
    revision = {"mod_revision": kv.mod_revision}
    of_partition = {"zone": parsed.name, "partition": parsed.partition}
    if parsed.kind is KeyKind.NODE:
        node = decode_node(kv.value)
        if isinstance(node, NodeRecord):
            return "nodes", _row("nodes", {"name": parsed.name, **revision}, node)
    elif parsed.kind is KeyKind.ZONE:
        spec = decode_zone_spec(kv.value)
        if isinstance(spec, ZoneSpec):
            return "zones", _row("zones", revision, spec)
    elif parsed.kind is KeyKind.ASSIGN and parsed.field in _PEER_FIELDS:
        value = _assignment(kv.value, parsed.field)
        columns = {**of_partition, "field": parsed.field.value, **revision}
        return "assignments", _row("assignments", columns, value)
    elif parsed.kind is KeyKind.PRIMARY:
        lease = decode_primary(kv.value)
        if isinstance(lease, PrimaryLease):
            ends = replace(lease, expiry=lease.until(terms.get(lease.node, 0)))
            return "primaries", _row("primaries", {**of_partition, **revision}, ends)
    elif parsed.kind is KeyKind.SIZES:
        size = decode_size(kv.value)
        if isinstance(size, ReplicaSize):
            return "sizes", _row("sizes", {**of_partition, "node": parsed.node}, size)
    return None


def snapshot_tables(keys: KeySpace, kvs: Iterable[KeyValue]) -> dict[str, list[dict[str, Any]]]:
    """Rows of the nodes, zones, assignments, primaries and sizes tables from keys read at one
    revision (any key of the prefix may be passed; others are ignored)."""
    tables: dict[str, list[dict[str, Any]]] = {
        "nodes": [],
        "zones": [],
        "assignments": [],
        "primaries": [],
        "sizes": [],
    }
    parsed_kvs = [(keys.parse(kv.key), kv) for kv in kvs]
    terms = {
        parsed.name: until
        for parsed, kv in parsed_kvs
        if parsed is not None
        and parsed.kind is KeyKind.TERM
        and (until := term_until(kv.value)) is not None
    }
    for parsed, kv in parsed_kvs:
        found = _snapshot_row(parsed, kv, terms) if parsed is not None else None
        if found is not None:
            table, row = found
            tables[table].append(row)
    return tables


def _value_ts(raw: bytes, field: AssignField) -> tuple[int | None, int | None]:
    """``(ts, epoch)`` of a stored assignment or cancel value, when it decodes."""
    decoded: Any = decode_cancel(raw) if field is AssignField.CANCEL else _assignment(raw, field)
    if decoded is None or not hasattr(decoded, "ts"):
        return None, None
    return decoded.ts, decoded.epoch


def history_rows(keys: KeySpace, events: Iterable[WatchEvent]) -> list[dict[str, Any]]:
    """One row per event on a stable/pending/planned/cancel key (trigger keys are left out: the
    pending/planned writes they guard carry the same revision)."""
    rows: list[dict[str, Any]] = []
    for event in events:
        parsed = keys.parse(event.kv.key)
        if parsed is None or parsed.kind is not KeyKind.ASSIGN or parsed.field is None:
            continue
        if parsed.field is AssignField.TRIGGER:
            continue
        put = event.kind is EventKind.PUT
        value = _assignment(event.kv.value, parsed.field) if put else None
        prev = _assignment(event.prev_kv.value, parsed.field) if event.prev_kv else None
        ts, epoch = _value_ts(event.kv.value, parsed.field) if put else (None, None)
        rows.append(
            {
                "revision": event.kv.mod_revision,
                "zone": parsed.name,
                "partition": parsed.partition,
                "field": parsed.field.value,
                "event": "put" if put else "delete",
                "peers": list(value.peers) if value else None,
                "prev_peers": list(prev.peers) if prev else None,
                "ts": ts,
                "epoch": epoch,
            }
        )
    return rows


async def read_export(
    client: EtcdClient, keys: KeySpace, progress: Progress = _no_progress
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, int]]:
    """Reads the snapshot at one revision and the retained history of the assignment keys."""
    first = await client.list_prefix(keys.zones_prefix())
    revision = first.revision
    kvs = list(first.kvs)
    progress(f"read {_SNAPSHOT_RANGES[0]}", 1, EXPORT_STEPS)
    for n, prefix in enumerate(
        (keys.nodes_prefix(), keys.assign_prefix(), keys.primary_prefix(), keys.sizes_prefix()), 2
    ):
        kvs.extend((await client.list_prefix(prefix, revision=revision)).kvs)
        progress(f"read {_SNAPSHOT_RANGES[n - 1]}", n, EXPORT_STEPS)
    tables = snapshot_tables(keys, kvs)
    assign = keys.assign_prefix()
    history = await read_history(client, assign, prefix_range_end(assign))
    tables["history"] = history_rows(keys, history.events)
    progress("read history", len(_SNAPSHOT_RANGES) + 1, EXPORT_STEPS)
    meta = {
        "revision": revision,
        "history_from": history.from_revision,
        "history_to": history.to_revision,
    }
    return tables, meta


def write_parquet(path: Path, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, row_group_size=ROW_GROUP_SIZE)


def write_tables(
    out: Path,
    tables: Mapping[str, list[dict[str, Any]]],
    meta: Mapping[str, Any],
    progress: Progress = _no_progress,
) -> None:
    """An export directory: ``<table>.parquet`` for every table, plus ``meta.json``."""
    done = EXPORT_STEPS - len(TABLES)
    with atomic_directory(out, "--out") as tmp:
        for name, rows in tables.items():
            write_parquet(tmp / f"{name}.parquet", rows, TABLES[name])
            done += 1
            progress(f"wrote {name}.parquet", done, EXPORT_STEPS)
        (tmp / "meta.json").write_text(json.dumps(dict(meta), indent=1, sort_keys=True) + "\n")


async def export(
    endpoints: str,
    prefix: str,
    out: Path,
    credentials: EtcdCredentials | None = None,
    progress: Progress = _no_progress,
) -> ExportSummary:
    """``placectl pipeline export``: read everything first, then write the directory atomically;
    ``progress`` is told of every step (:data:`EXPORT_STEPS` in all)."""
    keys = KeySpace(prefix)
    async with EtcdClient(endpoints, credentials=credentials) as client:
        tables, meta = await read_export(client, keys, progress)
    write_tables(out, tables, {**meta, "prefix": prefix}, progress)
    return ExportSummary(
        revision=meta["revision"],
        history_from=meta["history_from"],
        history_to=meta["history_to"],
        rows={name: len(rows) for name, rows in tables.items()},
    )
