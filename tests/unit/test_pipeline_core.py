"""The pipeline's pure core: what-if options, plan pricing and file format, Spark's totals logic,
master URLs, export rows."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.core.model import Node, ZoneSpec
from placement.errors import InvalidInput
from placement.metastore.codec import Assignment, ReplicaSize, encode_assignment, encode_size
from placement.metastore.keys import AssignField, KeySpace
from placement.metastore.kv import EventKind, KeyValue, WatchEvent
from placement.pipeline.engines import FLEET_KINDS, ResultRow, totals_from_sums, zone_rows
from placement.pipeline.export import history_rows, snapshot_tables, write_tables
from placement.pipeline.fleet import ZonePlan, plan_zone, zone_plan_json
from placement.pipeline.fleet import spread as _spread
from placement.pipeline.inputs import PlannedZone, read_stable, read_stable_rows
from placement.pipeline.planning import (
    COUNTER_KINDS,
    FleetTotals,
    PartitionSize,
    Rows,
    ZoneInput,
    bytes_to_move,
    indented_json,
    load_before,
    plan_text_parts,
    plan_zone_input,
    zone_fragment,
    zone_json,
)
from placement.pipeline.rows import skeleton, stable_from_rows
from placement.pipeline.snapshot import ClusterSnapshot, load_snapshot
from placement.pipeline.spark_master import parse_master, probe_master
from placement.pipeline.whatif import (
    WhatIf,
    apply_to_nodes,
    apply_to_spec,
    check_zones,
    parse_whatif,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "snapshot.json"
NODES = (Node("a", {"rack": "1"}), Node("b", {"rack": "2"}), Node("c", {"rack": "3"}))

# -- what-if ------------------------------------------------------------------------------------


# -- oracles: the whole-fleet planner and the totals the Spark engine computes with a group-by


@dataclass(frozen=True, slots=True)
class FleetPlan:
    zones: tuple[ZonePlan, ...]


def plan_fleet(snapshot: ClusterSnapshot) -> FleetPlan:
    """Plans every zone of the snapshot independently (zones never share state)."""
    return FleetPlan(tuple(plan_zone(z, snapshot.nodes) for z in snapshot.zones))


def fleet_plan_json(plan: FleetPlan) -> dict[str, Any]:
    """The plan file's content: per zone assignments and summary, plus fleet totals."""
    total: Counter[str] = Counter()
    for zone in plan.zones:
        total.update(zone.load)
    return {
        "zones": [zone_plan_json(z) for z in plan.zones],
        "summary": {
            "zones": len(plan.zones),
            "moves": sum(z.moves for z in plan.zones),
            "load": dict(sorted(total.items())),
            "spread": _spread(total),
        },
    }


def totals_from_rows(rows: Sequence[ResultRow]) -> FleetTotals:
    """The fleet totals of a set of rows as the Spark engine computes them: a group-by on
    (kind, key — blank for the fleet kinds) summing the values and counting the rows."""
    sums: dict[tuple[str, str], list[int]] = {}
    for row in rows:
        if row.kind in (*FLEET_KINDS, *COUNTER_KINDS):
            group = sums.setdefault((row.kind, "" if row.kind in FLEET_KINDS else row.key), [0, 0])
            group[0] += row.value
            group[1] += 1
    return totals_from_sums((kind, key, v, n) for (kind, key), (v, n) in sums.items())


def test_whatif_parses_and_applies() -> None:
    w = parse_whatif(["d,rack=4,tier=ssd"], ["a"], ["z=5"], ["z=7"])
    assert w.add_nodes == (Node("d", {"rack": "4", "tier": "ssd"}),)
    assert [n.name for n in apply_to_nodes(NODES, w)] == ["b", "c", "d"]
    spec = apply_to_spec(ZoneSpec("z", 4, 3), w)
    assert (spec.partitions, spec.replicas) == (7, 5)
    assert apply_to_spec(ZoneSpec("y", 4, 3), w) == ZoneSpec("y", 4, 3)


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"add_nodes": ["bad name"]}, "--add-node"),
        ({"add_nodes": ["d,rack"]}, "--add-node"),
        ({"set_replicas": ["z"]}, "--set-replicas"),
        ({"set_replicas": ["z=0"]}, "--set-replicas"),
        ({"set_partitions": ["z=70000"]}, "--set-partitions"),
    ],
)
def test_whatif_syntax_errors_name_the_option(kwargs: dict[str, Any], option: str) -> None:
    with pytest.raises(InvalidInput) as e:
        parse_whatif(**kwargs)
    assert e.value.field == option


def test_whatif_unknown_names() -> None:
    with pytest.raises(InvalidInput, match="--remove-node: node 'x' is not in the snapshot"):
        apply_to_nodes(NODES, parse_whatif(remove_nodes=["x"]))
    with pytest.raises(InvalidInput, match="--add-node: node 'a' is already"):
        apply_to_nodes(NODES, parse_whatif(add_nodes=["a"]))
    with pytest.raises(InvalidInput, match="--set-partitions: zone 'q' is not in the snapshot"):
        check_zones(["z"], parse_whatif(set_partitions=["q=3"]))


@given(st.lists(st.sampled_from(["a", "b", "c"]), unique=True))
def test_removing_nodes_keeps_the_others_in_order(removed: list[str]) -> None:
    kept = apply_to_nodes(NODES, WhatIf(remove_nodes=tuple(removed)))
    assert [n.name for n in kept] == [n.name for n in NODES if n.name not in removed]


# -- planning -----------------------------------------------------------------------------------


def test_local_engine_keeps_the_existing_plan_fields() -> None:
    """Without what-if, every field of pipeline.fleet's output is unchanged (compatible)."""
    snapshot = load_snapshot(EXAMPLE)
    old = fleet_plan_json(plan_fleet(snapshot))
    totals = FleetTotals()
    zones = []
    for z in snapshot.zones:
        result = plan_zone_input(ZoneInput(z.spec, z.stable), snapshot.nodes)
        totals.add(result)
        zones.append(json.loads(zone_fragment(result)))
    for new_zone, old_zone in zip(zones, old["zones"], strict=True):
        assert new_zone["assignments"] == old_zone["assignments"]
        assert old_zone["summary"].items() <= new_zone["summary"].items()
    assert old["summary"].items() <= totals.summary().items()


def test_bytes_and_load_before() -> None:
    stable = {0: ("a", "b"), 1: ("b", "c"), 5: ("x",)}
    target = [("a", "c"), ("b", "c"), ("a", "b")]
    assert bytes_to_move(stable, target, {0: 10, 2: 7}) == 10 + 0 + 2 * 7
    spec = ZoneSpec("z", 3, 2, node_selector={"rack": "1"})
    assert load_before(stable, NODES, spec) == {"a": 1, "b": 2, "c": 1, "x": 1}


def test_zone_rows_sum_to_the_local_totals() -> None:
    """What Spark aggregates (rows) equals what the local engine adds up (zone results)."""
    snapshot = load_snapshot(EXAMPLE)
    sizes = {0: PartitionSize(5, 2), 3: PartitionSize(11, 4)}
    # every zone as it is, then re-sharded with sizes (grow and shrink), then without sizes
    inputs = [ZoneInput(z.spec, z.stable, sizes) for z in snapshot.zones]
    for z in snapshot.zones:
        for partitions, known in ((z.spec.partitions * 2, sizes), (3, sizes), (5, {})):
            spec = apply_to_spec(z.spec, WhatIf(set_partitions={z.spec.name: partitions}))
            inputs.append(ZoneInput(spec, z.stable, known, z.spec.partitions))
    totals, rows = FleetTotals(), []
    for i, zin in enumerate(inputs):
        totals.add(plan_zone_input(zin, snapshot.nodes))
        planned = PlannedZone(i, zin.partitions_now or zin.spec.partitions, zin.spec)
        rows += zone_rows(planned, lambda z=zin: z, snapshot.nodes)
    assert totals.summary()["reshard"]["unsized_zones"] == len(snapshot.zones)
    assert totals_from_rows(rows).summary() == totals.summary()
    bad = ZoneInput(ZoneSpec("z", 2, 2, node_selector={"no": "match"}), {})
    (row,) = zone_rows(PlannedZone(7, 2, bad.spec), lambda: bad, NODES)
    assert (row.kind, row.zone_index) == ("error", 7)
    assert row.fragment is not None
    assert "no eligible node" in row.fragment


_json_values = st.recursive(
    st.none() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=60)
@given(
    st.lists(st.dictionaries(st.text(max_size=4), _json_values, max_size=4), max_size=4),
    st.dictionaries(st.text(max_size=4), _json_values, max_size=4),
)
def test_streamed_plan_text_equals_json_dump(
    zones: list[dict[str, Any]], summary: dict[str, Any]
) -> None:
    fragments = [
        "\n".join("  " + line for line in json.dumps(z, indent=1).split("\n")) for z in zones
    ]
    text = "".join(plan_text_parts(iter(fragments), lambda: summary))
    assert text == json.dumps({"zones": zones, "summary": summary}, indent=1) + "\n"


_any_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=4), inner, max_size=4)
        | st.dictionaries(st.text(max_size=3), st.integers(), max_size=4)
        | st.dictionaries(st.integers() | st.booleans() | st.none(), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=200)
@given(_any_json, st.sampled_from(["", " ", "  "]))
def test_indented_json_is_json_dumps_text(value: Any, pad: str) -> None:
    assert indented_json(value, pad) == json.dumps(value, indent=1).replace("\n", "\n" + pad)


@settings(max_examples=200)
@given(
    st.lists(st.lists(st.text(max_size=3), max_size=4).map(tuple), max_size=6)
    | st.integers(0, 4).flatmap(
        lambda w: st.lists(st.lists(st.text(max_size=3), min_size=w, max_size=w).map(tuple))
    ),
    st.sampled_from(["", " ", "   "]),
)
def test_rows_render_as_the_assignments_dict(rows: list[tuple[str, ...]], pad: str) -> None:
    """The plan file's assignments, rendered from the rows (one width: a format string mapped
    over the columns; mixed widths, empty rows, any text) = json.dumps of the dict."""
    want = {str(p): list(peers) for p, peers in enumerate(rows)}
    assert Rows(rows).json(pad) == json.dumps(want, indent=1).replace("\n", "\n" + pad)


def test_zone_fragment_is_the_zone_as_json_dump_prints_it() -> None:
    snapshot = load_snapshot(EXAMPLE)
    whatif = WhatIf(remove_nodes=(snapshot.nodes[0].name,), set_partitions={"orders": 20})
    nodes = apply_to_nodes(snapshot.nodes, whatif)
    for z in snapshot.zones:
        spec = apply_to_spec(z.spec, whatif)
        sizes = {0: PartitionSize(5, 2)}
        result = plan_zone_input(ZoneInput(spec, z.stable, sizes, z.spec.partitions), nodes)
        text = json.dumps(zone_json(result), indent=1)
        assert zone_fragment(result) == "\n".join("  " + line for line in text.split("\n"))


def test_stable_rows_read_by_column_equal_rows_read_one_by_one(tmp_path: Path) -> None:
    rows = [
        ("z", 0, "stable", ["a", "b"]),
        ("y", 1, "stable", ["c"]),
        ("z", 1, "pending", ["a", "c"]),
        ("z", 2, "stable", None),
        ("y", 0, "stable", ["b", "bad name", "a"]),
        ("z", 1, "stable", []),
        ("x", 0, "planned", ["a"]),
    ]
    tables = {
        "assignments": [
            {"zone": z, "partition": p, "field": f, "peers": peers, "epoch": 1, "ts": 0,
             "trigger": 1, "mod_revision": 1}
            for z, p, f, peers in rows
        ]
    }  # fmt: skip
    write_tables(tmp_path / "a", tables, {})
    stable, valid = read_stable(tmp_path / "a")
    expected = {
        "z": [(0, ["a", "b"]), (2, None), (1, [])],
        "y": [(1, ["c"]), (0, ["b", "bad name", "a"])],
    }
    assert stable == expected
    assert valid == {"a", "b", "c"}
    assert read_stable_rows(tmp_path / "a") == expected
    with pytest.raises(InvalidInput, match=r"zone=y,partition=0\]\.peers"):
        stable_from_rows("y", 2, stable["y"], valid)
    # a null inside a list: read row by row (as before: the name "None")
    tables["assignments"][0]["peers"] = ["a", None]
    write_tables(tmp_path / "b", tables, {})
    assert read_stable(tmp_path / "b")[0]["z"][0] == (0, ["a", None])


# -- Parquet rows -------------------------------------------------------------------------------


def test_parquet_rows_are_validated_with_table_paths() -> None:
    zone = {
        "name": "z",
        "partitions": 0,
        "replicas": 1,
        "node_selector": [],
        "failure_domain": None,
    }
    with pytest.raises(InvalidInput, match=r"^zones\.parquet\[0\]\.partitions"):
        skeleton([], [zone])
    node = {"name": "n", "attributes": [("rack", "1")], "weight": -1.0}
    with pytest.raises(InvalidInput, match=r"^nodes\.parquet\[0\]\.weight"):
        skeleton([node], [])
    with pytest.raises(InvalidInput, match=r"assignments\.parquet\[zone=z,partition=3\]"):
        stable_from_rows("z", 3, [(3, ["a"])])
    with pytest.raises(InvalidInput, match="listed twice"):
        stable_from_rows("z", 3, [(1, ["a", "a"])])
    assert stable_from_rows("z", 3, [(1, ["a", "b"]), (2, None)]) == {1: ("a", "b")}


# -- Spark master -------------------------------------------------------------------------------


def test_master_urls() -> None:
    assert parse_master("local[*]").probe == ()
    assert parse_master("spark://h1:7077,h2").probe == (("h1", 7077), ("h2", 7077))
    assert parse_master("k8s://https://api:6443").probe == (("api", 6443),)
    for bad in ("locl", "spark://", "spark://h:99999", "mesos://x"):
        with pytest.raises(InvalidInput, match=r"^--master"):
            parse_master(bad)


def test_probe_fails_with_the_address_and_passes_when_one_answers() -> None:
    attempts: list[tuple[str, int]] = []

    def refuse(address: tuple[str, int], timeout: float) -> object:
        attempts.append(address)
        if address[0] == "up":
            return None
        raise ConnectionRefusedError(111, "Connection refused")

    with pytest.raises(InvalidInput, match=r"--master: Spark master spark://down:1 is unreachable"):
        probe_master(parse_master("spark://down:1"), connect=refuse)
    probe_master(parse_master("spark://down:1,up:2"), connect=refuse)
    assert attempts == [("down", 1), ("down", 1), ("up", 2)]


# -- export rows --------------------------------------------------------------------------------


def _kv(key: bytes, value: bytes, revision: int) -> KeyValue:
    return KeyValue(key, value, revision, revision, 1, 0)


def test_export_rows_from_keys_and_events() -> None:
    keys = KeySpace("/p")
    stable = keys.assign("z", 3, AssignField.STABLE)
    kvs = [
        _kv(stable, encode_assignment(Assignment(("a", "b"), 1, 50, 2)), 10),
        _kv(keys.assign("z", 4, AssignField.STABLE), b"garbage", 11),
        _kv(keys.size("z", 3, "a"), encode_size(ReplicaSize(99, 3, 1)), 12),
        _kv(b"/elsewhere", b"x", 13),
    ]
    tables = snapshot_tables(keys, kvs)
    assert [(r["partition"], r["peers"], r["ts"]) for r in tables["assignments"]] == [
        (3, ["a", "b"], 50),
        (4, None, None),
    ]
    assert tables["sizes"][0]["bytes"] == 99
    put = WatchEvent(
        EventKind.PUT, kvs[0], _kv(stable, encode_assignment(Assignment(("c",), 1, 9, 1)), 5)
    )
    gone = WatchEvent(
        EventKind.DELETE, _kv(keys.assign("z", 3, AssignField.PENDING), b"", 14), None
    )
    trigger = WatchEvent(
        EventKind.PUT, _kv(keys.assign("z", 3, AssignField.TRIGGER), b"t", 10), None
    )
    rows = history_rows(keys, [put, trigger, gone])
    assert [(r["field"], r["event"], r["peers"], r["prev_peers"], r["ts"]) for r in rows] == [
        ("stable", "put", ["a", "b"], ["c"], 50),
        ("pending", "delete", None, None, None),
    ]
