"""placement.driver.liveness: which lease holders answer. Probes only nodes not heard from within
``fresh``; a node that does not answer is silent for ``hold`` (the same frozenset object while
nothing changes, so kept plans stay valid); an unknown address is silent without a probe."""

from __future__ import annotations

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
