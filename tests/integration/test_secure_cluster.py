"""A secure cluster as ``placectl up`` runs it — real driver and agent processes with mutual TLS
(design/deployment.md): every server refuses a plaintext client, a certificate another CA signed
and an expired one; the role table holds on the real servers — a ``reader`` cannot alter a zone
or put data, an ``agent`` cannot call the driver's admin methods, nobody but a driver may move
or delete a replica — and a refused call changes nothing in etcd or on the agents."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rich.console import Console

from placement.data.client import DataClient, DriverRoutes, GrpcConnector
from placement.data.partitioning import partition_of
from placement.errors import CredentialError
from placement.local.cluster import Cluster, UpOptions, start_cluster, wait_ready
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeySpace
from placement.metastore.kv import KeyValue
from placement.rpc import DATA_PROFILE, channel
from placement.security.pki import Pair, Role, issue, issue_ca, write_pair
from placement.security.probe import refusal, worth_probing
from placement.security.tls import TlsMaterial
from placement.v1 import (
    common_pb2,
    data_pb2,
    data_pb2_grpc,
    driver_pb2,
    driver_pb2_grpc,
    replica_pb2,
    replica_pb2_grpc,
)

pytestmark = pytest.mark.integration

ZONE = "sec"
PARTITIONS = 2


@pytest.fixture(scope="module")
def secure(etcd: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    prefix = f"/t{uuid.uuid4().hex[:12]}/placement"
    opts = UpOptions(nodes=2, drivers=1, etcd=etcd.endpoint, api_port=0, prefix=prefix)
    cluster = start_cluster(opts, tmp_path_factory.mktemp("secure"), Console(quiet=True))
    try:
        asyncio.run(wait_ready(cluster, opts, demo_zone=False))
        asyncio.run(_create_zone(cluster))
        yield cluster
    finally:
        cluster.stop()


async def _create_zone(cluster: Cluster) -> None:
    config = driver_pb2.ZoneConfig(partitions=PARTITIONS, replicas=2)
    async with channel(cluster.driver_apis[0], DATA_PROFILE, cluster.tls("admin")) as ch:
        stub = driver_pb2_grpc.PlacementServiceStub(ch)
        await stub.CreateZone(driver_pb2.CreateZoneRequest(name=ZONE, config=config), timeout=10)
    # serving: every partition takes a write
    async with DataClient(cluster.driver_apis, deadline=60.0, tls=cluster.tls("client")) as c:
        for key in _one_key_per_partition():
            await c.put(ZONE, key, b"ready")


def _one_key_per_partition() -> list[bytes]:
    found: dict[int, bytes] = {}
    for i in range(1000):
        found.setdefault(partition_of(b"k%d" % i, PARTITIONS), b"k%d" % i)
    return [found[p] for p in range(PARTITIONS)]


async def _agents(cluster: Cluster) -> dict[str, str]:
    async with channel(cluster.driver_apis[0], DATA_PROFILE, cluster.tls("reader")) as ch:
        stub = driver_pb2_grpc.PlacementServiceStub(ch)
        nodes = await stub.ListNodes(driver_pb2.ListNodesRequest(), timeout=10)
    return {n.name: n.address for n in nodes.nodes}


async def _snapshot(cluster: Cluster) -> list[KeyValue]:
    """The zone's records, assignments and the pause flag: what an operator change would touch."""
    keys = KeySpace(cluster.prefix)
    async with EtcdClient([cluster.etcd_endpoint]) as client:
        zones = await client.list_prefix(keys.zones_prefix())
        assign = await client.list_prefix(keys.assign_prefix())
        paused = await client.get(keys.paused())
    return [*zones.kvs, *assign.kvs, *paused.kvs]


NOW = dt.datetime.now(dt.UTC)
OTHER_CA = issue_ca("another CA", NOW)


def _refused_kinds(cluster: Cluster) -> dict[str, TlsMaterial | None]:
    assert cluster.pki is not None
    ca_cert = cluster.pki.ca.read_bytes()
    ca = Pair(ca_cert, (cluster.pki.directory / "ca.key").read_bytes())
    theirs = issue(OTHER_CA, "admin", Role.ADMIN, NOW)
    old = NOW - dt.timedelta(days=30)
    expired = issue(ca, "admin", Role.ADMIN, old, days=1, not_before=old)
    return {
        "plaintext": None,
        "another CA": TlsMaterial(ca_cert, theirs.cert, theirs.key),
        "expired": TlsMaterial(ca_cert, expired.cert, expired.key),
    }


async def _health(address: str, tls: TlsMaterial | None) -> int:
    async with channel(address, DATA_PROFILE, tls) as ch:
        reply = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
    return int(reply.status)


async def test_every_server_refuses_plaintext_another_ca_and_an_expired_certificate(
    secure: Cluster,
) -> None:
    servers = [*secure.driver_apis, *(await _agents(secure)).values()]
    assert len(servers) == 3
    for address in servers:
        assert (
            await _health(address, secure.tls("reader")) == health_pb2.HealthCheckResponse.SERVING
        )
        for kind, tls in _refused_kinds(secure).items():
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await _health(address, tls)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, (address, kind)
            # gRPC says only "Socket closed"; the probe names the credential to fix
            assert worth_probing(caught.value.details() or ""), caught.value.details()
            why = await refusal(address, tls)
            assert why is not None, (address, kind)
            assert REFUSAL_WORDS[kind] in why, (address, kind, why)
        assert await refusal(address, secure.tls("reader")) is None


#: What the probe says about each refused kind of :func:`_refused_kinds`.
REFUSAL_WORDS = {
    "plaintext": "serves TLS: pass --cacert, --cert and --key",
    "another CA": "--cert was not signed by the CA",
    "expired": "--cert expired on",
}


def _placectl(cluster: Cluster, tls: TlsMaterial | None, tmp: Path, *argv: str) -> Any:
    """``placectl ARGV`` against the cluster's drivers, presenting ``tls`` (files in ``tmp``)."""
    flags = ["--endpoint", ",".join(cluster.driver_apis)]
    if tls is not None:
        (tmp / "ca.crt").write_bytes(tls.ca)
        cert, key = write_pair(tmp, "me", Pair(tls.cert, tls.key))
        flags += ["--cacert", str(tmp / "ca.crt"), "--cert", str(cert), "--key", str(key)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLACECTL_")}
    return subprocess.run(
        [sys.executable, "-m", "placement", *flags, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


@pytest.mark.parametrize("kind", ["plaintext", "another CA", "expired"])
def test_placectl_with_a_refused_certificate_ends_at_once_naming_it(
    secure: Cluster, tmp_path: Path, kind: str
) -> None:
    tls = _refused_kinds(secure)[kind]
    for argv in (["zone", "list"], ["data", "put", ZONE, "k", "v"]):
        began = time.monotonic()
        result = _placectl(secure, tls, tmp_path, *argv)
        took = time.monotonic() - began
        assert result.returncode == 2, result
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, result.stderr
        assert REFUSAL_WORDS[kind] in lines[0], lines[0]
        assert took < 4.5, f"{argv}: retried for {took:.1f} s like an outage"
    ok = _placectl(secure, secure.tls("reader"), tmp_path, "zone", "list")
    assert ok.returncode == 0, ok
    assert ZONE in ok.stdout, ok


async def test_a_data_client_whose_certificate_an_agent_refuses_fails_at_once(
    secure: Cluster,
) -> None:
    """Routes read with a good certificate, the agents called with an expired one: the put ends
    with a CredentialError naming ``--cert`` at once instead of retrying until its deadline."""
    expired = _refused_kinds(secure)["expired"]
    routes = DriverRoutes(secure.driver_apis, tls=secure.tls("client"))
    client = DataClient(
        secure.driver_apis, deadline=30.0, route_source=routes, connector=GrpcConnector(expired)
    )
    async with client:
        began = time.monotonic()
        with pytest.raises(CredentialError, match="--cert expired on"):
            await client.put(ZONE, b"never-written", b"x")
        assert time.monotonic() - began < 5.0, "retried like an outage"
    async with DataClient(secure.driver_apis, tls=secure.tls("client")) as good:
        assert await good.get(ZONE, b"never-written") is None


async def _denied(call: Any, needs: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED, caught.value
    assert f"needs role {needs}" in (caught.value.details() or ""), caught.value.details()


async def test_a_reader_cannot_alter_a_zone_or_put_data(secure: Cluster) -> None:
    before = await _snapshot(secure)
    config = driver_pb2.ZoneConfig(partitions=PARTITIONS, replicas=1)
    async with channel(secure.driver_apis[0], DATA_PROFILE, secure.tls("reader")) as ch:
        api = driver_pb2_grpc.PlacementServiceStub(ch)
        zone = await api.GetZone(driver_pb2.GetZoneRequest(name=ZONE), timeout=10)
        assert zone.config.replicas == 2  # the reader reads
        await _denied(
            api.AlterZone(driver_pb2.AlterZoneRequest(name=ZONE, config=config), timeout=10),
            "admin or driver",
        )
        await _denied(
            api.CreateZone(driver_pb2.CreateZoneRequest(name="new", config=config), timeout=10),
            "admin or driver",
        )
        await _denied(api.DropZone(driver_pb2.DropZoneRequest(name=ZONE), timeout=10), "admin")
        await _denied(api.PauseRebalancing(driver_pb2.PauseRequest(), timeout=10), "admin")
    key = b"reader-wrote-this"
    async with DataClient(secure.driver_apis, tls=secure.tls("client")) as client:
        routes = await client.routes(ZONE, refresh=True)
        p = partition_of(key, routes.partitions)
        primary = routes.addresses[routes.route(p).primary]
        async with channel(primary, DATA_PROFILE, secure.tls("reader")) as ch:
            data = data_pb2_grpc.DataServiceStub(ch)
            ref = common_pb2.PartitionRef(zone=ZONE, partition=p, generation=routes.layout)
            put = data_pb2.PutRequest(partition=ref, key=key, value=b"x")
            await _denied(data.Put(put, timeout=10), "client")
            delete = data_pb2.DeleteRequest(partition=ref, key=_one_key_per_partition()[p])
            await _denied(data.Delete(delete, timeout=10), "client")
        assert await client.get(ZONE, key) is None
        assert await client.get(ZONE, _one_key_per_partition()[p]) == b"ready"
    assert await _snapshot(secure) == before


async def test_an_agent_certificate_cannot_call_the_drivers_admin_methods(secure: Cluster) -> None:
    before = await _snapshot(secure)
    config = driver_pb2.ZoneConfig(partitions=PARTITIONS, replicas=1)
    async with channel(secure.driver_apis[0], DATA_PROFILE, secure.tls("node-1")) as ch:
        api = driver_pb2_grpc.PlacementServiceStub(ch)
        await _denied(api.DropZone(driver_pb2.DropZoneRequest(name=ZONE), timeout=10), "admin")
        await _denied(
            api.AlterZone(driver_pb2.AlterZoneRequest(name=ZONE, config=config), timeout=10),
            "admin",
        )
        await _denied(
            api.CancelRebalance(common_pb2.PartitionRef(zone=ZONE, partition=0), timeout=10),
            "admin",
        )
        await _denied(
            api.GetZone(driver_pb2.GetZoneRequest(name=ZONE), timeout=10), "admin or client"
        )
    assert await _snapshot(secure) == before


@pytest.mark.parametrize("who", ["admin", "client", "node-2"])
async def test_only_a_driver_moves_or_deletes_a_replica(secure: Cluster, who: str) -> None:
    agents = await _agents(secure)
    ref = common_pb2.PartitionRef(zone=ZONE, partition=0)
    huge = 1 << 40
    async with channel(agents["node-1"], DATA_PROFILE, secure.tls("reader")) as ch:
        state = replica_pb2_grpc.ReplicaServiceStub(ch)
        request = replica_pb2.GetPartitionStateRequest(partition=ref)
        before = await state.GetPartitionState(request, timeout=10)
    async with channel(agents["node-1"], DATA_PROFILE, secure.tls(who)) as ch:
        stub = replica_pb2_grpc.ReplicaServiceStub(ch)
        retire = replica_pb2.RetireRequest(
            partition=ref, stable_peers=common_pb2.Peers(names=["node-2"]), revision=huge,
            epoch=huge,
        )  # fmt: skip
        await _denied(stub.Retire(retire, timeout=10), "driver")
        move = replica_pb2.RebalanceRequest(
            partition=ref,
            old_peers=before.current_peers,
            new_peers=common_pb2.Peers(names=["node-2"]),
            revision=huge,
            epoch=huge,
        )
        await _denied(stub.Rebalance(move, timeout=10), "driver")
    async with channel(agents["node-1"], DATA_PROFILE, secure.tls("reader")) as ch:
        state = replica_pb2_grpc.ReplicaServiceStub(ch)
        after = await state.GetPartitionState(request, timeout=10)
    assert after == before
