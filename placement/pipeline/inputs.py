"""Reading the plan's input: a snapshot JSON file or an export directory of Parquet tables.

Only the small tables (nodes, zone configs) are read up front, on the driver, for both engines;
they are validated and the what-if options checked against them before any planning starts. The
large ones (assignments, sizes) are read by the engine: whole by the local engine
(:func:`local_zone_inputs`), by Spark's executors for the Spark engine.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

from placement.core.model import Node, ZoneSpec
from placement.core.names import is_name
from placement.errors import InvalidInput
from placement.pipeline.locations import Location, local_path
from placement.pipeline.planning import PartitionSize, ZoneInput, partition_size
from placement.pipeline.rows import REQUIRED_FOR_PLAN, skeleton, stable_from_rows
from placement.pipeline.snapshot import ClusterSnapshot, load_snapshot
from placement.pipeline.whatif import WhatIf, apply_to_nodes, apply_to_spec, check_zones

if TYPE_CHECKING:
    import pyarrow as pa

_FIX_DIR = "pass a snapshot JSON file or a directory written by `placectl pipeline export`"


@dataclass(frozen=True, slots=True)
class PlannedZone:
    """A zone as the engines plan it: position in the output, current partition count (stable
    rows are validated against it) and the what-if spec."""

    index: int
    partitions_now: int
    spec: ZoneSpec


@dataclass(frozen=True, slots=True)
class PlanInput:
    """The validated input with the what-if applied to nodes and zone configs.

    ``snapshot`` carries the stable assignments for JSON input; for a Parquet directory
    (``parquet_dir`` set: a local path, or a URI the Spark engine reads) they stay in
    ``assignments.parquet`` until an engine reads them.
    """

    snapshot: ClusterSnapshot
    nodes: tuple[Node, ...]
    zones: tuple[PlannedZone, ...]
    parquet_dir: Location | None = None


def read_table(directory: Path, name: str, columns: Sequence[str] | None = None) -> pa.Table:
    """One table of an export directory, checked for the columns we read (pyarrow is imported
    here, so that planning a JSON snapshot needs no ``pipeline`` extra)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from placement.pipeline.schemas import TABLES

    path = directory / f"{name}.parquet"
    if not path.exists():
        raise InvalidInput("--input", f"{directory} has no {name}.parquet", _FIX_DIR)
    wanted = list(columns) if columns is not None else TABLES[name].names
    try:
        schema = pq.read_schema(path)
        check_columns(name, schema.names, wanted)
        return pq.read_table(path, columns=wanted)
    except (pa.ArrowException, OSError) as e:
        raise InvalidInput(
            "--input", f"{path} is not a readable Parquet file: {e}", _FIX_DIR
        ) from e


def check_columns(name: str, have: Collection[str], wanted: Sequence[str]) -> None:
    """InvalidInput naming the table unless it has every ``wanted`` column."""
    missing = [c for c in wanted if c not in have]
    if missing:
        raise InvalidInput(
            f"{name}.parquet",
            f"lacks column(s) {', '.join(missing)}",
            "re-export with `placectl pipeline export`",
        )


def _load_skeleton(directory: Path) -> ClusterSnapshot:
    for name in REQUIRED_FOR_PLAN:
        if not (directory / f"{name}.parquet").exists():
            raise InvalidInput("--input", f"{directory} has no {name}.parquet", _FIX_DIR)
    nodes = read_table(directory, "nodes", SKELETON_COLUMNS["nodes"]).to_pylist()
    zones = read_table(directory, "zones", SKELETON_COLUMNS["zones"]).to_pylist()
    return skeleton(nodes, zones)


def load_plan_input(path: Path, whatif: WhatIf) -> PlanInput:
    """Reads and validates the input and applies the what-if to its nodes and zone configs."""
    if path.is_dir():
        return plan_input_from(_load_skeleton(path), whatif, path)
    return plan_input_from(load_snapshot(path), whatif, None)


#: The columns of the small tables a plan reads up front.
SKELETON_COLUMNS: Mapping[str, Sequence[str]] = {
    "nodes": ("name", "attributes", "weight"),
    "zones": ("name", "partitions", "replicas", "node_selector", "failure_domain"),
}


def plan_input_from(
    snapshot: ClusterSnapshot, whatif: WhatIf, parquet_dir: Location | None
) -> PlanInput:
    """The plan's input from a validated snapshot (or an export's skeleton, its large tables
    left in ``parquet_dir``), the what-if applied."""
    nodes = apply_to_nodes(snapshot.nodes, whatif)
    check_zones((z.spec.name for z in snapshot.zones), whatif)
    zones = tuple(
        PlannedZone(i, z.spec.partitions, apply_to_spec(z.spec, whatif))
        for i, z in enumerate(snapshot.zones)
    )
    return PlanInput(snapshot, nodes, zones, parquet_dir)


def _column_rows(table: pa.Table) -> Iterator[tuple[Any, ...]]:
    return zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True)


#: zone -> its stable rows ``(partition, peers)``, in table order.
StableRows = dict[str, list[tuple[int, Sequence[str] | None]]]


def read_stable_rows(directory: Path) -> StableRows:
    """zone -> ``(partition, peers)`` of every stable row (local engine)."""
    return read_stable(directory)[0]


def read_stable(directory: Path) -> tuple[StableRows, frozenset[str]]:
    """:func:`read_stable_rows`, and the distinct node names of those rows that are valid names
    (for :func:`~placement.pipeline.rows.stable_from_rows`).

    Columnar: the rows are filtered in Arrow, and the peers' names are dictionary-encoded, so
    each distinct name becomes one Python string (not one per replica) and is validated once.
    A table with nulls where the columnar path does not expect them is read row by row.
    """
    import numpy as np
    import pyarrow.compute as pc

    table = read_table(directory, "assignments", ["zone", "partition", "field", "peers"])
    table = table.filter(pc.equal(table.column("field"), "stable"))
    zone, partition = table.column("zone"), table.column("partition")
    decoded = peer_lists(table.column("peers"))
    if zone.null_count or partition.null_count or decoded is None:
        return _read_stable_by_row(table), frozenset()
    lists, distinct = decoded
    zones = zone.combine_chunks().dictionary_encode()
    zone_names = zones.dictionary.to_pylist()
    codes = zones.indices.to_numpy()
    rows = list(zip(partition.to_pylist(), lists, strict=True))
    grouped: list[list[tuple[int, Sequence[str] | None]]]
    if (np.diff(codes) >= 0).all():  # each zone's rows together: codes are 0, 0, 1, 1, 2, …
        cuts = [0, *(np.flatnonzero(np.diff(codes)) + 1).tolist(), len(rows)]
        grouped = [rows[a:b] for a, b in pairwise(cuts)] if rows else []
    else:
        grouped = [[] for _ in zone_names]
        for z, row in zip(codes.tolist(), rows, strict=True):
            grouped[z].append(row)
    out: StableRows = defaultdict(list)
    out.update((name, group) for name, group in zip(zone_names, grouped, strict=True) if group)
    return out, frozenset(name for name in distinct if is_name(name))


def peer_lists(
    column: pa.ChunkedArray | pa.Array,
) -> tuple[list[Sequence[str] | None], list[str]] | None:
    """A ``peers`` column (list<string>) as Python lists (None for a null list) whose names are
    one string object per distinct name, and those distinct names; None when a name is null
    (read such rows one by one). Dictionary-encoded in Arrow, the usual column (every list of
    the same length) in one reshape."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    peers = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    names = pc.list_flatten(peers)
    if names.null_count:
        return None
    encoded = names.dictionary_encode()
    distinct: list[str] = encoded.dictionary.to_pylist()
    flat = np.asarray(distinct, dtype=object)[encoded.indices.to_numpy()]
    lengths = pc.list_value_length(peers).fill_null(0).to_numpy()
    lists: list[Sequence[str] | None]
    if not peers.null_count and len(lengths) and (lengths == lengths[0]).all() and lengths[0]:
        lists = flat.reshape(len(lengths), int(lengths[0])).tolist()  # the usual: R names each
    else:
        start, lists, names_list = 0, [], flat.tolist()
        present = peers.is_valid().to_numpy(zero_copy_only=False).tolist()
        for end, valid in zip(np.cumsum(lengths).tolist(), present, strict=True):
            lists.append(names_list[start:end] if valid else None)
            start = end
    return lists, distinct


def _read_stable_by_row(table: pa.Table) -> StableRows:
    out: StableRows = defaultdict(list)
    for zone, partition, field, peers in _column_rows(table):
        if field == "stable":
            out[zone].append((partition, peers))
    return out


def read_partition_sizes(directory: Path) -> dict[str, dict[int, PartitionSize]]:
    """zone -> partition -> size: the largest bytes and the largest key count its replicas
    report (:func:`~placement.pipeline.planning.partition_size`); empty without sizes.parquet.

    Aggregated in Arrow (a group-by); a table with null zones or partitions is read row by row.
    """
    if not (directory / "sizes.parquet").exists():
        return {}
    import pyarrow.compute as pc

    table = read_table(directory, "sizes", ["zone", "partition", "bytes", "keys"])
    out: dict[str, dict[int, PartitionSize]] = defaultdict(dict)
    if table.column("zone").null_count or table.column("partition").null_count:
        replicas: dict[tuple[str, int], list[tuple[int | None, int | None]]] = defaultdict(list)
        for zone, partition, size, keys in _column_rows(table):
            replicas[(zone, partition)].append((size, keys))
        for (zone, partition), reports in replicas.items():
            out[zone][partition] = partition_size(reports)
        return out
    # partition_size: the largest report, a null counting 0, and 0 without reports
    largest = table.group_by(["zone", "partition"], use_threads=False).aggregate(
        [("bytes", "max"), ("keys", "max")]
    )
    columns = [largest.column(c) for c in ("zone", "partition", "bytes_max", "keys_max")]
    zones, partitions = columns[0].to_pylist(), columns[1].to_pylist()
    sizes = [pc.max_element_wise(c.fill_null(0), 0).to_pylist() for c in columns[2:]]
    for zone, partition, size, keys in zip(zones, partitions, *sizes, strict=True):
        out[zone][partition] = PartitionSize(size, keys)
    return out


def zone_input(
    zone: PlannedZone,
    rows: Sequence[tuple[int, Sequence[str] | None]],
    sizes: Mapping[int, PartitionSize],
    valid_names: Collection[str] = frozenset(),
) -> ZoneInput:
    """The planner's input for one zone from its stable rows (validated; ``valid_names`` are
    known to be valid node names) and partition sizes."""
    stable = stable_from_rows(zone.spec.name, zone.partitions_now, rows, valid_names)
    return ZoneInput(zone.spec, stable, dict(sizes), zone.partitions_now)


def local_zone_inputs(plan_input: PlanInput) -> Iterator[tuple[PlannedZone, ZoneInput]]:
    """Every zone's input, in output order, for the local engine."""
    if plan_input.parquet_dir is None:
        for zone, snap in zip(plan_input.zones, plan_input.snapshot.zones, strict=True):
            yield zone, ZoneInput(zone.spec, snap.stable, {}, zone.partitions_now)
        return
    directory = local_path(plan_input.parquet_dir, "--input")
    stable, valid_names = read_stable(directory)
    sizes = read_partition_sizes(directory)
    for zone in plan_input.zones:
        name = zone.spec.name
        yield zone, zone_input(zone, stable.pop(name, []), sizes.pop(name, {}), valid_names)
