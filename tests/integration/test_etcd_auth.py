"""etcd with auth on, against a real etcd (design/deployment.md, "etcd"): the product's user may
use only its key prefix; a wrong password, no user at all, or a key outside the prefix is a
:class:`CredentialError` at once (never retried as an outage); a token etcd forgot (restart) is
exchanged again; and the processes' commands end with one line and exit 2 on a wrong password.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from placement.errors import CredentialError
from placement.local.etcd import EtcdMember
from placement.metastore.etcd import EtcdClient
from placement.security.credentials import PASSWORD_ENV, EtcdCredentials

pytestmark = pytest.mark.integration

USER, PASSWORD, PREFIX = "placement", "s3cret-pw", "/placement"
RIGHT = EtcdCredentials(user=USER, password=PASSWORD)


@pytest.fixture
async def secured(etcd_factory: Callable[[], EtcdMember]) -> EtcdMember:
    server = etcd_factory()
    async with EtcdClient([server.endpoint]) as setup:
        await setup.enable_auth(USER, PASSWORD, PREFIX)
    return server


async def test_the_product_user_works_under_its_prefix_only(secured: EtcdMember) -> None:
    async with EtcdClient([secured.endpoint], credentials=RIGHT) as c:
        await c.check_access(PREFIX)
        lease = await c.grant_lease(5)
        await c.put(f"{PREFIX}/k".encode(), b"v", lease=lease.id)
        start = await c.current_revision(f"{PREFIX}/k".encode())
        async with c.watch(f"{PREFIX}/".encode(), b"/placement0", start_revision=start) as w:
            await c.put(f"{PREFIX}/w".encode(), b"x")
            async with asyncio.timeout(10):
                batch = await anext(aiter(w))
        assert [e.kv.key for e in batch.events][-1] == f"{PREFIX}/w".encode()
        assert (await c.get(f"{PREFIX}/k".encode())).kvs[0].value == b"v"
        with pytest.raises(CredentialError, match="permission denied"):
            await c.get(b"/elsewhere/k")
        with pytest.raises(CredentialError, match="permission denied"):
            await c.put(b"/elsewhere/k", b"v")
        with pytest.raises(CredentialError, match="permission denied"):
            async with c.watch(b"/elsewhere/", b"/elsewhere0", start_revision=0) as w:
                await anext(aiter(w))
        await lease.revoke()


@pytest.mark.parametrize(
    ("credentials", "words"),
    [
        (EtcdCredentials(user=USER, password="wrong"), "--etcd-user"),
        (EtcdCredentials(user="nobody", password=PASSWORD), "--etcd-user"),
        (EtcdCredentials(), "named no user"),
    ],
    ids=["wrong-password", "unknown-user", "no-user"],
)
async def test_a_refused_credential_fails_at_once(
    secured: EtcdMember, credentials: EtcdCredentials, words: str
) -> None:
    async with EtcdClient([secured.endpoint], credentials=credentials, call_timeout=5.0) as c:
        began = time.monotonic()
        with pytest.raises(CredentialError, match=words):
            await c.check_access(PREFIX)
        assert time.monotonic() - began < 2.0, "retried like an outage"


async def test_an_expired_token_is_exchanged_again(
    etcd_factory: Callable[..., EtcdMember],
) -> None:
    """etcd forgets a simple token after ``--auth-token-ttl`` seconds unused: it then refuses
    it, and the client authenticates again instead of failing (writes, reads, watches)."""
    server = etcd_factory("--auth-token-ttl", "1")
    async with EtcdClient([server.endpoint]) as setup:
        await setup.enable_auth(USER, PASSWORD, PREFIX)
    async with EtcdClient([server.endpoint], credentials=RIGHT, watch_resume_window=30) as c:
        await c.put(f"{PREFIX}/before".encode(), b"1")
        start = await c.current_revision(f"{PREFIX}/before".encode())
        await asyncio.sleep(2.5)  # the token expires
        await c.put(f"{PREFIX}/after".encode(), b"2")
        await asyncio.sleep(2.5)
        assert (await c.get(f"{PREFIX}/before".encode())).kvs[0].value == b"1"
        await asyncio.sleep(2.5)
        async with c.watch(f"{PREFIX}/".encode(), b"/placement0", start_revision=start + 1) as w:
            async with asyncio.timeout(20):
                batch = await anext(aiter(w))
        assert batch.events[0].kv.key == f"{PREFIX}/after".encode()


def _run(argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.parametrize("command", ["driver", "agent", "inspect"])
def test_a_wrong_password_ends_a_command_with_one_line_and_exit_2(
    secured: EtcdMember, tmp_path: Path, command: str
) -> None:
    wrong = tmp_path / "password"
    wrong.write_text("not-the-password\n")
    auth = ["--etcd", secured.endpoint, "--etcd-user", USER, "--etcd-password-file", str(wrong)]
    placectl = [sys.executable, "-m", "placement"]
    argv = {
        "driver": [*placectl, "driver", "run", "--listen", "127.0.0.1:0", "--id", "d1", *auth],
        "agent": [
            *(sys.executable, "-m", "replica", "--node", "n1", "--listen", "127.0.0.1:0"),
            *("--data-dir", str(tmp_path / "agent"), *auth),
        ],
        "inspect": [*placectl, "inspect", *auth],
    }[command]
    began = time.monotonic()
    result = _run(argv)
    assert time.monotonic() - began < 20
    assert result.returncode == 2, result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "--etcd-user" in lines[0], lines[0]
    assert "password" in lines[0], lines[0]
    assert not (tmp_path / "agent").exists(), "the agent touched its data dir"


def test_the_password_may_come_from_the_environment(secured: EtcdMember) -> None:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "placement", "driver", "run", "--listen", "127.0.0.1:0"),
            *("--id", "d2", "--etcd", secured.endpoint, "--etcd-user", USER),
        ],
        env={**os.environ, PASSWORD_ENV: PASSWORD},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("driver d2 serving on 127.0.0.1:")
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_password_flags_are_checked_before_anything_runs(tmp_path: Path) -> None:
    placectl = [sys.executable, "-m", "placement", "inspect", "--etcd", "127.0.0.1:1"]
    empty = tmp_path / "empty"
    empty.write_text("")
    cases = [
        (["--etcd-user", USER], "no password"),
        (["--etcd-user", USER, "--etcd-password-file", str(empty)], "--etcd-password-file"),
        (["--etcd-password-file", str(empty)], "--etcd-password-file"),
        (["--etcd-cacert", str(empty)], "--etcd-cert"),
    ]
    for extra, words in cases:
        result = _run([*placectl, *extra])
        assert result.returncode == 2, (extra, result)
        assert words in result.stderr, (extra, result.stderr)
        assert "Traceback" not in result.stderr
