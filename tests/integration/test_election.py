"""metastore.election against a real etcd: one leader, fencing of a deposed one, take-over, and
a leader whose event loop is blocked keeping its lease (the keep-alive runs on its own thread)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from typing import Any

import pytest

from placement.errors import NotLeader, PlacementError, StoreUnavailable
from placement.metastore.election import Election, current_leader
from placement.metastore.etcd import EtcdClient, KeepAliveThread
from placement.metastore.keys import KeySpace, prefix_range_end
from placement.metastore.kv import EventKind, Range
from placement.metastore.store import Metastore
from placement.metastore.transitions import Outcome

pytestmark = pytest.mark.integration

WAIT = 20.0
ABC = ("a", "b", "c")
#: The election lease's TTL in the blocked-loop tests: the shortest etcd grants.
TTL = 2


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


def _keepalive_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == KeepAliveThread.NAME}


def _block_the_loop(how: str, seconds: float) -> None:
    """What a long pass does to the event loop: nothing else runs on it for ``seconds`` —
    asleep, or busy in Python (holding the GIL, which the interpreter hands to other threads
    every few milliseconds)."""
    if how == "sleep":
        time.sleep(seconds)
        return
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


class _UnansweredLooks(EtcdClient):
    """A real client whose first ``fail`` looks for a predecessor get no answer: they raise
    what a call past its timeout raises (etcd briefly away, or this loop blocked for longer
    than the call timeout, as in the blocked-loop test below)."""

    def __init__(self, endpoints: list[str], fail: float) -> None:
        super().__init__(endpoints)
        self.fail = fail
        self.failed = 0
        self.all_failed = asyncio.Event()

    async def range(self, key: bytes, range_end: bytes | None = None, **kw: Any) -> Range:
        if kw.get("max_create_revision") and self.failed < self.fail:
            self.failed += 1
            if self.failed >= self.fail:
                self.all_failed.set()
            raise StoreUnavailable("range: no answer in time (Deadline Exceeded)")
        return await super().range(key, range_end, **kw)


async def test_a_waiting_candidate_whose_look_goes_unanswered_keeps_its_place(
    etcd: Any, keys: KeySpace
) -> None:
    """Unanswered looks for the predecessor are retried under the same lease and key: the
    candidate neither gives up nor queues again, and it leads in the term its key began."""
    async with EtcdClient([etcd.endpoint]) as c1, _UnansweredLooks([etcd.endpoint], 3) as c2:
        first = await Election(c1, keys, "a", ttl=TTL).campaign()
        rival = asyncio.create_task(Election(c2, keys, "b", ttl=TTL).campaign())
        await _candidates(c1, keys, 2)
        queued = (await c1.get(keys.leader("b"))).first()
        assert queued is not None
        async with asyncio.timeout(WAIT):
            await c2.all_failed.wait()
        await _not_done_yet(rival)
        await first.resign()
        async with asyncio.timeout(WAIT):
            second = await rival
        assert (second.epoch, second.lease.id) == (queued.create_revision, queued.lease)
        await second.resign()


async def test_a_candidate_that_gets_no_answer_stops_when_its_lease_is_lost(
    etcd: Any, keys: KeySpace
) -> None:
    """Retrying does not outlive the lease: every look unanswered and the lease revoked
    elsewhere, the campaign ends with NotLeader within a keep-alive interval."""
    async with (
        EtcdClient([etcd.endpoint]) as c1,
        _UnansweredLooks([etcd.endpoint], float("inf")) as c2,
    ):
        first = await Election(c1, keys, "a", ttl=TTL).campaign()
        rival = asyncio.create_task(Election(c2, keys, "b", ttl=TTL).campaign())
        await _candidates(c1, keys, 2)
        queued = (await c1.get(keys.leader("b"))).first()
        assert queued is not None
        await _not_done_yet(rival)
        assert c2.failed > 0
        await c1.revoke_lease(queued.lease)
        with pytest.raises(NotLeader, match="lease lost"):
            async with asyncio.timeout(TTL + 1.0):
                await rival
        await first.resign()


@pytest.mark.parametrize("how", ["sleep", "busy"])
async def test_a_leader_whose_loop_is_blocked_for_three_ttls_keeps_its_lease_and_key(
    etcd: Any, keys: KeySpace, how: str
) -> None:
    """The leader's event loop does not run for 3 x the lease's TTL (a long pass). Its lease is
    refreshed on its own thread and connection meanwhile, so etcd keeps the key in the same term:
    the waiting candidate does not take over and the leader's fenced writes still apply. A real
    loss afterwards (the lease revoked elsewhere) is still seen within the TTL."""
    threads_before = _keepalive_threads()
    async with EtcdClient([etcd.endpoint]) as c1, EtcdClient([etcd.endpoint]) as c2:
        first = await Election(c1, keys, "a", ttl=TTL).campaign()
        rival = asyncio.create_task(Election(c2, keys, "b", ttl=TTL).campaign())
        await _candidates(c1, keys, 2)

        _block_the_loop(how, 3 * TTL)

        # Had the lease expired, the key would be gone (or re-created: another create revision)
        # and the rival's watch, resuming, would deliver its deletion now.
        held = (await c2.get(first.key)).first()
        assert held is not None, "the leader key expired while the leader's loop was blocked"
        assert (held.create_revision, held.lease) == (first.epoch, first.lease.id)
        assert await c2.lease_ttl(first.lease.id) > 0
        await _not_done_yet(rival)
        assert not first.is_lost, first.lost_reason
        await Metastore(c1, keys).create_partitions("z", {0: ABC}, 1, first.fence, ts=1)

        # A real loss: revoked from another client; the keep-alive's next answer is TTL 0.
        await c2.revoke_lease(first.lease.id)
        async with asyncio.timeout(TTL + 1.0):
            reason = await first.wait_lost()
        assert "lease" in reason or "deleted" in reason
        async with asyncio.timeout(WAIT):
            second = await rival
        assert second.epoch > first.epoch
        await second.resign()
    assert _keepalive_threads() <= threads_before, "a keep-alive thread outlived its client"


async def test_a_frozen_etcd_costs_the_leadership_at_the_lease_deadline(
    etcd_factory: Any, keys: KeySpace
) -> None:
    """etcd SIGSTOPped: no keep-alive answers and no watch event comes. ``wait_lost`` returns at
    the lease's deadline — within the TTL of the freeze, although a call may wait 5 s — and the
    client closes without waiting for etcd."""
    server = etcd_factory()
    threads_before = _keepalive_threads()
    loop = asyncio.get_running_loop()
    async with EtcdClient([server.endpoint], call_timeout=5.0) as c:
        leadership = await Election(c, keys, "a", ttl=TTL).campaign()
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            async with asyncio.timeout(WAIT):
                _, status = await asyncio.to_thread(os.waitpid, server.proc.pid, os.WUNTRACED)
            assert os.WIFSTOPPED(status)
            frozen_at = loop.time()
            async with asyncio.timeout(WAIT):
                reason = await leadership.wait_lost()
            noticed_after = loop.time() - frozen_at
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert "deadline" in reason, reason
        assert noticed_after <= TTL + 1.0, f"loss noticed {noticed_after:.1f}s after the freeze"
        with contextlib.suppress(PlacementError):
            await leadership.resign()
    assert _keepalive_threads() <= threads_before, "a keep-alive thread outlived its client"
