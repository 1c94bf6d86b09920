"""Cordoned nodes (placement.algo.cordon): they keep what they hold, up to their share, and take
no new replica unless a partition could not otherwise have R' members or span its domains.

The rules are checked against an independent reading of design/placement.md, "Cordoned nodes":
shapes and spread as without a cordon, no new pair on a cordoned node while the other nodes span
R' domains, a cordoned node keeps ``min(held, ⌊share⌋)`` or more, the other nodes within one of
their share of what is left, and no cordon at all gives exactly the plain placement.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_placement_oracles import (
    check_shape,
    domain_of,
    eligible_nodes,
    loads,
    realizable_shares,
    shares,
    width,
)

from placement.algo.place import Placement, place
from placement.core.model import Node, ZoneSpec

Case = tuple[ZoneSpec, list[Node], dict[int, list[str]], frozenset[str]]


@st.composite
def cordon_case(draw: st.DrawFn) -> Case:
    count = draw(st.integers(1, 9))
    domains = draw(st.booleans())
    weighted = draw(st.booleans())
    racks = draw(
        st.lists(st.sampled_from(["r1", "r2", "r3", None]), min_size=count, max_size=count)
    )
    nodes = [
        Node(
            f"n{i}",
            {"rack": rack} if rack is not None and domains else {},
            draw(st.sampled_from([0.5, 1.0, 2.0])) if weighted else 1.0,
        )
        for i, rack in enumerate(racks)
    ]
    zone = ZoneSpec(
        "z",
        draw(st.integers(1, 30)),
        draw(st.integers(1, 4)),
        failure_domain="rack" if domains else None,
    )
    pool = [n.name for n in nodes] + ["gone"]
    keys = draw(st.lists(st.integers(0, zone.partitions), unique=True, max_size=zone.partitions))
    current = {k: draw(st.lists(st.sampled_from(pool), max_size=5)) for k in keys}
    cordoned = frozenset(draw(st.lists(st.sampled_from(pool), max_size=count)))
    return zone, nodes, current, cordoned


def held_pairs(current: dict[int, list[str]], zone: ZoneSpec) -> set[tuple[int, str]]:
    return {(p, n) for p, peers in current.items() if p < zone.partitions for n in peers}


def open_domains(zone: ZoneSpec, nodes: Sequence[Node], cordoned: frozenset[str]) -> int:
    """Distinct domains (nodes, without a failure domain) of the nodes not cordoned."""
    free = [n for n in eligible_nodes(zone, nodes) if n.name not in cordoned]
    if zone.failure_domain is None:
        return len(free)
    return len({domain_of(n, zone.failure_domain) for n in free})


def check_cordon(
    zone: ZoneSpec,
    nodes: list[Node],
    current: dict[int, list[str]],
    cordoned: frozenset[str],
    result: Placement,
) -> None:
    check_shape(zone, nodes, result)
    eligible = eligible_nodes(zone, nodes)
    names = [n.name for n in eligible]
    w = width(zone, nodes)
    if zone.failure_domain is not None:
        by_name = {n.name: n for n in eligible}
        labels = {domain_of(n, zone.failure_domain) for n in eligible}
        for peers in result.assignments:
            spread = {domain_of(by_name[x], zone.failure_domain) for x in peers}
            assert len(spread) == min(w, len(labels)), peers
    held = held_pairs(current, zone)
    closed = [n for n in names if n in cordoned]
    new_on_cordoned = [
        (p, x)
        for p, peers in enumerate(result.assignments)
        for x in peers
        if x in cordoned and (p, x) not in held
    ]
    if open_domains(zone, nodes, cordoned) >= w:
        assert not new_on_cordoned, new_on_cordoned
    got = loads(result, names)
    if zone.failure_domain is None and closed:
        # Each cordoned node keeps its current pairs up to ⌊share⌋ (unless rows it holds are
        # over-full, which only happens when R shrank or a row lists a node twice) and never
        # exceeds ⌈share⌉ — while enough nodes are open.
        weights = [n.weight for n in eligible]
        hi = [zone.partitions] * len(names)
        share = dict(zip(names, shares(weights, zone.partitions * w, hi), strict=True))
        for c in closed:
            kept = sum(
                1 for p, peers in enumerate(result.assignments) if c in peers and (p, c) in held
            )
            mine = sum(1 for p, x in held if x == c)
            rows_full = all(len(set(current.get(p, []))) <= w for p, x in held if x == c)
            if open_domains(zone, nodes, cordoned) < w:
                continue  # rule 3 decides first: it may keep more, or other rows than it held
            if rows_full:
                assert kept >= min(mine, share[c].numerator // share[c].denominator), c
            assert kept <= -(-share[c].numerator // share[c].denominator), c
        # The others share the rest within one of their realisable share.
        free = [n for n in eligible if n.name not in cordoned]
        if free and open_domains(zone, nodes, cordoned) >= w:
            rest = [sum(1 for x in peers if x not in cordoned) for peers in result.assignments]
            target = realizable_shares([n.weight for n in free], rest)
            for n, s in zip(free, target, strict=True):
                assert s - 1 < got[n.name] < s + 1, (n.name, got[n.name], s)


@settings(max_examples=600, deadline=None)
@given(cordon_case())
def test_cordoned_nodes_take_no_new_replica_and_the_zone_stays_valid(case: Case) -> None:
    zone, nodes, current, cordoned = case
    result = place(zone, nodes, current, cordoned)
    check_cordon(zone, nodes, current, cordoned, result)
    # Fed back (the driver's next pass), it is a fixed point: a cordon never churns.
    again = {p: list(peers) for p, peers in enumerate(result.assignments)}
    assert place(zone, nodes, again, cordoned).assignments == result.assignments


@settings(max_examples=200, deadline=None)
@given(cordon_case())
def test_no_cordoned_eligible_node_is_the_plain_placement(case: Case) -> None:
    zone, nodes, current, cordoned = case
    names = {n.name for n in nodes}
    absent = frozenset(c for c in cordoned if c not in names) | {"nobody"}
    assert place(zone, nodes, current, absent) == place(zone, nodes, current)


def test_a_cordoned_node_keeps_its_replicas_and_a_grown_zone_avoids_it() -> None:
    nodes = [Node(f"n{i}") for i in range(5)]
    before = place(ZoneSpec("z", 20, 3), nodes)
    current = {p: list(peers) for p, peers in enumerate(before.assignments)}
    grown = place(ZoneSpec("z", 40, 3), nodes, current, {"n2"})
    held = [p for p, peers in enumerate(before.assignments) if "n2" in peers]
    assert [p for p, peers in enumerate(grown.assignments) if "n2" in peers] == held
    others = Counter(x for peers in grown.assignments for x in peers if x != "n2")
    assert max(others.values()) - min(others.values()) <= 1
    assert sum(others.values()) == 40 * 3 - len(held)


def test_a_joining_node_takes_the_share_a_cordoned_node_sheds_and_nothing_new_lands_on_it() -> None:
    nodes = [Node(f"n{i}") for i in range(3)]
    before = place(ZoneSpec("z", 30, 2), nodes)
    current = {p: list(peers) for p, peers in enumerate(before.assignments)}
    after = place(ZoneSpec("z", 30, 2), [*nodes, Node("n3")], current, {"n0"})
    held = {p for p, peers in enumerate(before.assignments) if "n0" in peers}
    now = {p for p, peers in enumerate(after.assignments) if "n0" in peers}
    assert now <= held
    assert len(now) == 15  # its share of 60 replicas over 4 nodes, all from what it held


def test_too_few_open_nodes_for_r_prime_use_the_cordoned_one_least() -> None:
    nodes = [Node(f"n{i}") for i in range(3)]
    result = place(ZoneSpec("z", 6, 3), nodes, {}, {"n1"})
    assert all(set(peers) == {"n0", "n1", "n2"} for peers in result.assignments)


@pytest.mark.parametrize("replicas", [2, 3])
def test_a_rack_of_cordoned_nodes_keeps_its_partitions_and_the_others_take_the_new_ones(
    replicas: int,
) -> None:
    nodes = [Node(f"n{r}{k}", {"rack": f"r{r}"}) for r in range(4) for k in range(2)]
    zone = ZoneSpec("z", 16, replicas, failure_domain="rack")
    before = place(zone, nodes)
    current = {p: list(peers) for p, peers in enumerate(before.assignments)}
    closed = frozenset({"n00", "n01"})
    bigger = ZoneSpec("z", 32, replicas, failure_domain="rack")
    grown = place(bigger, nodes, current, closed)
    check_cordon(bigger, nodes, current, closed, grown)
    held = {(p, x) for p, peers in enumerate(before.assignments) for x in peers}
    for p, peers in enumerate(grown.assignments):
        for x in peers:
            if x in closed:
                assert (p, x) in held
    share = Fraction(32 * replicas, 8)
    got = loads(grown, sorted(closed))
    assert all(got[c] <= share + 1 for c in closed)
