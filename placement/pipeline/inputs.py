"""Reading the plan's input: a snapshot JSON file or an export directory of Parquet tables.

Only the small tables (nodes, zone configs) are read up front, on the driver, for both engines;
they are validated and the what-if options checked against them before any planning starts. The
large ones (assignments, sizes) are read by the engine: whole by the local engine
(:func:`local_zone_inputs`), by Spark's executors for the Spark engine.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from placement.core.model import Node, ZoneSpec
from placement.errors import InvalidInput
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
    (``parquet_dir`` set) they stay in ``assignments.parquet`` until an engine reads them.
    """

    snapshot: ClusterSnapshot
    nodes: tuple[Node, ...]
    zones: tuple[PlannedZone, ...]
    parquet_dir: Path | None = None


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
        missing = [c for c in wanted if c not in schema.names]
        if missing:
            raise InvalidInput(
                f"{name}.parquet",
                f"lacks column(s) {', '.join(missing)}",
                "re-export with `placectl pipeline export`",
            )
        return pq.read_table(path, columns=wanted)
    except (pa.ArrowException, OSError) as e:
        raise InvalidInput(
            "--input", f"{path} is not a readable Parquet file: {e}", _FIX_DIR
        ) from e


def _load_skeleton(directory: Path) -> ClusterSnapshot:
    for name in REQUIRED_FOR_PLAN:
        if not (directory / f"{name}.parquet").exists():
            raise InvalidInput("--input", f"{directory} has no {name}.parquet", _FIX_DIR)
    nodes = read_table(directory, "nodes", ["name", "attributes", "weight"]).to_pylist()
    zones = read_table(
        directory, "zones", ["name", "partitions", "replicas", "node_selector", "failure_domain"]
    ).to_pylist()
    return skeleton(nodes, zones)


def load_plan_input(path: Path, whatif: WhatIf) -> PlanInput:
    """Reads and validates the input and applies the what-if to its nodes and zone configs."""
    if path.is_dir():
        snapshot, parquet_dir = _load_skeleton(path), path
    else:
        snapshot, parquet_dir = load_snapshot(path), None
    nodes = apply_to_nodes(snapshot.nodes, whatif)
    check_zones((z.spec.name for z in snapshot.zones), whatif)
    zones = tuple(
        PlannedZone(i, z.spec.partitions, apply_to_spec(z.spec, whatif))
        for i, z in enumerate(snapshot.zones)
    )
    return PlanInput(snapshot, nodes, zones, parquet_dir)


def _column_rows(table: pa.Table) -> Iterator[tuple[Any, ...]]:
    return zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True)


def read_stable_rows(directory: Path) -> dict[str, list[tuple[int, Sequence[str] | None]]]:
    """zone -> ``(partition, peers)`` of every stable row (local engine)."""
    table = read_table(directory, "assignments", ["zone", "partition", "field", "peers"])
    out: dict[str, list[tuple[int, Sequence[str] | None]]] = defaultdict(list)
    for zone, partition, field, peers in _column_rows(table):
        if field == "stable":
            out[zone].append((partition, peers))
    return out


def read_partition_sizes(directory: Path) -> dict[str, dict[int, PartitionSize]]:
    """zone -> partition -> size: the largest bytes and the largest key count its replicas
    report (:func:`~placement.pipeline.planning.partition_size`); empty without sizes.parquet."""
    if not (directory / "sizes.parquet").exists():
        return {}
    table = read_table(directory, "sizes", ["zone", "partition", "bytes", "keys"])
    replicas: dict[tuple[str, int], list[tuple[int | None, int | None]]] = defaultdict(list)
    for zone, partition, size, keys in _column_rows(table):
        replicas[(zone, partition)].append((size, keys))
    out: dict[str, dict[int, PartitionSize]] = defaultdict(dict)
    for (zone, partition), reports in replicas.items():
        out[zone][partition] = partition_size(reports)
    return out


def zone_input(
    zone: PlannedZone,
    rows: Sequence[tuple[int, Sequence[str] | None]],
    sizes: Mapping[int, PartitionSize],
) -> ZoneInput:
    """The planner's input for one zone from its stable rows (validated) and partition sizes."""
    stable = stable_from_rows(zone.spec.name, zone.partitions_now, rows)
    return ZoneInput(zone.spec, stable, dict(sizes), zone.partitions_now)


def local_zone_inputs(plan_input: PlanInput) -> Iterator[tuple[PlannedZone, ZoneInput]]:
    """Every zone's input, in output order, for the local engine."""
    if plan_input.parquet_dir is None:
        for zone, snap in zip(plan_input.zones, plan_input.snapshot.zones, strict=True):
            yield zone, ZoneInput(zone.spec, snap.stable, {}, zone.partitions_now)
        return
    stable = read_stable_rows(plan_input.parquet_dir)
    sizes = read_partition_sizes(plan_input.parquet_dir)
    for zone in plan_input.zones:
        name = zone.spec.name
        yield zone, zone_input(zone, stable.get(name, []), sizes.get(name, {}))
