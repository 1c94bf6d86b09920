"""metastore.etcd against a real etcd: reads at revisions, typed txns, errors, leases, watches."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest
from test_election import TTL, _block_the_loop
from test_listwatch import _put_once_up

from placement.errors import Compacted, InvalidInput, StoreUnavailable
from placement.metastore.codec import NodeRecord
from placement.metastore.etcd import EtcdClient, LeaseExpired, expiry_margin
from placement.metastore.keys import KeySpace, prefix_range_end
from placement.metastore.kv import EventKind, Range, TxnResult, WatchBatch, WatchEvent
from placement.metastore.txn import MAX_TXN_OPS, Compare, Delete, Get, Put, Txn
from replica.registration import Registration

pytestmark = pytest.mark.integration

WAIT = 20.0  # bound on every wait for an event
SCALE = float(os.environ.get("PLACEMENT_TEST_TIME_SCALE", "1"))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_reads_carry_their_revision_and_can_pin_an_old_one(
    client: EtcdClient, prefix: str
) -> None:
    key = f"{prefix}/k".encode()
    rev1 = await client.put(key, b"one")
    rev2 = await client.put(key, b"two")
    now = await client.get(key)
    assert now.revision >= rev2
    kv = now.first()
    assert kv is not None
    assert (kv.value, kv.create_revision, kv.mod_revision, kv.version) == (b"two", rev1, rev2, 2)
    old = await client.get(key, revision=rev1)
    assert old.revision == rev1
    assert old.first() is not None
    assert old.first().value == b"one"  # type: ignore[union-attr]
    assert (await client.get(key + b"-missing")).first() is None


async def test_list_prefix_pages_are_pinned_to_one_revision(
    client: EtcdClient, prefix: str
) -> None:
    base = f"{prefix}/list/".encode()
    for i in range(10):
        await client.put(base + b"%02d" % i, b"v")
    first = await client.range(base, prefix_range_end(base), limit=3)
    assert first.more
    assert len(first.kvs) == 3
    rev = first.revision
    await client.put(base + b"99", b"later")  # must not show in a listing at `rev`
    listed = await client.list_prefix(base, revision=rev, page_size=3)
    assert listed.revision == rev
    assert [kv.key[-2:] for kv in listed.kvs] == [b"%02d" % i for i in range(10)]
    latest = await client.list_prefix(base, page_size=4)
    assert len(latest.kvs) == 11


async def test_txn_compares_and_branches(client: EtcdClient, prefix: str) -> None:
    a, b = f"{prefix}/a".encode(), f"{prefix}/b".encode()
    # VALUE compare on a missing key is false: the AND-only trap the metastore avoids.
    missing = await client.txn((Compare.value(a, "<", b"\xff"),), (Put(a, b"x"),), (Get(a),))
    assert not missing.succeeded
    # version == 0 holds on a missing key; over a range it holds when no key of the range exists.
    created = await client.txn(
        (Compare.version(a, "==", 0), Compare.version(a, "==", 0, range_end=prefix_range_end(a))),
        (Put(a, b"1"), Put(b, b"2")),
        (),
    )
    assert created.succeeded
    lost = await client.txn(
        (Compare.mod(a, "==", created.revision - 1),), (Put(a, b"no"),), (Get(a),)
    )
    assert not lost.succeeded
    (found,) = lost.responses
    assert isinstance(found, Range)
    assert found.first() is not None
    assert found.first().mod_revision == created.revision  # type: ignore[union-attr]
    # Nested txn = OR: "a is 1 OR b is absent".
    nested = await client.txn(
        (Compare.value(a, "==", b"nope"),),
        (),
        (Txn((Compare.create(a, "==", created.revision),), (Delete(b),), (Get(b),)),),
    )
    assert not nested.succeeded
    (inner,) = nested.responses
    assert isinstance(inner, TxnResult)
    assert inner.succeeded
    assert (await client.get(b)).first() is None


async def test_a_write_window_queues_writes_beyond_it_and_never_reads(
    etcd: Any, prefix: str
) -> None:
    """``EtcdClient(write_window=N)``: write calls wait, first come first served, while N
    operations of writes are in flight; reads never wait for it."""
    key = f"{prefix}/window/".encode()
    async with EtcdClient([etcd.endpoint], call_timeout=5.0, write_window=4) as c:
        window = c._writes
        assert window is not None
        async with window.hold(4):  # the window is full
            write = asyncio.create_task(c.txn((), (Put(key + b"a", b"1"),)))
            put = asyncio.create_task(c.put(key + b"b", b"1"))
            read = await asyncio.wait_for(c.txn((), (Get(key + b"a"),)), WAIT)
            assert read.succeeded
            assert (await asyncio.wait_for(c.get(key + b"a"), WAIT)).first() is None
            await asyncio.sleep(0.2)
            assert not write.done()
            assert not put.done()
        assert (await asyncio.wait_for(write, WAIT)).succeeded
        await asyncio.wait_for(put, WAIT)
        # Many at once, far beyond the window: every one lands.
        pairs = [(Put(key + b"x%d" % i, b"x"), Put(key + b"y%d" % i, b"y")) for i in range(20)]
        await asyncio.wait_for(asyncio.gather(*(c.txn((), ops) for ops in pairs)), WAIT)
        assert len((await c.list_prefix(key)).kvs) == 42


async def test_limits_are_reported_as_invalid_input(client: EtcdClient, prefix: str) -> None:
    too_many = [Put(f"{prefix}/m{i}".encode(), b"x") for i in range(MAX_TXN_OPS + 1)]
    with pytest.raises(InvalidInput, match="too many operations"):
        await client.txn((), too_many)
    key = f"{prefix}/dup".encode()
    with pytest.raises(InvalidInput, match="duplicate key"):
        await client.txn((), (Put(key, b"1"), Put(key, b"2")))
    with pytest.raises(InvalidInput, match="future revision"):
        await client.get(key, revision=(await client.current_revision()) + 1000)


async def test_several_endpoints_fail_over(etcd: Any, prefix: str) -> None:
    dead = f"127.0.0.1:{_free_port()}"
    async with EtcdClient([dead, etcd.endpoint], call_timeout=2.0) as c:
        key = f"{prefix}/failover".encode()
        # A read is retried on the next endpoint at once.
        assert (await c.get(key)).first() is None
        assert c.active_endpoint == etcd.endpoint
        await c.put(key, b"v")
    async with EtcdClient([dead, etcd.endpoint], call_timeout=2.0) as c:
        # A write is not retried (outcome unknown): it raises, and the next call uses the next one.
        with pytest.raises(StoreUnavailable):
            await c.put(key, b"w")
        await c.put(key, b"w")
        assert (await c.get(key)).first().value == b"w"  # type: ignore[union-attr]


async def _until_stopped(pid: int) -> None:
    """Wait until our child ``pid`` has stopped (SIGSTOP is asynchronous): ``waitpid`` with
    ``WUNTRACED`` reports the stop, i.e. once every thread of it is stopped."""
    async with asyncio.timeout(WAIT):
        _, status = await asyncio.to_thread(os.waitpid, pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status)


async def test_call_timeout_on_a_frozen_etcd(etcd_factory: Any, prefix: str) -> None:
    server = etcd_factory()
    async with EtcdClient([server.endpoint], call_timeout=0.5) as c:
        await c.put(b"/k", b"v")
        os.kill(server.proc.pid, signal.SIGSTOP)
        await _until_stopped(server.proc.pid)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            with pytest.raises(StoreUnavailable, match=r"outcome unknown|no answer in time"):
                await c.put(b"/k", b"w")
            # one call's timeout, not a retry loop: a put is not idempotent, so it is not resent
            assert loop.time() - started < 0.5 + 1.0 * SCALE
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        # the write may or may not have happened: callers re-read, and find one of the two
        kv = (await c.get(b"/k")).first()
        assert kv is not None
        assert kv.value in (b"v", b"w")
        assert kv.version in (1, 2)  # never written twice


async def _first_batch(c: EtcdClient, key: bytes, start_revision: int) -> WatchBatch:
    async with c.watch(key, start_revision=start_revision) as w:
        return await anext(aiter(w))


async def test_compacted_reads_and_watches_raise_compacted(etcd_factory: Any) -> None:
    server = etcd_factory()
    async with EtcdClient([server.endpoint]) as c:
        revs = [await c.put(b"/c", b"%d" % i) for i in range(5)]
        await c.compact(revs[3])
        with pytest.raises(Compacted):
            await c.get(b"/c", revision=revs[1])
        with pytest.raises(Compacted) as e:
            await _first_batch(c, b"/c", revs[1])
        assert e.value.compact_revision == revs[3]


async def test_lease_is_kept_alive_past_its_ttl_and_loss_is_observed(
    client: EtcdClient, etcd: Any, prefix: str
) -> None:
    key = f"{prefix}/leased".encode()
    lease = await client.grant_lease(2)
    await client.put(key, b"v", lease=lease.id)
    # Bounded wait for an event that must NOT happen: the lease outlives 1.5 x its TTL.
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(3.0):
            await lease.wait_lost()
    assert (await client.get(key)).first() is not None
    assert await client.lease_ttl(lease.id) > 0
    # Revoked by someone else: the keep-alive sees TTL 0 and reports the loss.
    async with EtcdClient([etcd.endpoint]) as other:
        await other.revoke_lease(lease.id)
    async with asyncio.timeout(WAIT):
        reason = await lease.wait_lost()
    assert "expired" in reason
    assert (await client.get(key)).first() is None
    with pytest.raises(LeaseExpired):
        await client.put(key, b"v", lease=lease.id)


async def test_watch_delivers_ordered_events_with_prev_kv(client: EtcdClient, prefix: str) -> None:
    base = f"{prefix}/w/".encode()
    start = await client.current_revision() + 1
    await client.put(base + b"a", b"1")
    await client.put(base + b"a", b"2")
    await client.txn((), (Put(base + b"b", b"3"), Delete(base + b"a")))
    seen: list[WatchEvent] = []
    async with (
        asyncio.timeout(WAIT),
        client.watch(base, prefix_range_end(base), start_revision=start) as w,
    ):
        async for batch in w:
            assert list(batch.events) == sorted(batch.events, key=lambda e: e.kv.mod_revision)
            seen.extend(batch.events)
            if len(seen) >= 4:
                break
    assert [(e.kind, e.kv.key[-1:], e.kv.value) for e in seen] == [
        (EventKind.PUT, b"a", b"1"),
        (EventKind.PUT, b"a", b"2"),
        (EventKind.PUT, b"b", b"3"),
        (EventKind.DELETE, b"a", b""),
    ]
    assert seen[1].prev_kv is not None
    assert seen[1].prev_kv.value == b"1"
    assert seen[3].prev_kv is not None
    assert seen[3].prev_kv.value == b"2"
    assert seen[2].kv.mod_revision == seen[3].kv.mod_revision  # one txn, one revision


async def test_watch_resumes_after_etcd_is_killed_and_restarted(etcd_factory: Any) -> None:
    """kill -9 etcd mid-stream, restart it on the same ports and data dir: the watcher sees every
    event written before and after exactly once, in order."""
    server = etcd_factory()
    async with (
        EtcdClient([server.endpoint], watch_resume_window=60.0) as watcher_client,
        EtcdClient([server.endpoint]) as writer,
    ):
        start = await writer.current_revision() + 1
        written: dict[int, bytes] = {}
        for i in range(10):
            written[await writer.put(b"/r/%03d" % i, b"%d" % i)] = b"/r/%03d" % i
        seen: list[tuple[int, bytes]] = []
        async with watcher_client.watch(b"/r/", b"/r0", start_revision=start) as w:
            it = aiter(w)
            async with asyncio.timeout(WAIT):
                while len(seen) < 5:  # consume part of the history, then crash etcd
                    batch = await anext(it)
                    seen.extend((e.kv.mod_revision, e.kv.key) for e in batch.events)
            server.kill()
            await asyncio.to_thread(server.start)  # same ports, same data dir
            for i in range(10, 20):
                written[await _put_once_up(writer, b"/r/%03d" % i, b"%d" % i)] = b"/r/%03d" % i
            async with asyncio.timeout(WAIT):
                while len(seen) < 20:
                    batch = await anext(it)
                    seen.extend((e.kv.mod_revision, e.kv.key) for e in batch.events)
            assert w.resumes >= 1
        assert seen == sorted(written.items()), "every event exactly once, in order"


async def test_a_lease_outlives_the_member_its_keepalive_stream_was_on(
    etcd_cluster: Any,
) -> None:
    """The member carrying the keep-alive stream is SIGKILLed (the stream ends while the
    keep-alive sleeps): the next keep-alive goes to another member and the lease lives on."""
    doomed, *others = etcd_cluster
    endpoints = [doomed.endpoint, *(m.endpoint for m in others)]
    async with EtcdClient(endpoints, call_timeout=2.0) as c:
        lease = await c.grant_lease(2)
        await asyncio.sleep(1.0)  # the keep-alive stream is open, on the first member
        doomed.kill()
        await asyncio.sleep(6.0)  # three TTLs
        assert not lease.is_lost, lease
        assert await c.lease_ttl(lease.id) > 0, "the lease expired in etcd"
        await lease.revoke()


async def test_a_watch_on_a_member_without_quorum_fails(etcd_cluster: Any) -> None:
    """``hasleader: true``: a member that lost its quorum fails the watch instead of keeping it
    open and silent; after the resume window the watch raises StoreUnavailable."""
    survivor, *others = etcd_cluster
    async with EtcdClient([survivor.endpoint], call_timeout=2.0, watch_resume_window=2.0) as c:
        start = await c.put(b"/hl", b"1")
        async with c.watch(b"/hl", start_revision=start) as w:
            it = aiter(w)
            async with asyncio.timeout(WAIT):
                batch = await anext(it)
            assert batch.events[0].kv.value == b"1"
            for member in others:
                member.kill()
            # etcd says "no leader", or the stream breaks first (gRPC "Internal error"): either
            # way the watch must fail within the resume window rather than stay open and silent.
            with pytest.raises(StoreUnavailable):
                async with asyncio.timeout(WAIT):
                    await anext(it)


async def test_a_lease_is_given_up_a_margin_before_etcd_can_expire_it(
    client: EtcdClient, prefix: str
) -> None:
    """The holder's deadline is the grant's send + TTL − the margin; at that deadline etcd
    still holds the lease and its key (the holder stops first, design/metastore.md §5)."""
    loop = asyncio.get_running_loop()
    asked = loop.time()
    lease = await client.grant_lease(2, keepalive=False)
    key = f"{prefix}/held".encode()
    await client.put(key, b"v", lease=lease.id)
    margin = expiry_margin(lease.ttl)
    assert margin > 0
    assert lease.deadline == pytest.approx(asked + lease.ttl - margin, abs=0.01)
    await asyncio.sleep(max(0.0, lease.deadline - loop.time()))
    assert (await client.get(key)).first() is not None, "etcd expired it before the holder"
    await client.revoke_lease(lease.id)


async def test_lease_is_lost_when_no_keepalive_succeeds_before_its_deadline(
    etcd_factory: Any,
) -> None:
    """etcd frozen (SIGSTOP) for longer than the TTL: the keep-alive task gives the lease up at
    its deadline, without waiting for etcd to come back."""
    server = etcd_factory()
    async with EtcdClient([server.endpoint], call_timeout=0.5) as c:
        loop = asyncio.get_running_loop()
        granted = loop.time()
        lease = await c.grant_lease(2)
        os.kill(server.proc.pid, signal.SIGSTOP)
        await _until_stopped(server.proc.pid)
        try:
            async with asyncio.timeout(WAIT):
                reason = await lease.wait_lost()
            lost = loop.time()
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert "deadline" in reason
        # given up at its deadline (at most the TTL after the grant), not when etcd came back
        # or a retry loop gave up: the holder must stop acting on it before anyone else may
        assert lost - granted <= 2.0 + 0.5 * SCALE, lost - granted


async def test_an_agents_registration_outlives_a_blocked_loop(etcd: Any, keys: KeySpace) -> None:
    """An agent's node record is under a lease kept alive on its client's keep-alive thread,
    like the driver's election lease: the agent's loop busy for 3 x the TTL (its data plane)
    loses neither the lease nor the record."""
    async with EtcdClient([etcd.endpoint]) as c, EtcdClient([etcd.endpoint]) as observer:
        registration = Registration(c, keys, NodeRecord("n1", "127.0.0.1:1", {}), ttl=TTL)
        await registration.start()
        before = (await observer.get(keys.node("n1"))).first()
        assert before is not None
        _block_the_loop("busy", 3 * TTL)
        await asyncio.sleep(0.3)  # a loss, had there been one, is seen by now
        after = (await observer.get(keys.node("n1"))).first()
        assert after is not None, "the node record expired while the agent's loop was busy"
        assert (after.create_revision, after.lease) == (before.create_revision, before.lease)
        assert await observer.lease_ttl(after.lease) > 0
        assert registration.registered.is_set()
        assert registration.registrations == 1
        await registration.stop()
        assert (await observer.get(keys.node("n1"))).first() is None
