"""The Spark engine of ``placectl plan``: zones planned in parallel, grouped by zone.

Shape of the job (design/pipeline.md has the why):

1. the stable rows (Parquet read by the executors, or the JSON snapshot's rows) are joined to the
   list of zones to plan and co-grouped by zone with the partition sizes (bytes and keys, each
   the max over replicas);
2. ``applyInPandas`` runs :func:`placement.pipeline.engines.zone_rows` once per zone — the same
   pure code the local engine runs, hence the same placement function as the driver;
3. the result (one fragment row per zone, plus per-node / per-domain counter rows) is persisted;
   the fleet totals are a group-by whose few thousand rows come back to the driver, and the zone
   fragments are streamed to the output file in zone order with ``toLocalIterator`` — one Spark
   partition at a time, so the fleet is never held by the driver.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from placement.core.model import Node
from placement.errors import InvalidInput
from placement.pipeline.engines import (
    ERROR,
    FLEET_KINDS,
    ZONE,
    totals_from_sums,
    zone_rows,
)
from placement.pipeline.inputs import PlanInput, PlannedZone, zone_input
from placement.pipeline.planning import COUNTER_KINDS, FleetTotals, partition_size
from placement.pipeline.rows import snapshot_rows
from placement.pipeline.spark_master import Master, probe_master

RESULT_SCHEMA = "zone_index int, kind string, key string, value long, fragment string"
_STABLE_SCHEMA = pa.schema(
    [("zone", pa.string()), ("partition", pa.int32()), ("peers", pa.list_(pa.string()))]
)
DEFAULT_CONF: Mapping[str, str] = {
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}
_LOG4J = """rootLogger.level = error
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = spark: %p %c{1}: %m%n
"""


def start_spark(master: Master, conf: Mapping[str, str] | None = None) -> SparkSession:
    """A SparkSession on ``master`` (probed first: an unreachable master fails in seconds).

    The JVM logs only errors, and Python workers run this interpreter (the venv's)."""
    probe_master(master)
    log4j = Path(tempfile.gettempdir()) / f"placectl-spark-log4j2-{os.getuid()}.properties"
    if not log4j.exists() or log4j.read_text() != _LOG4J:
        log4j.write_text(_LOG4J)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master.url).appName("placectl-plan")
    settings = {
        **DEFAULT_CONF,
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{log4j}",
        **(conf or {}),
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        return builder.getOrCreate()
    except Exception as e:  # the JVM could not start: no Java, bad conf, ...
        raise InvalidInput(
            "--master",
            f"could not start Spark on {master.url}: {str(e).splitlines()[0] if str(e) else e!r}",
            "check Java 17 (scripts/setup.sh installs it) and the --spark-conf values",
        ) from e


def _stable_frame(spark: SparkSession, plan_input: PlanInput) -> DataFrame:
    if plan_input.parquet_dir is not None:
        path = str(plan_input.parquet_dir / "assignments.parquet")
        return (
            spark.read.parquet(path)
            .where(F.col("field") == "stable")
            .select("zone", F.col("partition").cast("int").alias("partition"), "peers")
        )
    table = pa.Table.from_pylist(snapshot_rows(plan_input.snapshot), schema=_STABLE_SCHEMA)
    return spark.createDataFrame(
        table.to_pandas(), schema="zone string, partition int, peers array<string>"
    )


def _sizes_frame(spark: SparkSession, plan_input: PlanInput) -> DataFrame:
    directory = plan_input.parquet_dir
    if directory is None or not (directory / "sizes.parquet").exists():
        return spark.createDataFrame([], "zone string, partition int, bytes long, keys long")
    return (
        spark.read.parquet(str(directory / "sizes.parquet"))
        .groupBy("zone", F.col("partition").cast("int").alias("partition"))
        .agg(
            F.max(F.coalesce(F.col("bytes"), F.lit(0))).alias("bytes"),
            F.max(F.coalesce(F.col("keys"), F.lit(0))).alias("keys"),
        )
    )


def _planner(zones: Mapping[str, PlannedZone], nodes: Sequence[Node]) -> Any:
    """The function ``applyInPandas`` calls per zone (pickled to the Python workers)."""

    def plan_group(key: tuple[Any, ...], stable: pd.DataFrame, sizes: pd.DataFrame) -> pd.DataFrame:
        zone = zones.get(str(key[0]))
        if zone is None or stable.empty:
            return pd.DataFrame({c: [] for c in ("zone_index", "kind", "key", "value", "fragment")})
        present = stable[stable["partition"].notna()]
        rows = [
            (int(p), None if peers is None else [str(x) for x in peers])
            for p, peers in zip(present["partition"], present["peers"], strict=True)
        ]
        by_partition: dict[int, list[tuple[int, int]]] = {}
        for p, size, keys in zip(sizes["partition"], sizes["bytes"], sizes["keys"], strict=True):
            by_partition.setdefault(int(p), []).append((int(size), int(keys)))
        part_sizes = {p: partition_size(v) for p, v in by_partition.items()}
        out = zone_rows(zone, lambda: zone_input(zone, rows, part_sizes), nodes)
        return pd.DataFrame(
            {
                "zone_index": [r.zone_index for r in out],
                "kind": [r.kind for r in out],
                "key": [r.key for r in out],
                "value": [r.value for r in out],
                "fragment": [r.fragment for r in out],
            }
        )

    return plan_group


def plan_spark(
    spark: SparkSession, plan_input: PlanInput
) -> tuple[FleetTotals, Iterator[str], DataFrame]:
    """Runs the plan on Spark. Returns the fleet totals, the zone fragments in output order (a
    lazy stream) and the persisted result (``unpersist`` it after consuming the stream).

    Raises the first (by zone order) zone's InvalidInput before anything is streamed.
    """
    zones = {z.spec.name: z for z in plan_input.zones}
    names = spark.createDataFrame([(name,) for name in zones], "zone string")
    stable = names.join(_stable_frame(spark, plan_input), "zone", "left")
    result = (
        stable.groupBy("zone")
        .cogroup(_sizes_frame(spark, plan_input).groupBy("zone"))
        .applyInPandas(_planner(zones, plan_input.nodes), RESULT_SCHEMA)
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    try:
        errors = result.where(F.col("kind") == ERROR).orderBy("zone_index").limit(1).collect()
        if errors:
            raise InvalidInput("", str(errors[0]["fragment"]))
        totals = _totals(result)
    except BaseException:
        result.unpersist()
        raise
    fragments = (
        str(row["fragment"])
        for row in result.where(F.col("kind") == ZONE)
        .orderBy("zone_index")
        .select("fragment")
        .toLocalIterator()
    )
    return totals, fragments, result


def _totals(result: DataFrame) -> FleetTotals:
    """Fleet totals by a group-by in Spark: only the aggregates reach the driver."""
    summed = (
        result.where(F.col("kind").isin(*FLEET_KINDS, *COUNTER_KINDS))
        .groupBy(
            "kind",
            F.when(F.col("kind").isin(*FLEET_KINDS), "").otherwise(F.col("key")).alias("key"),
        )
        .agg(F.sum("value").alias("value"), F.count("*").alias("n"))
        .collect()
    )
    return totals_from_sums(
        (str(row["kind"]), str(row["key"]), int(row["value"]), int(row["n"])) for row in summed
    )
