"""What one driver pass costs at fleet size, and what one GetZoneStatus answer costs.

    .venv/bin/python bench/driver_pass_bench.py [--zones 100] [--partitions 1000] [--nodes 1000]

Pure functions on a synthetic prefix, no etcd and no other process, so the figures are the
decision's own CPU (the driver runs it on its event loop, design/control-plane.md "One pass"):

* **creation**: ``--zones`` zone configs with their data-nodes records on ``--nodes`` registered
  nodes and no partition yet: the pass that places every zone and creates its partitions;
* **grant**: every partition created (stable + trigger keys, as that pass wrote them), no
  primary lease yet: the pass that grants every lease (a fresh memo, as after a leader change);
* **memo, changed**: the same view again with the memo of the grant pass — a zone whose plan had
  writes is decided again (the pass after the grant, before its echo);
* **status**: ``build_view`` + ``status_on_view`` of one zone of ``--partitions`` on 5 nodes
  after one key changed (the API's GetZoneStatus on its decode cache), the median of 21;
  without and with the placement memo the API keeps (``TargetsMemo``).

Each pass figure is the median of ``--repeat`` runs (default 3); ``--output`` writes the table
(``bench/results/driver_pass.md`` records before → after runs by hand, with the command).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for extra in (str(ROOT), str(ROOT / "bench")):
    if extra not in sys.path:
        sys.path.insert(0, extra)

from driver_view_bench import prefix  # noqa: E402
from run_info import run_section, uptime  # noqa: E402

from placement.api.service import status_on_view  # noqa: E402
from placement.core.model import ZoneSpec  # noqa: E402
from placement.driver.core import (  # noqa: E402
    DecodeCache,
    PlanMemo,
    TargetsMemo,
    build_view,
    plan_pass,
)
from placement.driver.leases import LeaseConfig  # noqa: E402
from placement.metastore.codec import (  # noqa: E402
    Assignment,
    DataNodes,
    NodeRecord,
    TriggerMark,
    encode_assignment,
    encode_datanodes,
    encode_node,
    encode_trigger,
    encode_zone_spec,
)
from placement.metastore.keys import AssignField, KeySpace  # noqa: E402
from placement.metastore.kv import KeyValue  # noqa: E402
from placement.runtime import tune_gc  # noqa: E402

NOW_MS = 1_000_000


class Prefix:
    """A growing synthetic prefix: ``put`` stamps each key with the next revision."""

    def __init__(self) -> None:
        self.keys = KeySpace("/bench")
        self.kvs: dict[bytes, KeyValue] = {}
        self.revision = 0

    def put(self, key: bytes, value: bytes) -> None:
        self.revision += 1
        self.kvs[key] = KeyValue(key, value, self.revision, self.revision, 1, 0)


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    """Median seconds of ``repeat`` runs of ``fn`` (the collector as the driver runs it: on,
    :func:`placement.runtime.tune_gc`) and the last result."""
    runs, result = [], None
    for _ in range(repeat):
        gc.collect()
        started = time.perf_counter()
        result = fn()
        runs.append(time.perf_counter() - started)
    return statistics.median(runs), result


def status_ms(partitions: int, memo: bool) -> float:
    keys, kvs = prefix(partitions)
    revision = max(kv.mod_revision for kv in kvs.values())
    cache = DecodeCache()
    placed = TargetsMemo() if memo else None  # as PlacementAPI keeps one
    runs = []
    for i in range(22):
        revision += 1
        changed = keys.assign("z", i % partitions, AssignField.STABLE)
        old = kvs[changed]
        kvs[changed] = KeyValue(changed, old.value, old.create_revision, revision, i + 2, 0)
        started = time.perf_counter()
        view = build_view(keys, kvs, revision, cache)
        status = status_on_view(keys, view, kvs, "z", NOW_MS, (), cache, placed)
        runs.append(time.perf_counter() - started)
        assert status is not None
        assert status.partitions_total == partitions
    return statistics.median(runs[1:]) * 1000  # the first fills the decode cache


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--zones", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    tune_gc()  # the driver's collector settings (placement.runtime)
    started, load = time.time(), [uptime()]
    leases = LeaseConfig()

    bench = Prefix()
    nodes = tuple(f"n{i:04d}" for i in range(args.nodes))
    for n in nodes:
        bench.put(bench.keys.node(n), encode_node(NodeRecord(n, "127.0.0.1:1")))
    zones = [f"z{z:03d}" for z in range(args.zones)]
    for z in zones:
        bench.put(bench.keys.zone(z), encode_zone_spec(ZoneSpec(z, args.partitions, 3)))
        bench.put(bench.keys.datanodes(z), encode_datanodes(DataNodes(nodes, nodes, None, None)))
    view = build_view(bench.keys, bench.kvs, bench.revision)
    creation, plan = timed(lambda: plan_pass(view, NOW_MS, leases, PlanMemo()), args.repeat)
    assert len(plan.creates) == args.zones  # type: ignore[attr-defined]

    for create in plan.creates:  # type: ignore[attr-defined]
        for p, peers in create.stables.items():
            stable = Assignment(tuple(peers), 1, 0, 2)
            bench.put(
                bench.keys.assign(create.zone, p, AssignField.STABLE), encode_assignment(stable)
            )
            bench.put(
                bench.keys.assign(create.zone, p, AssignField.TRIGGER),
                encode_trigger(TriggerMark(2, 1, 0)),
            )
    view = build_view(bench.keys, bench.kvs, bench.revision)
    grant, plan = timed(lambda: plan_pass(view, NOW_MS, leases, PlanMemo()), args.repeat)
    granted = sum(len(w.leases) for w in plan.primaries)  # type: ignore[attr-defined]
    assert granted == args.zones * args.partitions, granted
    memo = PlanMemo()
    plan_pass(view, NOW_MS, leases, memo)
    again, _ = timed(lambda: plan_pass(view, NOW_MS, leases, memo), args.repeat)
    status = status_ms(args.partitions, memo=False)
    status_memo = status_ms(args.partitions, memo=True)
    load.append(uptime())

    replicas = args.zones * args.partitions * 3
    lines = [
        f"Fleet: {args.zones} zones × {args.partitions} partitions × R=3 ({replicas:,} replicas)"
        f" on {args.nodes:,} nodes; medians of {args.repeat} runs.",
        "",
        "| figure | ms |",
        "|---|---:|",
        f"| creation pass (place every zone, create its partitions) | {creation * 1000:.0f} |",
        f"| grant pass (every primary lease; fresh memo) | {grant * 1000:.0f} |",
        f"| pass after the grant, before its echo (memo of the grant pass) | {again * 1000:.0f} |",
        f"| GetZoneStatus decision, one zone of {args.partitions} on 5 nodes (median of 21) |"
        f" {status:.1f} |",
        f"| the same with the API's placement memo (`TargetsMemo`) | {status_memo:.1f} |",
        "",
        *run_section(started, load, "start / end"),
    ]
    text = "\n".join(lines)
    print(text)
    if args.output is not None:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
