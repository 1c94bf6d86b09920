"""etcd processes on loopback: the members ``placectl up`` starts, and the tests' etcd.

One :class:`EtcdMember` is one etcd process with fixed ports and a data directory for its
lifetime (so it can be killed and started again on the same ones). :func:`member_group` names
the members of a cluster of one or three and their ``--initial-cluster``. With
:class:`EtcdTls` the member serves clients and peers over TLS and requires client certificates
(``--client-cert-auth``); its health is read from a plaintext metrics listener on loopback, so
the probe needs no certificate. ``fast`` shortens the raft timings (heartbeat 25 ms, election
250 ms) for tests that kill leaders.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from placement.errors import InvalidInput, PlacementError

#: etcd's backend batching for the product's write bursts (design/deployment.md, "etcd under
#: write bursts"): etcd 3.4 copies every write not yet committed to its database for each read
#: it opens — one per compare of a transaction and one per keep-alive answer's header — so a
#: burst of fenced transactions with the default batch (100 ms, 10,000 writes) held applies, and
#: with them every lease's renewal, for over a second. At most 500 writes or 10 ms between
#: commits keeps each copy small.
BACKEND_BATCHING: tuple[str, ...] = (
    "--backend-batch-limit", "500",
    "--backend-batch-interval", "10ms",
)  # fmt: skip

#: Seconds a member has to report healthy.
START_TIMEOUT = 30.0
#: Seconds between health probes of a starting member.
PROBE_EVERY = 0.05


def etcd_binary() -> str:
    """The etcd binary (``/usr/bin/etcd``, ``/usr/local/bin/etcd`` or on ``PATH``)."""
    for candidate in ("/usr/bin/etcd", "/usr/local/bin/etcd"):
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("etcd")
    if found is None:
        raise InvalidInput("--etcd", "no etcd binary found", "install etcd-server or pass --etcd")
    return found


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """The files an etcd member serves TLS with: the CA that signs every client and peer, and
    the member's own certificate (for clients and peers) and key."""

    ca: Path
    cert: Path
    key: Path


class EtcdMember:
    """One etcd process on ``127.0.0.1`` with fixed client, peer and metrics ports."""

    def __init__(
        self,
        binary: str,
        base_dir: Path,
        name: str,
        ports: tuple[int, int, int],
        *,
        initial_cluster: str | None = None,
        tls: EtcdTls | None = None,
        fast: bool = False,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.binary = binary
        #: More etcd flags (tests: e.g. ``--auth-token-ttl 1``).
        self.extra_args = extra_args
        self.name = name
        self.base_dir = base_dir
        self.data_dir = base_dir / "data"
        self.log_path = base_dir / "etcd.log"
        self.client_port, self.peer_port, self.metrics_port = ports
        self.tls = tls
        self.fast = fast
        self.initial_cluster = initial_cluster or f"{name}={self.peer_url}"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    @property
    def peer_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.peer_port}"

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.client_port}"

    @property
    def endpoint(self) -> str:
        """``HOST:PORT`` clients dial."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        metrics = f"http://127.0.0.1:{self.metrics_port}"
        argv = [
            self.binary,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.initial_cluster,
            "--initial-cluster-state", "new",
            "--listen-metrics-urls", metrics,
            "--logger", "zap",
            "--log-outputs", "stderr",
            *BACKEND_BATCHING,
        ]  # fmt: skip
        if self.fast:
            argv += ["--heartbeat-interval", "25", "--election-timeout", "250"]
        if self.tls is not None:
            ca, cert, key = str(self.tls.ca), str(self.tls.cert), str(self.tls.key)
            argv += [
                "--trusted-ca-file", ca, "--cert-file", cert, "--key-file", key,
                "--client-cert-auth",
                "--peer-trusted-ca-file", ca, "--peer-cert-file", cert, "--peer-key-file", key,
                "--peer-client-cert-auth",
            ]  # fmt: skip
        return [*argv, *self.extra_args]

    def start(self, *, wait: bool = True, start_new_session: bool = False) -> None:
        """Start the process (logging to ``etcd.log``); with ``wait``, until it is healthy."""
        if self.alive:
            raise PlacementError(f"etcd member {self.name} is already running")
        self.base_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=start_new_session,
            )
        if wait:
            self.wait_healthy()

    def healthy(self) -> bool:
        """Whether the member answers ``/health`` with true (it has a leader and serves)."""
        url = f"http://127.0.0.1:{self.metrics_port}/health"
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                return b'"health":"true"' in response.read()
        except (urllib.error.URLError, OSError):
            return False

    def is_leader(self) -> bool:
        """Whether the member leads its cluster now (its metrics' ``etcd_server_is_leader``)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                text = response.read().decode()
        except (urllib.error.URLError, OSError):
            return False
        return any(line.strip() == "etcd_server_is_leader 1" for line in text.splitlines())

    def wait_healthy(
        self, timeout: float = START_TIMEOUT, stopped: Callable[[], bool] = lambda: False
    ) -> None:
        """Returns once healthy; raises when the process exits, ``timeout`` passes, or (checked
        between probes) ``stopped()``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not stopped():
            if self.proc is not None and self.proc.poll() is not None:
                raise PlacementError(
                    f"etcd {self.name} exited with {self.proc.returncode}; log tail:\n"
                    f"{self.log_tail()}"
                )
            if self.healthy():
                return
            time.sleep(PROBE_EVERY)  # polling a process we cannot await
        if stopped():
            return
        raise PlacementError(
            f"etcd {self.name} not healthy after {timeout:.0f}s; log tail:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def signal(self, sig: signal.Signals) -> None:
        if self.alive:
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, like a crash (resumes a paused member first)."""
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def pause(self) -> None:
        """SIGSTOP: alive but silent, like a frozen machine."""
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.alive:
            assert self.proc is not None
            self.resume()
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


def member_group(
    binary: str,
    base_dir: Path,
    names: Sequence[str],
    ports: Sequence[int],
    *,
    tls: EtcdTls | None = None,
    fast: bool = False,
) -> list[EtcdMember]:
    """Members ``names`` of one new cluster (three ports each: client, peer, metrics), each
    under ``base_dir/NAME``; start them together (none is healthy before a quorum is up)."""
    if len(ports) != 3 * len(names):
        raise InvalidInput("ports", f"{len(names)} members need {3 * len(names)} ports", "")
    members = [
        EtcdMember(
            binary,
            base_dir / name,
            name,
            (ports[3 * i], ports[3 * i + 1], ports[3 * i + 2]),
            tls=tls,
            fast=fast,
        )
        for i, name in enumerate(names)
    ]
    initial = ",".join(f"{m.name}={m.peer_url}" for m in members)
    for member in members:
        member.initial_cluster = initial
    return members
