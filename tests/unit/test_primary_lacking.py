"""A primary whose replica lacks committed entries never serves (design/data-plane.md, "A primary
that lacks committed entries").

Found by ``test_etcd_faults_mid_rebalance_lose_nothing[sigstop-etcd-leader]``: a replica was
retired while a join naming it was in flight, a later catch-up re-created it empty, and the lease
moved to it. Its reconcile's tail append ("my log ends at 0") was answered OK by members that
keep their committed entries, and the empty primary served every read of an acknowledged key as
not found. Now such a member answers AHEAD, and the primary leaves the in-sync set instead.

Real agent stores on both sides (the member answers through ``answer_appends``, the follower's
own code); the etcd side is handed to the primary."""

from __future__ import annotations

import asyncio
from pathlib import Path

from placement.metastore.codec import InSyncSet, PrimaryLease
from replica.data.follower import answer_appends
from replica.data.model import AppendCall, AppendReply, Key, NotPrimary
from replica.data.primary import AssignmentMods, LeaseAndIsr, Primary, PrimaryDeps
from replica.data.storage import Entry
from replica.protocol import CreateReplica, PartitionRecord
from replica.records import AgentStore, StoreThread

ZONE, PARTITION, EPOCH = "z", 0, 2


async def _hosting(path: Path, node: str) -> StoreThread:
    db = StoreThread(await asyncio.to_thread(AgentStore.open, path, node))
    record = PartitionRecord(ZONE, PARTITION, 1, 1, 0, ("n1", "n2"), None, True)
    await db.call(db.store.commit, record, [CreateReplica(ZONE, PARTITION)])
    return db


async def _no_trim(key: Key, count: int) -> None:
    return None


async def test_an_empty_primary_whose_member_holds_committed_entries_leaves_the_isr(
    tmp_path: Path,
) -> None:
    n1 = await _hosting(tmp_path / "n1", "n1")  # re-created: empty
    n2 = await _hosting(tmp_path / "n2", "n2")
    # a member with entries but no commit index yet (no commit notice reached it): the empty
    # primary's tail append undoes them — it must not stay in the in-sync set
    n3 = await _hosting(tmp_path / "n3", "n3")
    entries = [Entry(i, 1, b"k%d" % i, b"v%d" % i, False) for i in range(1, 6)]
    await n2.call(n2.store.data.follow, ZONE, PARTITION, 1, 0, 0, entries, 5)
    await n3.call(n3.store.data.follow, ZONE, PARTITION, 1, 0, 0, entries, 0)
    members = {"n2": n2, "n3": n3}
    written: list[frozenset[str]] = []

    async def read_lease_and_isr(key: Key) -> LeaseAndIsr:
        return PrimaryLease("n1", EPOCH, 0), 7, InSyncSet(("n1", "n2", "n3"), "n1", 1, 0), 3

    async def write_isr(
        key: Key, epoch: int, members: frozenset[str], rev: int, mods: AssignmentMods = ()
    ) -> int:
        written.append(members)
        return rev + 1

    async def send_append(node: str, address: str, call: AppendCall, t: float) -> AppendReply:
        (reply,) = await answer_appends(members[node], [call], _no_trim)
        return reply

    deps = PrimaryDeps(
        node="n1",
        db=n1,
        isr_timeout=1.0,
        heartbeat=0.05,
        batch_max=64,
        fetch_bytes=1 << 20,
        send_append=send_append,
        address_of=lambda node: "127.0.0.1:1",
        lease_ok=lambda key, epoch: True,
        primary_hint=lambda key: "",
        min_in_sync=lambda zone: 2,
        read_lease_and_isr=read_lease_and_isr,
        write_isr=write_isr,
        trim=_no_trim,
    )
    primary = Primary(deps, (ZONE, PARTITION), EPOCH)
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
