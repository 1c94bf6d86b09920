"""The Spark engine of ``placectl plan``: zones planned in parallel, grouped by zone.

Shape of the job (design/pipeline.md has the why):

1. the stable rows (Parquet read by the executors, or the JSON snapshot's rows) are joined to the
   list of zones to plan and co-grouped by zone with the partition sizes (bytes and keys, each
   the max over replicas);
2. ``applyInArrow`` runs :func:`placement.pipeline.engines.zone_rows_and_counters` once per zone
   — the same pure code the local engine runs, hence the same placement function as the driver
   — in one task, zone after zone in name order, carrying the fleet's tally from one zone to
   the next (:class:`placement.algo.fleet.FleetTally`, started from the current loads that a
   first aggregation returns): each zone's ties go to the nodes the fleet loads least, and the
   plans are the local engine's byte for byte;
3. the result (one fragment row per zone, plus a row of per-node / per-domain counter arrays per
   counter kind) is persisted; the fleet totals are a group-by of the exploded counters whose few
   thousand rows come back to the driver, and the zone fragments are streamed to the output file
   in zone order with ``toLocalIterator`` — one range partition of a few MiB at a time, so the
   fleet is never held by the driver.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from placement.algo.fleet import FleetTally
from placement.core.model import Node
from placement.core.names import is_name
from placement.errors import InvalidInput, PlacementError
from placement.pipeline.engines import (
    ERROR,
    FLEET_KINDS,
    ZONE,
    totals_from_sums,
    zone_rows_and_counters,
)
from placement.pipeline.inputs import PlanInput, PlannedZone, peer_lists, zone_input
from placement.pipeline.locations import spark_uri
from placement.pipeline.planning import COUNTER_KINDS, FleetTotals, partition_size
from placement.pipeline.rows import snapshot_rows
from placement.pipeline.spark_inputs import partition_sizes, read_frame
from placement.pipeline.spark_master import Master, probe_master
from placement.runtime import tune_gc

#: A zone's rows; a counter kind's row carries the zone's counters as ``keys`` / ``values``.
RESULT_SCHEMA = (
    "zone_index int, kind string, key string, value long, fragment string, "
    "keys array<string>, values array<long>"
)
_STABLE_SCHEMA = pa.schema(
    [("zone", pa.string()), ("partition", pa.int32()), ("peers", pa.list_(pa.string()))]
)
DEFAULT_CONF: Mapping[str, str] = {
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # A partition of zone fragments (a few MiB, see _fragment_partitions) goes straight to the
    # driver rather than through the block manager, which lost such results now and then
    # (TaskResultLost) on the 2,000-zone fleet; Spark caps this at its message size (128 MiB).
    "spark.task.maxDirectResultSize": "128m",
}
#: The JVM's logging: errors only, and none of its network layer's: when the session is
#: stopped on a failed job, executors still talking to it made that layer log lost
#: connections and a stopped scheduler as errors with stack traces ("Could not find
#: CoarseGrainedScheduler", "Still have 1 requests outstanding"); a real failure to reach the
#: executors fails the job itself, and that is reported.
_LOG4J = """rootLogger.level = error
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
logger.network.name = org.apache.spark.network
logger.network.level = off
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = spark: %p %c{1}: %m%n
"""


def executor_python(master: Master, conf: Mapping[str, str]) -> str:
    """The Python the executors' workers run: ``spark.pyspark.python`` if given, else
    ``$PYSPARK_PYTHON``, else this interpreter for a local master (the executors are this
    process's) and ``python3`` on the executors' ``PATH`` for a cluster."""
    return (
        conf.get("spark.pyspark.python")
        or os.environ.get("PYSPARK_PYTHON")
        or (sys.executable if master.local else "python3")
    )


def start_spark(
    master: Master,
    conf: Mapping[str, str] | None = None,
    *,
    archive: str | None = None,
    app: str = "placectl-plan",
) -> SparkSession:
    """A SparkSession on ``master`` (probed first: an unreachable master fails in seconds).

    The JVM logs only errors; the executors' Python is :func:`executor_python`; ``archive``
    (a URI, from :func:`placement.pipeline.ship_env.archive_for`) is shipped to the executors
    and its ``site-packages`` put on their Python path."""
    from placement.pipeline.ship_env import spark_settings

    probe_master(master)
    conf = dict(conf or {})
    log4j = Path(tempfile.gettempdir()) / f"placectl-spark-log4j2-{os.getuid()}.properties"
    if not log4j.exists() or log4j.read_text() != _LOG4J:
        log4j.write_text(_LOG4J)
    python = executor_python(master, conf)
    builder = SparkSession.builder.master(master.url).appName(app)
    settings = {
        **DEFAULT_CONF,
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{log4j}",
        **conf,
        **(spark_settings(archive, conf) if archive else {}),
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    # PySpark reads the workers' Python from the environment when its context starts; it is
    # set for that moment only, so that no process this one starts later inherits it
    before = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = python
    try:
        return builder.getOrCreate()
    except Exception as e:  # the JVM could not start: no Java, bad conf, ...
        raise InvalidInput(
            "--master",
            f"could not start Spark on {master.url}: {str(e).splitlines()[0] if str(e) else e!r}",
            "check Java 17 (scripts/setup.sh installs it) and the --spark-conf values",
        ) from e
    finally:
        if before is None:
            del os.environ["PYSPARK_PYTHON"]
        else:
            os.environ["PYSPARK_PYTHON"] = before


def _stable_frame(spark: SparkSession, plan_input: PlanInput) -> DataFrame:
    if plan_input.parquet_dir is not None:
        directory = spark_uri(plan_input.parquet_dir)
        columns = ("zone", "partition", "field", "peers")
        return (
            read_frame(spark, directory, "assignments", columns)
            .where(F.col("field") == "stable")
            .select("zone", F.col("partition").cast("int").alias("partition"), "peers")
        )
    table = pa.Table.from_pylist(snapshot_rows(plan_input.snapshot), schema=_STABLE_SCHEMA)
    return spark.createDataFrame(
        table.to_pandas(), schema="zone string, partition int, peers array<string>"
    )


def _sizes_frame(spark: SparkSession, plan_input: PlanInput) -> DataFrame:
    directory = plan_input.parquet_dir
    sizes = None if directory is None else partition_sizes(spark, spark_uri(directory))
    if sizes is None:
        return spark.createDataFrame([], "zone string, partition int, bytes long, keys long")
    return sizes


_RESULT_ARROW = pa.schema(
    [
        ("zone_index", pa.int32()),
        ("kind", pa.string()),
        ("key", pa.string()),
        ("value", pa.int64()),
        ("fragment", pa.string()),
        ("keys", pa.list_(pa.string())),
        ("values", pa.list_(pa.int64())),
    ]
)


def _planner(
    zones: Mapping[str, PlannedZone],
    nodes: Sequence[Node],
    current: tuple[Mapping[str, int], Mapping[str, int]],
) -> Any:
    """The function ``applyInArrow`` calls per zone (pickled to the Python workers): Arrow
    tables in and out, the peers decoded column-wise as the local engine reads them. The zones
    come in name order in one task, and the fleet's tally (started from ``current``, every
    zone's current replicas and primaries per node) goes from one to the next."""
    valid: set[str] = set()  # node names found valid so far by this worker
    tally = FleetTally()
    tally.add(*current)
    last: list[str] = []  # the zone planned before
    tuned: list[bool] = []

    def plan_group(key: tuple[Any, ...], stable: pa.Table, sizes: pa.Table) -> pa.Table:
        if not tuned:
            # The one task plans every zone in this worker: a default collector rescanned
            # the tally, the inputs and the worker's modules on every few hundred
            # allocations (the local engine pauses it, cli/plan.py).
            tune_gc()
            tuned.append(True)
        zone = zones.get(str(key[0].as_py()))
        if zone is None or stable.num_rows == 0:
            return _RESULT_ARROW.empty_table()
        if last and last[0] >= zone.spec.name:
            raise PlacementError(
                f"zones planned out of name order ({last[0]!r}, then {zone.spec.name!r}):"
                " the fleet tally needs one task in name order"
            )
        last[:] = [zone.spec.name]
        present = stable.filter(pc.is_valid(stable.column("partition")))
        decoded = peer_lists(present.column("peers"))
        names: list[str] = []
        if decoded is None:  # a null name: the rows as they are (stable_from_rows checks them)
            lists = present.column("peers").to_pylist()
        else:
            lists, names = decoded
        rows = list(zip(present.column("partition").to_pylist(), lists, strict=True))
        valid.update(name for name in names if name not in valid and is_name(name))
        # one row per partition (the largest report of each, aggregated in Spark)
        by_partition: dict[int, list[tuple[int, int]]] = {}
        columns = (sizes.column(c).to_pylist() for c in ("partition", "bytes", "keys"))
        for p, size, keys in zip(*columns, strict=True):
            by_partition.setdefault(p, []).append((size, keys))
        part_sizes = {p: partition_size(v) for p, v in by_partition.items()}
        out, counters = zone_rows_and_counters(
            zone, lambda: zone_input(zone, rows, part_sizes, valid), nodes, tally
        )
        kinds = list(counters)
        return pa.Table.from_pydict(
            {
                "zone_index": [r.zone_index for r in out] + [zone.index] * len(kinds),
                "kind": [r.kind for r in out] + kinds,
                "key": [r.key for r in out] + [""] * len(kinds),
                "value": [r.value for r in out] + [0] * len(kinds),
                "fragment": [r.fragment for r in out] + [None] * len(kinds),
                "keys": [None] * len(out) + [list(counters[k]) for k in kinds],
                "values": [None] * len(out) + [list(counters[k].values()) for k in kinds],
            },
            schema=_RESULT_ARROW,
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
    shuffle = spark.conf.get("spark.sql.shuffle.partitions")
    # One shuffle partition: the zones' groups are planned in one task, in name order.
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    try:
        result = (
            stable.groupBy("zone")
            .cogroup(_sizes_frame(spark, plan_input).groupBy("zone"))
            .applyInArrow(_planner(zones, plan_input.nodes, _current_loads(stable)), RESULT_SCHEMA)
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
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", shuffle or "8")
    fragments = (
        str(row["fragment"])
        for row in result.where(F.col("kind") == ZONE)
        .select("zone_index", "fragment")
        .repartitionByRange(_fragment_partitions(plan_input), "zone_index")
        .sortWithinPartitions("zone_index")
        .select("fragment")
        .toLocalIterator()
    )
    return totals, fragments, result


def _current_loads(stable: DataFrame) -> tuple[dict[str, int], dict[str, int]]:
    """Every zone's current replicas and preferred primaries (first members) per node, summed
    in Spark (the local engine counts them zone by zone, ``engines.plan_local``)."""
    rows = stable.where(F.col("peers").isNotNull())
    replicas = rows.select(F.explode("peers").alias("node")).groupBy("node").count().collect()
    primaries = (
        rows.where(F.size("peers") > 0)
        .select(F.element_at("peers", 1).alias("node"))
        .groupBy("node")
        .count()
        .collect()
    )
    return (
        {str(r["node"]): int(r["count"]) for r in replicas},
        {str(r["node"]): int(r["count"]) for r in primaries},
    )


#: Zone fragment text per Spark partition streamed to the driver (an estimate: see below).
FRAGMENT_PARTITION_BYTES = 8 << 20


def _fragment_partitions(plan_input: PlanInput) -> int:
    """How many range partitions the zone fragments are streamed in: about
    :data:`FRAGMENT_PARTITION_BYTES` of text each, estimated at 24 bytes per replica and 80
    per node (four per-node tables) of a zone. ``orderBy`` left the count to Spark (the 8
    shuffle partitions, which adaptive execution may merge): 20 MiB or more each of the
    158 MiB of the 2,000-zone benchmark fleet, and streaming those failed in most runs
    (``TaskResultLost``, or ``Java heap space`` in the driver once they were direct results)."""
    per_node = 80 * len(plan_input.nodes)
    size = sum(24 * z.spec.partitions * z.spec.replicas + per_node for z in plan_input.zones)
    return max(1, min(len(plan_input.zones), -(-size // FRAGMENT_PARTITION_BYTES)))


def _totals(result: DataFrame) -> FleetTotals:
    """Fleet totals by a group-by in Spark (the counters' arrays exploded into one row per
    key first): only the aggregates reach the driver."""
    fleet = result.where(F.col("kind").isin(*FLEET_KINDS)).select(
        "kind", F.lit("").alias("key"), "value"
    )
    counters = (
        result.where(F.col("kind").isin(*COUNTER_KINDS))
        .select("kind", F.explode(F.arrays_zip("keys", "values")).alias("kv"))
        .select("kind", F.col("kv.keys").alias("key"), F.col("kv.values").alias("value"))
    )
    summed = (
        fleet.unionByName(counters)
        .groupBy("kind", "key")
        .agg(F.sum("value").alias("value"), F.count("*").alias("n"))
        .collect()
    )
    return totals_from_sums(
        (str(row["kind"]), str(row["key"]), int(row["value"]), int(row["n"])) for row in summed
    )
