"""The destination side of a re-sharding copy as a pure step (``plan_copy``): replaying a source's
log in arbitrary Fetch-sized chunks gives the destination exactly the source's state at its seal
— never what the source did after it (its clean-up deletes the moved keys once the zone flipped;
design/resharding.md)."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from placement.data.partitioning import SEAL_KEY
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


def test_the_throttle_charges_now_and_says_how_long_it_is_in_debt() -> None:
    now = [0.0]
    bucket = TokenBucket(1000, clock=lambda: now[0])
    assert bucket.charge(1000) == 0.0  # the one-second burst
    assert bucket.charge(500) == 0.5  # 500 over: half a second
    now[0] = 0.25
    assert bucket.debt() == 0.25
    now[0] = 0.5
    assert bucket.charge(0) == 0.0  # paid back by the time passed
    assert TokenBucket(0).charge(10**9) == 0.0  # unlimited


async def test_pullers_take_turns_so_the_burst_is_a_few_pages_however_many_pull() -> None:
    """20 pullers of 300-byte pages on a 1000 B/s bucket with 2 turns: never more than 2
    fetches in flight, none starts while the bucket is in debt, so the bytes moved by any
    time t stay within rate * t + the one-second burst + 2 pages — charging after the fetch
    alone let all 20 take their first page at once (6000 bytes at t = 0)."""
    now = [0.0]
    bucket = TokenBucket(1000, clock=lambda: now[0], turns=2)
    moved: list[tuple[float, int]] = []
    in_flight = [0, 0]  # now, most

    async def pause(delay: float) -> None:
        now[0] += delay
        await asyncio.sleep(0)

    async def puller() -> None:
        for _ in range(3):
            async with bucket.turn(pause):
                in_flight[0] += 1
                in_flight[1] = max(in_flight[1], in_flight[0])
                assert bucket.debt() == 0.0, "a turn started while the bucket was in debt"
                await asyncio.sleep(0)  # the fetch
                moved.append((now[0], 300))
                bucket.charge(300)
                in_flight[0] -= 1

    await asyncio.gather(*(puller() for _ in range(20)))
    assert in_flight[1] == 2
    total = 0
    for t, size in sorted(moved):
        total += size
        assert total <= 1000 * t + 1000 + 2 * 300 + 1, (t, total)  # + 1: float rounding
    assert total == 20 * 3 * 300


async def test_a_hurried_puller_skips_the_turn_and_the_debt() -> None:
    bucket = TokenBucket(1000, clock=lambda: 0.0, turns=1)
    bucket.charge(10_000)  # ten seconds in debt

    async def never(delay: float) -> None:
        raise AssertionError("a hurried puller waited")

    # Two at once with one turn: a hurried puller takes no turn either.
    async with bucket.turn(never, hurry=lambda: True), bucket.turn(never, hurry=lambda: True):
        pass


async def test_a_log_tail_fetch_takes_no_turn_but_waits_out_the_debt() -> None:
    """With every turn held by a snapshot page, a log tail (``page=False``) still starts —
    after the bucket's debt, not after the pages (a copy's tail poll queued behind 80 polls
    held the cut-over for 1-2 s)."""
    now = [0.0]
    bucket = TokenBucket(1000, clock=lambda: now[0], turns=1)
    waited: list[float] = []

    async def pause(delay: float) -> None:
        waited.append(delay)
        now[0] += delay

    held = asyncio.Event()
    release = asyncio.Event()

    async def page() -> None:
        async with bucket.turn(pause):
            held.set()
            await release.wait()

    holder = asyncio.create_task(page())
    await held.wait()
    bucket.charge(1500)  # half a second in debt
    async with bucket.turn(pause, page=False):
        assert waited == [0.5]
        assert not holder.done()  # the page still holds the only turn
    release.set()
    await holder
