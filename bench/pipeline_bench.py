"""Fleet what-if planning: ``--engine local`` vs ``--engine spark`` (``local[2]``) side by side.

A synthetic fleet — 2,000 zones × 512 partitions × 3 replicas over 1,000 nodes in 10 racks, its
stable assignments produced by ``place()`` itself zone after zone with the fleet's tally (as the
driver creates them: balanced per zone and across the fleet), one size report per partition —
is written once as an export directory (cached under ``--data``; the directory name says
``fleet-balanced``). Each engine then
plans it with one node removed, as a ``placectl plan`` subprocess; the bench samples the RSS of
that whole process tree (placectl, the JVM, Spark's Python workers) with psutil every 0.1 s.

    .venv/bin/python bench/pipeline_bench.py [--zones 2000] [--partitions 512] [--nodes 1000]
        [--standalone]

``--standalone`` also plans on a Spark standalone cluster on loopback (one master, one worker of
``--worker-cores`` cores, started from the pyspark package by ``placement.local.spark_standalone``;
as root the worker runs as ``nobody`` with this checkout hidden, so the environment is shipped
with ``--ship-env auto``, its packing timed separately). Prints a Markdown table (recorded in
bench/results/pipeline.md) and checks that every plan is byte-identical.
"""

from __future__ import annotations

import argparse
import contextlib
import filecmp
import os
import platform
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from placement.algo.fleet import FleetTally
from placement.algo.place import place
from placement.core.model import Node, ZoneSpec
from placement.pipeline.export import write_tables

ROOT = Path(__file__).resolve().parents[1]


def make_fleet(path: Path, zones: int, partitions: int, replicas: int, nodes: int) -> None:
    fleet = [Node(f"n{i:04d}", {"rack": f"r{i % 10}"}) for i in range(nodes)]
    tables: dict[str, list[dict[str, Any]]] = {
        "nodes": [
            {"name": n.name, "address": f"10.0.{i // 250}.{i % 250}:7000",
             "attributes": dict(n.attributes), "weight": 1.0, "mod_revision": 1}
            for i, n in enumerate(fleet)
        ],
        "zones": [], "assignments": [], "sizes": [], "primaries": [], "history": [],
    }  # fmt: skip
    tally = FleetTally()
    for z in range(zones):
        spec = ZoneSpec(f"zone{z:04d}", partitions, replicas, failure_domain="rack")
        tables["zones"].append(
            {"name": spec.name, "partitions": partitions, "replicas": replicas,
             "node_selector": {}, "failure_domain": "rack", "scale_up_delay": 0.0,
             "scale_down_delay": 0.0, "mod_revision": 1}
        )  # fmt: skip
        placed = place(spec, fleet, fleet=tally.others(Counter(), Counter()))
        tally.add(placed.loads, placed.primary_loads)
        for p, peers in enumerate(placed.assignments):
            tables["assignments"].append(
                {"zone": spec.name, "partition": p, "field": "stable", "peers": list(peers),
                 "epoch": 1, "ts": 0, "trigger": 1, "mod_revision": 1}
            )  # fmt: skip
            tables["sizes"].append(
                {"zone": spec.name, "partition": p, "node": peers[0],
                 "bytes": 1_000_000 + 7919 * p, "keys": 1000, "ts": 0}
            )  # fmt: skip
        if z % 200 == 199:
            print(f"  generated {z + 1} zones", file=sys.stderr, flush=True)
    write_tables(path, tables, {"synthetic": True})


def tree_rss(process: psutil.Process) -> int:
    total = 0
    for p in [process, *process.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def run(args: list[str]) -> tuple[float, int, str]:
    """Wall seconds and peak RSS of the whole process tree of one placectl run."""
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "placement", *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    watched = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(watched))
        time.sleep(0.1)
    wall = time.monotonic() - start
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"placectl {' '.join(args)} failed:\n{err}")
    return wall, peak, out.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--zones", type=int, default=2000)
    parser.add_argument("--partitions", type=int, default=512)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--data", type=Path, default=Path("/tmp/placement-pipeline-bench"))
    parser.add_argument("--standalone", action="store_true")
    parser.add_argument("--worker-cores", type=int, default=2)
    parser.add_argument("--worker-memory", default="6g")
    ns = parser.parse_args()
    fleet = ns.data / f"fleet-balanced-{ns.zones}x{ns.partitions}x{ns.replicas}-{ns.nodes}"
    if not (fleet / "meta.json").exists():
        ns.data.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        make_fleet(fleet, ns.zones, ns.partitions, ns.replicas, ns.nodes)
        print(f"fleet written in {time.monotonic() - began:.0f} s: {fleet}", file=sys.stderr)
    common = ["plan", "--input", str(fleet), "--remove-node", "n0000"]
    results = {}
    engines: list[tuple[str, list[str]]] = [
        ("local", []),
        (f"spark ({ns.master})", ["--master", ns.master]),
    ]
    with contextlib.ExitStack() as stack:
        if ns.standalone:
            from placement.local.spark_standalone import StandaloneSpark
            from placement.pipeline.ship_env import pack_environment

            root = os.geteuid() == 0
            cluster = stack.enter_context(
                StandaloneSpark(
                    cores=ns.worker_cores,
                    memory=ns.worker_memory,
                    user="nobody" if root else None,
                    hide=[ROOT] if root else [],
                )
            )
            began = time.monotonic()
            archive, fresh = pack_environment()
            packing = time.monotonic() - began
            print(f"environment {'packed' if fresh else 'cached'} in {packing:.1f} s: {archive}",
                  file=sys.stderr)  # fmt: skip
            engines.append(
                (
                    f"spark (standalone, 1 worker x {ns.worker_cores} cores"
                    f"{', as nobody, checkout hidden' if root else ''})",
                    [
                        "--master",
                        cluster.master_url,
                        "--ship-env",
                        "auto",
                        "--spark-conf",
                        "spark.driver.host=127.0.0.1",
                        "--spark-conf",
                        "spark.driver.bindAddress=127.0.0.1",
                        "--spark-conf",
                        f"spark.executor.memory={ns.worker_memory}",
                    ],
                )
            )
        for index, (label, extra) in enumerate(engines):
            out = ns.data / f"plan-{index}.json"
            engine = "local" if label == "local" else "spark"
            wall, peak, line = run([*common, "--output", str(out), "--engine", engine, *extra])
            results[label] = (wall, peak, line, out)
            print(f"{label}: {wall:.1f} s, peak {peak / 2**30:.2f} GiB: {line}", file=sys.stderr)
    first = results["local"][3]
    same = all(filecmp.cmp(first, r[3], shallow=False) for r in results.values())
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    models = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
    cpu = models[0] if models else platform.processor()
    ram = psutil.virtual_memory().total / 2**30
    print(f"\nmachine: {os.cpu_count()} CPUs ({cpu}), {ram:.1f} GiB RAM, "
          f"Python {platform.python_version()}, load avg {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"fleet: {ns.zones} zones x {ns.partitions} partitions x {ns.replicas} replicas over "
          f"{ns.nodes} nodes (rack failure domain), plan with n0000 removed\n")  # fmt: skip
    print("| engine | wall time | peak RSS (process tree) | plan |")
    print("|---|---|---|---|")
    for label, (wall, peak, line, _) in results.items():
        print(f"| {label} | {wall:.1f} s | {peak / 2**30:.2f} GiB | {line.split(' -> ')[0]} |")
    size = first.stat().st_size / 2**20
    print(f"\nplans byte-identical: {same} ({size:.0f} MiB)")
    if not same:
        raise SystemExit("the engines disagree")


if __name__ == "__main__":
    main()
