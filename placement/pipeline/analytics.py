"""Report statistics over reconstructed rebalances (pure): per zone and for the fleet."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from placement.pipeline.history import DONE, IN_PROGRESS, Rebalance


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


def report_json(
    stats: Mapping[str, ZoneStats], items: Sequence[Rebalance], meta: Mapping[str, Any]
) -> dict[str, Any]:
    """The numbers of the report (``report.json``)."""
    durations = [d for r in items if (d := r.duration_s) is not None]
    return {
        "history": dict(meta),
        "totals": {
            "zones": len(stats),
            "rebalances": len(items),
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
