"""A real etcd for integration tests: started on free 127.0.0.1 ports, data in a tmp dir.

* ``etcd`` — one process for the whole session (start-up takes ~0.3-1 s); tests stay independent
  through a random key ``prefix`` each (``keys`` is the KeySpace on it).
* ``etcd_factory`` — private processes for tests that kill, restart or compact (so they cannot
  disturb the shared one); :meth:`EtcdServer.restart` brings one back on the same ports and data.
* ``client`` — an :class:`EtcdClient` on the shared etcd, closed after the test.
* ``chaos_etcd`` — parametrized: the shared etcd in plaintext, or a private three-member etcd
  with TLS and auth on and the certificates of drivers ``d1``/``d2`` and agents ``n0``..``n9``
  (the chaos tests run both ways).

Skips (with the reason) only when no ``etcd`` binary exists.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from placement import failpoints
from placement.errors import InvalidInput, PlacementError
from placement.local.certs import ETCD_USER, LocalPki, create_pki
from placement.local.cluster import free_ports
from placement.local.etcd import EtcdMember, EtcdTls, member_group
from placement.local.etcd import etcd_binary as etcd_binary_path
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeySpace
from placement.security.credentials import EtcdCredentials
from placement.security.pki import Role
from placement.security.tls import TlsMaterial

#: The tests' etcd: one member with the short raft timings of tests that kill leaders.
EtcdServer = EtcdMember


def _start_server(binary: str, base_dir: Path, name: str, *extra: str) -> EtcdMember:
    """Start on fresh free ports; retry a few times if a port was taken in between."""
    last: Exception | None = None
    for attempt in range(3):
        server = EtcdMember(
            binary, base_dir / f"try{attempt}", name, _ports(1)[0], fast=True, extra_args=extra
        )
        try:
            server.start()
            return server
        except PlacementError as e:
            server.kill()
            last = e
    raise RuntimeError(f"could not start etcd: {last}")


def _ports(members: int) -> list[tuple[int, int, int]]:
    ports = free_ports(3 * members)
    return [(ports[3 * i], ports[3 * i + 1], ports[3 * i + 2]) for i in range(members)]


@pytest.fixture(scope="session", autouse=True)
def _no_failpoints_here() -> None:
    """This process never acts at a failpoint, whatever a test puts in the environment for
    the processes it starts (placement/failpoints.py)."""
    failpoints.load({})


@pytest.fixture(scope="session")
def etcd_binary() -> str:
    try:
        return etcd_binary_path()
    except InvalidInput:
        pytest.skip("no etcd binary (/usr/bin/etcd or on PATH): run scripts/setup.sh")


@pytest.fixture(scope="session")
def etcd(etcd_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = _start_server(etcd_binary, tmp_path_factory.mktemp("etcd-session"), "session")
    yield server
    server.stop()


@pytest.fixture
def etcd_factory(etcd_binary: str, tmp_path: Path) -> Iterator[Callable[[], EtcdServer]]:
    """Start private etcd processes (stopped at teardown)."""
    servers: list[EtcdServer] = []

    def make(*extra: str) -> EtcdServer:
        """A new private etcd; ``extra``: more etcd flags."""
        server = _start_server(
            etcd_binary, tmp_path / f"etcd{len(servers)}", f"private{len(servers)}", *extra
        )
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def etcd_cluster(etcd_binary: str, tmp_path: Path) -> Iterator[list[EtcdMember]]:
    """A private 3-member cluster (members started together: none is healthy without quorum)."""
    members = member_group(etcd_binary, tmp_path, ["m0", "m1", "m2"], free_ports(9), fast=True)
    try:
        for member in members:
            member.start(wait=False)
        for member in members:
            member.wait_healthy()
        yield members
    finally:
        for member in members:
            member.stop()


@pytest.fixture
def prefix() -> str:
    return f"/t{uuid.uuid4().hex[:12]}/placement"


@pytest.fixture
def keys(prefix: str) -> KeySpace:
    return KeySpace(prefix)


@pytest.fixture
async def client(etcd: EtcdServer) -> AsyncIterator[EtcdClient]:
    async with EtcdClient([etcd.endpoint], call_timeout=5.0) as c:
        yield c


@dataclass
class ChaosEtcd:
    """Where the chaos runs: the session etcd in plaintext, or a three-member etcd with TLS
    and auth on, mutual TLS between drivers and agents (design/deployment.md)."""

    endpoints: str
    client: EtcdClient
    pki: LocalPki | None = None
    #: What the product presents to etcd (secure: the ``etcd-client`` certificate).
    credentials: EtcdCredentials | None = None

    def tls(self, name: str) -> TlsMaterial | None:
        """The TLS material of process or role ``name`` (None in plaintext)."""
        return self.pki.material(name) if self.pki is not None else None


@pytest.fixture(params=["plaintext", "secure-3-members"])
async def chaos_etcd(
    request: pytest.FixtureRequest,
    etcd: Any,
    etcd_binary: str,
    tmp_path: Path,
    client: EtcdClient,
    prefix: str,
) -> AsyncIterator[ChaosEtcd]:
    if request.param == "plaintext":
        yield ChaosEtcd(etcd.endpoint, client)
        return
    processes = {"d1": Role.DRIVER, "d2": Role.DRIVER}
    processes |= {f"n{i}": Role.AGENT for i in range(10)}
    pki = create_pki(tmp_path / "tls", processes, dt.datetime.now(dt.UTC))
    members = member_group(
        etcd_binary,
        tmp_path / "etcd",
        ["m0", "m1", "m2"],
        free_ports(9),
        tls=EtcdTls(pki.ca, pki.cert("etcd"), pki.key("etcd")),
        fast=True,
    )
    try:
        for member in members:
            member.start(wait=False)
        for member in members:
            await asyncio.to_thread(member.wait_healthy)
        endpoints = ",".join(m.endpoint for m in members)
        root = EtcdCredentials(pki.material("etcd-root"))
        async with EtcdClient(endpoints, credentials=root) as setup:
            await setup.enable_auth(ETCD_USER, None, prefix)
        product = EtcdCredentials(pki.material("etcd-client"))
        async with EtcdClient(endpoints, credentials=product) as secure_client:
            yield ChaosEtcd(endpoints, secure_client, pki, product)
    finally:
        for member in members:
            member.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The pipeline tests' one local Spark (``local[2]``; a process holds one SparkContext)."""
    from placement.pipeline.spark_master import parse_master
    from placement.pipeline.spark_plan import start_spark

    session = start_spark(
        parse_master("local[2]"),
        {"spark.sql.shuffle.partitions": "2", "spark.sql.adaptive.enabled": "false"},
    )
    yield session
    session.stop()
