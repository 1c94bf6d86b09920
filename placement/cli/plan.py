"""``placectl plan``: the target assignment of every zone in a snapshot, with moves and balance,
planned locally or on Spark (both give byte-identical plans), optionally under what-if changes.

Every check that can fail on bad input runs before any output is opened; the plan is written to a
temporary file and renamed at the end (:mod:`placement.pipeline.outputs`). On Spark, a progress bar
per running stage (its tasks done) is drawn on stderr while the plan runs, when that is a terminal.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import click

from placement.cli.common import Bars, NoBars, Output, location_option, pipeline_extra
from placement.cli.spark_run import (
    StageReport,
    announce_pack,
    check_spark_options,
    parse_spark_options,
    spark_options,
    spark_run,
    stage_bars,
)
from placement.pipeline.locations import Location, as_location, local_path
from placement.pipeline.outputs import check_target, write_text_parts
from placement.pipeline.whatif import parse_whatif


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block (and back on after, if it was on).

    A large snapshot is hundreds of thousands of lists, dicts and tuples, none of them in a
    cycle (reference counting frees them all), yet each allocation counts towards the next
    collection, and the collections scan every object alive: with it on, a 300,000-replica
    plan spent about a third of its input time, and more in the placement and the output, in
    collections that freed nothing (bench/results/plan_cli.md)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def run_plan(
    input_path: Path | str,
    output_path: Path | str,
    *,
    engine: str,
    master: str | None = None,
    spark_conf: Sequence[str] = (),
    ship_env: str | None = None,
    add_nodes: Sequence[str] = (),
    remove_nodes: Sequence[str] = (),
    set_replicas: Sequence[str] = (),
    set_partitions: Sequence[str] = (),
    stages: StageReport | None = None,
    packed: Callable[[Path], None] | None = None,
) -> dict[str, Any]:
    """Validates everything, plans with ``engine``, writes the plan; returns its fleet summary.
    ``input_path`` and ``output_path`` are local paths or URIs (text: a Hadoop/Spark URI is read
    and written through Spark). On Spark, ``stages`` is told the active stages while it runs
    (from another thread), and ``packed`` the executors' environment archive when it had to be
    packed (not cached). Local input and output are checked before Spark starts; a URI, once it
    has (it is read through Spark) — in either case before anything is written."""
    from placement.pipeline.engines import plan_local
    from placement.pipeline.inputs import load_plan_input
    from placement.pipeline.planning import FleetTotals, plan_text_parts

    if engine == "local":  # a Spark option is wrong by being given; the defaults need no parsing
        check_spark_options(engine, master, spark_conf, ship_env)
    else:
        choice = parse_spark_options(engine, master, spark_conf, ship_env)
    source, target = as_location(input_path), as_location(output_path)
    whatif = parse_whatif(add_nodes, remove_nodes, set_replicas, set_partitions)
    if engine == "local":
        local_output = local_path(target, "--output")
        check_target(local_output, "--output", directory=False)
        with _cyclic_gc_paused():
            local_input = load_plan_input(local_path(source, "--input"), whatif)
            totals = FleetTotals()
            parts = plan_text_parts(plan_local(local_input, totals), totals.summary)
            write_text_parts(local_output, "--output", parts)
            return totals.summary()
    if isinstance(target, Path):
        check_target(target, "--output", directory=False)
    plan_input = load_plan_input(source, whatif) if isinstance(source, Path) else None
    from placement.pipeline.hadoop_fs import HadoopFs
    from placement.pipeline.spark_inputs import load_plan_input_spark
    from placement.pipeline.spark_plan import plan_spark

    run = spark_run(choice, app="placectl-plan", stages=stages, packed=packed)
    with run as spark:
        if isinstance(target, str):
            HadoopFs(spark).check_target(target, "--output", directory=False)
        if plan_input is None:
            plan_input = load_plan_input_spark(spark, str(source), whatif)
        totals, fragments, result = plan_spark(spark, plan_input)
        try:
            parts = plan_text_parts(fragments, totals.summary)
            if isinstance(target, Path):
                write_text_parts(target, "--output", parts)
            else:
                HadoopFs(spark).write_text_parts(target, "--output", parts)
        finally:
            result.unpersist()
    return totals.summary()


@click.command("plan")
@location_option(
    "--input",
    "input_path",
    "Cluster snapshot JSON, or a directory written by `placectl pipeline export`: a local path,"
    " or with --engine spark any URI Spark reads (file:, hdfs:, s3a:, ...).",
)
@location_option(
    "--output",
    "output_path",
    "Where to write the plan JSON: a local path, or with --engine spark a URI.",
)
@spark_options("Planning engine; both give byte-identical plans.")
@click.option(
    "--add-node",
    "add_nodes",
    multiple=True,
    metavar="NAME[,attr=value...]",
    help="What if this node joined.",
)
@click.option(
    "--remove-node", "remove_nodes", multiple=True, metavar="NAME", help="What if this node left."
)
@click.option(
    "--set-replicas", multiple=True, metavar="ZONE=R", help="What if ZONE had R replicas."
)
@click.option(
    "--set-partitions", multiple=True, metavar="ZONE=P", help="What if ZONE had P partitions."
)
def plan(input_path: Location, output_path: Location, engine: str, **options: Any) -> None:
    """Compute the target assignment of every zone in a snapshot, with moves and balance."""
    # the other options are run_plan's keyword arguments (Spark and what-if), named alike
    from placement.pipeline.planning import reshard_line

    bars_shown: AbstractContextManager[Bars]
    bars_shown = Output().progress() if engine == "spark" else nullcontext(NoBars())
    with pipeline_extra(f"placectl plan --engine {engine}"), bars_shown as bars:
        summary = run_plan(
            input_path,
            output_path,
            engine=engine,
            stages=stage_bars(bars),
            packed=announce_pack,
            **options,
        )
    click.echo(
        f"planned {summary['zones']} zone(s): {summary['moves']} move(s), "
        f"{summary['bytes_to_move']} byte(s) to move, node load spread "
        f"{summary['spread_before']} -> {summary['spread']} -> {output_path}"
    )
    line = reshard_line(summary)
    if line:
        click.echo(line)
