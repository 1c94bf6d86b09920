"""``placectl``: the operator's command line.

Every error the user can cause ends as one line on stderr and exit code 2 — never a traceback.
Commands that write files write them atomically (temp file + rename), so a failed run leaves
nothing behind.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, NoReturn

import click

from placement.cli.driver import driver
from placement.cli.ops import COMMANDS as OPS_COMMANDS
from placement.cli.pipeline import pipeline
from placement.errors import PlacementError

DEFAULT_ENDPOINT = "127.0.0.1:7400"


def fail(message: str) -> NoReturn:
    """Prints one clear line and exits 2 (the exit code for bad input everywhere)."""
    click.echo(f"placectl: error: {message}", err=True)
    sys.exit(2)


def write_json_atomically(path: Path, data: Any) -> None:
    """Writes ``data`` as JSON to ``path`` so that readers see the whole file or none of it."""
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        fail(f"--output: directory {directory} does not exist (create it first)")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--endpoint",
    default=DEFAULT_ENDPOINT,
    show_default=True,
    envvar="PLACECTL_ENDPOINT",
    help="Placement driver address(es), HOST:PORT[,HOST:PORT...]; any instance works.",
)
@click.pass_context
def cli(ctx: click.Context, endpoint: str) -> None:
    """Operate the replica-placement control plane."""
    ctx.obj = {"endpoints": [e.strip() for e in endpoint.split(",") if e.strip()]}


@cli.command()
@click.option(
    "--input",
    "input_path",
    required=True,
    type=click.Path(path_type=Path),
    help="Cluster snapshot JSON, or a directory written by `placectl pipeline export`.",
)
@click.option(
    "--output",
    "output_path",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="Where to write the plan JSON.",
)
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
    "--add-node", multiple=True, metavar="NAME[,attr=value...]", help="What if this node joined."
)
@click.option("--remove-node", multiple=True, metavar="NAME", help="What if this node left.")
@click.option(
    "--set-replicas", multiple=True, metavar="ZONE=R", help="What if ZONE had R replicas."
)
@click.option(
    "--set-partitions", multiple=True, metavar="ZONE=P", help="What if ZONE had P partitions."
)
def plan(
    input_path: Path,
    output_path: Path,
    engine: str,
    master: str | None,
    spark_conf: tuple[str, ...],
    add_node: tuple[str, ...],
    remove_node: tuple[str, ...],
    set_replicas: tuple[str, ...],
    set_partitions: tuple[str, ...],
) -> None:
    """Compute the target assignment of every zone in a snapshot, with moves and balance."""
    from placement.cli.pipeline import run_plan

    summary = run_plan(
        input_path,
        output_path,
        engine=engine,
        master=master,
        spark_conf=spark_conf,
        add_nodes=add_node,
        remove_nodes=remove_node,
        set_replicas=set_replicas,
        set_partitions=set_partitions,
    )
    click.echo(
        f"planned {summary['zones']} zone(s): {summary['moves']} move(s), "
        f"{summary['bytes_to_move']} byte(s) to move, node load spread "
        f"{summary['spread_before']} -> {summary['spread']} -> {output_path}"
    )


def main(argv: list[str] | None = None) -> None:
    """Console entry point: domain errors become one line and exit code 2."""
    try:
        cli.main(args=argv, prog_name="placectl", standalone_mode=False)
    except click.exceptions.Abort:
        fail("aborted")
    except click.ClickException as e:
        e.show()
        sys.exit(2)
    except PlacementError as e:
        fail(str(e))
    except KeyboardInterrupt:
        sys.exit(130)


cli.add_command(driver)
for _command in OPS_COMMANDS:
    cli.add_command(_command)
cli.add_command(pipeline)
import placement.cli.data  # noqa: E402, F401  (registers `placectl data` and `workload`)
