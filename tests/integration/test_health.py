"""Health that means something (design/deployment.md, "Health"), with real processes over mutual
TLS: a driver reports NOT_SERVING while its etcd has no quorum (two of three members killed) and
SERVING once the quorum is back; an agent reports NOT_SERVING while its registration lease is
lost (etcd frozen past the lease's TTL) and SERVING once it registered again."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from placement.local.certs import LocalPki, create_pki
from placement.local.etcd import EtcdMember
from placement.security.pki import Role

pytestmark = pytest.mark.integration

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
WITHIN = 30.0 * float(os.environ.get("CI_TIME_MULTIPLIER", "1"))


def _status(address: str, pki: LocalPki) -> int | None:
    """The server's overall health; None when it does not answer."""
    tls = pki.material("reader")
    credentials = grpc.ssl_channel_credentials(tls.ca, tls.key, tls.cert)
    with grpc.secure_channel(address, credentials) as ch:
        try:
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2)
        except grpc.RpcError:
            return None
    return int(reply.status)


def _until(address: str, pki: LocalPki, wanted: int, what: str) -> float:
    """Seconds until the server reports ``wanted``."""
    began = time.monotonic()
    while (status := _status(address, pki)) != wanted:
        assert time.monotonic() - began < WITHIN, f"{what}: still {status}"
        time.sleep(0.2)
    return time.monotonic() - began


def _start(argv: list[str], banner: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith(banner), line
    return proc, line.split()[-1]


@pytest.fixture
def pki(tmp_path: Path) -> LocalPki:
    processes = {"d1": Role.DRIVER, "n1": Role.AGENT}
    return create_pki(tmp_path / "tls", processes, dt.datetime.now(dt.UTC))


@pytest.fixture
def stopped_at_end() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


def test_a_driver_is_not_serving_while_etcd_has_no_quorum(
    etcd_cluster: list[EtcdMember], pki: LocalPki, stopped_at_end: list[subprocess.Popen[str]]
) -> None:
    endpoints = ",".join(m.endpoint for m in etcd_cluster)
    proc, address = _start(
        [
            *(sys.executable, "-m", "placement", "driver", "run", "--etcd", endpoints),
            *("--listen", "127.0.0.1:0", "--id", "d1", *pki.flags("d1")),
        ],
        "driver d1 serving on",
    )
    stopped_at_end.append(proc)
    assert _status(address, pki) == SERVING
    for member in etcd_cluster[1:]:
        member.kill()
    _until(address, pki, NOT_SERVING, "two of three etcd members down")
    for member in etcd_cluster[1:]:
        member.start(wait=False)
    _until(address, pki, SERVING, "the quorum is back")
    assert proc.poll() is None


def test_an_agent_is_not_serving_while_its_registration_is_lost(
    etcd_factory: Callable[[], EtcdMember],
    pki: LocalPki,
    tmp_path: Path,
    stopped_at_end: list[subprocess.Popen[str]],
) -> None:
    etcd = etcd_factory()
    proc, address = _start(
        [
            *(sys.executable, "-m", "replica", "--node", "n1", "--listen", "127.0.0.1:0"),
            *("--data-dir", str(tmp_path / "n1"), "--etcd", etcd.endpoint, "--lease-ttl", "2"),
            *pki.flags("n1"),
        ],
        "agent n1 listening on",
    )
    stopped_at_end.append(proc)
    assert _status(address, pki) == SERVING
    etcd.pause()
    try:
        _until(address, pki, NOT_SERVING, "etcd frozen past the registration lease")
    finally:
        etcd.resume()
    _until(address, pki, SERVING, "registered again")
    assert proc.poll() is None
