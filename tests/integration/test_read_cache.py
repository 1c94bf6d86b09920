"""Reads from memory (design/control-plane.md, "Reads from memory") against a real etcd: the
driver's read cache answers GetAssignments, GetZoneStatus and ListNodes exactly as a direct etcd
read at the same revision does, honours ``min_revision`` and ``linearizable``, falls back to etcd
when it cannot answer, and the options reach it over gRPC."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from placement.api.service import PlacementAPI, ReadOptions, ZoneNotFound
from placement.api.servicer import register
from placement.core.model import ZoneSpec
from placement.errors import InvalidInput, StoreUnavailable
from placement.metastore.codec import (
    Assignment,
    NodeRecord,
    PrimaryLease,
    encode_assignment,
    encode_node,
    encode_primary,
    encode_zone_spec,
)
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import AssignField, KeySpace
from placement.metastore.readcache import ReadCache
from placement.v1 import driver_pb2, driver_pb2_grpc

pytestmark = pytest.mark.asyncio

ZONE = "cached"
PARTITIONS = 20
NODES = ("n1", "n2", "n3", "n4")


async def _populate(client: EtcdClient, keys: KeySpace) -> int:
    """A zone with stable assignments, a pending move and primary leases, and node records,
    written as the driver and agents write them; the last write's revision."""
    await client.put(keys.zone(ZONE), encode_zone_spec(ZoneSpec(ZONE, PARTITIONS, 3)))
    for n in NODES:
        await client.put(keys.node(n), encode_node(NodeRecord(n, f"127.0.0.1:1{n[1:]}")))
    revision = 0
    for p in range(PARTITIONS):
        peers = tuple(NODES[(p + k) % 4] for k in range(3))
        stable = encode_assignment(Assignment(peers, 1, 0, 2))
        await client.put(keys.assign(ZONE, p, AssignField.STABLE), stable)
        lease = encode_primary(PrimaryLease(peers[0], 1, 2**62))
        revision = await client.put(keys.primary(ZONE, p), lease)
    return revision


async def _until(condition: Callable[[], bool], within: float) -> None:
    for _ in range(int(within / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {within}s")


@pytest.fixture
async def apis(etcd: Any, keys: KeySpace) -> AsyncIterator[tuple[PlacementAPI, PlacementAPI]]:
    """(cached, direct): the same API with and without a read cache."""
    async with EtcdClient([etcd.endpoint]) as client:
        await _populate(client, keys)
        cache = ReadCache(client, keys)
        cache.start()
        await asyncio.wait_for(cache.wait_synced(), 10)
        try:
            yield PlacementAPI(client, keys, cache=cache), PlacementAPI(client, keys)
        finally:
            await cache.close()


async def _same(cached: PlacementAPI, direct: PlacementAPI) -> int:
    """Every read answered by both at one revision (nothing else writes): equal; the revision."""
    revision, views, _ = await direct.assignments(ZONE, limit=1000)
    read = ReadOptions(min_revision=revision)
    assert await cached.assignments(ZONE, limit=1000, read=read) == (revision, views, None)
    for start in (0, 7, 14):
        assert await cached.assignments(ZONE, start=start, limit=7, read=read) == (
            await direct.assignments(ZONE, start=start, limit=7)
        )
    assert await cached.assignments(ZONE, partition=5, read=read) == (
        await direct.assignments(ZONE, partition=5)
    )
    assert await cached.list_nodes(read) == await direct.list_nodes()
    assert await cached.zone_status(ZONE, read) == await direct.zone_status(ZONE)
    return revision


async def test_the_cache_answers_what_etcd_answers_at_the_same_revision(
    apis: tuple[PlacementAPI, PlacementAPI],
) -> None:
    cached, direct = apis
    cache = cached.cache
    assert cache is not None
    assert await cache.ready(linearizable=True)
    await _same(cached, direct)
    # A write: a reader asking for at least its revision sees it, from memory.
    keys = cached.keys
    moved = encode_assignment(Assignment(("n4", "n1", "n2"), 1, 0, 9))
    written = await cached.client.put(keys.assign(ZONE, 3, AssignField.PENDING), moved)
    revision, (view,), _ = await cached.assignments(
        ZONE, partition=3, read=ReadOptions(min_revision=written)
    )
    assert revision >= written
    assert view.pending == ("n4", "n1", "n2")
    status = await cached.zone_status(ZONE, ReadOptions(linearizable=True))
    assert (status.partitions_total, status.partitions_done) == (PARTITIONS, PARTITIONS - 1)
    assert await _same(cached, direct) >= written


async def test_a_dropped_zone_is_not_found_and_nothing_is_kept_for_it(
    apis: tuple[PlacementAPI, PlacementAPI],
) -> None:
    cached, direct = apis
    for api in (cached, direct):
        await api.zone_status(ZONE)
        await api.assignments(ZONE, limit=5)
        assert api.holds(ZONE)
    written = (await cached.client.delete(cached.keys.zone(ZONE))).revision
    read = ReadOptions(min_revision=written)
    for api in (cached, direct):
        with pytest.raises(ZoneNotFound):
            await api.zone_status(ZONE, read)
        assert not api.holds(ZONE)


async def test_a_revision_from_the_future_is_refused_naming_it(
    apis: tuple[PlacementAPI, PlacementAPI],
) -> None:
    cached, direct = apis
    cache = cached.cache
    assert cache is not None
    cache.lag_wait = 0.2
    assert await cache.ready(linearizable=True)
    ahead = ReadOptions(min_revision=cache.revision + 1000)
    for api in (cached, direct):  # the cache waits, then reads etcd, which cannot answer it
        with pytest.raises(InvalidInput, match=r"read\.min_revision"):
            await api.assignments(ZONE, read=ahead)
        with pytest.raises(InvalidInput, match=r"read\.min_revision"):
            await api.list_nodes(ahead)
    with pytest.raises(InvalidInput, match="is negative"):
        await cached.zone_status(ZONE, ReadOptions(min_revision=-1))


async def test_a_cache_that_is_not_watching_reads_etcd(etcd: Any, keys: KeySpace) -> None:
    async with EtcdClient([etcd.endpoint]) as client:
        last = await _populate(client, keys)
        idle = ReadCache(client, keys)  # never started: not watching
        api = PlacementAPI(client, keys, cache=idle)
        revision, views, _ = await api.assignments(ZONE, limit=1000)
        assert revision >= last
        assert len(views) == PARTITIONS
        await idle.close()
        # A zone the cache does not hold (created a moment ago elsewhere) is read from etcd.
        cache = ReadCache(client, keys)
        cache.start()
        await asyncio.wait_for(cache.wait_synced(), 10)
        try:
            assert await cache.ready(linearizable=True)
            other = "fresh"
            await client.put(keys.zone(other), encode_zone_spec(ZoneSpec(other, 2, 1)))
            found = PlacementAPI(client, keys, cache=cache)
            status = await found.zone_status(other)
            assert status.name == other
        finally:
            await cache.close()


async def test_read_options_reach_the_cache_over_grpc(etcd: Any, keys: KeySpace) -> None:
    async with EtcdClient([etcd.endpoint]) as client:
        last = await _populate(client, keys)
        cache = ReadCache(client, keys)
        cache.start()
        await asyncio.wait_for(cache.wait_synced(), 10)
        server = grpc.aio.server()
        port = server.add_insecure_port("127.0.0.1:0")
        servicer, _ = await register(server, PlacementAPI(client, keys, cache=cache))
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = driver_pb2_grpc.PlacementServiceStub(channel)
                read = driver_pb2.ReadOptions(min_revision=last)
                nodes = await stub.ListNodes(driver_pb2.ListNodesRequest(read=read), timeout=5)
                assert [n.name for n in nodes.nodes] == list(NODES)
                assert nodes.revision >= last
                page = await stub.GetAssignments(
                    driver_pb2.GetAssignmentsRequest(zone=ZONE, read=read), timeout=5
                )
                assert len(page.assignments) == PARTITIONS
                assert page.revision >= last
                status = await stub.GetZoneStatus(
                    driver_pb2.GetZoneRequest(
                        name=ZONE, read=driver_pb2.ReadOptions(linearizable=True)
                    ),
                    timeout=5,
                )
                assert status.revision >= last
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.GetZoneStatus(
                        driver_pb2.GetZoneRequest(
                            name=ZONE, read=driver_pb2.ReadOptions(min_revision=-5)
                        ),
                        timeout=5,
                    )
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "read.min_revision" in (info.value.details() or "")
        finally:
            await server.stop(None)
            await servicer.close()
            await cache.close()


async def test_a_linearizable_read_reflects_every_write_before_it(
    etcd: Any, keys: KeySpace
) -> None:
    """etcd's revision also moves for keys the cache does not watch: a linearizable read the
    cache cannot prove current (it has not applied etcd's revision) is read from etcd, never
    answered from a cache that may miss a write."""
    async with EtcdClient([etcd.endpoint]) as client:
        await _populate(client, keys)
        cache = ReadCache(client, keys, lag_wait=30.0)
        cache.start()
        await asyncio.wait_for(cache.wait_synced(), 10)
        api = PlacementAPI(client, keys, cache=cache)
        try:
            assert await cache.ready(linearizable=True)  # caught up: from memory
            elsewhere = await client.put(f"/elsewhere/{keys.prefix}".encode(), b"x")
            assert not await asyncio.wait_for(cache.ready(linearizable=True), 5)
            revision, views, _ = await api.assignments(
                ZONE, limit=1000, read=ReadOptions(linearizable=True)
            )
            assert revision >= elsewhere  # etcd answered
            assert len(views) == PARTITIONS
            moved = encode_assignment(Assignment(("n4", "n1", "n2"), 1, 0, 9))
            written = await client.put(keys.assign(ZONE, 0, AssignField.PENDING), moved)
            revision, (view,), _ = await api.assignments(
                ZONE, partition=0, read=ReadOptions(linearizable=True)
            )
            assert revision >= written
            assert view.pending == ("n4", "n1", "n2")
        finally:
            await cache.close()


async def test_a_cache_cut_off_from_etcd_stops_answering(etcd_factory: Any) -> None:
    """Its watch resumes a broken stream by itself for a while: meanwhile the cache does not
    answer (a read goes to etcd and fails like any read there), and answers again once the
    stream is back."""
    server = etcd_factory()
    keys = KeySpace("/cut")
    async with EtcdClient([server.endpoint], watch_resume_window=120.0, call_timeout=2.0) as client:
        await _populate(client, keys)
        cache = ReadCache(client, keys)
        cache.start()
        await asyncio.wait_for(cache.wait_synced(), 10)
        api = PlacementAPI(client, keys, cache=cache)
        try:
            assert cache.synced
            server.kill()
            await _until(lambda: not cache.synced, 30)
            with pytest.raises(StoreUnavailable):
                await api.list_nodes()
            await asyncio.to_thread(server.start)
            await _until(lambda: cache.synced, 60)
            _, nodes = await api.list_nodes()
            assert [n.name for n in nodes] == list(NODES)
        finally:
            await cache.close()
