"""The private CA and certificates of a local cluster (``placectl up``), in ``{data-dir}/tls/``
(design/deployment.md).

``ca.crt`` (and ``ca.key``, kept for issuing more) sign one certificate per process — each
driver (role ``driver``) and agent (role ``agent``) by its name — one per operator role
(``admin``, ``reader``, ``client``), and etcd's: ``etcd`` (the members, for clients and peers),
``etcd-client`` (common name = the etcd user the product runs as) and ``etcd-root`` (common
name ``root``, etcd's administrator). etcd's carry no role, so the product's servers refuse
them. A directory that already holds a CA is reused (a restart with the same ``--data-dir``
keeps every certificate); missing certificates are issued. ``reader.p12`` holds the reader's
certificate and key as a PKCS#12 bundle a browser imports to open the drivers' dashboard
(password :data:`BROWSER_PASSWORD`: some browsers refuse a bundle without one; the file is
mode 0600 like the keys beside it).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12

from placement.security.pki import Pair, Role, issue, issue_ca, write_pair
from placement.security.tls import TlsMaterial, load_tls

#: The etcd user the product's processes run as (the common name of ``etcd-client.crt``).
ETCD_USER = "placement"
#: Operator certificates, by file stem: each carries the role of its name.
OPERATORS: Mapping[str, Role] = {"admin": Role.ADMIN, "reader": Role.READER, "client": Role.CLIENT}
#: etcd's certificates (no role), by file stem -> common name.
ETCD_NAMES: Mapping[str, str] = {"etcd": "etcd", "etcd-client": ETCD_USER, "etcd-root": "root"}
#: The operator certificate bundled for browsers (``{stem}.p12``) and the bundle's password.
BROWSER_OPERATOR = "reader"
BROWSER_PASSWORD = "placement"


@dataclass(frozen=True, slots=True)
class LocalPki:
    """The files of a local cluster's CA, and the flags and environment that name them."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    def cert(self, name: str) -> Path:
        return self.directory / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.directory / f"{name}.key"

    def material(self, name: str) -> TlsMaterial:
        return load_tls(self.ca, self.cert(name), self.key(name))

    def flags(self, name: str) -> list[str]:
        """``--cacert --cert --key`` of process or operator ``name``."""
        return [
            "--cacert",
            str(self.ca),
            "--cert",
            str(self.cert(name)),
            "--key",
            str(self.key(name)),
        ]

    def etcd_flags(self) -> list[str]:
        """``--etcd-cacert --etcd-cert --etcd-key``: the product's etcd client certificate."""
        return [
            "--etcd-cacert", str(self.ca),
            "--etcd-cert", str(self.cert("etcd-client")),
            "--etcd-key", str(self.key("etcd-client")),
        ]  # fmt: skip

    def bundle(self, name: str = BROWSER_OPERATOR) -> Path:
        """``{name}.p12``: certificate and key for a browser (password ``BROWSER_PASSWORD``)."""
        return self.directory / f"{name}.p12"

    def env(self, name: str) -> dict[str, str]:
        """``PLACECTL_CACERT``, ``PLACECTL_CERT``, ``PLACECTL_KEY`` for operator ``name``."""
        return {
            "PLACECTL_CACERT": str(self.ca),
            "PLACECTL_CERT": str(self.cert(name)),
            "PLACECTL_KEY": str(self.key(name)),
        }


def create_pki(
    directory: Path,
    processes: Mapping[str, Role],
    now: dt.datetime,
    hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
) -> LocalPki:
    """The CA in ``directory`` (created unless there), and every missing certificate: one per
    process in ``processes`` (name -> role), per operator role and for etcd."""
    pki = LocalPki(directory)
    if pki.ca.exists() and (directory / "ca.key").exists():
        ca = Pair(pki.ca.read_bytes(), (directory / "ca.key").read_bytes())
    else:
        ca = issue_ca("placement local CA", now)
        write_pair(directory, "ca", ca)
    wanted: dict[str, tuple[str, Role | None]] = {
        **{name: (name, role) for name, role in processes.items()},
        **{stem: (stem, role) for stem, role in OPERATORS.items()},
        **{stem: (cn, None) for stem, cn in ETCD_NAMES.items()},
    }
    for stem, (common_name, role) in wanted.items():
        if not (pki.cert(stem).exists() and pki.key(stem).exists()):
            write_pair(directory, stem, issue(ca, common_name, role, now, hosts=hosts))
    if not pki.bundle().exists():
        write_bundle(pki, BROWSER_OPERATOR)
    return pki


def write_bundle(pki: LocalPki, name: str) -> Path:
    """``{name}.p12`` (mode 0600): ``name``'s certificate, key and the CA, encrypted with
    :data:`BROWSER_PASSWORD` in the algorithms every browser's importer reads."""
    key = serialization.load_pem_private_key(pki.key(name).read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)  # pki.py issues ECDSA P-256 keys
    encryption = (
        serialization.PrivateFormat.PKCS12.encryption_builder()
        .kdf_rounds(50_000)
        .key_cert_algorithm(pkcs12.PBES.PBESv2SHA256AndAES256CBC)
        .build(BROWSER_PASSWORD.encode())
    )
    data = pkcs12.serialize_key_and_certificates(
        name.encode(),
        key,
        x509.load_pem_x509_certificate(pki.cert(name).read_bytes()),
        [x509.load_pem_x509_certificate(pki.ca.read_bytes())],
        encryption,
    )
    path = pki.bundle(name)
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_bytes(data)
    return path
