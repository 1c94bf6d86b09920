"""The Spark engine of ``placectl pipeline report``: the history's analytics as Spark jobs, the
numbers the local engine computes (design/pipeline.md, "Report").

Shape of the job:

1. ``history.parquet`` and the stable rows of ``assignments.parquet`` are read by the executors,
   each row numbered in file order (``position``), and **co-grouped by (zone, partition)**;
   ``applyInArrow`` runs :func:`placement.pipeline.history.partition_history` once per partition
   — the pure reconstruction the local engine runs — and emits its rebalances, its load change
   per stable event and its stable before/after. The result is persisted.
2. Aggregates: per zone and outcome, rebalances, moves and bytes (a join with the partition
   sizes); per zone, :meth:`~placement.pipeline.analytics.Durations.of` on the executors (one
   group per zone); replicas per node before and after; per revision, the summed load change
   and the ``ts`` of its last stable event. Only these aggregates reach the driver, with the
   ``done`` durations (the histogram plot) and the rebalance rows, streamed in order into
   ``rebalances.csv``; the skew sweep (:func:`~placement.pipeline.history.skew_sweep`) runs on
   the driver over the per-revision aggregates.

Paths are strings (a local path or a ``file://`` / ``hdfs://`` URI of the export directory), read
by Spark only: the driver opens no file of the export itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from placement.errors import InvalidInput
from placement.pipeline.analytics import (
    Durations,
    OutcomeSums,
    ReportInput,
    ZoneStats,
    zone_stats_of_sums,
)
from placement.pipeline.hadoop_fs import HadoopFs
from placement.pipeline.history import (
    DONE,
    LoadChange,
    Rebalance,
    event_of,
    partition_history,
    skew_sweep,
)
from placement.pipeline.locations import join
from placement.pipeline.spark_inputs import partition_sizes, read_frame

_HISTORY = ["revision", "zone", "partition", "field", "event", "peers", "prev_peers", "ts"]
_ASSIGNMENTS = ["zone", "partition", "field", "peers"]
REBALANCE, CHANGE, STATE = "rebalance", "change", "state"

#: One partition's reconstruction: ``rebalance`` rows (``seq``: its order in the partition;
#: ``old`` / ``new`` peers), one ``change`` row per stable event (``position`` of the event,
#: the nodes' load deltas as ``nodes`` / ``deltas``) and one ``state`` row (``old``: stable at
#: the history's start, ``new``: stable now).
RESULT_SCHEMA = (
    "kind string, zone string, partition int, seq int, outcome string, start_revision long, "
    "end_revision long, start_ts long, end_ts long, old array<string>, new array<string>, "
    "moves long, duration_s double, revision long, position long, ts long, "
    "nodes array<string>, deltas array<long>"
)
_PEERS = pa.list_(pa.string())
_RESULT_ARROW = pa.schema(
    [
        ("kind", pa.string()),
        ("zone", pa.string()),
        ("partition", pa.int32()),
        ("seq", pa.int32()),
        ("outcome", pa.string()),
        ("start_revision", pa.int64()),
        ("end_revision", pa.int64()),
        ("start_ts", pa.int64()),
        ("end_ts", pa.int64()),
        ("old", _PEERS),
        ("new", _PEERS),
        ("moves", pa.int64()),
        ("duration_s", pa.float64()),
        ("revision", pa.int64()),
        ("position", pa.int64()),
        ("ts", pa.int64()),
        ("nodes", _PEERS),
        ("deltas", pa.list_(pa.int64())),
    ]
)
DURATIONS_SCHEMA = "zone string, count long, mean double, median double, p90 double, max double"
_DURATIONS_ARROW = pa.schema(
    [
        ("zone", pa.string()),
        ("count", pa.int64()),
        ("mean", pa.float64()),
        ("median", pa.float64()),
        ("p90", pa.float64()),
        ("max", pa.float64()),
    ]
)


def _read(
    spark: SparkSession, base: str, name: str, columns: list[str], used: list[str] | None = None
) -> DataFrame:
    """One table of the export, checked for ``columns`` like the local engine's ``read_table``,
    with the ``used`` ones (default: all of them) and each row's ``position`` in the file
    (increasing in file order: Spark splits one file into its tasks in order)."""
    selected = read_frame(spark, base, name, columns).select(*(used or columns))
    return selected.withColumn("position", F.monotonically_increasing_id())


def _meta(spark: SparkSession, base: str) -> dict[str, Any]:
    """``meta.json`` as the local engine reads it: ``{}`` when absent or not a JSON object."""
    uri = str(join(base, "meta.json"))
    try:
        if HadoopFs(spark).kind(uri, "--input") != "file":
            return {}
        meta = json.loads(HadoopFs(spark).read_bytes(uri, "--input"))
    except (InvalidInput, ValueError):  # unreadable, not JSON: no history range, like local
        return {}
    return meta if isinstance(meta, dict) else {}


def _reconstruct(key: tuple[Any, ...], history: pa.Table, current: pa.Table) -> pa.Table:
    """``applyInArrow``'s function per (zone, partition): its events (in file order, as the
    local engine reads them) and its current stable row(s) -> the rows of RESULT_SCHEMA."""
    history = history.sort_by("position")
    events = [event_of(row) for row in history.select(_HISTORY).to_pylist()]
    positions = history.column("position").to_pylist()
    stables = current.sort_by("position").column("peers").to_pylist()
    now = tuple(stables[-1]) if stables else None  # the last row, like the local dict
    found = partition_history(events, now)
    zone, partition = str(key[0].as_py()), int(key[1].as_py())
    rows: list[dict[str, Any]] = [
        {
            "kind": REBALANCE,
            "seq": seq,
            "outcome": r.outcome,
            "start_revision": r.start_revision,
            "end_revision": r.end_revision,
            "start_ts": r.start_ts,
            "end_ts": r.end_ts,
            "old": None if r.old is None else list(r.old),
            "new": list(r.new),
            "moves": r.moves,
            "duration_s": r.duration_s,
        }
        for seq, r in enumerate(found.rebalances)
    ]
    rows.extend(
        {
            "kind": CHANGE,
            "revision": change.revision,
            "position": positions[i],
            "ts": change.ts,
            "nodes": list(change.delta),
            "deltas": list(change.delta.values()),
        }
        for i, change in found.changes
    )
    if found.start is not None or now is not None:
        rows.append(
            {
                "kind": STATE,
                "old": None if found.start is None else list(found.start),
                "new": None if now is None else list(now),
            }
        )
    for row in rows:
        row["zone"], row["partition"] = zone, partition
    return pa.Table.from_pylist(rows, schema=_RESULT_ARROW)


def _zone_durations(key: tuple[Any, ...], done: pa.Table) -> pa.Table:
    """``applyInArrow``'s function per zone: :meth:`Durations.of` of its ``done`` durations,
    the function the local engine runs (Spark's own percentiles would round differently)."""
    d = Durations.of(done.column("duration_s").to_pylist())
    return pa.Table.from_pylist(
        [
            {
                "zone": str(key[0].as_py()),
                "count": d.count,
                "mean": d.mean,
                "median": d.median,
                "p90": d.p90,
                "max": d.max,
            }
        ],
        schema=_DURATIONS_ARROW,
    )


def _zone_stats(
    spark: SparkSession, base: str, rebalances: DataFrame
) -> tuple[dict[str, ZoneStats], list[float]]:
    """Per zone (sorted by name) and every ``done`` duration."""
    sizes = partition_sizes(spark, base)
    sized = (
        rebalances.join(sizes.select("zone", "partition", "bytes"), ["zone", "partition"], "left")
        if sizes is not None
        else rebalances.withColumn("bytes", F.lit(0).cast("long"))
    )
    sums: dict[str, list[OutcomeSums]] = {}
    for row in (
        sized.groupBy("zone", "outcome")
        .agg(
            F.count("*").alias("n"),
            F.sum("moves").alias("moves"),
            F.sum(F.col("moves") * F.coalesce(F.col("bytes"), F.lit(0))).alias("bytes"),
        )
        .collect()
    ):
        sums.setdefault(str(row["zone"]), []).append(
            (str(row["outcome"]), int(row["n"]), int(row["moves"]), int(row["bytes"]))
        )
    done = rebalances.where((F.col("outcome") == DONE) & F.col("duration_s").isNotNull()).select(
        "zone", "duration_s"
    )
    durations = {
        str(row["zone"]): Durations(
            int(row["count"]), row["mean"], row["median"], row["p90"], row["max"]
        )
        for row in done.groupBy("zone").applyInArrow(_zone_durations, DURATIONS_SCHEMA).collect()
    }
    every = [float(row["duration_s"]) for row in done.select("duration_s").collect()]
    stats = {
        zone: zone_stats_of_sums(zone, sums[zone], durations.get(zone, Durations.of([])))
        for zone in sorted(sums)
    }
    return stats, every


def _loads(state: DataFrame) -> tuple[dict[str, int], dict[str, int]]:
    """Replicas per node at the history's start and now (a count per node in Spark)."""
    counted = (
        state.select(F.lit("before").alias("when"), F.explode("old").alias("node"))
        .unionByName(state.select(F.lit("after").alias("when"), F.explode("new").alias("node")))
        .groupBy("when", "node")
        .count()
        .collect()
    )
    found: dict[str, dict[str, int]] = {"before": {}, "after": {}}
    for row in counted:
        found[str(row["when"])][str(row["node"])] = int(row["count"])
    return dict(sorted(found["before"].items())), dict(sorted(found["after"].items()))


def _load_changes(changes: DataFrame) -> Iterator[LoadChange]:
    """:func:`~placement.pipeline.history.merge_changes` as a group-by: per revision (ascending),
    the nodes' deltas summed and the ``ts`` of the stable event of the highest position."""
    last = changes.groupBy("revision").agg(F.max(F.struct("position", "ts")).alias("last"))
    deltas = (
        changes.select("revision", F.explode(F.arrays_zip("nodes", "deltas")).alias("d"))
        .groupBy("revision", F.col("d.nodes").alias("node"))
        .agg(F.sum("d.deltas").alias("delta"))
        .where(F.col("delta") != 0)
        .groupBy("revision")
        .agg(F.collect_list(F.struct("node", "delta")).alias("delta"))
    )
    per_revision = (
        last.join(deltas, "revision", "left")
        .select("revision", F.col("last.ts").alias("ts"), "delta")
        .orderBy("revision")
    )
    for row in per_revision.toLocalIterator():
        delta = {str(d["node"]): int(d["delta"]) for d in row["delta"] or ()}
        ts = row["ts"]
        yield LoadChange(int(row["revision"]), None if ts is None else int(ts), delta)


def _rebalance_rows(rebalances: DataFrame) -> Iterator[Rebalance]:
    """The rebalances in the local engine's order (zone, partition, then as reconstructed),
    streamed to the driver one Spark partition at a time."""
    ordered = rebalances.orderBy("zone", "partition", "seq").select(
        "zone", "partition", "start_revision", "start_ts", "old", "new", "outcome",
        "end_revision", "end_ts",
    )  # fmt: skip
    for row in ordered.toLocalIterator():
        old = row["old"]
        yield Rebalance(
            str(row["zone"]),
            int(row["partition"]),
            int(row["start_revision"]),
            row["start_ts"],
            None if old is None else tuple(old),
            tuple(row["new"]),
            str(row["outcome"]),
            row["end_revision"],
            row["end_ts"],
        )


@contextmanager
def spark_report_input(spark: SparkSession, base: str) -> Iterator[ReportInput]:
    """The report's numbers computed on Spark from the export directory ``base`` (a path or a
    URI). Its ``rows`` stream from the persisted result: write the report inside the block."""
    history = _read(spark, base, "history", [*_HISTORY, "epoch"], _HISTORY).withColumn(
        "partition", F.col("partition").cast("int")
    )
    current = (
        _read(spark, base, "assignments", _ASSIGNMENTS)
        .where((F.col("field") == "stable") & F.col("peers").isNotNull())
        .select("zone", F.col("partition").cast("int").alias("partition"), "peers", "position")
    )
    meta = _meta(spark, base)
    result = (
        history.groupBy("zone", "partition")
        .cogroup(current.groupBy("zone", "partition"))
        .applyInArrow(_reconstruct, RESULT_SCHEMA)
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    try:
        rebalances = result.where(F.col("kind") == REBALANCE)
        stats, durations = _zone_stats(spark, base, rebalances)
        before, after = _loads(result.where(F.col("kind") == STATE))
        skew = skew_sweep(before, _load_changes(result.where(F.col("kind") == CHANGE)))
        yield ReportInput(
            stats=stats,
            rebalances=sum(s.rebalances for s in stats.values()),
            durations=durations,
            meta=meta,
            load_before=before,
            load_after=after,
            skew=skew,
            rows=lambda: _rebalance_rows(rebalances),
        )
    finally:
        result.unpersist()
