"""What one driver pass costs at fleet size, and what one GetZoneStatus answer costs.

    .venv/bin/python bench/driver_pass_bench.py [--zones 100] [--partitions 1000] [--nodes 1000]

Pure functions on a synthetic prefix, no etcd and no other process, so the figures are the
decision's own CPU (the driver runs it on its event loop, design/control-plane.md "One pass"):

* **creation**: ``--zones`` zone configs with their layouts and data-nodes records on ``--nodes``
  registered nodes and no partition yet: the pass that places every zone and creates its
  partitions; then the same burst as the leader runs it, in passes of its budget
  (``PASS_BUDGET``) on the incremental view, each pass's creations landing before the next;
* **grant**: every partition created (stable + trigger keys, as that pass wrote them), no
  primary lease yet: the pass that grants every lease (a fresh memo, as after a leader change);
* **memo, changed**: the same view again with the memo of the grant pass — a zone whose plan had
  writes is decided again (the pass after the grant, before its echo);
* **join**: the fleet settled (every lease granted and landed, the memo warm), then one more
  node registered: the first pass with the driver's budget and the next ones (most zones
  deferred; its writes not landed, as while they are in flight);
* **gauges**: the leader's state gauges over that fleet (``driver.gauges.fleet_gauges``): the
  loop as it was before ``GaugeMemo`` (every partition and lease counted at every scrape), a
  first scrape, and a scrape of the same view with the memo of the last;
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
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for extra in (str(ROOT), str(ROOT / "bench")):
    if extra not in sys.path:
        sys.path.insert(0, extra)

from driver_view_bench import prefix  # noqa: E402
from run_info import run_section, uptime  # noqa: E402

from placement.api.service import status_on_view  # noqa: E402
from placement.core.layout import ZoneLayout  # noqa: E402
from placement.core.model import ZoneSpec  # noqa: E402
from placement.driver.core import (  # noqa: E402
    ClusterView,
    DecodeCache,
    PassPlan,
    PlanMemo,
    TargetsMemo,
    build_view,
    plan_pass,
    view_zone_status,
)
from placement.driver.gauges import GaugeMemo, fleet_gauges  # noqa: E402
from placement.driver.incremental import ViewBuilder, view_group  # noqa: E402
from placement.driver.leases import LeaseConfig  # noqa: E402
from placement.driver.loop import PASS_BUDGET  # noqa: E402
from placement.metastore.codec import (  # noqa: E402
    Assignment,
    DataNodes,
    LayoutValue,
    NodeRecord,
    PrimaryLease,
    TriggerMark,
    encode_assignment,
    encode_datanodes,
    encode_layout,
    encode_node,
    encode_primary,
    encode_term,
    encode_trigger,
    encode_zone_spec,
)
from placement.metastore.keys import AssignField, KeySpace  # noqa: E402
from placement.metastore.kv import KeyValue  # noqa: E402
from placement.runtime import tune_gc  # noqa: E402

NOW_MS = 1_000_000


class Prefix:
    """A growing synthetic prefix: ``put`` stamps each key with the next revision, and keeps the
    groups and stamps of the leader's list-watch (``placement.driver.incremental``)."""

    def __init__(self) -> None:
        self.keys = KeySpace("/bench")
        self.kvs: dict[bytes, KeyValue] = {}
        self.revision = 0
        self._group = view_group(self.keys)
        self.groups: dict[str, dict[bytes, KeyValue]] = {}
        self.stamps: dict[str, int] = {}

    def put(self, key: bytes, value: bytes) -> None:
        self.revision += 1
        kv = KeyValue(key, value, self.revision, self.revision, 1, 0)
        self.kvs[key] = kv
        name = self._group(key)
        if name is not None:
            self.groups.setdefault(name, {})[key] = kv
            self.stamps[name] = self.revision

    def land_leases(self, plan: PassPlan) -> None:
        """A pass's primary leases and lease terms, as their writes come back."""
        for write in plan.primaries:
            for p, lease in write.leases.items():
                self.put(self.keys.primary(write.zone, p), encode_primary(lease.lease))
        if plan.terms is not None:
            for node, term in plan.terms.writes.items():
                self.put(self.keys.term(node), encode_term(term.term))

    def land(self, plan: PassPlan) -> None:
        """A pass's partition creations, as their writes come back through the watch."""
        for create in plan.creates:
            for p, peers in create.stables.items():
                stable = Assignment(tuple(peers), 1, 0, 2)
                self.put(
                    self.keys.assign(create.zone, p, AssignField.STABLE),
                    encode_assignment(stable),
                )
                self.put(
                    self.keys.assign(create.zone, p, AssignField.TRIGGER),
                    encode_trigger(TriggerMark(2, 1, 0)),
                )


def fleet(zones: int, partitions: int, nodes: int) -> Prefix:
    """``nodes`` registered nodes and ``zones`` zone configs with their layouts and data-nodes
    records: every zone waiting for its partitions."""
    bench = Prefix()
    names = tuple(f"n{i:04d}" for i in range(nodes))
    for n in names:
        bench.put(bench.keys.node(n), encode_node(NodeRecord(n, "127.0.0.1:1")))
    for z in (f"z{z:03d}" for z in range(zones)):
        bench.put(bench.keys.zone(z), encode_zone_spec(ZoneSpec(z, partitions, 3)))
        bench.put(bench.keys.layout(z), encode_layout(LayoutValue(ZoneLayout(1, partitions), 1, 0)))
        bench.put(bench.keys.datanodes(z), encode_datanodes(DataNodes(names, names, None, None)))
    return bench


def budgeted_creation(zones: int, partitions: int, nodes: int) -> tuple[int, float, float]:
    """The creation burst as the leader runs it: passes with its budget (``PASS_BUDGET``) on
    the incremental view, each pass's creations landing before the next. (passes, longest
    pass's decision ms, all passes' decisions ms); the view builds are not counted."""
    bench = fleet(zones, partitions, nodes)
    builder, memo = ViewBuilder(bench.keys), PlanMemo()
    passes, longest, total = 0, 0.0, 0.0
    while True:
        view = builder.build(bench.revision, bench.groups, bench.stamps)
        gc.collect()
        started = time.perf_counter()
        plan = plan_pass(view, NOW_MS, None, memo, budget=PASS_BUDGET)
        took = time.perf_counter() - started
        passes, longest, total = passes + 1, max(longest, took), total + took
        bench.land(plan)
        if not plan.deferred:
            return passes, longest * 1000, total * 1000


def joined_passes(bench: Prefix, leases: LeaseConfig, passes: int) -> tuple[float, float, int]:
    """The fleet settled (memo warm), then one more node registered: every zone is decided
    again, a budget's worth per pass, the rest deferred. (first pass ms, median of the next
    ``passes`` ms, zones deferred in the first); the passes' writes do not land, as while
    they are in flight."""
    builder, memo = ViewBuilder(bench.keys), PlanMemo()
    view = builder.build(bench.revision, bench.groups, bench.stamps)
    plan_pass(view, NOW_MS, leases, memo, budget=PASS_BUDGET)
    bench.put(bench.keys.node("joined"), encode_node(NodeRecord("joined", "127.0.0.1:1")))
    view = builder.build(bench.revision, bench.groups, bench.stamps)
    runs, deferred = [], 0
    for i in range(passes + 1):
        gc.collect()
        started = time.perf_counter()
        plan = plan_pass(view, NOW_MS + i, leases, memo, budget=PASS_BUDGET)
        runs.append(time.perf_counter() - started)
        deferred = deferred or len(plan.deferred)
    return runs[0] * 1000, statistics.median(runs[1:]) * 1000, deferred


def scrapes(view: ClusterView, repeat: int) -> tuple[float, float, float]:
    """The leader's gauges over the fleet's view (ms): the loop as it was before ``GaugeMemo``
    (every partition and lease counted at every scrape; the zones' placements kept in a
    ``TargetsMemo``, which on this tree keeps their outlooks too), a first scrape with a fresh
    memo, and a scrape of the same view with the memo of the last."""
    targets = TargetsMemo()

    def recounted() -> None:
        replicas: Counter[str] = Counter()
        primaries: Counter[str] = Counter()
        for zone in view.zones.values():
            for state in zone.partitions.values():
                replicas.update(state.peers(AssignField.STABLE) or ())
            for lease in zone.primaries.values():
                if isinstance(lease.value, PrimaryLease) and view.lease_until(lease.value) > NOW_MS:
                    primaries[lease.value.node] += 1
            view_zone_status(view, zone.name, NOW_MS, memo=targets)

    recounted()
    before, _ = timed(recounted, repeat)
    first, _ = timed(lambda: fleet_gauges(view, NOW_MS, GaugeMemo(), {}), repeat)
    memo = GaugeMemo()
    fleet_gauges(view, NOW_MS, memo, {})
    kept, _ = timed(lambda: fleet_gauges(view, NOW_MS, memo, {}), repeat)
    return before * 1000, first * 1000, kept * 1000


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

    bench = fleet(args.zones, args.partitions, args.nodes)
    view = build_view(bench.keys, bench.kvs, bench.revision)
    creation, plan = timed(lambda: plan_pass(view, NOW_MS, leases, PlanMemo()), args.repeat)
    assert isinstance(plan, PassPlan)
    assert len(plan.creates) == args.zones
    passes, longest, total = budgeted_creation(args.zones, args.partitions, args.nodes)

    bench.land(plan)
    view = build_view(bench.keys, bench.kvs, bench.revision)
    grant, plan = timed(lambda: plan_pass(view, NOW_MS, leases, PlanMemo()), args.repeat)
    granted = sum(len(w.leases) for w in plan.primaries)  # type: ignore[attr-defined]
    assert granted == args.zones * args.partitions, granted
    memo = PlanMemo()
    plan_pass(view, NOW_MS, leases, memo)
    again, _ = timed(lambda: plan_pass(view, NOW_MS, leases, memo), args.repeat)
    bench.land_leases(plan)
    view = build_view(bench.keys, bench.kvs, bench.revision)
    assert sum(len(z.primaries) for z in view.zones.values()) == args.zones * args.partitions
    scrape_before, scrape_first, scrape_kept = scrapes(view, args.repeat)
    join_first, join_next, join_deferred = joined_passes(bench, leases, 5)
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
        f"| creation in passes of the driver's budget ({PASS_BUDGET:,} partitions): longest"
        f" pass (of {passes}) | {longest:.0f} |",
        f"| the same: all those passes' decisions together | {total:.0f} |",
        f"| grant pass (every primary lease; fresh memo) | {grant * 1000:.0f} |",
        f"| pass after the grant, before its echo (memo of the grant pass) | {again * 1000:.0f} |",
        f"| a node joins the settled fleet: first pass with the budget ({join_deferred} zones"
        f" deferred) | {join_first:.0f} |",
        f"| the same: the next passes, its writes not landed yet (median of 5) | {join_next:.0f} |",
        f"| the leader's gauges, every lease granted: every partition and lease counted at every"
        f" scrape (the zones' statuses with a kept `TargetsMemo`) | {scrape_before:.0f} |",
        f"| the same with `GaugeMemo`: first scrape | {scrape_first:.0f} |",
        f"| the same: a scrape of the same view | {scrape_kept:.0f} |",
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
