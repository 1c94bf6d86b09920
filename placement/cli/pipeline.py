"""``placectl pipeline export|report``: the thin CLI shell of the data pipeline (the
``pipeline`` extra).

Every check that can fail on bad input runs before any output is opened; outputs are written to
a temporary directory and renamed at the end (:mod:`placement.pipeline.outputs`). Both print a
summary line, or with ``-o json|yaml`` (``--json``) the summary as data; ``export`` draws a
progress bar of its steps on stderr while it runs, when that is a terminal.
"""

from __future__ import annotations

from pathlib import Path

import click

from placement.cli.common import Output, output_option, path_option, pipeline_extra
from placement.metastore.keys import DEFAULT_PREFIX
from placement.pipeline.outputs import check_target
from placement.security.credentials import EtcdCredentials
from placement.security.flags import etcd_flags

_OUT = path_option("--out", "out", "Directory to write (replaced).")


@click.group()
def pipeline() -> None:
    """Data pipeline: export the cluster to Parquet, analyse its rebalance history."""


@pipeline.command("export")
@click.option("--etcd", "endpoints", required=True, help="etcd endpoints HOST:PORT[,HOST:PORT...].")
@click.option(
    "--prefix", default=DEFAULT_PREFIX, show_default=True, help="Key prefix of the deployment."
)
@_OUT
@output_option
@etcd_flags
def export_command(
    endpoints: str, prefix: str, out: Path, output: Output, etcd_credentials: EtcdCredentials
) -> None:
    """Write the cluster snapshot and the assignment history still in etcd as Parquet."""
    import asyncio

    with pipeline_extra("placectl pipeline export"):
        from placement.pipeline.export import EXPORT_STEPS, export

    check_target(out, "--out", directory=True)
    with output.progress() as bars:
        task = bars.add_task("exporting", total=EXPORT_STEPS)

        def progress(what: str, done: int, total: int) -> None:
            bars.update(task, completed=done, total=total, detail=what)

        summary = asyncio.run(export(endpoints, prefix, out, etcd_credentials, progress))
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


@pipeline.command("report")
@path_option("--input", "input_dir", "A directory written by `placectl pipeline export`.")
@_OUT
@output_option
def report_command(input_dir: Path, out: Path, output: Output) -> None:
    """Rebalances per zone, durations, moves, skew over time: report.html with plots."""
    with pipeline_extra("placectl pipeline report"):
        from placement.pipeline.report import build_report

    check_target(out, "--out", directory=True)
    summary = build_report(input_dir, out)
    output.emit(
        {**summary, "report": str(out / "report.html")},
        lambda wide: (
            f"{summary['rebalances']} rebalance(s) in {summary['zones']} zone(s), "
            f"{summary['moves']} move(s) -> {out / 'report.html'}"
        ),
    )
