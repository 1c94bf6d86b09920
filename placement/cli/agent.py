"""``placectl agent run``: one replica agent process (registers its node in etcd)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from placement.cli.common import parse_pairs, run


@click.group()
def agent() -> None:
    """Replica agents."""


@agent.command("run")
@click.option("--etcd", "etcd_endpoints", required=True, help="etcd HOST:PORT[,...]")
@click.option("--node", required=True, help="This node's name.")
@click.option("--listen", required=True, help="HOST:PORT to serve on (port 0 = any free).")
@click.option("--data-dir", required=True, type=click.Path(path_type=Path, file_okay=False))
@click.option("--prefix", default="/placement", show_default=True, help="Metastore key prefix.")
@click.option("--attribute", multiple=True, metavar="K=V", help="Node attribute (repeatable).")
@click.option("--lease-ttl", type=click.IntRange(min=2), default=5, show_default=True)
@click.option(
    "--catch-up-mbps",
    type=click.FloatRange(min=0),
    default=64.0,
    show_default=True,
    help="Catch-up bandwidth of this agent in MB/s (0 = unlimited).",
)
@click.option(
    "--isr-timeout",
    type=click.FloatRange(min=0.2),
    default=3.0,
    show_default=True,
    help="Seconds a replica may stay silent before its primary drops it from the in-sync set.",
)
def agent_run(
    etcd_endpoints: str,
    node: str,
    listen: str,
    data_dir: Path,
    prefix: str,
    attribute: tuple[str, ...],
    lease_ttl: int,
    catch_up_mbps: float,
    isr_timeout: float,
) -> None:
    """Run a replica agent that registers NODE in etcd (until SIGTERM/SIGINT)."""
    import logging

    from replica.data.plane import DataConfig
    from replica.server import serve

    attributes = parse_pairs(attribute, "--attribute")
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    code = run(
        serve(
            node,
            listen,
            data_dir,
            etcd=etcd_endpoints,
            prefix=prefix,
            attributes=attributes,
            lease_ttl=lease_ttl,
            data_config=DataConfig(
                isr_timeout=isr_timeout, catch_up_bytes_per_s=catch_up_mbps * 1e6
            ),
        )
    )
    sys.exit(code)
