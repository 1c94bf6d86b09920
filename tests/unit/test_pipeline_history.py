"""Rebalances, durations and skew reconstructed from assignment history (pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from placement.pipeline.analytics import zone_stats
from placement.pipeline.history import (
    CANCELLED,
    DONE,
    DROPPED,
    IN_PROGRESS,
    Event,
    rebalances,
    skew_over_time,
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
