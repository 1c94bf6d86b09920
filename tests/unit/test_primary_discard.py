"""A primary whose replica is discarded under it (a retire, an aborted re-sharding's destination)
stops quietly: its next write is refused and fails the client's write with NotPrimary, it does
not recreate the discarded replica's data state, and it logs no traceback.

A real agent store (sqlite on disk, the store thread's group commit); the etcd side is a
one-node in-sync set the test hands the primary. Before the fix, the write after the discard
recreated an empty data state and failed with ``ValueError: entry 2 does not follow 0``.

Also the other ends of a discard: an aborted re-sharding's purge against writes still queued,
a learner's join cancelled during its in-sync-set write, and a replica discarded and re-created
empty that is then made primary (it must leave the in-sync set, never serve)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from placement.data.partitioning import SEAL_KEY, key_moves, partition_of
from placement.metastore.codec import InSyncSet, PrimaryLease
from placement.metastore.keys import AssignField
from replica.data.control import Seal
from replica.data.follower import answer_appends
from replica.data.model import (
    AppendCall,
    AppendOutcome,
    AppendReply,
    Key,
    NotPrimary,
    Sealed,
    Unavailable,
)
from replica.data.primary import AssignmentMods, LeaseAndIsr, Primary, PrimaryDeps
from replica.data.storage import Entry
from replica.protocol import CreateReplica, DiscardReplica, PartitionRecord
from replica.records import AgentStore, StoreThread

ZONE, PARTITION, NODE, EPOCH = "z", 3, "n1", 1


class IsrWrites:
    """A ``PrimaryDeps.write_isr`` that records each in-sync set written (``written``; ``wrote``
    is set at the first) and lands it at once."""

    def __init__(self) -> None:
        self.written: list[frozenset[str]] = []
        self.wrote = asyncio.Event()

    async def write_isr(
        self,
        key: Key,
        lease_epoch: int,
        members: frozenset[str],
        isr_revision: int,
        assignment_mods: AssignmentMods = (),
    ) -> int:
        self.written.append(members)
        self.wrote.set()
        return isr_revision + 1


def _record(hosted: bool) -> PartitionRecord:
    return PartitionRecord(ZONE, PARTITION, 1, 1, 0, (NODE,), None, hosted)


def _deps(db: StoreThread) -> PrimaryDeps:
    lease = PrimaryLease(NODE, EPOCH, expiry=2**62)
    isr = InSyncSet((NODE,), NODE, EPOCH, 0)

    async def read_lease_and_isr(key: Key) -> LeaseAndIsr:
        return lease, 1, isr, 1

    async def write_isr(
        key: Key,
        lease_epoch: int,
        members: frozenset[str],
        isr_revision: int,
        assignment_mods: AssignmentMods = (),
    ) -> int:
        raise AssertionError("a one-node in-sync set is never rewritten here")

    async def send_append(node: str, address: str, call: AppendCall, t: float) -> AppendReply:
        raise AssertionError("a one-node in-sync set sends no append")

    async def trim(key: Key, count: int) -> None:
        return None

    return PrimaryDeps(
        node=NODE,
        db=db,
        isr_timeout=1.0,
        heartbeat=0.05,
        batch_max=64,
        fetch_bytes=1 << 20,
        send_append=send_append,
        address_of=lambda node: "",
        lease_ok=lambda key, epoch: True,
        primary_hint=lambda key: "",
        min_in_sync=lambda zone: 1,
        read_lease_and_isr=read_lease_and_isr,
        write_isr=write_isr,
        trim=trim,
    )


@contextlib.asynccontextmanager
async def hosted_primary(tmp_path: Path) -> AsyncIterator[tuple[StoreThread, AgentStore, Primary]]:
    """A real agent store hosting the partition, and its primary (stopped, store closed after)."""
    db = StoreThread(await asyncio.to_thread(AgentStore.open, tmp_path, NODE))
    try:
        await db.call(db.store.commit, _record(True), [CreateReplica(ZONE, PARTITION)])
        primary = Primary(_deps(db), (ZONE, PARTITION), EPOCH)
        try:
            yield db, db.store, primary
        finally:
            await primary.stop("test over")
    finally:
        await db.close()


async def test_a_write_after_the_replica_is_discarded_is_refused_and_recreates_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = StoreThread(await asyncio.to_thread(AgentStore.open, tmp_path, NODE))
    store = db.store
    try:
        await db.call(store.commit, _record(True), [CreateReplica(ZONE, PARTITION)])
        primary = Primary(_deps(db), (ZONE, PARTITION), EPOCH)
        index, epoch, existed = await asyncio.wait_for(primary.submit(b"k", b"v"), 5)
        assert (index, epoch, existed) == (1, EPOCH, False)
        assert await db.call(store.data.get, ZONE, PARTITION, b"k") == b"v"

        await db.call(store.commit, _record(False), [DiscardReplica(ZONE, PARTITION)])
        assert await db.call(store.data.state, ZONE, PARTITION) is None

        with caplog.at_level(logging.INFO, logger="replica.data.primary"):
            with pytest.raises(NotPrimary):
                await asyncio.wait_for(primary.submit(b"k2", b"v2"), 5)
            await asyncio.sleep(0)
        assert primary.finished
        # Nothing recreated: no data state, no key written into the discarded replica.
        assert await db.call(store.data.state, ZONE, PARTITION) is None
        assert await db.call(store.data.get, ZONE, PARTITION, b"k2") is None
        assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
        assert any("no longer hosted" in r.getMessage() for r in caplog.records)
        await primary.stop("test over")
    finally:
        await db.close()


async def test_a_batch_refused_below_the_minimum_fails_every_write_queued_behind_it(
    tmp_path: Path,
) -> None:
    """One ``write_many`` split across two batches (here batch_max = 1: a copy's keys, then its
    cursor) when the first batch is refused below the zone's minimum in-sync set and the set
    has grown by the second: nothing of it may commit — a committed cursor without the keys it
    covers loses them (found by review: 513 writes against a 512 batch)."""
    db = StoreThread(await asyncio.to_thread(AgentStore.open, tmp_path, NODE))
    store = db.store
    minimums = iter([2])  # below the minimum for the first batch only

    try:
        await db.call(store.commit, _record(True), [CreateReplica(ZONE, PARTITION)])
        deps = replace(_deps(db), batch_max=1, min_in_sync=lambda zone: next(minimums, 1))
        primary = Primary(deps, (ZONE, PARTITION), EPOCH)
        with pytest.raises(Unavailable):
            await asyncio.wait_for(primary.write_many([(b"key", b"v"), (b"cursor", b"c")]), 5)
        assert await db.call(store.data.get, ZONE, PARTITION, b"cursor") is None
        assert await db.call(store.data.get, ZONE, PARTITION, b"key") is None
        # and the primary goes on: the next write commits
        await asyncio.wait_for(primary.submit(b"later", b"v"), 5)
        assert await db.call(store.data.get, ZONE, PARTITION, b"later") == b"v"
        await primary.stop("test over")
    finally:
        await db.close()


async def test_a_write_sent_to_a_new_primary_before_its_reconcile_still_meets_the_seal(
    tmp_path: Path,
) -> None:
    """A source's new primary loads the seal from its replica in the reconcile; a client write
    to a moving key that arrives before that (a retry right after a failover during SEAL) must
    be refused as sealed, not appended after the seal where no copy takes it (found by review).
    """
    db = StoreThread(await asyncio.to_thread(AgentStore.open, tmp_path, NODE))
    store = db.store
    release = asyncio.Event()
    try:
        await db.call(store.commit, _record(True), [CreateReplica(ZONE, PARTITION)])
        seal = Seal(attempt=7, source=4, target=8)
        sealed = [Entry(1, EPOCH, SEAL_KEY, seal.encode())]
        await db.group(store.data.append_writes, ZONE, PARTITION, sealed, 1)
        base = _deps(db)

        async def slow_read(key: Key) -> LeaseAndIsr:
            await release.wait()
            return await base.read_lease_and_isr(key)

        primary = Primary(replace(base, read_lease_and_isr=slow_read), (ZONE, PARTITION), EPOCH)
        moving = next(
            k
            for i in range(10_000)
            if partition_of(k := b"m-%d" % i, 4) == PARTITION and key_moves(k, 4, 8) is not None
        )
        attempt = asyncio.create_task(primary.submit(moving, b"v"))
        await asyncio.sleep(0.05)
        release.set()
        with pytest.raises(Sealed):
            await asyncio.wait_for(attempt, 5)
        assert await db.call(store.data.get, ZONE, PARTITION, moving) is None
        await primary.stop("test over")
    finally:
        await db.close()


@pytest.mark.parametrize("reported", [3, 0], ids=["log-ends-at-3", "storage-error"])
async def test_a_member_behind_the_primarys_snapshot_point_leaves_the_isr_even_below_the_minimum(
    tmp_path: Path, reported: int
) -> None:
    """A new primary whose log starts at a snapshot point (it caught up from a snapshot) above
    where a member's log ends (it undid entries above its commit index when the primary took
    over) cannot bring that member up to date with appends. Kept in the in-sync set at the
    zone's minimum, it blocked the partition for good (found by the etcd chaos test: writes
    refused for minutes); it leaves the set — writes wait below the minimum — and returns as a
    learner copying a snapshot. Nothing acknowledged is lost: the primary holds it all. A log
    end of 0 is what a follower's storage error answers: that member is kept (review finding).
    """
    db = StoreThread(await asyncio.to_thread(AgentStore.open, tmp_path, NODE))
    store = db.store
    isr_writes = IsrWrites()
    written, wrote = isr_writes.written, isr_writes.wrote
    try:
        await db.call(store.commit, _record(True), [CreateReplica(ZONE, PARTITION)])
        entries = [Entry(i, EPOCH, b"k%d" % i, b"v") for i in range(1, 11)]
        await db.group(store.data.append_writes, ZONE, PARTITION, entries, 10)
        state = await db.call(store.data.trim, ZONE, PARTITION, 2)
        assert state.base_index == 8
        new_epoch = EPOCH + 1
        lease = PrimaryLease(NODE, new_epoch, expiry=2**62)
        isr = InSyncSet((NODE, "n2"), "n0", EPOCH, 0)

        async def read_lease_and_isr(key: Key) -> LeaseAndIsr:
            return lease, 1, isr, 1

        async def send_append(node: str, address: str, call: AppendCall, t: float) -> AppendReply:
            return AppendReply(AppendOutcome.MISMATCH, last_index=reported, last_epoch=EPOCH)

        deps = replace(
            _deps(db),
            min_in_sync=lambda zone: 2,
            read_lease_and_isr=read_lease_and_isr,
            write_isr=isr_writes.write_isr,
            send_append=send_append,
            address_of=lambda node: "127.0.0.1:1",
        )
        primary = Primary(deps, (ZONE, PARTITION), new_epoch)
        attempt = asyncio.create_task(primary.submit(b"k", b"v"))
        if reported:
            await asyncio.wait_for(wrote.wait(), 5)
            assert written[0] == frozenset({NODE}), written
        # below the minimum either way: the write is refused, not acknowledged by one replica
        with pytest.raises(Unavailable):
            await asyncio.wait_for(attempt, 5)
        if not reported:
            assert written == [], "a member that answered a storage error left the set"
        assert await db.call(store.data.get, ZONE, PARTITION, b"k1") == b"v"
        await primary.stop("test over")
    finally:
        await db.close()


async def test_a_purge_deletes_exactly_the_dead_keys_with_deletes_an_undo_can_restore(
    tmp_path: Path,
) -> None:
    """Re-sharding's purge (CLEANUP of a grow 4 -> 8): every key of the partition that no longer
    routes to it is deleted through the log, and every key that still routes to it stays. The
    deletes are ordinary ones, each keeping the value it removes: a delete that kept nothing
    ("discard") left replicas different for good when it was undone on one member and the next
    two primaries lacked it (design/resharding.md, "Why no acknowledged write is lost")."""
    from replica.data.resharding import purge

    async with hosted_primary(tmp_path) as (db, store, primary):
        keys = [k for i in range(400) if partition_of(k := b"p-%d" % i, 4) == PARTITION]
        big = b"x" * 65536
        await asyncio.wait_for(primary.write_many([(k, big) for k in keys]), 10)
        moved = {k for k in keys if partition_of(k, 8) != PARTITION}
        assert moved
        assert len(moved) < len(keys)

        assert await asyncio.wait_for(purge(db, primary, 8), 20) == len(moved)

        for k in keys:
            assert (await db.call(store.data.get, ZONE, PARTITION, k) is None) == (k in moved)
        rows = await db.call(
            lambda: store._conn.execute(
                "SELECT key, LENGTH(prev) FROM rlog WHERE zone = ? AND partition = ? AND del = 1",
                (ZONE, PARTITION),
            ).fetchall()
        )
        assert {bytes(k) for k, _ in rows} == moved
        assert all(prev == len(big) for _, prev in rows)


async def test_a_draining_fetch_is_answered_once_the_seal_is_committed_even_if_asked_first(
    tmp_path: Path,
) -> None:
    """A destination in SEAL asks a source that has not seen SEAL yet (its view lags): the fetch
    waits for the source's own seal and is answered with it, so one fetch drains the source; a
    fetch of a COPY poll is answered at once (design/resharding.md, SEAL)."""
    from replica.data.model import FetchCall, FetchOutcome

    async with hosted_primary(tmp_path) as (_db, _store, primary):
        moving = next(
            k
            for i in range(10_000)
            if partition_of(k := b"m-%d" % i, 4) == PARTITION and key_moves(k, 4, 8) is not None
        )
        await asyncio.wait_for(primary.submit(moving, b"v"), 5)
        select = (8, partition_of(moving, 8))

        def call(seal_attempt: int) -> FetchCall:
            return FetchCall(ZONE, PARTITION, "n9", False, select=select, seal_attempt=seal_attempt)

        polled = await asyncio.wait_for(primary.fetch(call(0)), 1)  # COPY: at once, no seal
        assert polled.outcome is FetchOutcome.OK
        assert [e.key for e in polled.entries] == [moving]

        draining = asyncio.create_task(primary.fetch(call(7)))
        await asyncio.sleep(0.1)
        assert not draining.done()  # the source has not sealed: the fetch waits
        await asyncio.wait_for(primary.seal_for(Seal(attempt=7, source=4, target=8)), 5)
        reply = await asyncio.wait_for(draining, 1)
        assert [e.key for e in reply.entries] == [moving, SEAL_KEY]  # the seal comes with it


async def test_a_draining_fetch_held_for_the_seal_ends_when_its_primary_stops(
    tmp_path: Path,
) -> None:
    """A source primary that stops (deposed, retired) while a destination's fetch waits for its
    seal answers that fetch NotPrimary at once, not after the 2 s bound (review finding)."""
    from replica.data.model import FetchCall

    async with hosted_primary(tmp_path) as (_db, _store, primary):
        call = FetchCall(ZONE, PARTITION, "n9", False, select=(8, 7), seal_attempt=7)
        draining = asyncio.create_task(primary.fetch(call))
        await asyncio.sleep(0.1)
        assert not draining.done()
        await primary.stop("deposed")
        with pytest.raises(NotPrimary):
            await asyncio.wait_for(draining, 0.5)


async def test_a_new_destination_primary_whose_cursor_is_drained_copies_nothing_again(
    tmp_path: Path,
) -> None:
    """A destination primary that takes over with a drained cursor (committed) for a source
    never fetches from it again: after the flip, a copy resumed from there could only bring the
    source's old values or its purge (review finding)."""
    from placement.core.layout import Reshard, ReshardPhase
    from replica.data.control import Cursor, cursor_key
    from replica.data.follower import TokenBucket
    from replica.data.resharding import Puller, ReshardDeps

    async with hosted_primary(tmp_path) as (db, _store, primary):
        # partition 3 is a destination of 2 -> 4; its sources are 0 and 1
        reshard = Reshard(attempt=9, source=2, target=4, phase=ReshardPhase.SEAL)
        drained = Cursor(9, snapshot=False, base=1, index=5, seal_bound=5)
        assert drained.drained
        await asyncio.wait_for(
            primary.write_many([(cursor_key(s), drained.encode()) for s in range(2)]), 5
        )

        async def send_fetch(*args: object) -> object:
            raise AssertionError("a drained source is fetched from again")

        deps = ReshardDeps(
            node=NODE,
            db=db,
            fetch_bytes=1 << 20,
            send_fetch=send_fetch,  # type: ignore[arg-type]
            bucket=TokenBucket(0),
            leader_of=lambda key: ("n2", "127.0.0.1:1"),
            put_owned=None,
            report_key=lambda zone, partition: b"",
            now_ms=lambda: 0,
        )
        puller = Puller(deps, primary, reshard)
        await asyncio.wait_for(puller.run(), 5)
        assert puller.drained


async def test_a_learner_joins_under_a_steady_stream_of_writes(tmp_path: Path) -> None:
    """A learner that got everything up to the last entry joins on its next fetch even while a
    client writes without pause: the primary holds new batches (at most ``JOIN_HOLD``) until
    that fetch. Without the hold each answer carried the entries committed meanwhile and the
    learner never found the log at rest (a chaos test's learner joined only when its writers
    stopped, a minute later)."""
    from replica.data.model import FetchCall
    from replica.data.primary import JOIN_HOLD

    isr_writes = IsrWrites()
    written = isr_writes.written
    db = StoreThread(await asyncio.to_thread(AgentStore.open, tmp_path, NODE))
    try:
        await db.call(db.store.commit, _record(True), [CreateReplica(ZONE, PARTITION)])
        primary = Primary(
            replace(_deps(db), write_isr=isr_writes.write_isr), (ZONE, PARTITION), EPOCH
        )
        stop = asyncio.Event()

        async def writer() -> int:
            n = 0
            while not stop.is_set():
                await primary.submit(b"w-%d" % n, b"v")
                n += 1
            return n

        writing = asyncio.create_task(writer())
        await asyncio.sleep(0.2)
        after, answers = 0, 0
        started = asyncio.get_running_loop().time()
        while not written and answers < 50:
            reply = await asyncio.wait_for(
                primary.fetch(FetchCall(ZONE, PARTITION, "n9", False, after_index=after)), 5
            )
            answers += 1
            if reply.entries:
                after = reply.entries[-1].index
        stop.set()
        writes = await writing
        # (then it leaves again: this test's learner answers no append)
        assert written[:1] == [frozenset({NODE, "n9"})], f"no join in {answers} fetches"
        assert writes > answers  # the writes went on throughout
        assert asyncio.get_running_loop().time() - started < 10 * JOIN_HOLD
        await primary.stop("test over")
    finally:
        await db.close()


async def test_an_abort_purge_deletes_a_copy_that_commits_after_its_copy_was_cancelled(
    tmp_path: Path,
) -> None:
    """ABORT of a shrink 8 -> 4 on its destination: the copy is cancelled as the purge starts,
    but a copy batch already taken by the primary (held here on the replication lock, as an
    append to a slow member holds it) still commits. The purge scans only once every write
    queued before it has left the queue (``Primary.settled``), so that copied key is deleted
    too. Before, the purge scanned at once, found nothing, and the copy landed after it: a key
    left behind that a later re-sharding could serve with a stale (or deleted) value."""
    from replica.data.resharding import purge

    async with hosted_primary(tmp_path) as (db, store, primary):
        own = next(k for i in range(100) if partition_of(k := b"o-%d" % i, 8) == PARTITION)
        await asyncio.wait_for(primary.submit(own, b"v"), 5)  # reconciled
        for _ in range(500):  # its commit notice done: nothing else wants the lock
            if primary._told_commit == primary.state.commit_index:
                break
            await asyncio.sleep(0.01)
        stray = next(k for i in range(100) if partition_of(k := b"c-%d" % i, 8) != PARTITION)
        async with primary._lock:  # the batch in flight waits for its replication
            copy = asyncio.create_task(primary.write_many([(stray, b"copied")]))
            for _ in range(100):
                await asyncio.sleep(0.01)
                if primary._inflight:
                    break
            # Taken into a batch — or, on a slow machine, still queued: the purge must wait
            # for it either way.
            assert [w.key for w in primary._inflight + primary._queue] == [stray]
            copy.cancel()  # the abort stops the copy ...
            purging = asyncio.create_task(purge(db, primary, 8))  # ... and starts the purge
            await asyncio.sleep(0.2)
            assert not purging.done(), "the purge did not wait for the copy in flight"
        assert await asyncio.wait_for(purging, 10) == 1
        assert await db.call(store.data.get, ZONE, PARTITION, stray) is None
        assert await db.call(store.data.get, ZONE, PARTITION, own) == b"v"
        with pytest.raises(asyncio.CancelledError):
            await copy


async def test_settled_returns_at_once_with_nothing_queued_and_when_the_primary_stops(
    tmp_path: Path,
) -> None:
    async with hosted_primary(tmp_path) as (_db, _store, primary):
        await asyncio.wait_for(primary.submit(b"warm", b"v"), 5)
        await asyncio.wait_for(primary.settled(), 1)  # nothing queued
        async with primary._lock:
            write = asyncio.create_task(primary.write_many([(b"k", b"v")]))
            await asyncio.sleep(0.05)
            waiter = asyncio.create_task(primary.settled())
            await asyncio.sleep(0.05)
            assert not waiter.done()
            await primary.stop("test")  # its queue fails: nothing is left to wait for
            await asyncio.wait_for(waiter, 1)
        with pytest.raises(NotPrimary):
            await write


async def test_a_copy_ends_every_source_loop_when_one_fails_or_it_is_cancelled() -> None:
    """``Puller.run`` runs one loop per source in a task group: a loop that fails ends the
    others, and cancelling the copy (an abort) reaches every loop. With gather, a failed loop
    left the others copying, owned by nothing, past the abort's purge."""
    from types import SimpleNamespace

    from replica.data.resharding import Puller

    for failing in (True, False):
        ended: list[int] = []

        async def pull(source: int, failing: bool = failing, ended: list[int] = ended) -> None:
            try:
                if source == 0 and failing:
                    await asyncio.sleep(0.01)
                    raise NotPrimary(ZONE, 0, "")
                await asyncio.sleep(60)
            finally:
                ended.append(source)

        puller = object.__new__(Puller)
        puller.reshard = SimpleNamespace(moves=SimpleNamespace(sources=(0, 1, 2)))  # type: ignore[assignment]
        puller._pull = pull  # type: ignore[method-assign]
        task = asyncio.create_task(puller.run())
        if failing:
            with pytest.raises(NotPrimary):  # the loop's own error, not a group of it
                await asyncio.wait_for(task, 5)
        else:
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert sorted(ended) == [0, 1, 2]


async def test_a_learners_join_cancelled_during_its_isr_write_lets_no_write_commit_without_it(
    tmp_path: Path,
) -> None:
    """A learner asks for what follows the last entry, so the primary writes an in-sync set
    naming it — and the learner's fetch is cancelled (its deadline) while etcd is slow. The
    fetch holds the replication lock: it must keep it until the write has landed and the
    primary replicates to the learner, or a write committed meanwhile is missing on an in-sync
    member (found by ``test_etcd_faults_mid_rebalance_lose_nothing[sigkill-etcd-leader]``: the
    lease then moved to that member, whose log the others refused for good)."""
    from replica.data.model import FetchCall

    landed = asyncio.Event()
    appended: list[AppendCall] = []
    judged_by: AssignmentMods = ((AssignField.STABLE, 7), (AssignField.PENDING, 0))
    fenced: list[AssignmentMods] = []

    async def write_isr(
        key: Key,
        lease_epoch: int,
        members: frozenset[str],
        isr_revision: int,
        assignment_mods: AssignmentMods = (),
    ) -> int:
        fenced.append(assignment_mods)
        await landed.wait()  # etcd electing a leader
        return isr_revision + 1

    async def send_append(node: str, address: str, call: AppendCall, t: float) -> AppendReply:
        appended.append(call)
        return AppendReply(AppendOutcome.OK, call.prev_index + len(call.entries), EPOCH, EPOCH)

    db = StoreThread(await asyncio.to_thread(AgentStore.open, tmp_path, NODE))
    try:
        await db.call(db.store.commit, _record(True), [CreateReplica(ZONE, PARTITION)])
        deps = replace(
            _deps(db),
            write_isr=write_isr,
            send_append=send_append,
            address_of=lambda n: "a",
            assignment_revisions=lambda key: judged_by,
        )
        primary = Primary(deps, (ZONE, PARTITION), EPOCH)
        try:
            await asyncio.wait_for(primary.submit(b"k1", b"v1"), 5)
            last = primary.state.last_index
            fetch = asyncio.create_task(
                primary.fetch(FetchCall(ZONE, PARTITION, "n2", False, after_index=last))
            )
            await asyncio.sleep(0.05)  # its in-sync set write is in flight
            fetch.cancel()
            await asyncio.sleep(0.05)
            write = asyncio.create_task(primary.submit(b"k2", b"v2"))
            await asyncio.sleep(0.2)
            assert not write.done(), "a write committed while the in-sync set write was in flight"
            landed.set()
            index, _, _ = await asyncio.wait_for(write, 5)
            assert primary.members.get("n2") == index  # the learner holds it
            # the join compared the assignment it was judged by (a retire's race: see
            # test_a_join_judged_by_an_assignment_that_moved_on_is_not_written)
            assert fenced == [judged_by]
            assert any(e.index == index for call in appended for e in call.entries)
            with pytest.raises(asyncio.CancelledError):
                await fetch
        finally:
            landed.set()
            await primary.stop("test over")
    finally:
        await db.close()


async def _hosting(path: Path, node: str) -> StoreThread:
    db = StoreThread(await asyncio.to_thread(AgentStore.open, path, node))
    await db.call(db.store.commit, _record(True), [CreateReplica(ZONE, PARTITION)])
    return db


async def _no_trim(key: Key, count: int) -> None:
    return None


async def test_an_empty_primary_whose_member_holds_committed_entries_leaves_the_isr(
    tmp_path: Path,
) -> None:
    """A primary whose replica lacks committed entries never serves (design/data-plane.md,
    "A primary that lacks committed entries"). Found by
    ``test_etcd_faults_mid_rebalance_lose_nothing[sigstop-etcd-leader]``: a replica was retired
    while a join naming it was in flight, a later catch-up re-created it empty, and the lease
    moved to it. Its reconcile's tail append ("my log ends at 0") was answered OK by members that
    keep their committed entries, and the empty primary served every read of an acknowledged key
    as not found. Now such a member answers AHEAD, and the primary leaves the in-sync set. Real
    agent stores on every side (the members answer through ``answer_appends``, the follower's
    own code); the etcd side is handed to the primary."""
    n1 = await _hosting(tmp_path / "n1", NODE)  # re-created: empty
    n2 = await _hosting(tmp_path / "n2", "n2")
    # a member with entries but no commit index yet (no commit notice reached it): the empty
    # primary's tail append undoes them — it must not stay in the in-sync set
    n3 = await _hosting(tmp_path / "n3", "n3")
    entries = [Entry(i, 1, b"k%d" % i, b"v%d" % i, False) for i in range(1, 6)]
    await n2.call(n2.store.data.follow, ZONE, PARTITION, 1, 0, 0, entries, 5)
    await n3.call(n3.store.data.follow, ZONE, PARTITION, 1, 0, 0, entries, 0)
    members = {"n2": n2, "n3": n3}
    isr_writes = IsrWrites()
    written = isr_writes.written

    async def read_lease_and_isr(key: Key) -> LeaseAndIsr:
        return PrimaryLease(NODE, 2, 0), 7, InSyncSet((NODE, "n2", "n3"), NODE, 1, 0), 3

    async def send_append(node: str, address: str, call: AppendCall, t: float) -> AppendReply:
        (reply,) = await answer_appends(members[node], [call], _no_trim)
        return reply

    deps = replace(
        _deps(n1),
        send_append=send_append,
        address_of=lambda node: "127.0.0.1:1",
        min_in_sync=lambda zone: 2,
        read_lease_and_isr=read_lease_and_isr,
        write_isr=isr_writes.write_isr,
    )
    primary = Primary(deps, (ZONE, PARTITION), 2)
    try:
        for _ in range(250):
            if primary.finished:
                break
            await asyncio.sleep(0.02)
        assert primary.finished, "the primary went on reconciling"
        assert not primary.ready.is_set(), "it finished its reconcile: it would serve"
        # the in-sync set of the member that refused: not this node, not the one it emptied
        assert written == [frozenset({"n2"})]
        try:
            await asyncio.wait_for(primary.submit(b"k9", b"v"), 5)
        except NotPrimary:
            pass
        else:
            raise AssertionError("a write was acknowledged by a primary lacking entries")
        # the member undid nothing: every committed entry is still there
        state = await n2.call(n2.store.data.state, ZONE, PARTITION)
        assert state is not None
        assert (state.last_index, state.commit_index) == (5, 5)
        assert await n2.call(n2.store.data.get, ZONE, PARTITION, b"k5") == b"v5"
    finally:
        await primary.stop("test over")
        await n1.close()
        await n2.close()
        await n3.close()


@contextlib.asynccontextmanager
async def _new_primary_with_n2(
    tmp_path: Path, **deps: object
) -> AsyncIterator[tuple[Primary, StoreThread]]:
    """Node n1's new primary at epoch 2 of an in-sync set {n1, n2} (written at epoch 1), n2
    answering through ``answer_appends`` on its own real store; ``deps`` override the rest."""
    n1 = await _hosting(tmp_path / "n1", NODE)
    n2 = await _hosting(tmp_path / "n2", "n2")

    async def read_lease_and_isr(key: Key) -> LeaseAndIsr:
        return PrimaryLease(NODE, 2, 0), 7, InSyncSet((NODE, "n2"), "n0", 1, 0), 3

    async def send_append(node: str, address: str, call: AppendCall, t: float) -> AppendReply:
        (reply,) = await answer_appends(n2, [call], _no_trim)
        return reply

    base = replace(
        _deps(n1),
        send_append=send_append,
        address_of=lambda node: "127.0.0.1:1",
        read_lease_and_isr=read_lease_and_isr,
    )
    primary = Primary(replace(base, **deps), (ZONE, PARTITION), 2)  # type: ignore[arg-type]
    try:
        yield primary, n2
    finally:
        await primary.stop("test over")
        await n1.close()
        await n2.close()


async def test_a_new_primary_drops_a_member_the_assignment_no_longer_names_without_a_poke(
    tmp_path: Path,
) -> None:
    """The stable switch that named a member gone reached the agent while another node still held
    the lease (it pokes only the primary of its moment); the lease then moved here. The new
    primary looks at its members once its reconcile is done. Before, it kept the retired member
    in the in-sync set until the next assignment or node change: found by
    ``bench/data_plane_bench.py``, whose zone never settled (two partitions' ISRs kept a node
    stable no longer named, so its retire never came). Real agent stores on both sides."""
    isr_writes = IsrWrites()
    gone = {"n2": "the assignment no longer names it"}
    async with _new_primary_with_n2(
        tmp_path, write_isr=isr_writes.write_isr, member_gone=lambda key, m: gone.get(m, "")
    ) as (primary, _n2):
        await asyncio.wait_for(primary.ready.wait(), 5)
        await asyncio.wait_for(isr_writes.wrote.wait(), 5)
        assert isr_writes.written == [frozenset({NODE})]
        assert dict(primary.members) == {}
        assert await asyncio.wait_for(primary.submit(b"k", b"v"), 5) == (1, 2, False)


async def test_a_members_leaving_is_fenced_by_the_assignment_it_was_judged_by(
    tmp_path: Path,
) -> None:
    """The agent watches leases and assignments apart: a new primary's view may not show yet the
    pending that names a member which just joined. Its probe's ISR write compares the assignment
    revisions it judged by; when they moved on (etcd refuses: Unavailable), the member stays and
    the primary serves on (the change pokes it again). And a primary with nothing gone writes no
    in-sync set at all."""
    judged_by: AssignmentMods = ((AssignField.STABLE, 7), (AssignField.PENDING, 9))
    fenced: list[AssignmentMods] = []
    refused = asyncio.Event()
    named = {"n2": "the assignment no longer names it"}

    async def write_isr(
        key: Key,
        lease_epoch: int,
        members: frozenset[str],
        isr_revision: int,
        assignment_mods: AssignmentMods = (),
    ) -> int:
        fenced.append(assignment_mods)
        refused.set()
        raise Unavailable("the assignment of z/3 changed since this in-sync set change was judged")

    async with _new_primary_with_n2(
        tmp_path,
        write_isr=write_isr,
        member_gone=lambda key, m: named.get(m, ""),
        assignment_revisions=lambda key: judged_by,
    ) as (primary, n2):
        await asyncio.wait_for(refused.wait(), 5)
        assert fenced == [judged_by]
        assert await asyncio.wait_for(primary.submit(b"k", b"v"), 5) == (1, 2, False)
        assert not primary.finished
        assert dict(primary.members) == {"n2": 1}  # kept, and it has the write
        assert await n2.call(n2.store.data.get, ZONE, PARTITION, b"k") == b"v"
        named.clear()  # the view caught up: the pending names n2
        primary.poke()
        assert await asyncio.wait_for(primary.submit(b"k2", b"v"), 5) == (2, 2, False)
        assert fenced == [judged_by], "an in-sync set was written with nothing gone"
