"""Mutual TLS through the one channel/server factory (placement.rpc), against a real gRPC
server: a client with a certificate from the server's CA is served; a plaintext client, a
client without a certificate, one with a certificate from another CA and one with an expired
certificate are all refused (design/deployment.md)."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from placement.rpc import DATA_PROFILE, bind_server, channel, start_server
from placement.security.pki import Pair, Role, issue, issue_ca
from placement.security.tls import TlsMaterial

pytestmark = pytest.mark.integration

NOW = dt.datetime.now(dt.UTC)
CA = issue_ca("test CA", NOW)
OTHER_CA = issue_ca("another CA", NOW)


def _material(ca: Pair, pair: Pair) -> TlsMaterial:
    return TlsMaterial(ca.cert, pair.cert, pair.key)


@pytest.fixture
async def tls_server() -> AsyncIterator[str]:
    server, address = bind_server(
        "127.0.0.1:0", tls=_material(CA, issue(CA, "node-1", Role.AGENT, NOW))
    )
    await start_server(server, [])
    try:
        yield address
    finally:
        await server.stop(None)


async def _check(ch: grpc.aio.Channel) -> int:
    async with ch:
        stub = health_pb2_grpc.HealthStub(ch)
        reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        return int(reply.status)


async def test_a_client_certificate_from_the_ca_is_served(tls_server: str) -> None:
    tls = _material(CA, issue(CA, "admin", Role.ADMIN, NOW))
    status = await _check(channel(tls_server, DATA_PROFILE, tls))
    assert status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("client", ["plaintext", "no certificate", "another CA", "expired"])
async def test_every_other_client_is_refused(tls_server: str, client: str) -> None:
    if client == "plaintext":
        ch = channel(tls_server, DATA_PROFILE)
    elif client == "no certificate":
        ch = grpc.aio.secure_channel(tls_server, grpc.ssl_channel_credentials(CA.cert))
    elif client == "another CA":
        # Trusts the server's CA, but presents a certificate the server's CA did not sign.
        theirs = issue(OTHER_CA, "admin", Role.ADMIN, NOW)
        ch = channel(tls_server, DATA_PROFILE, TlsMaterial(CA.cert, theirs.cert, theirs.key))
    else:
        old = NOW - dt.timedelta(days=30)
        expired = issue(CA, "admin", Role.ADMIN, old, days=1, not_before=old)
        ch = channel(tls_server, DATA_PROFILE, _material(CA, expired))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _check(ch)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value
