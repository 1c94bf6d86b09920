"""Rebalances, durations and skew reconstructed from assignment history (pure)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from placement.pipeline.analytics import Durations, done_durations, zone_stats, zone_stats_of_sums
from placement.pipeline.history import (
    CANCELLED,
    DONE,
    DROPPED,
    IN_PROGRESS,
    Event,
    LoadChange,
    Rebalance,
    SkewPoint,
    merge_changes,
    node_load,
    partition_history,
    rebalances,
    skew_over_time,
    skew_sweep,
    stable_at_start,
)


def put(
    rev: int,
    field: str,
    peers: tuple[str, ...],
    ts: int,
    prev: tuple[str, ...] | None = None,
    p: int = 0,
) -> Event:
    return Event(rev, "z", p, field, "put", peers, prev, ts)


def delete(rev: int, field: str, p: int = 0) -> Event:
    return Event(rev, "z", p, field, "delete")


def test_done_then_planned_promoted_then_cancelled_then_open() -> None:
    history = [
        put(1, "stable", ("a", "b"), 100),
        put(2, "pending", ("a", "c"), 200),
        put(3, "planned", ("c", "d"), 300),
        # finish: stable := pending, pending := planned, in one revision
        put(4, "pending", ("c", "d"), 4000, prev=("a", "c")),
        put(4, "stable", ("a", "c"), 4000, prev=("a", "b")),
        delete(4, "planned"),
        put(5, "cancel", (), 4500),
        delete(6, "pending"),
        delete(6, "cancel"),
        put(7, "pending", ("a", "b"), 9000),
    ]
    found = rebalances(history)
    assert [(r.outcome, r.start_revision, r.end_revision) for r in found] == [
        (DONE, 2, 4),
        (CANCELLED, 4, 6),
        (IN_PROGRESS, 7, None),
    ]
    assert [r.duration_s for r in found] == [3.8, None, None]
    assert [r.moves for r in found] == [1, 1, 1]  # c onto a,b; d onto a,c; b onto a,c


def test_zone_dropped_and_unknown_start() -> None:
    history = [put(9, "pending", ("b",), 10), delete(12, "stable"), delete(12, "pending")]
    (r,) = rebalances(history, {("z", 0): ("a",)})
    assert (r.outcome, r.old, r.moves) == (DROPPED, ("a",), 1)


def test_stats_skew_and_start_state() -> None:
    history = [
        put(2, "pending", ("a", "c"), 1000),
        put(3, "stable", ("a", "c"), 3000, prev=("a", "b")),
        put(3, "stable", ("a", "b"), 3000, prev=None, p=1),
    ]
    start = stable_at_start(history, {("z", 0): ("a", "c"), ("z", 1): ("a", "b"), ("z", 2): ("c",)})
    assert start == {("z", 0): ("a", "b"), ("z", 2): ("c",)}
    stats = zone_stats(rebalances(history, start), {("z", 0): 500})
    assert (stats["z"].moves_done, stats["z"].bytes_moved, stats["z"].durations.max) == (
        1,
        500,
        2.0,
    )
    (point,) = skew_over_time(history, start)  # one point per revision
    assert (point.revision, point.max_load, point.min_load) == (3, 2, 1)  # a=2, b=1, c=2


@given(st.lists(st.sampled_from(["trigger", "finish", "cancel"]), max_size=30))
def test_every_switch_is_one_done_rebalance(ops: list[str]) -> None:
    """A model of the protocol: each finish of an open pending is exactly one DONE."""
    events, rev, pending, switches = [put(1, "stable", ("n0",), 0)], 1, False, 0
    stable = ("n0",)
    for i, op in enumerate(ops):
        rev += 1
        if op == "trigger" and not pending:
            events.append(put(rev, "pending", (f"n{i + 1}",), rev))
            pending = True
        elif op == "finish" and pending:
            new = events[-1].peers
            assert new is not None
            events.append(put(rev, "stable", new, rev, prev=stable))
            events.append(delete(rev, "pending"))
            stable, pending, switches = new, False, switches + 1
        elif op == "cancel" and pending:
            events.append(delete(rev, "pending"))
            pending = False
    found = rebalances(events)
    assert sum(r.outcome == DONE for r in found) == switches
    assert sum(r.outcome == IN_PROGRESS for r in found) == int(pending)


def _skew_reference(
    events: list[Event], start: dict[tuple[str, int], tuple[str, ...]]
) -> list[SkewPoint]:
    """skew_over_time as it was before the per-partition refactoring (the oracle)."""
    state = dict(start)
    load: Counter[str] = Counter()
    for peers in state.values():
        load.update(peers)
    points: list[SkewPoint] = []
    ordered = sorted(
        (e for e in events if e.field == "stable"), key=lambda e: e.revision
    )  # stable first within a revision: every other field sorts after it
    for i, event in enumerate(ordered):
        key = (event.zone, event.partition)
        load.subtract(state.pop(key, ()))
        if event.event == "put" and event.peers is not None:
            state[key] = event.peers
            load.update(event.peers)
        if i + 1 < len(ordered) and ordered[i + 1].revision == event.revision:
            continue
        held = [v for v in load.values() if v > 0]
        high, low = (max(held), min(held)) if held else (0, 0)
        points.append(SkewPoint(event.revision, event.ts, high - low, high, low))
    return points


_NODES = st.sampled_from(["a", "b", "c", "d"])
_EVENTS = st.lists(
    st.builds(
        Event,
        revision=st.integers(1, 12),
        zone=st.sampled_from(["x", "y"]),
        partition=st.integers(0, 2),
        field=st.sampled_from(["stable", "pending", "planned", "cancel"]),
        event=st.sampled_from(["put", "put", "delete"]),
        peers=st.none() | st.lists(_NODES, max_size=3).map(tuple),
        prev_peers=st.none() | st.lists(_NODES, max_size=3).map(tuple),
        ts=st.none() | st.integers(0, 10_000),
    ),
    max_size=40,
)
_CURRENT = st.dictionaries(
    st.tuples(st.sampled_from(["x", "y", "z"]), st.integers(0, 3)),
    st.lists(_NODES, min_size=1, max_size=3).map(tuple),
    max_size=8,
)


@given(_EVENTS, _CURRENT)
def test_per_partition_reconstruction_is_the_fleets(
    events: list[Event], current: dict[tuple[str, int], tuple[str, ...]]
) -> None:
    """What the Spark engine runs per (zone, partition) and merges gives the local engine's
    rebalances, start state and skew, even for arbitrary (inconsistent) histories with ties."""
    start = stable_at_start(events, current)
    skew = skew_over_time(events, start)
    assert skew == _skew_reference(events, start)
    by_partition: dict[tuple[str, int], list[tuple[int, Event]]] = {}
    for i, e in enumerate(events):
        by_partition.setdefault((e.zone, e.partition), []).append((i, e))
    found: list[Rebalance] = []
    changes: list[tuple[int, LoadChange]] = []
    starts: dict[tuple[str, int], tuple[str, ...]] = {}
    for key in sorted(set(by_partition) | set(current)):
        indexed = by_partition.get(key, [])
        part = partition_history([e for _, e in indexed], current.get(key))
        found.extend(part.rebalances)
        changes.extend((indexed[i][0], change) for i, change in part.changes)
        if part.start is not None:
            starts[key] = part.start
    assert starts == start
    assert found == rebalances(events, start)
    assert skew_sweep(node_load(starts.values()), merge_changes(changes)) == skew


@given(_EVENTS, st.dictionaries(st.tuples(st.just("x"), st.integers(0, 2)), st.integers(0, 99)))
def test_zone_stats_from_per_outcome_sums(
    events: list[Event], sizes: dict[tuple[str, int], int]
) -> None:
    items = rebalances(events)
    expected = zone_stats(items, sizes)
    for zone, stats in expected.items():
        sums: dict[str, list[int]] = {}
        for r in items:
            if r.zone == zone:
                n, moves, size = sums.setdefault(r.outcome, [0, 0, 0])
                size += r.moves * sizes.get((r.zone, r.partition), 0)
                sums[r.outcome] = [n + 1, moves + r.moves, size]
        durations = Durations.of(done_durations(r for r in items if r.zone == zone))
        rows = [(outcome, n, moves, size) for outcome, (n, moves, size) in sums.items()]
        assert zone_stats_of_sums(zone, rows, durations) == stats
