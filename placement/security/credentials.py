"""Credentials a process presents to etcd, and telling a refused credential from an outage
(design/deployment.md).

etcd takes a client certificate (its common name is the etcd user when etcd's auth is on) and/or
a user name and password (exchanged for a token). The password comes from a file or an
environment variable, never from a flag value visible in ``ps``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from placement.errors import InvalidInput
from placement.security.tls import TlsMaterial

#: The environment variable an etcd password may come from.
PASSWORD_ENV = "PLACEMENT_ETCD_PASSWORD"
#: The flags naming the etcd client's TLS files: CA, certificate, key.
ETCD_TLS_OPTIONS = ("--etcd-cacert", "--etcd-cert", "--etcd-key")


@dataclass(frozen=True, slots=True)
class EtcdCredentials:
    """What the etcd client presents: TLS material (the CA that signed etcd's certificate, and a
    client certificate and key) and/or a user and password."""

    tls: TlsMaterial | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if (self.user is None) != (self.password is None):
            raise InvalidInput(
                "--etcd-user",
                "an etcd user needs a password, and a password a user",
                f"pass --etcd-user with --etcd-password-file FILE or {PASSWORD_ENV}",
            )


def read_password(path: Path | None, env: str = PASSWORD_ENV) -> str | None:
    """The password in ``path`` (its first line), else the environment variable ``env``, else
    None. An unreadable or empty file is an error naming ``--etcd-password-file``."""
    if path is None:
        return os.environ.get(env) or None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidInput(
            "--etcd-password-file", f"cannot read {path}: {e}", "check the path"
        ) from e
    password = text.splitlines()[0] if text else ""
    if not password:
        raise InvalidInput("--etcd-password-file", f"{path} is empty", "write the password in it")
    return password


#: Fragments of a gRPC transport error's text that mean the TLS handshake refused a certificate
#: (ours or the peer's) or met a plaintext peer — not a peer that is down. Lower case.
_HANDSHAKE_REFUSALS = (
    "certificate_verify_failed",
    "certificate verify failed",
    "certificate_required",
    "bad_certificate",
    "certificate_expired",
    "certificate_unknown",
    "unknown_ca",
    "wrong_version_number",
    "handshake failed",
)


def handshake_refused(details: str) -> bool:
    """Whether a transport error's ``details`` say the TLS handshake failed on a credential (a
    certificate refused either way, or TLS against plaintext), rather than the peer being
    unreachable."""
    text = details.lower()
    return any(fragment in text for fragment in _HANDSHAKE_REFUSALS)
