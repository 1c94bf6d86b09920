"""An agent's etcd work during a burst of moves, batched per node against a real etcd (issue 14
item 1; design/replica-protocol.md, "Move reports"; design/data-plane.md, "ISR changes"):

* the move reports of catch-ups that end together go out in a few transactions, not one each;
* ``IsrWrites`` keeps one write per partition per transaction, and a closed one answers None;
* a learner asks for small snapshot pages first, and a caught-up learner not in the in-sync set
  waits for a change of its partition instead of polling every 50 ms;
* a replica the assignment no longer names gets no learner.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

from placement.metastore.codec import (
    InSyncSet,
    MoveReport,
    NodeRecord,
    PrimaryLease,
    decode_report,
    encode_primary,
)
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import AssignField, KeySpace
from placement.metastore.store import ISR_BATCH, IsrWrite, Metastore
from replica.data.follower import FIRST_PAGE_BYTES, IDLE_POLL, Learner, LearnerDeps, TokenBucket
from replica.data.isr_writes import IsrWrites
from replica.data.model import FetchCall, FetchOutcome, FetchReply, Key
from replica.data.plane import DataPlane
from replica.protocol import MoveRequest, RebalanceOutcome, StartCatchUp
from replica.records import AgentStore, StoreThread
from replica.registration import Registration
from replica.service import ReplicaAgent, record_catch_up

TIMEOUT = 20.0


@pytest.fixture
def keys() -> KeySpace:
    return KeySpace(f"/t{uuid.uuid4().hex[:12]}/placement")


async def _eventually(check: object, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not await check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def test_catch_ups_ending_together_report_in_a_few_transactions(
    client: EtcdClient, keys: KeySpace, tmp_path: Path
) -> None:
    """200 catch-ups of one agent end at once: every DONE is reported (the agent's key, the
    move's revision), in a handful of etcd transactions — before, one put each."""
    partitions = 200
    registration = Registration(client, keys, NodeRecord("n1", "127.0.0.1:1", {}), ttl=5)
    await registration.start()
    gate = asyncio.Event()

    async def gated(job: StartCatchUp, db: StoreThread) -> None:
        await record_catch_up(job, db)
        await gate.wait()

    store = await asyncio.to_thread(AgentStore.open, tmp_path / "agent", "n1")
    agent = ReplicaAgent("n1", StoreThread(store), catch_up=gated, reporter=registration.report)
    try:
        moves = [MoveRequest("z", p, ("n2",), ("n1", "n2"), 100 + p, 1) for p in range(partitions)]
        answers = await asyncio.gather(*(agent.rebalance(m) for m in moves))
        assert {a.outcome for a in answers} == {RebalanceOutcome.ACCEPTED}
        before = await client.current_revision()
        gate.set()
        prefix = keys.progress_prefix()

        async def all_reported() -> bool:
            return len((await client.list_prefix(prefix)).kvs) == partitions

        await _eventually(all_reported, "every report")
        txns = await client.current_revision() - before  # every write txn bumps it by one
        for kv in (await client.list_prefix(prefix)).kvs:
            report = decode_report(kv.value)
            assert isinstance(report, MoveReport)
            partition = int(kv.key.split(b"/")[-2])
            assert kv.key == keys.progress("z", partition, "n1")
            assert (report.revision, report.phase) == (100 + partition, "DONE")
            assert kv.lease != 0  # under the registration lease: gone with the agent
        assert txns <= 10, f"{txns} transactions for {partitions} reports"
        assert registration.reports.flushes == txns
    finally:
        await agent.close()
        await registration.stop()


async def test_isr_writes_keep_a_partition_once_per_transaction_and_closing_answers_none(
    client: EtcdClient, keys: KeySpace
) -> None:
    """Two writes of one partition never share a transaction (the second waits for the next
    and, its compare now stale, fails — with its whole batch: None, the caller checks alone);
    writes still queued or in flight when the agent closes them answer None."""
    store = Metastore(client, keys)
    lease_revs = [
        await client.put(keys.primary("z", p), encode_primary(PrimaryLease("n1", 1, 2**40)))
        for p in range(2)
    ]
    writes = IsrWrites(store)
    isr = InSyncSet(("n1", "n2"), "n1", 1, 0)
    first, other, again = await asyncio.gather(
        writes.write(IsrWrite("z", 0, isr, lease_revs[0], 0)),
        writes.write(IsrWrite("z", 1, isr, lease_revs[1], 0)),
        writes.write(IsrWrite("z", 0, isr, lease_revs[0], 0)),  # compares what the first changes
    )
    assert first is not None
    assert first == other  # one transaction
    assert again is None
    assert (writes.transactions, writes.written) == (2, 2)
    await writes.close()

    gate = asyncio.Event()

    class Stuck(Metastore):
        async def write_isrs(self, batch: Sequence[IsrWrite]) -> int | None:
            await gate.wait()
            return 1

    stuck = IsrWrites(Stuck(client, keys))
    pending = [
        asyncio.ensure_future(stuck.write(IsrWrite("z", p, isr, lease_revs[0], 0))) for p in (0, 0)
    ]
    await asyncio.sleep(0.05)  # the first in flight, the second queued behind it
    await stuck.close()
    assert await asyncio.gather(*pending) == [None, None]


async def test_a_full_batch_of_joins_fits_one_etcd_transaction(
    client: EtcdClient, keys: KeySpace
) -> None:
    """A learner's join compares its assignment's two revisions on top of the lease's and the
    ISR's: ``ISR_BATCH`` joins are four compares each, and etcd takes them in one transaction
    (at 64 per batch, joins overflowed etcd's limit and every write fell back to its own)."""
    store = Metastore(client, keys)
    joins = []
    for p in range(ISR_BATCH):
        lease_rev = await client.put(
            keys.primary("z", p), encode_primary(PrimaryLease("n1", 1, 2**40))
        )
        isr = InSyncSet(("n1", "n2"), "n1", 1, 0)
        mods = ((AssignField.STABLE, 0), (AssignField.PENDING, 0))  # absent, as the view saw
        joins.append(IsrWrite("z", p, isr, lease_rev, 0, mods))
    revision = await store.write_isrs(joins)
    assert revision is not None
    assert len((await client.list_prefix(keys.zone_isr_prefix("z"))).kvs) == ISR_BATCH


class _Source:
    """A primary for one learner: a snapshot of ``pages`` pages, then an empty log."""

    def __init__(self, pages: int) -> None:
        self.pages = pages
        self.asked: list[int] = []  # max_bytes of each snapshot fetch
        self.tails = 0

    async def fetch(self, address: str, call: FetchCall, rpc_timeout: float) -> FetchReply:
        if not call.snapshot:
            self.tails += 1
            return FetchReply(FetchOutcome.OK, commit_index=5, lease_epoch=3)
        self.asked.append(call.max_bytes)
        n = len(self.asked)
        return FetchReply(
            FetchOutcome.OK,
            items=((f"k{n}".encode(), b"v"),),
            snapshot_done=n == self.pages,
            snapshot_index=5,
            snapshot_epoch=3,
            commit_index=5,
            lease_epoch=3,
        )


async def test_a_learner_starts_with_small_pages_and_waits_for_a_change_when_caught_up(
    tmp_path: Path,
) -> None:
    """Snapshot pages of 16 KiB, then twice as large each time, up to ``fetch_bytes``; once it
    holds everything, the learner asks again only after a wait that grows while nothing changes
    (woken at once by a change of its partition in the real agent) — not every 50 ms."""
    store = await asyncio.to_thread(AgentStore.open, tmp_path / "agent", "n2")
    db = StoreThread(store)
    key: Key = ("z", 0)
    await db.call(store.begin_replica, *key)
    source = _Source(pages=4)
    waits: list[float] = []
    in_sync = [False]

    async def idle(k: Key, at_most: float) -> None:
        assert k == key
        waits.append(at_most)
        if len(waits) == 4:
            in_sync[0] = True  # the primary added it: the view shows it

    deps = LearnerDeps(
        node="n2",
        db=db,
        fetch_bytes=64 << 10,
        send_fetch=source.fetch,
        bucket=TokenBucket(1e12),
        primary_of=lambda k: ("n1", "127.0.0.1:1"),
        done=lambda k: in_sync[0],
        idle=idle,
    )
    try:
        await asyncio.wait_for(Learner(deps, key).run(), TIMEOUT)
        assert source.asked == [FIRST_PAGE_BYTES, 32 << 10, 64 << 10, 64 << 10]
        assert waits == [IDLE_POLL, IDLE_POLL * 2, IDLE_POLL * 4, IDLE_POLL * 8]
        assert source.tails == 4
        state = await db.call(store.data.state, *key)
        assert state is not None
        assert not state.loading_snapshot
        assert (state.last_index, state.seen_epoch) == (5, 3)  # loaded, and fenced in one go
    finally:
        await db.close()


async def test_a_replica_the_assignment_no_longer_names_gets_no_learner(
    client: EtcdClient, keys: KeySpace, tmp_path: Path
) -> None:
    """A leaving replica (hosted until retired, out of the in-sync set) would only poll a primary
    that never adds it: the agent runs a learner only while stable or pending names its node
    (or the assignment is unknown)."""
    store = await asyncio.to_thread(AgentStore.open, tmp_path / "agent", "n1")
    db = StoreThread(store)
    plane = DataPlane("n1", db, client, keys)
    try:
        key: Key = ("z", 0)
        assert plane.named(key)  # unknown: not judged by it
        plane.view.assignments[key] = {AssignField.STABLE: frozenset({"n2", "n3"})}
        assert not plane.named(key)
        plane.view.assignments[key][AssignField.PENDING] = frozenset({"n1", "n2"})
        assert plane.named(key)
        plane.view.assignments[key] = {AssignField.STABLE: None}  # unreadable
        assert plane.named(key)
    finally:
        await plane.close()
        await db.close()
