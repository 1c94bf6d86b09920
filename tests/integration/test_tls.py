"""Mutual TLS through the one channel/server factory (placement.rpc), against a real gRPC
server: a client with a certificate from the server's CA is served; a plaintext client, a
client without a certificate, one with a certificate from another CA and one with an expired
certificate are all refused; a certified caller whose role the table does not allow gets
PERMISSION_DENIED before the method's body runs (design/deployment.md)."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from placement.rpc import API_PROFILE, DATA_PROFILE, bind_server, channel, start_server
from placement.security.pki import Pair, Role, issue, issue_ca
from placement.security.tls import TlsMaterial
from placement.v1 import driver_pb2, driver_pb2_grpc

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


class _Recording(driver_pb2_grpc.PlacementServiceServicer):
    """The API's gRPC surface with a recording body: what is under test is the role guard in
    front of it (it must stop a call before the body runs)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def CreateZone(self, request: Any, context: Any) -> driver_pb2.Zone:
        self.calls.append("CreateZone")
        return driver_pb2.Zone(name=request.name)

    async def WatchAssignments(self, request: Any, context: Any) -> AsyncIterator[Any]:
        self.calls.append("WatchAssignments")
        yield driver_pb2.AssignmentEvent()


@pytest.fixture
async def guarded() -> AsyncIterator[tuple[str, _Recording]]:
    server, address = bind_server(
        "127.0.0.1:0", tls=_material(CA, issue(CA, "driver-1", Role.DRIVER, NOW))
    )
    body = _Recording()
    driver_pb2_grpc.add_PlacementServiceServicer_to_server(body, server)
    await start_server(server, ["placement.v1.PlacementService"])
    try:
        yield address, body
    finally:
        await server.stop(None)


def _stub(address: str, role: Role) -> tuple[grpc.aio.Channel, Any]:
    ch = channel(address, API_PROFILE, _material(CA, issue(CA, f"a-{role.value}", role, NOW)))
    return ch, driver_pb2_grpc.PlacementServiceStub(ch)


async def test_a_role_the_table_does_not_allow_is_denied_before_the_body_runs(
    guarded: tuple[str, _Recording],
) -> None:
    address, body = guarded
    request = driver_pb2.CreateZoneRequest(name="z", config=driver_pb2.ZoneConfig(partitions=1))
    for role in (Role.READER, Role.AGENT, Role.CLIENT):
        ch, stub = _stub(address, role)
        async with ch:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.CreateZone(request, timeout=5)
            assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "needs role admin or driver" in (caught.value.details() or "")
            assert f"has role {role.value}" in (caught.value.details() or "")
            # Health stays open to every certified caller.
            health = health_pb2_grpc.HealthStub(ch)
            await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert body.calls == []
    ch, stub = _stub(address, Role.ADMIN)
    async with ch:
        assert (await stub.CreateZone(request, timeout=5)).name == "z"
    assert body.calls == ["CreateZone"]


async def test_a_streaming_method_is_guarded_too(guarded: tuple[str, _Recording]) -> None:
    address, body = guarded
    ch, stub = _stub(address, Role.AGENT)
    async with ch:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in stub.WatchAssignments(driver_pb2.WatchAssignmentsRequest()):
                pass
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert body.calls == []
    ch, stub = _stub(address, Role.READER)
    async with ch:
        events = [e async for e in stub.WatchAssignments(driver_pb2.WatchAssignmentsRequest())]
    assert len(events) == 1
    assert body.calls == ["WatchAssignments"]
