"""Telling a refused certificate from a peer that went away (design/deployment.md, "Credential
errors").

When a server refuses this process's client certificate (another CA signed it, it expired, none
was sent) or a TLS server meets a plaintext client, gRPC reports only "Socket closed" — as for a
peer that was killed — and for etcd sometimes "Unwrap failed". Callers that see such an error ask
a :class:`Prober`: it opens one TLS connection of its own to the address with the same material,
sends the HTTP/2 preface and reads. A server that accepts the certificate answers with its HTTP/2
settings; one that refused it sends a certificate alert during the handshake, or closes the
connection right after it (asked twice, so a server restarting in between is not taken for a
refusal). An address that does not answer, or answers, is not a refusal (``None``): the caller
goes on treating it as an outage. The whole probe is bounded by the caller's budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from placement.security.tls import TlsMaterial, key_files

#: The longest a probe takes (connect, handshake, first bytes), unless the caller has less.
PROBE_TIMEOUT = 2.0

_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

#: Fragments of a transport error's text after which a probe is worth it (lower case).
_CLOSED = ("socket closed", "unwrap failed", "tsi_data_corrupted", "connection reset")

#: TLS alerts (OpenSSL reason names) that refuse a certificate; other alerts are not about it.
_CERTIFICATE_ALERTS = (
    "BAD_CERTIFICATE",
    "UNKNOWN_CA",
    "CERTIFICATE_REQUIRED",
    "CERTIFICATE_EXPIRED",
    "CERTIFICATE_REVOKED",
    "CERTIFICATE_UNKNOWN",
    "UNSUPPORTED_CERTIFICATE",
    "ACCESS_DENIED",
)

Options = tuple[str, str, str]
GRPC_OPTIONS: Options = ("--cacert", "--cert", "--key")


def worth_probing(details: str) -> bool:
    """Whether a transport error's ``details`` may hide a refused certificate: the peer closed
    or garbled the connection (rather than being unreachable or timing out)."""
    text = details.lower()
    return any(fragment in text for fragment in _CLOSED)


def probe_context(tls: TlsMaterial | None) -> ssl.SSLContext:
    """The client context a probe speaks with: ``tls``'s CA, certificate and key (``None``:
    any server certificate, none of ours — only "does it speak TLS?"). Raises ``ssl.SSLError``
    (the material does not load) or ``OSError`` (no temporary directory to load it through)."""
    if tls is None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context = ssl.create_default_context(cadata=tls.ca.decode("ascii", "replace"))
        with key_files(tls) as (cert, key):
            context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["h2"])
    return context


def certificate_problem(tls: TlsMaterial, now: dt.datetime, cert_option: str) -> str:
    """What is wrong with this process's own certificate as far as it can tell alone (expired,
    not valid yet, not signed by a CA it trusts), or what else to check."""
    try:
        chain = x509.load_pem_x509_certificates(tls.cert)
        authorities = x509.load_pem_x509_certificates(tls.ca)
    except ValueError:
        return f"{cert_option} is not a readable PEM certificate"
    cert = chain[0]
    if cert.not_valid_after_utc < now:
        return f"the certificate in {cert_option} expired on {cert.not_valid_after_utc:%Y-%m-%d}"
    if cert.not_valid_before_utc > now:
        return (
            f"the certificate in {cert_option} is valid only from "
            f"{cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC (is this clock right?)"
        )
    signed = False
    for authority in authorities:
        with contextlib.suppress(ValueError, TypeError, InvalidSignature):
            cert.verify_directly_issued_by(authority)
            signed = True
    if not signed and len(chain) == 1:  # a chain's intermediates are not judged here
        return (
            f"the certificate in {cert_option} was not signed by the CA this process trusts "
            f"(it was issued by {cert.issuer.rfc4514_string()})"
        )
    return f"is the certificate in {cert_option} signed by the CA the server trusts?"


@dataclass(frozen=True, slots=True)
class _Refused:
    """The server refused our certificate: ``how`` (a certificate alert, or closed)."""

    how: str


CLOSED = _Refused("closed after the handshake")


async def _probe_once(
    address: str, context: ssl.SSLContext, tls: TlsMaterial | None, options: Options
) -> str | _Refused | None:
    """One connection: the whole answer (a line naming the option to fix), a refusal of our
    certificate to explain, or None. Unbounded: the caller bounds it."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        reader, writer = await asyncio.open_connection(
            host, int(port), ssl=context, server_hostname=host if tls is not None else None
        )
    except ssl.SSLCertVerificationError as e:
        return (
            f"the certificate of {address} does not verify against {options[0]} "
            f"({e.verify_message}): pass the CA that signed the server's certificate"
        )
    except ssl.SSLError as e:
        reason = str(e.reason or "")
        if tls is None:
            # a handshake alert is still TLS (a TLS 1.2 server asking for our certificate)
            if "ALERT" in reason:
                return f"{address} serves TLS: pass {', '.join(options[:2])} and {options[2]}"
            return None
        if "WRONG_VERSION_NUMBER" in reason:
            return f"{address} does not serve TLS: drop {', '.join(options[:2])} and {options[2]}"
        if any(alert in reason for alert in _CERTIFICATE_ALERTS):
            return _Refused(reason.lower())
        return None
    except (OSError, ValueError):
        return None  # unreachable: an outage, not a credential
    try:
        if tls is None:
            return f"{address} serves TLS: pass {', '.join(options[:2])} and {options[2]}"
        writer.write(_H2_PREFACE)
        try:
            await writer.drain()
            first = await reader.read(9)
        except ssl.SSLError as e:
            reason = str(e.reason or e)
            alert = any(a in reason for a in _CERTIFICATE_ALERTS)
            return _Refused(reason.lower()) if alert else None
        except ConnectionResetError:
            return CLOSED
        except OSError:
            return None
        return None if first else CLOSED
    finally:
        writer.close()


async def refusal(
    address: str,
    tls: TlsMaterial | None,
    *,
    options: Options = GRPC_OPTIONS,
    context: ssl.SSLContext | None = None,
    budget: float = PROBE_TIMEOUT,
    now: dt.datetime | None = None,
) -> str | None:
    """Why ``address`` refuses this process's credentials — one line naming the option to fix —
    or None when it does not (it accepted them, could not be reached, or did not answer within
    ``budget`` seconds: an outage). ``context``: :func:`probe_context` of ``tls``, when the
    caller keeps one."""
    try:
        context = context or probe_context(tls)
    except ssl.SSLError as e:
        return f"{options[1]}/{options[2]} cannot be loaded ({e.reason or e}): do they match?"
    except OSError:
        return None  # no temporary directory to load the key through: cannot tell
    try:
        async with asyncio.timeout(max(budget, 0.0)):
            why = await _probe_once(address, context, tls, options)
            if why is CLOSED:  # once more: a server restarting just then is no refusal
                why = await _probe_once(address, context, tls, options)
    except TimeoutError:
        return None
    if not isinstance(why, _Refused) or tls is None:
        return why if isinstance(why, str) else None
    problem = certificate_problem(tls, now or dt.datetime.now(dt.UTC), options[1])
    return f"{address} refused this process's certificate ({why.how}): {problem}"


class Prober:
    """:func:`refusal` for one set of credentials (its context built once), each address asked
    at most once per ``interval`` seconds, its verdict kept meanwhile (a peer that was down at
    the first question may refuse later). ``on_refused(address, why)`` is called when a probe
    (not a kept verdict) finds a refusal — callers log it there, once per interval."""

    def __init__(
        self,
        tls: TlsMaterial | None,
        options: Options = GRPC_OPTIONS,
        *,
        interval: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        on_refused: Callable[[str, str], None] | None = None,
    ) -> None:
        self.tls = tls
        self.options = options
        self.interval = interval
        self._clock = clock
        self._on_refused = on_refused
        self._context: ssl.SSLContext | None = None
        self._verdicts: dict[str, tuple[float, str | None]] = {}

    async def refusal(
        self, address: str, details: str, budget: float = PROBE_TIMEOUT
    ) -> str | None:
        """After a call to ``address`` failed with ``details``: why it refuses these
        credentials (asked now, or the verdict of the last ``interval``), or None."""
        if not worth_probing(details):
            return None
        now = self._clock()
        kept = self._verdicts.get(address)
        if kept is not None and now < kept[0]:
            return kept[1]
        self._verdicts[address] = (now + self.interval, None)  # concurrent callers: not twice
        why = await refusal(
            address,
            self.tls,
            options=self.options,
            context=self._probe_context(),
            budget=min(budget, PROBE_TIMEOUT),
        )
        self._verdicts[address] = (now + self.interval, why)
        if why is not None and self._on_refused is not None:
            self._on_refused(address, why)
        return why

    def _probe_context(self) -> ssl.SSLContext | None:
        if self._context is None:
            with contextlib.suppress(ssl.SSLError, OSError):  # refusal() says what failed
                self._context = probe_context(self.tls)
        return self._context
