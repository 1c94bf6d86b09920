"""``placectl``: the operator's command line.

Every error the user can cause ends as one line on stderr and exit code 2 — never a traceback.
Commands that write files write them atomically (temp file + rename), so a failed run leaves
nothing behind.

The root group loads each command's module only when that command runs (or ``--help`` lists it),
so a read such as ``placectl zone status`` never imports the driver, the placement function,
etcd or the data pipeline (design/architecture.md).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import click

from placement.cli.common import LazyGroup, fail
from placement.errors import PlacementError
from placement.grpc_env import quiet_grpc_core
from placement.security.flags import tls_flags
from placement.security.tls import TlsMaterial

DEFAULT_ENDPOINT = "127.0.0.1:7400"

#: Every ``placectl`` command: name -> ``module:attribute`` of its click command or group.
COMMANDS: Mapping[str, str] = {
    "agent": "placement.cli.agent:agent",
    "assignments": "placement.cli.reads:assignments",
    "certs": "placement.cli.certs:certs",
    "completion": "placement.cli.completion:completion",
    "data": "placement.cli.data:data",
    "driver": "placement.cli.driver:driver",
    "inspect": "placement.cli.inspect:inspect",
    "node": "placement.cli.node:node",
    "nodes": "placement.cli.reads:nodes",
    "pipeline": "placement.cli.pipeline:pipeline",
    "plan": "placement.cli.plan:plan",
    "rebalance": "placement.cli.rebalance:rebalance",
    "up": "placement.cli.up:up",
    "workload": "placement.cli.workload:workload",
    "zone": "placement.cli.zone:zone",
}


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--endpoint",
    default=DEFAULT_ENDPOINT,
    show_default=True,
    envvar="PLACECTL_ENDPOINT",
    help="Placement driver address(es), HOST:PORT[,HOST:PORT...]; any instance works.",
)
@tls_flags(envvar_prefix="PLACECTL")
@click.version_option(
    package_name="placement", prog_name="placectl", message="%(prog)s %(version)s"
)
@click.pass_context
def cli(ctx: click.Context, endpoint: str, tls: TlsMaterial | None) -> None:
    """Operate the replica-placement control plane.

    With --cacert/--cert/--key (or PLACECTL_CACERT, PLACECTL_CERT, PLACECTL_KEY) every call is
    mutual TLS; the certificate's role decides what the drivers and agents let it do."""
    ctx.obj = {"endpoints": [e.strip() for e in endpoint.split(",") if e.strip()], "tls": tls}


def main(argv: list[str] | None = None) -> None:
    """Console entry point: domain errors become one line and exit code 2."""
    quiet_grpc_core()  # before a command imports grpc
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
