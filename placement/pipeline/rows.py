"""The Parquet tables of an export directory: their schemas, and rows <-> domain values (pure).

Every table is one Parquet file ``<name>.parquet`` in the directory (design/pipeline.md lists the
columns). Rows read back are validated here, for both engines, and problems are reported as
:class:`InvalidInput` naming the table, the row and the column.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from placement.core.model import Peers
from placement.core.names import validate_name
from placement.errors import InvalidInput
from placement.pipeline.snapshot import ClusterSnapshot, parse_snapshot

#: The tables a plan needs; sizes are used when present (schemas: :mod:`.schemas`).
REQUIRED_FOR_PLAN = ("nodes", "zones", "assignments")


def _relocate(error: InvalidInput, table: str) -> InvalidInput:
    """``zones[3].replicas`` (a JSON path) -> ``zones.parquet[3].replicas``."""
    path = error.field
    for name in ("nodes", "zones"):
        if path.startswith(f"{name}["):
            path = f"{table}.parquet" + path[len(name) :]
    return InvalidInput(path, error.problem, error.fix)


def _pairs(value: Any) -> dict[str, str]:
    """A Parquet map as pyarrow returns it (list of pairs) or a dict -> dict."""
    if value is None:
        return {}
    return dict(value.items()) if isinstance(value, dict) else dict(value)


def skeleton(
    node_rows: Iterable[Mapping[str, Any]], zone_rows: Iterable[Mapping[str, Any]]
) -> ClusterSnapshot:
    """Nodes and zone configs (no assignments yet), validated like a JSON snapshot."""
    nodes = [
        {"name": r["name"], "attributes": _pairs(r["attributes"]), "weight": r["weight"]}
        for r in node_rows
    ]
    zones = [
        {
            "name": r["name"],
            "partitions": r["partitions"],
            "replicas": r["replicas"],
            "node_selector": _pairs(r["node_selector"]),
            "failure_domain": r["failure_domain"],
        }
        for r in zone_rows
    ]
    try:
        parsed = parse_snapshot({"nodes": [], "zones": zones})
    except InvalidInput as e:
        raise _relocate(e, "zones") from e
    try:
        with_nodes = parse_snapshot({"nodes": nodes, "zones": []})
    except InvalidInput as e:
        raise _relocate(e, "nodes") from e
    return ClusterSnapshot(with_nodes.nodes, parsed.zones)


def stable_from_rows(
    zone: str,
    partitions: int,
    rows: Iterable[tuple[int, Sequence[str] | None]],
    valid_names: Collection[str] = frozenset(),
) -> dict[int, Peers]:
    """A zone's stable rows ``(partition, peers)`` -> partition -> peers, validated against the
    zone's (current) partition count. Rows with null peers (undecodable in etcd) are unknown and
    skipped: their partition is placed afresh.

    ``valid_names`` (optional) are names already known to be valid node names: only the others
    are checked one by one (the local engine checks the distinct names of the whole table once).
    """
    stable: dict[int, Peers] = {}
    known = valid_names if isinstance(valid_names, (set, frozenset)) else frozenset(valid_names)
    for partition, peers in rows:
        if not 0 <= partition < partitions:
            raise InvalidInput(
                _where(zone, partition),
                f"partition {partition} is not one of zone {zone}'s {partitions} partitions",
                "re-export the cluster or fix the row",
            )
        if partition in stable:
            raise InvalidInput(
                _where(zone, partition), "a second stable row", "keep one stable row per partition"
            )
        if peers is None:
            continue
        names = tuple(map(str, peers))
        if len(set(names)) != len(names) or not known.issuperset(names):
            _check_peers(zone, partition, names)
        stable[partition] = names
    return stable


def _where(zone: str, partition: int) -> str:
    return f"assignments.parquet[zone={zone},partition={partition}]"


def _check_peers(zone: str, partition: int, names: Peers) -> None:
    """Raises :class:`InvalidInput` for the first invalid name of a row, then for a name listed
    twice."""
    for name in names:
        try:
            validate_name(name, "node")
        except InvalidInput as e:
            raise InvalidInput(f"{_where(zone, partition)}.peers", e.problem, e.fix) from e
    if len(set(names)) != len(names):
        raise InvalidInput(
            f"{_where(zone, partition)}.peers", "a node is listed twice", "list each node once"
        )


def snapshot_rows(snapshot: ClusterSnapshot) -> list[dict[str, Any]]:
    """The stable assignments of a JSON snapshot as ``assignments`` rows (field ``stable``)."""
    return [
        {"zone": z.spec.name, "partition": p, "field": "stable", "peers": list(peers)}
        for z in snapshot.zones
        for p, peers in sorted(z.stable.items())
    ]
