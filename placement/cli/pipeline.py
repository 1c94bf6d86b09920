"""``placectl pipeline export|report``: the thin CLI shell of the data pipeline (the
``pipeline`` extra).

Every check that can fail on bad input runs before any output is opened; outputs are written to
a temporary directory and renamed at the end (:mod:`placement.pipeline.outputs`). Both print a
summary line, or with ``-o json|yaml`` (``--json``) the summary as data; ``export`` draws a
progress bar of its steps on stderr while it runs, and ``report --engine spark`` one per Spark
stage (as ``placectl plan`` does), when that is a terminal.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import click

from placement.cli.common import (
    Bars,
    NoBars,
    Output,
    location_option,
    output_option,
    pipeline_extra,
)
from placement.cli.spark_run import (
    StageReport,
    announce_pack,
    parse_conf,
    parse_spark_options,
    spark_options,
    spark_run,
    stage_bars,
)
from placement.errors import InvalidInput
from placement.metastore.keys import DEFAULT_PREFIX
from placement.pipeline.locations import Location, as_location, join, local_path, spark_uri
from placement.pipeline.outputs import check_target
from placement.pipeline.spark_master import parse_master
from placement.security.credentials import EtcdCredentials
from placement.security.flags import etcd_flags


@click.group()
def pipeline() -> None:
    """Data pipeline: export the cluster to Parquet, analyse its rebalance history."""


@pipeline.command("export")
@click.option("--etcd", "endpoints", required=True, help="etcd endpoints HOST:PORT[,HOST:PORT...].")
@click.option(
    "--prefix", default=DEFAULT_PREFIX, show_default=True, help="Key prefix of the deployment."
)
@location_option(
    "--out",
    "out",
    "Directory to write (replaced): a local path, or a URI written through Spark's Hadoop file"
    " system (hdfs:, s3a:, file: ...).",
)
@click.option(
    "--spark-conf",
    multiple=True,
    metavar="KEY=VALUE",
    help="Spark setting for writing to a URI --out, e.g. spark.hadoop.fs.s3a.endpoint=...",
)
@output_option
@etcd_flags
def export_command(
    endpoints: str,
    prefix: str,
    out: Location,
    spark_conf: tuple[str, ...],
    output: Output,
    etcd_credentials: EtcdCredentials,
) -> None:
    """Write the cluster snapshot and the assignment history still in etcd as Parquet."""
    import asyncio

    with pipeline_extra("placectl pipeline export"):
        from placement.pipeline.export import EXPORT_STEPS, export

    conf = parse_conf(spark_conf)
    if isinstance(out, Path) and conf:
        raise InvalidInput("--spark-conf", "only applies to a URI --out", "drop it, or name a URI")
    with contextlib.ExitStack() as stack:
        if isinstance(out, Path):
            check_target(out, "--out", directory=True)
            written = out
        else:  # written here first, then copied through the Hadoop file system of a local Spark
            with pipeline_extra("placectl pipeline export --out URI"):
                from placement.pipeline.hadoop_fs import HadoopFs
                from placement.pipeline.spark_plan import start_spark
            spark = start_spark(parse_master("local[1]"), conf)
            HadoopFs(spark).check_target(out, "--out", directory=True)
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="placectl-export-"))
            written = Path(scratch) / "export"
        with output.progress() as bars:
            task = bars.add_task("exporting", total=EXPORT_STEPS)

            def progress(what: str, done: int, total: int) -> None:
                bars.update(task, completed=done, total=total, detail=what)

            summary = asyncio.run(export(endpoints, prefix, written, etcd_credentials, progress))
        if isinstance(out, str):
            HadoopFs(spark).put_directory(written, out, "--out")
    rows = ", ".join(f"{n} {c}" for n, c in summary.rows.items())
    output.emit(
        {
            "revision": summary.revision,
            "history_from": summary.history_from,
            "history_to": summary.history_to,
            "rows": dict(summary.rows),
            "out": str(out),
        },
        lambda wide: (
            f"exported revision {summary.revision} (history {summary.history_from}.."
            f"{summary.history_to}): {rows} -> {out}"
        ),
    )


def run_report(
    input_dir: Path | str,
    out: Path | str,
    *,
    engine: str,
    master: str | None = None,
    spark_conf: Sequence[str] = (),
    ship_env: str | None = None,
    stages: StageReport | None = None,
    packed: Callable[[Path], None] | None = None,
) -> dict[str, Any]:
    """Validates everything, computes the report with ``engine``, writes it; returns its totals.
    ``input_dir`` and ``out`` are local paths or (Spark engine) URIs, as for ``placectl plan``
    (:func:`placement.cli.plan.run_plan`, whose Spark options and environment shipping this
    shares). On Spark, ``stages`` is told the active stages while it runs (from another
    thread)."""
    from placement.pipeline.report import build_report, check_export, write_report

    choice = parse_spark_options(engine, master, spark_conf, ship_env)
    source, target = as_location(input_dir), as_location(out)
    if engine == "local":
        local_out = local_path(target, "--out")
        check_target(local_out, "--out", directory=True)
        return build_report(local_path(source, "--input"), local_out)
    if isinstance(target, Path):
        check_target(target, "--out", directory=True)
    if isinstance(source, Path):
        check_export(source)
    from placement.pipeline.hadoop_fs import HadoopFs
    from placement.pipeline.spark_report import spark_report_input

    run = spark_run(choice, app="placectl-report", stages=stages, packed=packed)
    with run as spark:
        if isinstance(target, str):
            HadoopFs(spark).check_target(target, "--out", directory=True)
        with spark_report_input(spark, spark_uri(source)) as data:
            if isinstance(target, Path):
                return write_report(data, target)
            # rendered here, then copied to the URI through Spark's Hadoop file system
            with tempfile.TemporaryDirectory(prefix="placectl-report-") as scratch:
                rendered = Path(scratch) / "report"
                totals = write_report(data, rendered)
                HadoopFs(spark).put_directory(rendered, target, "--out")
                return totals


@pipeline.command("report")
@location_option(
    "--input",
    "input_dir",
    "A directory written by `placectl pipeline export`: a local path, or with --engine spark a"
    " URI Spark reads (file:, hdfs:, s3a:, ...).",
)
@location_option(
    "--out", "out", "Directory to write (replaced): a local path, or with --engine spark a URI."
)
@spark_options("Analytics engine; both give identical report.json and rebalances.csv.")
@output_option
def report_command(
    input_dir: Location,
    out: Location,
    engine: str,
    master: str | None,
    spark_conf: tuple[str, ...],
    ship_env: str | None,
    output: Output,
) -> None:
    """Rebalances per zone, durations, moves, skew over time: report.html with plots."""

    bars_shown: AbstractContextManager[Bars]
    bars_shown = output.progress() if engine == "spark" else nullcontext(NoBars())
    what = "placectl pipeline report" + (" --engine spark" if engine == "spark" else "")
    with pipeline_extra(what), bars_shown as bars:
        summary = run_report(
            input_dir,
            out,
            engine=engine,
            master=master,
            spark_conf=spark_conf,
            ship_env=ship_env,
            stages=stage_bars(bars),
            packed=announce_pack,
        )
    output.emit(
        {**summary, "report": str(join(out, "report.html"))},
        lambda wide: (
            f"{summary['rebalances']} rebalance(s) in {summary['zones']} zone(s), "
            f"{summary['moves']} move(s) -> {join(out, 'report.html')}"
        ),
    )


@pipeline.command("pack-env")
@click.option(
    "--out",
    "out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write the archive here (always packed) instead of the cache.",
)
@output_option
def pack_env_command(out: Path | None, output: Output) -> None:
    """Pack what Spark executors need (the product and its dependencies, from this environment)
    into one archive for --ship-env PATH|URI (design/pipeline.md, "Shipping the environment")."""
    from placement.pipeline.ship_env import pack_environment

    if out is not None:
        check_target(out, "--out", directory=False)
    with pipeline_extra("placectl pipeline pack-env"):
        archive, fresh = pack_environment(output=out)
    size = archive.stat().st_size
    output.emit(
        {"archive": str(archive), "bytes": size, "packed": fresh},
        lambda wide: (
            f"{'packed' if fresh else 'cached'}: {archive} ({size / 2**20:.0f} MiB);"
            f" use --ship-env {archive}"
        ),
    )
