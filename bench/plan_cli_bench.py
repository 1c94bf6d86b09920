"""How long ``placectl plan`` takes for 300,000 replicas, as a whole process (issue 15, item 6).

    .venv/bin/python bench/plan_cli_bench.py [--runs 7] [--baseline GIT_REF]

Two snapshots of two zones of 50,000 partitions × 3 replicas on 1,000 nodes in 20 racks (the
zones spread over racks): ``fresh`` (no stable assignment) and ``leave`` (the stable assignment
``fresh``'s plan gives, with one node gone: 300,000 current pairs read, 300 re-placed). Each is
planned ``--runs`` times in a fresh process (``placectl plan --input F --output OUT``), timed
from spawn to exit like ``bench/startup_bench.py``; ``--baseline`` measures that commit too, in
the same run, and checks both trees write byte-identical plans. Results go to
``bench/results/plan_cli.md`` with the machine and its load.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from startup_bench import PLACECTL, cpu_model, exported, time_runs

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "plan_cli.md"
NODES, RACKS, ZONES, PARTITIONS, REPLICAS = 1000, 20, 2, 50_000, 3


def snapshots(work: Path) -> dict[str, Path]:
    """The ``fresh`` and ``leave`` snapshots (module docstring), written under ``work``."""
    nodes = [
        {"name": f"node-{i:04d}", "attributes": {"rack": f"r{i % RACKS}"}} for i in range(NODES)
    ]
    zones = [
        {"name": f"z{z}", "partitions": PARTITIONS, "replicas": REPLICAS, "failure_domain": "rack"}
        for z in range(ZONES)
    ]
    fresh = work / "fresh.json"
    fresh.write_text(json.dumps({"nodes": nodes, "zones": zones}))
    planned = work / "fresh-plan.json"
    subprocess.run(
        [*PLACECTL, "plan", "--input", str(fresh), "--output", str(planned)],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    plan = json.loads(planned.read_text())
    for zone, out in zip(zones, plan["zones"], strict=True):
        zone["stable"] = out["assignments"]
    leave = work / "leave.json"
    leave.write_text(json.dumps({"nodes": nodes[1:], "zones": zones}))
    return {"fresh": fresh, "leave": leave}


def measure(tree: Path, inputs: dict[str, Path], out: Path, runs: int) -> dict[str, list[float]]:
    times = {}
    for name, path in inputs.items():
        argv = [*PLACECTL, "plan", "--input", str(path), "--output", str(out / f"{name}.json")]
        times[name] = time_runs(argv, tree, runs, 0)
    return times


def table(label: str, results: dict[str, list[float]]) -> list[str]:
    lines = [f"### {label}", "", "| snapshot | median (s) | min (s) |", "|---|---|---|"]
    for name, times in results.items():
        lines.append(f"| `{name}` | {statistics.median(times):.3f} | {min(times):.3f} |")
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--baseline", help="Also measure this git ref (e.g. the commit before).")
    parser.add_argument(
        "--plans-may-differ",
        action="store_true",
        help="The baseline places differently on purpose (e.g. before the fleet tie-breaker):"
        " report which plans differ instead of stopping.",
    )
    args = parser.parse_args()
    sections: list[str] = []
    with tempfile.TemporaryDirectory(prefix="plan-cli-bench-") as tmp:
        work = Path(tmp)
        inputs = snapshots(work)
        differ: list[str] = []
        (work / "after").mkdir()
        if args.baseline:
            (work / "before").mkdir()
            with exported(args.baseline) as tree:
                before = measure(tree, inputs, work / "before", args.runs)
            sections += table(f"Before: `{args.baseline}`", before)
        after = measure(ROOT, inputs, work / "after", args.runs)
        if args.baseline:
            for name in inputs:
                if not filecmp.cmp(
                    work / "before" / f"{name}.json", work / "after" / f"{name}.json", shallow=False
                ):
                    if not args.plans_may_differ:
                        raise SystemExit(f"{name}: the plans of the two trees differ")
                    differ.append(name)
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    sections += table(f"This tree (HEAD `{head}`, working tree as measured)", after)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    report = [
        "# placectl plan of 300,000 replicas",
        "",
        f"`{' '.join(['python', 'bench/plan_cli_bench.py', *sys.argv[1:]])}`: {ZONES} zones of "
        f"{PARTITIONS:,} partitions × {REPLICAS} on {NODES:,} nodes in {RACKS} racks (failure "
        "domain `rack`); `fresh` has no stable assignment, `leave` is `fresh`'s plan as stable "
        "with one node gone. Wall time of a fresh `placectl plan` process, spawn to exit, input "
        "and output JSON included, the tree's bytecode cached (written by a warm-up run, as an "
        "install has it)."
        + (
            " Both trees wrote byte-identical plans."
            if args.baseline and not differ
            else f" The trees' plans differ ({', '.join(differ)}: --plans-may-differ)."
            if differ
            else ""
        ),
        "",
        f"Machine: {len(os.sched_getaffinity(0))} CPU(s) (nproc), {cpu_model()}; Python "
        f"{platform.python_version()}; {args.runs} runs per snapshot; load average at the end "
        f"{load}.",
        "",
        *sections,
    ]
    RESULTS.write_text("\n".join(report))
    print("\n".join(report))


if __name__ == "__main__":
    main()
