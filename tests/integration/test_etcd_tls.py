"""etcd serving TLS and requiring client certificates, against a real etcd (design/deployment.md,
"Credential errors"): a client certificate another CA signed, an expired one, a plaintext client
and a CA that did not sign etcd's certificate are each a :class:`CredentialError` at once naming
the flag to fix — not an outage retried for ever — and a process given one ends at once with one
line and exit 2, having touched nothing."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from placement.errors import CredentialError
from placement.local.certs import ETCD_USER, LocalPki, create_pki
from placement.local.cluster import free_ports
from placement.local.etcd import EtcdMember, EtcdTls, member_group
from placement.metastore.etcd import EtcdClient
from placement.security.credentials import EtcdCredentials
from placement.security.pki import Pair, Role, issue, issue_ca, write_pair
from placement.security.tls import TlsMaterial

pytestmark = pytest.mark.integration

NOW = dt.datetime.now(dt.UTC)
PREFIX = "/placement"


def _tls_member(binary: str, base: Path, pki: LocalPki) -> EtcdMember:
    """One started etcd member serving TLS with ``pki``'s etcd certificate, requiring client
    certificates."""
    (member,) = member_group(
        binary,
        base / "etcd",
        ["tls0"],
        free_ports(3),
        tls=EtcdTls(pki.ca, pki.cert("etcd"), pki.key("etcd")),
        fast=True,
    )
    member.start()
    return member


@pytest.fixture(scope="module")
def tls_etcd(
    etcd_binary: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[EtcdMember, LocalPki]]:
    base = tmp_path_factory.mktemp("etcd-tls")
    pki = create_pki(base / "tls", {}, NOW)
    member = _tls_member(etcd_binary, base, pki)
    try:
        yield member, pki
    finally:
        member.stop()


def _wrong(pki: LocalPki) -> dict[str, tuple[EtcdCredentials, str]]:
    """Each wrong credential, with words its error must contain."""
    ca = Pair(pki.ca.read_bytes(), (pki.directory / "ca.key").read_bytes())
    other_ca = issue_ca("another CA", NOW)
    theirs = issue(other_ca, "etcd-client", None, NOW)
    old = NOW - dt.timedelta(days=30)
    expired = issue(ca, "etcd-client", None, old, days=1, not_before=old)
    ca_cert = pki.ca.read_bytes()
    return {
        "another-ca": (
            EtcdCredentials(TlsMaterial(ca_cert, theirs.cert, theirs.key)),
            "--etcd-cert was not signed by the CA",
        ),
        "expired": (
            EtcdCredentials(TlsMaterial(ca_cert, expired.cert, expired.key)),
            "--etcd-cert expired on",
        ),
        "plaintext": (EtcdCredentials(), "serves TLS: pass --etcd-cacert"),
        "wrong-cacert": (
            EtcdCredentials(TlsMaterial(other_ca.cert, theirs.cert, theirs.key)),
            "--etcd-cacert",
        ),
    }


KINDS = ["another-ca", "expired", "plaintext", "wrong-cacert"]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_refused_certificate_is_a_credential_error_at_once(
    tls_etcd: tuple[EtcdMember, LocalPki], kind: str
) -> None:
    member, pki = tls_etcd
    credentials, words = _wrong(pki)[kind]
    async with EtcdClient([member.endpoint], credentials=credentials, call_timeout=5.0) as c:
        began = time.monotonic()
        with pytest.raises(CredentialError) as caught:
            await c.check_access(PREFIX)
        assert time.monotonic() - began < 4.0, "retried like an outage"
    assert words in str(caught.value), caught.value
    # the right certificate still works, so the refusals above were about the credential
    right = EtcdCredentials(pki.material("etcd-client"))
    async with EtcdClient([member.endpoint], credentials=right, call_timeout=5.0) as c:
        await c.check_access(PREFIX)


@pytest.mark.parametrize("kind", ["another-ca", "expired", "plaintext"])
def test_a_process_with_a_refused_etcd_certificate_ends_with_one_line_and_exit_2(
    tls_etcd: tuple[EtcdMember, LocalPki], tmp_path: Path, kind: str
) -> None:
    member, pki = tls_etcd
    credentials, words = _wrong(pki)[kind]
    flags = ["--etcd", member.endpoint]
    if credentials.tls is not None:
        ca, cert, key = (
            tmp_path / "ca.crt",
            *write_pair(tmp_path, "client", Pair(credentials.tls.cert, credentials.tls.key)),
        )
        ca.write_bytes(credentials.tls.ca)
        flags += ["--etcd-cacert", str(ca), "--etcd-cert", str(cert), "--etcd-key", str(key)]
    for argv in (
        [
            *(sys.executable, "-m", "placement", "driver", "run"),
            *("--listen", "127.0.0.1:0", "--id", "d1"),
        ],
        [
            *(sys.executable, "-m", "replica", "--node", "n1", "--listen", "127.0.0.1:0"),
            *("--data-dir", str(tmp_path / "agent")),
        ],
        [sys.executable, "-m", "placement", "inspect"],
    ):
        began = time.monotonic()
        result = subprocess.run(
            [*argv, *flags], capture_output=True, text=True, timeout=60, check=False
        )
        assert time.monotonic() - began < 15, "retried like an outage"
        assert result.returncode == 2, result
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, result.stderr
        assert words in lines[0], lines[0]
    assert not (tmp_path / "agent").exists(), "the agent touched its data dir"


@pytest.fixture
def authed_etcd(etcd_binary: str, tmp_path: Path) -> Iterator[tuple[EtcdMember, LocalPki, str]]:
    """A private TLS etcd with auth on: the product's user (certificate ``etcd-client``) may
    use ``PREFIX/`` only; ``etcd-root`` administers it. Yields the member, the PKI, the prefix."""
    pki = create_pki(tmp_path / "tls", {"node-1": Role.AGENT, "d1": Role.DRIVER}, NOW)
    member = _tls_member(etcd_binary, tmp_path, pki)
    try:
        asyncio.run(_enable_auth(member, pki))
        yield member, pki, PREFIX
    finally:
        member.stop()


async def _enable_auth(member: EtcdMember, pki: LocalPki) -> None:
    root = EtcdCredentials(pki.material("etcd-root"))
    async with EtcdClient([member.endpoint], credentials=root) as client:
        await client.enable_auth(ETCD_USER, None, PREFIX)


@pytest.mark.parametrize("process", ["agent", "driver"])
def test_a_process_whose_etcd_permission_is_revoked_ends_with_one_line_and_exit_2(
    authed_etcd: tuple[EtcdMember, LocalPki, str], tmp_path: Path, process: str
) -> None:
    """Revoked while it runs: etcd 3.4 keeps serving the open streams, so the process notices
    when they reopen (here: etcd restarts) — its watches can no longer be opened, and it stops
    (an agent through ``DataPlane.on_fatal``) instead of running on a frozen view."""
    member, pki, prefix = authed_etcd
    common = ["--listen", "127.0.0.1:0", "--etcd", member.endpoint, "--prefix", prefix]
    argv, announce = {
        "agent": (
            [
                *(sys.executable, "-m", "replica", "--node", "node-1", *common),
                *("--data-dir", str(tmp_path / "agent"), *pki.flags("node-1")),
            ],
            "agent node-1 listening on ",
        ),
        "driver": (
            [
                sys.executable,
                "-m",
                "placement",
                "driver",
                "run",
                "--id",
                "d1",
                *common,
                *pki.flags("d1"),
            ],
            "driver d1 serving on ",
        ),
    }[process]
    agent = subprocess.Popen(
        [*argv, *pki.etcd_flags()], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert agent.stdout is not None
        assert agent.stdout.readline().startswith(announce)
        start = f"{prefix}/"
        end = start[:-1] + "0"  # the prefix range's end: '/' + 1
        revoke = subprocess.run(
            [
                *("etcdctl", "--endpoints", f"https://{member.endpoint}"),
                *("--cacert", str(pki.ca), "--cert", str(pki.cert("etcd-root"))),
                *("--key", str(pki.key("etcd-root"))),
                *("role", "revoke-permission", ETCD_USER, start, end),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env={**os.environ, "ETCDCTL_API": "3"},
        )
        assert revoke.returncode == 0, revoke
        member.restart()
        code = agent.wait(timeout=20)
        stderr = agent.stderr.read() if agent.stderr is not None else ""
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert code == 2, stderr
    last = [line for line in stderr.splitlines() if line.strip()][-1]
    assert "permission denied" in last.lower(), stderr
    assert "Traceback" not in stderr, stderr
