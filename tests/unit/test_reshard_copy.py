"""The destination side of a re-sharding copy as a pure step (``plan_copy``): replaying a source's
log in arbitrary Fetch-sized chunks gives the destination exactly the source's state at its seal
— never what the source did after it (its clean-up deletes the moved keys once the zone flipped;
design/resharding.md)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.data.partitioning import SEAL_KEY
from replica.data import follower
from replica.data.control import Cursor, Seal
from replica.data.follower import TokenBucket
from replica.data.model import FetchOutcome, FetchReply
from replica.data.resharding import plan_copy
from replica.data.storage import Entry

KEYS = [b"a", b"b", b"c", b"d"]

writes = st.lists(
    st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), st.binary(min_size=1, max_size=3))),
    max_size=30,
)


def source_log(before: list[tuple[bytes, bytes | None]]) -> tuple[list[Entry], int]:
    """The source's log: the client writes, its seal, then the purge deleting every key (what
    the source writes once the zone flipped); returns it and the seal's index."""
    log: list[Entry] = []
    for key, value in before:
        log.append(Entry(len(log) + 1, 1, key, value or b"", value is None))
    seal = Seal(7, 4, 8).encode()
    log.append(Entry(len(log) + 1, 1, SEAL_KEY, seal))
    sealed_at = len(log)
    for key in KEYS:
        log.append(Entry(len(log) + 1, 1, key, b"", True))
    log.append(Entry(len(log) + 1, 1, SEAL_KEY, b"", True))
    return log, sealed_at


def state_of(entries: list[Entry]) -> dict[bytes, bytes]:
    state: dict[bytes, bytes] = {}
    for e in entries:
        if e.key == SEAL_KEY:
            continue
        if e.delete:
            state.pop(e.key, None)
        else:
            state[e.key] = e.value
    return state


@given(writes, st.lists(st.integers(1, 8), min_size=1, max_size=40))
def test_the_copy_holds_the_source_at_its_seal_and_never_its_purge(
    before: list[tuple[bytes, bytes | None]], chunks: list[int]
) -> None:
    log, sealed_at = source_log(before)
    cursor = Cursor(7, snapshot=False, base=0, index=0)
    destination: dict[bytes, bytes] = {}
    sizes = iter(chunks * (len(log) + 1))
    while True:
        start = cursor.index
        chunk = log[start : start + next(sizes)]  # entries after the cursor, as Fetch sends them
        reply = FetchReply(
            FetchOutcome.OK,
            entries=tuple(chunk),
            commit_index=len(log),
            scanned_to=chunk[-1].index if chunk else start,
        )
        changes, after, lag = plan_copy(cursor, reply)
        for key, value in changes:
            if value is None:
                destination.pop(key, None)
            else:
                destination[key] = value
        assert after.index <= sealed_at, "the cursor passed the seal"
        if after == cursor:
            break
        cursor = after
    assert cursor.drained
    assert cursor.index == cursor.seal_bound == sealed_at
    assert lag == 0
    assert destination == state_of(log[:sealed_at])


def test_a_snapshot_page_with_the_seal_bounds_the_log_replay_after_it() -> None:
    page = FetchReply(
        FetchOutcome.OK,
        items=((b"a", b"1"), (SEAL_KEY, Seal(7, 4, 8).encode())),
        snapshot_done=True,
        snapshot_index=5,
        commit_index=9,
        scanned_after=SEAL_KEY,
    )
    changes, cursor, lag = plan_copy(Cursor(7), page)
    assert changes == [(b"a", b"1")]
    assert (cursor.snapshot, cursor.base, cursor.index, cursor.seal_bound) == (False, 5, 5, 5)
    assert lag is None
    assert cursor.drained
    tail = FetchReply(
        FetchOutcome.OK,
        entries=(Entry(6, 1, b"a", b"", True),),  # after the seal: the purge
        commit_index=9,
        scanned_to=9,
    )
    changes, after, lag = plan_copy(cursor, tail)
    assert (changes, after, lag) == ([], cursor, 0)


async def test_the_throttle_charges_now_and_says_how_long_to_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``charge`` takes the bytes at once and returns the wait (a copy waits it out itself,
    cut short by SEAL); ``take`` sleeps it."""
    now = [0.0]
    bucket = TokenBucket(1000, clock=lambda: now[0])
    assert bucket.charge(1000) == 0.0  # the one-second burst
    assert bucket.charge(500) == 0.5  # 500 over: half a second
    now[0] = 0.5
    assert bucket.charge(0) == 0.0  # paid back by the time passed
    slept: list[float] = []

    async def record(delay: float) -> None:
        slept.append(delay)

    monkeypatch.setattr(follower.asyncio, "sleep", record)
    await bucket.take(250)
    assert slept == [0.25]
    assert TokenBucket(0).charge(10**9) == 0.0  # unlimited
