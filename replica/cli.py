"""The one agent command: ``run`` (``python -m replica`` runs it alone; ``placectl agent run`` is
the same command in ``placectl``).

``run --node NAME --listen HOST:PORT [--advertise HOST:PORT] --data-dir DIR [--etcd ENDPOINTS
[--prefix P] [--attribute K=V ...]]`` runs one replica agent until SIGTERM/SIGINT; with
``--etcd`` it registers its node record (with the ``--advertise`` address, default the
``--listen`` one) and runs the data plane (design/control-plane.md, design/data-plane.md).

Exit status: 0 after SIGTERM/SIGINT, 1 after a fatal store error or when etcd does not answer,
2 for bad input (one line on stderr naming the option).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import click

from placement import failpoints
from placement.errors import PlacementError, StoreUnavailable
from placement.logs import configure_logging
from placement.runtime import tune_gc
from placement.security.credentials import EtcdCredentials
from placement.security.flags import etcd_flags, tls_flags
from placement.security.tls import TlsMaterial
from replica.data.plane import DataConfig
from replica.registration import parse_attributes
from replica.server import serve

#: The program name of ``python -m replica`` in usage and error lines.
PROG = "python -m replica"


@click.command("run", context_settings={"show_default": True})
@click.option("--node", required=True, help="This node's name (1-64 of [A-Za-z0-9_.-]).")
@click.option("--listen", required=True, help="HOST:PORT to serve on (port 0 = any free).")
@click.option(
    "--advertise",
    default=None,
    help="HOST:PORT other processes dial (port 0 = the bound one); needed when --listen binds "
    "every interface (default: the --listen address).",
)
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="Directory of the agent's database (agent.db).",
)
@click.option("--grace", type=float, default=5.0, help="Seconds for in-flight RPCs.")
@click.option("--etcd", help="etcd HOST:PORT[,...]: register this node there, run the data plane.")
@click.option("--prefix", default="/placement", help="Metastore key prefix.")
@click.option("--attribute", multiple=True, metavar="K=V", help="Node attribute (repeatable).")
@click.option(
    "--lease-ttl", type=click.IntRange(min=2), default=5, help="Registration lease seconds."
)
@click.option(
    "--catch-up-mbps",
    type=click.FloatRange(min=0),
    default=64.0,
    help="Catch-up bandwidth of this agent in MB/s (0 = unlimited).",
)
@click.option(
    "--catch-up-yields/--catch-up-fixed",
    default=True,
    help="Run catch-up and re-sharding copies below --catch-up-mbps while they slow this"
    " agent's client writes (the default), or always at it.",
)
@click.option(
    "--isr-timeout",
    type=click.FloatRange(min=0.2),
    default=3.0,
    help="Seconds a replica may stay silent before its primary drops it from the in-sync set.",
)
@click.option(
    "--log-level", default="INFO", help="Python logging level (DEBUG, INFO, WARNING, ERROR)."
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    help="Log lines as text, or one JSON object per line (design/observability.md).",
)
@click.option(
    "--metrics-listen",
    default=None,
    metavar="HOST:PORT",
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (off by default).",
)
@tls_flags()
@etcd_flags
def run(
    node: str,
    listen: str,
    advertise: str | None,
    data_dir: Path,
    grace: float,
    etcd: str | None,
    prefix: str,
    attribute: tuple[str, ...],
    lease_ttl: int,
    catch_up_mbps: float,
    catch_up_yields: bool,
    isr_timeout: float,
    log_level: str,
    log_format: str,
    metrics_listen: str | None,
    tls: TlsMaterial | None,
    etcd_credentials: EtcdCredentials,
) -> None:
    """Run a replica agent (until SIGTERM/SIGINT); with --etcd it registers NODE there."""
    try:
        failpoints.load()  # a bad PLACEMENT_FAILPOINTS stops the agent here, named
        attributes = parse_attributes(attribute)
        configure_logging(log_level, log_format, {"component": "agent", "node": node})
        tune_gc()
        code = asyncio.run(
            serve(
                node,
                listen,
                data_dir,
                grace=grace,
                etcd=etcd,
                prefix=prefix,
                attributes=attributes,
                lease_ttl=lease_ttl,
                advertise=advertise,
                data_config=DataConfig(
                    isr_timeout=isr_timeout,
                    catch_up_bytes_per_s=catch_up_mbps * 1e6,
                    catch_up_yields=catch_up_yields,
                ),
                tls=tls,
                etcd_credentials=etcd_credentials,
                metrics_listen=metrics_listen,
            )
        )
    except StoreUnavailable as e:
        _fail(str(e), 1)
    except PlacementError as e:
        _fail(str(e), 2)
    sys.exit(code)


def _fail(message: str, code: int) -> NoReturn:
    prog = click.get_current_context().find_root().info_name or PROG
    click.echo(f"{prog}: error: {message}", err=True)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m replica``: :func:`run` on its own; a usage error is one line, exit 2."""
    try:
        run.main(args=argv, prog_name=PROG, standalone_mode=False)
    except click.ClickException as e:
        click.echo(f"{PROG}: error: {e.format_message()}", err=True)
        sys.exit(2)
