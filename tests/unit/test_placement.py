"""Properties of the placement function: shape, balance, primaries, determinism, errors.

Movement properties are in test_placement_moves.py, failure domains in
test_placement_domains.py; the oracles they share are in test_placement_oracles.py.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_placement_oracles import check_all, eligible_nodes, loads, primaries

from placement.algo.place import count_moves, place
from placement.core.model import Node, Peers, ZoneSpec
from placement.errors import InvalidInput

NAMES = [f"n{i:02d}" for i in range(12)]
WEIGHTS = st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0, 7.0])


@st.composite
def nodes_strategy(draw: st.DrawFn, max_nodes: int = 8, weighted: bool | None = None) -> list[Node]:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=max_nodes, unique=True))
    use_weights = draw(st.booleans()) if weighted is None else weighted
    tiers = draw(
        st.lists(st.sampled_from(["hot", "hot", "cold"]), min_size=len(names), max_size=len(names))
    )
    return [
        Node(name, {"tier": tier}, draw(WEIGHTS) if use_weights else 1.0)
        for name, tier in zip(names, tiers, strict=True)
    ]


@st.composite
def current_strategy(
    draw: st.DrawFn, partitions: int, names: Sequence[str]
) -> dict[int, list[str]]:
    """Arbitrary current assignments: left nodes, duplicates, too many or too few members."""
    pool = [*names, "gone1", "gone2"]
    keys = draw(st.lists(st.integers(0, partitions + 2), max_size=partitions + 3, unique=True))
    return {k: draw(st.lists(st.sampled_from(pool), max_size=5)) for k in keys}


@st.composite
def scenario(
    draw: st.DrawFn, weighted: bool | None = None
) -> tuple[ZoneSpec, list[Node], dict[int, list[str]]]:
    nodes = draw(nodes_strategy(weighted=weighted))
    selector = draw(st.sampled_from([{}, {"tier": "hot"}]))
    if not any(n.matches(selector) for n in nodes):
        selector = {}
    zone = ZoneSpec("z", draw(st.integers(1, 40)), draw(st.integers(1, 5)), selector)
    current = draw(current_strategy(zone.partitions, [n.name for n in nodes]))
    return zone, nodes, current


def as_current(result_assignments: Sequence[Peers]) -> dict[int, list[str]]:
    return {p: list(peers) for p, peers in enumerate(result_assignments)}


# --- properties 1-3 -------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(scenario())
def test_shape_balance_and_primaries(
    case: tuple[ZoneSpec, list[Node], dict[int, list[str]]],
) -> None:
    zone, nodes, current = case
    check_all(zone, nodes, place(zone, nodes, current))


@settings(max_examples=100, deadline=None)
@given(scenario(weighted=False))
def test_unweighted_loads_and_primaries_are_within_one(
    case: tuple[ZoneSpec, list[Node], dict[int, list[str]]],
) -> None:
    zone, nodes, current = case
    result = place(zone, nodes, current)
    names = [n.name for n in eligible_nodes(zone, nodes)]
    got, lead = loads(result, names), primaries(result, names)
    assert max(got.values()) - min(got.values()) <= 1
    assert max(lead.values()) - min(lead.values()) <= 1


# --- property 5: determinism ----------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(scenario(), st.randoms(use_true_random=False))
def test_same_input_in_any_order_gives_same_output(
    case: tuple[ZoneSpec, list[Node], dict[int, list[str]]], rnd: random.Random
) -> None:
    zone, nodes, current = case
    expected = place(zone, nodes, current)
    shuffled_nodes = list(nodes)
    rnd.shuffle(shuffled_nodes)
    items = list(current.items())
    rnd.shuffle(items)
    reordered: dict[int, list[str]] = {}
    for p, peers in items:
        tail = list(peers[1:])
        rnd.shuffle(tail)
        reordered[p] = [*peers[:1], *tail]
    assert place(zone, shuffled_nodes, reordered) == expected


@settings(max_examples=150, deadline=None)
@given(scenario())
def test_output_fed_back_is_a_fixed_point(
    case: tuple[ZoneSpec, list[Node], dict[int, list[str]]],
) -> None:
    zone, nodes, current = case
    first = place(zone, nodes, current)
    again = place(zone, nodes, as_current(first.assignments))
    assert again.assignments == first.assignments
    assert count_moves(as_current(first.assignments), again.assignments) == 0


@settings(max_examples=100, deadline=None)
@given(scenario(), st.randoms(use_true_random=False))
def test_balanced_current_is_kept_whole_including_its_primaries(
    case: tuple[ZoneSpec, list[Node], dict[int, list[str]]], rnd: random.Random
) -> None:
    """Stickiness of primaries: any balanced current (here: place's output with primaries
    exchanged between rows, which keeps every node's count) comes back unchanged."""
    zone, nodes, current = case
    result = [list(peers) for peers in place(zone, nodes, current).assignments]
    for _ in range(3 * len(result)):
        p, q = rnd.randrange(len(result)), rnd.randrange(len(result))
        a, b = result[p][0], result[q][0]
        if a != b and b in result[p] and a in result[q]:
            result[p] = [b, *sorted(x for x in result[p] if x != b)]
            result[q] = [a, *sorted(x for x in result[q] if x != a)]
    again = place(zone, nodes, dict(enumerate(result)))
    assert [list(peers) for peers in again.assignments] == result


def test_members_after_the_primary_are_in_name_order() -> None:
    nodes = [Node(f"n{i}") for i in range(7)]
    for peers in place(ZoneSpec("z", 50, 4), nodes).assignments:
        assert list(peers[1:]) == sorted(peers[1:])


# --- examples -------------------------------------------------------------------------------------


def test_fresh_zone_example() -> None:
    nodes = [Node("a"), Node("b"), Node("c"), Node("d")]
    result = place(ZoneSpec("orders", 6, 2), nodes)
    assert sorted(result.loads.values()) == [3, 3, 3, 3]
    assert sorted(result.primary_loads.values()) == [1, 1, 2, 2]


def test_more_replicas_than_nodes_uses_every_node() -> None:
    nodes = [Node("a"), Node("b")]
    result = place(ZoneSpec("z", 3, 5), nodes)
    assert all(sorted(peers) == ["a", "b"] for peers in result.assignments)
    assert sorted(result.primary_loads.values()) == [1, 2]


def test_heavy_node_is_capped_at_one_replica_per_partition() -> None:
    nodes = [Node("big", weight=100.0), Node("s1"), Node("s2"), Node("s3")]
    result = place(ZoneSpec("z", 10, 2), nodes)
    assert result.loads["big"] == 10
    assert sorted(result.loads[n] for n in ("s1", "s2", "s3")) == [3, 3, 4]


def test_selector_filters_nodes() -> None:
    nodes = [Node("a", {"tier": "hot"}), Node("b", {"tier": "cold"}), Node("c", {"tier": "hot"})]
    result = place(ZoneSpec("z", 4, 3, {"tier": "hot"}), nodes)
    assert all(sorted(peers) == ["a", "c"] for peers in result.assignments)


def test_count_moves_counts_new_pairs_only() -> None:
    assert count_moves({0: ["a", "b"], 1: ["c"]}, [("b", "a"), ("c", "d"), ("e",)]) == 2


# --- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("zone", "nodes", "field"),
    [
        (ZoneSpec("z", 0, 1), [Node("a")], "zone.partitions"),
        (ZoneSpec("z", 1, 0), [Node("a")], "zone.replicas"),
        (ZoneSpec("z", 1, 1), [Node("a"), Node("b", weight=0.0)], "nodes[1].weight"),
        (ZoneSpec("z", 1, 1), [Node("a", weight=-1.0)], "nodes[0].weight"),
        (ZoneSpec("z", 1, 1), [Node("a", weight=float("nan"))], "nodes[0].weight"),
        (ZoneSpec("z", 1, 1), [Node("a"), Node("a")], "nodes[1].name"),
        (ZoneSpec("z", 1, 1, {"tier": "hot"}), [Node("a")], "nodes"),
        (ZoneSpec("z", 1, 1), [], "nodes"),
    ],
)
def test_invalid_input_names_the_field(zone: ZoneSpec, nodes: list[Node], field: str) -> None:
    with pytest.raises(InvalidInput) as error:
        place(zone, nodes)
    assert error.value.field == field
    assert error.value.fix


def test_no_eligible_node_message_names_the_zone() -> None:
    with pytest.raises(InvalidInput, match="no eligible node for zone orders"):
        place(ZoneSpec("orders", 1, 1, {"tier": "hot"}), [Node("a")])
