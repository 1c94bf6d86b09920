"""A real etcd for integration tests: started on free 127.0.0.1 ports, data in a tmp dir.

* ``etcd`` — one process for the whole session (start-up takes ~0.3-1 s); tests stay independent
  through a random key ``prefix`` each (``keys`` is the KeySpace on it).
* ``etcd_factory`` — private processes for tests that kill, restart or compact (so they cannot
  disturb the shared one); :meth:`EtcdServer.restart` brings one back on the same ports and data.
* ``client`` — an :class:`EtcdClient` on the shared etcd, closed after the test.

Skips (with the reason) only when no ``etcd`` binary exists.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from placement.local.cluster import free_ports
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeySpace

_START_TIMEOUT = 30.0


def _etcd_binary() -> str | None:
    if os.access("/usr/bin/etcd", os.X_OK):
        return "/usr/bin/etcd"
    return shutil.which("etcd")


class EtcdServer:
    """One single-member etcd process with fixed ports and data dir for its lifetime."""

    def __init__(
        self,
        binary: str,
        base_dir: Path,
        name: str = "etcd",
        *,
        ports: tuple[int, int] | None = None,
        initial_cluster: str | None = None,
    ) -> None:
        self.binary = binary
        self.name = name
        self.base_dir = base_dir
        self.data_dir = base_dir / "data"
        self.log_path = base_dir / "etcd.log"
        self.client_port, self.peer_port = ports or free_ports(2)
        self.initial_cluster = initial_cluster or f"{name}={self.peer_url}"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def _command(self) -> list[str]:
        client_url = f"http://127.0.0.1:{self.client_port}"
        peer_url = f"http://127.0.0.1:{self.peer_port}"
        return [
            self.binary,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", client_url,
            "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", self.initial_cluster,
            "--initial-cluster-state", "new",
            "--heartbeat-interval", "25",
            "--election-timeout", "250",
            "--logger", "zap",
            "--log-outputs", "stderr",
        ]  # fmt: skip

    def start(self, *, wait: bool = True) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.base_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                self._command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        finally:
            log.close()
        if wait:
            self.wait_healthy()

    def wait_healthy(self, timeout: float = _START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        url = f"http://{self.endpoint}/health"
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"etcd exited with {self.proc.returncode}; log tail:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=1.0) as response:
                    if b'"health":"true"' in response.read():
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.02)  # polling a process we cannot await
        raise RuntimeError(f"etcd not healthy after {timeout}s; log tail:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, like a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def restart(self) -> None:
        """Kill -9 if running, then start again on the same ports and data dir."""
        self.kill()
        self.start()


def _start_server(binary: str, base_dir: Path, name: str) -> EtcdServer:
    """Start on fresh free ports; retry a few times if a port was taken in between."""
    last: Exception | None = None
    for attempt in range(3):
        server = EtcdServer(binary, base_dir / f"try{attempt}", name)
        try:
            server.start()
            return server
        except RuntimeError as e:
            server.kill()
            last = e
    raise RuntimeError(f"could not start etcd: {last}")


@pytest.fixture(scope="session")
def etcd_binary() -> str:
    binary = _etcd_binary()
    if binary is None:
        pytest.skip("no etcd binary (/usr/bin/etcd or on PATH): run scripts/setup.sh")
    return binary


@pytest.fixture(scope="session")
def etcd(etcd_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = _start_server(etcd_binary, tmp_path_factory.mktemp("etcd-session"), "session")
    yield server
    server.stop()


@pytest.fixture
def etcd_factory(etcd_binary: str, tmp_path: Path) -> Iterator[Callable[[], EtcdServer]]:
    """Start private etcd processes (stopped at teardown)."""
    servers: list[EtcdServer] = []

    def make() -> EtcdServer:
        server = _start_server(
            etcd_binary, tmp_path / f"etcd{len(servers)}", f"private{len(servers)}"
        )
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def etcd_cluster(etcd_binary: str, tmp_path: Path) -> Iterator[list[EtcdServer]]:
    """A private 3-member cluster (members started together: none is healthy without quorum)."""
    ports = free_ports(6)
    names = [f"m{i}" for i in range(3)]
    cluster = ",".join(f"{n}=http://127.0.0.1:{ports[2 * i + 1]}" for i, n in enumerate(names))
    members = [
        EtcdServer(
            etcd_binary,
            tmp_path / name,
            name,
            ports=(ports[2 * i], ports[2 * i + 1]),
            initial_cluster=cluster,
        )
        for i, name in enumerate(names)
    ]
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
