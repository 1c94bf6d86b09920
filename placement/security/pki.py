"""A private CA and the certificates it issues (design/deployment.md), with ``cryptography``.

Every process and operator gets one certificate: its **name** is the subject's common name, its
**role** a SAN URI ``urn:placement:role:ROLE`` — what the servers' role table checks (see
:func:`identity_of`). Keys are ECDSA P-256: signing and handshakes cost a fraction of RSA's, and
every TLS stack in the product (gRPC's BoringSSL, etcd's Go TLS) speaks it. Server certificates
also carry the host names and IP addresses peers dial (SAN DNS / IP).

Pure apart from the clock passed in: nothing here touches files (:func:`write_pair` does).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from placement.errors import InvalidInput

#: The SAN URI prefix that carries a certificate's role.
ROLE_URI = "urn:placement:role:"


class Role(Enum):
    """Who may call what (the servers' role table; design/deployment.md)."""

    DRIVER = "driver"
    AGENT = "agent"
    ADMIN = "admin"
    READER = "reader"
    CLIENT = "client"


@dataclass(frozen=True, slots=True)
class Pair:
    """A certificate and its private key, PEM-encoded."""

    cert: bytes
    key: bytes


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a certificate names: its common name and role."""

    name: str
    role: Role


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "placement"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def issue_ca(common_name: str, now: dt.datetime, days: int = 3650) -> Pair:
    """A self-signed CA certificate valid from ``now`` for ``days``."""
    key = _key()
    name = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return Pair(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def issue(
    ca: Pair,
    name: str,
    role: Role | None,
    now: dt.datetime,
    *,
    hosts: Sequence[str] = ("localhost", "127.0.0.1"),
    days: int = 365,
    not_before: dt.datetime | None = None,
) -> Pair:
    """A certificate for ``name`` in ``role``, signed by ``ca``, valid from ``not_before``
    (default: five minutes before ``now``) until ``now + days``; usable as a server's (for
    ``hosts``: names and IP addresses) and as a client's. Without a role (etcd's own
    certificates) the product's servers refuse every call it makes."""
    if not name or "/" in name:
        raise InvalidInput("name", f"{name!r} is not a certificate name", "e.g. node-1 or admin")
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise InvalidInput("ca", "the CA key is not an ECDSA key", "create the CA with issue_ca")
    key = _key()
    sans: list[x509.GeneralName] = []
    if role is not None:
        sans.append(x509.UniformResourceIdentifier(ROLE_URI + role.value))
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return Pair(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def identity_of(cert_pem: bytes) -> Identity:
    """The name and role a certificate carries; InvalidInput when it carries no role."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    name = str(names[0].value) if names else ""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        sans = x509.SubjectAlternativeName([])
    for uri in sans.get_values_for_type(x509.UniformResourceIdentifier):
        if uri.startswith(ROLE_URI):
            try:
                return Identity(name, Role(uri.removeprefix(ROLE_URI)))
            except ValueError:
                break
    raise InvalidInput(
        "certificate",
        f"the certificate of {name!r} names no role",
        f"issue it with a SAN URI {ROLE_URI}ROLE (one of {', '.join(r.value for r in Role)})",
    )


def write_pair(directory: Path, stem: str, pair: Pair) -> tuple[Path, Path]:
    """``STEM.crt`` and ``STEM.key`` (mode 0600) in ``directory``; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert.write_bytes(pair.cert)
    key.touch(mode=0o600, exist_ok=True)
    key.chmod(0o600)
    key.write_bytes(pair.key)
    return cert, key


def require_identity(cert_pem: bytes, role: Role, name: str | None = None) -> Identity:
    """The certificate's identity, checked at a process's start-up: it must carry ``role`` (and
    name ``name``, for an agent: its node, since peers check a node's appends against it).
    InvalidInput names ``--cert``."""
    who = identity_of(cert_pem)
    if who.role is not role:
        raise InvalidInput(
            "--cert",
            f"the certificate of {who.name!r} has role {who.role.value}, not {role.value}",
            f"give this process a {role.value} certificate",
        )
    if name is not None and who.name != name:
        raise InvalidInput(
            "--cert",
            f"the certificate names {who.name!r}, not {name!r}",
            f"issue {name}'s certificate with common name {name}",
        )
    return who
