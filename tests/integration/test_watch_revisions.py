"""WatchAssignments at the edges of etcd's history, over real gRPC against a private etcd (its
history is compacted here, so no other test shares it):

* from revision 0 — "now": nothing before the call is replayed, and the next change arrives;
* from a compacted revision: OUT_OF_RANGE at once, naming the compaction and what to do (re-read
  the assignments, then watch from the revision of that read) — on the raw stream and through
  ``PlacementClient.watch_assignments``, which does not retry it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from test_api import Cluster, _config, _Role, _serve

from placement.api.client import ApiError, PlacementClient
from placement.metastore.election import Election
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeySpace
from placement.metastore.store import Metastore
from placement.v1 import driver_pb2

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def private(etcd_factory: Any, keys: KeySpace) -> AsyncIterator[Cluster]:
    server = etcd_factory()
    async with EtcdClient([server.endpoint]) as client:
        role = _Role(None)
        leader = await _serve(client, keys, role)
        value = json.dumps({"id": "d1", "api": leader.address}).encode()
        role.leadership = await Election(client, keys, "d1", ttl=5, value=value).campaign()
        try:
            yield Cluster(leader, leader, client, keys, role.leadership.fence)
        finally:
            await leader.channel.close()
            await leader.server.stop(None)
            await role.leadership.resign()


async def _zone(c: Cluster) -> Metastore:
    created = await c.leader.stub.CreateZone(
        driver_pb2.CreateZoneRequest(name="h", config=_config(partitions=2, replicas=2)), timeout=5
    )
    store = Metastore(c.client, c.keys)
    placed = {0: ("a", "b"), 1: ("b", "c")}
    await store.create_partitions("h", placed, created.revision, c.leader_fence, 1)
    return store


async def test_a_watch_from_revision_zero_starts_now(private: Cluster) -> None:
    c = private
    store = await _zone(c)
    before = await c.client.current_revision(c.keys.zone("h"))
    watch = c.leader.stub.WatchAssignments(
        driver_pb2.WatchAssignmentsRequest(zone="h", from_revision=0), timeout=20
    )
    first = asyncio.ensure_future(anext(aiter(watch)))
    triggered: list[int] = []
    targets = (("c", "d"), ("d", "e"))
    for i in range(50):  # the stream picks "now" when it starts: change until it shows one
        target = targets[i % 2]
        trig = await store.trigger("h", 1, target, before + 10 + i, c.leader_fence, 2 + i)
        triggered.append(trig.revision)
        done, _ = await asyncio.wait({first}, timeout=0.2)
        if done:
            break
    event = await asyncio.wait_for(first, 10)
    watch.cancel()
    assert event.revision > before, "a watch from 0 replayed what came before it"
    assert event.assignment.partition == 1
    assert event.revision in triggered, (event.revision, triggered)


async def test_a_watch_from_a_compacted_revision_says_so_at_once(private: Cluster) -> None:
    c = private
    store = await _zone(c)
    old = await c.client.current_revision(c.keys.zone("h"))
    await store.trigger("h", 1, ("c", "d"), old + 10, c.leader_fence, 2)
    now = await c.client.current_revision(c.keys.zone("h"))
    await c.client.compact(now)

    watch = c.leader.stub.WatchAssignments(
        driver_pb2.WatchAssignmentsRequest(zone="h", from_revision=old), timeout=20
    )
    with pytest.raises(grpc.aio.AioRpcError) as raw:
        async for _ in watch:
            pass
    assert raw.value.code() == grpc.StatusCode.OUT_OF_RANGE, raw.value
    assert "compacted" in (raw.value.details() or ""), raw.value.details()
    assert "re-list" in (raw.value.details() or ""), raw.value.details()

    async with PlacementClient(c.leader.address, deadline=30.0) as api:
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(ApiError) as refused:
            async for _ in api.watch_assignments("h", old):
                pass
        assert refused.value.code == grpc.StatusCode.OUT_OF_RANGE, refused.value
        assert loop.time() - began < 5.0, "a compacted revision was retried, not said"
        # From the compaction on, the same watch works.
        stream = api.watch_assignments("h", now)
        nxt = asyncio.ensure_future(anext(aiter(stream)))
        await store.trigger("h", 0, ("a", "d"), now + 10, c.leader_fence, 3)
        event = await asyncio.wait_for(nxt, 10)
        assert event.revision > now
        assert event.assignment.partition == 0
        await stream.aclose()
