"""Credential flags and errors (design/deployment.md): the TLS and etcd flags load all-or-none
and name the missing flag; a password comes from a file or the environment; a refused
credential from etcd or a handshake is a CredentialError, never an outage to retry; a process's
certificate must carry its role (and an agent's, its node's name)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import click
import grpc
import pytest
from click.testing import CliRunner

from placement.errors import CredentialError, InvalidInput, StoreUnavailable
from placement.metastore.etcd import EtcdClient, translate
from placement.security import probe
from placement.security.credentials import (
    PASSWORD_ENV,
    EtcdCredentials,
    handshake_refused,
    read_password,
)
from placement.security.flags import etcd_flags, optional_tls, tls_flags
from placement.security.pki import Pair, Role, issue, issue_ca, require_identity, write_pair
from placement.security.probe import Prober, certificate_problem, worth_probing
from placement.security.tls import TlsMaterial

NOW = dt.datetime.now(dt.UTC)
CA = issue_ca("ca", NOW)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    ca = tmp_path / "ca.crt"
    ca.write_bytes(CA.cert)
    cert, key = write_pair(tmp_path, "node-1", issue(CA, "node-1", Role.AGENT, NOW))
    return {"ca": ca, "cert": cert, "key": key}


def test_tls_is_all_or_none(files: dict[str, Path]) -> None:
    assert optional_tls(None, None, None) is None
    loaded = optional_tls(files["ca"], files["cert"], files["key"])
    assert loaded is not None
    assert loaded.ca == CA.cert
    with pytest.raises(InvalidInput, match="--key missing") as caught:
        optional_tls(files["ca"], files["cert"], None)
    assert caught.value.field == "--key"
    with pytest.raises(InvalidInput) as caught:
        optional_tls(None, files["cert"], files["key"])
    assert caught.value.field == "--cacert"
    not_pem = files["ca"].parent / "notes.txt"
    not_pem.write_text("hello")
    with pytest.raises(InvalidInput, match="not a PEM") as caught:
        optional_tls(files["ca"], files["cert"], not_pem)
    assert caught.value.field == "--key"


def _command(decorator: Any) -> click.Command:
    seen: dict[str, Any] = {}

    @click.command()
    @decorator
    def cmd(**kwargs: Any) -> None:
        seen.update(kwargs)
        click.echo(repr(sorted(kwargs)))

    cmd.seen = seen  # type: ignore[attr-defined]
    return cmd


def test_the_tls_flags_hand_the_command_loaded_material(files: dict[str, Path]) -> None:
    cmd = _command(tls_flags("PLACECTL"))
    env = {"PLACECTL_CACERT": str(files["ca"]), "PLACECTL_CERT": str(files["cert"])}
    result = CliRunner().invoke(cmd, ["--key", str(files["key"])], env=env)
    assert result.exit_code == 0, result.output
    assert cmd.seen["tls"].cert == files["cert"].read_bytes()  # type: ignore[attr-defined]
    half = CliRunner().invoke(cmd, ["--cacert", str(files["ca"])], env={})
    assert half.exit_code == 2
    assert "--cert" in half.output


def test_the_etcd_flags_read_the_password_from_a_file_or_the_environment(
    tmp_path: Path,
) -> None:
    cmd = _command(etcd_flags)
    secret = tmp_path / "pw"
    secret.write_text("from-file\nignored\n")
    ok = CliRunner().invoke(cmd, ["--etcd-user", "u", "--etcd-password-file", str(secret)])
    assert ok.exit_code == 0, ok.output
    assert cmd.seen["etcd_credentials"] == EtcdCredentials(None, "u", "from-file")  # type: ignore[attr-defined]
    from_env = CliRunner().invoke(cmd, ["--etcd-user", "u"], env={PASSWORD_ENV: "from-env"})
    assert from_env.exit_code == 0, from_env.output
    assert cmd.seen["etcd_credentials"].password == "from-env"  # type: ignore[attr-defined]
    for argv, words in [
        (["--etcd-user", "u"], "no password"),
        (["--etcd-password-file", str(secret)], "without a user"),
    ]:
        bad = CliRunner().invoke(cmd, argv, env={PASSWORD_ENV: ""})
        assert bad.exit_code == 2, (argv, bad.output)
        assert words in bad.output
    assert "from-file" not in repr(cmd.seen["etcd_credentials"])  # type: ignore[attr-defined]


def test_read_password(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    assert read_password(None) is None
    monkeypatch.setenv(PASSWORD_ENV, "e")
    assert read_password(None) == "e"
    with pytest.raises(InvalidInput, match="cannot read"):
        read_password(tmp_path / "absent")
    (tmp_path / "empty").write_text("")
    with pytest.raises(InvalidInput, match="empty"):
        read_password(tmp_path / "empty")


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


@pytest.mark.parametrize(
    ("code", "details", "kind"),
    [
        (grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied", CredentialError),
        (grpc.StatusCode.UNAUTHENTICATED, "etcdserver: invalid auth token", CredentialError),
        (
            grpc.StatusCode.INVALID_ARGUMENT,
            "etcdserver: authentication failed, invalid user ID or password",
            CredentialError,
        ),
        (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: user name is empty", CredentialError),
        (
            grpc.StatusCode.UNAVAILABLE,
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:2379: Tls "
            "handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL "
            "routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED",
            CredentialError,
        ),
        (grpc.StatusCode.UNAVAILABLE, "Connection refused", StoreUnavailable),
        (grpc.StatusCode.UNAVAILABLE, "etcdserver: leader changed", StoreUnavailable),
        (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: too many operations", InvalidInput),
    ],
)
def test_etcd_errors_tell_a_refused_credential_from_an_outage(
    code: grpc.StatusCode, details: str, kind: type[Exception]
) -> None:
    error = translate(_rpc_error(code, details), "range")
    assert type(error) is kind, error


@pytest.mark.parametrize(
    ("code", "details", "stale"),
    [
        (grpc.StatusCode.UNAUTHENTICATED, "etcdserver: invalid auth token", True),
        (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: revision of auth store is old", True),
        (grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied", False),
        (grpc.StatusCode.UNAVAILABLE, "Connection refused", False),
    ],
)
def test_a_stale_token_is_forgotten_so_the_call_authenticates_again(
    code: grpc.StatusCode, details: str, stale: bool
) -> None:
    """Expired or lost, or issued before the users and roles changed: authenticate again."""
    client = EtcdClient(["127.0.0.1:1"], credentials=EtcdCredentials(user="u", password="p"))
    client._token = "t"
    assert client.forget_token(_rpc_error(code, details)) is stale
    assert client.forget_token(f"rpc error: {details}") is stale
    assert (client._token is None) is stale


def test_handshake_refused_is_about_certificates_not_reachability() -> None:
    assert handshake_refused("Ssl handshake failed: ... CERTIFICATE_VERIFY_FAILED")
    assert handshake_refused("SSL routines:OPENSSL_internal:WRONG_VERSION_NUMBER")
    assert not handshake_refused("Failed to connect to remote host: Connection refused")
    assert not handshake_refused("Socket closed")
    assert not handshake_refused("Deadline Exceeded")


def test_a_process_certificate_must_carry_its_role_and_name() -> None:
    agent = issue(CA, "node-1", Role.AGENT, NOW)
    assert require_identity(agent.cert, Role.AGENT, "node-1").name == "node-1"
    with pytest.raises(InvalidInput, match="not 'node-2'") as caught:
        require_identity(agent.cert, Role.AGENT, "node-2")
    assert caught.value.field == "--cert"
    with pytest.raises(InvalidInput, match="role agent, not driver"):
        require_identity(agent.cert, Role.DRIVER)
    no_role = issue(CA, "etcd", None, NOW)
    with pytest.raises(InvalidInput, match="names no role"):
        require_identity(no_role.cert, Role.DRIVER)


def test_a_closed_socket_is_worth_probing_an_unreachable_peer_is_not() -> None:
    assert worth_probing("failed to connect to all addresses; last error: ...: Socket closed")
    assert worth_probing("Unwrap failed (TSI_DATA_CORRUPTED)")
    assert not worth_probing("Failed to connect to remote host: Connection refused")
    assert not worth_probing("Deadline Exceeded")


def test_the_probe_names_what_is_wrong_with_our_own_certificate() -> None:
    def material(pair: Pair, ca: Pair = CA) -> TlsMaterial:
        return TlsMaterial(ca.cert, pair.cert, pair.key)

    old = NOW - dt.timedelta(days=30)
    expired = issue(CA, "admin", Role.ADMIN, old, days=1, not_before=old)
    assert "--cert expired on" in certificate_problem(material(expired), NOW, "--cert")
    later = NOW + dt.timedelta(days=2)
    early = issue(CA, "admin", Role.ADMIN, later, not_before=later)
    assert "valid only from" in certificate_problem(material(early), NOW, "--etcd-cert")
    theirs = issue(issue_ca("theirs", NOW), "admin", Role.ADMIN, NOW)
    problem = certificate_problem(material(theirs), NOW, "--cert")
    assert "not signed by the CA this process trusts" in problem
    assert "CN=theirs" in problem
    neutral = "is the certificate in --cert signed by the CA the server trusts?"
    fine = certificate_problem(material(issue(CA, "admin", Role.ADMIN, NOW)), NOW, "--cert")
    assert fine == neutral
    # a CA bundle (say, mid-rotation) trusts the certificate if any of its CAs signed it
    other = issue_ca("next CA", NOW)
    bundle = TlsMaterial(CA.cert + other.cert, theirs.cert, theirs.key)
    assert "not signed" in certificate_problem(bundle, NOW, "--cert")
    by_other = issue(other, "admin", Role.ADMIN, NOW)
    assert (
        certificate_problem(
            TlsMaterial(CA.cert + other.cert, by_other.cert, by_other.key), NOW, "--cert"
        )
        == neutral
    )
    # a chain's intermediates are not judged: no claim it is unsigned
    chained = TlsMaterial(CA.cert, by_other.cert + other.cert, by_other.key)
    assert certificate_problem(chained, NOW, "--cert") == neutral


async def test_the_prober_asks_each_address_at_most_once_per_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []

    async def refusal(address: str, tls: Any, **_: Any) -> str:
        asked.append(address)
        return f"{address} refused"

    heard: list[tuple[str, str]] = []
    monkeypatch.setattr(probe, "refusal", refusal)
    now = [100.0]
    prober = Prober(
        None, interval=30.0, clock=lambda: now[0], on_refused=lambda a, w: heard.append((a, w))
    )
    assert await prober.refusal("a:1", "Connection refused") is None  # not worth asking
    assert await prober.refusal("a:1", "Socket closed") == "a:1 refused"
    assert await prober.refusal("a:1", "Socket closed") == "a:1 refused"  # kept, not asked
    assert await prober.refusal("b:1", "Socket closed") == "b:1 refused"
    now[0] += 30.0
    assert await prober.refusal("a:1", "Socket closed") == "a:1 refused"
    assert asked == ["a:1", "b:1", "a:1"]
    assert [a for a, _ in heard] == ["a:1", "b:1", "a:1"], "told once per probe, not per ask"
