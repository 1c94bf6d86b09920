"""Minimal movement (property 4) and partition-count changes (property 6).

The strongest statement: without failure domains, for ANY current assignment (left nodes,
duplicates, too many or too few members, partitions beyond P), the number of new pairs equals the
minimum over all assignments whose loads are within 1 of the shares — checked against a dynamic
program on small zones. ``S − kept`` with every valid current pair kept is only a lower bound: a
kept set can be impossible to complete (see the oracle's own test), so the DP is the right oracle.
The classic cases then follow with their closed forms, on larger zones built by ``place`` itself.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st
from test_placement_oracles import check_all, min_moves, refill_possible, shares

from placement.algo.place import count_moves, place
from placement.core.model import Node, Peers, ZoneSpec


def as_current(assignments: Sequence[Peers]) -> dict[int, list[str]]:
    return {p: list(peers) for p, peers in enumerate(assignments)}


def plain_nodes(count: int) -> list[Node]:
    return [Node(f"n{i:02d}") for i in range(count)]


@st.composite
def small_case(draw: st.DrawFn) -> tuple[ZoneSpec, list[Node], dict[int, list[str]]]:
    count = draw(st.integers(1, 5))
    weighted = draw(st.booleans())
    nodes = [
        Node(f"n{i}", weight=draw(st.sampled_from([0.5, 1.0, 2.0, 3.0])) if weighted else 1.0)
        for i in range(count)
    ]
    zone = ZoneSpec("z", draw(st.integers(1, 5)), draw(st.integers(1, 3)))
    pool = [n.name for n in nodes] + ["gone"]
    keys = draw(st.lists(st.integers(0, zone.partitions + 1), unique=True, max_size=6))
    current = {k: draw(st.lists(st.sampled_from(pool), max_size=4)) for k in keys}
    return zone, nodes, current


@settings(max_examples=250, deadline=None)
@given(small_case())
def test_new_pairs_are_the_minimum_for_any_current(
    case: tuple[ZoneSpec, list[Node], dict[int, list[str]]],
) -> None:
    zone, nodes, current = case
    result = place(zone, nodes, current)
    check_all(zone, nodes, result)
    assert count_moves(current, result.assignments) == min_moves(zone, nodes, current)


@st.composite
def balanced_zone(draw: st.DrawFn, min_nodes: int = 1) -> tuple[ZoneSpec, list[Node]]:
    count = draw(st.integers(min_nodes, 14))
    replicas = draw(st.integers(1, count))
    return ZoneSpec("z", draw(st.integers(1, 400)), replicas), plain_nodes(count)


@settings(max_examples=60, deadline=None)
@given(balanced_zone())
def test_join_moves_floor_s_over_n_plus_one(case: tuple[ZoneSpec, list[Node]]) -> None:
    zone, nodes = case
    before = place(zone, nodes)
    joined = [*nodes, Node("joiner")]
    after = place(zone, joined, as_current(before.assignments))
    check_all(zone, joined, after)
    moves = count_moves(as_current(before.assignments), after.assignments)
    assert moves == zone.partitions * zone.replicas // (len(nodes) + 1)
    assert after.loads["joiner"] == moves


@settings(max_examples=60, deadline=None)
@given(balanced_zone(min_nodes=2), st.data())
def test_leave_moves_exactly_the_leaving_load(
    case: tuple[ZoneSpec, list[Node]], data: st.DataObject
) -> None:
    """Exactly the leaver's load whenever its replicas can be re-placed without displacing
    others (a max-flow oracle decides); otherwise more, and the DP test shows it is minimal."""
    zone, nodes = case
    if zone.replicas == len(nodes):  # R' would shrink: nothing to re-place
        zone = ZoneSpec("z", zone.partitions, zone.replicas - 1)
    before = place(zone, nodes)
    gone = data.draw(st.sampled_from(nodes))
    rest = [n for n in nodes if n != gone]
    after = place(zone, rest, as_current(before.assignments))
    check_all(zone, rest, after)
    moves = count_moves(as_current(before.assignments), after.assignments)
    if refill_possible(zone, rest, as_current(before.assignments)):
        assert moves == before.loads[gone.name]
    else:  # some node shares (nearly) all the orphaned partitions: tiny or dense zones only
        assert moves > before.loads[gone.name]


@settings(max_examples=60, deadline=None)
@given(balanced_zone(min_nodes=2))
def test_one_more_replica_moves_exactly_p(case: tuple[ZoneSpec, list[Node]]) -> None:
    zone, nodes = case
    if zone.replicas == len(nodes):
        zone = ZoneSpec("z", zone.partitions, zone.replicas - 1)
    before = place(zone, nodes)
    grown = ZoneSpec("z", zone.partitions, zone.replicas + 1)
    after = place(grown, nodes, as_current(before.assignments))
    check_all(grown, nodes, after)
    assert count_moves(as_current(before.assignments), after.assignments) == zone.partitions


@settings(max_examples=60, deadline=None)
@given(balanced_zone(min_nodes=2))
def test_one_less_replica_moves_nothing(case: tuple[ZoneSpec, list[Node]]) -> None:
    zone, nodes = case
    if zone.replicas == 1:
        zone = ZoneSpec("z", zone.partitions, 2)
    before = place(zone, nodes)
    shrunk = ZoneSpec("z", zone.partitions, zone.replicas - 1)
    after = place(shrunk, nodes, as_current(before.assignments))
    check_all(shrunk, nodes, after)
    assert count_moves(as_current(before.assignments), after.assignments) == 0
    for old, new in zip(before.assignments, after.assignments, strict=True):
        assert set(new) <= set(old)


@settings(max_examples=60, deadline=None)
@given(balanced_zone(), st.integers(1, 400))
def test_partition_count_change(case: tuple[ZoneSpec, list[Node]], new_count: int) -> None:
    """More partitions: old ones keep everything, new ones are new. Fewer: the survivors move
    only what the new targets force, i.e. the lower bound Σ max(0, target_i − kept_i)."""
    zone, nodes = case
    before = place(zone, nodes)
    resized = ZoneSpec("z", new_count, zone.replicas)
    after = place(resized, nodes, as_current(before.assignments))
    check_all(resized, nodes, after)
    moves = count_moves(as_current(before.assignments), after.assignments)
    if new_count >= zone.partitions:
        assert moves == (new_count - zone.partitions) * zone.replicas
        for old, new in zip(before.assignments, after.assignments, strict=False):
            assert set(new) == set(old)
    else:
        held: Counter[str] = Counter(x for peers in before.assignments[:new_count] for x in peers)
        assert moves == forced_moves(resized, nodes, held)


def forced_moves(zone: ZoneSpec, nodes: Sequence[Node], held: Counter[str]) -> int:
    """Σ max(0, target_i − held_i) with the +1 targets given to the nodes holding the most."""
    total = zone.partitions * min(zone.replicas, len(nodes))
    share = shares([n.weight for n in nodes], total, [zone.partitions] * len(nodes))
    floor = {n.name: s.numerator // s.denominator for n, s in zip(nodes, share, strict=True)}
    extra = total - sum(floor.values())
    eligible = [n.name for n, s in zip(nodes, share, strict=True) if s.denominator != 1]
    over = sum(1 for name in eligible if held[name] > floor[name])
    return sum(max(0, floor[n] - held[n]) for n in floor) + max(0, extra - over)


def test_unchanged_input_gives_identical_output_at_scale() -> None:
    nodes = plain_nodes(40)
    zone = ZoneSpec("z", 3000, 3)
    first = place(zone, nodes)
    again = place(zone, list(reversed(nodes)), as_current(first.assignments))
    assert again.assignments == first.assignments


def test_join_and_leave_at_scale_are_exact() -> None:
    nodes = plain_nodes(60)
    zone = ZoneSpec("z", 5000, 3)
    before = place(zone, nodes)
    current = as_current(before.assignments)
    joined = place(zone, [*nodes, Node("new")], current)
    assert count_moves(current, joined.assignments) == 5000 * 3 // 61
    left = place(zone, nodes[1:], current)
    assert count_moves(current, left.assignments) == before.loads[nodes[0].name]
    for result in (joined, left):
        assert max(result.loads.values()) - min(result.loads.values()) <= 1
        assert max(result.primary_loads.values()) - min(result.primary_loads.values()) <= 1


def test_returning_node_gets_its_old_replicas_back_when_nothing_else_changed() -> None:
    """Leave then return: the zone goes back to balance with the minimum moves again."""
    nodes = plain_nodes(8)
    zone = ZoneSpec("z", 200, 3)
    start = place(zone, nodes)
    without = place(zone, nodes[:-1], as_current(start.assignments))
    back = place(zone, nodes, as_current(without.assignments))
    assert count_moves(as_current(without.assignments), back.assignments) == 600 // 8
    assert max(back.loads.values()) - min(back.loads.values()) <= 1
