"""Report statistics over reconstructed rebalances (pure): per zone and for the fleet."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from placement.pipeline.history import DONE, IN_PROGRESS, Rebalance, SkewPoint


@dataclass(frozen=True, slots=True)
class Durations:
    """Seconds from pending written to stable switched, over ``done`` rebalances."""

    count: int
    mean: float | None
    median: float | None
    p90: float | None
    max: float | None

    @staticmethod
    def of(values: Sequence[float]) -> Durations:
        if not values:
            return Durations(0, None, None, None, None)
        ordered = sorted(values)
        p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
        return Durations(
            len(ordered),
            statistics.fmean(ordered),
            statistics.median(ordered),
            p90,
            ordered[-1],
        )


@dataclass(frozen=True, slots=True)
class ZoneStats:
    """One zone's rebalances: counts by outcome, replicas copied and their bytes, durations."""

    zone: str
    rebalances: int
    outcomes: Mapping[str, int]
    moves_done: int
    moves_in_progress: int
    bytes_moved: int
    bytes_to_move: int
    durations: Durations

    @property
    def moves(self) -> int:
        return self.moves_done + self.moves_in_progress


def zone_stats(
    items: Sequence[Rebalance], sizes: Mapping[tuple[str, int], int]
) -> dict[str, ZoneStats]:
    """Per zone (sorted by name); a partition's bytes are its size (0 when unknown) per move."""
    by_zone: dict[str, list[Rebalance]] = defaultdict(list)
    for r in items:
        by_zone[r.zone].append(r)
    out: dict[str, ZoneStats] = {}
    for zone in sorted(by_zone):
        mine = by_zone[zone]
        outcomes: dict[str, int] = defaultdict(int)
        for r in mine:
            outcomes[r.outcome] += 1

        def moved(outcome: str, rs: list[Rebalance] = mine) -> tuple[int, int]:
            chosen = [r for r in rs if r.outcome == outcome]
            moves = sum(r.moves for r in chosen)
            size = sum(r.moves * sizes.get((r.zone, r.partition), 0) for r in chosen)
            return moves, size

        done_moves, done_bytes = moved(DONE)
        open_moves, open_bytes = moved(IN_PROGRESS)
        durations = [d for r in mine if (d := r.duration_s) is not None]
        out[zone] = ZoneStats(
            zone,
            len(mine),
            dict(sorted(outcomes.items())),
            done_moves,
            open_moves,
            done_bytes,
            open_bytes,
            Durations.of(durations),
        )
    return out


#: One zone's rebalances of one outcome, summed: ``(outcome, rebalances, moves, bytes)`` (bytes:
#: each move times its partition's size).
OutcomeSums = tuple[str, int, int, int]


def zone_stats_of_sums(zone: str, sums: Iterable[OutcomeSums], durations: Durations) -> ZoneStats:
    """A zone's :class:`ZoneStats` from its per-outcome sums and durations — the numbers
    :func:`zone_stats` computes from its rebalances (the Spark engine sums them in a group-by
    and runs :meth:`Durations.of` per zone on the executors)."""
    by_outcome = {outcome: (n, moves, size) for outcome, n, moves, size in sums}
    done = by_outcome.get(DONE, (0, 0, 0))
    open_ = by_outcome.get(IN_PROGRESS, (0, 0, 0))
    return ZoneStats(
        zone,
        sum(n for n, _, _ in by_outcome.values()),
        {outcome: by_outcome[outcome][0] for outcome in sorted(by_outcome)},
        done[1],
        open_[1],
        done[2],
        open_[2],
        durations,
    )


@dataclass(frozen=True, slots=True)
class ReportInput:
    """What a report is made of, from either engine: the zones' statistics (sorted by name),
    the number of rebalances and every ``done`` duration, the export's ``meta.json``, replicas
    per node before and after the history, the skew points, and ``rows``: called once, while
    the report is written, it yields the rebalances in (zone, partition, start) order for
    ``rebalances.csv`` (the Spark engine streams them from the executors)."""

    stats: Mapping[str, ZoneStats]
    rebalances: int
    durations: Sequence[float]
    meta: Mapping[str, Any]
    load_before: Mapping[str, int]
    load_after: Mapping[str, int]
    skew: Sequence[SkewPoint]
    rows: Callable[[], Iterable[Rebalance]]


def report_json(
    stats: Mapping[str, ZoneStats], items: Sequence[Rebalance], meta: Mapping[str, Any]
) -> dict[str, Any]:
    """The numbers of the report (``report.json``)."""
    return numbers_json(stats, len(items), done_durations(items), meta)


def done_durations(items: Iterable[Rebalance]) -> list[float]:
    """The durations of the ``done`` rebalances (seconds), in their order."""
    return [d for r in items if (d := r.duration_s) is not None]


def numbers_json(
    stats: Mapping[str, ZoneStats],
    rebalances: int,
    durations: Sequence[float],
    meta: Mapping[str, Any],
) -> dict[str, Any]:
    """:func:`report_json` from the zones' statistics, the number of rebalances and every
    ``done`` duration (in any order: :meth:`Durations.of` sorts them) — what the Spark engine
    brings to the driver instead of the rebalances."""
    return {
        "history": dict(meta),
        "totals": {
            "zones": len(stats),
            "rebalances": rebalances,
            "done": sum(s.outcomes.get(DONE, 0) for s in stats.values()),
            "in_progress": sum(s.outcomes.get(IN_PROGRESS, 0) for s in stats.values()),
            "moves": sum(s.moves for s in stats.values()),
            "bytes_moved": sum(s.bytes_moved for s in stats.values()),
            "bytes_to_move": sum(s.bytes_to_move for s in stats.values()),
            "duration_s": _durations_json(Durations.of(durations)),
        },
        "zones": {
            name: {
                "rebalances": s.rebalances,
                "outcomes": dict(s.outcomes),
                "moves": s.moves,
                "moves_done": s.moves_done,
                "moves_in_progress": s.moves_in_progress,
                "bytes_moved": s.bytes_moved,
                "bytes_to_move": s.bytes_to_move,
                "duration_s": _durations_json(s.durations),
            }
            for name, s in stats.items()
        },
    }


def _durations_json(d: Durations) -> dict[str, Any]:
    return {"count": d.count, "mean": d.mean, "median": d.median, "p90": d.p90, "max": d.max}
