"""The Spark side of a command that runs on either engine (``placectl plan``, ``placectl
pipeline report``): its options, and one sequence from the master to the session —
probe the master (an unreachable one fails before anything is packed), ship the executors'
environment (``--ship-env``), start the session, watch its stages, and turn a failure of the
executors' Python into one line (design/pipeline.md, "Shipping the environment").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from placement.cli.common import Bars, stacked
from placement.errors import InvalidInput
from placement.pipeline.whatif import split_setting

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from placement.pipeline.ship_env import ShipEnv
    from placement.pipeline.spark_master import Master
    from placement.pipeline.spark_progress import StageProgress

StageReport = Callable[[Sequence["StageProgress"]], None]
F = TypeVar("F", bound=Callable[..., Any])


def spark_options(engine_help: str) -> Callable[[F], F]:
    """``--engine local|spark``, ``--master``, ``--spark-conf`` and ``--ship-env``."""
    return stacked(
        click.option(
            "--engine",
            type=click.Choice(["local", "spark"]),
            default="local",
            show_default=True,
            help=engine_help,
        ),
        click.option(
            "--master", default=None, help="Spark master URL for --engine spark [local[*]]."
        ),
        click.option(
            "--spark-conf",
            multiple=True,
            metavar="KEY=VALUE",
            help="Extra Spark setting (repeatable).",
        ),
        click.option(
            "--ship-env",
            default=None,
            metavar="auto|none|PATH",
            help="What the executors run: auto packs this environment (the product and its"
            " dependencies) and ships it to a cluster master's executors, nothing for"
            " local[...]; none ships nothing; PATH or URI ships that archive (`placectl"
            " pipeline pack-env`). [auto]",
        ),
    )


def check_spark_options(
    engine: str, master: str | None, spark_conf: Sequence[str], ship_env: str | None
) -> None:
    """``--master``, ``--spark-conf`` and ``--ship-env`` only go with ``--engine spark``."""
    if engine == "spark":
        return
    given = (("--master", master), ("--spark-conf", spark_conf), ("--ship-env", ship_env))
    for option, value in given:
        if value:
            raise InvalidInput(option, "only applies to --engine spark", "add --engine spark")


def parse_conf(items: Sequence[str]) -> dict[str, str]:
    """``--spark-conf KEY=VALUE`` options -> a dict."""
    return dict(split_setting("--spark-conf", item, "spark.driver.memory=4g") for item in items)


@dataclass(frozen=True, slots=True)
class SparkChoice:
    """What ``--master``, ``--spark-conf`` and ``--ship-env`` chose, validated."""

    master: Master
    conf: Mapping[str, str]
    ship: ShipEnv


def parse_spark_options(
    engine: str, master: str | None, spark_conf: Sequence[str], ship_env: str | None
) -> SparkChoice:
    """The Spark options, checked (only with ``--engine spark``) and parsed: the defaults
    ``local[*]`` and ``auto`` when not given."""
    # imported here: the local engine never needs them (``placectl plan``'s start-up)
    from placement.pipeline.ship_env import parse_ship_env
    from placement.pipeline.spark_master import DEFAULT_MASTER, parse_master

    check_spark_options(engine, master, spark_conf, ship_env)
    return SparkChoice(
        parse_master(master or DEFAULT_MASTER),
        parse_conf(spark_conf),
        parse_ship_env(ship_env or "auto"),
    )


def announce_pack(archive: Path) -> None:
    """Says on stderr that the executors' environment was packed (once per content)."""
    size = archive.stat().st_size / 2**20
    click.echo(f"packed the executors' environment: {archive} ({size:.0f} MiB)", err=True)


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


@contextlib.contextmanager
def spark_run(
    choice: SparkChoice,
    *,
    app: str,
    stages: StageReport | None = None,
    packed: Callable[[Path], None] | None = None,
) -> Iterator[SparkSession]:
    """The session a command's Spark jobs run in, its stages reported to ``stages`` (from
    another thread) and ``packed`` told of an environment archive packed now (not cached).
    A job whose executors could not run the product fails as one InvalidInput line."""
    from pyspark.sql import SparkSession

    from placement.pipeline.ship_env import archive_for, executor_failure
    from placement.pipeline.spark_master import probe_master
    from placement.pipeline.spark_plan import start_spark
    from placement.pipeline.spark_progress import StageWatcher

    master, conf, ship = choice.master, choice.conf, choice.ship
    probe_master(master)
    archive, fresh = archive_for(ship, master)
    if fresh is not None and packed is not None:
        packed(fresh)
    # A session this run starts is this run's to stop; one already active (a caller's, in the
    # same process) is left running for it.
    owned = SparkSession.getActiveSession() is None
    spark = start_spark(master, conf, archive=archive, app=app)
    try:
        with StageWatcher(spark.sparkContext.statusTracker(), stages or (lambda found: None)):
            yield spark
    except Exception as e:
        failure = executor_failure(e, ship, master)
        if failure is None:
            raise
        raise failure from None
    finally:
        if owned:
            # Stopped before the command says anything more: a session left to die with the
            # process logged the executors' lost connections (Java stack traces) after the
            # command's one-line error.
            with contextlib.suppress(Exception):
                spark.sparkContext.cancelAllJobs()
            with contextlib.suppress(Exception):
                spark.stop()
