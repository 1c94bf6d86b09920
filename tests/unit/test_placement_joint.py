"""Members chosen for their primaries too (placement.algo.joint; design/placement.md,
"Primaries"): among the member sets keeping the most current pairs, one whose primaries keep
the most current primaries the kept-primary ports allow."""

from __future__ import annotations

import random

import pytest
from placement_mip import kept_and_changes
from test_placement_mip import random_case
from test_placement_oracles import check_all

from placement.algo import joint
from placement.algo.place import place
from placement.core.model import Node, ZoneSpec


def test_a_tie_between_kept_pairs_goes_to_the_row_whose_primary_it_keeps() -> None:
    """P = 1, R = 2: the heavy n0 must hold the partition, and one of n1 and n2 (both current
    members) keeps its replica. Keeping n1 (the core's tie order) changes the primary; keeping
    n2, the current primary, changes nothing else."""
    zone = ZoneSpec("z", 1, 2)
    nodes = [Node("n0", {}, 3.0), Node("n1", {}, 1.0), Node("n2", {}, 1.0), Node("n3", {}, 1.0)]
    current = {0: ["n2", "gone", "n1"]}
    result = place(zone, nodes, current)
    assert result.assignments == (("n2", "n0"),)
    check_all(zone, nodes, result)


def test_with_failure_domains_a_domain_keeps_the_node_that_led() -> None:
    """Racks a, b, c; n1 (rack c, weight 3) must hold 7 replicas of 14 across the racks. The
    members that keep the most pairs also let every current primary lead."""
    zone = ZoneSpec("z", 7, 2, failure_domain="rack")
    nodes = [
        Node("n0", {"rack": "a"}, 1.0),
        Node("n1", {"rack": "c"}, 3.0),
        Node("n2", {"rack": "b"}, 0.5),
    ]
    current = {1: ["n1", "n0", "n2"], 2: ["n2"], 3: ["x", "n2"], 4: ["n1", "n2"], 6: ["n2"]}
    result = place(zone, nodes, current)
    got = kept_and_changes(zone, nodes, current, result.assignments)
    assert (got.kept, got.primary_changes) == (6, 0)
    check_all(zone, nodes, result)


@pytest.mark.parametrize("domains", [False, True])
def test_never_fewer_kept_pairs_nor_more_primary_changes_than_without_it(
    domains: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the oracle's random small zones: at least the kept pairs of the core's members (a
    cycle may also find one the core missed), never more primary changes, every target met —
    and fewer changes somewhere."""
    rng = random.Random(7 + domains)
    fewer = 0
    for _ in range(600):
        zone, nodes, current = random_case(rng, domains)
        if not any(n.matches(zone.node_selector) for n in nodes):
            continue
        with_it = place(zone, nodes, current)
        monkeypatch.setattr(joint, "JOINT_EDGES", 0)
        without = place(zone, nodes, current)
        monkeypatch.undo()
        check_all(zone, nodes, with_it)
        a = kept_and_changes(zone, nodes, current, with_it.assignments)
        b = kept_and_changes(zone, nodes, current, without.assignments)
        assert a.kept >= b.kept, (zone, nodes, current)  # more, where the core missed one
        assert a.primary_changes <= b.primary_changes, (zone, nodes, current)
        fewer += a.primary_changes < b.primary_changes
    assert fewer >= 3


def test_the_exchanges_charge_every_candidate_they_look_at(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: only the candidates whose primaries were chosen were charged, so a
    zone of 6,000 × 2 on 4 racks looked at millions of refused swaps after a leave (6.6 s).
    Every candidate looked at costs a unit of EXCHANGE_WORK now."""
    zone = ZoneSpec("z", 6000, 2, failure_domain="rack")
    nodes = [Node(f"n{i}", {"rack": f"r{i}"}, 1.0) for i in range(4)]
    current = {p: list(r) for p, r in enumerate(place(zone, nodes, {}).assignments)}
    looked = 0
    real = joint._Search._loses

    def counted(self: joint._Search, p: int, y: int, z: int) -> int:
        nonlocal looked
        looked += 1
        return real(self, p, y, z)

    monkeypatch.setattr(joint._Search, "_loses", counted)
    result = place(zone, nodes[1:], current)
    check_all(zone, nodes[1:], result)
    assert 0 < looked <= joint.EXCHANGE_WORK


def test_a_small_zone_spread_over_many_more_racks_keeps_every_primary() -> None:
    """Found by review: 20 partitions moving from 30 nodes to 1,000 in 100 racks. The
    circulation has 5,000 vertices and 24,000 edges; a search that waited n rounds for each
    cycle found none within JOINT_WORK, and 3 primaries changed. Now each cycle is taken as
    soon as it forms (and the 9 it takes fit JOINT_WORK): every primary stays."""
    zone = ZoneSpec("z", 20, 3, failure_domain="rack")
    nodes = [Node(f"n{i:04d}", {"rack": f"r{i % 100}"}, 1.0) for i in range(1000)]
    current = {p: list(r) for p, r in enumerate(place(zone, nodes[:30], {}).assignments)}
    result = place(zone, nodes, current)
    check_all(zone, nodes, result)
    assert [row[0] for row in result.assignments] == [current[p][0] for p in range(20)]
