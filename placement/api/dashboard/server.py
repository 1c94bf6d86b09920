"""The dashboard's HTTP server (aiohttp, on the driver's own event loop): ``GET /`` the page,
``GET /dashboard.js`` and ``/dashboard.css`` its script and style (files of this package: no
build step, nothing fetched from elsewhere), ``GET /api/dashboard`` the JSON document
(:mod:`.document`). Read-only: every other method is refused (405).

With the process's TLS material it serves HTTPS with the driver's own certificate. Client
certificates (``client_cert``): ``required`` (the default) — mutual TLS like every other port,
and the certificate's role must be one the read RPCs admit (``security.roles``: GetZoneStatus's
row), so an agent's certificate gets 403; ``none`` — HTTPS without asking the browser for one,
for operators who reach the port through a boundary of their own (design/observability.md).
Without TLS material it is plain HTTP.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources

from aiohttp import web

from placement.api.dashboard import ClientCert
from placement.api.dashboard.document import DashboardSource
from placement.errors import InvalidInput, PlacementError
from placement.metrics import parse_listen
from placement.security.pki import identity_of
from placement.security.roles import TABLE
from placement.security.tls import TlsMaterial, key_files

OPTION = "--http-listen"
#: The dashboard shows what the read RPCs answer, so it admits the roles they admit.
READ_METHOD = "/placement.v1.PlacementService/GetZoneStatus"

_STATIC = {
    "/": ("index.html", "text/html"),
    "/dashboard.js": ("dashboard.js", "text/javascript"),
    "/dashboard.css": ("dashboard.css", "text/css"),
}
_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Only this origin's own files: no inline script, no other site, no framing.
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'none'",
}


@dataclass(slots=True)
class DashboardServer:
    """The page at ``url``; :meth:`close` stops serving."""

    url: str
    _runner: web.AppRunner

    async def close(self) -> None:
        await self._runner.cleanup()


def ssl_context(tls: TlsMaterial, client_cert: ClientCert) -> ssl.SSLContext:
    """The server side: the driver's certificate; with ``required``, a client certificate of
    the same CA is demanded during the handshake."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with key_files(tls) as (cert, key):
        context.load_cert_chain(cert, key)
    if client_cert == "required":
        context.load_verify_locations(cadata=tls.ca.decode("ascii", "replace"))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _denial(request: web.Request) -> str:
    """Why the caller's certificate may not read (``""``: it may, or none was asked for)."""
    transport = request.transport
    tls_object = transport.get_extra_info("ssl_object") if transport is not None else None
    if not isinstance(tls_object, ssl.SSLObject | ssl.SSLSocket):
        return ""
    der = tls_object.getpeercert(binary_form=True)
    if der is None:
        return ""  # client_cert="none": nothing was asked for
    try:
        who = identity_of(ssl.DER_cert_to_PEM_cert(der).encode("ascii"))
    except InvalidInput:
        return "the certificate names no role"
    allowed = TABLE[READ_METHOD]
    if who.role in allowed:
        return ""
    needed = " or ".join(sorted(r.value for r in allowed))
    return f"the dashboard needs role {needed}; {who.name!r} has role {who.role.value}"


def make_app(source: DashboardSource) -> web.Application:
    """The routes on ``source`` (tests mount it without a socket)."""

    @web.middleware
    async def guard(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        denied = _denial(request)
        if denied:
            return web.json_response({"error": denied}, status=403, headers=_HEADERS)
        response = await handler(request)
        response.headers.update(_HEADERS)
        return response

    package = resources.files(__package__)

    async def static(request: web.Request) -> web.Response:
        name, kind = _STATIC[request.path]
        body = package.joinpath(name).read_bytes()
        return web.Response(body=body, content_type=kind, charset="utf-8")

    async def document(request: web.Request) -> web.Response:
        try:
            found = await source.document()
        except PlacementError as e:  # etcd unavailable: the page keeps what it shows, says why
            return web.json_response({"error": str(e)}, status=503)
        return web.json_response(found.to_json())

    app = web.Application(middlewares=[guard])
    for path in _STATIC:
        app.router.add_get(path, static, allow_head=False)
    app.router.add_get("/api/dashboard", document, allow_head=False)
    return app


async def serve_dashboard(
    listen: str,
    source: DashboardSource,
    tls: TlsMaterial | None = None,
    client_cert: ClientCert = "required",
) -> DashboardServer:
    """Serve the dashboard on ``listen`` (HOST:PORT, port 0 = any free) on the running loop.
    InvalidInput naming ``--http-listen`` when it is malformed or cannot be bound."""
    host, port = parse_listen(listen, OPTION)
    context = ssl_context(tls, client_cert) if tls is not None else None
    runner = web.AppRunner(make_app(source), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=context)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise InvalidInput(
            OPTION, f"cannot listen on {listen}: {e.strerror}", "pick a free port"
        ) from e
    bound = runner.addresses[0][1]
    scheme = "https" if context is not None else "http"
    where = f"[{host}]" if ":" in host else host
    return DashboardServer(f"{scheme}://{where}:{bound}/", runner)
