"""``placectl up``: a whole local cluster in one command, torn down completely on Ctrl-C/SIGTERM.

Starts, in order: etcd — one member, or three with ``--etcd-members 3`` (free loopback ports,
data under ``--data-dir``) — unless ``--etcd`` is given; D drivers (``placectl driver run``; the
first on ``--api-port``, the CLI's default endpoint); N agents (``placectl agent run``, attribute
``rack=r{i mod 3 + 1}``); then creates the demo zone and shows endpoints and a live status until
stopped.

Secure by default (design/deployment.md): a private CA and a certificate per process and per
operator role in ``{data-dir}/tls/`` (:mod:`placement.local.certs`); every gRPC server and client
is mutual TLS; etcd serves TLS with client certificates and has auth on, the product's etcd user
allowed only its key prefix. ``--insecure`` starts today's plaintext cluster instead.

Every child runs in its own session (process group), so a terminal's Ctrl-C reaches only this
process. The stop is bounded by design (design/control-plane.md, "placectl up"):

* the SIGINT/SIGTERM handlers only record the signal; the code looks at it at safe points (a
  handler that raised could fire inside an event-loop callback, where asyncio logs and swallows
  the exception, or inside ``Popen``, leaking the child being started);
* the asynchronous phase (readiness wait, live table) is cancelled and given ``CANCEL_GRACE``
  seconds to unwind, on a loop that is then closed without awaiting stragglers;
* agents and drivers get SIGTERM together, then etcd: each tier waits up to ``STOP_GRACE``
  seconds, SIGKILLs its groups, and reaps within ``KILL_WAIT``; a second signal skips the grace;
* a watchdog thread SIGKILLs every group and exits (status 1) if the process is still alive
  ``STOP_DEADLINE`` seconds after the stop began, whatever the main thread is blocked on.

Nothing it started survives it (``tests/integration/test_up.py`` checks by process group). Logs:
``DIR/logs/*.log``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime as dt
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import grpc
from rich.console import Console
from rich.live import Live
from rich.table import Table

from placement.api.client import ApiError, PlacementClient
from placement.errors import PlacementError
from placement.local.certs import BROWSER_PASSWORD, ETCD_USER, LocalPki, create_pki
from placement.local.etcd import EtcdMember, EtcdTls, etcd_binary, member_group
from placement.metastore.codec import LeaderRecord, decode_leader
from placement.metastore.election import current_leader
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeySpace
from placement.security.credentials import EtcdCredentials
from placement.security.pki import Role
from placement.security.tls import TlsMaterial, load_tls
from placement.v1 import driver_pb2

#: Seconds a tier of children has between SIGTERM and SIGKILL.
STOP_GRACE = 10.0
#: Seconds to reap a tier after SIGKILL (only a process stuck in the kernel takes longer).
KILL_WAIT = 5.0
#: Seconds the asynchronous phase (readiness wait, live table) has to unwind once cancelled.
CANCEL_GRACE = 3.0
#: Seconds after the stop began when the watchdog kills every group and exits regardless.
STOP_DEADLINE = CANCEL_GRACE + 2 * (STOP_GRACE + KILL_WAIT) + 5.0
#: Seconds between looks at a stop request or at children exiting.
POLL = 0.05
START_TIMEOUT = 60.0
DEMO_ZONE = "demo"
DEMO_PARTITIONS = 16
#: The children stopped last (names start with it): agents and drivers leave the metastore
#: cleanly while it still runs.
METASTORE = "etcd"
#: The operator certificate ``placectl up`` itself uses (readiness, the demo zone, the table).
OPERATOR = "admin"


class Stopped(Exception):
    """A stop was requested during the synchronous start-up: unwind and stop every child."""


def _never() -> bool:
    return False


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
    #: Extra ``agent run`` options for every agent (tests: e.g. a catch-up throttle).
    agent_args: tuple[str, ...] = ()
    #: Plaintext everywhere, no certificates, no etcd auth.
    insecure: bool = False
    #: Members of the etcd cluster it starts (1 or 3).
    etcd_members: int = 1
    #: Every driver and agent serves /metrics on a free loopback port (``Cluster.metrics``).
    metrics: bool = True
    #: ``--log-format`` of every driver and agent (text or json).
    log_format: str = "text"
    #: Every driver serves the web dashboard on a free loopback port (``Cluster.dashboards``).
    dashboard: bool = True


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

    def signal_group(self, sig: signal.Signals) -> None:
        """Signal the child's process group (``start_new_session``: the child leads it)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)


@dataclass
class Cluster:
    base: Path
    etcd_endpoint: str
    driver_apis: list[str]
    prefix: str = "/placement"
    children: list[Child] = field(default_factory=list)
    #: The CA and certificates (None: an insecure cluster).
    pki: LocalPki | None = None
    #: The etcd members it started (none with ``--etcd``).
    etcd_members: list[EtcdMember] = field(default_factory=list)
    #: Whether the etcd it started has TLS and auth on (the product's user: ``ETCD_USER``).
    etcd_secured: bool = False
    #: Process name -> its metrics address (HOST:PORT; ``/metrics`` there).
    metrics: dict[str, str] = field(default_factory=dict)
    #: Driver name -> its dashboard's URL.
    dashboards: dict[str, str] = field(default_factory=dict)

    @property
    def scheme(self) -> str:
        """``https`` (every HTTP endpoint of a secure cluster), or ``http``."""
        return "https" if self.pki is not None else "http"

    def tls(self, name: str = OPERATOR) -> TlsMaterial | None:
        """The TLS material of operator (or process) ``name``; None when insecure."""
        return self.pki.material(name) if self.pki is not None else None

    def env(self, name: str = OPERATOR) -> dict[str, str]:
        """``PLACECTL_*`` for ``placectl`` as operator ``name`` (empty when insecure)."""
        return self.pki.env(name) if self.pki is not None else {}

    def etcd_credentials(self, name: str = "etcd-client") -> EtcdCredentials:
        """What an etcd client presents: the certificate ``name`` (``etcd-client``: the
        product's user; ``etcd-root``: etcd's administrator) when etcd is secured."""
        if self.pki is None or not self.etcd_secured:
            return EtcdCredentials()
        return EtcdCredentials(load_tls(self.pki.ca, self.pki.cert(name), self.pki.key(name)))

    def etcd_flags(self) -> list[str]:
        """``--etcd-cacert ...`` for ``placectl inspect``-like commands (empty when plaintext)."""
        return self.pki.etcd_flags() if self.pki is not None and self.etcd_secured else []

    def restart_etcd_member(self, member: EtcdMember) -> None:
        """Start a stopped or killed etcd member again (same ports, data and flags), as the
        same child, so :meth:`stop` stops it."""
        (child,) = [c for c in self.children if c.name == member.name]
        if child.alive:
            raise PlacementError(f"etcd member {member.name} is still running")
        child.start()
        member.proc = child.proc

    def stop(self, grace: float = STOP_GRACE, forced: Callable[[], bool] = _never) -> list[Child]:
        """Agents and drivers together, then etcd; returns the children still not reaped."""
        tiers = (
            [c for c in self.children if not c.name.startswith(METASTORE)],
            [c for c in self.children if c.name.startswith(METASTORE)],
        )
        return [child for tier in tiers for child in stop_together(tier, grace, forced)]


def stop_together(
    children: Sequence[Child], grace: float, forced: Callable[[], bool] = _never
) -> list[Child]:
    """SIGTERM every group at once, wait up to ``grace`` (less once ``forced()``), SIGKILL every
    group (stragglers, and the child itself if stuck), reap within ``KILL_WAIT``; returns the
    children still not reaped."""
    started = [c for c in children if c.proc is not None]
    for child in started:
        if child.alive:
            child.signal_group(signal.SIGTERM)
    _wait_until(lambda: not any(c.alive for c in started), grace, forced)
    for child in started:
        child.signal_group(signal.SIGKILL)
    _wait_until(lambda: not any(c.alive for c in started), KILL_WAIT)
    return [c for c in started if c.alive]


def _wait_until(
    done: Callable[[], bool], timeout: float, forced: Callable[[], bool] = _never
) -> None:
    deadline = time.monotonic() + timeout
    while not done() and not forced() and time.monotonic() < deadline:
        time.sleep(POLL)


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


def _placectl() -> list[str]:
    return [sys.executable, "-m", "placement"]


def _check_stop(stopped: Callable[[], bool]) -> None:
    if stopped():
        raise Stopped


def start_cluster(opts: UpOptions, base: Path, console: Console) -> Cluster:
    """Start etcd (unless given), drivers and agents; the caller stops the returned cluster."""
    cluster = Cluster(base, opts.etcd or "", [], opts.prefix)
    try:
        launch(cluster, opts, console)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def launch(
    cluster: Cluster, opts: UpOptions, console: Console, stopped: Callable[[], bool] = _never
) -> None:
    """Start etcd (unless given), drivers and agents into ``cluster`` (which the caller stops,
    also after an error); raises :class:`Stopped` at the first safe point after ``stopped()``."""
    base = cluster.base
    logs = base / "logs"
    processes = {f"driver-{i + 1}": Role.DRIVER for i in range(opts.drivers)}
    processes |= {f"node-{i + 1}": Role.AGENT for i in range(opts.nodes)}
    if not opts.insecure:
        cluster.pki = create_pki(base / "tls", processes, dt.datetime.now(dt.UTC))
        console.print(
            f"tls       {cluster.pki.directory} (a private CA, a certificate per process)"
        )
    if opts.etcd is None:
        _start_etcd(cluster, opts, console, stopped)
    tls_flags = cluster.pki.flags if cluster.pki is not None else lambda name: []
    # One call for every port every process listens on (the agents' too: an agent on port 0
    # could be handed a port reserved here for a process not yet listening): ports freed by one
    # call may come back from the next.
    n_metrics = len(processes) if opts.metrics else 0
    n_dashboards = opts.drivers if opts.dashboard else 0
    allocated = free_ports(opts.drivers + opts.nodes + n_metrics + n_dashboards)
    agent_ports = iter(allocated[opts.drivers : opts.drivers + opts.nodes])
    rest = allocated[opts.drivers + opts.nodes :]
    metrics_ports = iter(rest[:n_metrics])
    dashboard_ports = iter(rest[n_metrics:])

    def dashboard(name: str) -> list[str]:
        """A driver's --http-listen on a port of its own."""
        port = next(dashboard_ports, None)
        if port is None:
            return []
        cluster.dashboards[name] = f"{cluster.scheme}://127.0.0.1:{port}/"
        return ["--http-listen", f"127.0.0.1:{port}"]

    def observed(name: str) -> list[str]:
        """A process's --log-format, and --metrics-listen on a port of its own."""
        flags = ["--log-format", opts.log_format]
        port = next(metrics_ports, None)
        if port is not None:
            cluster.metrics[name] = f"127.0.0.1:{port}"
            flags += ["--metrics-listen", cluster.metrics[name]]
        return flags

    ports = allocated[: opts.drivers]
    if opts.api_port:
        if port_free(opts.api_port):
            ports[0] = opts.api_port
        else:
            console.print(f"[yellow]port {opts.api_port} is taken; first driver on {ports[0]}[/]")
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
                *observed(f"driver-{i + 1}"),
                *dashboard(f"driver-{i + 1}"),
                *tls_flags(f"driver-{i + 1}"),
                *cluster.etcd_flags(),
            ],
            logs / f"driver-{i + 1}.log",
            api,
        )
        _start(cluster, driver, console, stopped)
        cluster.driver_apis.append(api)
    for i in range(opts.nodes):
        node = f"node-{i + 1}"
        agent = agent_child(
            cluster, opts, node, f"127.0.0.1:{next(agent_ports)}", f"r{i % 3 + 1}", observed(node)
        )
        _start(cluster, agent, console, stopped)


def agent_child(
    cluster: Cluster, opts: UpOptions, node: str, listen: str, rack: str, observed: list[str]
) -> Child:
    """Agent ``node`` (``placectl agent run``) listening on ``listen``, attribute ``rack=RACK``,
    with ``observed`` (its ``--log-format`` and ``--metrics-listen``) and its certificate."""
    tls_flags = cluster.pki.flags(node) if cluster.pki is not None else []
    return Child(
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
            listen,
            "--data-dir",
            str(cluster.base / "agents" / node),
            "--prefix",
            opts.prefix,
            "--attribute",
            f"rack={rack}",
            "--lease-ttl",
            str(opts.lease_ttl),
            *observed,
            *tls_flags,
            *cluster.etcd_flags(),
            *opts.agent_args,
        ],
        cluster.base / "logs" / f"{node}.log",
    )


def add_agent(cluster: Cluster, opts: UpOptions, node: str, rack: str) -> Child:
    """Start a new agent ``node`` in a running cluster — a node joining (its certificate issued
    by the cluster's CA first, when secure); :meth:`Cluster.stop` stops it with the rest."""
    if any(c.name == node for c in cluster.children):
        raise PlacementError(f"{node} is already a process of this cluster")
    if cluster.pki is not None:
        create_pki(cluster.pki.directory, {node: Role.AGENT}, dt.datetime.now(dt.UTC))
    (port,) = free_ports(1)
    child = agent_child(
        cluster, opts, node, f"127.0.0.1:{port}", rack, ["--log-format", opts.log_format]
    )
    _start(cluster, child, Console(quiet=True), _never)
    return child


def _start_etcd(
    cluster: Cluster, opts: UpOptions, console: Console, stopped: Callable[[], bool]
) -> None:
    """Start the etcd members, wait until they are healthy; when secure, turn auth on with the
    product's user allowed only its prefix (as etcd's root, by certificate)."""
    pki = cluster.pki
    n = opts.etcd_members
    names = [METASTORE] if n == 1 else [f"{METASTORE}-{i + 1}" for i in range(n)]
    tls = EtcdTls(pki.ca, pki.cert("etcd"), pki.key("etcd")) if pki is not None else None
    members = member_group(etcd_binary(), cluster.base / "etcd", names, free_ports(3 * n), tls=tls)
    for member in members:
        child = Child(member.name, member.command(), cluster.base / "logs" / f"{member.name}.log")
        child.address = member.endpoint
        _start(cluster, child, console, stopped)
        member.proc = child.proc  # the member probes health and stops through its process
        member.log_path = child.log
    cluster.etcd_members = members
    for member in members:
        member.wait_healthy(START_TIMEOUT, stopped)
        _check_stop(stopped)
    cluster.etcd_endpoint = ",".join(m.endpoint for m in members)
    if pki is not None:
        _run_async(_secure_etcd(cluster))
        cluster.etcd_secured = True
    scheme = "TLS, auth on" if pki is not None else "plaintext"
    console.print(f"etcd      {cluster.etcd_endpoint}  ({scheme}; data {cluster.base / 'etcd'})")


async def _secure_etcd(cluster: Cluster) -> None:
    pki = cluster.pki
    assert pki is not None
    root_tls = load_tls(pki.ca, pki.cert("etcd-root"), pki.key("etcd-root"))
    async with EtcdClient(
        cluster.etcd_endpoint.split(","), credentials=EtcdCredentials(root_tls)
    ) as root:
        await root.enable_auth(ETCD_USER, None, cluster.prefix)


def _run_async(coro: Coroutine[Any, Any, None]) -> None:
    """Runs ``coro`` to completion from synchronous code, also when the caller is inside a
    running event loop (a test): on a loop of its own, in a worker thread."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, coro).result()


def _start(cluster: Cluster, child: Child, console: Console, stopped: Callable[[], bool]) -> None:
    _check_stop(stopped)
    cluster.children.append(child)
    child.start()
    assert child.proc is not None
    console.print(f"started {child.name} pid {child.proc.pid}")


async def wait_ready(cluster: Cluster, opts: UpOptions, *, demo_zone: bool = True) -> None:
    """Wait until a driver answers and every agent registered; create the demo zone."""
    deadline = time.monotonic() + START_TIMEOUT
    async with PlacementClient(
        cluster.driver_apis, call_timeout=2.0, deadline=2.0, tls=cluster.tls()
    ) as client:
        while True:
            _check_children(cluster)
            try:
                found = await client.read(
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
        found = await client.read(
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
        elif child.name.startswith(METASTORE):
            role = "metastore"
        else:
            role = "registered" if child.name in registered else "not registered"
        address = child.address or registered.get(child.name, "-")
        table.add_row(child.name, str(proc.pid if proc else "-"), state, address, role)
    try:
        status = await client.read(
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
        async with EtcdClient(
            cluster.etcd_endpoint.split(","),
            call_timeout=1.0,
            credentials=cluster.etcd_credentials(),
        ) as client:
            kv = await current_leader(client, KeySpace(cluster.prefix))
    except PlacementError:
        return None
    record = decode_leader(kv.value) if kv is not None else None
    return record.member_id if isinstance(record, LeaderRecord) else None


async def _live(cluster: Cluster, console: Console) -> None:
    async with PlacementClient(
        cluster.driver_apis, call_timeout=1.0, deadline=1.0, tls=cluster.tls()
    ) as client:
        with Live(
            await _status_table(cluster, client), console=console, auto_refresh=False
        ) as view:
            while True:
                await asyncio.sleep(1.0)
                view.update(await _status_table(cluster, client), refresh=True)


async def _serve(cluster: Cluster, opts: UpOptions, console: Console) -> None:
    """Wait until ready (creating the demo zone), print the endpoints, then show the live table
    (or nothing) until cancelled."""
    with console.status("waiting for the drivers and agents ..."):
        await wait_ready(cluster, opts)
    endpoint = ",".join(cluster.driver_apis)
    console.print(f"drivers   {endpoint}")
    console.print(f"agents    {opts.nodes} (logs in {cluster.base / 'logs'})")
    if cluster.metrics:
        console.print(
            "metrics   "
            + ", ".join(
                f"{name} {cluster.scheme}://{address}/metrics"
                for name, address in cluster.metrics.items()
            )
        )
    if cluster.dashboards:
        console.print(
            "dashboard " + ", ".join(f"{url} ({name})" for name, url in cluster.dashboards.items())
        )
        if cluster.pki is not None:
            console.print(
                f"  a browser presents {cluster.pki.bundle()} (import it; password"
                f" {BROWSER_PASSWORD}) and trusts {cluster.pki.ca}"
            )
    if cluster.pki is not None:
        pki = cluster.pki
        env_file = write_env_file(cluster, endpoint)
        console.print(f"mutual TLS everywhere; as the {OPERATOR} operator: source {env_file}, or")
        for name, value in cluster.env(OPERATOR).items():
            console.print(f"  export {name}={value}")
        console.print(
            f"  (or --cacert/--cert/--key; {pki.cert('reader')} and {pki.cert('client')} "
            "are the reader and client roles)"
        )
    console.print(f"demo zone {DEMO_ZONE} created; try:")
    console.print(f"  placectl --endpoint {endpoint} zone status {DEMO_ZONE} --watch")
    console.print(f"  placectl --endpoint {endpoint} assignments {DEMO_ZONE}")
    console.print(f"  placectl --endpoint {endpoint} data put {DEMO_ZONE} hello world")
    console.print(f"  placectl --endpoint {endpoint} data scan {DEMO_ZONE}")
    console.print(
        f"  placectl --endpoint {endpoint} workload run --zone {DEMO_ZONE}"
        " --duration 10 --record run.jsonl"
    )
    etcd_flags = " ".join(cluster.etcd_flags())
    console.print(f"  placectl inspect --etcd {cluster.etcd_endpoint} {etcd_flags}".rstrip())
    console.print("cluster up; Ctrl-C stops every process")
    if opts.live:
        await _live(cluster, console)
    else:
        await asyncio.Event().wait()  # until cancelled


def write_env_file(cluster: Cluster, endpoint: str, name: str = OPERATOR) -> Path:
    """``{data-dir}/placectl.env``: the exports that make ``placectl`` the ``name`` operator of
    this cluster (``source`` it); written atomically."""
    lines = [f"export PLACECTL_ENDPOINT={endpoint}"]
    lines += [f"export {k}={v}" for k, v in cluster.env(name).items()]
    path = cluster.base / "placectl.env"
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
    return path


def _run_until_stopped(main: Coroutine[Any, Any, None], stop: StopRequest) -> None:
    """Run ``main`` until it fails or a stop is requested, then cancel it and give it
    ``CANCEL_GRACE`` seconds. Its own loop, closed without awaiting a task that is still
    unwinding (``asyncio.run`` would await it without a bound)."""
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(_until_stopped(main, stop))
    finally:
        loop.close()


async def _until_stopped(main: Coroutine[Any, Any, None], stop: StopRequest) -> None:
    task = asyncio.create_task(main)
    while not task.done() and not stop.requested():
        await asyncio.wait({task}, timeout=POLL)
    if not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_GRACE)
    if task.done() and not task.cancelled():
        task.result()  # start-up errors


#: The signals that stop ``placectl up`` (and every process it started).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """SIGINT/SIGTERM handlers that only record the signal; the code polls :meth:`requested`.

    Explicit handlers, not Python's default: a shell starts a background job (``placectl up &``)
    with SIGINT ignored, and Python keeps an inherited SIG_IGN instead of installing its
    KeyboardInterrupt handler — so ``kill -INT`` would otherwise do nothing. The handler only
    appends to a list (no lock: a handler can interrupt anything, even itself). A signal after
    the stop began forces it (no more grace). A daemon thread is the last bound: once a signal
    arrived or :meth:`begin` was called, it SIGKILLs every group and exits after
    ``STOP_DEADLINE`` seconds if the process is still there.
    """

    def __init__(self, cluster: Cluster, deadline: float = STOP_DEADLINE) -> None:
        self.cluster = cluster
        self.deadline = deadline
        self.signals: list[int] = []
        self._signals_at_begin: int | None = None

    def requested(self) -> bool:
        return bool(self.signals)

    def forced(self) -> bool:
        """Two signals, or one after a stop that began without one (a failed start-up)."""
        began = self._signals_at_begin
        return len(self.signals) >= 2 or (began is not None and len(self.signals) > began)

    def begin(self) -> None:
        """The teardown starts: arms the watchdog even when no signal arrived."""
        if self._signals_at_begin is None:
            self._signals_at_begin = len(self.signals)

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopRequest]:
        previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
        threading.Thread(target=self._watchdog, name="up-stop-watchdog", daemon=True).start()
        try:
            yield self
        finally:
            for s, old in previous.items():
                signal.signal(s, old)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append(signum)

    def _watchdog(self) -> None:
        while not self.signals and self._signals_at_begin is None:
            time.sleep(0.1)
        time.sleep(self.deadline)
        for child in list(self.cluster.children):
            if child.proc is not None and child.proc.returncode is None:  # reaped: pid reusable
                child.signal_group(signal.SIGKILL)
        _tell_stderr(f"placectl up: stop took over {self.deadline:.0f}s; killed every process\n")
        os._exit(1)


def _tell_stderr(text: str) -> None:
    """Writes ``text`` only if stderr can take it now (a full pipe must not block the exit)."""
    with contextlib.suppress(OSError, ValueError):
        if select.select([], [2], [], 0)[1]:
            os.write(2, text.encode())


def run_up(opts: UpOptions) -> int:
    """Run until Ctrl-C or SIGTERM; 0 after a clean stop, 1 when start-up failed.

    Owns the process: once stopping, it exits within ``STOP_DEADLINE`` seconds (watchdog)."""
    console = Console(highlight=False, soft_wrap=True)  # commands and paths stay copyable
    base = opts.data_dir or Path(tempfile.mkdtemp(prefix="placectl-up-"))
    base.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(base, opts.etcd or "", [], opts.prefix)
    with StopRequest(cluster).installed() as stop:
        try:
            launch(cluster, opts, console, stop.requested)
            _run_until_stopped(_serve(cluster, opts, console), stop)
            return 0
        except Stopped:
            return 0
        except PlacementError as e:
            console.print(f"[red]placectl up: error: {e}[/]")
            return 1
        finally:
            stop.begin()
            _teardown(cluster, console, stop)


def _teardown(cluster: Cluster, console: Console, stop: StopRequest) -> None:
    if not cluster.children:
        return
    console.print("stopping every process ...")
    stuck = cluster.stop(forced=stop.forced)
    for child in stuck:
        assert child.proc is not None
        console.print(f"[red]{child.name} (pid {child.proc.pid}) did not exit after SIGKILL[/]")
    if not stuck:
        console.print("stopped")
