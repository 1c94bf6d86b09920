"""``placectl up``: a local cluster (etcd, drivers, agents, a demo zone) until Ctrl-C/SIGTERM;
mutual TLS and etcd auth unless ``--insecure`` (design/deployment.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command("up")
@click.option("--nodes", "n_nodes", type=click.IntRange(1, 64), default=3, show_default=True)
@click.option("--drivers", type=click.IntRange(1, 9), default=2, show_default=True)
@click.option("--etcd", "etcd_endpoints", help="Use this etcd instead of starting one.")
@click.option("--data-dir", type=click.Path(path_type=Path, file_okay=False), help="State dir.")
@click.option(
    "--api-port",
    type=click.IntRange(0, 65535),
    default=7400,
    show_default=True,
    help="Port of the first driver's API (the CLI's default endpoint); 0 = any free.",
)
@click.option("--prefix", default="/placement", show_default=True, help="Metastore key prefix.")
@click.option("--no-status", is_flag=True, help="Print endpoints, then wait (no live table).")
@click.option(
    "--insecure",
    is_flag=True,
    help="Plaintext everywhere: no certificates, no etcd auth (default: mutual TLS, etcd auth).",
)
@click.option(
    "--etcd-members",
    type=click.Choice(["1", "3"]),
    default="1",
    show_default=True,
    help="Members of the etcd cluster it starts on loopback.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Log format of every driver and agent (their logs are in DATA_DIR/logs).",
)
def up(
    n_nodes: int,
    drivers: int,
    etcd_endpoints: str | None,
    data_dir: Path | None,
    api_port: int,
    prefix: str,
    no_status: bool,
    insecure: bool,
    etcd_members: str,
    log_format: str,
) -> None:
    """Start a local cluster (etcd, drivers, agents, a demo zone) until Ctrl-C/SIGTERM."""
    from placement.local.cluster import UpOptions, run_up

    code = run_up(
        UpOptions(
            nodes=n_nodes,
            drivers=drivers,
            etcd=etcd_endpoints,
            data_dir=data_dir,
            api_port=api_port,
            live=not no_status,
            prefix=prefix,
            insecure=insecure,
            etcd_members=int(etcd_members),
            log_format=log_format,
        )
    )
    sys.exit(code)
