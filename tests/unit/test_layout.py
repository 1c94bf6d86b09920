"""The pure core of re-sharding (design/resharding.md): which keys and partitions move, and the
phase machine's decisions."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.core.layout import (
    BEFORE_FLIP,
    Moves,
    Reshard,
    ReshardFacts,
    ReshardPhase,
    ReshardRunning,
    Step,
    Transition,
    ZoneLayout,
    cancel_reshard,
    check_alter,
    next_step,
)
from placement.core.limits import MAX_PARTITIONS
from placement.data.partitioning import CONTROL_PREFIX, jump_hash, key_hash, key_moves, partition_of
from placement.errors import InvalidInput

counts = st.integers(1, 2048)
keys = st.binary(min_size=1, max_size=64).filter(lambda k: not k.startswith(CONTROL_PREFIX))

#: A fixed sample of keys (their hashes) for the fraction checks: seeded, so a failure replays.
_RNG = random.Random(20261124)
SAMPLE = [key_hash(_RNG.randbytes(16)) for _ in range(20_000)]


@given(keys, counts, counts)
def test_a_key_moves_iff_its_partition_differs_and_only_from_a_source_to_a_destination(
    key: bytes, old: int, new: int
) -> None:
    before, after = partition_of(key, old), partition_of(key, new)
    moved = key_moves(key, old, new)
    if before == after:
        assert moved is None
        return
    assert moved == (before, after)
    m = Moves(old, new)
    assert before in m.sources
    assert after in m.destinations
    if new > old:  # a grow moves keys only into the new partitions
        assert after >= old
    else:  # a shrink moves only the removed partitions' keys
        assert before >= new
        assert after < new


@given(counts, counts)
def test_sources_and_destinations_are_disjoint_and_within_both_layouts(old: int, new: int) -> None:
    m = Moves(old, new)
    assert not set(m.sources) & set(m.destinations)
    assert set(m.sources) <= set(range(old))
    assert set(m.destinations) <= set(range(new))
    if old == new:
        assert m.moving_share == 0
        assert not m.destinations


@settings(max_examples=40, deadline=None)
@given(counts, counts)
def test_the_moved_fraction_matches_the_theory(old: int, new: int) -> None:
    """Over 20,000 keys the share that moves is |P'-P| / max(P, P') within 5 standard
    deviations (binomial), and every moved key lands in a destination."""
    m = Moves(old, new)
    moved = 0
    for h in SAMPLE:
        a, b = jump_hash(h, old), jump_hash(h, new)
        if a != b:
            moved += 1
            assert b in m.destinations
    n, f = len(SAMPLE), m.moving_share
    assert abs(moved - n * f) <= 5 * math.sqrt(n * f * (1 - f)) + 1, (moved, n * f)


def test_growing_by_one_moves_one_in_p_plus_one_keys_all_into_the_new_partition() -> None:
    moved = [jump_hash(h, 17) for h in SAMPLE if jump_hash(h, 16) != jump_hash(h, 17)]
    assert set(moved) == {16}
    assert abs(len(moved) - len(SAMPLE) / 17) <= 5 * math.sqrt(len(SAMPLE) / 17)


def test_bad_counts_are_refused_naming_the_field() -> None:
    with pytest.raises(InvalidInput, match=r"^new: 0 is out of range"):
        Moves(4, 0)
    with pytest.raises(InvalidInput, match=r"^old:"):
        key_moves(b"k", MAX_PARTITIONS + 1, 4)
    with pytest.raises(InvalidInput, match=r"^reshard.target: equals the source count 4"):
        Reshard(7, 4, 4, ReshardPhase.COPY)
    with pytest.raises(InvalidInput, match=r"^partitions: 8 in force"):
        ZoneLayout(3, 8, Reshard(7, 4, 8, ReshardPhase.COPY))  # before the flip 4 is in force
    with pytest.raises(InvalidInput, match=r"^generation"):
        ZoneLayout(0, 8)


# -- the phase machine ----------------------------------------------------------------------------

CREATED = 5  # the zone config's create revision: its first layout's generation


def _step(
    layout: ZoneLayout | None, wanted: int, seen: ReshardFacts, revision: int
) -> Transition | None:
    return next_step(layout, wanted, seen, wanted_revision=revision, created_revision=CREATED)


ALL = ReshardFacts(ready=True, caught_up=True, drained=True, purged=True)
facts = st.builds(ReshardFacts, st.booleans(), st.booleans(), st.booleans(), st.booleans())


def test_a_grow_runs_every_phase_once_and_ends_on_the_next_generation() -> None:
    layout: ZoneLayout | None = None
    layout = _apply(_step(layout, 8, ALL, 3), Step.INIT)
    assert layout == ZoneLayout(CREATED, 8)
    assert _step(layout, 8, ALL, 3) is None  # nothing wanted
    steps = []
    while (t := _step(layout, 16, ALL, 9)) is not None:
        steps.append((t.step, t.layout.reshard.phase if t.layout.reshard else None))
        layout = t.layout
    assert steps == [
        (Step.BEGIN, ReshardPhase.PREPARE),
        (Step.ADVANCE, ReshardPhase.COPY),
        (Step.ADVANCE, ReshardPhase.SEAL),
        (Step.FLIP, ReshardPhase.CLEANUP),
        (Step.FINISH, None),
    ]
    assert layout == ZoneLayout(CREATED + 1, 16)


def test_each_phase_waits_for_its_own_fact() -> None:
    layout = ZoneLayout(4, 8, Reshard(9, 8, 16, ReshardPhase.PREPARE))
    for phase, fact in [
        (ReshardPhase.PREPARE, "ready"),
        (ReshardPhase.COPY, "caught_up"),
        (ReshardPhase.SEAL, "drained"),
    ]:
        at = ZoneLayout(4, 8, Reshard(9, 8, 16, phase))
        others = ReshardFacts(**{f: f != fact for f in ("ready", "caught_up", "drained", "purged")})
        assert _step(at, 16, others, 9) is None, phase
        assert _step(at, 16, ReshardFacts(**{fact: True}), 9) is not None, phase
    cleanup = ZoneLayout(5, 16, Reshard(9, 8, 16, ReshardPhase.CLEANUP))
    assert _step(cleanup, 16, ReshardFacts(ready=True, caught_up=True, drained=True), 9) is None
    assert layout.existing() == range(16)


@pytest.mark.parametrize("phase", sorted(BEFORE_FLIP))
def test_wanting_the_old_count_before_the_flip_aborts_back_to_it(phase: ReshardPhase) -> None:
    layout = ZoneLayout(4, 16, Reshard(9, 16, 5, phase))
    t = _step(layout, 16, ReshardFacts(), 12)
    assert t is not None
    assert t.step is Step.ABORT
    assert t.layout == ZoneLayout(4, 16, Reshard(9, 16, 5, ReshardPhase.ABORT))
    assert t.layout.existing() == range(16)  # a shrink's removed partitions stay until the end
    done = _step(t.layout, 16, ReshardFacts(purged=True), 12)
    assert done is not None
    assert done.layout == ZoneLayout(4, 16)


def test_after_the_flip_the_old_count_is_a_new_reshard_once_clean_up_ends() -> None:
    flipped = ZoneLayout(5, 5, Reshard(9, 16, 5, ReshardPhase.CLEANUP))
    assert _step(flipped, 16, ReshardFacts(), 14) is None  # no abort after the flip
    done = _step(flipped, 16, ReshardFacts(purged=True), 14)
    assert done is not None
    assert done.layout == ZoneLayout(5, 5)
    again = _step(done.layout, 16, ReshardFacts(), 14)
    assert again is not None
    assert again.step is Step.BEGIN
    assert again.layout.reshard == Reshard(14, 5, 16, ReshardPhase.PREPARE)


@settings(max_examples=300)
@given(st.lists(st.tuples(st.integers(1, 6), facts), min_size=1, max_size=40))
def test_any_run_keeps_the_invariants_and_then_settles_on_what_is_wanted(
    run: list[tuple[int, ReshardFacts]],
) -> None:
    """Whatever the operator wants when, and whatever the driver observes: the generation grows
    by one exactly at a flip from a drained SEAL, an abort happens only before the flip and
    keeps the generation, and once the facts all hold the zone settles on the wanted count."""
    layout: ZoneLayout | None = None
    revision = 0
    wanted = 0
    for want, seen in run:
        if want != wanted:
            revision += 1
            wanted = want
        t = _step(layout, wanted, seen, revision)
        if t is None:
            continue
        _check_transition(layout, t.step, t.layout, wanted, seen)
        layout = t.layout
    for _ in range(12):  # then every fact holds: at most two reshards (the running one, a new one)
        t = _step(layout, wanted, ALL, revision)
        if t is None:
            break
        _check_transition(layout, t.step, t.layout, wanted, ALL)
        layout = t.layout
    assert layout is not None
    assert layout.reshard is None
    assert layout.partitions == wanted


def _check_transition(
    before: ZoneLayout | None, step: Step, after: ZoneLayout, wanted: int, seen: ReshardFacts
) -> None:
    if before is None:
        assert step is Step.INIT
        assert after == ZoneLayout(CREATED, wanted)
        return
    r, r2 = before.reshard, after.reshard
    if after.generation != before.generation:
        assert step is Step.FLIP
        assert after.generation == before.generation + 1
        assert r is not None
        assert r.phase is ReshardPhase.SEAL
        assert seen.drained
        assert after.partitions == r.target
    if step is Step.ABORT:
        assert r is not None
        assert r.phase in BEFORE_FLIP
        assert wanted == r.source
        assert after.partitions == before.partitions
    if step is Step.FINISH:
        assert r is not None
        assert r2 is None
        assert seen.purged
        assert after.partitions == (r.target if r.phase is ReshardPhase.CLEANUP else r.source)
    if step is Step.BEGIN:
        assert r is None
        assert r2 is not None
        assert r2.target == wanted


def _apply(t: Transition | None, step: Step) -> ZoneLayout:
    assert t is not None
    assert t.step is step
    return t.layout


# -- the operator's partition changes ---------------------------------------------------------


def test_a_change_is_accepted_with_no_reshard_running() -> None:
    check_alter(None, "kv", 8, 16)
    check_alter(ZoneLayout(1, 8), "kv", 8, 3)


@pytest.mark.parametrize("phase", sorted(BEFORE_FLIP))
def test_before_the_flip_only_the_old_count_aborting_or_the_same_count_is_accepted(
    phase: ReshardPhase,
) -> None:
    layout = ZoneLayout(2, 8, Reshard(9, 8, 16, phase))
    check_alter(layout, "kv", 16, 8)  # abort
    check_alter(layout, "kv", 16, 16)  # no change
    with pytest.raises(ReshardRunning) as e:
        check_alter(layout, "kv", 16, 32)
    assert str(e.value) == (
        f"zone kv is re-sharding 8 → 16 (phase {phase}): wait for it to finish, or alter"
        " --partitions 8 to abort it"
    )


def test_after_the_flip_no_change_is_accepted_until_clean_up_ends() -> None:
    layout = ZoneLayout(3, 16, Reshard(9, 8, 16, ReshardPhase.CLEANUP))
    check_alter(layout, "kv", 16, 16)
    for requested in (8, 32):
        with pytest.raises(ReshardRunning, match="wait for its clean-up to finish"):
            check_alter(layout, "kv", 16, requested)


@pytest.mark.parametrize("phase", sorted(BEFORE_FLIP))
def test_cancelling_before_the_flip_alters_the_count_back_to_the_source(
    phase: ReshardPhase,
) -> None:
    layout = ZoneLayout(2, 8, Reshard(9, 8, 16, phase))
    decision = cancel_reshard(layout, "kv")
    assert (decision.count, decision.accepted) == (8, True)
    assert decision.detail == "re-sharding 8 → 16 aborted: the zone keeps 8 partitions"
    check_alter(layout, "kv", 16, 8)  # the write it asks for is one check_alter allows


def test_cancelling_writes_nothing_without_a_reshard_while_aborting_or_after_the_flip() -> None:
    none = cancel_reshard(ZoneLayout(2, 8), "kv")
    assert (none.count, none.accepted) == (None, False)
    assert "kv is not re-sharding" in none.detail
    assert cancel_reshard(None, "kv").accepted is False
    aborting = cancel_reshard(ZoneLayout(2, 8, Reshard(9, 8, 16, ReshardPhase.ABORT)), "kv")
    assert (aborting.count, aborting.accepted) == (None, True)
    flipped = cancel_reshard(ZoneLayout(3, 16, Reshard(9, 8, 16, ReshardPhase.CLEANUP)), "kv")
    assert (flipped.count, flipped.accepted) == (None, False)
    assert "can no longer be cancelled" in flipped.detail
