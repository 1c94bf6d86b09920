"""``placectl driver run``: one placement-driver instance (leader election, driving, API server).

The process serves a ``grpc.aio`` server on ``--listen`` with standard health checking and server
reflection, plus what ``add_servicers(server, driver) -> service names`` adds — by default
``placement.api.service.add_to_server``: the client API on the driver's ``client``/``keys`` with the
:class:`~placement.driver.loop.Driver` as its leadership view (``fence()``/``leader_api()``).

Prints ``driver ID serving on HOST:PORT`` once serving; logs ``leader ID epoch E`` when it
leads and ``ID stepping down (epoch E): REASON`` when it stops leading. SIGTERM/SIGINT: stop
driving, resign (the next instance takes over at once), stop the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence

import click
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from placement.api.service import add_to_server
from placement.core.names import validate_name
from placement.driver.leases import LeaseConfig
from placement.driver.loop import Driver, DriverConfig
from placement.errors import InvalidInput
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import DEFAULT_PREFIX, KeySpace

AddServicers = Callable[[grpc.aio.Server, Driver], Sequence[str]]


def _split_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise InvalidInput("--listen", f"{listen!r} is not HOST:PORT", "e.g. 127.0.0.1:7400")
    return host, int(port)


async def serve_driver(
    endpoints: Sequence[str],
    listen: str,
    member_id: str,
    *,
    prefix: str = DEFAULT_PREFIX,
    lease_ttl: int = 5,
    max_moves_global: int = 64,
    max_moves_per_node: int = 8,
    primary_lease: float = 10.0,
    add_servicers: AddServicers | None = None,
    announce: Callable[[str], None] = lambda line: print(line, flush=True),
) -> int:
    """Run one instance until SIGTERM/SIGINT; returns the exit status."""
    keys = KeySpace(prefix)
    validate_name(member_id, "member")
    host, port = _split_listen(listen)
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as e:
        raise InvalidInput("--listen", f"cannot bind {listen}: {e}", "pick a free port") from e
    address = f"{host}:{bound}"
    config = DriverConfig(
        member_id=member_id,
        api_address=address,
        lease_ttl=lease_ttl,
        max_moves_global=max_moves_global,
        max_moves_per_node=max_moves_per_node,
        leases=LeaseConfig(
            duration_ms=int(primary_lease * 1000), renew_before_ms=int(primary_lease * 500)
        ),
    )
    async with EtcdClient(list(endpoints)) as client:
        driver = Driver(client, keys, config)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        added = list((add_servicers or add_to_server)(server, driver))
        reflection.enable_server_reflection(
            [*added, health.SERVICE_NAME, reflection.SERVICE_NAME], server
        )
        for service in ("", *added):
            await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
        await server.start()
        announce(f"driver {member_id} serving on {address}")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        run = asyncio.create_task(driver.run(), name="driver")
        stopped = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({run, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (run, stopped):
                task.cancel()
            await asyncio.gather(run, stopped, return_exceptions=True)
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
@click.option("--id", "member_id", default=None, help="Instance name (default: hostname-pid).")
@click.option(
    "--lease-ttl", default=5, show_default=True, type=click.IntRange(2, 3600),
    help="Election lease TTL in seconds.",
)  # fmt: skip
@click.option("--prefix", default=DEFAULT_PREFIX, show_default=True, help="etcd key prefix.")
@click.option(
    "--max-moves", default=64, show_default=True, type=click.IntRange(1, 100_000),
    help="Partitions being moved at once, in total.",
)  # fmt: skip
@click.option(
    "--max-moves-per-node", default=8, show_default=True, type=click.IntRange(1, 100_000),
    help="Partitions being moved at once onto one node.",
)  # fmt: skip
@click.option(
    "--primary-lease", default=10.0, show_default=True, type=click.FloatRange(1.0, 3600.0),
    help="Seconds a partition's primary lease lasts (renewed at half); a dead primary is "
    "replaced after it expires.",
)  # fmt: skip
@click.option("--log-level", default="INFO", show_default=True, help="Python logging level.")
def run(
    etcd: str,
    listen: str,
    member_id: str | None,
    lease_ttl: int,
    prefix: str,
    max_moves: int,
    max_moves_per_node: int,
    primary_lease: float,
    log_level: str,
) -> None:
    """Run one driver instance until SIGTERM/SIGINT."""
    logging.basicConfig(
        level=log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    endpoints = [e.strip() for e in etcd.split(",") if e.strip()]
    name = member_id or f"{socket.gethostname()}-{os.getpid()}"
    with contextlib.suppress(KeyboardInterrupt):
        status = asyncio.run(
            serve_driver(
                endpoints,
                listen,
                name,
                prefix=prefix,
                lease_ttl=lease_ttl,
                max_moves_global=max_moves,
                max_moves_per_node=max_moves_per_node,
                primary_lease=primary_lease,
            )
        )
        sys.exit(status)
