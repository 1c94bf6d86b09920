"""Telling a refused certificate from a peer that went away (design/deployment.md, "Credential
errors").

When a server refuses this process's client certificate (another CA signed it, it expired, none
was sent) or a TLS server meets a plaintext client, gRPC reports only "Socket closed" — as for a
peer that was killed — and for etcd sometimes "Unwrap failed". Callers that see such an error ask
:func:`refusal` once: it opens one TLS connection of its own to the address with the same
material, sends the HTTP/2 preface and reads. A server that accepts the certificate answers with
its HTTP/2 settings; one that refused it sends a TLS alert or closes the connection right after
the handshake. An address that does not answer, or answers, is not a refusal (``None``): the
caller goes on treating it as an outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import math
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from placement.security.tls import TlsMaterial

#: How long the probe waits for the connection, the handshake and the server's first bytes.
PROBE_TIMEOUT = 2.0

_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

#: Fragments of a transport error's text after which :func:`refusal` is worth asking (lower case).
_CLOSED = ("socket closed", "unwrap failed", "tsi_data_corrupted", "connection reset")


def worth_probing(details: str) -> bool:
    """Whether a transport error's ``details`` may hide a refused certificate: the peer closed
    or garbled the connection (rather than being unreachable or timing out)."""
    text = details.lower()
    return any(fragment in text for fragment in _CLOSED)


@contextlib.contextmanager
def _key_files(tls: TlsMaterial) -> Iterator[tuple[str, str]]:
    """``ssl`` loads a certificate chain only from files: the two, readable by this user only,
    for as long as the context is being built."""
    with tempfile.TemporaryDirectory(prefix="placement-probe-") as d:
        cert, key = Path(d) / "cert.pem", Path(d) / "key.pem"
        for path, data in ((cert, tls.cert), (key, tls.key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        yield str(cert), str(key)


def _context(tls: TlsMaterial | None) -> ssl.SSLContext:
    if tls is None:  # only: does it speak TLS at all?
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context = ssl.create_default_context(cadata=tls.ca.decode("ascii", "replace"))
        with _key_files(tls) as (cert, key):
            context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["h2"])
    return context


def certificate_problem(tls: TlsMaterial, now: dt.datetime, cert_option: str) -> str:
    """What is wrong with this process's own certificate as far as it can tell alone (expired,
    not valid yet, not signed by its CA), or what else to check."""
    try:
        cert = x509.load_pem_x509_certificate(tls.cert)
        ca = x509.load_pem_x509_certificate(tls.ca)
    except ValueError:
        return f"{cert_option} is not a readable PEM certificate"
    if cert.not_valid_after_utc < now:
        return f"the certificate in {cert_option} expired on {cert.not_valid_after_utc:%Y-%m-%d}"
    if cert.not_valid_before_utc > now:
        return (
            f"the certificate in {cert_option} is valid only from "
            f"{cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC (is this clock right?)"
        )
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return (
            f"the certificate in {cert_option} was not signed by the CA this process trusts "
            f"(it was issued by {cert.issuer.rfc4514_string()})"
        )
    return f"is the certificate in {cert_option} signed by the CA the server trusts?"


async def refusal(
    address: str,
    tls: TlsMaterial | None,
    *,
    options: tuple[str, str, str] = ("--cacert", "--cert", "--key"),
    now: dt.datetime | None = None,
) -> str | None:
    """Why ``address`` refuses this process's credentials — one line naming the option to fix —
    or None when it does not (it accepted them, or could not be reached: an outage)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        context = _context(tls)
    except ssl.SSLError as e:
        return f"{options[1]}/{options[2]} cannot be loaded ({e.reason or e}): do they match?"
    try:
        async with asyncio.timeout(PROBE_TIMEOUT):
            reader, writer = await asyncio.open_connection(
                host, int(port), ssl=context, server_hostname=host if tls is not None else None
            )
    except ssl.SSLCertVerificationError as e:
        return (
            f"the certificate of {address} does not verify against {options[0]} "
            f"({e.verify_message}): pass the CA that signed the server's certificate"
        )
    except ssl.SSLError as e:
        if tls is None:
            return None  # not TLS either: whatever closed the socket, it is not a credential
        if "WRONG_VERSION_NUMBER" in str(e.reason):
            return f"{address} does not serve TLS: drop {options[0]}, {options[1]} and {options[2]}"
        if "ALERT" in str(e.reason):
            return _refused(address, tls, str(e.reason), options, now)
        return None
    except (OSError, TimeoutError, ValueError):
        return None  # unreachable or slow: an outage, not a credential
    try:
        if tls is None:
            return f"{address} serves TLS: pass {options[0]}, {options[1]} and {options[2]}"
        writer.write(_H2_PREFACE)
        try:
            async with asyncio.timeout(PROBE_TIMEOUT):
                await writer.drain()
                first = await reader.read(9)
        except ssl.SSLError as e:
            return _refused(address, tls, str(e.reason or e), options, now)
        except ConnectionResetError:
            return _refused(address, tls, "connection reset", options, now)
        except (OSError, TimeoutError):
            return None
        return None if first else _refused(address, tls, "closed after the handshake", options, now)
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
            async with asyncio.timeout(PROBE_TIMEOUT):
                await writer.wait_closed()


class Prober:
    """:func:`refusal` for one set of credentials, asking each address at most once per
    ``interval`` seconds (a peer that was down at the first question may refuse later)."""

    def __init__(
        self,
        tls: TlsMaterial | None,
        options: tuple[str, str, str] = ("--cacert", "--cert", "--key"),
        *,
        interval: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tls = tls
        self.options = options
        self.interval = interval
        self._clock = clock
        self._asked: dict[str, float] = {}

    async def refusal(self, address: str, details: str) -> str | None:
        """After a call to ``address`` failed with ``details``: why it refuses these
        credentials, or None (not worth asking, asked recently, or not refused)."""
        now = self._clock()
        if not worth_probing(details) or now < self._asked.get(address, -math.inf):
            return None
        self._asked[address] = now + self.interval
        return await refusal(address, self.tls, options=self.options)


def _refused(
    address: str,
    tls: TlsMaterial,
    how: str,
    options: tuple[str, str, str],
    now: dt.datetime | None,
) -> str:
    problem = certificate_problem(tls, now or dt.datetime.now(dt.UTC), options[1])
    return f"{address} refused this process's certificate ({how.lower()}): {problem}"
