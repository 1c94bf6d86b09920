"""placement.driver.liveness: which lease holders answer. Probes only nodes not heard from within
``fresh``; a node that does not answer is silent for ``hold`` (the same frozenset object while
nothing changes, so kept plans stay valid); an unknown address is silent without a probe."""

from __future__ import annotations

import asyncio

from placement.driver.liveness import Liveness


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_probes_only_what_is_not_fresh_and_holds_silence() -> None:
    up = {"a:1": True, "b:1": False}
    asked: list[str] = []

    async def probe(address: str, within: float) -> bool:
        asked.append(address)
        assert within == 0.5
        return up[address]

    clock = Clock()
    live = Liveness(probe, fresh=1.0, timeout=0.5, hold=2.0, clock=clock)
    nodes = {"a": "a:1", "b": "b:1", "c": ""}
    assert await live.check(nodes) == {"b", "c"}
    assert sorted(asked) == ["a:1", "b:1"]  # no address: silent, never probed
    silent = live.silent()
    assert silent == {"b", "c"}
    assert live.silent() is silent
    clock.now += 0.5
    asked.clear()
    assert await live.check(nodes) == {"b", "c"}  # a answered 0.5 s ago: not asked again
    assert asked == ["b:1"]
    up["b:1"] = True
    clock.now += 0.6
    asked.clear()
    assert await live.check(nodes) == {"c"}
    assert sorted(asked) == ["a:1", "b:1"]
    assert live.silent() == {"c"}
    clock.now += 2.1
    assert live.silent() == frozenset()  # c's hold is over: the next pass may plan for it
    up["b:1"] = False
    assert await live.check(nodes) == {"b", "c"}
    live.forget({"a": object(), "c": object()})  # b's node record is gone
    assert live.silent() == {"c"}


async def test_fails_open_when_no_agent_answers_and_shares_a_probe_in_flight() -> None:
    calls: list[str] = []
    gate = asyncio.Event()
    up = {"a:1": False, "b:1": False}

    async def probe(address: str, within: float) -> bool:
        calls.append(address)
        await gate.wait()
        return up[address]

    clock = Clock()
    live = Liveness(probe, fresh=1.0, hold=1.0, open_after=15.0, clock=clock)
    # two zones' rounds at once: one probe per node
    first = asyncio.ensure_future(live.check({"a": "a:1", "b": "b:1"}))
    second = asyncio.ensure_future(live.check({"b": "b:1"}))
    await asyncio.sleep(0)
    gate.set()
    # nobody has ever answered: the fault is on this side, nothing is withheld
    assert await first == frozenset()
    assert await second == frozenset()
    assert sorted(calls) == ["a:1", "b:1"]
    assert live.failed_open == 2
    assert live.silent() == frozenset()  # passes plan for them as before the check
    assert live.silence_ends_in() is None
    up["a:1"] = True
    clock.now += 1.5
    assert await live.check({"a": "a:1", "b": "b:1"}) == {"b"}  # a answers: b is really gone
    assert live.failed_open == 2
    assert live.silence_ends_in() == 1.0
    clock.now += 16
    assert await live.check({"b": "b:1"}) == frozenset()  # a last answered 16 s ago
    assert live.failed_open == 3
