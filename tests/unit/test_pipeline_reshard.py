"""The what-if ``--set-partitions``: the keys and bytes a reshard would move, from the sizes agents
report (design/resharding.md, "The layout and its generation"; design/formats.md, "Plan")."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli_plan import placectl

from placement.algo.place import place
from placement.core.layout import Moves
from placement.core.model import Node, ZoneSpec
from placement.data.partitioning import CONTROL_PREFIX, key_moves, partition_of
from placement.pipeline.export import write_tables
from placement.pipeline.inputs import read_partition_sizes
from placement.pipeline.planning import (
    FleetTotals,
    PartitionSize,
    ReshardEstimate,
    ZoneInput,
    partition_size,
    plan_zone_input,
    reshard_estimate,
    reshard_line,
    zone_json,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "snapshot.json"
NODES = (Node("n1", {"rack": "1"}), Node("n2", {"rack": "2"}), Node("n3", {"rack": "3"}))


def _sizes(keys: list[bytes], value_size: dict[bytes, int], partitions: int) -> dict[int, Any]:
    """partition -> PartitionSize of ``keys`` (with their values' sizes) under ``partitions``."""
    counts: dict[int, list[int]] = {}
    for k in keys:
        c = counts.setdefault(partition_of(k, partitions), [0, 0])
        c[0] += value_size[k]
        c[1] += 1
    return {p: PartitionSize(b, n) for p, (b, n) in counts.items()}


# -- the pure computation -----------------------------------------------------------------------


def test_moved_takes_the_share_of_every_source_for_a_grow_and_the_removed_for_a_shrink() -> None:
    amounts = {0: 100, 1: 60, 2: 40, 3: 7, 9: 1000}  # 9 is no partition under 4 or 8: ignored
    assert Moves(4, 8).moved(amounts) == (100 + 60 + 40 + 7) // 2
    assert Moves(4, 6).moved(amounts) == 207 * 2 // 6  # 69: rounded down
    assert Moves(4, 3).moved(amounts) == 7
    assert Moves(4, 1).moved(amounts) == 60 + 40 + 7
    assert Moves(4, 4).moved(amounts) == 0


def test_partition_size_is_the_largest_replica_report_of_each() -> None:
    assert partition_size([(10, 3), (12, 1), (None, 5)]) == PartitionSize(12, 5)
    assert partition_size([(None, None)]) == PartitionSize(0, 0)
    assert partition_size([]) == PartitionSize(0, 0)


def test_estimate_of_a_grow_a_shrink_and_unknown_sizes() -> None:
    sizes = {p: PartitionSize(1000 * (p + 1), 10 * (p + 1)) for p in range(4)}
    assert reshard_estimate(4, 4, sizes) is None
    assert reshard_estimate(4, 8, sizes) == ReshardEstimate(4, 8, keys=50, bytes=5000)
    assert reshard_estimate(4, 2, sizes) == ReshardEstimate(4, 2, keys=70, bytes=7000)
    assert reshard_estimate(4, 8, {}) == ReshardEstimate(4, 8, None, None)
    # a shrink's sources are the removed partitions: sizes of the kept ones say nothing
    only_kept = {p: sizes[p] for p in (0, 1)}
    assert reshard_estimate(4, 2, only_kept) == ReshardEstimate(4, 2, None, None)
    # sizes of partitions the layout does not have (left over) are not counted
    assert reshard_estimate(4, 2, {**sizes, 7: PartitionSize(10**9, 10**6)}) == (
        ReshardEstimate(4, 2, keys=70, bytes=7000)
    )


@settings(max_examples=40, deadline=None)
@given(
    old=st.integers(1, 40),
    extra=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_grow_estimate_matches_the_keys_that_move(old: int, extra: int, seed: int) -> None:
    """On 3,000 random keys (random value sizes), the estimate from per-partition sizes is within
    6 standard deviations of what ``key_moves`` moves: each key moves with probability
    (P'-P)/P', from whatever source partition, so the count is binomial."""
    new = old + extra
    rng = random.Random(seed)
    keys = [rng.randbytes(12) for _ in range(3000)]
    value_size = {k: rng.randint(1, 500) for k in keys}
    estimate = reshard_estimate(old, new, _sizes(keys, value_size, old))
    assert estimate is not None
    assert estimate.keys is not None
    assert estimate.bytes is not None
    moved = [k for k in keys if key_moves(k, old, new) is not None]
    f = extra / new
    sigma_keys = math.sqrt(len(keys) * f * (1 - f))
    sigma_bytes = math.sqrt(sum(s * s for s in value_size.values()) * f * (1 - f))
    assert abs(estimate.keys - len(moved)) <= 6 * sigma_keys + 1, (estimate, len(moved))
    moved_bytes = sum(value_size[k] for k in moved)
    assert abs(estimate.bytes - moved_bytes) <= 6 * sigma_bytes + 500, (estimate, moved_bytes)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.binary(min_size=1, max_size=16).filter(lambda k: not k.startswith(CONTROL_PREFIX)),
        unique=True,
        max_size=300,
    ),
    st.integers(2, 64),
    st.data(),
)
def test_a_shrink_estimate_is_exactly_the_keys_that_move(
    keys: list[bytes], old: int, data: st.DataObject
) -> None:
    new = data.draw(st.integers(1, old - 1), label="new")
    value_size = {k: len(k) * 3 + 1 for k in keys}
    estimate = reshard_estimate(old, new, _sizes(keys, value_size, old))
    moved = [k for k in keys if key_moves(k, old, new) is not None]
    assert estimate is not None
    if not any(partition_of(k, old) >= new for k in keys):
        # no key in a removed partition: no size either, so unknown (not 0)
        assert (estimate.keys, estimate.bytes) == (None, None)
        assert not moved
    else:
        assert estimate.keys == len(moved)
        assert estimate.bytes == sum(value_size[k] for k in moved)


def test_the_zone_summary_has_reshard_only_when_the_count_changes() -> None:
    spec = ZoneSpec("z", 4, 2)
    stable = dict(enumerate(place(spec, NODES).assignments))
    sizes = {p: PartitionSize(100, 10) for p in range(4)}
    same = zone_json(plan_zone_input(ZoneInput(spec, stable, sizes), NODES))
    assert "reshard" not in same["summary"]
    grown = ZoneInput(ZoneSpec("z", 8, 2), stable, sizes, partitions_now=4)
    summary = zone_json(plan_zone_input(grown, NODES))["summary"]
    assert summary["reshard"] == {"from": 4, "to": 8, "keys": 20, "bytes": 200}
    assert list(summary)[-1] == "reshard"  # after the existing fields, which keep their order


def test_fleet_totals_and_the_cli_line() -> None:
    spec = ZoneSpec("z", 4, 2)
    stable = dict(enumerate(place(spec, NODES).assignments))
    sizes = {p: PartitionSize(100, 10) for p in range(4)}
    totals = FleetTotals()
    totals.add(plan_zone_input(ZoneInput(spec, stable, sizes), NODES))
    assert "reshard" not in totals.summary()
    assert reshard_line(totals.summary()) is None

    totals.add(plan_zone_input(ZoneInput(ZoneSpec("z", 1, 2), stable, {}, 4), NODES))
    assert totals.summary()["reshard"] == {
        "zones": 1,
        "keys": None,
        "bytes": None,
        "unsized_zones": 1,
    }
    line = reshard_line(totals.summary())
    assert line is not None
    assert "unknown: no partition sizes reported" in line

    totals.add(plan_zone_input(ZoneInput(ZoneSpec("z", 2, 2), stable, sizes, 4), NODES))
    assert totals.summary()["reshard"] == {
        "zones": 2,
        "keys": 20,
        "bytes": 200,
        "unsized_zones": 1,
    }
    assert reshard_line(totals.summary()) == (
        "reshard of 2 zone(s): 20 key(s), 200 byte(s) to move between partitions (estimated "
        "from the reported sizes; 1 zone(s) without sizes are not counted)"
    )


def test_read_partition_sizes_keeps_keys_too(tmp_path: Path) -> None:
    rows = [
        {"zone": "z", "partition": 0, "node": "n1", "bytes": 10, "keys": 4},
        {"zone": "z", "partition": 0, "node": "n2", "bytes": 12, "keys": 3},
        {"zone": "z", "partition": 1, "node": "n1", "bytes": None, "keys": None},
        {"zone": "y", "partition": 0, "node": "n1", "bytes": 5, "keys": 1},
    ]
    write_tables(tmp_path / "x", {"sizes": rows}, {})
    assert read_partition_sizes(tmp_path / "x") == {
        "z": {0: PartitionSize(12, 4), 1: PartitionSize(0, 0)},
        "y": {0: PartitionSize(5, 1)},
    }


# -- placectl plan ------------------------------------------------------------------------------


def _export_dir(path: Path) -> Path:
    """An export directory of two zones (z: 4 partitions, y: 4) on three nodes, with sizes: per
    partition p of z the largest replica reports bytes 1000(p+1)+1 and keys 10(p+1), of y 100 and
    1 (each from a different replica, so they are two maxima)."""
    tables: dict[str, list[dict[str, Any]]] = {
        "nodes": [
            {"name": n.name, "address": "x:1", "attributes": dict(n.attributes), "weight": 1.0}
            for n in NODES
        ],
        "zones": [],
        "assignments": [],
        "sizes": [],
    }
    for name in ("z", "y"):
        spec = ZoneSpec(name, 4, 2, failure_domain="rack")
        tables["zones"].append(
            {"name": name, "partitions": 4, "replicas": 2, "node_selector": {},
             "failure_domain": "rack", "scale_up_delay": 0.0, "scale_down_delay": 0.0}
        )  # fmt: skip
        for p, peers in enumerate(place(spec, NODES).assignments):
            tables["assignments"].append(
                {"zone": name, "partition": p, "field": "stable", "peers": list(peers)}
            )
            for k, node in enumerate(peers):  # k = 0, 1
                size, keys = (1000 * (p + 1) + k, 10 * (p + 1) - k) if name == "z" else (99 + k, 1)
                tables["sizes"].append(
                    {"zone": name, "partition": p, "node": node, "bytes": size, "keys": keys}
                )
    write_tables(path, tables, {})
    return path


def test_plan_of_an_export_reports_the_keys_and_bytes_a_reshard_moves(tmp_path: Path) -> None:
    export = _export_dir(tmp_path / "export")
    out = tmp_path / "plan.json"
    result = placectl(
        "plan", "--input", str(export), "--output", str(out),
        "--set-partitions", "z=6", "--set-partitions", "y=3",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    plan = json.loads(out.read_text())
    z, y = (zone["summary"] for zone in plan["zones"])
    # grow 4 -> 6: a third of every partition's keys and bytes (rounded down)
    z_bytes, z_keys = sum(1000 * (p + 1) + 1 for p in range(4)), sum(10 * (p + 1) for p in range(4))
    assert z["reshard"] == {"from": 4, "to": 6, "keys": z_keys // 3, "bytes": z_bytes // 3}
    assert (z_keys // 3, z_bytes // 3) == (33, 3334)
    # shrink 4 -> 3: all of partition 3's
    assert y["reshard"] == {"from": 4, "to": 3, "keys": 1, "bytes": 100}
    assert plan["summary"]["reshard"] == {
        "zones": 2,
        "keys": 34,
        "bytes": 3434,
        "unsized_zones": 0,
    }
    # the replica movement figures are there as before
    assert plan["summary"]["bytes_to_move"] == z["bytes_to_move"] + y["bytes_to_move"] > 0
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == (
        "reshard of 2 zone(s): 34 key(s), 3434 byte(s) to move between partitions "
        "(estimated from the reported sizes)"
    )


def test_plan_without_sizes_says_the_reshard_is_unknown(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    result = placectl(
        "plan", "--input", str(EXAMPLE), "--output", str(out), "--set-partitions", "orders=20"
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads(out.read_text())
    orders, sessions = (zone["summary"] for zone in plan["zones"])
    assert orders["reshard"] == {"from": 12, "to": 20, "keys": None, "bytes": None}
    assert "reshard" not in sessions
    assert plan["summary"]["reshard"]["keys"] is None
    assert "keys and bytes to move unknown: no partition sizes reported" in result.stdout
