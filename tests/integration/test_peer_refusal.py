"""A peer that refuses this process's certificate, over real TLS (design/deployment.md,
"Credential errors"): gRPC reports it only as "Socket closed", so the driver's agent client and
an agent's replication links ask the peer (:mod:`placement.security.probe`) and log one error
naming the flag to fix — and keep running, since one misconfigured peer must not stop the
control plane or an agent.

The peer here is an agent given the wrong ``--cacert``: its own certificate is signed by the
cluster's CA (so callers trust it) but it accepts only clients another CA signed."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import AsyncIterator

import pytest
from test_driver import eventually

from placement.driver.agents import AgentClient, AgentUnavailable
from placement.rpc import bind_server, start_server
from placement.security.pki import Role, issue, issue_ca
from placement.security.tls import TlsMaterial
from replica.data.peers import ReplicationPeers

pytestmark = pytest.mark.integration

NOW = dt.datetime.now(dt.UTC)
CA = issue_ca("cluster CA", NOW)
WRONG_CA = issue_ca("some other CA", NOW)

REFUSED = "refused this process's certificate"


def _material(name: str, role: Role) -> TlsMaterial:
    pair = issue(CA, name, role, NOW)
    return TlsMaterial(CA.cert, pair.cert, pair.key)


@pytest.fixture
async def misconfigured_agent() -> AsyncIterator[str]:
    """A server with node-2's certificate that trusts only ``WRONG_CA``'s clients."""
    own = issue(CA, "node-2", Role.AGENT, NOW)
    server, address = bind_server("127.0.0.1:0", tls=TlsMaterial(WRONG_CA.cert, own.cert, own.key))
    await start_server(server, ["placement.v1.ReplicaService"])
    yield address
    await server.stop(None)


async def test_the_driver_says_an_agent_refuses_its_certificate_and_keeps_going(
    misconfigured_agent: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = AgentClient(timeout=3.0, tls=_material("d1", Role.DRIVER))
    try:
        with caplog.at_level(logging.ERROR, logger="placement.driver.agents"):
            with pytest.raises(AgentUnavailable, match=REFUSED) as caught:
                await client.hosted(misconfigured_agent, "z", 0)
            assert "--cert" in str(caught.value)
            errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
            assert len(errors) == 1, errors
            assert REFUSED in errors[0]
            # asked again within the probe interval: the verdict is kept, not probed or logged again
            with pytest.raises(AgentUnavailable, match=REFUSED):
                await client.hosted(misconfigured_agent, "z", 0)
            errors = [r for r in caplog.records if r.levelno == logging.ERROR]
            assert len(errors) == 1
    finally:
        await client.close()


async def test_a_replication_link_says_its_peer_refuses_the_agents_certificate(
    misconfigured_agent: str, caplog: pytest.LogCaptureFixture
) -> None:
    peers = ReplicationPeers("node-1", tls=_material("node-1", Role.AGENT))
    try:
        with caplog.at_level(logging.ERROR, logger="replica.data.peers"):
            peers.link("node-2", misconfigured_agent)  # its heartbeat is refused

            async def logged() -> bool:
                return any(REFUSED in r.getMessage() for r in caplog.records)

            await eventually(logged, "the refusal logged", within=10)
        line = next(r.getMessage() for r in caplog.records if REFUSED in r.getMessage())
        assert line.startswith(f"replication to {misconfigured_agent}:"), line
        assert "--cert" in line, line
        # the link goes on (heartbeats, the peer counted as down), logging no more than once
        await eventually(lambda: _true(peers.is_down("node-2")), "the peer counted as down")
        assert sum(REFUSED in r.getMessage() for r in caplog.records) == 1
    finally:
        await peers.close()


async def _true(value: bool) -> bool:
    return value
