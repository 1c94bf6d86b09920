"""Primary leases on the in-sync set: who may hold a lease, when it may move, the ISR compare;
and the nodes' lease terms that make the leases last (renewed once per node, not per lease)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Set
from dataclasses import dataclass, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.algo.place import place
from placement.core.model import Node, Peers, ZoneSpec
from placement.driver.leases import (
    LeaseConfig,
    corrupt_isrs,
    lease_holders,
    next_due_ms,
    plan_primaries,
    plan_terms,
    terms_due_ms,
)
from placement.metastore.codec import Corrupt, InSyncSet, LeaseTerm, PrimaryLease
from placement.metastore.transitions import LeaseWrite, TermWrite, Versioned

#: The per-node rules: each term renewed only when it is due itself.
CFG = LeaseConfig(10_000, 5_000, aligned=False)
#: The driver's default: the holders' terms are renewed together (tested at the end).
ALIGNED = LeaseConfig(10_000, 5_000)
POOL = ("n0", "n1", "n2", "n3", "n4", "n5")


def lease(
    node: str, epoch: int, expiry: int = 0, mod: int = 5, ts: int = 0
) -> Versioned[PrimaryLease]:
    """A lease as read; ``expiry`` 0: no cap (it lasts while its holder's term does)."""
    return Versioned(PrimaryLease(node, epoch, expiry, 0, ts), b"", mod, mod)


def term(until: int, mod: int = 30) -> Versioned[LeaseTerm | Corrupt]:
    return Versioned(LeaseTerm(until), b"", mod, mod)


def isr(members: Peers, mod: int = 40, lease_epoch: int = 1) -> Versioned[InSyncSet | Corrupt]:
    primary = members[0]
    return Versioned(InSyncSet(tuple(sorted(members)), primary, lease_epoch, 0), b"", mod, mod)


def corrupt_isr(mod: int = 41) -> Versioned[InSyncSet | Corrupt]:
    return Versioned(Corrupt(b"junk", "not JSON"), b"junk", mod, mod)


def until(terms: Mapping[str, int], old: PrimaryLease) -> int:
    """When ``old`` ends, given the nodes' terms' untils."""
    return old.until(terms.get(old.node, 0))


def ends(terms: Mapping[str, Versioned[LeaseTerm | Corrupt]]) -> dict[str, int]:
    """node -> its readable term's until (``ClusterView.term_until``)."""
    return {n: t.value.until for n, t in terms.items() if isinstance(t.value, LeaseTerm)}


# -- the rules, one at a time ------------------------------------------------------------------


def test_a_grant_goes_only_to_a_live_member_of_the_isr() -> None:
    stables = {0: ("a", "b", "c"), 1: ("a", "b", "c"), 2: ("a", "b", "c")}
    isrs = {0: isr(("b", "c"), mod=11), 1: isr(("a",), mod=12), 2: isr(("c",), mod=13)}
    grants = plan_primaries(stables, {}, {"a", "b"}, 0, CFG, isrs)
    # 0: the preferred primary a is not in sync -> b; 1: a; 2: only c is in sync and c is down.
    # The lease epoch starts above the one the ISR was written under (1), not at 1 again.
    # A new lease has no cap: it lasts while its holder's term does.
    assert grants == {
        0: LeaseWrite(PrimaryLease("b", 2, 0), 0, 11),
        1: LeaseWrite(PrimaryLease("a", 2, 0), 0, 12),
    }
    # so the new holders' terms are to be written with the grants
    assert lease_holders(stables, {}, grants, {"a", "b"}, 0, {}) == {"a", "b"}


def test_without_an_isr_key_any_live_member_of_stable_may_hold_it() -> None:
    grants = plan_primaries({0: ("a", "b")}, {}, {"b"}, 0, CFG, {})
    assert grants == {0: LeaseWrite(PrimaryLease("b", 1, 0), 0, 0)}


def test_a_dead_holder_keeps_its_lease_until_its_term_ends_then_an_isr_member_gets_it() -> None:
    stables = {0: ("a", "b", "c")}
    current = {0: lease("a", 3, mod=7)}
    isrs = {0: isr(("a", "c"), mod=9)}
    live = {"b", "c"}  # a's node record is gone (or its agent is silent)
    terms = {"a": 20_000}
    for now in (0, 10_000, 19_999):
        assert plan_primaries(stables, current, live, now, CFG, isrs, terms=terms) == {}
        # and nobody renews a's term for it: a is no holder to renew
        assert lease_holders(stables, current, {}, live, now, terms) == frozenset()
    after = plan_primaries(stables, current, live, 20_000, CFG, isrs, terms=terms)
    assert after == {0: LeaseWrite(PrimaryLease("c", 4, 0), 7, 9)}  # not b: not in sync
    # without a term (and no cap) the lease has ended already
    assert plan_primaries(stables, current, live, 0, CFG, isrs) == after
    # with a cap too, it ends at the earlier of the two
    capped = {0: lease("a", 3, 15_000, mod=7)}
    assert plan_primaries(stables, capped, live, 14_999, CFG, isrs, terms=terms) == {}
    assert plan_primaries(stables, capped, live, 15_000, CFG, isrs, terms=terms) == after


def test_a_holder_that_left_stable_moves_at_once_to_an_isr_member() -> None:
    current = {0: lease("a", 2)}
    moved = plan_primaries(
        {0: ("b", "c")}, current, {"a", "b", "c"}, 0, CFG, {0: isr(("c",))}, terms={"a": 20_000}
    )
    assert moved == {0: LeaseWrite(PrimaryLease("c", 3, 0), 5, 40)}


def test_a_leaving_holder_hands_its_lease_over_at_once_to_an_in_sync_member() -> None:
    """Drained or stopping (``leaving``): the lease moves now — long before its term ends — to a
    live ISR member that is not leaving, with the ISR compare; with no such member it stays (not
    written: its holder's term is renewed); a leaving node gets no new lease while another can
    take it."""
    stables = {0: ("a", "b", "c")}
    current = {0: lease("a", 3, mod=7)}
    live = {"a", "b", "c"}
    isrs = {0: isr(("a", "b", "c"), mod=9)}
    terms = {"a": 20_000}
    handed = plan_primaries(stables, current, live, 0, CFG, isrs, {"a"}, terms)
    assert handed == {0: LeaseWrite(PrimaryLease("b", 4, 0), 7, 9)}
    not_b = plan_primaries(stables, current, live, 0, CFG, isrs, {"a", "b"}, terms)
    assert not_b == {0: LeaseWrite(PrimaryLease("c", 4, 0), 7, 9)}
    alone = {0: isr(("a",), mod=9)}
    for now in (0, 16_000):  # 16_000: a's term is due, the lease itself is not written
        assert plan_primaries(stables, current, live, now, CFG, alone, {"a"}, terms) == {}
        assert lease_holders(stables, current, {}, live, now, terms) == {"a"}
    fresh = plan_primaries({0: ("a", "b")}, {}, {"a", "b"}, 0, CFG, {}, {"a"})
    assert fresh == {0: LeaseWrite(PrimaryLease("b", 1, 0), 0, 0)}
    only = plan_primaries({0: ("a", "b")}, {}, {"a"}, 0, CFG, {}, {"a"})
    assert only == {0: LeaseWrite(PrimaryLease("a", 1, 0), 0, 0)}


def test_the_preferred_primary_gets_no_hand_over_while_it_is_leaving() -> None:
    stables = {0: ("a", "b")}
    current = {0: lease("b", 2, mod=7)}  # written at 0: handed over from 5_000 on
    isrs = {0: isr(("a", "b"), mod=9)}
    terms = {"b": 9_000}
    kept = plan_primaries(stables, current, {"a", "b"}, 6_000, CFG, isrs, {"a"}, terms)
    assert kept == {}
    assert lease_holders(stables, current, kept, {"a", "b"}, 6_000, terms) == {"b"}
    # not leaving: it does get it
    handed = plan_primaries(stables, current, {"a", "b"}, 6_000, CFG, isrs, frozenset(), terms)
    assert handed == {0: LeaseWrite(PrimaryLease("a", 3, 0), 7, 9)}


def test_no_candidate_caps_an_ended_lease_once_then_leaves_it_as_it_is() -> None:
    """Ended (its term ran out), holder gone, and the only in-sync member is down too: nobody
    gets it. It is capped at its end, compared on the holder's term as read, so a later
    renewal of that term (the holder back, holding other leases) cannot bring it back; capped,
    it is left as it is."""
    stables, isrs = {0: ("a", "b")}, {0: isr(("a",))}
    current = {0: lease("a", 2)}
    capped = plan_primaries(
        stables, current, {"b"}, 5_000, CFG, isrs, terms={"a": 1_000}, term_mods={"a": 17}
    )
    assert capped == {0: LeaseWrite(PrimaryLease("a", 2, 1_000), 5, None, 17)}
    # no term at all: capped at the earliest end there is
    nothing = plan_primaries(stables, current, {"b"}, 5_000, CFG, isrs)
    assert nothing == {0: LeaseWrite(PrimaryLease("a", 2, 1), 5, None, 0)}
    # once capped, a renewed term does not bring it back and nothing more is written
    current = {0: lease("a", 2, 1_000, mod=6)}
    assert until({"a": 20_000}, current[0].value) == 1_000
    assert plan_primaries(stables, current, {"b"}, 5_000, CFG, isrs, terms={"a": 20_000}) == {}


def test_a_live_holder_outside_the_isr_is_capped_at_its_term_and_moves_after_the_cap() -> None:
    stables = {0: ("a", "b")}
    isrs = {0: isr(("a",), mod=3)}
    live = {"a", "b"}
    current = {0: lease("b", 2)}
    # b is live and in stable but not in sync: its term goes on (it answers, and may hold other
    # leases), so this lease is capped at the term as it is now: same holder and lease epoch,
    # no ISR compare, no early move
    capped = plan_primaries(
        stables, current, live, 4_000, CFG, isrs, terms={"b": 8_000}, term_mods={"b": 9}
    )
    # compared on b's term as read (mod 9): it lands before any renewal of that term
    assert capped == {0: LeaseWrite(PrimaryLease("b", 2, 8_000), 5, None, 9)}
    assert lease_holders(stables, current, capped, live, 4_000, {"b": 8_000}) == frozenset()
    # the cap written (mod 6, at 4_000); b's term renewed meanwhile: the cap still holds
    current = {0: lease("b", 2, 8_000, mod=6, ts=4_000)}
    later = {"b": 14_000}
    for now in (4_000, 7_999):
        assert plan_primaries(stables, current, live, now, CFG, isrs, terms=later) == {}
        # b's term may go on (its cap bounds this lease whatever the term does)
        assert lease_holders(stables, current, {}, live, now, later) == {"b"}
    assert lease_holders(stables, current, {}, live, 8_000, later) == frozenset()  # ended
    assert next_due_ms(stables, current, 4_000, CFG) == 8_000
    moved = plan_primaries(stables, current, live, 8_000, CFG, isrs, terms=later)
    assert moved == {0: LeaseWrite(PrimaryLease("a", 3, 0), 6, 3)}
    # a holder outside the ISR that is not live is not capped: its term is not renewed anyway
    dead = plan_primaries(stables, {0: lease("b", 2)}, {"a"}, 4_000, CFG, isrs, terms={"b": 8_000})
    assert dead == {}


def test_a_live_holder_that_left_stable_with_no_taker_is_capped_not_kept_by_its_term() -> None:
    """It left stable (a move finished) and nobody can take the lease yet (the only in-sync
    member is down): its term goes on for its other leases, so this one is capped — else every
    renewal of the term would keep a node outside stable primary for ever."""
    stables = {0: ("b", "c")}
    isrs = {0: isr(("c",), mod=3)}
    live = {"a", "b"}
    current = {0: lease("a", 2)}
    capped = plan_primaries(stables, current, live, 1_000, CFG, isrs, terms={"a": 6_000})
    assert capped == {0: LeaseWrite(PrimaryLease("a", 2, 6_000), 5, None, 0)}
    assert lease_holders(stables, current, capped, live, 1_000, {"a": 6_000}) == frozenset()
    # capped, it ends then whatever a's term does; then it is left alone until c is back
    current = {0: lease("a", 2, 6_000, mod=6)}
    assert plan_primaries(stables, current, live, 5_000, CFG, isrs, terms={"a": 20_000}) == {}
    assert plan_primaries(stables, current, live, 6_000, CFG, isrs, terms={"a": 20_000}) == {}
    assert lease_holders(stables, current, {}, live, 6_000, {"a": 20_000}) == frozenset()
    # with a corrupt ISR alike (no one but the holder could be trusted, and it left stable)
    current = {0: lease("a", 2)}
    corrupt = plan_primaries(
        stables, current, live, 1_000, CFG, {0: corrupt_isr()}, terms={"a": 6_000}
    )
    assert corrupt == {0: LeaseWrite(PrimaryLease("a", 2, 6_000), 5, None, 0)}


def test_a_kept_capped_lease_is_uncapped_and_its_holder_needs_its_term() -> None:
    stables = {0: ("a", "b")}
    current = {0: lease("a", 2, 9_000, mod=6, ts=3_000)}  # capped while a was out of sync
    live = {"a", "b"}
    terms = {"a": 12_000}
    # a is back in sync: the cap is lifted (same holder and lease epoch, no ISR compare)
    both = {0: isr(("a", "b"), mod=7)}
    uncapped = plan_primaries(stables, current, live, 4_000, CFG, both, terms=terms)
    assert uncapped == {0: LeaseWrite(PrimaryLease("a", 2, 0), 6, None)}
    assert lease_holders(stables, current, uncapped, live, 4_000, terms) == {"a"}
    # a has no term (the cap alone holds): not uncapped until it has one, which it is given
    assert plan_primaries(stables, current, live, 4_000, CFG, both) == {}
    assert lease_holders(stables, current, {}, live, 4_000, {}) == {"a"}
    # still out of sync: the cap stays as it is (no write)
    out = {0: isr(("b",), mod=7)}
    assert plan_primaries(stables, current, live, 4_000, CFG, out, terms=terms) == {}
    # held by a member that is not the preferred primary, due for hand-over: handed over instead
    handed = plan_primaries({0: ("b", "a")}, current, live, 8_000, CFG, both, terms=terms)
    assert handed == {0: LeaseWrite(PrimaryLease("b", 3, 0), 6, 7)}
    # not due for hand-over yet (written at 3_000): uncapped
    early = plan_primaries({0: ("b", "a")}, current, live, 7_999, CFG, both, terms=terms)
    assert early == {0: LeaseWrite(PrimaryLease("a", 2, 0), 6, None)}


def test_a_lease_with_a_cap_and_no_term_ends_at_its_cap() -> None:
    """A lease written before the terms (its ``expiry`` set, no term for its holder)."""
    stables = {0: ("a", "b")}
    current = {0: lease("a", 1, 9_000)}
    # its holder gone: it waits for the cap, then moves
    assert plan_primaries(stables, current, {"b"}, 8_999, CFG) == {}
    assert next_due_ms(stables, current, 0, CFG) == 9_000
    moved = plan_primaries(stables, current, {"b"}, 9_000, CFG)
    assert moved == {0: LeaseWrite(PrimaryLease("b", 2, 0), 5, 0)}
    # its holder live: kept as it is while the holder has no term — the pass writes one (after
    # its lease writes) — and uncapped at the next pass, once the term is there: no lapse
    kept = plan_primaries(stables, current, {"a", "b"}, 1_000, CFG)
    assert kept == {}
    holders = lease_holders(stables, current, kept, {"a", "b"}, 1_000, {})
    assert holders == {"a"}
    assert plan_terms({}, holders, {"a", "b"}, 1_000, CFG) == {"a": TermWrite(LeaseTerm(11_000), 0)}
    uncapped = plan_primaries(stables, current, {"a", "b"}, 1_001, CFG, terms={"a": 11_000})
    assert uncapped == {0: LeaseWrite(PrimaryLease("a", 1, 0), 5, None)}
    assert until({"a": 11_000}, uncapped[0].lease) == 11_000  # later than its cap


@pytest.mark.parametrize(
    ("expiry", "term_until", "ends"),
    [
        (0, 0, 0),  # neither: over
        (0, 9_000, 9_000),  # no cap: the term
        (7_000, 0, 7_000),  # no term: the cap
        (7_000, 9_000, 7_000),  # both: the earlier
        (9_000, 7_000, 7_000),
    ],
)
def test_a_lease_ends_with_its_holders_term_or_its_cap_whichever_is_first(
    expiry: int, term_until: int, ends: int
) -> None:
    assert PrimaryLease("a", 1, expiry).until(term_until) == ends


def test_hand_over_to_the_preferred_primary_needs_it_in_sync_a_period_on() -> None:
    """A period (duration - renew_before) after the lease was written, with the preferred
    primary live and in sync; the write carries the ISR revision it was decided on."""
    current = {0: lease("b", 2, ts=1_000)}  # written at 1_000
    stables = {0: ("a", "b")}
    live = {"a", "b"}
    terms = {"b": 12_000}
    both = {0: isr(("a", "b"), mod=6)}
    # written less than a period (duration - renew_before) ago: kept, not written
    assert plan_primaries(stables, current, live, 5_999, CFG, both, terms=terms) == {}
    assert next_due_ms(stables, current, 0, CFG) == 6_000
    not_in_sync = plan_primaries(stables, current, live, 6_000, CFG, {0: isr(("b",))}, terms=terms)
    assert not_in_sync == {}  # kept (and not renewed: its term is)
    in_sync = plan_primaries(stables, current, live, 6_000, CFG, both, terms=terms)
    assert in_sync == {0: LeaseWrite(PrimaryLease("a", 3, 0), 5, 6)}
    no_isr = plan_primaries(stables, current, live, 6_000, CFG, {}, terms=terms)
    assert no_isr == {0: LeaseWrite(PrimaryLease("a", 3, 0), 5, 0)}
    # the preferred primary not live: kept
    assert plan_primaries(stables, current, {"b"}, 6_000, CFG, both, terms=terms) == {}


def test_a_corrupt_isr_lets_only_the_current_holder_keep_its_lease() -> None:
    stables = {0: ("a", "b"), 1: ("a", "b"), 2: ("a", "b")}
    current = {0: lease("b", 2), 1: lease("a", 4)}
    terms = {"b": 12_000, "a": 3_000}
    isrs = {p: corrupt_isr() for p in stables}
    # 0: kept by b (not written); 1: a is gone and its term ended, b is not known to be in
    # sync (capped at its end, no move); 2: no lease and nobody known to be in sync
    assert plan_primaries(stables, current, {"b"}, 8_000, CFG, isrs, terms=terms) == {
        1: LeaseWrite(PrimaryLease("a", 4, 3_000), 5, None, 0)
    }
    assert lease_holders(stables, current, {}, {"b"}, 8_000, terms) == {"b"}
    # a is live and preferred, but not known to be in sync: no hand-over to it
    assert plan_primaries({0: ("a", "b")}, current, {"a", "b"}, 8_000, CFG, isrs, terms=terms) == {}
    # its own lease ended (e.g. the driver was down): the holder may get it back, compared
    regrant = plan_primaries(
        {0: ("a", "b")}, current, {"a", "b"}, 20_000, CFG, {0: isrs[0]}, terms=terms
    )
    assert regrant == {0: LeaseWrite(PrimaryLease("b", 3, 0), 5, 41)}
    assert corrupt_isrs({**isrs, 3: isr(("a",))}) == [0, 1, 2]


def test_a_corrupt_lease_restarts_above_the_epoch_the_isr_was_written_under() -> None:
    current: dict[int, Versioned[PrimaryLease]] = {
        0: Versioned(Corrupt(b"x", "bad"), b"x", 8, 8)  # type: ignore[arg-type]
    }
    writes = plan_primaries({0: ("a",)}, current, {"a"}, 0, CFG, {0: isr(("a",), lease_epoch=7)})
    assert writes == {0: LeaseWrite(PrimaryLease("a", 8, 0), 8, 40)}
    assert lease_holders({0: ("a",)}, current, writes, {"a"}, 0, {}) == {"a"}


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


# -- which nodes' terms the leases need, and their renewal ---------------------------------------


def test_lease_holders_are_the_live_holders_of_leases_that_last_unless_being_capped() -> None:
    stables = {p: (n, "z") for p, n in enumerate("abcdefg")}
    current = {
        0: lease("a", 1),  # kept: a needs its term
        1: lease("b", 1, 6_000),  # capped: bounded by its cap, b's term renewed all the same
        2: lease("c", 1),  # c is not live: its term is not renewed
        3: lease("d", 1),  # d's term ended: the lease is over
        5: lease("f", 1),  # written below, with a cap
        6: lease("z", 1),  # handed over below: z needs no term for it
        9: lease("y", 1),  # not a partition of these stables
    }
    writes = {
        4: LeaseWrite(PrimaryLease("e", 1, 0), 0, 0),  # granted: e needs a term
        5: LeaseWrite(PrimaryLease("f", 1, 7_000), 5),
        6: LeaseWrite(PrimaryLease("g", 2, 0), 5, 0),
    }
    live = {"a", "b", "d", "e", "f", "g", "y", "z"}
    terms = {n: 9_000 for n in "abcefgyz"} | {"d": 500}
    assert lease_holders(stables, current, writes, live, 1_000, terms) == {"a", "b", "e", "g"}
    # f's lease being capped by this pass's writes: f needs no term for it
    assert "f" not in lease_holders(stables, current, writes, live, 1_000, terms)
    # uncapping b's lease makes it need b's term just the same
    uncap = {**writes, 1: LeaseWrite(PrimaryLease("b", 1, 0), 5)}
    assert lease_holders(stables, current, uncap, live, 1_000, terms) == {"a", "b", "e", "g"}
    # once a's term has ended, its unwritten lease needs it no more (it is moved, or waits)
    assert lease_holders(stables, current, writes, live, 9_000, terms) == {"e", "g"}


def test_plan_terms_renews_the_live_holders_that_are_due_and_aligned_those_below_half() -> None:
    terms = {
        "a": term(4_000, mod=11),  # 4_000 left: due
        "b": term(7_000, mod=12),  # 7_000 left: below align_below (7_500), not due
        "c": term(9_500, mod=13),  # fresh
        "d": Versioned(Corrupt(b"x", "bad"), b"x", 14, 14),  # corrupt: as none, due
        "s": term(1_000, mod=15),  # a holder, but silent (not live): never renewed
        "x": term(1_000, mod=16),  # live, but holds nothing: never renewed
    }
    holders = {"a", "b", "c", "d", "e", "s", "u"}  # e: no term yet; u: unregistered, no term
    live = {"a", "b", "c", "d", "e", "x"}
    fresh = LeaseTerm(10_000)
    single = plan_terms(terms, holders, live, 0, CFG)
    assert single == {
        "a": TermWrite(fresh, 11),
        "d": TermWrite(fresh, 14),
        "e": TermWrite(fresh, 0),
    }
    aligned = plan_terms(terms, holders, live, 0, ALIGNED)
    assert aligned == {**single, "b": TermWrite(fresh, 12)}
    # none due: nothing written, aligned or not (b is not renewed early on its own)
    assert plan_terms(terms, {"b", "c"}, live, 0, ALIGNED) == {}
    assert plan_terms(terms, {"b", "c"}, live, 0, CFG) == {}
    # just at renew_before left: not due yet; one ms later: due
    assert plan_terms(terms, {"c"}, live, 4_500, CFG) == {}
    assert plan_terms(terms, {"c"}, live, 4_501, CFG) == {"c": TermWrite(LeaseTerm(14_501), 13)}
    # the silent and unregistered holders never, whatever is due
    assert plan_terms(terms, {"s", "u"}, {"a"}, 0, ALIGNED) == {}


def test_terms_due_is_the_earliest_renewal_or_end_of_a_holders_term_still_ahead() -> None:
    terms = {"a": 9_000, "b": 12_000, "c": 1_000}
    holders = {"a", "b", "d"}  # c holds nothing, d has no term
    assert terms_due_ms(terms, holders, 0, CFG) == 4_001  # a: < 5_000 left from then
    assert terms_due_ms(terms, holders, 4_001, CFG) == 7_001  # b's renewal
    assert terms_due_ms(terms, holders, 7_001, CFG) == 9_000  # a not renewed: it ends
    assert terms_due_ms(terms, holders, 9_000, CFG) == 12_000
    assert terms_due_ms(terms, holders, 12_000, CFG) is None  # nothing ahead
    assert terms_due_ms(terms, {"c", "d"}, 0, CFG) == 1_000
    assert terms_due_ms(terms, {"d"}, 0, CFG) is None


def test_next_due_is_the_earliest_cap_or_hand_over_of_a_lease_still_ahead() -> None:
    """A lease's cap and its hand-over time; not its holder's term's end — the pass watches
    every term's end for all zones at once (plan_pass), so a zone's plan need not."""
    stables = {0: ("a",), 1: ("b", "a"), 2: ("a",)}
    # 0: held by its preferred primary, no cap (it ends with a's term: not a zone due time);
    # 1: capped at 4_000, held by a, not the preferred b (written at 1_000: handed over from
    # 6_000); 2: no lease
    current = {0: lease("a", 1), 1: lease("a", 1, 4_000, ts=1_000)}
    assert next_due_ms(stables, current, 0, ALIGNED) == 4_000
    assert next_due_ms(stables, current, 4_000, ALIGNED) == 6_000
    assert next_due_ms(stables, current, 6_000, ALIGNED) is None  # nothing ahead
    assert next_due_ms(stables, {0: current[0]}, 0, ALIGNED) is None
    assert next_due_ms({}, current, 0, ALIGNED) is None  # not partitions of stable


# -- properties --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    stables: Mapping[int, Peers]
    current: Mapping[int, Versioned[PrimaryLease]]
    isrs: Mapping[int, Versioned[InSyncSet | Corrupt]]
    live: frozenset[str]
    now: int
    #: node -> its term's until
    terms: Mapping[str, int]


def _around(draw: st.DrawFn, now: int) -> int:
    """A time that has passed, is now, or is ahead (each about as likely)."""
    kind = draw(st.sampled_from(["ahead", "passed", "now"]))
    if kind == "passed":
        return now - draw(st.integers(1, 10_000))
    return now if kind == "now" else now + draw(st.integers(1, 15_000))


@st.composite
def cases(draw: st.DrawFn, *, with_isr: bool = True) -> Case:
    """Terms and caps that ended, end now or last; leases written lately or a period ago or
    more; holders mostly members of stable, nodes mostly live."""
    now = draw(st.integers(10_000, 40_000))
    partitions = draw(st.integers(1, 10))
    stables: dict[int, Peers] = {}
    current: dict[int, Versioned[PrimaryLease]] = {}
    isrs: dict[int, Versioned[InSyncSet | Corrupt]] = {}
    for p in range(partitions):
        peers = tuple(draw(st.lists(st.sampled_from(POOL), min_size=1, max_size=4, unique=True)))
        stables[p] = peers
        if draw(st.booleans()):
            holder = draw(st.sampled_from(peers if draw(st.booleans()) else POOL))
            epoch = draw(st.integers(1, 5))
            cap = _around(draw, now) if draw(st.booleans()) else 0
            period = CFG.hand_over_after_ms
            ago = st.sampled_from([st.integers(0, period - 1), st.integers(period, 2 * period)])
            ts = now - draw(draw(ago))
            current[p] = lease(holder, epoch, cap, mod=10 + p, ts=ts)
        if with_isr:
            kind = draw(st.sampled_from(["absent", "set", "corrupt"]))
            if kind == "set":
                members = draw(
                    st.lists(
                        st.sampled_from(peers if draw(st.booleans()) else POOL),
                        min_size=1,
                        max_size=4,
                        unique=True,
                    )
                )
                isrs[p] = isr(tuple(members), mod=100 + p)
            elif kind == "corrupt":
                isrs[p] = corrupt_isr(mod=100 + p)
    live = frozenset(n for n in POOL if draw(st.integers(0, 3)) < 3)
    terms = {n: _around(draw, now) for n in POOL if draw(st.integers(0, 3)) < 3}
    return Case(stables, current, isrs, live, now, terms)


def _plan(case: Case, config: LeaseConfig = CFG) -> dict[int, LeaseWrite]:
    return plan_primaries(
        case.stables, case.current, case.live, case.now, config, case.isrs, terms=case.terms
    )


def _holder(case: Case, p: int) -> PrimaryLease | None:
    entry = case.current.get(p)
    return entry.value if entry is not None and isinstance(entry.value, PrimaryLease) else None


def _eligible(case: Case, p: int, node: str) -> bool:
    """``node`` (the current holder, if the ISR is corrupt) may hold ``p``'s lease as far as
    the ISR goes."""
    if node not in case.stables[p]:
        return False
    entry = case.isrs.get(p)
    if entry is None:
        return True
    if isinstance(entry.value, InSyncSet):
        return node in entry.value.members
    return True  # a corrupt ISR lets the holder keep it


def _kept(case: Case, p: int) -> bool:
    """The lease of ``p`` is one its holder may keep (left alone, uncapped or handed over)."""
    old = _holder(case, p)
    return (
        old is not None
        and old.node in case.live
        and _eligible(case, p, old.node)
        and until(case.terms, old) > case.now
    )


@given(cases())
def test_a_new_holder_is_always_a_live_member_of_stable_in_the_isr(case: Case) -> None:
    writes = _plan(case)
    for p, write in writes.items():
        old = _holder(case, p)
        new = write.lease
        assert write.expected_mod == (case.current[p].mod_revision if p in case.current else 0)
        isr_entry = case.isrs.get(p)
        if old is not None and new.node == old.node and new.lease_epoch == old.lease_epoch:
            # the same holder: its lease capped or uncapped, with no ISR compare
            assert write.isr_mod is None
            lasts = until(case.terms, old)
            if lasts <= case.now:
                # ended, and nobody can take it: capped at its end, so no renewal of its
                # holder's term brings it back
                assert not old.expiry
                assert new.expiry == max(lasts, 1)
                assert write.term_mod is not None
                continue
            assert new.node in case.live
            if old.node not in case.stables[p]:
                # it left stable and nobody can take the lease yet: capped, never kept
                assert not old.expiry
                assert new.expiry == lasts
                continue
            if old.expiry:
                assert new.expiry == 0  # uncapped: kept
                assert _kept(case, p)
            else:
                assert new.expiry == lasts  # capped at its term as it is now
                assert not _eligible(case, p, old.node)
            continue
        # the holder changes (or a new lease epoch starts): decided on the ISR, compared on it
        assert new.node in case.stables[p]
        assert new.expiry == 0  # a new lease lasts while its holder's term does
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
def test_a_holder_in_stable_is_never_replaced_before_its_lease_ends_unless_handed_over(
    case: Case,
) -> None:
    writes = _plan(case)
    for p, write in writes.items():
        old = _holder(case, p)
        if old is None or old.node not in case.stables[p] or write.lease.node == old.node:
            continue
        if case.now < until(case.terms, old):
            # only a hand-over to the preferred primary, by a live holder it may keep, at least
            # a period after the lease was written
            assert write.lease.node == case.stables[p][0]
            assert _kept(case, p)
            assert case.now >= old.ts + CFG.hand_over_after_ms


@given(cases())
def test_a_lease_that_is_fine_is_left_alone(case: Case) -> None:
    writes = _plan(case)
    for p in case.stables:
        old = _holder(case, p)
        if old is None or old.node not in case.stables[p] or until(case.terms, old) <= case.now:
            continue
        if old.node not in case.live:
            assert p not in writes  # a dead holder's lease just runs out
        elif (
            _kept(case, p)
            and not old.expiry
            and (old.node == case.stables[p][0] or case.now < old.ts + CFG.hand_over_after_ms)
        ):
            assert p not in writes  # never renewed: its holder's term is
            holders = lease_holders(
                case.stables, case.current, writes, case.live, case.now, case.terms
            )
            assert old.node in holders


@given(cases())
def test_a_written_lease_needs_its_holders_term_unless_capped(case: Case) -> None:
    writes = _plan(case)
    holders = lease_holders(case.stables, case.current, writes, case.live, case.now, case.terms)
    assert holders <= case.live
    for write in writes.values():
        if write.lease.expiry == 0:
            assert write.lease.node in holders
    # and a holder is one only for an uncapped lease that is written, or one not written that
    # lasts (capped or not: a cap bounds its lease whatever the term does)
    needing: set[str] = set()
    for p in case.stables:
        if p in writes:
            if not writes[p].lease.expiry:
                needing.add(writes[p].lease.node)
        elif (
            (old := _holder(case, p)) is not None
            and old.node in case.live
            and until(case.terms, old) > case.now
        ):
            needing.add(old.node)
    assert holders == needing


@given(cases(with_isr=False))
def test_with_every_member_in_sync_the_leases_are_those_without_an_isr(case: Case) -> None:
    plain = plan_primaries(case.stables, case.current, case.live, case.now, CFG, terms=case.terms)
    full = {p: isr(peers, mod=200 + p) for p, peers in case.stables.items()}
    with_isr = plan_primaries(
        case.stables, case.current, case.live, case.now, CFG, full, terms=case.terms
    )
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


def _without_isr(
    stables: Mapping[int, Peers],
    current: Mapping[int, Versioned[PrimaryLease]],
    live: Set[str],
    now_ms: int,
    config: LeaseConfig,
    terms: Mapping[str, int],
) -> dict[int, tuple[PrimaryLease, int, int | None]]:
    """The lease rules written out plainly for every member of stable in sync (no ISR keys:
    only liveness counts, as before the data plane) — the oracle."""
    keep: dict[int, PrimaryLease] = {}
    move: list[int] = []
    counts: Counter[str] = Counter()
    for p, peers in sorted(stables.items()):
        entry = current.get(p)
        old = entry.value if entry is not None else None
        if not isinstance(old, PrimaryLease) or old.node not in peers:
            move.append(p)
        elif old.until(terms.get(old.node, 0)) <= now_ms:
            move.append(p)  # ended
        else:
            counts[old.node] += 1  # held (a dead holder's runs out: nothing written)
            if old.node in live:
                keep[p] = old
    writes: dict[int, tuple[PrimaryLease, int, int | None]] = {}
    for p, held in keep.items():
        preferred = stables[p][0]
        mod = current[p].mod_revision
        if (
            held.node != preferred
            and preferred in live
            and now_ms >= held.ts + config.hand_over_after_ms
        ):
            counts[held.node] -= 1
            counts[preferred] += 1
            writes[p] = (PrimaryLease(preferred, held.lease_epoch + 1, 0), mod, 0)
        elif held.expiry and terms.get(held.node, 0) > now_ms:  # uncapped once it has a term
            writes[p] = (PrimaryLease(held.node, held.lease_epoch, 0), mod, None)
    for p in move:
        candidates = [n for n in stables[p] if n in live]
        if not candidates:
            entry = current.get(p)
            old = entry.value if entry is not None else None
            if entry is not None and isinstance(old, PrimaryLease) and not old.expiry:
                # nobody can take it, and its holder's term may go on or come back: capped
                ends_at = old.until(terms.get(old.node, 0))
                if old.node in live or ends_at <= now_ms:
                    capped = PrimaryLease(old.node, old.lease_epoch, max(ends_at, 1))
                    writes[p] = (capped, entry.mod_revision, None)
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
            PrimaryLease(holder, lease_epoch, 0),
            entry.mod_revision if entry is not None else 0,
            0,
        )
    return writes


@given(cases(with_isr=False))
def test_without_isr_keys_leases_are_planned_on_liveness_alone(case: Case) -> None:
    writes = plan_primaries(
        case.stables, case.current, case.live, case.now, CFG, {}, terms=case.terms
    )
    before = _without_isr(case.stables, case.current, case.live, case.now, CFG, case.terms)
    assert {p: (w.lease, w.expected_mod, w.isr_mod) for p, w in writes.items()} == before
    # everyone in sync: a lease is capped only when nobody can take it — its holder left
    # stable (and lasts), or it ended
    for p, w in writes.items():
        if w.lease.expiry:
            old = case.current[p].value
            assert isinstance(old, PrimaryLease)
            assert not any(n in case.live for n in case.stables[p])
            assert w.lease.node not in case.stables[p] or until(case.terms, old) <= case.now


# -- the terms renew together (aligned) ----------------------------------------------------------


def test_aligned_terms_share_one_until_after_a_round_and_stay_together() -> None:
    nodes = ("a", "b", "c", "d", "e", "f")
    terms = {n: term(6_000 + 900 * i, mod=10 + i) for i, n in enumerate(nodes)}
    holders = set(nodes)
    now = 1_001  # a is due (4_999 left)
    rounds = 0
    while now < 60_000:
        writes = plan_terms(terms, holders, holders, now, ALIGNED)
        if writes:
            rounds += 1
            for n, w in writes.items():
                assert w.expected_mod == terms[n].mod_revision
                terms[n] = term(w.term.until, mod=now)
            if rounds >= 2:  # two groups at first (d..f were renewed too recently), then one
                assert set(writes) == holders or rounds == 2
                assert len(set(ends(terms).values())) == 1
            assert all(u - now >= ALIGNED.renew_before_ms for u in ends(terms).values())
        due = terms_due_ms(ends(terms), holders, now, ALIGNED)
        assert due is not None
        assert due > now
        now = due
    # about one round per duration - renew_before (5 s) over 59 s, not one per node and period
    assert rounds <= 13
    # per node, each is renewed on its own: more rounds
    single: dict[str, Versioned[LeaseTerm | Corrupt]] = {
        n: term(6_000 + 900 * i) for i, n in enumerate(nodes)
    }
    now, single_rounds = 1_001, 0
    while now < 60_000:
        writes = plan_terms(single, holders, holders, now, CFG)
        single_rounds += bool(writes)
        for n, w in writes.items():
            single[n] = term(w.term.until)
        due = terms_due_ms(ends(single), holders, now, CFG)
        assert due is not None
        now = due
    assert single_rounds > rounds


def test_at_rest_only_the_terms_are_written_one_round_per_period() -> None:
    """The leases of a settled zone are written once (the grants), then never again: only the
    holders' terms are, together, about once per ``duration - renew_before``."""
    stables = {p: (POOL[p % 3], POOL[(p + 1) % 3]) for p in range(9)}
    live = set(POOL[:3])
    current: dict[int, Versioned[PrimaryLease]] = {}
    terms: dict[str, Versioned[LeaseTerm | Corrupt]] = {}
    now, rounds, lease_writes = 0, 0, 0
    while now < 60_000:
        untils = ends(terms)
        writes = plan_primaries(stables, current, live, now, ALIGNED, terms=untils)
        holders = lease_holders(stables, current, writes, live, now, untils)
        renew = plan_terms(terms, holders, live, now, ALIGNED)
        rounds += bool(renew)
        lease_writes += len(writes)
        for n, tw in renew.items():
            terms[n] = term(tw.term.until, mod=now + 1)
        for p, w in writes.items():
            current[p] = lease(w.lease.node, w.lease.lease_epoch, w.lease.expiry, now + 1, now)
        untils = ends(terms)
        for p, entry in current.items():  # every lease held by its preferred primary, lasting
            assert isinstance(entry.value, PrimaryLease)
            assert entry.value.node == stables[p][0]
            assert until(untils, entry.value) > now
        dues = [
            d
            for d in (
                next_due_ms(stables, current, now, ALIGNED),
                terms_due_ms(untils, holders, now, ALIGNED),
            )
            if d is not None
        ]
        now = min(dues)
    assert lease_writes == len(stables)  # the grants, and nothing after
    assert rounds <= 13


@st.composite
def term_cases(
    draw: st.DrawFn,
) -> tuple[dict[str, Versioned[LeaseTerm | Corrupt]], frozenset[str], frozenset[str], int]:
    terms: dict[str, Versioned[LeaseTerm | Corrupt]] = {}
    for i, n in enumerate(draw(st.lists(st.sampled_from(POOL), unique=True))):
        if draw(st.integers(0, 5)) == 0:
            terms[n] = Versioned(Corrupt(b"x", "bad"), b"x", 50 + i, 50 + i)
        else:
            terms[n] = term(draw(st.integers(0, 30_000)), mod=50 + i)
    holders = frozenset(draw(st.lists(st.sampled_from(POOL), unique=True)))
    live = frozenset(draw(st.lists(st.sampled_from(POOL), unique=True)))
    return terms, holders, live, draw(st.integers(0, 30_000))


@given(term_cases())
def test_aligned_term_writes_only_add_live_holders_below_half_a_period(
    case: tuple[dict[str, Versioned[LeaseTerm | Corrupt]], frozenset[str], frozenset[str], int],
) -> None:
    terms, holders, live, now = case
    single = plan_terms(terms, holders, live, now, CFG)
    aligned = plan_terms(terms, holders, live, now, ALIGNED)

    def below(n: str, ms: int) -> bool:
        t = terms.get(n)
        return t is None or not isinstance(t.value, LeaseTerm) or t.value.until - now < ms

    due = {n for n in holders & live if below(n, CFG.renew_before_ms)}
    assert set(single) == due  # a live holder's term is renewed when due, no one else's
    if due:
        assert set(aligned) == {n for n in holders & live if below(n, ALIGNED.align_below_ms)}
    else:
        assert aligned == {}  # nothing due: exactly the per-node plan
    for plan in (single, aligned):
        for n, write in plan.items():
            mod = terms[n].mod_revision if n in terms else 0
            assert write == TermWrite(LeaseTerm(now + CFG.duration_ms), mod)
    # once written, nothing is due at once
    after = {**terms, **{n: term(w.term.until, mod=999) for n, w in aligned.items()}}
    assert plan_terms(after, holders, live, now, ALIGNED) == {}


@given(cases())
def test_aligned_new_holders_are_live_isr_members_and_never_early_but_hand_overs(
    case: Case,
) -> None:
    """``aligned`` concerns the terms alone: the leases are planned exactly as per node."""
    writes = _plan(case, ALIGNED)
    assert writes == _plan(case, CFG)
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
        if old is not None and old.node in case.stables[p] and case.now < until(case.terms, old):
            assert new.node == case.stables[p][0]
            assert old.node in case.live


def test_a_cap_is_compared_on_its_holders_term_and_a_move_on_the_isr() -> None:
    """The transactions of a pass's lease writes: a cap carries a compare of the holder's term
    key at the mod revision it was computed from (absent: version 0 ≡ mod 0), so it never lands
    after a renewal of that term; a move carries the ISR compare; both the lease key's."""
    from placement.metastore.keys import KeySpace
    from placement.metastore.transitions import plan_primary_txns
    from placement.metastore.txn import Compare

    keys = KeySpace("/t")
    writes = {
        0: LeaseWrite(PrimaryLease("a", 2, 8_000), 5, None, 17),
        1: LeaseWrite(PrimaryLease("b", 3, 0), 6, 40),
        2: LeaseWrite(PrimaryLease("c", 1, 0), 7),  # an uncap: the lease key alone
    }
    txns = plan_primary_txns(keys, "z", writes, epoch=9, ts=1)
    compares = {c for txn_compares, _ in txns for c in txn_compares}
    assert Compare.mod(keys.term("a"), "==", 17) in compares
    assert Compare.mod(keys.isr("z", 1), "==", 40) in compares
    assert {Compare.mod(keys.primary("z", p), "==", 5 + p) for p in range(3)} <= compares
    assert len(compares) == 5  # nothing else: no term compare for the move or the uncap
