"""``placectl pipeline report --engine spark`` on a real local Spark (``local[2]``): the same
report.json and rebalances.csv as the local engine, for the known history written through etcd and
for a large generated one; bad input is one line, exit 2, nothing written."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from test_pipeline_export import write_known_history

from placement.cli.pipeline import run_report
from placement.errors import InvalidInput
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeySpace
from placement.pipeline.export import export, write_tables
from placement.pipeline.schemas import HISTORY

ROOT = Path(__file__).resolve().parents[2]


def placectl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "placement", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
    )


def _same_report(local: Path, spark: Path) -> dict[str, Any]:
    """Asserts both engines' report.json and rebalances.csv are identical; returns the numbers."""
    text = (local / "report.json").read_text()
    numbers: dict[str, Any] = json.loads(text)
    other = json.loads((spark / "report.json").read_text())
    assert json.dumps(other, sort_keys=True) == json.dumps(numbers, sort_keys=True)
    assert (spark / "report.json").read_text() == text
    csv = (local / "rebalances.csv").read_text()
    assert (spark / "rebalances.csv").read_text() == csv
    assert csv.count("\n") == numbers["totals"]["rebalances"] + 1
    for name in ("report.html", "plots/skew_over_time.png"):
        assert (spark / name).stat().st_size > 1000
    return numbers


def _both(export_dir: Path, tmp_path: Path) -> dict[str, Any]:
    local, spark = tmp_path / "local", tmp_path / "spark"
    seen: list[int] = []
    totals = run_report(export_dir, local, engine="local")
    spark_totals = run_report(
        export_dir, spark, engine="spark", master="local[2]",
        stages=lambda found: seen.append(len(found)),
    )  # fmt: skip
    assert spark_totals == totals
    assert seen  # ran under a StageWatcher reporting to ``stages``
    return _same_report(local, spark)


async def test_known_history_both_engines_and_the_cli(
    spark: SparkSession, client: EtcdClient, keys: KeySpace, prefix: str, tmp_path: Path
) -> None:
    await write_known_history(client, keys)
    await export(client.endpoints[0], prefix, tmp_path / "export")
    numbers = _both(tmp_path / "export", tmp_path)
    orders, carts = numbers["zones"]["orders"], numbers["zones"]["carts"]
    assert orders["outcomes"] == {"done": 1, "in_progress": 1}
    assert (orders["bytes_moved"], orders["bytes_to_move"]) == (150, 70)
    assert (carts["outcomes"], carts["duration_s"]["mean"]) == ({"done": 2}, 0.75)
    assert numbers["load_after"] == {"n1": 1, "n2": 1, "n3": 3}
    assert numbers["skew"][-1]["spread"] == 2
    # the command line, in a process of its own (its own Spark), says the same
    out = tmp_path / "cli"
    result = placectl(
        "pipeline", "report", "--input", str(tmp_path / "export"), "--out", str(out),
        "--engine", "spark", "--master", "local[2]",
        "--spark-conf", "spark.sql.shuffle.partitions=3", "-o", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["rebalances"] == 4
    _same_report(tmp_path / "local", out)


def _generated_export(path: Path, seed: int = 17) -> Path:
    """A fleet's history as the exporter writes it: 5 zones (two created, one dropped inside the
    history), ~300 partitions, rebalances done (finished in batches: one revision, several
    stable switches of different ts), cancelled, superseded, dropped and in progress, planned
    targets promoted, an undecodable stable value, nodes joining and leaving; rows of one
    revision in shuffled order, in many row groups (so Spark reads the file in several tasks)."""
    rng = random.Random(seed)
    live = [f"n{i:02d}" for i in range(8)]
    joining = [f"n{i:02d}" for i in range(8, 12)]
    zones = {f"zone-{z}": (rng.randint(40, 80), 2 + z % 2) for z in range(5)}
    stable: dict[tuple[str, int], tuple[str, ...] | None] = {}
    pending: dict[tuple[str, int], tuple[str, ...]] = {}
    planned: dict[tuple[str, int], tuple[str, ...]] = {}
    for zone in ("zone-0", "zone-1", "zone-2"):  # exist before the history starts
        partitions, replicas = zones[zone]
        for p in range(partitions):
            stable[(zone, p)] = tuple(rng.sample(live, replicas))
    rows: list[dict[str, Any]] = []
    revision, clock = 1000, 1_700_000_000_000
    batch: list[dict[str, Any]] = []

    def emit(key: tuple[str, int], field: str, peers: Any, prev: Any, ts: int | None) -> None:
        batch.append(
            {"revision": revision, "zone": key[0], "partition": key[1], "field": field,
             "event": "delete" if peers is False else "put",
             "peers": None if peers is False or peers is None else list(peers),
             "prev_peers": None if prev is None else list(prev),
             "ts": None if peers is False else ts, "epoch": None if peers is False else 3}
        )  # fmt: skip

    def target(key: tuple[str, int]) -> tuple[str, ...]:
        now = list(stable.get(key) or rng.sample(live, 2))
        gone = [n for n in now if n not in live]
        out = rng.choice(gone) if gone else rng.choice(now)
        now[now.index(out)] = rng.choice([n for n in live if n not in now])
        return tuple(now)

    def existing() -> list[tuple[str, int]]:
        return sorted(k for k, v in stable.items() if v is not None)

    for step in range(900):
        revision += 1
        clock += rng.randint(50, 5000)
        roll = rng.random()
        if step in (5, 300):  # a zone created in one transaction
            zone = "zone-3" if step == 5 else "zone-4"
            partitions, replicas = zones[zone]
            for p in range(partitions):
                stable[(zone, p)] = tuple(rng.sample(live, replicas))
                emit((zone, p), "stable", stable[(zone, p)], None, clock)
        elif step == 600:  # zone-2 dropped: every key of it deleted in one transaction
            for key in [k for k in stable if k[0] == "zone-2"]:
                emit(key, "stable", False, stable.pop(key), None)
                if key in pending:
                    emit(key, "pending", False, pending.pop(key), None)
                if key in planned:
                    emit(key, "planned", False, planned.pop(key), None)
        elif step in (100, 250, 400, 700):  # a node joins
            live.append(joining.pop(0))
        elif step in (350, 650):  # a node leaves: its partitions are triggered away
            gone = live.pop(rng.randrange(len(live)))
            for key in [k for k in existing() if gone in (stable[k] or ())][:25]:
                if key not in pending:
                    pending[key] = target(key)
                    emit(key, "pending", pending[key], None, clock)
        elif step == 450:  # an undecodable stable value (exported with null peers)
            key = rng.choice([k for k in existing() if k not in pending])
            emit(key, "stable", None, stable[key], clock)
            stable[key] = None
        elif roll < 0.40:  # triggers
            for key in rng.sample(existing(), 3):
                if key not in pending:
                    pending[key] = target(key)
                    emit(key, "pending", pending[key], None, clock - rng.randint(0, 40))
        elif roll < 0.70 and pending:  # a batch of finishes in one revision
            for key in rng.sample(sorted(pending), min(len(pending), rng.randint(1, 4))):
                new = pending.pop(key)
                emit(key, "stable", new, stable.get(key), clock + rng.randint(0, 900))
                stable[key] = new
                if key in planned:
                    pending[key] = planned.pop(key)
                    emit(key, "pending", pending[key], new, clock)
                    emit(key, "planned", False, pending[key], None)
                else:
                    emit(key, "pending", False, new, None)
        elif roll < 0.78 and pending:  # a target planned behind the pending one
            key = rng.choice(sorted(pending))
            before, planned[key] = planned.get(key), target(key)
            emit(key, "planned", planned[key], before, clock)
        elif roll < 0.86 and pending:  # cancel: the cancel key, then pending deleted with it
            key = rng.choice(sorted(pending))
            emit(key, "cancel", (), None, clock)
            rows.extend(batch)
            batch = []
            revision += 1
            emit(key, "pending", False, pending.pop(key), None)
            emit(key, "cancel", False, (), None)
            if key in planned:
                emit(key, "planned", False, planned.pop(key), None)
        elif roll < 0.92 and pending:  # superseded: pending overwritten
            key = rng.choice(sorted(pending))
            old, pending[key] = pending[key], target(key)
            emit(key, "pending", pending[key], old, clock)
        rng.shuffle(batch)
        rows.extend(batch)
        batch = []
    assignments = [
        {"zone": z, "partition": p, "field": field, "peers": None if peers is None else list(peers)}
        for field, table in (("stable", stable), ("pending", pending), ("planned", planned))
        for (z, p), peers in sorted(table.items())
    ]
    sizes = [
        {"zone": z, "partition": p, "node": node, "ts": 1,
         "bytes": None if (p + k) % 11 == 0 else 1000 * p + 7 * k + 1, "keys": p}
        for (z, p), peers in sorted(stable.items()) if z != "zone-4"
        for k, node in enumerate(peers or ())
    ]  # fmt: skip
    meta = {"revision": revision, "history_from": 1001, "history_to": revision, "prefix": "/g"}
    tables = {"history": rows, "assignments": assignments, "sizes": sizes}
    write_tables(path, tables, meta)
    table = pa.Table.from_pylist(rows, schema=HISTORY)
    pq.write_table(table, path / "history.parquet", row_group_size=250)
    return path


@pytest.fixture
def small_splits(spark: SparkSession) -> Iterator[None]:
    """Spark reads the history in several tasks (one per few row groups), as a large one is."""
    spark.conf.set("spark.sql.files.maxPartitionBytes", "8192")
    yield
    spark.conf.unset("spark.sql.files.maxPartitionBytes")


def test_generated_history_both_engines(
    spark: SparkSession, small_splits: None, tmp_path: Path
) -> None:
    export_dir = _generated_export(tmp_path / "export")
    history = spark.read.parquet(str(export_dir / "history.parquet"))
    assert history.rdd.getNumPartitions() > 2  # the positions span several tasks
    numbers = _both(export_dir, tmp_path)
    totals, zones = numbers["totals"], numbers["zones"]
    assert totals["rebalances"] > 300
    assert len(zones) == 5
    outcomes = {o for z in zones.values() for o in z["outcomes"]}
    assert outcomes == {"done", "cancelled", "superseded", "in_progress", "dropped"}
    with_bytes = [n for n, z in zones.items() if z["outcomes"].get("done") and z["bytes_moved"]]
    assert len(with_bytes) >= 3
    assert zones["zone-4"]["bytes_moved"] == 0  # no sizes reported for it
    assert totals["bytes_to_move"] > 0
    durations = totals["duration_s"]
    assert durations["count"] == totals["done"] > 100
    assert 0 < durations["median"] < durations["p90"] < durations["max"]
    assert len(numbers["skew"]) > 200
    assert len({p["spread"] for p in numbers["skew"]}) > 2
    assert set(numbers["load_before"]) != set(numbers["load_after"])  # nodes joined and left
    assert numbers["history"]["history_to"] > 1900


def test_missing_column_named_by_the_spark_engine(spark: SparkSession, tmp_path: Path) -> None:
    export_dir = _generated_export(tmp_path / "export")
    table = pq.read_table(export_dir / "history.parquet").drop_columns(["prev_peers"])
    pq.write_table(table, export_dir / "history.parquet")
    for engine in ("local", "spark"):
        with pytest.raises(InvalidInput, match=r"^history\.parquet: lacks column\(s\) prev_peers"):
            run_report(export_dir, tmp_path / engine, engine=engine)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


BAD = [
    (["--engine", "spark"], "--input", "has no history.parquet"),
    (["--master", "local[2]"], "--master", "only applies to --engine spark"),
    (["--spark-conf", "spark.driver.memory=1g"], "--spark-conf", "only applies"),
    (["--engine", "spark", "--master", "sprak://x:1"], "--master", "is not"),
    (["--engine", "spark", "--spark-conf", "novalue"], "--spark-conf", ""),
]


@pytest.mark.parametrize(("args", "option", "problem"), BAD)
def test_bad_report_input(tmp_path: Path, args: list[str], option: str, problem: str) -> None:
    export_dir = tmp_path / "export"
    export_dir.mkdir()
    (export_dir / "assignments.parquet").write_bytes(b"")  # no history.parquet
    out = tmp_path / "report"
    out.mkdir()
    (out / "report.json").write_text("previous report")
    result = placectl("pipeline", "report", "--input", str(export_dir), "--out", str(out), *args)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"placectl: error: {option}: "), line
    assert problem in line
    assert line.endswith(")")  # the fix
    assert [p.name for p in out.iterdir()] == ["report.json"]
    assert (out / "report.json").read_text() == "previous report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "report"]
