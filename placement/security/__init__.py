"""Certificates and identities (design/deployment.md): the private CA ``placectl up`` creates,
the certificates it issues per process and operator role, and the TLS material every gRPC
server and client loads."""
