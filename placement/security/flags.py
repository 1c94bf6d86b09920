"""The command-line flags that name credentials, the same on every command (design/deployment.md):
``--cacert --cert --key`` (etcdctl's names) for gRPC, and ``--etcd-cacert --etcd-cert
--etcd-key --etcd-user --etcd-password-file`` for etcd.

Each decorator adds its flags to a click command and hands the command one loaded value instead
(``tls: TlsMaterial | None``, ``etcd_credentials: EtcdCredentials``): the files are read once, at
start-up, and a missing, unreadable or incomplete set is a usage error (exit 2) naming the flag.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from placement.errors import InvalidInput
from placement.security.credentials import (
    ETCD_TLS_OPTIONS,
    PASSWORD_ENV,
    EtcdCredentials,
    read_password,
)
from placement.security.tls import TlsMaterial, load_tls

F = TypeVar("F", bound=Callable[..., Any])

_FILE = click.Path(path_type=Path, dir_okay=False)


def optional_tls(
    cacert: Path | None,
    cert: Path | None,
    key: Path | None,
    options: tuple[str, str, str] = ("--cacert", "--cert", "--key"),
) -> TlsMaterial | None:
    """None when no file is named (plaintext); the loaded material when all three are; an error
    naming the missing flags when only some are."""
    given = (cacert, cert, key)
    if all(p is None for p in given):
        return None
    missing = [flag for flag, p in zip(options, given, strict=True) if p is None]
    if missing:
        raise InvalidInput(
            missing[0],
            f"TLS needs all of {' '.join(options)}; {' and '.join(missing)} missing",
            "pass the CA certificate, this process's certificate and its key",
        )
    assert cacert is not None
    assert cert is not None
    assert key is not None
    return load_tls(cacert, cert, key, options)


def _usage(e: InvalidInput) -> click.UsageError:
    return click.UsageError(str(e))


def tls_flags(envvar_prefix: str | None = None) -> Callable[[F], F]:
    """``--cacert --cert --key`` → the command's ``tls`` argument. With ``envvar_prefix``
    (``PLACECTL``) each flag also reads ``PREFIX_CACERT``, ``PREFIX_CERT``, ``PREFIX_KEY``."""

    def env(name: str) -> str | None:
        return f"{envvar_prefix}_{name}" if envvar_prefix else None

    options = (
        click.option(
            "--cacert", type=_FILE, envvar=env("CACERT"),
            help="CA certificate (PEM) that signs every peer; with --cert/--key: mutual TLS.",
        ),
        click.option(
            "--cert", type=_FILE, envvar=env("CERT"),
            help="This process's certificate (PEM), signed by the CA; it names its role.",
        ),
        click.option("--key", type=_FILE, envvar=env("KEY"), help="The certificate's key."),
    )  # fmt: skip

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def wrapper(
            *args: Any, cacert: Path | None, cert: Path | None, key: Path | None, **kwargs: Any
        ) -> Any:
            try:
                tls = optional_tls(cacert, cert, key)
            except InvalidInput as e:
                raise _usage(e) from e
            return f(*args, tls=tls, **kwargs)

        decorated: Any = wrapper
        for option in reversed(options):
            decorated = option(decorated)
        return decorated  # type: ignore[no-any-return]

    return decorate


def etcd_flags(f: F) -> F:
    """``--etcd-cacert --etcd-cert --etcd-key --etcd-user --etcd-password-file`` → the
    command's ``etcd_credentials`` argument (the password may come from ``PASSWORD_ENV``)."""
    names = ETCD_TLS_OPTIONS

    @functools.wraps(f)
    def wrapper(
        *args: Any,
        etcd_cacert: Path | None,
        etcd_cert: Path | None,
        etcd_key: Path | None,
        etcd_user: str | None,
        etcd_password_file: Path | None,
        **kwargs: Any,
    ) -> Any:
        try:
            tls = optional_tls(etcd_cacert, etcd_cert, etcd_key, names)
            password = read_password(etcd_password_file) if etcd_user else None
            if etcd_user and password is None:
                raise InvalidInput(
                    "--etcd-user",
                    f"no password for etcd user {etcd_user!r}",
                    f"pass --etcd-password-file FILE or set {PASSWORD_ENV}",
                )
            if etcd_password_file is not None and not etcd_user:
                raise InvalidInput(
                    "--etcd-password-file", "a password without a user", "add --etcd-user NAME"
                )
            credentials = EtcdCredentials(tls, etcd_user or None, password)
        except InvalidInput as e:
            raise _usage(e) from e
        return f(*args, etcd_credentials=credentials, **kwargs)

    options = (
        click.option("--etcd-cacert", type=_FILE, help="CA certificate that signed etcd's."),
        click.option("--etcd-cert", type=_FILE, help="Client certificate for etcd."),
        click.option("--etcd-key", type=_FILE, help="Key of --etcd-cert."),
        click.option("--etcd-user", help="etcd user (auth on); its password from a file or env."),
        click.option(
            "--etcd-password-file", type=_FILE,
            help=f"File holding the etcd user's password (else ${PASSWORD_ENV}).",
        ),
    )  # fmt: skip
    decorated: Any = wrapper
    for option in reversed(options):
        decorated = option(decorated)
    return decorated  # type: ignore[no-any-return]
