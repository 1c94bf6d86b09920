"""Rebalances reconstructed from the assignment history (pure).

A rebalance of a partition starts when **pending** is written (its value's ``ts``: the trigger's
time) and ends at the next event that retires that pending:

* ``done``       — stable is switched (``stable := pending``; stable's ``ts`` is the switch time);
* ``cancelled``  — pending is deleted while stable stays (cancel finished, or nothing to move);
* ``dropped``    — the zone was dropped (stable deleted);
* ``superseded`` — pending was overwritten without a switch;
* ``in_progress``— still pending at the end of the history.

Events of one revision are applied stable-first, so ``finish`` (stable := pending, pending :=
planned in one transaction) ends one rebalance and starts the next at the same revision.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from placement.core.model import Peers

DONE, CANCELLED, DROPPED, SUPERSEDED, IN_PROGRESS = (
    "done",
    "cancelled",
    "dropped",
    "superseded",
    "in_progress",
)
_FIELD_ORDER = {"stable": 0, "pending": 1, "planned": 2, "cancel": 3}


@dataclass(frozen=True, slots=True)
class Event:
    """One row of ``history.parquet``: a put or delete of an assignment key."""

    revision: int
    zone: str
    partition: int
    field: str
    event: str
    peers: Peers | None = None
    prev_peers: Peers | None = None
    ts: int | None = None


def event_of(row: Mapping[str, Any]) -> Event:
    """An :class:`Event` from a ``history.parquet`` row as pyarrow's ``to_pylist`` gives it (the
    local engine's rows and the Spark engine's, one partition's at a time)."""
    peers, prev = row["peers"], row["prev_peers"]
    return Event(
        int(row["revision"]),
        str(row["zone"]),
        int(row["partition"]),
        str(row["field"]),
        str(row["event"]),
        None if peers is None else tuple(peers),
        None if prev is None else tuple(prev),
        row["ts"],
    )


@dataclass(frozen=True, slots=True)
class Rebalance:
    """One rebalance of one partition; ``old`` is stable when it started (None if unknown)."""

    zone: str
    partition: int
    start_revision: int
    start_ts: int | None
    old: Peers | None
    new: Peers
    outcome: str
    end_revision: int | None = None
    end_ts: int | None = None

    @property
    def moves(self) -> int:
        """New (partition, node) pairs: replicas copied (or to copy) by this rebalance."""
        return len(set(self.new) - set(self.old or ()))

    @property
    def duration_s(self) -> float | None:
        """Pending written -> stable switched, in seconds; only for ``done`` rebalances."""
        if self.outcome != DONE or self.start_ts is None or self.end_ts is None:
            return None
        return (self.end_ts - self.start_ts) / 1000.0


def _sort_key(event: Event) -> tuple[int, int]:
    return (event.revision, _FIELD_ORDER.get(event.field, 9))


def _ordered(events: Iterable[Event]) -> list[Event]:
    return sorted(events, key=_sort_key)


def rebalances(
    events: Iterable[Event], initial: Mapping[tuple[str, int], Peers] | None = None
) -> list[Rebalance]:
    """Every rebalance in the history, ordered by (zone, partition, start revision).

    ``initial``: stable of each partition before the first event (:func:`stable_at_start`); it
    gives the ``old`` side of a rebalance that started before stable changed in the history."""
    by_partition: dict[tuple[str, int], list[Event]] = defaultdict(list)
    for event in events:
        by_partition[(event.zone, event.partition)].append(event)
    out: list[Rebalance] = []
    for key in sorted(by_partition):
        start = (initial or {}).get(key)
        out.extend(_partition_rebalances(_ordered(by_partition[key]), start))
    return out


def _partition_rebalances(events: Sequence[Event], stable: Peers | None) -> list[Rebalance]:
    out: list[Rebalance] = []
    open_: Rebalance | None = None
    closed_at = -1

    def close(outcome: str, event: Event) -> None:
        nonlocal open_, closed_at
        assert open_ is not None
        end_ts = event.ts if outcome == DONE else None
        out.append(_with_end(open_, outcome, event.revision, end_ts))
        open_, closed_at = None, event.revision

    for event in events:
        if event.field == "stable":
            if stable is None:
                stable = event.prev_peers
            if event.event == "put":
                if open_ is not None:
                    if open_.old is None and event.prev_peers is not None:
                        open_ = _with_old(open_, event.prev_peers)
                    close(DONE, event)
                stable = event.peers
            else:
                if open_ is not None:
                    close(DROPPED, event)
                stable = None
        elif event.field == "pending":
            if event.event == "put" and event.peers is not None:
                if open_ is not None:
                    close(SUPERSEDED, event)
                open_ = Rebalance(
                    event.zone, event.partition, event.revision, event.ts, stable, event.peers, ""
                )
            elif event.event == "delete" and open_ is not None and closed_at != event.revision:
                close(CANCELLED, event)
    if open_ is not None:
        out.append(_with_end(open_, IN_PROGRESS, None, None))
    return out


def _with_end(r: Rebalance, outcome: str, revision: int | None, ts: int | None) -> Rebalance:
    return Rebalance(
        r.zone, r.partition, r.start_revision, r.start_ts, r.old, r.new, outcome, revision, ts
    )


def _with_old(r: Rebalance, old: Peers) -> Rebalance:
    return Rebalance(r.zone, r.partition, r.start_revision, r.start_ts, old, r.new, r.outcome)


@dataclass(frozen=True, slots=True)
class SkewPoint:
    """Fleet-wide replicas per node right after ``revision`` (nodes holding at least one)."""

    revision: int
    ts: int | None
    spread: int
    max_load: int
    min_load: int


def stable_at_start(
    events: Iterable[Event], current: Mapping[tuple[str, int], Peers]
) -> dict[tuple[str, int], Peers]:
    """Stable of every partition just before the history's first event: the ``prev_peers`` of a
    key's first stable event (absent if it was created inside the history), else its current
    value (unchanged throughout)."""
    first: dict[tuple[str, int], Event] = {}
    for event in _ordered(events):
        if event.field == "stable":
            first.setdefault((event.zone, event.partition), event)
    start: dict[tuple[str, int], Peers] = {}
    for key in set(current) | set(first):
        if key in first:
            prev = first[key].prev_peers
            if prev is not None:
                start[key] = prev
        else:
            start[key] = current[key]
    return start


def node_load(stables: Iterable[Peers]) -> dict[str, int]:
    load: Counter[str] = Counter()
    for peers in stables:
        load.update(peers)
    return dict(sorted(load.items()))


@dataclass(frozen=True, slots=True)
class LoadChange:
    """Replicas gained (> 0) or lost (< 0) per node by the stable events of one revision — of
    one partition (:func:`partition_history`) or of the fleet (:func:`merge_changes`). ``ts``:
    the stable value's ``ts`` of the revision's last stable event (in input order)."""

    revision: int
    ts: int | None
    delta: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class PartitionHistory:
    """One partition's history reconstructed (the unit of work of the Spark engine).

    ``start``: stable just before the history's first event (:func:`stable_at_start`);
    ``changes``: one per stable event, in order, each with the event's index in the sequence
    given to :func:`partition_history` (its position, to find a revision's last event)."""

    start: Peers | None
    rebalances: list[Rebalance]
    changes: list[tuple[int, LoadChange]]


def partition_history(events: Sequence[Event], current: Peers | None) -> PartitionHistory:
    """The rebalances and load changes of one partition from its events (in input order: ties
    of revision and field keep it) and its current stable (None: none now). The same as
    :func:`rebalances`, :func:`stable_at_start` and :func:`load_changes` give for it."""
    order = sorted(range(len(events)), key=lambda i: _sort_key(events[i]))
    ordered = [(i, events[i]) for i in order]
    first = next((e for _, e in ordered if e.field == "stable"), None)
    start = first.prev_peers if first is not None else current
    found = _partition_rebalances([e for _, e in ordered], start)
    return PartitionHistory(start, found, _partition_changes(ordered, start))


def _partition_changes(
    ordered: Sequence[tuple[int, Event]], stable: Peers | None
) -> list[tuple[int, LoadChange]]:
    out: list[tuple[int, LoadChange]] = []
    for i, event in ordered:
        if event.field != "stable":
            continue
        new = event.peers if event.event == "put" else None
        delta: Counter[str] = Counter(new or ())
        delta.subtract(stable or ())
        stable = new
        out.append((i, LoadChange(event.revision, event.ts, {n: v for n, v in delta.items() if v})))
    return out


def merge_changes(changes: Iterable[tuple[int, LoadChange]]) -> list[LoadChange]:
    """Per revision, ascending: the deltas summed, the ``ts`` of the change of the highest
    position (the revision's last stable event in input order). The Spark engine does this
    with a group-by (``placement.pipeline.spark_report``)."""
    last: dict[int, tuple[int, int | None]] = {}
    totals: dict[int, Counter[str]] = defaultdict(Counter)
    for position, change in changes:
        seen = last.get(change.revision)
        if seen is None or position > seen[0]:
            last[change.revision] = (position, change.ts)
        totals[change.revision].update(change.delta)
    return [
        LoadChange(rev, last[rev][1], {n: v for n, v in sorted(totals[rev].items()) if v})
        for rev in sorted(last)
    ]


def load_changes(
    events: Iterable[Event], start: Mapping[tuple[str, int], Peers]
) -> list[LoadChange]:
    """The fleet's per-node load change at every revision that switched (or deleted) a stable."""
    by_partition: dict[tuple[str, int], list[tuple[int, Event]]] = defaultdict(list)
    for i, event in enumerate(events):
        by_partition[(event.zone, event.partition)].append((i, event))
    found: list[tuple[int, LoadChange]] = []
    for key, indexed in by_partition.items():
        ordered = sorted(indexed, key=lambda item: _sort_key(item[1]))
        found.extend(_partition_changes(ordered, start.get(key)))
    return merge_changes(found)


def skew_sweep(start_load: Mapping[str, int], changes: Iterable[LoadChange]) -> list[SkewPoint]:
    """The per-node load spread after each change (ascending revisions) from the load at the
    start: the loop both engines run (on the driver for Spark, over Spark's aggregates)."""
    load: Counter[str] = Counter(start_load)
    points: list[SkewPoint] = []
    for change in changes:
        load.update(change.delta)
        held = [v for v in load.values() if v > 0]
        high, low = (max(held), min(held)) if held else (0, 0)
        points.append(SkewPoint(change.revision, change.ts, high - low, high, low))
    return points


def skew_over_time(
    events: Iterable[Event], start: Mapping[tuple[str, int], Peers]
) -> list[SkewPoint]:
    """The fleet's per-node load spread after every revision that switched some stable."""
    return skew_sweep(node_load(start.values()), load_changes(events, start))
