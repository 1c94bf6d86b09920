"""``placectl driver run``: one placement-driver instance (leader election, driving, API server).

The process serves a ``grpc.aio`` server on ``--listen`` from the one server factory
(:mod:`placement.rpc`: health checking and server reflection), plus what
``add_servicers(server, driver) -> service names`` adds — by default
``placement.api.servicer.add_to_server``: the client API on the driver's ``client``/``keys`` with
the :class:`~placement.driver.loop.Driver` as its leadership view (``fence()``/``leader_api()``).

Prints ``driver ID serving on HOST:PORT`` once serving; logs ``leader ID epoch E`` when it
leads and ``ID stepping down (epoch E): REASON`` when it stops leading. SIGTERM/SIGINT: stop
driving, resign (the next instance takes over at once), stop the server.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import click

from placement.api.dashboard import CLIENT_CERT_CHOICES, ClientCert
from placement.core.names import validate_name
from placement.core.throttles import (
    DEFAULT_MAX_BYTES_PER_NODE,
    DEFAULT_MAX_MOVES,
    DEFAULT_MAX_MOVES_PER_NODE,
)
from placement.metastore.keys import DEFAULT_PREFIX, KeySpace
from placement.security.flags import etcd_flags, tls_flags

if TYPE_CHECKING:
    import grpc

    from placement.driver.loop import Driver
    from placement.security.credentials import EtcdCredentials
    from placement.security.tls import TlsMaterial

    AddServicers = Callable[[grpc.aio.Server, Driver], Sequence[str]]

#: Operations (compares and ops) of the driver's write transactions in flight at once: two
#: full transactions. A pass's zones write concurrently, and eight queued transactions of 128
#: keys each held etcd's applies — and so every lease renewal — for seconds (design/deployment.md,
#: "etcd under write bursts").
WRITE_WINDOW = 2 * 129


async def serve_driver(
    endpoints: Sequence[str],
    listen: str,
    member_id: str,
    *,
    advertise: str | None = None,
    prefix: str = DEFAULT_PREFIX,
    lease_ttl: int = 5,
    max_moves_global: int = DEFAULT_MAX_MOVES,
    max_moves_per_node: int = DEFAULT_MAX_MOVES_PER_NODE,
    max_bytes_per_node: int = DEFAULT_MAX_BYTES_PER_NODE,
    primary_lease: float = 10.0,
    probe_holders: bool = True,
    add_servicers: AddServicers | None = None,
    announce: Callable[[str], None] = lambda line: print(line, flush=True),
    tls: TlsMaterial | None = None,
    etcd_credentials: EtcdCredentials | None = None,
    metrics_listen: str | None = None,
    http_listen: str | None = None,
    http_client_cert: ClientCert = "required",
) -> int:
    """Run one instance until SIGTERM/SIGINT; returns the exit status. With ``metrics_listen``
    (HOST:PORT) it serves Prometheus metrics at ``/metrics`` there, with ``http_listen`` the web
    dashboard (``http_client_cert``: whether browsers must present a certificate under TLS) —
    design/observability.md."""
    import asyncio

    from placement.aio import cancel_and_wait, first_done, stop_on_signals
    from placement.api.servicer import add_to_server
    from placement.driver.health import PROBE_EVERY, follow_etcd
    from placement.driver.leases import LeaseConfig
    from placement.driver.loop import Driver, DriverConfig
    from placement.metastore.etcd import EtcdClient
    from placement.metastore.readcache import ReadCache
    from placement.metrics import parse_listen, register_collector, serve_metrics
    from placement.rpc import advertised_address, bind_server, set_serving, start_server

    keys = KeySpace(prefix)
    if metrics_listen is not None:
        parse_listen(metrics_listen)  # bad input fails before anything binds
    if http_listen is not None:
        parse_listen(http_listen, "--http-listen")
    validate_name(member_id, "member")
    if tls is not None:
        from placement.security.pki import Role, require_identity

        require_identity(tls.cert, Role.DRIVER)
    advertised_address(listen, advertise)  # bad input fails before anything binds
    server, bound = bind_server(listen, tls=tls)
    address = advertised_address(listen, advertise, bound)
    config = DriverConfig(
        member_id=member_id,
        api_address=address,
        lease_ttl=lease_ttl,
        max_moves_global=max_moves_global,
        max_moves_per_node=max_moves_per_node,
        max_bytes_per_node=max_bytes_per_node,
        leases=LeaseConfig(
            duration_ms=int(primary_lease * 1000), renew_before_ms=int(primary_lease * 500)
        ),
        probe_holders=probe_holders,
    )
    async with (
        contextlib.AsyncExitStack() as closing,
        EtcdClient(
            list(endpoints), credentials=etcd_credentials, write_window=WRITE_WINDOW
        ) as client,
        EtcdClient(
            list(endpoints), credentials=etcd_credentials, call_timeout=2 * PROBE_EVERY
        ) as probe_client,
    ):
        await client.check_access(keys.prefix)  # a refused credential ends the process now
        driver = Driver(client, keys, config, tls=tls)
        reads = None
        if add_servicers is None or http_listen is not None:  # someone answers from it
            reads = ReadCache(client, keys)  # GetAssignments, GetZoneStatus, ListNodes, dashboard
            reads.start()
            closing.push_async_callback(reads.close)
        closing.callback(register_collector(driver.gauges))  # unregistered on the way out
        closing.callback(register_collector(driver.etcd_health.gauges))
        if metrics_listen is not None:
            metrics_server = serve_metrics(metrics_listen, tls)
            closing.callback(metrics_server.close)
            logging.getLogger(__name__).info("metrics at http://%s/metrics", metrics_server.address)
        if http_listen is not None:
            from placement.api.dashboard.document import DashboardSource
            from placement.api.dashboard.server import serve_dashboard

            source = DashboardSource(
                client, keys, member_id, driver, cache=reads, alarms=driver.etcd_health.details
            )
            dashboard = await serve_dashboard(http_listen, source, tls, http_client_cert)
            closing.push_async_callback(dashboard.close)
            logging.getLogger(__name__).info("dashboard at %s", dashboard.url)
        if add_servicers is None:
            added = add_to_server(server, driver, reads)
        else:
            added = add_servicers(server, driver)
        health_servicer = await start_server(server, added)
        stop = asyncio.Event()

        async def serving(flag: bool) -> None:
            await set_serving(health_servicer, added, flag)

        quorum = asyncio.create_task(
            follow_etcd(probe_client, keys.leader_prefix(), serving, driver.etcd_health),
            name="etcd-health",
        )
        with stop_on_signals(stop):
            # announced once SIGTERM/SIGINT stop it cleanly (a script may signal at once)
            announce(f"driver {member_id} serving on {address}")
            try:
                run, _ = await first_done(
                    asyncio.create_task(driver.run(), name="driver"), stop.wait()
                )
            finally:
                with contextlib.suppress(Exception):  # the probe's own failure: shutdown goes on
                    await cancel_and_wait(quorum)
                await health_servicer.enter_graceful_shutdown()
                await server.stop(2.0)
                await driver.agents.close()
        if run.done() and not run.cancelled() and run.exception() is not None:
            raise run.exception()  # type: ignore[misc]
    return 0


@click.group("driver")
def driver() -> None:
    """Run placement-driver instances."""


@driver.command("run")
@click.option("--etcd", "etcd", required=True, help="etcd endpoints HOST:PORT[,HOST:PORT...].")
@click.option("--listen", required=True, help="HOST:PORT of the API server (port 0 = any free).")
@click.option(
    "--advertise",
    default=None,
    help="HOST:PORT clients and other drivers dial (port 0 = the bound one); needed when "
    "--listen binds every interface (default: the --listen address).",
)
@click.option("--id", "member_id", default=None, help="Instance name (default: hostname-pid).")
@click.option(
    "--lease-ttl", default=5, show_default=True, type=click.IntRange(2, 3600),
    help="Election lease TTL in seconds.",
)  # fmt: skip
@click.option("--prefix", default=DEFAULT_PREFIX, show_default=True, help="etcd key prefix.")
@click.option(
    "--max-moves", default=DEFAULT_MAX_MOVES, show_default=True,
    type=click.IntRange(1, 100_000), help="Partitions being moved at once, in total.",
)  # fmt: skip
@click.option(
    "--max-moves-per-node", default=DEFAULT_MAX_MOVES_PER_NODE, show_default=True,
    type=click.IntRange(1, 100_000), help="Partitions being moved at once onto one node.",
)  # fmt: skip
@click.option(
    "--max-mib-per-node", "max_mib_per_node", default=DEFAULT_MAX_BYTES_PER_NODE // 2**20,
    show_default=True, type=click.IntRange(1, 10**7),
    help="MiB being copied at once onto one node (a move counts its partition's largest "
    "replica, at least 1 MiB; a larger one runs alone).",
)  # fmt: skip
@click.option(
    "--primary-lease", default=10.0, show_default=True, type=click.FloatRange(1.0, 3600.0),
    help="Seconds a partition's primary lease lasts (renewed at half); a dead primary is "
    "replaced after it expires.",
)  # fmt: skip
@click.option(
    "--probe-holders/--no-probe-holders", default=True, show_default=True,
    help="Health-check a lease's holder before renewing or granting it, so a killed agent's "
    "leases are not renewed while its node record lingers (design/control-plane.md).",
)  # fmt: skip
@click.option("--log-level", default="INFO", show_default=True, help="Python logging level.")
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
    help="Log lines as text, or one JSON object per line (design/observability.md).",
)  # fmt: skip
@click.option(
    "--metrics-listen", default=None, metavar="HOST:PORT",
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (off by default).",
)  # fmt: skip
@click.option(
    "--http-listen", default=None, metavar="HOST:PORT",
    help="Serve the read-only web dashboard at HOST:PORT (HTTPS under TLS; off by default).",
)  # fmt: skip
@click.option(
    "--http-client-cert", type=click.Choice(CLIENT_CERT_CHOICES), default="required",
    show_default=True,
    help="Under TLS, whether the dashboard requires a client certificate of the cluster's CA "
    "(a role the read commands allow) or serves any browser (design/observability.md).",
)  # fmt: skip
@tls_flags()
@etcd_flags
def run(
    etcd: str,
    listen: str,
    advertise: str | None,
    member_id: str | None,
    lease_ttl: int,
    prefix: str,
    max_moves: int,
    max_moves_per_node: int,
    max_mib_per_node: int,
    primary_lease: float,
    probe_holders: bool,
    log_level: str,
    log_format: str,
    metrics_listen: str | None,
    http_listen: str | None,
    http_client_cert: ClientCert,
    tls: TlsMaterial | None,
    etcd_credentials: EtcdCredentials,
) -> None:
    """Run one driver instance until SIGTERM/SIGINT."""
    import asyncio

    from placement import failpoints
    from placement.errors import InvalidInput
    from placement.logs import configure_logging
    from placement.runtime import tune_gc

    try:
        failpoints.load()  # a bad PLACEMENT_FAILPOINTS stops the driver here, named
    except InvalidInput as e:
        raise click.UsageError(str(e)) from None
    endpoints = [e.strip() for e in etcd.split(",") if e.strip()]
    name = member_id or f"{socket.gethostname()}-{os.getpid()}"
    configure_logging(log_level, log_format, {"component": "driver", "driver": name})
    tune_gc()
    with contextlib.suppress(KeyboardInterrupt):
        status = asyncio.run(
            serve_driver(
                endpoints,
                listen,
                name,
                advertise=advertise,
                prefix=prefix,
                lease_ttl=lease_ttl,
                max_moves_global=max_moves,
                max_moves_per_node=max_moves_per_node,
                max_bytes_per_node=max_mib_per_node * 2**20,
                primary_lease=primary_lease,
                probe_holders=probe_holders,
                tls=tls,
                etcd_credentials=etcd_credentials,
                metrics_listen=metrics_listen,
                http_listen=http_listen,
                http_client_cert=http_client_cert,
            )
        )
        sys.exit(status)
