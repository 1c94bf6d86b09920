"""placement.aio's batching and byte budget: the Coalescer flushes what arrives during a flush
together, keeps two items of one key apart and hands every submitter its own result or the
batch's error; the ByteBudget never lets more than its capacity in flight, admits in order and
admits a piece larger than the whole budget alone."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.aio import ByteBudget, Coalescer, Pulse, wait_event


async def test_items_submitted_during_a_flush_go_out_together_in_the_next() -> None:
    batches: list[list[int]] = []
    release = asyncio.Event()

    async def flush(items: list[int]) -> list[int]:
        batches.append(items)
        if len(batches) == 1:
            await release.wait()
        return [i * 10 for i in items]

    coalescer: Coalescer[int, int] = Coalescer(flush, limit=100, name="t")
    first = asyncio.ensure_future(coalescer.submit(0))
    await asyncio.sleep(0)
    rest = [asyncio.ensure_future(coalescer.submit(i)) for i in range(1, 51)]
    await asyncio.sleep(0)
    release.set()
    assert await first == 0
    assert await asyncio.gather(*rest) == [i * 10 for i in range(1, 51)]
    assert batches == [[0], list(range(1, 51))]
    assert (coalescer.flushes, coalescer.items) == (2, 51)


async def test_a_batch_keeps_its_size_bound_and_a_larger_item_goes_alone_in_order() -> None:
    batches: list[list[int]] = []

    async def flush(items: list[int]) -> list[int]:
        batches.append(items)
        await asyncio.sleep(0)
        return items

    coalescer: Coalescer[int, int] = Coalescer(
        flush, limit=100, name="t", size=lambda n: n, max_size=10
    )
    sizes = [1, 4, 5, 3, 25, 2, 9, 1, 1]
    assert await asyncio.gather(*(coalescer.submit(n) for n in sizes)) == sizes
    assert [n for b in batches for n in b] == sizes  # nothing overtaken
    for batch in batches:
        assert len(batch) == 1 or sum(batch) <= 10
    assert [25] in batches
    with pytest.raises(ValueError, match="max_size"):
        Coalescer(flush, limit=1, name="t", size=len)


async def test_a_batch_keeps_the_limit_and_one_item_per_key_and_shares_its_error() -> None:
    batches: list[list[tuple[str, int]]] = []

    async def flush(items: list[tuple[str, int]]) -> list[int]:
        batches.append(items)
        await asyncio.sleep(0)
        if ("bad", 0) in items:
            raise ValueError("the batch failed")
        return [n for _, n in items]

    coalescer: Coalescer[tuple[str, int], int] = Coalescer(
        flush, limit=3, name="t", key=lambda item: item[0]
    )
    items = [("a", 1), ("a", 2), ("b", 3), ("c", 4), ("d", 5), ("bad", 0)]
    results = await asyncio.gather(*(coalescer.submit(i) for i in items), return_exceptions=True)
    assert all(len(b) <= 3 for b in batches)
    assert all(len({k for k, _ in b}) == len(b) for b in batches)  # a key once per batch
    # a's two items in submission order, in different batches
    assert [i for b in batches for i in b if i[0] == "a"] == [("a", 1), ("a", 2)]
    failed = next(b for b in batches if ("bad", 0) in b)
    for item, result in zip(items, results, strict=True):
        if item in failed:
            assert isinstance(result, ValueError)
        else:
            assert result == item[1]
    await coalescer.close()


async def test_a_cancelled_submitter_does_not_cancel_the_batch_of_the_others() -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def flush(items: list[int]) -> list[int]:
        started.set()
        await release.wait()
        return items

    coalescer: Coalescer[int, int] = Coalescer(flush, limit=10, name="t")
    one = asyncio.ensure_future(coalescer.submit(1))
    two = asyncio.ensure_future(coalescer.submit(2))
    await started.wait()
    one.cancel()
    release.set()
    assert await two == 2
    with pytest.raises(asyncio.CancelledError):
        await one


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 100),
    pieces=st.lists(st.integers(0, 150), min_size=1, max_size=30),
    seed=st.integers(0, 1000),
)
def test_the_budget_is_never_exceeded_and_admits_in_order(
    capacity: int, pieces: list[int], seed: int
) -> None:
    async def run() -> None:
        budget = ByteBudget(capacity)
        admitted: list[int] = []
        rng = random.Random(seed)

        async def work(i: int, amount: int) -> None:
            async with budget.hold(amount):
                admitted.append(i)
                # alone, or within the capacity
                assert budget.in_flight <= capacity
                for _ in range(rng.randint(0, 3)):
                    await asyncio.sleep(0)

        await asyncio.gather(*(work(i, a) for i, a in enumerate(pieces)))
        assert admitted == list(range(len(pieces)))  # first come, first served
        assert budget.in_flight == 0
        assert budget.peak <= capacity

    asyncio.run(run())


async def test_a_waiter_cancelled_in_the_queue_lets_the_next_in() -> None:
    budget = ByteBudget(10)
    order: list[str] = []
    async with budget.hold(8):
        big = asyncio.ensure_future(_hold(budget, 9, order, "big"))
        small = asyncio.ensure_future(_hold(budget, 2, order, "small"))
        await asyncio.sleep(0)
        assert order == []  # small waits behind big: no overtaking
        big.cancel()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert order == ["small"]  # big gone: small fits beside the 8 held
    await small
    assert budget.in_flight == 0


async def _hold(budget: ByteBudget, amount: int, order: list[str], name: str) -> None:
    async with budget.hold(amount):
        order.append(name)


async def test_a_pulse_wakes_every_waiter_of_its_round_and_none_sleeps_through_a_fire() -> None:
    """Waiters that took the round before a fire all wake; one that takes it after waits for
    the next fire; a round taken before a fire that happens before the wait starts is still
    set (the look-then-wait race a cleared event would lose)."""
    pulse = Pulse()
    early = pulse.round
    waiters = [asyncio.ensure_future(pulse.round.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    pulse.fire()
    await asyncio.wait_for(asyncio.gather(*waiters), 1)
    assert early.is_set()  # taken before the fire, waited on after it: not missed
    late = pulse.round
    assert not late.is_set()
    assert not await wait_event(late, 0.05)
    pulse.fire()
    assert await wait_event(late, 0.05)
