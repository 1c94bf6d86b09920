"""The stable/pending/planned/cancel protocol (design/metastore.md) against REAL etcd and a model.

Hypothesis drives random sequences of: triggers with newer, equal and older revisions (targets from
a few small peer sets, including a re-ordering), finish / cancel / finish_cancel for the current and
for old pending revisions, batched triggers, a pending deleted out of band (written again by a
trigger at the same revision unless a cancel holds the partition), and writes under a deposed
epoch (the leader key
deleted and re-created, or absent). Operations are decided either on a fresh read or on an
**old observed state** (up to several steps stale), and the ``race`` rule runs two writers on one
in-flight rebalance where the second decides on the state both saw before the first wrote. That is
what exercises the compares: a stale decision must be caught by them and re-made, never written.

After every step etcd's state (values and mod revisions) must equal the model's, and:

* stable changes only from pending: the new stable's peers/trigger are the pending's just before;
* planned exists only with pending; cancel exists only with pending and names its revision;
* stale triggers, stale finishes and deposed writers change nothing (full state incl. mod
  revisions compared before/after).

The model below is written from the rules, independently of the metastore's planners.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Awaitable, Callable
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

from placement.core.model import Peers
from placement.errors import NotLeader
from placement.metastore.codec import Assignment, CancelIntent, TriggerMark
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import AssignField, KeySpace
from placement.metastore.store import Metastore
from placement.metastore.transitions import (
    Fence,
    Outcome,
    PartitionState,
    TransitionResult,
    ZoneState,
)

pytestmark = pytest.mark.integration

T = TypeVar("T")

PEER_SETS: list[Peers] = [("a", "b", "c"), ("b", "c", "d"), ("a", "c", "d"), ("c", "b", "a")]
INITIAL: Peers = PEER_SETS[0]
PARTITIONS = (0, 1)
HISTORY = 8
F = AssignField

# -- the model -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MKey:
    value: object
    mod: int


@dataclass
class MPartition:
    keys: dict[AssignField, MKey] = field(default_factory=dict)

    def get(self, f: AssignField) -> MKey | None:
        return self.keys.get(f)

    def peers(self, f: AssignField) -> Peers | None:
        k = self.keys.get(f)
        return None if k is None else k.value.peers  # type: ignore[attr-defined,no-any-return]


Writes = dict[AssignField, object | None]  # None = delete


@dataclass(frozen=True)
class Expect:
    outcome: Outcome
    writes: Writes


def _restamp(value: object, epoch: int, ts: int) -> Assignment:
    assert isinstance(value, Assignment)
    return replace(value, epoch=epoch, ts=ts)


def model_trigger(m: MPartition, target: Peers, rev: int, epoch: int, ts: int) -> Expect:
    stored = m.get(F.TRIGGER)
    new = Assignment(target, epoch, ts, rev)
    if stored is not None and rev <= stored.value.revision:  # type: ignore[attr-defined]
        mark = stored.value
        assert isinstance(mark, TriggerMark)
        idle = all(m.get(f) is None for f in (F.PENDING, F.PLANNED, F.CANCEL))
        if rev == mark.revision and not mark.held and idle and m.peers(F.STABLE) != target:
            return Expect(Outcome.APPLIED, {F.PENDING: new})  # a lost pending, written again
        return Expect(Outcome.STALE_TRIGGER, {})
    writes: Writes = {F.TRIGGER: TriggerMark(rev, epoch, ts)}
    if m.get(F.PENDING) is None:
        if m.peers(F.STABLE) != target:
            writes[F.PENDING] = new
    elif m.get(F.CANCEL) is not None:
        writes[F.PLANNED] = new  # the cancel may end on old or new: the target must survive it
    elif m.peers(F.PENDING) == target:
        if m.get(F.PLANNED) is not None:
            writes[F.PLANNED] = None
    else:
        writes[F.PLANNED] = new
    return Expect(Outcome.APPLIED, writes)


def model_finish(m: MPartition, rev: int, epoch: int, ts: int) -> Expect:
    pending = m.get(F.PENDING)
    if pending is None or pending.mod != rev:
        return Expect(Outcome.STALE, {})
    if m.get(F.CANCEL) is not None:
        return Expect(Outcome.CANCELLED, {})
    planned = m.get(F.PLANNED)
    writes: Writes = {F.STABLE: _restamp(pending.value, epoch, ts)}
    if planned is not None:
        writes[F.PENDING] = _restamp(planned.value, epoch, ts)
        writes[F.PLANNED] = None
    else:
        writes[F.PENDING] = None
    return Expect(Outcome.APPLIED, writes)


def model_cancel(m: MPartition, rev: int, epoch: int, ts: int) -> Expect:
    pending = m.get(F.PENDING)
    if pending is None or pending.mod != rev:
        return Expect(Outcome.STALE, {})
    if m.get(F.CANCEL) is not None:
        return Expect(Outcome.APPLIED, {})
    old, new = m.peers(F.STABLE), m.peers(F.PENDING)
    assert old is not None
    assert new is not None
    return Expect(Outcome.APPLIED, {F.CANCEL: CancelIntent(old, new, rev, epoch, ts)})


def model_finish_cancel(m: MPartition, rev: int, done: bool, epoch: int, ts: int) -> Expect:
    pending = m.get(F.PENDING)
    if pending is None or pending.mod != rev or m.get(F.CANCEL) is None:
        return Expect(Outcome.STALE, {})
    planned = m.get(F.PLANNED)
    writes: Writes = {F.CANCEL: None}
    if done:
        writes[F.STABLE] = _restamp(pending.value, epoch, ts)
    else:  # held where the cancel left it until a newer trigger
        mark = m.get(F.TRIGGER)
        assert mark is not None
        assert isinstance(mark.value, TriggerMark)
        writes[F.TRIGGER] = replace(mark.value, epoch=epoch, ts=ts, held=True)
    if planned is not None:
        writes[F.PENDING] = _restamp(planned.value, epoch, ts)
        writes[F.PLANNED] = None
    else:
        writes[F.PENDING] = None
    return Expect(Outcome.APPLIED, writes)


def apply_writes(m: MPartition, writes: Writes, revision: int) -> None:
    for f, value in writes.items():
        if value is None:
            m.keys.pop(f, None)
        else:
            m.keys[f] = MKey(value, revision)


# -- helpers ---------------------------------------------------------------------------------------


def snapshot(s: PartitionState) -> dict[AssignField, tuple[object, int]]:
    """Everything etcd holds for a partition except the read revision: values and mod revisions."""
    out = {}
    for f in AssignField:
        entry = s.entry(f)
        if entry is not None:
            out[f] = (entry.value, entry.mod_revision)
    return out


def model_snapshot(m: MPartition) -> dict[AssignField, tuple[object, int]]:
    return {f: (k.value, k.mod) for f, k in m.keys.items()}


@dataclass
class Ctx:
    loop: asyncio.AbstractEventLoop
    client: EtcdClient
    keys: KeySpace
    zones: itertools.count[int] = field(default_factory=itertools.count)
    stats: Counter[str] = field(default_factory=Counter)


observations = st.integers(-1, HISTORY - 1)  # -1: read fresh inside; k: the state seen k steps ago
fence_choice = st.integers(0, 9)  # 0..7: the current fence; 8, 9: an older one (if any)
partitions = st.sampled_from(PARTITIONS)
revision_choice = st.sampled_from(["current", "current", "current", "old"])
OPS = ["trigger", "finish", "cancel", "finish_cancel"]
RACE_PAIRS = [(first, second) for first in [*OPS, "cycle"] for second in OPS] + [
    ("cycle", "trigger"),  # the ABA of "no pending": weighted up
    ("trigger", "trigger"),
]
#: Trigger targets in races: "the stable/pending the writer saw" (twice as likely), or a peer set.
AIMS = ["=stable", "=pending", "=stable", "=pending", *(str(i) for i in range(len(PEER_SETS)))]


class ProtocolMachine(RuleBasedStateMachine):
    def __init__(self, ctx: Ctx) -> None:
        super().__init__()
        self.ctx = ctx
        self.store = Metastore(ctx.client, ctx.keys)
        self.zone = f"z{next(ctx.zones)}"
        self.leader_key = ctx.keys.leader(f"m-{self.zone}")
        self.fences: list[Fence] = []
        self.leader_epoch: int | None = None
        self.model: dict[int, MPartition] = {p: MPartition() for p in PARTITIONS}
        self.seen: dict[int, list[PartitionState]] = {p: [] for p in PARTITIONS}
        self.pending_revisions: dict[int, list[int]] = {p: [] for p in PARTITIONS}
        self.step = 0

    def event(self, what: str) -> None:
        hypothesis_event(what)
        self.ctx.stats[what] += 1

    def run(self, coro: Awaitable[T]) -> T:
        return self.ctx.loop.run_until_complete(coro)

    # -- setup and leadership ----------------------------------------------------------------

    @initialize()
    def create(self) -> None:
        epoch = self.run(self.ctx.client.put(self.leader_key, b"leader"))
        self.leader_epoch = epoch
        self.fences.append(Fence(self.leader_key, epoch))
        result = self.run(
            self.store.create_partitions(
                self.zone, dict.fromkeys(PARTITIONS, INITIAL), 1, self.fences[-1], ts=0
            )
        )
        assert result.created == PARTITIONS
        revision = result.txns[-1].revision
        for p in PARTITIONS:
            apply_writes(
                self.model[p],
                {F.STABLE: Assignment(INITIAL, epoch, 0, 1), F.TRIGGER: TriggerMark(1, epoch, 0)},
                revision,
            )
        self.check_all()

    @rule(gap=st.booleans(), peers=st.sampled_from(PEER_SETS))
    def depose(self, gap: bool, peers: Peers) -> None:
        """A new term: the leader key deleted and created again (same key, new create revision).

        With ``gap``, a write is attempted while there is no leader key at all: it must fail.
        """
        self.run(self.ctx.client.delete(self.leader_key))
        self.leader_epoch = None
        if gap:
            self.step += 1
            stored = self.model[0].get(F.TRIGGER)
            assert stored is not None
            rev = stored.value.revision + 1  # type: ignore[attr-defined]
            fence = self.fences[-1]
            self.execute(
                "trigger (no leader)",
                0,
                fence,
                model_trigger(self.model[0], peers, rev, fence.epoch, self.step),
                lambda: self.store.trigger(self.zone, 0, peers, rev, fence, self.step),
                None,
            )
        epoch = self.run(self.ctx.client.put(self.leader_key, b"leader"))
        self.leader_epoch = epoch
        self.fences.append(Fence(self.leader_key, epoch))

    # -- transitions ---------------------------------------------------------------------------

    def fence(self, choice: int) -> Fence:
        if choice >= 8 and len(self.fences) > 1:
            return self.fences[-1 - min(choice - 7, len(self.fences) - 1)]
        return self.fences[-1]

    def observed(self, p: int, choice: int) -> PartitionState | None:
        if choice < 0 or not self.seen[p]:
            return None
        return self.seen[p][-1 - min(choice, len(self.seen[p]) - 1)]

    def pending_revision(self, p: int, which: str, idx: int) -> int:
        pending = self.model[p].get(F.PENDING)
        if which == "current" and pending is not None:
            return pending.mod
        old = self.pending_revisions[p]
        return old[idx % len(old)] if old else 1

    def execute(
        self,
        name: str,
        p: int,
        fence: Fence,
        expect: Expect,
        call: Callable[[], Awaitable[TransitionResult]],
        observed: PartitionState | None,
    ) -> None:
        self.step += 1
        before = self.run(self.store.read_partition(self.zone, p))
        stale = observed is not None and snapshot(observed) != snapshot(before)
        if fence.epoch != self.leader_epoch:
            self.event(f"{name}: deposed writer{' (stale observation)' if stale else ''}")
            with pytest.raises(NotLeader):
                self.run(call())
            after = self.run(self.store.read_partition(self.zone, p))
            assert snapshot(after) == snapshot(before), "a deposed writer changed something"
            return
        result = self.run(call())
        self.event(
            f"{name}: {result.outcome.value}"
            + (f" ({result.action.value})" if result.action else "")
            + (" re-decided on a fresh read" if result.attempts > 1 and stale else "")
            + (" on a stale observation" if stale else "")
        )
        assert result.outcome is expect.outcome, (result, expect)
        after = self.run(self.store.read_partition(self.zone, p))
        if expect.writes:
            apply_writes(self.model[p], expect.writes, result.revision)
            assert snapshot(result.state) == snapshot(after), "returned state != etcd's"
        else:
            assert snapshot(after) == snapshot(before), f"{expect.outcome} changed something"
        self.check_step(p, before, after)

    @rule(
        p=partitions,
        peers=st.sampled_from(PEER_SETS),
        kind=st.sampled_from(["newer", "equal", "older"]),
        delta=st.integers(1, 3),
        obs=observations,
        f=fence_choice,
    )
    def trigger(self, p: int, peers: Peers, kind: str, delta: int, obs: int, f: int) -> None:
        stored = self.model[p].get(F.TRIGGER)
        assert stored is not None
        current = stored.value.revision  # type: ignore[attr-defined]
        rev = {"newer": current + delta, "equal": current, "older": max(1, current - delta)}[kind]
        fence = self.fence(f)
        ts = self.step + 1
        expect = model_trigger(self.model[p], peers, rev, fence.epoch, ts)
        observed = self.observed(p, obs)
        self.execute(
            f"trigger {kind}",
            p,
            fence,
            expect,
            lambda: self.store.trigger(self.zone, p, peers, rev, fence, ts, observed=observed),
            observed,
        )

    @rule(
        pair=st.tuples(st.sampled_from(PEER_SETS), st.sampled_from(PEER_SETS)),
        delta=st.integers(0, 2),
        obs=observations,
        f=fence_choice,
    )
    def apply_triggers(self, pair: tuple[Peers, Peers], delta: int, obs: int, f: int) -> None:
        """One trigger revision for both partitions, batched (delta 0 = equal to the highest),
        decided on a fresh zone read or on a zone snapshot made of old observations."""
        self.step += 1
        fence = self.fence(f)
        ts = self.step
        rev = max(self.model[p].get(F.TRIGGER).value.revision for p in PARTITIONS) + delta  # type: ignore[union-attr]
        befores = {p: self.run(self.store.read_partition(self.zone, p)) for p in PARTITIONS}
        observed: ZoneState | None = None
        if obs >= 0:
            states = {p: self.observed(p, obs) for p in PARTITIONS}
            parts = {p: s for p, s in states.items() if s is not None}
            observed = ZoneState(self.zone, min(s.revision for s in parts.values()), parts)
            if any(snapshot(s) != snapshot(befores[p]) for p, s in parts.items()):
                self.event("apply_triggers: on a stale zone snapshot")
        call = self.store.apply_triggers(
            self.zone, dict(zip(PARTITIONS, pair, strict=True)), rev, fence, ts, observed=observed
        )
        if fence.epoch != self.leader_epoch:
            self.event(f"apply_triggers: deposed writer{' on a snapshot' if observed else ''}")
            with pytest.raises(NotLeader):
                self.run(call)
            for p in PARTITIONS:
                after = self.run(self.store.read_partition(self.zone, p))
                assert snapshot(after) == snapshot(befores[p]), "a deposed writer changed something"
        else:
            result = self.run(call)
            for p, target in zip(PARTITIONS, pair, strict=True):
                expect = model_trigger(self.model[p], target, rev, fence.epoch, ts)
                self.event(f"apply_triggers: {result.results[p].outcome.value}")
                assert result.results[p].outcome is expect.outcome
                if expect.writes:
                    apply_writes(self.model[p], expect.writes, result.results[p].revision)
        for p in PARTITIONS:
            after = self.run(self.store.read_partition(self.zone, p))
            self.check_step(p, befores[p], after)

    @rule(
        p=partitions, which=revision_choice, idx=st.integers(0, 9), obs=observations, f=fence_choice
    )
    def finish(self, p: int, which: str, idx: int, obs: int, f: int) -> None:
        rev = self.pending_revision(p, which, idx)
        fence = self.fence(f)
        ts = self.step + 1
        observed = self.observed(p, obs)
        self.execute(
            f"finish {which}",
            p,
            fence,
            model_finish(self.model[p], rev, fence.epoch, ts),
            lambda: self.store.finish(self.zone, p, rev, fence, ts, observed=observed),
            observed,
        )

    @rule(
        p=partitions, which=revision_choice, idx=st.integers(0, 9), obs=observations, f=fence_choice
    )
    def cancel(self, p: int, which: str, idx: int, obs: int, f: int) -> None:
        rev = self.pending_revision(p, which, idx)
        fence = self.fence(f)
        ts = self.step + 1
        observed = self.observed(p, obs)
        self.execute(
            f"cancel {which}",
            p,
            fence,
            model_cancel(self.model[p], rev, fence.epoch, ts),
            lambda: self.store.cancel(self.zone, p, rev, fence, ts, observed=observed),
            observed,
        )

    @rule(
        p=partitions,
        which=revision_choice,
        idx=st.integers(0, 9),
        done=st.booleans(),
        obs=observations,
        f=fence_choice,
    )
    def finish_cancel(self, p: int, which: str, idx: int, done: bool, obs: int, f: int) -> None:
        rev = self.pending_revision(p, which, idx)
        fence = self.fence(f)
        ts = self.step + 1
        observed = self.observed(p, obs)
        self.execute(
            f"finish_cancel {which}",
            p,
            fence,
            model_finish_cancel(self.model[p], rev, done, fence.epoch, ts),
            lambda: self.store.finish_cancel(
                self.zone, p, rev, fence, ts, already_done=done, observed=observed
            ),
            observed,
        )

    @rule(
        p=partitions,
        start=st.sampled_from(["idle", "in flight", "in flight", "cancelled"]),
        ops=st.sampled_from(RACE_PAIRS),
        aims=st.tuples(st.sampled_from(AIMS), st.sampled_from(AIMS)),
        newest=st.booleans(),
        done=st.booleans(),
    )
    def race(
        self,
        p: int,
        start: str,
        ops: tuple[str, str],
        aims: tuple[str, str],
        newest: bool,
        done: bool,
    ) -> None:
        """Two writers on one partition: the second decides on the state both saw before the
        first one wrote (its snapshot is stale by exactly that write).

        ``start``: no rebalance, one in flight, or one in flight and cancelled. ``ops``: every
        pair, including the same op twice (a request handled twice) and a first writer that runs
        a whole rebalance ("cycle": trigger then finish — "no pending" before and after, the ABA
        case). A second trigger is equal to the first writer's trigger or, with ``newest``, newer
        than every trigger so far. ``aims`` pick trigger targets, also "the stable/pending the
        writer saw"."""
        self.settle(p, start)
        seen = self.seen[p][-1]
        self.event(f"race: {start}: {ops[0]} -> {ops[1]}")
        self.race_op(ops[0], p, aims[0], newest, done, seen, observed=None)
        self.race_op(ops[1], p, aims[1], newest, done, seen, observed=seen)

    def settle(self, p: int, start: str) -> None:
        """Bring partition ``p`` to ``start`` with fresh, valid writes."""
        if start == "idle":
            while self.model[p].get(F.PENDING) is not None:  # finish it (and what is planned)
                op = "finish_cancel" if self.model[p].get(F.CANCEL) else "finish"
                self.race_op(op, p, "", False, False, self.seen[p][-1], None)
        elif self.model[p].get(F.PENDING) is None:
            self.race_op("trigger", p, "=other", True, False, self.seen[p][-1], None)
        if start == "cancelled" and self.model[p].get(F.CANCEL) is None:
            self.race_op("cancel", p, "", False, False, self.seen[p][-1], None)

    def race_op(
        self,
        op: str,
        p: int,
        aim: str,
        newest: bool,
        done: bool,
        seen: PartitionState,
        observed: PartitionState | None,
    ) -> None:
        """``op`` by a writer that saw ``seen`` (and decides on ``observed``, if given)."""
        fence = self.fences[-1]
        ts = self.step + 1
        old = self.pending_revisions[p]
        rev = seen.mod(F.PENDING) or (old[-1] if old else 1)
        name = f"race {'second' if observed else 'first'} {op}"
        stored = self.model[p].get(F.TRIGGER)
        assert seen.trigger is not None
        assert stored is not None
        assert isinstance(seen.trigger.value, TriggerMark)
        if op == "cycle":  # a whole rebalance: a new target, then finished
            self.race_op("trigger", p, "=other", True, done, seen, None)
            self.settle(p, "idle")
            return
        expect: Expect
        call: Callable[[], Awaitable[TransitionResult]]
        if op == "trigger":
            peers = self.aim(aim, seen)
            newer = stored.value.revision + 1  # type: ignore[attr-defined]
            trigger = newer if newest else seen.trigger.value.revision + 1
            expect = model_trigger(self.model[p], peers, trigger, fence.epoch, ts)
            call = lambda: self.store.trigger(  # noqa: E731
                self.zone, p, peers, trigger, fence, ts, observed=observed
            )
        elif op == "finish":
            expect = model_finish(self.model[p], rev, fence.epoch, ts)
            call = lambda: self.store.finish(self.zone, p, rev, fence, ts, observed=observed)  # noqa: E731
        elif op == "cancel":
            expect = model_cancel(self.model[p], rev, fence.epoch, ts)
            call = lambda: self.store.cancel(self.zone, p, rev, fence, ts, observed=observed)  # noqa: E731
        else:
            expect = model_finish_cancel(self.model[p], rev, done, fence.epoch, ts)
            call = lambda: self.store.finish_cancel(  # noqa: E731
                self.zone, p, rev, fence, ts, already_done=done, observed=observed
            )
        self.execute(name, p, fence, expect, call, observed)

    def aim(self, aim: str, seen: PartitionState) -> Peers:
        """A trigger target: a peer set, or relative to what the writer saw."""
        stable = seen.peers(F.STABLE)
        pending = seen.peers(F.PENDING) or stable
        assert stable is not None
        assert pending is not None
        if aim == "=stable":
            return stable
        if aim == "=pending":
            return pending
        if aim == "=other":
            current = self.model[seen.partition].peers(F.PENDING) or self.model[
                seen.partition
            ].peers(F.STABLE)
            return next(t for t in PEER_SETS if t not in (stable, pending, current))
        return PEER_SETS[int(aim)]

    @rule(p=partitions)
    def lose_pending(self, p: int) -> None:
        """An operator (or a bug) deletes a rebalance's pending out of band: the next trigger at
        the same revision writes it again (design/metastore.md, "Pending recovery")."""
        m = self.model[p]
        if m.get(F.PENDING) is None or m.get(F.PLANNED) is not None or m.get(F.CANCEL) is not None:
            return
        self.step += 1
        self.run(self.ctx.client.delete(self.ctx.keys.assign(self.zone, p, F.PENDING)))
        m.keys.pop(F.PENDING)
        self.event("pending deleted out of band")
        self.check_all()

    # -- checks --------------------------------------------------------------------------------

    def check_step(self, p: int, before: PartitionState, after: PartitionState) -> None:
        """Invariants over one step, checked on etcd's state alone (not on the model)."""
        if after.mod(F.STABLE) != before.mod(F.STABLE):
            assert before.pending is not None, "stable changed without a pending"
            new, old_pending = after.stable, before.pending
            assert new is not None
            assert isinstance(new.value, Assignment)
            assert isinstance(old_pending.value, Assignment)
            assert (new.value.peers, new.value.trigger) == (
                old_pending.value.peers,
                old_pending.value.trigger,
            ), "stable's new value is not the pending value just before"
        self.record(p, after)

    def record(self, p: int, state: PartitionState) -> None:
        self.seen[p] = [*self.seen[p], state][-HISTORY:]
        mod = state.mod(F.PENDING)
        if mod and mod not in self.pending_revisions[p]:
            self.pending_revisions[p].append(mod)

    def check_all(self) -> None:
        for p in PARTITIONS:
            self.record(p, self.run(self.store.read_partition(self.zone, p)))

    @invariant()
    def etcd_equals_model_and_invariants_hold(self) -> None:
        for p in PARTITIONS:
            if not self.seen[p]:
                continue
            actual = self.seen[p][-1]  # read right after the last step
            assert snapshot(actual) == model_snapshot(self.model[p]), f"partition {p} diverged"
            assert actual.stable is not None
            if actual.planned is not None:
                assert actual.pending is not None, "planned without pending"
            if actual.cancel is not None:
                assert actual.pending is not None, "cancel without pending"
                assert isinstance(actual.cancel.value, CancelIntent)
                assert actual.cancel.value.pending_revision == actual.pending.mod_revision


def test_protocol_matches_model(etcd: Any, prefix: str) -> None:
    loop = asyncio.new_event_loop()
    client = EtcdClient([etcd.endpoint], call_timeout=10.0)
    ctx = Ctx(loop, client, KeySpace(prefix))
    try:
        run_state_machine_as_test(
            lambda: ProtocolMachine(ctx),
            settings=settings(
                max_examples=300,
                stateful_step_count=20,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    finally:
        loop.run_until_complete(client.close())
        loop.close()
    print("\n".join(f"{n:6d}  {what}" for what, n in sorted(ctx.stats.items())))
