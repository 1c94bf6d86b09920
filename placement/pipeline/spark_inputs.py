"""The plan's input at a URI (``hdfs:``, ``s3a:``, ``file:`` ...), read through Spark: a
snapshot JSON file through the Hadoop FileSystem, an export directory's small tables (nodes,
zone configs) with Spark's Parquet reader — validated exactly like local input
(:mod:`placement.pipeline.inputs`); the large tables stay where they are for the executors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from placement.errors import InvalidInput
from placement.pipeline.hadoop_fs import HadoopFs, first_line
from placement.pipeline.inputs import (
    SKELETON_COLUMNS,
    PlanInput,
    check_columns,
    plan_input_from,
)
from placement.pipeline.locations import join
from placement.pipeline.rows import REQUIRED_FOR_PLAN, skeleton
from placement.pipeline.snapshot import decode_snapshot
from placement.pipeline.whatif import WhatIf

_FIX = "pass a directory written by `placectl pipeline export`"
_FIX_PLAN = "pass a snapshot JSON file or a directory written by `placectl pipeline export`"


def read_frame(spark: SparkSession, directory: str, name: str, columns: Sequence[str]) -> DataFrame:
    """One table of an export directory at a URI as a Spark frame, checked like a local
    directory's (:func:`placement.pipeline.inputs.read_table`): there, readable, and holding
    ``columns`` (errors name the table)."""
    uri = str(join(directory, f"{name}.parquet"))
    kind = HadoopFs(spark).kind(uri, "--input")
    if kind is None:
        raise InvalidInput("--input", f"{directory} has no {name}.parquet", _FIX)
    if kind != "file":  # a directory of part files has no one file order (history's order)
        raise InvalidInput("--input", f"{uri} is a directory, not one Parquet file", _FIX)
    try:
        frame = spark.read.parquet(uri)
    except Exception as e:  # AnalysisException, Py4JJavaError: not Parquet, unreadable
        raise InvalidInput(
            "--input", f"{uri} is not a readable Parquet file: {first_line(e)}", _FIX
        ) from e
    check_columns(name, frame.columns, columns)
    return frame


def partition_sizes(spark: SparkSession, directory: str) -> DataFrame | None:
    """(zone, partition, bytes, keys) of an export at a URI: each the largest any replica of the
    partition reports (a null counts 0, never below 0), as the local engine's
    :func:`placement.pipeline.inputs.read_partition_sizes`; None without ``sizes.parquet``."""
    if HadoopFs(spark).kind(str(join(directory, "sizes.parquet")), "--input") is None:
        return None
    largest = [
        F.greatest(F.max(F.coalesce(F.col(c), F.lit(0))), F.lit(0)).cast("long").alias(c)
        for c in ("bytes", "keys")
    ]
    return (
        read_frame(spark, directory, "sizes", ("zone", "partition", "bytes", "keys"))
        .groupBy("zone", F.col("partition").cast("int").alias("partition"))
        .agg(*largest)
    )


def read_small_table(
    spark: SparkSession, directory: str, name: str, columns: Sequence[str]
) -> list[dict[str, Any]]:
    """The rows of one small table (nodes, zone configs), in file order."""
    frame = read_frame(spark, directory, name, columns)
    rows: list[dict[str, Any]] = frame.select(*columns).toArrow().to_pylist()
    return rows


def load_plan_input_spark(spark: SparkSession, uri: str, whatif: WhatIf) -> PlanInput:
    """:func:`placement.pipeline.inputs.load_plan_input` for a URI."""
    kind = HadoopFs(spark).kind(uri, "--input")
    if kind is None:
        raise InvalidInput("--input", f"{uri} does not exist", _FIX_PLAN)
    if kind == "file":
        text = HadoopFs(spark).read_bytes(uri, "--input")
        return plan_input_from(decode_snapshot(text, uri), whatif, None)
    for name in REQUIRED_FOR_PLAN:
        if HadoopFs(spark).kind(str(join(uri, f"{name}.parquet")), "--input") is None:
            raise InvalidInput("--input", f"{uri} has no {name}.parquet", _FIX_PLAN)
    tables = {
        name: read_small_table(spark, uri, name, columns)
        for name, columns in SKELETON_COLUMNS.items()
    }
    return plan_input_from(skeleton(tables["nodes"], tables["zones"]), whatif, uri)
