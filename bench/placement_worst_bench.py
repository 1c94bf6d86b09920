"""Placement's worst case: adversarial current assignments on P = 65,536, N = 1,000.

Run from the repository root::

    .venv/bin/python bench/placement_worst_bench.py [--quick] [--only TEXT]

Every construction below is a current assignment built to defeat one of place()'s shortcuts
(design/placement.md, "How it stays fast"): the greedy keep, the bulk fill, the swap repair
and — behind them — the SPFA fallback, O(P·N) per augmenting path. Each is run with and without
failure domains (20 racks of 50 nodes; and 2 racks, fewer than R', where every partition spans
both), with equal and with mixed weights, and while R changes at the same time. The time is
one call of ``place()`` (the best and the worst of ``REPEATS``, after ``gc.collect()``); every
result is checked (R' distinct eligible members per partition, the domain spread). Then a
random search at P = 4,096, N = 64 mixes the constructions' ingredients and keeps the slowest
per pair, which is re-run at full size. Writes bench/results/placement_worst.md.

Goal (the placement issue): the worst time constructed ≤ 2 s.
"""

from __future__ import annotations

import argparse
import gc
import math
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from run_info import run_section, uptime

from placement.algo.place import place
from placement.core.model import Node, ZoneSpec

RESULTS = Path(__file__).resolve().parent / "results" / "placement_worst.md"
REPEATS = 3
GOAL_S = 2.0
#: Random mixes tried at P = 4,096, N = 64.
SEARCH_ROUNDS = 100
#: A call still running after this many seconds is stopped and reported as such.
TIME_BOX_S = 60.0

Current = dict[int, list[str]]


@dataclass(frozen=True)
class Case:
    name: str
    #: How the current assignment is built: (rng, partitions, node names, R before) -> current.
    build: Callable[[random.Random, int, list[str], int], Current]
    before: int  # R of the current assignment
    after: int  # R asked for
    departed: float  # share of the nodes gone (every other one, then more)


def shuffled(rng: random.Random, p: int, names: list[str], r: int) -> Current:
    """Every pair shuffled: each partition on r uniformly random nodes."""
    return {q: rng.sample(names, r) for q in range(p)}


def crowded(rng: random.Random, p: int, names: list[str], r: int) -> Current:
    """Everything on 5 % of the nodes: the keep must shed almost every pair."""
    few = names[: max(r, len(names) // 20)]
    return {q: rng.sample(few, r) for q in range(p)}


def mirrored(rng: random.Random, p: int, names: list[str], r: int) -> Current:
    """Whole blocks of partitions on the same r nodes: every shed row meets the same nodes."""
    blocks = [rng.sample(names, r) for _ in range(max(1, len(names) // (4 * r)))]
    return {q: list(blocks[q % len(blocks)]) for q in range(p)}


def striped(rng: random.Random, p: int, names: list[str], r: int) -> Current:
    """Consecutive nodes per partition, in node order: the bulk fill's runs of one node's
    slots meet rows that already hold its neighbours."""
    n = len(names)
    return {q: [names[(q + k) % n] for k in range(r)] for q in range(p)}


def ragged(rng: random.Random, p: int, names: list[str], r: int) -> Current:
    """Rows of 0..2r members with duplicates and unknown names, and gaps in the keys."""
    current: Current = {}
    for q in range(p):
        if rng.random() < 0.1:
            continue
        size = rng.randrange(0, 2 * r + 1)
        row = [rng.choice(names) for _ in range(size)]
        if row and rng.random() < 0.2:
            row.append(row[0])
        if rng.random() < 0.05:
            row.append("departed-long-ago")
        current[q] = row
    return current


BUILDERS = {f.__name__: f for f in (shuffled, crowded, mirrored, striped, ragged)}


def make_nodes(n: int, domains: int | None, weighted: bool, rng: random.Random) -> list[Node]:
    weights = [0.5, 1.0, 1.0, 2.0, 4.0]
    return [
        Node(
            f"n{i:04d}",
            {"rack": f"r{i % domains:02d}"} if domains else {},
            rng.choice(weights) if weighted else 1.0,
        )
        for i in range(n)
    ]


def check(zone: ZoneSpec, eligible: list[Node], assignments: tuple[tuple[str, ...], ...]) -> None:
    names = {n.name for n in eligible}
    width = min(zone.replicas, len(eligible))
    rack = {n.name: n.attributes.get("rack", n.name) for n in eligible}
    spread = min(width, len(set(rack.values())))
    for peers in assignments:
        if len(peers) != width or len(set(peers)) != width or not set(peers) <= names:
            raise SystemExit(f"invalid partition {peers} for {zone}")
        if zone.failure_domain and len({rack[x] for x in peers}) != spread:
            raise SystemExit(f"partition {peers} spans too few domains")


def live_nodes(nodes: list[Node], departed: float, rng: random.Random) -> list[Node]:
    if departed <= 0:
        return nodes
    gone = set(rng.sample(range(len(nodes)), int(len(nodes) * departed)))
    return [n for i, n in enumerate(nodes) if i not in gone]


class TimeBox(Exception):
    """A call ran past the time box (raised by SIGALRM inside place())."""


def _alarm(signum: int, frame: object) -> None:
    raise TimeBox


def timed(zone: ZoneSpec, nodes: list[Node], current: Current) -> tuple[float, float]:
    """Best and worst of ``REPEATS`` calls (one when a call takes over ``GOAL_S``); ``inf``
    for a call stopped at ``TIME_BOX_S``."""
    times: list[float] = []
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for _ in range(REPEATS):
            gc.collect()
            start = time.perf_counter()
            signal.setitimer(signal.ITIMER_REAL, TIME_BOX_S)
            try:
                result = place(zone, nodes, current)
            except TimeBox:
                return math.inf, math.inf
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            times.append(time.perf_counter() - start)
            check(zone, nodes, result.assignments)
            if times[-1] > GOAL_S:
                break
    finally:
        signal.signal(signal.SIGALRM, previous)
    return min(times), max(times)


def seconds(t: float) -> str:
    return f"> {TIME_BOX_S:g} (stopped)" if math.isinf(t) else f"{t:.3f}"


def cases() -> list[Case]:
    out = []
    for name in BUILDERS:
        out.append(Case(name, BUILDERS[name], 3, 3, 0.0))
        out.append(Case(name, BUILDERS[name], 3, 4, 0.5))
        out.append(Case(name, BUILDERS[name], 5, 2, 0.5))
    return out


LAYOUTS = (("flat", None, False), ("flat, weighted", None, True), ("20 racks", 20, False),
           ("20 racks, weighted", 20, True), ("2 racks", 2, False))  # fmt: skip


@dataclass(frozen=True)
class Mix:
    """One random mix of the constructions' ingredients (the search's unit)."""

    builder: str
    before: int
    after: int
    departed: float
    layout: int

    def __str__(self) -> str:
        return (
            f"{self.builder}, R {self.before} → {self.after}, {int(self.departed * 100)} %"
            f" departed, {LAYOUTS[self.layout][0]}"
        )


def search(rng: random.Random, rounds: int) -> list[tuple[float, Mix]]:
    """Random mixes at P = 4,096, N = 64; the slowest per replica first."""
    found = []
    for _ in range(rounds):
        mix = Mix(
            rng.choice(list(BUILDERS)),
            rng.randint(1, 6),
            rng.randint(1, 6),
            rng.choice([0.0, 0.25, 0.5, 0.75]),
            rng.randrange(len(LAYOUTS)),
        )
        found.append((run_mix(rng, mix, 4096, 64)[1] / (4096 * mix.after), mix))
    found.sort(key=lambda x: -x[0])
    return found


def run_mix(rng: random.Random, mix: Mix, p: int, n: int) -> tuple[float, float]:
    _, domains, weighted = LAYOUTS[mix.layout]
    nodes = make_nodes(n, domains, weighted, rng)
    current = BUILDERS[mix.builder](rng, p, [x.name for x in nodes], mix.before)
    live = live_nodes(nodes, mix.departed, rng)
    zone = ZoneSpec("z", p, mix.after, failure_domain="rack" if domains else None)
    return timed(zone, live, current)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="P = 8,192, N = 200, no search")
    parser.add_argument(
        "--only",
        metavar="TEXT",
        help="time only the constructions whose description contains TEXT (each built from"
        " the same random stream as in a whole run), no search, no results file",
    )
    args = parser.parse_args()
    p, n = (8192, 200) if args.quick else (65536, 1000)
    rng = random.Random(1)
    started = time.time()
    load = [uptime()]
    rows = []
    worst = (0.0, "")
    for case in cases():
        for label, domains, weighted in LAYOUTS:
            nodes = make_nodes(n, domains, weighted, rng)
            current = case.build(rng, p, [x.name for x in nodes], case.before)
            live = live_nodes(nodes, case.departed, rng)
            zone = ZoneSpec("z", p, case.after, failure_domain="rack" if domains else None)
            what = (
                f"{case.name}, R {case.before} → {case.after},"
                f" {int(case.departed * 100)} % departed, {label}"
            )
            if args.only is not None and args.only not in what:
                continue
            best, slowest = timed(zone, live, current)
            rows.append((what, best, slowest))
            worst = max(worst, (slowest, what))
            print(f"{what}: {seconds(best)} / {seconds(slowest)} s", flush=True)
    load.append(uptime())
    searched: list[tuple[str, float, float]] = []
    if args.only is not None:
        return 0
    if not args.quick:
        for _, mix in search(rng, SEARCH_ROUNDS)[:5]:
            best, slowest = run_mix(rng, mix, p, n)
            searched.append((str(mix), best, slowest))
            worst = max(worst, (slowest, f"search: {mix}"))
            print(f"search {mix}: {seconds(best)} / {seconds(slowest)} s", flush=True)
    load.append(uptime())
    if args.quick:
        print(f"worst {seconds(worst[0])} s: {worst[1]}")
        return 0
    lines = [
        "# Placement's worst case",
        "",
        "Produced by `.venv/bin/python bench/placement_worst_bench.py` (do not edit by hand).",
        f"P = {p:,}, N = {n:,} (before departures); one `place()` call per run, best and worst"
        f" of {REPEATS} after `gc.collect()` (one run when it takes over {GOAL_S:g} s; a run"
        f" still going after {TIME_BOX_S:g} s is stopped); every result checked (R' distinct"
        " eligible members, the domain spread). Constructions: see the module docstring.",
        "",
        f"**Worst time constructed: {seconds(worst[0])} s** ({worst[1]}); goal ≤ {GOAL_S:g} s:"
        f" {'met' if worst[0] <= GOAL_S else 'NOT met'}.",
        "",
        "| current assignment | best s | worst s |",
        "|---|---:|---:|",
        *(f"| {w} | {seconds(b)} | {seconds(s)} |" for w, b, s in rows),
        "",
        f"Random search ({SEARCH_ROUNDS} mixes at P = 4,096, N = 64, ranked by time per"
        " replica; the five slowest re-run at full size):",
        "",
        "| mix | best s | worst s |",
        "|---|---:|---:|",
        *(f"| {w} | {seconds(b)} | {seconds(s)} |" for w, b, s in searched),
        "",
        *run_section(started, load, "start / after the constructions / end"),
    ]
    RESULTS.write_text("\n".join(lines))
    print(f"worst {seconds(worst[0])} s: {worst[1]}; wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
