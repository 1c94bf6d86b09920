"""``placectl workload``: recorded writers (``run``, with a progress bar on a terminal), and the
checker (``check``) that no acknowledged write was lost. Exit 1 when ``check`` finds a violation,
2 on bad input. Both take ``-o json|yaml|table|wide`` (``--json``; ``wide`` is ``table``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from placement.cli.common import Bars, Output, output_option, path_option
from placement.cli.data import with_data_client
from placement.errors import InvalidInput

if TYPE_CHECKING:
    from placement.data.client import DataClient
    from placement.data.workload import WorkloadStats


def workload_progress(bars: Bars, duration: float) -> Callable[[WorkloadStats, float], None]:
    """A ``run_writers`` progress callback drawing ``bars``: seconds of ``duration`` done, with
    acknowledged, attempted and failed writes."""
    task = bars.add_task("writing", total=duration)

    def report(stats: WorkloadStats, elapsed: float) -> None:
        failed = sum(stats.failures.values())
        bars.update(
            task,
            completed=min(elapsed, duration),
            detail=f"{stats.acked}/{stats.attempted} acknowledged, {failed} failed",
        )

    return report


@click.group("workload")
def workload() -> None:
    """Recorded writers, and the checker that no acknowledged write was lost."""


@workload.command("run")
@click.option("--zone", required=True, help="Zone to write to.")
@click.option("--writers", type=int, default=8, show_default=True, help="Concurrent writers.")
@click.option(
    "--keys-per-writer", type=int, default=50, show_default=True, help="Keys each writer owns."
)
@click.option("--duration", type=float, default=30.0, show_default=True, help="Seconds to run.")
@path_option(
    "--record",
    "record_path",
    "JSONL record of every attempt and outcome (overwritten).",
    dir_okay=False,
)
@click.option(
    "--delete-ratio", type=float, default=0.1, show_default=True, help="Share of deletes (0..1)."
)
@click.option(
    "--readers", type=int, default=2, show_default=True,
    help="Concurrent readers of the run's keys: their reads are recorded and `workload check` "
    "holds every key to linearizability (0: none).",
)  # fmt: skip
@click.option("--seed", type=int, help="Seed of the writers' key and op choices.")
@output_option
@click.pass_context
def workload_run(
    ctx: click.Context,
    zone: str,
    writers: int,
    keys_per_writer: int,
    duration: float,
    record_path: Path,
    delete_ratio: float,
    readers: int,
    seed: int | None,
    output: Output,
) -> None:
    """Run writers against ZONE for --duration seconds (Ctrl-C/SIGTERM stop early), recording
    every write to --record; prints acks, failures and latency (a progress bar on stderr while it
    runs, when that is a terminal)."""
    import asyncio

    from placement.aio import stop_on_signals
    from placement.data.workload import run_writers

    if not record_path.parent.is_dir():
        raise InvalidInput("--record", f"directory {record_path.parent} does not exist", "")

    async def body(client: DataClient) -> Any:
        stop = asyncio.Event()
        with stop_on_signals(stop), output.progress() as bars:
            return await run_writers(
                client,
                zone,
                writers,
                keys_per_writer,
                duration,
                record_path,
                stop,
                delete_ratio=delete_ratio,
                readers=readers,
                seed=seed,
                progress=workload_progress(bars, duration),
            )

    stats = with_data_client(ctx, body)
    failures = ", ".join(f"{k} {v}" for k, v in sorted(stats.failures.items())) or "none"
    output.emit(
        {"zone": zone, "record": str(record_path), **stats.as_json()},
        lambda wide: (
            f"run {stats.run} on {zone}: {stats.acked}/{stats.attempted} writes acknowledged in "
            f"{stats.elapsed:.1f}s ({stats.throughput:.0f}/s), failures: {failures}; "
            f"latency p50 {stats.p50 * 1000:.1f} ms, p99 {stats.p99 * 1000:.1f} ms"
            f" -> {record_path}"
        ),
    )


@workload.command("check")
@click.option("--zone", required=True, help="Zone the record was written to.")
@path_option("--record", "record_path", "The JSONL record `workload run` wrote.", dir_okay=False)
@click.option(
    "--settle",
    type=float,
    default=10.0,
    show_default=True,
    help="Seconds to re-read replicas while they disagree (catch-up in progress).",
)
@output_option
@click.pass_context
def workload_check(
    ctx: click.Context, zone: str, record_path: Path, settle: float, output: Output
) -> None:
    """Check ZONE against a record: the API and every stable replica hold every acknowledged
    write, and replicas agree. Exit 1 on any violation."""
    from placement.data.checker import check_workload

    if not settle >= 0:
        raise InvalidInput("--settle", f"{settle} is negative", "seconds, e.g. 10")
    result = with_data_client(ctx, lambda c: check_workload(c, zone, record_path, settle=settle))
    output.emit(
        result.as_json(),
        lambda wide: "\n".join(
            [
                f"{'OK' if result.ok else 'FAILED'}: zone {zone} run {result.run}: "
                f"{result.acked_writes}/{result.attempted_writes} writes acknowledged over "
                f"{result.keys} keys; lost {result.lost}, wrong {result.wrong}; replicas: "
                f"{result.replicas_checked} checked in {result.partitions_checked} partitions, "
                f"divergent {result.divergent_replicas}, lost {result.replica_lost}, "
                f"wrong {result.replica_wrong}, unreadable {result.unreachable_replicas}; "
                f"{result.reads} reads: {result.nonlinearizable} keys not linearizable"
                + (f" ({result.undecided} undecided)" if result.undecided else ""),
                *(f"  {example}" for example in result.examples),
            ]
        ),
    )
    if not result.ok:
        sys.exit(1)
