"""The private CA and its certificates (placement.security): a certificate carries its name
and role and verifies against its CA; bad names, role-less certificates and unreadable TLS
files are refused naming the field to fix."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from placement.errors import InvalidInput
from placement.security.pki import Identity, Role, identity_of, issue, issue_ca, write_pair
from placement.security.tls import load_tls

NOW = dt.datetime(2026, 11, 24, tzinfo=dt.UTC)


def test_a_certificate_carries_its_name_role_and_hosts_and_verifies_against_its_ca() -> None:
    ca = issue_ca("test CA", NOW)
    pair = issue(ca, "node-1", Role.AGENT, NOW, hosts=("localhost", "127.0.0.2"))
    assert identity_of(pair.cert) == Identity("node-1", Role.AGENT)
    cert = x509.load_pem_x509_certificate(pair.cert)
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.2")]
    assert cert.not_valid_after_utc == NOW + dt.timedelta(days=365)
    impostor = issue_ca("test CA", NOW)  # the same name, another key
    with pytest.raises(InvalidSignature):
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(impostor.cert))


def test_every_role_round_trips_and_a_role_less_certificate_is_refused() -> None:
    ca = issue_ca("test CA", NOW)
    for role in Role:
        assert identity_of(issue(ca, f"who-{role.value}", role, NOW).cert).role is role
    with pytest.raises(InvalidInput) as caught:
        identity_of(ca.cert)  # the CA's own certificate names no role
    assert caught.value.field == "certificate"
    with pytest.raises(InvalidInput) as caught:
        issue(ca, "a/b", Role.ADMIN, NOW)
    assert caught.value.field == "name"


def test_tls_files_are_read_once_and_a_missing_or_non_pem_one_names_its_flag(
    tmp_path: Path,
) -> None:
    ca = issue_ca("test CA", NOW)
    cacert, _ = write_pair(tmp_path, "ca", ca)
    cert, key = write_pair(tmp_path, "admin", issue(ca, "admin", Role.ADMIN, NOW))
    assert key.stat().st_mode & 0o777 == 0o600
    material = load_tls(cacert, cert, key)
    assert (material.ca, material.cert) == (ca.cert, cert.read_bytes())
    with pytest.raises(InvalidInput) as caught:
        load_tls(cacert, tmp_path / "missing.crt", key)
    assert caught.value.field == "--cert"
    garbage = tmp_path / "garbage.key"
    garbage.write_bytes(b"not a key")
    with pytest.raises(InvalidInput) as caught:
        load_tls(cacert, cert, garbage)
    assert caught.value.field == "--key"
