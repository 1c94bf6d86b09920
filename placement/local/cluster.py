"""``placectl up``: a whole local cluster in one command, torn down completely on Ctrl-C/SIGTERM.

Starts, in order: etcd (free loopback ports, data under ``--data-dir``) unless ``--etcd`` is
given; D drivers (``placectl driver run``; the first on ``--api-port``, the CLI's default
endpoint); N agents (``placectl agent run``, attribute ``rack=r{i mod 3}``); then creates the demo
zone and shows endpoints and a live status until stopped.

Every child runs in its own session (process group), so a terminal's Ctrl-C reaches only this
process, which then stops the children in reverse order: SIGTERM to each group, wait up to
``STOP_GRACE`` seconds, SIGKILL the group if it is still there, and reap it. Nothing it started
survives it (``tests/integration/test_up.py`` checks by process group). Logs: ``DIR/logs/*.log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import grpc
from rich.console import Console
from rich.live import Live
from rich.table import Table

from placement.api.client import ApiError, PlacementClient
from placement.errors import InvalidInput, PlacementError
from placement.metastore.codec import LeaderRecord, decode_leader
from placement.metastore.election import current_leader
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeySpace
from placement.v1 import driver_pb2

STOP_GRACE = 10.0
START_TIMEOUT = 60.0
DEMO_ZONE = "demo"
DEMO_PARTITIONS = 16


class Stopped(Exception):
    """SIGINT or SIGTERM arrived: unwind and stop every child."""


@dataclass(frozen=True, slots=True)
class UpOptions:
    nodes: int = 3
    drivers: int = 2
    etcd: str | None = None
    data_dir: Path | None = None
    api_port: int = 7400
    live: bool = True
    prefix: str = "/placement"
    lease_ttl: int = 3


@dataclass
class Child:
    name: str
    argv: list[str]
    log: Path
    address: str = ""
    proc: subprocess.Popen[bytes] | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # own process group: Ctrl-C is ours to relay
            )

    def stop(self, grace: float = STOP_GRACE) -> None:
        """SIGTERM the group, wait, SIGKILL the group if needed; always reaps."""
        proc = self.proc
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the child leads its own group
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)  # stragglers in the group (and the child if stuck)
        proc.wait()


@dataclass
class Cluster:
    base: Path
    etcd_endpoint: str
    driver_apis: list[str]
    prefix: str = "/placement"
    children: list[Child] = field(default_factory=list)

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop()


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports the kernel just handed out on 127.0.0.1 (bound together, then freed)."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def etcd_binary() -> str:
    for candidate in ("/usr/bin/etcd", "/usr/local/bin/etcd"):
        if os.access(candidate, os.X_OK):
            return candidate
    import shutil

    found = shutil.which("etcd")
    if found is None:
        raise InvalidInput("--etcd", "no etcd binary found", "install etcd-server or pass --etcd")
    return found


def _placectl() -> list[str]:
    return [sys.executable, "-m", "placement"]


def _wait_etcd(child: Child, endpoint: str, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.alive:
            raise PlacementError(f"etcd exited early; see {child.log}")
        try:
            with urllib.request.urlopen(f"http://{endpoint}/health", timeout=1.0) as r:
                if b'"health":"true"' in r.read():
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)
    raise PlacementError(f"etcd not healthy after {timeout:.0f}s; see {child.log}")


def start_cluster(opts: UpOptions, base: Path, console: Console) -> Cluster:
    """Start etcd (unless given), drivers and agents; the caller stops the returned cluster."""
    cluster = Cluster(base, opts.etcd or "", [], opts.prefix)
    logs = base / "logs"
    try:
        if opts.etcd is None:
            client_port, peer_port = free_ports(2)
            client_url = f"http://127.0.0.1:{client_port}"
            peer_url = f"http://127.0.0.1:{peer_port}"
            etcd = Child(
                "etcd",
                [
                    etcd_binary(),
                    "--name",
                    "up",
                    "--data-dir",
                    str(base / "etcd"),
                    "--listen-client-urls",
                    client_url,
                    "--advertise-client-urls",
                    client_url,
                    "--listen-peer-urls",
                    peer_url,
                    "--initial-advertise-peer-urls",
                    peer_url,
                    "--initial-cluster",
                    f"up={peer_url}",
                    "--logger",
                    "zap",
                    "--log-outputs",
                    "stderr",
                ],
                logs / "etcd.log",
                f"127.0.0.1:{client_port}",
            )
            cluster.children.append(etcd)
            etcd.start()
            _started(console, etcd)
            cluster.etcd_endpoint = f"127.0.0.1:{client_port}"
            _wait_etcd(etcd, cluster.etcd_endpoint)
            console.print(f"etcd      {cluster.etcd_endpoint}  (data {base / 'etcd'})")
        ports = free_ports(opts.drivers)
        if opts.api_port:
            if port_free(opts.api_port):
                ports[0] = opts.api_port
            else:
                console.print(
                    f"[yellow]port {opts.api_port} is taken; first driver on {ports[0]}[/]"
                )
        for i, port in enumerate(ports):
            api = f"127.0.0.1:{port}"
            driver = Child(
                f"driver-{i + 1}",
                [
                    *_placectl(),
                    "driver",
                    "run",
                    "--etcd",
                    cluster.etcd_endpoint,
                    "--listen",
                    api,
                    "--id",
                    f"driver-{i + 1}",
                    "--prefix",
                    opts.prefix,
                    "--lease-ttl",
                    str(opts.lease_ttl),
                ],
                logs / f"driver-{i + 1}.log",
                api,
            )
            cluster.children.append(driver)
            driver.start()
            _started(console, driver)
            cluster.driver_apis.append(api)
        for i in range(opts.nodes):
            node = f"node-{i + 1}"
            agent = Child(
                node,
                [
                    *_placectl(),
                    "agent",
                    "run",
                    "--etcd",
                    cluster.etcd_endpoint,
                    "--node",
                    node,
                    "--listen",
                    "127.0.0.1:0",
                    "--data-dir",
                    str(base / "agents" / node),
                    "--prefix",
                    opts.prefix,
                    "--attribute",
                    f"rack=r{i % 3 + 1}",
                    "--lease-ttl",
                    str(opts.lease_ttl),
                ],
                logs / f"{node}.log",
            )
            cluster.children.append(agent)
            agent.start()
            _started(console, agent)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _started(console: Console, child: Child) -> None:
    assert child.proc is not None
    console.print(f"started {child.name} pid {child.proc.pid}")


async def wait_ready(cluster: Cluster, opts: UpOptions, *, demo_zone: bool = True) -> None:
    """Wait until a driver answers and every agent registered; create the demo zone."""
    deadline = time.monotonic() + START_TIMEOUT
    async with PlacementClient(cluster.driver_apis, call_timeout=2.0, deadline=2.0) as client:
        while True:
            _check_children(cluster)
            try:
                found = await client.call(
                    lambda s, t: s.ListNodes(driver_pb2.ListNodesRequest(), timeout=t)
                )
                if len(found.nodes) >= opts.nodes:
                    break
            except ApiError as e:
                if not e.unavailable:
                    raise
            if time.monotonic() > deadline:
                raise PlacementError(
                    f"cluster not up after {START_TIMEOUT:.0f}s; logs in {cluster.base / 'logs'}"
                )
            await asyncio.sleep(0.2)
        if not demo_zone:
            return
        request = driver_pb2.CreateZoneRequest(
            name=DEMO_ZONE,
            config=driver_pb2.ZoneConfig(
                partitions=DEMO_PARTITIONS,
                replicas=min(3, opts.nodes),
                failure_domain="rack",
            ),
        )
        while True:
            try:
                await client.call(lambda s, t: s.CreateZone(request, timeout=t))
                return
            except ApiError as e:
                if e.code == grpc.StatusCode.ALREADY_EXISTS:
                    return
                if not e.unavailable or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.2)


def _check_children(cluster: Cluster) -> None:
    for child in cluster.children:
        if child.proc is not None and child.proc.poll() is not None:
            raise PlacementError(
                f"{child.name} exited with {child.proc.returncode}; see {child.log}"
            )


async def _status_table(cluster: Cluster, client: PlacementClient) -> Table:
    """Processes (pid, address, which driver leads), then the demo zone's status."""
    try:
        found = await client.call(
            lambda s, t: s.ListNodes(driver_pb2.ListNodesRequest(), timeout=t)
        )
        registered = {n.name: n.address for n in found.nodes}
    except PlacementError:
        registered = {}
    leader = await _leader(cluster)
    table = Table(title=f"placectl up — {cluster.base}", expand=False)
    for column in ("process", "pid", "state", "address", "role"):
        table.add_column(column)
    for child in cluster.children:
        proc = child.proc
        state = "running" if child.alive else f"exited ({proc and proc.returncode})"
        if child.name.startswith("driver-"):
            role = "leader" if child.name == leader else "follower"
        elif child.name == "etcd":
            role = "metastore"
        else:
            role = "registered" if child.name in registered else "not registered"
        address = child.address or registered.get(child.name, "-")
        table.add_row(child.name, str(proc.pid if proc else "-"), state, address, role)
    try:
        status = await client.call(
            lambda s, t: s.GetZoneStatus(driver_pb2.GetZoneRequest(name=DEMO_ZONE), timeout=t)
        )
        detail = f"{status.partitions_done}/{status.partitions_total} partitions stable"
        state = driver_pb2.ZoneState.Name(status.state)
    except PlacementError as e:
        detail, state = str(e), "unknown"
    table.add_row(f"zone {DEMO_ZONE}", "", state, detail, "")
    return table


async def _leader(cluster: Cluster) -> str | None:
    """The leading driver's id, from its election key (None when unknown)."""
    try:
        async with EtcdClient([cluster.etcd_endpoint], call_timeout=1.0) as client:
            kv = await current_leader(client, KeySpace(cluster.prefix))
    except PlacementError:
        return None
    record = decode_leader(kv.value) if kv is not None else None
    return record.member_id if isinstance(record, LeaderRecord) else None


async def _live(cluster: Cluster, console: Console, live: bool) -> None:
    async with PlacementClient(cluster.driver_apis, call_timeout=1.0, deadline=1.0) as client:
        if not live:
            await asyncio.Event().wait()  # until Ctrl-C/SIGTERM
        with Live(
            await _status_table(cluster, client), console=console, auto_refresh=False
        ) as view:
            while True:
                await asyncio.sleep(1.0)
                view.update(await _status_table(cluster, client), refresh=True)


#: The signals that stop ``placectl up`` (and every process it started).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _stop_signals_raise() -> Iterator[None]:
    """Explicit handlers for SIGINT and SIGTERM that unwind into the teardown.

    Explicit, not Python's default: a shell starts a background job (``placectl up &``) with
    SIGINT ignored, and Python keeps an inherited SIG_IGN instead of installing its
    KeyboardInterrupt handler — so ``kill -INT`` would otherwise do nothing. These handlers also
    cover the synchronous start-up, and ``asyncio.run`` leaves a non-default SIGINT handler alone.
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Stopped(signal.Signals(signum).name)

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def run_up(opts: UpOptions) -> int:
    """Run until Ctrl-C or SIGTERM; 0 after a clean stop, 1 when start-up failed."""
    console = Console(highlight=False)
    base = opts.data_dir or Path(tempfile.mkdtemp(prefix="placectl-up-"))
    base.mkdir(parents=True, exist_ok=True)
    with _stop_signals_raise():
        cluster: Cluster | None = None
        try:
            cluster = start_cluster(opts, base, console)
            with console.status("waiting for the drivers and agents ..."):
                asyncio.run(wait_ready(cluster, opts))
            endpoint = ",".join(cluster.driver_apis)
            console.print(f"drivers   {endpoint}")
            console.print(f"agents    {opts.nodes} (logs in {base / 'logs'})")
            console.print(f"demo zone {DEMO_ZONE} created; try:")
            console.print(f"  placectl --endpoint {endpoint} zone status {DEMO_ZONE} --watch")
            console.print(f"  placectl --endpoint {endpoint} assignments {DEMO_ZONE}")
            console.print(f"  placectl --endpoint {endpoint} data put {DEMO_ZONE} hello world")
            console.print(f"  placectl --endpoint {endpoint} data scan {DEMO_ZONE}")
            console.print(
                f"  placectl --endpoint {endpoint} workload run --zone {DEMO_ZONE}"
                " --duration 10 --record run.jsonl"
            )
            console.print(f"  placectl inspect --etcd {cluster.etcd_endpoint}")
            console.print("cluster up; Ctrl-C stops every process")
            asyncio.run(_live(cluster, console, opts.live))
            return 0
        except (KeyboardInterrupt, Stopped):
            return 0
        except PlacementError as e:
            console.print(f"[red]placectl up: error: {e}[/]")
            return 1
        finally:
            if cluster is not None:
                console.print("stopping every process ...")
                with _ignore_signals():
                    cluster.stop()
                console.print("stopped")


@contextlib.contextmanager
def _ignore_signals() -> Iterator[None]:
    """While tearing down, a second Ctrl-C/SIGTERM must not leave children behind."""
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
