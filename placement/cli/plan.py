"""``placectl plan``: the target assignment of every zone in a snapshot, with moves and balance,
planned locally or on Spark (both give byte-identical plans), optionally under what-if changes.

Every check that can fail on bad input runs before any output is opened; the plan is written to a
temporary file and renamed at the end (:mod:`placement.pipeline.outputs`). On Spark, a progress bar
per running stage (its tasks done) is drawn on stderr while the plan runs, when that is a terminal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from placement.cli.common import Bars, NoBars, Output, path_option, pipeline_extra
from placement.errors import InvalidInput
from placement.pipeline.outputs import check_target, write_text_parts
from placement.pipeline.spark_master import DEFAULT_MASTER, parse_master
from placement.pipeline.whatif import parse_whatif, split_setting

if TYPE_CHECKING:
    from placement.pipeline.spark_progress import StageProgress

StageReport = Callable[[Sequence["StageProgress"]], None]


def parse_conf(items: Sequence[str]) -> dict[str, str]:
    """``--spark-conf KEY=VALUE`` options -> a dict."""
    return dict(split_setting("--spark-conf", item, "spark.driver.memory=4g") for item in items)


def run_plan(
    input_path: Path,
    output_path: Path,
    *,
    engine: str,
    master: str | None = None,
    spark_conf: Sequence[str] = (),
    add_nodes: Sequence[str] = (),
    remove_nodes: Sequence[str] = (),
    set_replicas: Sequence[str] = (),
    set_partitions: Sequence[str] = (),
    stages: StageReport | None = None,
) -> dict[str, Any]:
    """Validates everything, plans with ``engine``, writes the plan; returns its fleet summary.
    On Spark, ``stages`` is told the active stages while it runs (from another thread)."""
    from placement.pipeline.engines import plan_local
    from placement.pipeline.inputs import load_plan_input
    from placement.pipeline.planning import FleetTotals, plan_text_parts

    if engine != "spark" and (master is not None or spark_conf):
        raise InvalidInput("--master", "only applies to --engine spark", "add --engine spark")
    whatif = parse_whatif(add_nodes, remove_nodes, set_replicas, set_partitions)
    parsed_master = parse_master(master or DEFAULT_MASTER)
    conf = parse_conf(spark_conf)
    check_target(output_path, "--output", directory=False)
    plan_input = load_plan_input(input_path, whatif)
    if engine == "local":
        totals = FleetTotals()
        write_text_parts(
            output_path, "--output", plan_text_parts(plan_local(plan_input, totals), totals.summary)
        )
        return totals.summary()
    from placement.pipeline.spark_plan import plan_spark, start_spark
    from placement.pipeline.spark_progress import StageWatcher

    spark = start_spark(parsed_master, conf)
    with StageWatcher(spark.sparkContext.statusTracker(), stages or (lambda found: None)):
        totals, fragments, result = plan_spark(spark, plan_input)
        try:
            write_text_parts(output_path, "--output", plan_text_parts(fragments, totals.summary))
        finally:
            result.unpersist()
    return totals.summary()


def stage_bars(bars: Bars) -> StageReport:
    """A ``run_plan(stages=...)`` report drawing a bar per Spark stage: tasks done of its tasks;
    a stage no longer active is shown complete."""
    shown: dict[int, tuple[Any, int]] = {}  # stage id -> (bar, tasks)

    def report(active: Sequence[StageProgress]) -> None:
        running = {s.stage_id for s in active}
        for stage_id, (task, tasks) in shown.items():
            if stage_id not in running:
                bars.update(task, completed=tasks)
        for s in active:
            if s.stage_id not in shown:
                name = s.name if len(s.name) <= 40 else s.name[:39] + "…"
                task = bars.add_task(f"spark stage {s.stage_id}", total=s.tasks, detail=name)
                shown[s.stage_id] = (task, s.tasks)
            task, _ = shown[s.stage_id]
            shown[s.stage_id] = (task, s.tasks)
            bars.update(task, completed=s.completed, total=s.tasks)

    return report


@click.command("plan")
@path_option(
    "--input",
    "input_path",
    "Cluster snapshot JSON, or a directory written by `placectl pipeline export`.",
)
@path_option("--output", "output_path", "Where to write the plan JSON.", dir_okay=False)
@click.option(
    "--engine",
    type=click.Choice(["local", "spark"]),
    default="local",
    show_default=True,
    help="Planning engine; both give byte-identical plans.",
)
@click.option("--master", default=None, help="Spark master URL for --engine spark [local[*]].")
@click.option(
    "--spark-conf", multiple=True, metavar="KEY=VALUE", help="Extra Spark setting (repeatable)."
)
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
def plan(input_path: Path, output_path: Path, engine: str, **options: Any) -> None:
    """Compute the target assignment of every zone in a snapshot, with moves and balance."""
    # the other options are run_plan's keyword arguments (Spark and what-if), named alike
    from placement.pipeline.planning import reshard_line

    bars_shown: AbstractContextManager[Bars]
    bars_shown = Output().progress() if engine == "spark" else nullcontext(NoBars())
    with pipeline_extra(f"placectl plan --engine {engine}"), bars_shown as bars:
        summary = run_plan(
            input_path, output_path, engine=engine, stages=stage_bars(bars), **options
        )
    click.echo(
        f"planned {summary['zones']} zone(s): {summary['moves']} move(s), "
        f"{summary['bytes_to_move']} byte(s) to move, node load spread "
        f"{summary['spread_before']} -> {summary['spread']} -> {output_path}"
    )
    line = reshard_line(summary)
    if line:
        click.echo(line)
