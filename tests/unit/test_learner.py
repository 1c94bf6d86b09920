"""The learner (``replica.data.follower.Learner``) on a real agent store, pulling from a primary
whose answers follow ``Primary.fetch``'s rules over a real ``DataStore`` (committed entries
after the asked index; the asker joins the in-sync set when it asks for what follows the last
entry). What it must never do (design/data-plane.md, "Learners"):

* undo an entry the primary holds — the node may be an in-sync member whose view of etcd does
  not show it yet, and the entries above its lazily written commit index may be acknowledged
  ones (the chaos campaign's lost write, 2026-11-28);
* keep an entry the primary does not hold (a deposed primary's half-replicated batch);
* ask to join with a position remembered from a replica that was retired and created again
  under it (it would be added to the in-sync set empty).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path

from replica.data.follower import Learner, LearnerDeps, TokenBucket
from replica.data.model import FetchCall, FetchOutcome, FetchReply, Key
from replica.data.storage import DataStore, Entry
from replica.records import AgentStore, StoreThread

KEY: Key = ("z", 0)
TIMEOUT = 10.0


def entry(index: int, epoch: int, value: str) -> Entry:
    return Entry(index, epoch, f"k{index}".encode(), value.encode(), False)


class Primary:
    """The primary's side of a Fetch (``Primary.fetch``), on a real ``DataStore``; every entry
    of its log is committed (a fetch is served under ``committed()``)."""

    def __init__(self, epoch: int) -> None:
        conn = sqlite3.connect(":memory:", isolation_level=None)
        self.data = DataStore(conn)
        self.data.create_schema()
        self.data.raise_fence(*KEY, epoch)
        self.epoch = epoch
        self.asked: list[int] = []
        #: Who asked for what follows the last entry (the primary would add it to the ISR),
        #: with the learner's log as it was on disk at that moment.
        self.admitted: list[list[tuple[int, int]]] = []
        self.learner_log: Callable[[], list[tuple[int, int]]] = list
        #: The learner's log on disk at each of its fetches.
        self.seen: list[list[tuple[int, int]]] = []

    def append(self, entries: list[Entry]) -> None:
        self.data.append(*KEY, entries, entries[-1].index)

    def log(self) -> list[tuple[int, int, bytes]]:
        state = self.data.state(*KEY)
        assert state is not None
        return [
            (e.index, e.epoch, e.value)
            for e in self.data.entries(*KEY, 0, state.last_index, 1 << 30)
        ]

    async def fetch(self, address: str, call: FetchCall, rpc_timeout: float) -> FetchReply:
        assert not call.snapshot, "the learner's replica holds the primary's base: no snapshot"
        state = self.data.state(*KEY)
        assert state is not None
        self.asked.append(call.after_index)
        self.seen.append(self.learner_log())
        if call.after_index == state.last_index:
            self.admitted.append(self.learner_log())
        entries = self.data.entries(*KEY, call.after_index, state.last_index, 1 << 20)
        return FetchReply(
            FetchOutcome.OK,
            entries=tuple(entries),
            commit_index=state.last_index,
            lease_epoch=self.epoch,
        )


async def open_store(tmp_path: Path) -> tuple[AgentStore, StoreThread]:
    store = await asyncio.to_thread(AgentStore.open, tmp_path / "agent", "n2")
    db = StoreThread(store)
    await db.call(store.begin_replica, *KEY)
    return store, db


def log_of(store: AgentStore) -> list[tuple[int, int, bytes]]:
    state = store.data.state(*KEY)
    assert state is not None
    return [
        (e.index, e.epoch, e.value) for e in store.data.entries(*KEY, 0, state.last_index, 1 << 30)
    ]


def deps(
    db: StoreThread,
    primary: Primary,
    done: list[bool],
    idle: Callable[[Key, float], Awaitable[None]] | None = None,
) -> LearnerDeps:
    """A learner of n2 pulling from ``primary``; by default, once caught up (its first idle
    wait) the view shows it in the ISR (``done``)."""

    async def joined(key: Key, at_most: float) -> None:
        done[0] = True
        await asyncio.sleep(0)

    return LearnerDeps(
        node="n2",
        db=db,
        fetch_bytes=1 << 20,
        send_fetch=primary.fetch,
        bucket=TokenBucket(0),
        primary_of=lambda k: ("n1", "127.0.0.1:1"),
        done=lambda k: done[0],
        idle=idle or joined,
    )


async def test_an_in_sync_member_running_a_learner_keeps_every_acknowledged_entry(
    tmp_path: Path,
) -> None:
    """Entries 1..5 of epoch 1 were acknowledged — on the primary and on n2 — but n2's commit
    index on disk still says 2 (written lazily). n2's view does not show it in the in-sync set,
    so a learner starts there: it must keep 3..5 (the old learner undid them at its start; had
    n2 taken the lease next, three acknowledged writes were gone), take the primary's entry 6,
    and only then ask for what follows the last entry."""
    store, db = await open_store(tmp_path)
    acked = [entry(i, 1, f"v{i}") for i in range(1, 6)]
    await db.call(store.data.append, *KEY, acked, 2)
    primary = Primary(epoch=2)
    primary.append(acked)
    primary.append([entry(6, 2, "v6")])
    primary.learner_log = lambda: [(i, e) for i, e, _ in log_of(store)]
    done = [False]
    try:
        await asyncio.wait_for(Learner(deps(db, primary, done), KEY).run(), TIMEOUT)
        assert log_of(store) == primary.log()
        assert primary.asked[0] == 2, "the learner asks after its commit index"
        assert primary.seen[0] == [(i, 1) for i in range(1, 6)], "it undid acknowledged entries"
        assert primary.admitted == [[(i, 1) for i in range(1, 6)] + [(6, 2)]]
        state = store.data.state(*KEY)
        assert state is not None
        assert (state.commit_index, state.seen_epoch) == (6, 2)
    finally:
        store.close()


async def test_a_learner_undoes_exactly_the_entries_the_primary_does_not_hold(
    tmp_path: Path,
) -> None:
    """n2 holds 1..3 of epoch 1 (acknowledged, its commit index says 1) and 4..5 of epoch 1 that
    a deposed primary never got acknowledged; the primary of epoch 2 holds 1..3 and its own 4.
    The learner's answer replaces 4 and drops 5; 2 and 3 stay."""
    store, db = await open_store(tmp_path)
    await db.call(store.data.append, *KEY, [entry(i, 1, f"v{i}") for i in range(1, 4)], 1)
    await db.call(store.data.append, *KEY, [entry(4, 1, "lost"), entry(5, 1, "lost")], 1)
    primary = Primary(epoch=2)
    primary.append([entry(i, 1, f"v{i}") for i in range(1, 4)])
    primary.append([entry(4, 2, "v4")])
    done = [False]
    try:
        await asyncio.wait_for(Learner(deps(db, primary, done), KEY).run(), TIMEOUT)
        assert log_of(store) == primary.log()
        assert store.data.get(*KEY, b"k5") is None
        assert store.data.get(*KEY, b"k4") == b"v4"
    finally:
        store.close()


async def test_a_learner_undoes_a_suffix_past_the_primarys_last_entry(tmp_path: Path) -> None:
    """n2 holds 1..3 (acknowledged) and 4..5 of epoch 1 that were never acknowledged; the new
    primary (epoch 2) has written nothing yet, so its log ends at 3 and nothing in the answer
    differs from n2's entries: the suffix past the primary's last entry must go all the same —
    kept, n2 would join the in-sync set with the values of writes nobody acknowledged."""
    store, db = await open_store(tmp_path)
    await db.call(store.data.append, *KEY, [entry(i, 1, f"v{i}") for i in range(1, 4)], 1)
    await db.call(store.data.append, *KEY, [entry(4, 1, "lost"), entry(5, 1, "lost")], 1)
    primary = Primary(epoch=2)
    primary.append([entry(i, 1, f"v{i}") for i in range(1, 4)])
    primary.learner_log = lambda: [(i, e) for i, e, _ in log_of(store)]
    done = [False]
    try:
        await asyncio.wait_for(Learner(deps(db, primary, done), KEY).run(), TIMEOUT)
        assert log_of(store) == primary.log()
        assert primary.admitted == [[(1, 1), (2, 1), (3, 1)]]
        assert store.data.get(*KEY, b"k4") is None
        assert store.data.get(*KEY, b"k5") is None
    finally:
        store.close()


async def test_a_learner_whose_replica_is_created_again_under_it_starts_over(
    tmp_path: Path,
) -> None:
    """Caught up and waiting to be added, the learner's replica is retired and a new move creates
    it again, empty: the learner must not ask for what follows the primary's last entry with
    the position it remembers — the primary would add an empty replica to the in-sync set."""
    store, db = await open_store(tmp_path)
    primary = Primary(epoch=1)
    primary.append([entry(i, 1, f"v{i}") for i in range(1, 4)])
    await db.call(store.data.append, *KEY, [entry(i, 1, f"v{i}") for i in range(1, 4)], 3)
    waits = [0]

    async def idle(key: Key, at_most: float) -> None:
        waits[0] += 1
        if waits[0] > 1:
            raise AssertionError("the learner went on with the position it remembered")
        if waits[0] == 1:  # the retire drops the data; a new catch-up creates it empty
            await db.call(store.data.drop, *KEY)
            await db.call(store.begin_replica, *KEY)
            await db.call(store.data.ensure, *KEY)

    learner_deps = deps(db, primary, [False], idle)
    primary.learner_log = lambda: [(i, e) for i, e, _ in log_of(store)]
    try:
        await asyncio.wait_for(Learner(learner_deps, KEY).run(), TIMEOUT)
        # It ended (the roles pass starts a new one from the replica as it is now), and no
        # fetch asked to join on behalf of the empty replica.
        assert all(log for log in primary.admitted), primary.admitted
        assert waits[0] == 1
    finally:
        store.close()
