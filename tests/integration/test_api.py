"""PlacementService over real gRPC against a real etcd: CRUD, validation, forwarding, health.

Two API servers on port 0 share one etcd prefix: ``leader`` holds a real election win (its fence),
``follower`` has none and forwards writes to the leader's address from the election value.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from test_driver_chaos import Blackhole

from placement.api.client import PlacementClient
from placement.api.service import PlacementAPI
from placement.api.servicer import SERVICE_NAME, register
from placement.core.model import ZoneSpec, effective_min_in_sync
from placement.metastore.codec import NodeRecord, PrimaryLease, decode_zone_spec
from placement.metastore.election import Election, Leadership
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeySpace
from placement.metastore.store import Metastore
from placement.metastore.transitions import Fence, LeaseWrite
from placement.v1 import common_pb2, driver_pb2, driver_pb2_grpc
from replica.registration import Registration

pytestmark = pytest.mark.asyncio


class _Role:
    """The API's view of leadership (the driver's ``fence()`` / ``leader_api()``)."""

    def __init__(self, leadership: Leadership | None) -> None:
        self.leadership = leadership

    def fence(self) -> Fence | None:
        if self.leadership is None or self.leadership.is_lost:
            return None
        return self.leadership.fence

    def leader_api(self) -> str | None:
        return None


@dataclass
class Served:
    server: grpc.aio.Server
    channel: grpc.aio.Channel
    stub: driver_pb2_grpc.PlacementServiceAsyncStub
    address: str


async def _serve(client: EtcdClient, keys: KeySpace, role: _Role) -> Served:
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await register(server, PlacementAPI(client, keys, role))
    await server.start()
    address = f"127.0.0.1:{port}"
    channel = grpc.aio.insecure_channel(address)
    return Served(server, channel, driver_pb2_grpc.PlacementServiceStub(channel), address)


@dataclass
class Cluster:
    leader: Served
    follower: Served
    client: EtcdClient
    keys: KeySpace
    leader_fence: Fence


@pytest.fixture
async def cluster(etcd: Any, keys: KeySpace) -> AsyncIterator[Cluster]:
    async with EtcdClient([etcd.endpoint]) as client:
        leader_role = _Role(None)
        leader = await _serve(client, keys, leader_role)
        value = json.dumps({"id": "d1", "api": leader.address}).encode()
        leadership = await Election(client, keys, "d1", ttl=5, value=value).campaign()
        leader_role.leadership = leadership
        follower = await _serve(client, keys, _Role(None))
        try:
            yield Cluster(leader, follower, client, keys, leadership.fence)
        finally:
            for served in (leader, follower):
                await served.channel.close()
                await served.server.stop(None)
            await leadership.resign()


def _config(**kw: object) -> driver_pb2.ZoneConfig:
    base: dict[str, object] = {"partitions": 8, "replicas": 3}
    base.update(kw)
    return driver_pb2.ZoneConfig(**base)  # type: ignore[arg-type]


async def _zone_keys(c: Cluster) -> list[bytes]:
    found = await c.client.list_prefix(c.keys.zones_prefix())
    return [kv.key for kv in found.kvs]


async def test_crud_on_leader_and_via_follower(cluster: Cluster) -> None:
    c = cluster
    created = await c.leader.stub.CreateZone(
        driver_pb2.CreateZoneRequest(
            name="orders",
            config=_config(node_selector={"tier": "ssd"}, failure_domain="rack"),
        ),
        timeout=5,
    )
    assert created.config.partitions == 8
    assert created.revision > 0
    # a follower forwards the write to the leader
    await c.follower.stub.CreateZone(
        driver_pb2.CreateZoneRequest(name="logs", config=_config(scale_down_delay_seconds=30)),
        timeout=5,
    )
    zones = await c.follower.stub.ListZones(driver_pb2.ListZonesRequest(), timeout=5)
    assert [z.name for z in zones.zones] == ["logs", "orders"]
    got = await c.follower.stub.GetZone(driver_pb2.GetZoneRequest(name="logs"), timeout=5)
    assert got.config.scale_down_delay_seconds == 30
    altered = await c.follower.stub.AlterZone(
        driver_pb2.AlterZoneRequest(
            name="orders", config=_config(replicas=5), update_fields=["replicas"]
        ),
        timeout=5,
    )
    assert (altered.config.replicas, altered.config.partitions) == (5, 8)
    assert dict(altered.config.node_selector) == {"tier": "ssd"}
    status = await c.follower.stub.GetZoneStatus(
        driver_pb2.GetZoneRequest(name="orders"), timeout=5
    )
    # no driver runs here, so nobody created the partitions: the zone is not READY yet
    assert status.state == driver_pb2.REBALANCING
    assert (status.partitions_done, status.partitions_total) == (0, 8)
    await c.follower.stub.DropZone(driver_pb2.DropZoneRequest(name="logs"), timeout=5)
    assert await _zone_keys(c) == [c.keys.zone("orders")]


@pytest.mark.parametrize(
    ("name", "config", "field"),
    [
        ("z", {"replicas": 0}, "replicas"),
        ("z", {"replicas": 65}, "replicas"),
        ("z", {"partitions": 0}, "partitions"),
        ("z", {"partitions": 65_537}, "partitions"),
        ("z", {"node_selector": {"rack a": "x"}}, "node_selector"),
        ("z", {"node_selector": {f"k{i}": "v" for i in range(33)}}, "node_selector"),
        # 2.5 MiB of selector: over etcd's request limit, refused before it gets there
        ("z", {"node_selector": {f"k{i:06d}": "v" * 64 for i in range(30_000)}}, "node_selector"),
        ("z", {"scale_up_delay_seconds": -1.0}, "scale_up_delay"),
        ("z", {"scale_down_delay_seconds": -0.5}, "scale_down_delay"),
        ("z", {"min_in_sync": 65}, "min_in_sync"),
        ("bad name", {}, "zone"),
    ],
)
async def test_invalid_create_names_field_and_writes_nothing(
    cluster: Cluster, name: str, config: dict[str, object], field: str
) -> None:
    c = cluster
    before = await c.client.current_revision()
    for stub in (c.leader.stub, c.follower.stub):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.CreateZone(
                driver_pb2.CreateZoneRequest(name=name, config=_config(**config)), timeout=5
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in (info.value.details() or "")
    assert await _zone_keys(c) == []
    assert await c.client.current_revision() == before


async def test_min_in_sync_is_stored_shown_and_altered(cluster: Cluster) -> None:
    c = cluster
    created = await c.follower.stub.CreateZone(
        driver_pb2.CreateZoneRequest(name="isr", config=_config(min_in_sync=3)), timeout=5
    )
    assert created.config.min_in_sync == 3
    stored = decode_zone_spec((await c.client.get(c.keys.zone("isr"))).kvs[0].value)
    assert isinstance(stored, ZoneSpec)
    assert (stored.min_in_sync, effective_min_in_sync(stored)) == (3, 3)
    lowered = await c.follower.stub.AlterZone(
        driver_pb2.AlterZoneRequest(
            name="isr", config=_config(min_in_sync=1), update_fields=["min_in_sync"]
        ),
        timeout=5,
    )
    assert (lowered.config.min_in_sync, lowered.config.replicas) == (1, 3)
    # 0 (unset) on an alter naming the field: back to the default, which is not stored
    default = await c.leader.stub.AlterZone(
        driver_pb2.AlterZoneRequest(
            name="isr", config=driver_pb2.ZoneConfig(), update_fields=["min_in_sync"]
        ),
        timeout=5,
    )
    assert default.config.min_in_sync == 0
    raw = (await c.client.get(c.keys.zone("isr"))).kvs[0].value
    assert b"min_in_sync" not in raw
    got = await c.follower.stub.GetZone(driver_pb2.GetZoneRequest(name="isr"), timeout=5)
    assert got.config.min_in_sync == 0


async def test_duplicate_unknown_and_bad_alter(cluster: Cluster) -> None:
    c = cluster
    request = driver_pb2.CreateZoneRequest(name="dup", config=_config())
    await c.leader.stub.CreateZone(request, timeout=5)
    revision = await c.client.current_revision()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await c.follower.stub.CreateZone(request, timeout=5)
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    for call in (
        c.follower.stub.GetZone(driver_pb2.GetZoneRequest(name="nope"), timeout=5),
        c.follower.stub.DropZone(driver_pb2.DropZoneRequest(name="nope"), timeout=5),
        c.follower.stub.GetZoneStatus(driver_pb2.GetZoneRequest(name="nope"), timeout=5),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    for fields, config, field in (
        (["replicas"], _config(replicas=0), "replicas"),
        (["min_in_sync"], _config(min_in_sync=100), "min_in_sync"),
        (["colour"], _config(), "update_fields"),
        ([], _config(), "update_fields"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await c.leader.stub.AlterZone(
                driver_pb2.AlterZoneRequest(name="dup", config=config, update_fields=fields),
                timeout=5,
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in (info.value.details() or "")
    assert await c.client.current_revision() == revision


async def test_assignments_pages_nodes_pause_cancel(cluster: Cluster) -> None:
    c = cluster
    await c.leader.stub.CreateZone(
        driver_pb2.CreateZoneRequest(name="a", config=_config(partitions=5)), timeout=5
    )
    first = await c.follower.stub.GetAssignments(
        driver_pb2.GetAssignmentsRequest(zone="a", page_size=2), timeout=5
    )
    assert [a.partition for a in first.assignments] == [0, 1]
    assert first.next_page_token == "2"
    assert not first.assignments[0].has_pending
    last = await c.follower.stub.GetAssignments(
        driver_pb2.GetAssignmentsRequest(zone="a", page_size=2, page_token="4"), timeout=5
    )
    assert [a.partition for a in last.assignments] == [4]
    assert last.next_page_token == ""
    one = await c.follower.stub.GetAssignments(
        driver_pb2.GetAssignmentsRequest(zone="a", partition=3), timeout=5
    )
    assert [a.partition for a in one.assignments] == [3]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await c.follower.stub.GetAssignments(
            driver_pb2.GetAssignmentsRequest(zone="a", partition=5), timeout=5
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    nodes = await c.follower.stub.ListNodes(driver_pb2.ListNodesRequest(), timeout=5)
    assert list(nodes.nodes) == []

    paused = await c.follower.stub.PauseRebalancing(driver_pb2.PauseRequest(), timeout=5)
    assert paused.paused
    assert (await c.client.get(c.keys.paused())).kvs
    resumed = await c.follower.stub.ResumeRebalancing(driver_pb2.PauseRequest(), timeout=5)
    assert not resumed.paused
    assert not (await c.client.get(c.keys.paused())).kvs

    reply = await c.follower.stub.CancelRebalance(
        common_pb2.PartitionRef(zone="a", partition=1), timeout=5
    )
    assert not reply.accepted
    assert "no rebalance" in reply.detail


async def test_writes_unavailable_without_leader(etcd: Any, keys: KeySpace) -> None:
    async with EtcdClient([etcd.endpoint]) as client:
        served = await _serve(client, keys, _Role(None))
        try:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await served.stub.CreateZone(
                    driver_pb2.CreateZoneRequest(name="z", config=_config()), timeout=5
                )
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "leader" in (info.value.details() or "")
        finally:
            await served.channel.close()
            await served.server.stop(None)


async def test_health_and_reflection(cluster: Cluster) -> None:
    health = health_pb2_grpc.HealthStub(cluster.follower.channel)
    answer = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    reflect = reflection_pb2_grpc.ServerReflectionStub(cluster.follower.channel)

    async def requests() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
        yield reflection_pb2.ServerReflectionRequest(list_services="")

    names: list[str] = []
    async for response in reflect.ServerReflectionInfo(requests(), timeout=5):
        names = [s.name for s in response.list_services_response.service]
        break
    assert SERVICE_NAME in names
    assert "grpc.health.v1.Health" in names


async def test_watch_streams_primary_lease_moves_not_renewals_and_resumes(
    cluster: Cluster,
) -> None:
    """WatchAssignments carries the primary: a lease granted or moved is an event with the new
    holder; a renewal (same node and epoch, later expiry) is not; a watch resumed from the last
    revision seen continues exactly after it."""
    c = cluster
    created = await c.leader.stub.CreateZone(
        driver_pb2.CreateZoneRequest(name="lw", config=_config(partitions=2, replicas=2)), timeout=5
    )
    store = Metastore(c.client, c.keys)
    fence = c.leader_fence
    await store.create_partitions("lw", {0: ("a", "b"), 1: ("b", "c")}, created.revision, fence, 1)
    start = await c.client.current_revision(c.keys.zone("lw"))
    watch = c.follower.stub.WatchAssignments(
        driver_pb2.WatchAssignmentsRequest(zone="lw", from_revision=start), timeout=20
    )

    async def lease(node: str, epoch: int, expiry: int, expected: int, moves: bool) -> int:
        write = LeaseWrite(PrimaryLease(node, epoch, expiry), expected, 0 if moves else None)
        done = await store.write_primaries("lw", {0: write}, fence, 1)
        assert done.raced == 0
        return done.revision

    granted = await lease("a", 1, 10_000, 0, True)
    renewed = await lease("a", 1, 20_000, granted, False)
    moved = await lease("b", 2, 30_000, renewed, True)
    events = []
    async for event in watch:
        events.append((event.revision, event.assignment.partition, event.assignment.primary))
        if event.revision >= moved:
            break
    watch.cancel()
    assert events == [(granted, 0, "a"), (moved, 0, "b")], (events, start, granted, renewed)

    resumed = c.leader.stub.WatchAssignments(
        driver_pb2.WatchAssignmentsRequest(zone="lw", from_revision=granted), timeout=20
    )
    async for event in resumed:
        first = (event.revision, event.assignment.primary)
        break
    resumed.cancel()
    assert first == (moved, "b")


async def test_watch_and_cancel_a_pending_rebalance(cluster: Cluster) -> None:
    c = cluster
    created = await c.leader.stub.CreateZone(
        driver_pb2.CreateZoneRequest(name="w", config=_config(partitions=2, replicas=2)), timeout=5
    )
    fence = c.leader_fence
    store = Metastore(c.client, c.keys)
    watch = c.follower.stub.WatchAssignments(
        driver_pb2.WatchAssignmentsRequest(zone="w", from_revision=created.revision), timeout=20
    )
    await store.create_partitions("w", {0: ("a", "b"), 1: ("b", "c")}, created.revision, fence, 1)
    trig = await store.trigger("w", 1, ("c", "d"), created.revision + 5, fence, 2)
    assert trig.state.pending is not None
    seen: list[tuple[int, list[str], list[str]]] = []
    async for event in watch:
        a = event.assignment
        seen.append((a.partition, list(a.stable.names), list(a.pending.names)))
        if a.has_pending:
            break
    watch.cancel()
    assert (0, ["a", "b"], []) in seen
    assert seen[-1] == (1, ["b", "c"], ["c", "d"])

    got = await c.follower.stub.GetAssignments(
        driver_pb2.GetAssignmentsRequest(zone="w", partition=1), timeout=5
    )
    assert got.assignments[0].has_pending
    reply = await c.follower.stub.CancelRebalance(
        common_pb2.PartitionRef(zone="w", partition=1), timeout=5
    )
    assert reply.accepted, reply.detail
    state = await store.read_partition("w", 1)
    assert state.cancel is not None
    assert state.pending is not None
    assert state.cancel.value.pending_revision == state.pending.mod_revision  # type: ignore[union-attr]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await c.follower.stub.CancelRebalance(
            common_pb2.PartitionRef(zone="w", partition=2), timeout=5
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "partition" in (info.value.details() or "")


async def test_registration_survives_lease_loss_and_revokes(etcd: Any, keys: KeySpace) -> None:
    async with EtcdClient([etcd.endpoint]) as client:
        record = NodeRecord("n1", "127.0.0.1:9", {"rack": "a"})
        registration = Registration(client, keys, record, ttl=2)
        await registration.start()
        first = (await client.get(keys.node("n1"))).first()
        assert first is not None
        assert first.lease != 0
        await client.revoke_lease(first.lease)  # as if etcd expired it
        deadline = asyncio.get_running_loop().time() + 15
        again = None
        while asyncio.get_running_loop().time() < deadline:
            again = (await client.get(keys.node("n1"))).first()
            if again is not None and again.lease != first.lease:
                break
            await asyncio.sleep(0.1)
        assert again is not None
        assert again.lease != first.lease
        # The key is visible once etcd commits it; the agent counts the registration when it
        # reads the reply (and then sets ``registered``) — wait for that, not for luck.
        await asyncio.wait_for(registration.registered.wait(), 5)
        assert registration.registrations == 2
        await registration.stop()
        assert not (await client.get(keys.node("n1"))).kvs


async def test_a_read_is_hedged_past_a_frozen_driver_and_a_write_is_not(cluster: Cluster) -> None:
    """The client is connected to the leader when it freezes (a proxy in front of it holds
    every byte and closes nothing: what a SIGSTOPped process looks like to a connection already
    open). A read asks the next endpoint after ``hedge_after`` and returns its answer long
    before ``call_timeout``; a write is never sent twice at once, so it waits ``call_timeout``
    on the frozen driver before it fails over — and is applied once."""
    c = cluster
    proxy = Blackhole(c.leader.address)
    frozen = await proxy.start()
    loop = asyncio.get_running_loop()
    list_zones = driver_pb2.ListZonesRequest()
    create = driver_pb2.CreateZoneRequest(name="written", config=_config())
    try:
        endpoints = [frozen, c.follower.address]
        for hedged in (True, False):
            async with PlacementClient(endpoints, call_timeout=3.0, hedge_after=0.2) as api:
                await api.call(lambda s, t: s.ListZones(list_zones, timeout=t))  # connected
                assert api.active_endpoint == frozen
                proxy.open.clear()
                began = loop.time()
                if hedged:
                    zones = await api.read(lambda s, t: s.ListZones(list_zones, timeout=t))
                    took = loop.time() - began
                    assert [z.name for z in zones.zones] == [], zones
                    assert took < 2.0, f"the read waited {took:.2f}s on the frozen driver"
                else:
                    await api.call(lambda s, t: s.CreateZone(create, timeout=t))
                    took = loop.time() - began
                    assert took >= 3.0, f"the write left the frozen driver after {took:.2f}s"
                assert api.active_endpoint == c.follower.address
                proxy.open.set()
        names = await c.follower.stub.ListZones(list_zones, timeout=5)
        assert [z.name for z in names.zones] == ["written"]
    finally:
        await proxy.close()
