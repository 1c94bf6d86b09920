"""Primary leases on the in-sync set: who may hold a lease, when it may move, the ISR compare."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Set
from dataclasses import dataclass, replace

from hypothesis import given
from hypothesis import strategies as st

from placement.algo.place import place
from placement.core.model import Node, Peers, ZoneSpec
from placement.driver.leases import LeaseConfig, corrupt_isrs, next_due_ms, plan_primaries
from placement.metastore.codec import Corrupt, InSyncSet, PrimaryLease
from placement.metastore.transitions import LeaseWrite, Versioned

#: The per-lease rules: each lease renewed only when it is due itself.
CFG = LeaseConfig(10_000, 5_000, aligned=False)
#: The driver's default: a zone's kept leases are renewed together (tested at the end).
ALIGNED = LeaseConfig(10_000, 5_000)
POOL = ("n0", "n1", "n2", "n3", "n4", "n5")


def lease(node: str, epoch: int, expiry: int, mod: int = 5) -> Versioned[PrimaryLease]:
    return Versioned(PrimaryLease(node, epoch, expiry), b"", mod, mod)


def isr(members: Peers, mod: int = 40, lease_epoch: int = 1) -> Versioned[InSyncSet | Corrupt]:
    primary = members[0]
    return Versioned(InSyncSet(tuple(sorted(members)), primary, lease_epoch, 0), b"", mod, mod)


def corrupt_isr(mod: int = 41) -> Versioned[InSyncSet | Corrupt]:
    return Versioned(Corrupt(b"junk", "not JSON"), b"junk", mod, mod)


# -- the rules, one at a time ------------------------------------------------------------------


def test_a_grant_goes_only_to_a_live_member_of_the_isr() -> None:
    stables = {0: ("a", "b", "c"), 1: ("a", "b", "c"), 2: ("a", "b", "c")}
    isrs = {0: isr(("b", "c"), mod=11), 1: isr(("a",), mod=12), 2: isr(("c",), mod=13)}
    grants = plan_primaries(stables, {}, {"a", "b"}, 0, CFG, isrs)
    # 0: the preferred primary a is not in sync -> b; 1: a; 2: only c is in sync and c is down.
    # The lease epoch starts above the one the ISR was written under (1), not at 1 again.
    assert grants == {
        0: LeaseWrite(PrimaryLease("b", 2, 10_000), 0, 11),
        1: LeaseWrite(PrimaryLease("a", 2, 10_000), 0, 12),
    }


def test_without_an_isr_key_any_live_member_of_stable_may_hold_it() -> None:
    grants = plan_primaries({0: ("a", "b")}, {}, {"b"}, 0, CFG, {})
    assert grants == {0: LeaseWrite(PrimaryLease("b", 1, 10_000), 0, 0)}


def test_a_dead_holder_keeps_its_lease_until_it_expires_then_an_isr_member_gets_it() -> None:
    stables = {0: ("a", "b", "c")}
    current = {0: lease("a", 3, 20_000, mod=7)}
    isrs = {0: isr(("a", "c"), mod=9)}
    live = {"b", "c"}  # a's node record is gone
    for now in (0, 10_000, 19_999):
        assert plan_primaries(stables, current, live, now, CFG, isrs) == {}
    after = plan_primaries(stables, current, live, 20_000, CFG, isrs)
    assert after == {0: LeaseWrite(PrimaryLease("c", 4, 30_000), 7, 9)}  # not b: not in sync


def test_a_holder_that_left_stable_moves_at_once_to_an_isr_member() -> None:
    current = {0: lease("a", 2, 20_000)}
    moved = plan_primaries({0: ("b", "c")}, current, {"a", "b", "c"}, 0, CFG, {0: isr(("c",))})
    assert moved == {0: LeaseWrite(PrimaryLease("c", 3, 10_000), 5, 40)}


def test_a_leaving_holder_hands_its_lease_over_at_once_to_an_in_sync_member() -> None:
    """Drained or stopping (``leaving``): the lease moves now — long before it is due — to a
    live ISR member that is not leaving, with the ISR compare; with no such member it stays
    and is renewed as usual; a leaving node gets no new lease while another can take it."""
    stables = {0: ("a", "b", "c")}
    current = {0: lease("a", 3, 20_000, mod=7)}
    live = {"a", "b", "c"}
    isrs = {0: isr(("a", "b", "c"), mod=9)}
    handed = plan_primaries(stables, current, live, 0, CFG, isrs, {"a"})
    assert handed == {0: LeaseWrite(PrimaryLease("b", 4, 10_000), 7, 9)}
    not_b = plan_primaries(stables, current, live, 0, CFG, isrs, {"a", "b"})
    assert not_b == {0: LeaseWrite(PrimaryLease("c", 4, 10_000), 7, 9)}
    alone = {0: isr(("a",), mod=9)}
    assert plan_primaries(stables, current, live, 0, CFG, alone, {"a"}) == {}
    due = plan_primaries(stables, current, live, 16_000, CFG, alone, {"a"})
    assert due == {0: LeaseWrite(PrimaryLease("a", 3, 26_000), 7)}  # renewed: no one else
    fresh = plan_primaries({0: ("a", "b")}, {}, {"a", "b"}, 0, CFG, {}, {"a"})
    assert fresh == {0: LeaseWrite(PrimaryLease("b", 1, 10_000), 0, 0)}
    only = plan_primaries({0: ("a", "b")}, {}, {"a"}, 0, CFG, {}, {"a"})
    assert only == {0: LeaseWrite(PrimaryLease("a", 1, 10_000), 0, 0)}


def test_the_preferred_primary_gets_no_hand_over_while_it_is_leaving() -> None:
    stables = {0: ("a", "b")}
    current = {0: lease("b", 2, 4_000, mod=7)}
    isrs = {0: isr(("a", "b"), mod=9)}
    renewed = plan_primaries(stables, current, {"a", "b"}, 0, CFG, isrs, {"a"})
    assert renewed == {0: LeaseWrite(PrimaryLease("b", 2, 10_000), 7)}


def test_no_candidate_leaves_the_lease_as_it_is() -> None:
    current = {0: lease("a", 2, 1_000)}
    # expired, holder gone, and the only in-sync member is down too
    assert plan_primaries({0: ("a", "b")}, current, {"b"}, 5_000, CFG, {0: isr(("a",))}) == {}


def test_a_holder_outside_the_isr_is_not_renewed_and_moves_after_expiry() -> None:
    current = {0: lease("b", 2, 8_000)}
    isrs = {0: isr(("a",), mod=3)}
    # b is live and in stable but not in sync: no renewal (nor early move) while it holds it
    assert plan_primaries({0: ("a", "b")}, current, {"a", "b"}, 4_000, CFG, isrs) == {}
    assert plan_primaries({0: ("a", "b")}, current, {"a", "b"}, 8_000, CFG, isrs) == {
        0: LeaseWrite(PrimaryLease("a", 3, 18_000), 5, 3)
    }


def test_hand_over_to_the_preferred_primary_needs_it_in_sync_and_carries_the_isr_revision() -> None:
    current = {0: lease("b", 2, 12_000)}
    stables = {0: ("a", "b")}
    live = {"a", "b"}
    not_in_sync = plan_primaries(stables, current, live, 8_000, CFG, {0: isr(("b",), mod=6)})
    assert not_in_sync == {0: LeaseWrite(PrimaryLease("b", 2, 18_000), 5, None)}  # renewed
    in_sync = plan_primaries(stables, current, live, 8_000, CFG, {0: isr(("a", "b"), mod=6)})
    assert in_sync == {0: LeaseWrite(PrimaryLease("a", 3, 18_000), 5, 6)}
    no_isr = plan_primaries(stables, current, live, 8_000, CFG, {})
    assert no_isr == {0: LeaseWrite(PrimaryLease("a", 3, 18_000), 5, 0)}


def test_a_corrupt_isr_lets_only_the_current_holder_keep_its_lease() -> None:
    stables = {0: ("a", "b"), 1: ("a", "b"), 2: ("a", "b")}
    current = {0: lease("b", 2, 12_000), 1: lease("a", 4, 3_000)}
    isrs = {p: corrupt_isr() for p in stables}
    writes = plan_primaries(stables, current, {"b"}, 8_000, CFG, isrs)
    # 0: renewed, not handed to a; 1: a is gone and expired, b is not known to be in sync;
    # 2: no lease and nobody known to be in sync
    assert writes == {0: LeaseWrite(PrimaryLease("b", 2, 18_000), 5, None)}
    # its own lease expired (e.g. the driver was down): the holder may get it back, compared
    regrant = plan_primaries({0: ("a", "b")}, current, {"a", "b"}, 20_000, CFG, {0: isrs[0]})
    assert regrant == {0: LeaseWrite(PrimaryLease("b", 3, 30_000), 5, 41)}
    assert corrupt_isrs({**isrs, 3: isr(("a",))}) == [0, 1, 2]


def test_a_corrupt_lease_restarts_above_the_epoch_the_isr_was_written_under() -> None:
    current: dict[int, Versioned[PrimaryLease]] = {
        0: Versioned(Corrupt(b"x", "bad"), b"x", 8, 8)  # type: ignore[arg-type]
    }
    writes = plan_primaries({0: ("a",)}, current, {"a"}, 0, CFG, {0: isr(("a",), lease_epoch=7)})
    assert writes == {0: LeaseWrite(PrimaryLease("a", 8, 10_000), 8, 40)}


def test_balance_is_kept_when_every_member_is_in_sync() -> None:
    nodes = [Node(f"n{i}") for i in range(5)]
    stables = dict(enumerate(place(ZoneSpec("z", 50, 3), nodes).assignments))
    live = {n.name for n in nodes}
    plain = plan_primaries(stables, {}, live, 0, CFG)
    isrs = {p: isr(peers, mod=100 + p) for p, peers in stables.items()}
    with_isr = plan_primaries(stables, {}, live, 0, CFG, isrs)
    assert {p: w.lease.node for p, w in with_isr.items()} == {
        p: w.lease.node for p, w in plain.items()
    }
    assert all(w.isr_mod == 100 + p for p, w in with_isr.items())
    counts = Counter(w.lease.node for w in with_isr.values())
    assert max(counts.values()) - min(counts.values()) <= 1, counts


def test_balance_without_the_preferred_primaries_spreads_over_the_isr() -> None:
    # n0 is preferred everywhere but in sync nowhere: the leases spread ±1 over n1..n3
    stables = {p: ("n0", *(f"n{1 + (p + i) % 3}" for i in range(2))) for p in range(12)}
    isrs = {p: isr(stables[p][1:]) for p in stables}
    grants = plan_primaries(stables, {}, set(POOL), 0, CFG, isrs)
    counts = Counter(w.lease.node for w in grants.values())
    assert "n0" not in counts
    assert max(counts.values()) - min(counts.values()) <= 1, counts


# -- properties --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    stables: Mapping[int, Peers]
    current: Mapping[int, Versioned[PrimaryLease]]
    isrs: Mapping[int, Versioned[InSyncSet | Corrupt]]
    live: frozenset[str]
    now: int


@st.composite
def cases(draw: st.DrawFn, *, with_isr: bool = True) -> Case:
    partitions = draw(st.integers(1, 10))
    stables: dict[int, Peers] = {}
    current: dict[int, Versioned[PrimaryLease]] = {}
    isrs: dict[int, Versioned[InSyncSet | Corrupt]] = {}
    for p in range(partitions):
        peers = tuple(draw(st.lists(st.sampled_from(POOL), min_size=1, max_size=4, unique=True)))
        stables[p] = peers
        if draw(st.booleans()):
            holder = draw(st.sampled_from(POOL))
            epoch = draw(st.integers(1, 5))
            current[p] = lease(holder, epoch, draw(st.integers(0, 30_000)), mod=10 + p)
        if with_isr:
            kind = draw(st.sampled_from(["absent", "set", "corrupt"]))
            if kind == "set":
                members = draw(st.lists(st.sampled_from(POOL), min_size=1, max_size=4, unique=True))
                isrs[p] = isr(tuple(members), mod=100 + p)
            elif kind == "corrupt":
                isrs[p] = corrupt_isr(mod=100 + p)
    live = frozenset(draw(st.lists(st.sampled_from(POOL), unique=True)))
    return Case(stables, current, isrs, live, draw(st.integers(0, 30_000)))


def _holder(case: Case, p: int) -> PrimaryLease | None:
    entry = case.current.get(p)
    return entry.value if entry is not None and isinstance(entry.value, PrimaryLease) else None


@given(cases())
def test_a_new_holder_is_always_a_live_member_of_stable_in_the_isr(case: Case) -> None:
    writes = plan_primaries(case.stables, case.current, case.live, case.now, CFG, case.isrs)
    for p, write in writes.items():
        old = _holder(case, p)
        new = write.lease
        assert new.node in case.stables[p]
        assert new.expiry == case.now + CFG.duration_ms
        assert write.expected_mod == (case.current[p].mod_revision if p in case.current else 0)
        isr_entry = case.isrs.get(p)
        if old is not None and new.node == old.node and new.lease_epoch == old.lease_epoch:
            assert write.isr_mod is None  # a renewal: no ISR compare
            continue
        # the holder changes (or a new lease epoch starts): decided on the ISR, compared on it
        assert new.node in case.live
        assert write.isr_mod == (isr_entry.mod_revision if isr_entry is not None else 0)
        floor = 1 if old is None else old.lease_epoch + 1
        if isr_entry is not None and isinstance(isr_entry.value, InSyncSet):
            floor = max(floor, isr_entry.value.lease_epoch + 1)
        assert new.lease_epoch == floor
        if isr_entry is None:
            continue
        if isinstance(isr_entry.value, InSyncSet):
            assert new.node in isr_entry.value.members
        else:
            assert old is not None  # corrupt ISR: nobody but the holder
            assert new.node == old.node


@given(cases())
def test_a_holder_in_stable_is_never_replaced_before_its_lease_expires_unless_handed_over(
    case: Case,
) -> None:
    writes = plan_primaries(case.stables, case.current, case.live, case.now, CFG, case.isrs)
    for p, write in writes.items():
        old = _holder(case, p)
        if old is None or old.node not in case.stables[p] or write.lease.node == old.node:
            continue
        if case.now < old.expiry:
            # only a hand-over to the preferred primary, by a live holder, at renewal time
            assert write.lease.node == case.stables[p][0]
            assert old.node in case.live
            assert old.expiry - case.now < CFG.renew_before_ms


@given(cases())
def test_a_lease_that_is_fine_is_left_alone(case: Case) -> None:
    writes = plan_primaries(case.stables, case.current, case.live, case.now, CFG, case.isrs)
    for p in case.stables:
        old = _holder(case, p)
        fine = old is not None and old.expiry - case.now >= CFG.renew_before_ms
        if fine and old is not None and old.node in case.stables[p]:
            assert p not in writes


@given(cases(with_isr=False))
def test_with_every_member_in_sync_the_leases_are_those_without_an_isr(case: Case) -> None:
    plain = plan_primaries(case.stables, case.current, case.live, case.now, CFG)
    full = {p: isr(peers, mod=200 + p) for p, peers in case.stables.items()}
    with_isr = plan_primaries(case.stables, case.current, case.live, case.now, CFG, full)
    assert {p: replace(w.lease, lease_epoch=0) for p, w in with_isr.items()} == {
        p: replace(w.lease, lease_epoch=0) for p, w in plain.items()
    }
    for p, write in with_isr.items():
        # the same epochs, except that a brand-new lease starts above the ISR's epoch (1)
        assert write.lease.lease_epoch == max(
            plain[p].lease.lease_epoch, 2 if p not in case.current else 0
        )
        assert write.isr_mod in (None, 200 + p)
        assert (write.isr_mod is None) == (plain[p].isr_mod is None)


def _before_isr(
    stables: Mapping[int, Peers],
    current: Mapping[int, Versioned[PrimaryLease]],
    live: Set[str],
    now_ms: int,
    config: LeaseConfig,
) -> dict[int, tuple[PrimaryLease, int]]:
    """plan_primaries as it was before the data plane (the oracle for "no ISR: as before")."""
    keep: dict[int, PrimaryLease] = {}
    move: list[int] = []
    for p, peers in sorted(stables.items()):
        entry = current.get(p)
        old = entry.value if entry is not None else None
        if (
            isinstance(old, PrimaryLease)
            and old.node in peers
            and old.node in live
            and old.expiry > now_ms
        ):
            keep[p] = old
        else:
            move.append(p)
    counts = Counter(held.node for held in keep.values())
    writes: dict[int, tuple[PrimaryLease, int]] = {}
    for p, held in keep.items():
        if held.expiry - now_ms < config.renew_before_ms:
            preferred = stables[p][0]
            if held.node != preferred and preferred in live:
                counts[held.node] -= 1
                counts[preferred] += 1
                handed = PrimaryLease(preferred, held.lease_epoch + 1, now_ms + config.duration_ms)
                writes[p] = (handed, current[p].mod_revision)
                continue
            renewed = PrimaryLease(held.node, held.lease_epoch, now_ms + config.duration_ms)
            writes[p] = (renewed, current[p].mod_revision)
    for p in move:
        candidates = [n for n in stables[p] if n in live]
        if not candidates:
            continue
        if candidates[0] == stables[p][0]:
            holder = candidates[0]
        else:
            holder = min(candidates, key=lambda n: (counts[n], stables[p].index(n)))
        counts[holder] += 1
        entry = current.get(p)
        old = entry.value if entry is not None else None
        lease_epoch = old.lease_epoch + 1 if isinstance(old, PrimaryLease) else 1
        writes[p] = (
            PrimaryLease(holder, lease_epoch, now_ms + config.duration_ms),
            entry.mod_revision if entry is not None else 0,
        )
    return writes


@given(cases(with_isr=False))
def test_without_isr_keys_leases_are_planned_as_before_the_data_plane(case: Case) -> None:
    # The one change without ISR keys: a dead holder's lease waits for its expiry. Cases
    # without such a holder must come out exactly as before.
    current = {
        p: entry
        for p, entry in case.current.items()
        if not (
            entry.value.node in case.stables[p]
            and entry.value.node not in case.live
            and entry.value.expiry > case.now
        )
    }
    writes = plan_primaries(case.stables, current, case.live, case.now, CFG, {})
    before = _before_isr(case.stables, current, case.live, case.now, CFG)
    assert {p: (w.lease, w.expected_mod) for p, w in writes.items()} == before


# -- the zone renews together (aligned) ----------------------------------------------------------


def _kept(case: Case, p: int) -> bool:
    """The lease of ``p`` is one its holder may keep (renewed, or handed over at renewal)."""
    old = _holder(case, p)
    if old is None or old.node not in case.stables[p] or old.node not in case.live:
        return False
    if old.expiry <= case.now:
        return False
    entry = case.isrs.get(p)
    if entry is None:
        return True
    if isinstance(entry.value, InSyncSet):
        return old.node in entry.value.members
    return True  # a corrupt ISR lets the holder keep it


def test_aligned_one_due_lease_renews_every_kept_lease_of_the_zone() -> None:
    stables = {0: ("a", "b"), 1: ("b", "a"), 2: ("a", "b"), 3: ("b", "a")}
    current = {
        0: lease("a", 1, 12_000, mod=10),  # due at 8_000
        1: lease("b", 2, 15_000, mod=11),  # not due yet: renewed with it
        2: lease("b", 3, 15_400, mod=12),  # not the preferred primary: handed over with it
        3: lease("b", 1, 15_500, mod=13),  # 7_500 left (renewed < half a period ago): alone
    }
    live = {"a", "b"}
    writes = plan_primaries(stables, current, live, 8_000, ALIGNED)
    assert writes == {
        0: LeaseWrite(PrimaryLease("a", 1, 18_000), 10, None),
        1: LeaseWrite(PrimaryLease("b", 2, 18_000), 11, None),
        2: LeaseWrite(PrimaryLease("a", 4, 18_000), 12, 0),
    }
    # nothing due (every kept lease has >= renew_before left): nothing written, as per lease
    assert plan_primaries(stables, current, live, 6_999, ALIGNED) == {}
    assert plan_primaries(stables, current, live, 6_999, CFG) == {}
    # per lease, only the due one is renewed
    assert set(plan_primaries(stables, current, live, 8_000, CFG)) == {0}


def test_aligned_leases_share_one_expiry_after_a_round_and_stay_together() -> None:
    stables = {p: ("a", "b") for p in range(6)}
    current = {p: lease("a", 1, 6_000 + 900 * p, mod=10 + p) for p in range(6)}
    live = {"a", "b"}
    now = 1_001  # partition 0 is due (4_999 left)
    rounds = 0
    while now < 60_000:
        writes = plan_primaries(stables, current, live, now, ALIGNED)
        if writes:
            rounds += 1
            for p, w in writes.items():
                current[p] = lease(w.lease.node, w.lease.lease_epoch, w.lease.expiry, mod=now)
            if rounds >= 2:  # two groups at first (3..5 were renewed too recently), then one
                assert set(writes) == set(stables) or rounds == 2
                assert len({entry.value.expiry for entry in current.values()}) == 1
            assert all(e.value.expiry - now >= ALIGNED.renew_before_ms for e in current.values())
        due = next_due_ms(stables, current, now, ALIGNED)
        assert due is not None
        assert due > now
        now = due
    # about one round per duration - renew_before (5 s) over 59 s, not one per lease and period
    assert rounds <= 13


def test_next_due_is_the_earliest_renewal_or_expiry_still_ahead() -> None:
    stables = {0: ("a",), 1: ("a",), 2: ("a",)}
    current = {0: lease("a", 1, 9_000), 1: lease("a", 1, 4_000)}
    assert next_due_ms(stables, current, 0, ALIGNED) == 4_000  # 1 expires before 0 is due
    assert next_due_ms(stables, current, 4_000, ALIGNED) == 4_001  # 0: < 5_000 left
    assert next_due_ms(stables, current, 4_001, ALIGNED) == 9_000  # 0's renewal time passed
    assert next_due_ms(stables, current, 9_000, ALIGNED) is None  # nothing ahead
    assert next_due_ms({}, current, 0, ALIGNED) is None  # leases of partitions not in stable


@given(cases())
def test_aligned_writes_only_add_renewals_and_hand_overs_of_kept_leases(case: Case) -> None:
    aligned = plan_primaries(case.stables, case.current, case.live, case.now, ALIGNED, case.isrs)
    single = plan_primaries(case.stables, case.current, case.live, case.now, CFG, case.isrs)
    kept = [p for p in case.stables if _kept(case, p)]
    any_due = any(
        (old := _holder(case, p)) is not None and old.expiry - case.now < CFG.renew_before_ms
        for p in kept
    )
    if not any_due:
        assert aligned == single  # no lease due: exactly the per-lease plan
    for p, write in aligned.items():
        assert write.lease.expiry == case.now + CFG.duration_ms
        if p not in kept:
            continue
        old = _holder(case, p)
        assert old is not None
        assert any_due  # a kept lease is written only at the zone's renewal
        if write.lease.node == old.node:
            assert write == LeaseWrite(
                replace(old, expiry=case.now + CFG.duration_ms),
                case.current[p].mod_revision,
                None,
            )
        else:
            # a hand-over to the preferred primary while the holder is live (fenced by epoch)
            assert write.lease.node == case.stables[p][0]
            assert write.lease.node in case.live
            assert write.lease.lease_epoch == old.lease_epoch + 1
            assert write.isr_mod is not None
    for p in single:
        if p in kept:
            assert p in aligned  # whatever is due alone is written aligned too
        else:
            assert aligned[p].lease.node in case.stables[p]


@given(cases())
def test_aligned_new_holders_are_live_isr_members_and_never_early_but_hand_overs(
    case: Case,
) -> None:
    writes = plan_primaries(case.stables, case.current, case.live, case.now, ALIGNED, case.isrs)
    for p, write in writes.items():
        old = _holder(case, p)
        new = write.lease
        if old is not None and new.node == old.node and new.lease_epoch == old.lease_epoch:
            continue
        assert new.node in case.live
        isr_entry = case.isrs.get(p)
        assert write.isr_mod == (isr_entry.mod_revision if isr_entry is not None else 0)
        if isr_entry is not None and isinstance(isr_entry.value, InSyncSet):
            assert new.node in isr_entry.value.members
        elif isr_entry is not None:
            assert old is not None
            assert new.node == old.node
        if old is not None and old.node in case.stables[p] and case.now < old.expiry:
            assert new.node == case.stables[p][0]
            assert old.node in case.live
