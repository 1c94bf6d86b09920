"""Placement against its exact oracle on 10,000 random small zones; weakened variants.

Run from the repository root::

    .venv/bin/python bench/placement_oracle_bench.py [--instances 10000]

The oracle (tests/unit/placement_mip.py) states placement's targets as a MIP and solves, with
HiGHS, the most current pairs any assignment meeting them keeps, then the fewest primary
changes among those. Instances come from the suite's generator
(``test_placement_mip.random_case``: P ≤ 12, N ≤ 8, R ≤ 4, weights, a selector, departed nodes,
duplicates, over-long rows, stray partitions), half with failure domains. Zones with fewer
domains than R' are not modelled by the oracle and are counted apart. Then each weakened variant
(a deliberate bug) runs on the flat instances (solver variants) or on those with failure domains
(the joint steps of placement.algo.domain_keep), and the run counts those where the oracle sees
it keep fewer pairs than the optimum. Writes bench/results/placement_oracle.md.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "unit"))

import numpy as np  # noqa: E402
from placement_mip import Optimum, kept_and_changes, optimum  # noqa: E402
from run_info import run_section, uptime  # noqa: E402
from test_placement_mip import random_case  # noqa: E402

import placement.algo.joint as joint  # noqa: E402
import placement.algo.place as place_module  # noqa: E402
import placement.algo.solver as solver  # noqa: E402
from placement.algo.place import place  # noqa: E402
from placement.core.model import Node, ZoneSpec  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "placement_oracle.md"
#: One compared instance: the zone, its nodes, its current assignment and the oracle's optimum.
Solved = tuple[ZoneSpec, list[Node], dict[int, list[str]], Optimum]


def _greedy_keep(*args: object, **kwargs: object) -> bool:
    return True  # trust the greedy keep: never complete it by augmenting paths


def _ceil_by_key(pb: solver.CoreProblem, load: np.ndarray) -> np.ndarray:
    cand = np.flatnonzero(pb.targets.eligible)
    order = np.argsort(pb.node_key[cand], kind="stable")  # ignores who holds most above floor
    ceil = np.zeros(pb.n_nodes, dtype=np.bool_)
    ceil[cand[order[: pb.targets.extra]]] = True
    return ceil


def _no_swap(*args: object, **kwargs: object) -> tuple[np.ndarray, np.ndarray]:
    node, pending = args[4], args[5]
    assert isinstance(node, np.ndarray)
    assert isinstance(pending, np.ndarray)
    return np.where(pending, -1, node), pending.copy()  # conflicts go to the general search


def _levels_only(ctx: object, dom: object, pairs: object, limits: object) -> object:
    return pairs  # the levels' answer as it is: no joint bound, no kept set handed down


def _no_drop_tiers(*args: object, **kwargs: object) -> None:
    return None  # level 1 sheds without knowing which pairs level 2 loses anyway


#: name -> (what it breaks, the patch: module attribute -> replacement); solver variants run
#: on the flat instances, place variants on the ones with failure domains.
VARIANTS: dict[str, tuple[str, dict[str, Callable[..., object]]]] = {
    "greedy-keep": (
        "the greedy keep is trusted: no augmenting paths complete it",
        {"_keep_is_maximal": _greedy_keep},
    ),
    "ceil-by-key": (
        "the +1 slots go by node key, not to the nodes holding most above their floor",
        {"_choose_ceil": _ceil_by_key},
    ),
    "no-swap-repair": (
        "conflicts skip the 0-cost swaps (a control: only slower, never worse)",
        {"_swap_repair": _no_swap},
    ),
    "levels-only": (
        "failure domains: the two levels' answer as it is (no joint bound, no drop tiers)",
        {"_keep_most": _levels_only, "_drop_tiers": _no_drop_tiers},
    ),
    "no-joint-bound": (
        "failure domains: drop tiers only (no joint bound, no kept set handed down)",
        {"_keep_most": _levels_only},
    ),
}
#: The variants that patch placement.algo.place and run on the instances with domains.
DOMAIN_VARIANTS = {"levels-only", "no-joint-bound"}


def _nothing(*args: object, **kwargs: object) -> None:
    return None


#: Variants of the members chosen for their primaries (placement.algo.joint), run on flat
#: instances and on instances with domains: counted where the primaries change more than the
#: optimum.
PRIMARY_VARIANTS: dict[str, tuple[str, dict[str, Callable[..., object]]]] = {
    "(none)": ("nothing: the product, for comparison on the same instances", {}),
    "no-ports": (
        "the member sets are not re-chosen on the circulation with kept-primary ports",
        {"members_for_primaries": _nothing},
    ),
    "no-exchanges": (
        "no member moved or swapped between two rows for the primaries' floors",
        {"exchanges": _nothing},
    ),
    "core-members": (
        "the core's members as they are (neither of the two)",
        {"members_for_primaries": _nothing, "exchanges": _nothing},
    ),
}


@contextlib.contextmanager
def patched(module: object, patch: dict[str, Callable[..., object]]) -> Iterator[None]:
    saved = {name: getattr(module, name) for name in patch}
    try:
        for name, value in patch.items():
            setattr(module, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--instances", type=int, default=10_000)
    parser.add_argument("--variant-instances", type=int, default=2_000)
    args = parser.parse_args()
    started = time.time()
    load = [uptime()]
    rng = random.Random(2026)
    tally: dict[str, Counter[str]] = {"flat": Counter(), "domains": Counter()}
    gaps: dict[str, Counter[int]] = {"kept": Counter(), "primary": Counter()}
    flat_cases: list[Solved] = []
    domain_cases: list[Solved] = []
    examples: list[str] = []
    for k in range(args.instances):
        kind = "domains" if k % 2 else "flat"
        zone, nodes, current = random_case(rng, domains=kind == "domains")
        if not any(n.matches(zone.node_selector) for n in nodes):
            tally[kind]["no eligible node"] += 1
            continue
        best = optimum(zone, nodes, current)
        if best is None:
            tally[kind]["fewer domains than R' (not modelled)"] += 1
            continue
        got = kept_and_changes(zone, nodes, current, place(zone, nodes, current).assignments)
        tally[kind]["compared"] += 1
        (flat_cases if kind == "flat" else domain_cases).append((zone, nodes, current, best))
        if got.kept < best.kept:
            tally[kind]["kept fewer than the optimum"] += 1
            gaps["kept"][best.kept - got.kept] += 1
            if len(examples) < 3:
                examples.append(
                    f"{kind}: kept {got.kept} of {best.kept}; {zone}; {nodes}; {current}"
                )
        elif got.kept > best.kept:
            raise SystemExit(f"oracle below the function: {zone} {nodes} {current}")
        else:
            tally[kind]["kept = optimum"] += 1
            if got.primary_changes == best.primary_changes:
                tally[kind]["primary changes = optimum"] += 1
            else:
                tally[kind]["primary changes above the optimum"] += 1
                gaps["primary"][got.primary_changes - best.primary_changes] += 1
    load.append(uptime())
    caught: list[tuple[str, str, int, int]] = []
    for name, (what, patch) in VARIANTS.items():
        worse = 0
        domains = name in DOMAIN_VARIANTS
        tried = (domain_cases if domains else flat_cases)[: args.variant_instances]
        with patched(place_module if domains else solver, patch):
            for zone, nodes, current, best in tried:
                try:
                    result = place(zone, nodes, current)
                except Exception:  # a broken variant may also crash: the oracle test fails
                    worse += 1
                    continue
                if kept_and_changes(zone, nodes, current, result.assignments).kept < best.kept:
                    worse += 1
        caught.append((name, what, worse, len(tried)))
        print(f"variant {name}: {worse} of {len(tried)} below the optimum", flush=True)
    primary_caught: list[tuple[str, str, int, int, int, int]] = []
    for name, (what, patch) in PRIMARY_VARIANTS.items():
        counts = []
        for cases in (flat_cases, domain_cases):
            tried = cases[: args.variant_instances]
            worse = 0
            with patched(joint, patch):
                for zone, nodes, current, best in tried:
                    result = place(zone, nodes, current)
                    got = kept_and_changes(zone, nodes, current, result.assignments)
                    worse += got.kept < best.kept or got.primary_changes > best.primary_changes
            counts += [worse, len(tried)]
        primary_caught.append((name, what, *counts))
        print(f"variant {name}: {counts[0]} + {counts[2]} above the optimum", flush=True)
    load.append(uptime())
    lines = [
        "# Placement against its exact oracle",
        "",
        "Produced by `.venv/bin/python bench/placement_oracle_bench.py` (do not edit by hand).",
        f"{args.instances:,} random small zones (P ≤ 12, N ≤ 8, R ≤ 4; weights, selectors,"
        " departed nodes, duplicates, over-long rows; half with a failure domain), each solved"
        " by the MIP oracle of tests/unit/placement_mip.py (HiGHS): the most current pairs kept"
        " under placement's targets, then the fewest primary changes among those.",
        "",
        "| instances | flat | with failure domains |",
        "|---|---:|---:|",
    ]
    keys = sorted(set(tally["flat"]) | set(tally["domains"]))
    lines += [f"| {k} | {tally['flat'][k]:,} | {tally['domains'][k]:,} |" for k in keys]
    lines += [
        "",
        "Pairs short of the optimum (gap: instances): "
        + (", ".join(f"{g}: {c}" for g, c in sorted(gaps["kept"].items())) or "none")
        + ". Primary changes above the optimum, where the kept pairs are optimal (gap:"
        " instances): "
        + (", ".join(f"{g}: {c}" for g, c in sorted(gaps["primary"].items())) or "none")
        + ".",
        "",
    ]
    if examples:
        lines += ["Examples:", "", *(f"- `{e}`" for e in examples), ""]
    lines += [
        "## Weakened variants (flat instances; the last two on instances with failure domains)",
        "",
        "| variant | what it breaks | instances below the optimum |",
        "|---|---|---:|",
        *(f"| {n} | {w} | {c:,} of {t:,} |" for n, w, c, t in caught),
        "",
        "## Weakened variants of the primaries (placement.algo.joint)",
        "",
        "| variant | what it breaks | flat instances above the optimum | with failure domains |",
        "|---|---|---:|---:|",
        *(
            f"| {n} | {w} | {a:,} of {b:,} | {c:,} of {d:,} |"
            for n, w, a, b, c, d in primary_caught
        ),
        "",
        *run_section(started, load, "start / after the comparison / end"),
    ]
    RESULTS.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
