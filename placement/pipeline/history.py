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


def _ordered(events: Iterable[Event]) -> list[Event]:
    return sorted(events, key=lambda e: (e.revision, _FIELD_ORDER.get(e.field, 9)))


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


def skew_over_time(
    events: Iterable[Event], start: Mapping[tuple[str, int], Peers]
) -> list[SkewPoint]:
    """The fleet's per-node load spread after every revision that switched some stable."""
    state = dict(start)
    load: Counter[str] = Counter()
    for peers in state.values():
        load.update(peers)
    points: list[SkewPoint] = []
    ordered = [e for e in _ordered(events) if e.field == "stable"]
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
