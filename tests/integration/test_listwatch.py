"""metastore.listwatch on a real etcd: snapshots, resume after a crash, re-list on compaction."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from placement.core.retry import Backoff, RetryPolicy
from placement.errors import StoreUnavailable
from placement.metastore.etcd import EtcdClient
from placement.metastore.listwatch import ListWatch, Snapshot, WatchState
from placement.metastore.txn import Put

pytestmark = pytest.mark.integration

WAIT = 20.0


async def _etcd_state(client: EtcdClient, prefix: bytes) -> dict[bytes, tuple[bytes, int]]:
    listed = await client.list_prefix(prefix)
    return {kv.key: (kv.value, kv.mod_revision) for kv in listed.kvs}


def _state(snapshot: Snapshot) -> dict[bytes, tuple[bytes, int]]:
    return {k: (kv.value, kv.mod_revision) for k, kv in snapshot.kvs.items()}


def _mirror_apply(mirror: dict[bytes, tuple[bytes, int]], lw: ListWatch, taken: set[bytes]) -> None:
    """What a follower's consumer does: each key taken read live, absent = deleted."""
    for key in taken:
        kv = lw.get(key)
        if kv is None:
            mirror.pop(key, None)
        else:
            mirror[key] = (kv.value, kv.mod_revision)


async def _until(lw: ListWatch, last: Snapshot, pred: Any) -> Snapshot:
    async with asyncio.timeout(WAIT):
        while not pred(last):
            last = await lw.wait_newer(last)
    return last


async def test_snapshots_follow_the_prefix_and_are_immutable(
    client: EtcdClient, prefix: str
) -> None:
    base = f"{prefix}/lw/".encode()
    await client.put(base + b"a", b"1")
    await client.put(base + b"z", b"untouched")
    async with ListWatch(client, base, page_size=2) as lw:
        follower = lw.follow()
        mirror = _state(lw.snapshot())
        first = lw.snapshot()
        assert first.generation == 1
        assert _state(first) == await _etcd_state(client, base)
        with pytest.raises(TypeError):
            first.kvs[base + b"x"] = first.kvs[base + b"a"]  # type: ignore[index]
        await client.txn((), (Put(base + b"b", b"2"), Put(base + b"c", b"3")))
        await client.delete(base + b"a")
        rev = await client.put(base + b"b", b"4")
        last = await _until(lw, first, lambda s: s.revision >= rev)
        assert _state(last) == await _etcd_state(client, base)
        assert base + b"a" in first.kvs, "an old snapshot never changes"
        taken = follower.take()
        assert taken == {base + b"a", base + b"b", base + b"c"}, "the keys changed, only they"
        _mirror_apply(mirror, lw, taken)
        assert mirror == _state(last)
        assert follower.take() == set()
        updates = lw.updates()
        update = await anext(updates)
        assert update.reset
        assert update.snapshot is lw.snapshot()
        await client.put(base + b"d", b"5")
        update = await anext(updates)
        assert not update.reset
        assert base + b"d" in update.snapshot.kvs
        await updates.aclose()


async def _put_once_up(writer: EtcdClient, key: bytes, value: bytes) -> int:
    """Put, retrying while the writer's channel has not reconnected to the restarted etcd yet
    (its first calls fail fast with "connection refused" until the reconnect backoff ends; a
    re-put of the same value is harmless here)."""
    async with asyncio.timeout(15):
        while True:
            try:
                return await writer.put(key, value)
            except StoreUnavailable:
                await asyncio.sleep(0.1)


async def test_resumes_after_etcd_is_killed_and_restarted(etcd_factory: Any) -> None:
    server = etcd_factory()
    async with (
        EtcdClient([server.endpoint], watch_resume_window=60.0) as client,
        EtcdClient([server.endpoint]) as writer,
    ):
        for i in range(5):
            await writer.put(b"/p/%d" % i, b"before")
        async with ListWatch(client, b"/p/") as lw:
            first = lw.snapshot()
            server.kill()
            await asyncio.to_thread(server.start)
            rev = 0
            for i in range(3, 8):
                rev = await _put_once_up(writer, b"/p/%d" % i, b"after")
            await writer.delete(b"/p/0")
            rev = await writer.current_revision()
            last = await _until(lw, first, lambda s: s.revision >= rev)
            assert _state(last) == await _etcd_state(writer, b"/p/")
            assert last.generation == 1, "resumed, not re-listed"
            assert lw.resets == 0, "resumed, not re-listed"


async def test_relists_when_compacted_while_disconnected(etcd_factory: Any) -> None:
    """etcd restarts, and before the watcher is back its revision is compacted away: it re-lists
    and the reset snapshot equals etcd's state."""
    server = etcd_factory()
    gate = asyncio.Event()
    retrying = asyncio.Event()

    async def gated_sleep(delay: float) -> None:
        retrying.set()
        await gate.wait()

    async with (
        EtcdClient([server.endpoint], watch_resume_window=0.0) as client,
        EtcdClient([server.endpoint]) as writer,
    ):
        for i in range(5):
            await writer.put(b"/q/%d" % i, b"v0")
        lw = ListWatch(
            client, b"/q/", sleep=gated_sleep, backoff=Backoff(RetryPolicy(0.01, 0.01, floor=0.5))
        )
        first = await lw.start()
        follower = lw.follow()
        mirror = _state(first)
        try:
            server.kill()
            async with asyncio.timeout(WAIT):
                await retrying.wait()  # the list-watch gave up its stream and waits to retry
            assert lw.state is WatchState.RETRYING
            await asyncio.to_thread(server.start)
            for i in range(3, 9):
                await _put_once_up(writer, b"/q/%d" % i, b"v1")
            await writer.delete(b"/q/0")
            rev = await writer.put(b"/q/1", b"v2")
            await writer.compact(rev)
            gate.set()
            last = await _until(lw, first, lambda s: s.generation == 2)
            assert lw.resets == 1
            assert last.revision >= rev
            assert _state(last) == await _etcd_state(writer, b"/q/")
            # The follower names every key before and after the re-list: /q/0's delete, which
            # no event carried, included.
            taken = follower.take()
            assert b"/q/0" in taken
            _mirror_apply(mirror, lw, taken)
            assert mirror == _state(last)
            rev = await writer.put(b"/q/9", b"after")
            last = await _until(lw, last, lambda s: s.revision >= rev)
            assert _state(last) == await _etcd_state(writer, b"/q/")
        finally:
            await lw.close()


async def test_quiet_keys_wake_nobody_but_show_in_the_next_snapshot(
    client: EtcdClient, prefix: str
) -> None:
    base = f"{prefix}/lq/".encode()
    quiet = base + b"sizes/"
    async with ListWatch(client, base, quiet=lambda key: key.startswith(quiet)) as lw:
        first = lw.snapshot()
        await client.put(quiet + b"a", b"1")
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(1.0):
                await lw.wait_newer(first)
        rev = await client.put(base + b"zone", b"z")
        last = await _until(lw, first, lambda s: s.revision >= rev)
        assert quiet + b"a" in last.kvs
        assert _state(last) == await _etcd_state(client, base)
