"""The Spark engine on a real local Spark (``local[2]``): byte-identical plans to the local engine
for JSON and Parquet input, with every what-if option; bad rows found by the executors."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from test_pipeline_export import write_known_history

from placement.algo.place import place
from placement.cli.plan import run_plan
from placement.core.model import Node, ZoneSpec
from placement.errors import InvalidInput
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeySpace
from placement.pipeline.export import export, write_tables
from placement.pipeline.schemas import ASSIGNMENTS
from placement.pipeline.spark_progress import StageProgress, StageWatcher

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "snapshot.json"


def _both(input_path: Path, tmp_path: Path, **options: Any) -> tuple[str, dict[str, Any]]:
    """Plans with both engines; asserts identical bytes; returns the text and the plan."""
    local, spark = tmp_path / "local.json", tmp_path / "spark.json"
    run_plan(input_path, local, engine="local", **options)
    run_plan(input_path, spark, engine="spark", master="local[2]", **options)
    text = local.read_text()
    assert spark.read_text() == text
    return text, json.loads(text)


def test_engines_agree_on_json_input_with_what_ifs(spark: SparkSession, tmp_path: Path) -> None:
    _both(EXAMPLE, tmp_path)
    whatif = {
        "remove_nodes": ["node-a2"],
        "add_nodes": ["node-d1,rack=d,tier=ssd", "node-d2,rack=d,tier=hdd"],
        "set_replicas": ["orders=2", "sessions=3"],
        "set_partitions": ["orders=20"],
    }
    _, plan = _both(EXAMPLE, tmp_path, **whatif)
    orders, sessions = plan["zones"]
    assert len(orders["assignments"]) == 20
    assert {len(p) for p in orders["assignments"].values()} == {2}
    assert {len(p) for p in sessions["assignments"].values()} == {3}
    assert "node-a2" not in plan["summary"]["load"]
    assert "node-a2" in plan["summary"]["load_before"]
    assert plan["summary"]["load"]["node-d1"] > 0
    # a JSON snapshot has no sizes: the reshard's keys and bytes are unknown, not 0
    assert orders["summary"]["reshard"] == {"from": 12, "to": 20, "keys": None, "bytes": None}
    assert "reshard" not in sessions["summary"]
    assert plan["summary"]["reshard"] == {
        "zones": 1,
        "keys": None,
        "bytes": None,
        "unsized_zones": 1,
    }


def _fleet_dir(path: Path, zones: int = 6, partitions: int = 16) -> Path:
    """An export-format directory: balanced stable from place(), sizes of every replica
    (partition p's largest: 1000p+2 bytes, 10p+2 keys)."""
    nodes = [Node(f"n{i:02d}", {"rack": f"r{i % 4}"}) for i in range(10)]
    tables: dict[str, list[dict[str, Any]]] = {
        "nodes": [
            {"name": n.name, "address": "x:1", "attributes": dict(n.attributes), "weight": 1.0}
            for n in nodes
        ],
        "zones": [],
        "assignments": [],
        "sizes": [],
        "primaries": [],
        "history": [],
    }
    for z in range(zones):
        spec = ZoneSpec(f"z{z}", partitions, 3, failure_domain="rack" if z % 2 else None)
        tables["zones"].append(
            {"name": spec.name, "partitions": partitions, "replicas": 3, "node_selector": {},
             "failure_domain": spec.failure_domain, "scale_up_delay": 0.0, "scale_down_delay": 0.0}
        )  # fmt: skip
        for p, peers in enumerate(place(spec, nodes).assignments):
            tables["assignments"].append(
                {"zone": spec.name, "partition": p, "field": "stable", "peers": list(peers)}
            )
            for k, node in enumerate(peers):
                tables["sizes"].append(
                    {"zone": spec.name, "partition": p, "node": node, "bytes": 1000 * p + k,
                     "keys": 10 * p + 2 - k}
                )  # fmt: skip
    write_tables(path, tables, {})
    return path


def test_engines_agree_on_parquet_input_with_sizes(spark: SparkSession, tmp_path: Path) -> None:
    fleet = _fleet_dir(tmp_path / "fleet")
    _, plan = _both(fleet, tmp_path, remove_nodes=["n03"], set_partitions=["z1=24", "z3=10"])
    for zone in plan["zones"]:
        summary = zone["summary"]
        assert "n03" not in summary["load"]
        assert summary["bytes_to_move"] > 0
        if "domain_load" not in summary or not summary["domain_load"]:
            # no failure domain: removing a node moves exactly its replicas
            assert summary["moves"] == summary["load_before"]["n03"]
    assert plan["summary"]["bytes_to_move"] == sum(
        z["summary"]["bytes_to_move"] for z in plan["zones"]
    )
    # the reshard figures (Spark's equal the local engine's: the files are identical): a grow
    # 16 -> 24 moves a third of every partition's keys and bytes, a shrink 16 -> 10 all of
    # partitions 10..15's
    reshards = {z["name"]: z["summary"].get("reshard") for z in plan["zones"]}
    grow_keys, grow_bytes = sum(10 * p + 2 for p in range(16)), sum(1000 * p + 2 for p in range(16))
    shrink_keys = sum(10 * p + 2 for p in range(10, 16))
    shrink_bytes = sum(1000 * p + 2 for p in range(10, 16))
    assert reshards == {
        "z0": None,
        "z1": {"from": 16, "to": 24, "keys": grow_keys // 3, "bytes": grow_bytes // 3},
        "z2": None,
        "z3": {"from": 16, "to": 10, "keys": shrink_keys, "bytes": shrink_bytes},
        "z4": None,
        "z5": None,
    }
    assert plan["summary"]["reshard"] == {
        "zones": 2,
        "keys": grow_keys // 3 + shrink_keys,
        "bytes": grow_bytes // 3 + shrink_bytes,
        "unsized_zones": 0,
    }


def test_bad_row_found_by_either_engine(spark: SparkSession, tmp_path: Path) -> None:
    fleet = _fleet_dir(tmp_path / "fleet", zones=2, partitions=4)
    table = pq.read_table(fleet / "assignments.parquet").to_pylist()
    table[5]["partition"] = 40

    pq.write_table(pa.Table.from_pylist(table, schema=ASSIGNMENTS), fleet / "assignments.parquet")
    for engine in ("local", "spark"):
        out = tmp_path / f"{engine}.json"
        with pytest.raises(InvalidInput, match=r"assignments\.parquet\[zone=z1,partition=40\]"):
            run_plan(fleet, out, engine=engine)
        assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet"]


async def test_export_then_plan_on_spark(
    spark: SparkSession, client: EtcdClient, keys: KeySpace, prefix: str, tmp_path: Path
) -> None:
    await write_known_history(client, keys)
    await export(client.endpoints[0], prefix, tmp_path / "export")
    _, plan = _both(tmp_path / "export", tmp_path, remove_nodes=["n3"])
    orders = {z["name"]: z for z in plan["zones"]}["orders"]["summary"]
    # orders: stable p0 = n1,n3 (size 150), p1 = n2,n3 (size 70); n3 leaves -> one new replica
    # of each partition
    assert (orders["moves"], orders["bytes_to_move"]) == (2, 220)


def test_stage_watcher_reads_the_real_status_tracker(spark: SparkSession, tmp_path: Path) -> None:
    """``placectl plan --engine spark``'s bars come from Spark's own status tracker: a stage of
    six half-second tasks on two cores is seen running (its task counts read), then done."""
    seen: list[list[StageProgress]] = []
    with StageWatcher(spark.sparkContext.statusTracker(), seen.append, interval=0.05):
        # a lambda: pickled by value (the workers cannot import this test module)
        slow = spark.sparkContext.parallelize(range(6), 6).map(lambda x: time.sleep(0.5) or x)
        assert slow.count() == 6
    stages = [s for poll in seen for s in poll]
    assert stages, "no active stage seen"
    assert {s.tasks for s in stages} == {6}
    done = [s.completed for s in stages]
    # (how many are seen done depends on how late Spark's listener bus runs on a busy machine)
    assert done == sorted(done)
    assert all(0 <= n <= 6 for n in done)
    assert all("count" in s.name for s in stages), stages[0].name
    assert seen[-1] == []  # polled once more on the way out

    reports: list[list[StageProgress]] = []
    run_plan(EXAMPLE, tmp_path / "plan.json", engine="spark", master="local[2]",
             stages=lambda found: reports.append(list(found)))  # fmt: skip
    assert reports[-1] == []  # the plan ran under a watcher reporting to ``stages``


def test_a_uri_output_replaces_the_old_one_whole_or_not_at_all(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``HadoopFs`` writes (design/pipeline.md, "Storage"): a new plan replaces the old one; a
    plan that fails half-way leaves the old one as it was and no temporary; a directory
    replaces a directory; a target with no parent or in a missing directory is one line."""
    from placement.pipeline.hadoop_fs import HadoopFs

    fs = HadoopFs(spark)
    target = tmp_path / "plan.json"
    target.write_text("old plan")
    fs.write_text_parts(target.as_uri(), "--output", ["new ", "plan" * 2_000_000])
    assert target.read_text() == "new " + "plan" * 2_000_000
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]

    def failing() -> Iterator[str]:
        yield "half a plan" * 1_000_000
        raise InvalidInput("--set-replicas", "a bad zone found late")

    with pytest.raises(InvalidInput, match="a bad zone found late"):
        fs.write_text_parts(target.as_uri(), "--output", failing())
    assert target.read_text().startswith("new plan")
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]

    report = tmp_path / "report"
    report.mkdir()
    (report / "old.txt").write_text("old")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "report.json").write_text("{}")
    fs.put_directory(fresh, report.as_uri(), "--out")
    assert [p.name for p in report.iterdir()] == ["report.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh", "plan.json", "report"]
    with pytest.raises(InvalidInput, match="--output: directory file:/no/such/dir does not"):
        fs.write_text_parts("file:///no/such/dir/plan.json", "--output", ["x"])
    with pytest.raises(InvalidInput, match=r"--out: .* is a file"):
        fs.put_directory(fresh, target.as_uri(), "--out")
