"""Pending recovery (design/metastore.md, "Pending recovery"), against real etcd, a real driver and
real agents: a rebalance's pending deleted out of band is written again by the leader at the same
trigger revision and the move completes; a cancelled one stays where the cancel left it — held,
never re-planned at that revision — until the next trigger, which takes it to its target."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from test_driver import Cluster, eventually, leader_fence, running_driver, settled

from placement.core.model import ZoneSpec
from placement.driver.core import build_view, zone_outlook
from placement.metastore.codec import TriggerMark
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import AssignField, KeySpace
from placement.metastore.store import Metastore

ZONE = "rec"


@pytest.fixture
async def slow_cluster(
    tmp_path: Path, client: EtcdClient, keys: KeySpace
) -> AsyncIterator[Cluster]:
    """Agents whose catch-ups last 2 s: a move stays in flight long enough to be tampered with."""
    c = Cluster(tmp_path, client, keys, catchup_delay=2.0)
    try:
        yield c
    finally:
        await c.close()


async def off_target(store: Metastore, keys: KeySpace) -> tuple[int, ...]:
    """The partitions a pass would still move (the zone status's outlook, on one read)."""
    revision, kvs = await store.read_zone_snapshot(ZONE)
    outlook = zone_outlook(build_view(keys, kvs, revision), ZONE, int(time.time() * 1000))
    assert outlook is not None
    return outlook.off_target


async def in_flight(store: Metastore) -> list[int]:
    zone = await store.read_zone(ZONE)
    return [p for p, s in zone.partitions.items() if s.pending is not None]


async def test_a_lost_pending_is_written_again_and_a_cancel_holds_until_the_next_trigger(
    etcd: object, slow_cluster: Cluster, client: EtcdClient, keys: KeySpace
) -> None:
    cluster = slow_cluster
    for i in range(4):
        await cluster.start_agent(f"n{i}")
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    async with running_driver(endpoint, keys) as driver:
        store = cluster.store
        fence = await leader_fence(driver)
        spec = ZoneSpec(ZONE, partitions=6, replicas=2)
        assert (await store.create_zone(spec, fence)).applied
        await eventually(lambda: settled(store, spec), "zone creation")

        # R 2 -> 3: every partition gains a replica (a 2 s catch-up). Behind the driver's
        # back one pending is deleted; the move of another is cancelled.
        bigger = ZoneSpec(ZONE, partitions=6, replicas=3)
        record = await store.get_zone(ZONE)
        assert record is not None
        assert (await store.update_zone(bigger, record.mod_revision, fence)).applied

        async def two_moving() -> bool:
            return len(await in_flight(store)) >= 2

        await eventually(two_moving, "the rebalance to start")
        lost, held = (await in_flight(store))[:2]
        before = await store.read_partition(ZONE, lost)
        assert before.pending is not None
        await client.delete(keys.assign(ZONE, lost, AssignField.PENDING))
        state = await store.read_partition(ZONE, held)
        assert state.pending is not None
        cancelled = await store.cancel(
            ZONE, held, state.pending.mod_revision, fence, int(time.time() * 1000)
        )
        assert cancelled.outcome.value == "applied"

        async def none_moving() -> bool:
            return not await in_flight(store)

        await eventually(none_moving, "the moves, the recovered one and the cancel to end", 60)
        await asyncio.sleep(2.0)  # passes go by: nothing re-plans the held partition
        assert not await in_flight(store)
        # The lost pending was written again at the same trigger, and its move completed.
        after = await store.read_partition(ZONE, lost)
        assert after.trigger is not None
        assert before.trigger is not None
        assert after.trigger.value == before.trigger.value
        assert len(after.peers(AssignField.STABLE) or ()) == 3, f"partition {lost} left short"
        # The cancelled one stays where the cancel left it, marked held.
        kept = await store.read_partition(ZONE, held)
        assert kept.trigger is not None
        mark = kept.trigger.value
        assert isinstance(mark, TriggerMark)
        assert mark.held
        assert kept.peers(AssignField.STABLE) == state.peers(AssignField.STABLE)
        assert await off_target(store, keys) == (held,)

        # The next trigger (any change of the zone's config) takes it to its target.
        record = await store.get_zone(ZONE)
        assert record is not None
        delayed = ZoneSpec(ZONE, partitions=6, replicas=3, scale_up_delay=0.5)
        assert (await store.update_zone(delayed, record.mod_revision, fence)).applied
        await eventually(lambda: settled(store, delayed), "the held partition back on target", 60)
        assert await off_target(store, keys) == ()
