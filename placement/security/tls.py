"""The TLS material a process loads once — CA, certificate, key — from the files its flags name
(``--cacert --cert --key``, etcdctl's names), with an error naming the flag to fix."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from placement.errors import InvalidInput

_PEM_BEGIN = b"-----BEGIN "


@dataclass(frozen=True, slots=True)
class TlsMaterial:
    """PEM bytes: the CA that signs every peer, this process's certificate and its key."""

    ca: bytes
    cert: bytes
    key: bytes


def _read(path: Path, option: str, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InvalidInput(
            option, f"cannot read {what} {path}: {e.strerror}", "check the path"
        ) from e
    if _PEM_BEGIN not in data:
        raise InvalidInput(option, f"{path} is not a PEM {what}", f"pass the {what} file")
    return data


def load_tls(
    cacert: Path,
    cert: Path,
    key: Path,
    options: tuple[str, str, str] = ("--cacert", "--cert", "--key"),
) -> TlsMaterial:
    """Read the three files; InvalidInput names the option of the one that is missing or not
    PEM. Whether they match each other is checked where they are used (the TLS handshake)."""
    return TlsMaterial(
        _read(cacert, options[0], "CA certificate"),
        _read(cert, options[1], "certificate"),
        _read(key, options[2], "private key"),
    )


@contextlib.contextmanager
def key_files(tls: TlsMaterial) -> Iterator[tuple[str, str]]:
    """``ssl`` loads a certificate chain only from files: the certificate and key, readable by
    this user only, for as long as a context is being built (``ssl.SSLContext.load_cert_chain``)."""
    with tempfile.TemporaryDirectory(prefix="placement-tls-") as d:
        cert, key = Path(d) / "cert.pem", Path(d) / "key.pem"
        for path, data in ((cert, tls.cert), (key, tls.key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        yield str(cert), str(key)
