"""The fast paths added for joins and leaves, against the general paths.

``solve_rows`` builds the members matrix by editing the current rows when ``place()`` read a
dense current assignment (``FAST_ROWS``), and phase 2 skips the conflict search when no
conflict is possible (``FAST_FILL``): both must give exactly the pairs of
:func:`placement_core.solve`, sorted into rows. The primary balancer's upper-fix searches
expand nodes as they are reached (``FAST_LEVEL``): the same paths as the queue-based search.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.algo import preferred as placement_primary
from placement.algo import solver as placement_core
from placement.algo.hashing import mix64
from placement.algo.place import _Index, _parse_current, place
from placement.algo.preferred import choose_primaries
from placement.algo.solver import _conflicts
from placement.core.model import Node, ZoneSpec

FLAGS = ("FAST_ROWS", "FAST_FILL")


@contextmanager
def general_path(*flags: str) -> Iterator[None]:
    try:
        for flag in flags:
            setattr(placement_core, flag, False)
        yield
    finally:
        for flag in flags:
            setattr(placement_core, flag, True)


@st.composite
def changes(
    draw: st.DrawFn,
) -> tuple[ZoneSpec, list[Node], dict[int, Sequence[str]]]:
    """A zone after joins, leaves or replacements, from a previous output (maybe edited)."""
    n_nodes = draw(st.integers(1, 12))
    zone = ZoneSpec("rows", draw(st.integers(1, 120)), draw(st.integers(1, 4)), failure_domain=None)
    weights = draw(st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=n_nodes + 3))
    pool = [Node(f"n{i:02d}", {}, weights[i]) for i in range(n_nodes + 3)]
    before = draw(st.permutations(pool))[:n_nodes]
    after = draw(st.lists(st.sampled_from(pool), min_size=1, unique=True))
    previous = place(zone, before).assignments
    as_tuples = draw(st.booleans())
    current: dict[int, Sequence[str]] = {
        p: (peers if as_tuples else list(peers)) for p, peers in enumerate(previous)
    }
    for p in draw(st.lists(st.integers(0, zone.partitions - 1), max_size=6)):
        edit = draw(st.integers(0, 3))
        peers = list(current[p])
        if not peers:
            peers = [draw(st.sampled_from(pool)).name]
        elif edit == 0:  # a member replaced (maybe by one already there, or one that left)
            peers[draw(st.integers(0, len(peers) - 1))] = draw(st.sampled_from(pool)).name
        elif edit == 1:
            peers = peers[::-1]
        elif edit == 2:  # a missing member: rows of unequal length take the general reading
            peers = peers[1:]
        else:
            peers = [*peers, draw(st.sampled_from(pool)).name]
        current[p] = peers
    if draw(st.booleans()):  # the partition count changed
        zone = ZoneSpec("rows", max(1, zone.partitions + draw(st.integers(-20, 20))), zone.replicas)
    return zone, after, current


@settings(max_examples=300, deadline=None)
@given(changes())
def test_place_with_and_without_the_row_fast_paths(
    case: tuple[ZoneSpec, list[Node], dict[int, Sequence[str]]],
) -> None:
    zone, nodes, current = case
    fast = place(zone, nodes, current)
    for flags in (FLAGS, ("FAST_ROWS",), ("FAST_FILL",)):
        with general_path(*flags):
            general = place(zone, nodes, current)
        assert fast == general
        assert fast.loads == general.loads
        assert fast.primary_loads == general.primary_loads


def test_row_fast_paths_at_scale_joins_and_leaves() -> None:
    """Bench-like changes (one or two joins, leaves, a replacement), lists and tuples."""
    pool = [Node(f"node-{i:04d}") for i in range(64)]
    zone = ZoneSpec("scale", 3000, 3)
    previous = place(zone, pool[:60]).assignments
    for current in ({p: list(x) for p, x in enumerate(previous)}, dict(enumerate(previous))):
        for after in (pool[:61], pool[:62], pool[:59], pool[1:60], [*pool[:59], pool[60]]):
            fast = place(zone, after, current)
            with general_path(*FLAGS):
                general = place(zone, after, current)
            assert fast == general
            assert fast.primary_loads == general.primary_loads


def test_dense_reading_hints_describe_the_current_pairs() -> None:
    rng = np.random.default_rng(41)
    names = [f"n{i}" for i in range(8)]
    index = _Index((name, i) for i, name in enumerate(names[:6]))  # n6, n7 have left
    hinted = 0
    for _ in range(400):
        partitions, width = int(rng.integers(1, 12)), int(rng.integers(1, 6))
        current = {
            p: [names[int(x)] for x in rng.integers(0, 8, width)]
            for p in range(int(rng.integers(1, 14)))
        }
        rows, nodes, _, _, given = _parse_current(current, partitions, index)
        assert given is not None
        if given.slots is None or given.row_count is None:
            assert len(current) < partitions
            continue
        hinted += 1
        assert np.array_equal(given.row_count, np.bincount(rows, minlength=partitions))
        assert np.array_equal(given.slots // width, rows)
        assert (np.diff(given.slots) > 0).all()
        ordered = np.sort(given.matrix[:partitions], axis=1).reshape(-1)
        assert np.array_equal(ordered[given.slots], nodes)
    assert hinted > 100


def test_conflicts_by_row_pointers_match_the_sorted_codes() -> None:
    rng = np.random.default_rng(43)
    for _ in range(400):
        n_rows, n_nodes = int(rng.integers(1, 20)), int(rng.integers(1, 7))
        kept = np.unique(rng.integers(0, n_rows * n_nodes, int(rng.integers(0, 40))))
        kept_row, kept_node = kept // n_nodes, kept % n_nodes
        if rng.random() < 0.5:  # any order inside a row
            for p in range(n_rows):
                at = np.flatnonzero(kept_row == p)
                kept_node[at] = rng.permutation(kept_node[at])
        code = rng.integers(0, n_rows * n_nodes, int(rng.integers(0, 30)))
        ptr = np.zeros(n_rows + 1, dtype=np.int64)
        np.cumsum(np.bincount(kept_row, minlength=n_rows), out=ptr[1:])
        row, node = code // n_nodes, code % n_nodes
        by_row = _conflicts(n_nodes, kept_row, kept_node, row, node, ptr)
        sorted_kept = np.sort(kept)
        expected = _conflicts(n_nodes, sorted_kept // n_nodes, sorted_kept % n_nodes, row, node)
        assert np.array_equal(by_row, expected)


def test_level_search_matches_the_queue_search() -> None:
    """``FAST_LEVEL`` (upper-fix searches expanding nodes as they are reached) against the
    queue-based search, on balancing problems with long paths and many givers."""
    rng = np.random.default_rng(47)
    for trial in range(600):
        n_rows, n_nodes = int(rng.integers(1, 120)), int(rng.integers(2, 12))
        width = int(rng.integers(1, min(n_nodes, 4) + 1))
        if trial % 2:  # rows from overlapping windows of nodes: givers far from takers
            base = rng.integers(0, n_nodes, n_rows)
            span = min(n_nodes, width + 2)
            rows = [(b + rng.choice(span, width, replace=False)) % n_nodes for b in base]
        else:
            rows = [rng.choice(n_nodes, width, replace=False) for _ in range(n_rows)]
        members = np.sort(np.stack(rows), axis=1)
        load = np.bincount(members.ravel(), minlength=n_nodes)
        current = members[:, 0].copy()  # the lowest member leads: large excesses
        if trial % 4 == 0:
            current = members[np.arange(n_rows), rng.integers(0, width, n_rows)]
            current = np.where(rng.random(n_rows) < 0.5, np.minimum(current, 1), current)
        row_key = mix64(np.arange(n_rows, dtype=np.uint64), trial)
        fast = choose_primaries(members, load, current, row_key)
        try:
            placement_primary.FAST_LEVEL = False
            general = choose_primaries(members, load, current, row_key)
        finally:
            placement_primary.FAST_LEVEL = True
        assert np.array_equal(fast, general)


@settings(max_examples=150, deadline=None)
@given(changes())
def test_place_with_and_without_the_level_search(
    case: tuple[ZoneSpec, list[Node], dict[int, Sequence[str]]],
) -> None:
    zone, nodes, current = case
    fast = place(zone, nodes, current)
    try:
        placement_primary.FAST_LEVEL = False
        general = place(zone, nodes, current)
    finally:
        placement_primary.FAST_LEVEL = True
    assert fast == general
    assert fast.primary_loads == general.primary_loads
