"""The layout transitions of re-sharding (design/resharding.md) against REAL etcd and a model.

Hypothesis drives random sequences of: operators changing the zone's partition count the way the
API does (read config and layout at one revision, :func:`check_alter`, ``update_zone`` comparing
both), drivers taking the next re-sharding step the way the leader does (:func:`next_step` on a
read, ``write_layout`` comparing the layout and the config), each deciding either on a fresh read
or on a read up to several steps **stale**, and writers whose term ended. A stale decision must be
caught by the compares and written nowhere.

After every step etcd (values and mod revisions of the config and the layout) equals the model,
in which a write applies exactly when what it was decided on is still current, and:

* a flip (the generation grows) happens only from SEAL, by one, to the target count, while the
  config does not ask for the source count (an abort the API accepted is never overridden);
* an abort happens only before the flip, while the config asks for the source count;
* the config never asks for a count the layout forbids: before the flip only the source or the
  target, from the flip on (CLEANUP) only the target, while aborting only the source.

The mutation check (design/resharding.md, "Every transaction") removes each compare in turn.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import event as hypothesis_event
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from placement.core.layout import (
    BEFORE_FLIP,
    ReshardFacts,
    ReshardPhase,
    ReshardRunning,
    ZoneLayout,
    check_alter,
    next_step,
)
from placement.core.model import ZoneSpec
from placement.errors import NotLeader
from placement.metastore.codec import LayoutValue
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeySpace
from placement.metastore.store import Metastore
from placement.metastore.transitions import Fence, ZoneRecord

pytestmark = pytest.mark.integration

T = TypeVar("T")
COUNTS = (4, 8, 16, 5)
HISTORY = 6


@dataclass
class Model:
    partitions: int
    zone_mod: int
    created: int
    layout: ZoneLayout | None = None
    layout_mod: int = 0


@dataclass
class Ctx:
    loop: asyncio.AbstractEventLoop
    client: EtcdClient
    keys: KeySpace
    zones: itertools.count[int] = field(default_factory=itertools.count)
    stats: Counter[str] = field(default_factory=Counter)


#: -1: a fresh read; k: the read of k reads ago (stale unless nothing was written since).
observations = st.sampled_from([-1, -1, -1, -1, 0, 1, 2, HISTORY - 1])
#: A writer whose term ended, now and then.
deposed = st.integers(0, 7).map(lambda x: x == 0)
facts = st.builds(
    ReshardFacts,
    st.booleans() | st.just(True),
    st.booleans() | st.just(True),
    st.booleans() | st.just(True),
    st.booleans() | st.just(True),
)


class LayoutMachine(RuleBasedStateMachine):
    def __init__(self, ctx: Ctx) -> None:
        super().__init__()
        self.ctx = ctx
        self.store = Metastore(ctx.client, ctx.keys)
        self.zone = f"z{next(ctx.zones)}"
        self.leader_key = ctx.keys.leader(f"m-{self.zone}")
        self.fences: list[Fence] = []
        self.seen: list[ZoneRecord] = []
        self.model: Model | None = None
        self.ts = 0

    def run(self, coro: Awaitable[T]) -> T:
        return self.ctx.loop.run_until_complete(coro)

    def event(self, what: str) -> None:
        hypothesis_event(what)
        self.ctx.stats[what] += 1

    def read(self) -> ZoneRecord:
        found = self.run(self.store.get_zone(self.zone))
        assert found is not None
        self.seen.append(found)
        del self.seen[:-HISTORY]
        return found

    def observed(self, choice: int) -> ZoneRecord:
        if choice < 0 or not self.seen:
            return self.read()
        return self.seen[-1 - min(choice, len(self.seen) - 1)]

    def fence(self, old: bool) -> Fence:
        return self.fences[0] if old and len(self.fences) > 1 else self.fences[-1]

    @initialize(partitions=st.sampled_from(COUNTS))
    def create(self, partitions: int) -> None:
        epoch = self.run(self.ctx.client.put(self.leader_key, b"leader"))
        self.fences.append(Fence(self.leader_key, epoch))
        spec = ZoneSpec(self.zone, partitions, 3)
        written = self.run(self.store.create_zone(spec, self.fences[-1]))
        assert written.applied
        self.model = Model(partitions, written.revision, written.revision)
        self.read()

    @rule()
    def depose(self) -> None:
        """A new term: the leader key deleted and created again (a new create revision)."""
        self.run(self.ctx.client.delete(self.leader_key))
        epoch = self.run(self.ctx.client.put(self.leader_key, b"leader"))
        self.fences.append(Fence(self.leader_key, epoch))

    @rule(requested=st.sampled_from(COUNTS), seen=observations, old=deposed)
    def alter(self, requested: int, seen: int, old: bool) -> None:
        """The API's AlterZone of the partition count, decided on ``seen``."""
        m = self.model
        assert m is not None
        obs = self.observed(seen)
        assert isinstance(obs.spec, ZoneSpec)
        layout = obs.layout.layout if isinstance(obs.layout, LayoutValue) else None
        stale = (obs.mod_revision, obs.layout_revision) != (m.zone_mod, m.layout_mod)
        try:
            check_alter(layout, self.zone, obs.spec.partitions, requested)
        except ReshardRunning:
            self.event("alter: refused (a reshard runs)")
            return
        fence = self.fence(old)
        spec = replace(obs.spec, partitions=requested)
        call = self.store.update_zone(spec, obs.mod_revision, fence, obs.layout_revision)
        if fence is not self.fences[-1]:
            with pytest.raises(NotLeader):
                self.run(call)
            self.event("alter: deposed writer")
            return
        written = self.run(call)
        assert written.applied is not stale, (written, stale)
        self.event(f"alter: {'lost a compare (stale read)' if stale else 'applied'}")
        if written.applied:
            m.partitions, m.zone_mod = requested, written.revision

    @rule(seen_facts=facts, seen=observations, old=deposed)
    def drive(self, seen_facts: ReshardFacts, seen: int, old: bool) -> None:
        """The leader's layout step, decided on ``seen`` with the facts it gathered."""
        m = self.model
        assert m is not None
        obs = self.observed(seen)
        assert isinstance(obs.spec, ZoneSpec)
        layout = obs.layout.layout if isinstance(obs.layout, LayoutValue) else None
        t = next_step(
            layout,
            obs.spec.partitions,
            seen_facts,
            wanted_revision=obs.mod_revision,
            created_revision=obs.create_revision,
        )
        if t is None:
            return
        stale = (obs.mod_revision, obs.layout_revision) != (m.zone_mod, m.layout_mod)
        fence = self.fence(old)
        self.ts += 1
        call = self.store.write_layout(
            self.zone, t.layout, obs.layout_revision, obs.mod_revision, fence, self.ts
        )
        if fence is not self.fences[-1]:
            with pytest.raises(NotLeader):
                self.run(call)
            self.event(f"{t.step}: deposed writer")
            return
        revision = self.run(call)
        assert (revision > 0) is not stale, (t, stale)
        self.event(f"{t.step}: {'lost a compare (stale read)' if stale else 'applied'}")
        if revision:
            self._check_transition(m, t.layout)
            m.layout, m.layout_mod = t.layout, revision

    @rule(
        first=st.sampled_from(["alter", "drive"]),
        second=st.sampled_from(["alter", "drive"]),
        requested=st.sampled_from(COUNTS),
        seen_facts=facts,
    )
    def race(self, first: str, second: str, requested: int, seen_facts: ReshardFacts) -> None:
        """Two writers read the same state; the first writes, the second decides on what both
        read: its compares must refuse whatever the first changed (the config or the layout)."""
        self.read()
        for op, seen in ((first, -1), (second, 1)):  # 1: the read both made (one read since)
            if op == "alter":
                self.alter(requested, seen, False)
            else:
                self.drive(seen_facts, seen, False)

    @rule(steps=st.integers(1, 4))
    def drive_on(self, steps: int) -> None:
        """A leader that sees every fact hold, on fresh reads: drives the reshard forward."""
        for _ in range(steps):
            self.drive(ReshardFacts(True, True, True, True), -1, False)

    def _check_transition(self, m: Model, after: ZoneLayout) -> None:
        before = m.layout
        if before is None:
            assert after.generation == m.created
            return
        r = before.reshard
        if after.generation != before.generation:
            assert r is not None
            assert r.phase is ReshardPhase.SEAL, "flipped from a phase other than SEAL"
            assert after.generation == before.generation + 1
            assert after.partitions == r.target
            assert m.partitions != r.source, "flipped although the config asks for an abort"
        if after.reshard is not None and after.reshard.phase is ReshardPhase.ABORT:
            assert r is not None
            assert r.phase in BEFORE_FLIP or r.phase is ReshardPhase.ABORT
            assert m.partitions == r.source, "aborted although the config does not ask for it"

    @invariant()
    def etcd_equals_the_model_and_the_config_fits_the_layout(self) -> None:
        m = self.model
        if m is None:
            return
        now = self.run(self.store.get_zone(self.zone))
        assert now is not None
        assert isinstance(now.spec, ZoneSpec)
        assert (now.spec.partitions, now.mod_revision) == (m.partitions, m.zone_mod)
        layout = now.layout.layout if isinstance(now.layout, LayoutValue) else now.layout
        assert (layout, now.layout_revision) == (m.layout, m.layout_mod)
        r = m.layout.reshard if m.layout is not None else None
        if r is None:
            return
        if r.phase in BEFORE_FLIP:
            assert m.partitions in (r.source, r.target), "a third count during a reshard"
        elif r.phase is ReshardPhase.CLEANUP:
            assert m.partitions == r.target, "the count changed during clean-up"
        else:
            assert m.partitions == r.source, "the count changed while aborting"


def test_layout_transitions_match_the_model(etcd: Any, prefix: str) -> None:
    loop = asyncio.new_event_loop()
    client = EtcdClient([etcd.endpoint], call_timeout=10.0)
    ctx = Ctx(loop, client, KeySpace(prefix))
    try:
        run_state_machine_as_test(
            lambda: LayoutMachine(ctx),
            settings=settings(
                max_examples=150,
                stateful_step_count=25,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    finally:
        loop.run_until_complete(client.close())
        loop.close()
    print("\n".join(f"{n:6d}  {what}" for what, n in sorted(ctx.stats.items())))
    for needed in ("begin: applied", "flip: applied", "abort: applied", "finish: applied"):
        assert ctx.stats[needed], f"the run never reached {needed!r}: {dict(ctx.stats)}"
    assert ctx.stats["alter: refused (a reshard runs)"]
    assert any("lost a compare" in what for what in ctx.stats)
