"""``placectl plan`` (both engines) and ``placectl pipeline export|report``: the thin CLI shell.

Every check that can fail on bad input runs before any output is opened; outputs are written to
a temporary file or directory and renamed at the end (:mod:`placement.pipeline.outputs`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from placement.errors import InvalidInput
from placement.metastore.keys import DEFAULT_PREFIX
from placement.pipeline.outputs import check_target, write_text_parts
from placement.pipeline.spark_master import DEFAULT_MASTER, parse_master
from placement.pipeline.whatif import parse_whatif, split_setting


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
) -> dict[str, Any]:
    """Validates everything, plans with ``engine``, writes the plan; returns its fleet summary."""
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

    spark = start_spark(parsed_master, conf)
    totals, fragments, result = plan_spark(spark, plan_input)
    try:
        write_text_parts(output_path, "--output", plan_text_parts(fragments, totals.summary))
    finally:
        result.unpersist()
    return totals.summary()


_OUT = click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(path_type=Path),
    help="Directory to write (replaced).",
)


@click.group()
def pipeline() -> None:
    """Data pipeline: export the cluster to Parquet, analyse its rebalance history."""


@pipeline.command("export")
@click.option("--etcd", "endpoints", required=True, help="etcd endpoints HOST:PORT[,HOST:PORT...].")
@click.option(
    "--prefix", default=DEFAULT_PREFIX, show_default=True, help="Key prefix of the deployment."
)
@_OUT
def export_command(endpoints: str, prefix: str, out: Path) -> None:
    """Write the cluster snapshot and the assignment history still in etcd as Parquet."""
    from placement.pipeline.export import export

    check_target(out, "--out", directory=True)
    summary = asyncio.run(export(endpoints, prefix, out))
    rows = ", ".join(f"{n} {c}" for n, c in summary.rows.items())
    click.echo(
        f"exported revision {summary.revision} (history {summary.history_from}.."
        f"{summary.history_to}): {rows} -> {out}"
    )


@pipeline.command("report")
@click.option(
    "--input",
    "input_dir",
    required=True,
    type=click.Path(path_type=Path),
    help="A directory written by `placectl pipeline export`.",
)
@_OUT
def report_command(input_dir: Path, out: Path) -> None:
    """Rebalances per zone, durations, moves, skew over time: report.html with plots."""
    from placement.pipeline.report import build_report

    check_target(out, "--out", directory=True)
    summary = build_report(input_dir, out)
    click.echo(
        f"{summary['rebalances']} rebalance(s) in {summary['zones']} zone(s), "
        f"{summary['moves']} move(s) -> {out / 'report.html'}"
    )
