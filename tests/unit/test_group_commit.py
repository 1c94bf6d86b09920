"""The agent store's group commit (``StoreThread.group``): calls submitted together share one
transaction, each part fails alone, and a returned part is durable (read back from a new
connection to the same file)."""

from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from replica.data.storage import Entry
from replica.records import DB_NAME, AgentStore, StoreThread


def entry(index: int, key: bytes) -> Entry:
    return Entry(index, 1, key, b"v" + key)


def fails(store: AgentStore) -> None:
    store.data.ensure("z", 99)  # written, then undone with its part
    raise ValueError("this part fails")


def on_disk(path: Path) -> dict[tuple[str, int], bytes]:
    conn = sqlite3.connect(path / DB_NAME)
    try:
        rows = conn.execute("SELECT zone, partition, key FROM kv").fetchall()
        states = conn.execute("SELECT zone, partition FROM dstate").fetchall()
    finally:
        conn.close()
    return {(z, p): bytes(k) for z, p, k in rows} | {(z, p): b"" for z, p in states if p == 99}


async def test_parts_share_a_transaction_fail_alone_and_are_durable(tmp_path: Path) -> None:
    db = StoreThread(await asyncio.to_thread(AgentStore.open, tmp_path, "n1"))
    try:
        calls = [("z", p, [entry(1, b"k%d" % p)], 0) for p in range(50)]
        results = await db.group_each(db.store.data.append_writes, calls)
        assert db.groups == 1
        assert db.grouped == 50
        assert all(not isinstance(r, Exception) and r[0].last_index == 1 for r in results)

        # One failing part among others: only its own writes are undone.
        outcomes = await asyncio.gather(
            db.group(db.store.data.append_writes, "z", 100, [entry(1, b"a")], 0),
            db.group(fails, db.store),
            db.group(db.store.data.append_writes, "z", 101, [entry(1, b"b")], 0),
            return_exceptions=True,
        )
        assert isinstance(outcomes[1], ValueError)
        assert not isinstance(outcomes[0], BaseException)
        assert not isinstance(outcomes[2], BaseException)

        # A part that breaks a storage rule raises to its caller, like a plain call would.
        with pytest.raises(ValueError, match="does not follow"):
            await db.group(db.store.data.append_writes, "z", 0, [entry(5, b"gap")], 0)
    finally:
        await db.close()
    found = on_disk(tmp_path)
    assert all(found.get(("z", p)) == b"k%d" % p for p in range(50))
    assert found.get(("z", 100)) == b"a"
    assert found.get(("z", 101)) == b"b"
    assert ("z", 99) not in found  # the failed part left nothing behind


async def test_concurrent_callers_are_grouped_while_the_thread_is_busy(tmp_path: Path) -> None:
    db = StoreThread(await asyncio.to_thread(AgentStore.open, tmp_path, "n1"))
    try:

        async def writer(p: int) -> None:
            for i in range(1, 21):
                await db.group(db.store.data.append_writes, "z", p, [entry(i, b"k%d" % i)], 0)

        await asyncio.gather(*(writer(p) for p in range(16)))
        assert db.grouped == 16 * 20
        assert db.groups < db.grouped / 2, (db.groups, db.grouped)  # fsyncs shared
    finally:
        await db.close()


async def test_stores_sharing_one_thread_each_commit_their_own_and_close_alone(
    tmp_path: Path,
) -> None:
    """The fleet simulator's nodes share one store thread: each store's group commits to its
    own file, and closing one store leaves the thread serving the others."""
    shared = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shared-store")
    try:
        dbs = [
            StoreThread(await asyncio.to_thread(AgentStore.open, tmp_path / n, n), shared)
            for n in ("n1", "n2")
        ]
        for i, db in enumerate(dbs):
            await db.group(db.store.data.append_writes, "z", i, [entry(1, b"k%d" % i)], 0)
        await dbs[0].close()
        await dbs[1].group(dbs[1].store.data.append_writes, "z", 7, [entry(1, b"after")], 0)
        await dbs[1].close()
        assert on_disk(tmp_path / "n1") == {("z", 0): b"k0"}
        assert on_disk(tmp_path / "n2") == {("z", 1): b"k1", ("z", 7): b"after"}
        # Still open: the stores' owner shuts it down, not a store's close.
        assert shared.submit(lambda: 1).result() == 1
    finally:
        shared.shutdown(wait=True)
