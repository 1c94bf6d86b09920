"""Placement benchmark: our stateful place() against rendezvous hashing and a hash ring.

Run from the repository root::

    .venv/bin/python bench/placement_bench.py

Scenarios (the performance goals of the placement issue):

(a) fresh zone, P=100,000, R=3, N=1,000 — minimum moves S (everything is new);
(b) one node joins a balanced zone, P=10,000, R=3, N=100 → 101 — minimum ⌊S/(N+1)⌋;
(c) one node leaves, same size, N=100 → 99 — minimum: the leaving node's load.

Every algorithm gets the same node names and sizes. For the stateless baselines a change is a
full recomputation; for place() the previous assignment is the current input. Times are the best
of several runs. Prints a table and writes bench/results/placement.md.
"""

from __future__ import annotations

import datetime
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from baselines import hash_ring, rendezvous
from numpy.typing import NDArray

from placement.model import Node, ZoneSpec
from placement.placement import place

I64 = NDArray[np.int64]
RESULTS = Path(__file__).resolve().parent / "results" / "placement.md"
#: A baseline whose estimated time exceeds this is reported as skipped.
TIME_BOX_S = 60.0
REPEATS = 3
INTRO = f"""\
Produced by `.venv/bin/python bench/placement_bench.py` (do not edit by hand). Times are the
best of {REPEATS} runs of one call. The baselines recompute from scratch after a change; place()
starts from the previous assignment. "minimum" is S for (a), ⌊S/(N+1)⌋ for (b), and for (c) the
leaving node's load in the algorithm's own previous assignment. A stateless baseline that leaves
the zone unbalanced can move fewer than the balanced minimum (ratio < 1). Spreads are over the
eligible nodes after the change; "primary" counts first members.
"""


@dataclass(frozen=True)
class Row:
    scenario: str
    algorithm: str
    seconds: float | None
    moves: int
    minimum: int
    spread: int
    max_mean: float
    primary_spread: int
    primary_max_mean: float


def names(count: int) -> list[str]:
    return [f"node-{i:04d}" for i in range(count)]


def best_time(fn: Callable[[], I64], repeats: int = REPEATS) -> tuple[float, I64]:
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    assert result is not None
    return best, result


def ours(
    partitions: int, replicas: int, nodes: list[str], current: I64 | None, pool: list[str]
) -> I64:
    """place() on names, converted to the index matrix the scoring uses (not timed)."""
    zone = ZoneSpec("bench", partitions, replicas)
    cur = (
        None
        if current is None
        else {p: [pool[i] for i in row] for p, row in enumerate(current.tolist())}
    )
    result = place(zone, [Node(n) for n in nodes], cur)
    index = {n: i for i, n in enumerate(pool)}
    return np.asarray([[index[x] for x in peers] for peers in result.assignments], dtype=np.int64)


def timed_ours(
    partitions: int, replicas: int, nodes: list[str], current: I64 | None, pool: list[str]
) -> tuple[float, I64]:
    zone = ZoneSpec("bench", partitions, replicas)
    node_objs = [Node(n) for n in nodes]
    cur = (
        None
        if current is None
        else {p: [pool[i] for i in row] for p, row in enumerate(current.tolist())}
    )
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        place(zone, node_objs, cur)
        best = min(best, time.perf_counter() - start)
    return best, ours(partitions, replicas, nodes, current, pool)


def timed_baseline(
    algorithm: Callable[[int, int, list[str]], I64],
    partitions: int,
    replicas: int,
    nodes: list[str],
    pool: list[str],
) -> tuple[float | None, I64 | None]:
    """Time-boxed: a run at a tenth of the partitions predicts the full one."""
    small = max(1, partitions // 10)
    start = time.perf_counter()
    algorithm(small, replicas, nodes)
    estimate = (time.perf_counter() - start) * partitions / small
    if estimate > TIME_BOX_S:
        return None, None
    seconds, local = best_time(lambda: algorithm(partitions, replicas, nodes))
    index = {n: i for i, n in enumerate(pool)}
    remap = np.asarray([index[n] for n in nodes], dtype=np.int64)
    return seconds, remap[local]


def new_pairs(before: I64 | None, after: I64) -> int:
    if before is None:
        return after.size
    moves = 0
    for row_before, row_after in zip(before.tolist(), after.tolist(), strict=True):
        moves += len(set(row_after) - set(row_before))
    return moves


def score(
    scenario: str,
    algorithm: str,
    seconds: float | None,
    before: I64 | None,
    after: I64,
    eligible: list[int],
    minimum: int,
) -> Row:
    load = np.bincount(after.ravel(), minlength=max(eligible) + 1)[eligible]
    lead = np.bincount(after[:, 0], minlength=max(eligible) + 1)[eligible]
    return Row(
        scenario,
        algorithm,
        seconds,
        new_pairs(before, after),
        minimum,
        int(load.max() - load.min()),
        float(load.max() / load.mean()),
        int(lead.max() - lead.min()),
        float(lead.max() / lead.mean()),
    )


def skipped(scenario: str, algorithm: str, minimum: int) -> Row:
    return Row(scenario, algorithm, None, -1, minimum, -1, float("nan"), -1, float("nan"))


BASELINES: dict[str, Callable[[int, int, list[str]], I64]] = {
    "rendezvous (HRW)": lambda p, r, n: rendezvous(p, r, n, seed="bench"),
    "hash ring (32 pts)": lambda p, r, n: hash_ring(p, r, n, seed="bench"),
}


def scenario_fresh() -> list[Row]:
    p, r, n = 100_000, 3, 1_000
    pool = names(n)
    label = f"(a) fresh P={p:,} R={r} N={n:,}"
    rows = []
    seconds, after = timed_ours(p, r, pool, None, pool)
    rows.append(score(label, "place() (ours)", seconds, None, after, list(range(n)), p * r))
    for name, algorithm in BASELINES.items():
        t, result = timed_baseline(algorithm, p, r, pool, pool)
        rows.append(
            skipped(label, name, p * r)
            if result is None
            else score(label, name, t, None, result, list(range(n)), p * r)
        )
    return rows


def scenario_change(join: bool) -> list[Row]:
    p, r, n = 10_000, 3, 100
    pool = names(n + 1)
    before_nodes = pool[:n]
    after_nodes = pool[: n + 1] if join else pool[: n - 1]
    leaving = n - 1
    label = (
        f"(b) join P={p:,} R={r} N={n}→{n + 1}"
        if join
        else f"(c) leave P={p:,} R={r} N={n}→{n - 1}"
    )
    eligible = list(range(len(after_nodes)))
    rows = []
    before = ours(p, r, before_nodes, None, pool)
    minimum = p * r // (n + 1) if join else int((before == leaving).sum())
    seconds, after = timed_ours(p, r, after_nodes, before, pool)
    rows.append(score(label, "place() (ours)", seconds, before, after, eligible, minimum))
    for name, algorithm in BASELINES.items():
        _, base_before = timed_baseline(algorithm, p, r, before_nodes, pool)
        t, base_after = timed_baseline(algorithm, p, r, after_nodes, pool)
        if base_before is None or base_after is None:
            rows.append(skipped(label, name, minimum))
            continue
        own_min = minimum if join else int((base_before == leaving).sum())
        rows.append(score(label, name, t, base_before, base_after, eligible, own_min))
    return rows


def table(rows: list[Row]) -> str:
    header = (
        "| scenario | algorithm | time (s) | moves | minimum | moves ÷ min "
        "| spread (max−min) | max/mean | primary spread | primary max/mean |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for row in rows:
        if row.seconds is None:
            head = f"| {row.scenario} | {row.algorithm} | skipped (>60 s) |"
            lines.append(f"{head} | {row.minimum:,} | | | | | |")
            continue
        lines.append(
            f"| {row.scenario} | {row.algorithm} | {row.seconds:.3f} "
            f"| {row.moves:,} | {row.minimum:,} "
            f"| {row.moves / row.minimum:.3f} | {row.spread} | {row.max_mean:.3f} "
            f"| {row.primary_spread} | {row.primary_max_mean:.3f} |"
        )
    return header + "\n".join(lines) + "\n"


def machine() -> str:
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        lscpu = "lscpu unavailable\n"
    head = "\n".join(lscpu.splitlines()[:10])
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in lscpu.splitlines()
            if line.startswith("Model name")
        ),
        "?",
    )
    cpus = next(
        (line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("CPU(s)")),
        "?",
    )
    return (
        f"- date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}\n"
        f"- CPU: {model}, {cpus} CPU(s)\n"
        f"- Python {platform.python_version()} ({platform.python_implementation()}), "
        f"numpy {np.__version__}, {platform.system()} {platform.release()}\n\n"
        f"`lscpu | head`:\n\n```\n{head}\n```\n"
    )


def main() -> int:
    rows = scenario_fresh() + scenario_change(join=True) + scenario_change(join=False)
    text = table(rows)
    print(text)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(f"# Placement benchmark\n\n{INTRO}\n{text}\n## Machine\n\n{machine()}")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
