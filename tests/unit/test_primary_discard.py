"""A primary whose replica is discarded under it (a retire, an aborted re-sharding's destination)
stops quietly: its next write is refused and fails the client's write with NotPrimary, it does
not recreate the discarded replica's data state, and it logs no traceback.

A real agent store (sqlite on disk, the store thread's group commit); the etcd side is a
one-node in-sync set the test hands the primary. Before the fix, the write after the discard
recreated an empty data state and failed with ``ValueError: entry 2 does not follow 0``."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from placement.metastore.codec import InSyncSet, PrimaryLease
from replica.data.model import AppendCall, AppendReply, Key, NotPrimary
from replica.data.primary import LeaseAndIsr, Primary, PrimaryDeps
from replica.protocol import CreateReplica, DiscardReplica, PartitionRecord
from replica.records import AgentStore, StoreThread

ZONE, PARTITION, NODE, EPOCH = "z", 3, "n1", 1


def _record(hosted: bool) -> PartitionRecord:
    return PartitionRecord(ZONE, PARTITION, 1, 1, 0, (NODE,), None, hosted)


def _deps(db: StoreThread) -> PrimaryDeps:
    lease = PrimaryLease(NODE, EPOCH, expiry=2**62)
    isr = InSyncSet((NODE,), NODE, EPOCH, 0)

    async def read_lease_and_isr(key: Key) -> LeaseAndIsr:
        return lease, 1, isr, 1

    async def write_isr(key: Key, epoch: int, members: frozenset[str], rev: int) -> int:
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
