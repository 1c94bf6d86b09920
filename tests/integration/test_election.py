"""metastore.election against a real etcd: one leader, fencing of a deposed one, take-over."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from placement.errors import NotLeader
from placement.metastore.election import Election, current_leader
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeySpace, prefix_range_end
from placement.metastore.kv import EventKind
from placement.metastore.store import Metastore
from placement.metastore.transitions import Outcome

pytestmark = pytest.mark.integration

WAIT = 20.0
ABC = ("a", "b", "c")


async def _not_done_yet(task: asyncio.Task[Any]) -> None:
    """Bounded wait for something that must NOT happen: ``task`` stays waiting for 0.3 s."""
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await asyncio.shield(task)
    assert not task.done()


async def _candidates(client: EtcdClient, keys: KeySpace, n: int) -> None:
    """Wait (bounded) until exactly ``n`` keys are under the leader prefix: list, then watch."""
    prefix = keys.leader_prefix()
    listed = await client.list_prefix(prefix)
    present = {kv.key for kv in listed.kvs}
    if len(present) == n:
        return
    async with (
        asyncio.timeout(WAIT),
        client.watch(prefix, prefix_range_end(prefix), start_revision=listed.revision + 1) as w,
    ):
        async for batch in w:
            for e in batch.events:
                if e.kind is EventKind.DELETE:
                    present.discard(e.kv.key)
                else:
                    present.add(e.kv.key)
            if len(present) == n:
                return


async def test_two_candidates_one_leads_and_the_other_takes_over(etcd: Any, keys: KeySpace) -> None:
    async with EtcdClient([etcd.endpoint]) as c1, EtcdClient([etcd.endpoint]) as c2:
        first = await Election(c1, keys, "driver-1", ttl=5).campaign()
        second_campaign = asyncio.create_task(Election(c2, keys, "driver-2", ttl=5).campaign())
        # The follower is waiting on its predecessor: its key is there, it does not lead.
        await _candidates(c1, keys, 2)
        await _not_done_yet(second_campaign)
        leader = await current_leader(c1, keys)
        assert leader is not None
        assert leader.key == keys.leader("driver-1")
        assert leader.create_revision == first.epoch

        store1 = Metastore(c1, keys)
        await store1.create_partitions("z", {0: ABC}, 1, first.fence, ts=1)

        # The leader's key is deleted (e.g. by an operator, or its lease expired).
        await c2.delete(first.key)
        async with asyncio.timeout(WAIT):
            assert "deleted" in await first.wait_lost()
            second = await second_campaign
        assert second.epoch > first.epoch
        # The former leader, whatever it believes, can no longer write.
        with pytest.raises(NotLeader):
            await store1.trigger("z", 0, ("b", "c", "d"), 2, first.fence, ts=2)
        store2 = Metastore(c2, keys)
        r = await store2.trigger("z", 0, ("b", "c", "d"), 2, second.fence, ts=2)
        assert r.outcome is Outcome.APPLIED
        await second.resign()
        assert (await current_leader(c2, keys)) is None


async def test_resign_hands_over_and_lease_loss_is_observed(etcd: Any, keys: KeySpace) -> None:
    async with EtcdClient([etcd.endpoint]) as c1, EtcdClient([etcd.endpoint]) as c2:
        first = await Election(c1, keys, "a", ttl=5).campaign()
        waiting = asyncio.create_task(Election(c2, keys, "b", ttl=5).campaign())
        await _not_done_yet(waiting)
        await first.resign()
        assert first.is_lost
        assert first.lost_reason == "resigned"
        async with asyncio.timeout(WAIT):
            second = await waiting
        # Its lease revoked behind its back: the keep-alive answer reports it, leadership is lost.
        await c1.revoke_lease(second.lease.id)
        async with asyncio.timeout(WAIT):
            reason = await second.wait_lost()
        assert "lease" in reason or "deleted" in reason
        with pytest.raises(NotLeader):
            await Metastore(c2, keys).create_partitions("z", {0: ABC}, 1, second.fence, ts=1)


async def test_candidates_wait_for_their_predecessor_only(etcd: Any, keys: KeySpace) -> None:
    async with (
        EtcdClient([etcd.endpoint]) as c1,
        EtcdClient([etcd.endpoint]) as c2,
        EtcdClient([etcd.endpoint]) as c3,
    ):
        first = await Election(c1, keys, "m1").campaign()
        second = asyncio.create_task(Election(c2, keys, "m2").campaign())
        await _candidates(c1, keys, 2)
        third = asyncio.create_task(Election(c3, keys, "m3").campaign())
        await _candidates(c1, keys, 3)
        # The middle candidate gives up: the third now waits on the first, and still follows.
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        await _candidates(c1, keys, 2)
        await _not_done_yet(third)
        await first.resign()
        async with asyncio.timeout(WAIT):
            leader = await third
        assert leader.epoch > first.epoch
        await leader.resign()


async def test_a_restarted_member_waits_for_its_old_key(etcd: Any, keys: KeySpace) -> None:
    """A key of the same member id under another (old) lease is not deleted, only waited out."""
    async with EtcdClient([etcd.endpoint]) as old, EtcdClient([etcd.endpoint]) as new:
        stale = await Election(old, keys, "same").campaign()
        restarted = asyncio.create_task(Election(new, keys, "same").campaign())
        await _not_done_yet(restarted)
        await stale.lease.revoke()  # the old incarnation's lease ends
        async with asyncio.timeout(WAIT):
            leadership = await restarted
        assert leadership.epoch > stale.epoch
        await leadership.resign()
