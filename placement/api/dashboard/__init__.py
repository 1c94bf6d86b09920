"""The read-only web dashboard every driver serves at ``--http-listen`` (design/observability.md,
"Web dashboard"): :mod:`.document` builds what it shows from one consistent read of the prefix,
by the same rules as the gRPC API; :mod:`.server` serves that document as JSON and the page
(``index.html``, plain HTML and JavaScript that polls it) over HTTPS."""

from typing import Literal, get_args

#: ``--http-client-cert``: under TLS, whether a browser must present a certificate of the
#: cluster's CA (``required``) or is served without one (``none``). Here, not in the server
#: module, so ``placectl driver run --help`` loads no HTTP server.
ClientCert = Literal["required", "none"]
CLIENT_CERT_CHOICES: tuple[str, ...] = get_args(ClientCert)
