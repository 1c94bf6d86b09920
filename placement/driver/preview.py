"""A dry run: what the leader would end up doing for an operator's change, decided on a view by
the pass's own rules, writing nothing (design/control-plane.md, "Dry run"). Pure: no I/O.

A change is a zone config (``zone alter --dry-run``) or nodes to drain (``node drain
--dry-run``). For every zone it touches, the preview applies the change to the view and asks
the same questions a pass asks — the zone's matching registered nodes (:func:`observed_nodes`'s
rules, drained nodes out), the placement target of every partition (:func:`zone_targets`, the
same placement function on the same current assignment) — and reports, from the assignment in
force now (stable) to that target:

* each partition whose replica set changes, before and after (after = ``()``: a shrink removes
  it; before = ``()``: a grow creates it), with the bytes its joining replicas copy (the
  partition's size as its replicas report it, once per joining replica);
* per node, replicas before and after, and the unexpired primary leases a drained node hands
  over first;
* a partition-count change's re-sharding and the bytes its copy moves
  (:meth:`~placement.core.layout.Moves.moved`, the estimate status uses).

It is the *final* state: a membership change still held by a scale-up or scale-down delay is
taken as applied (the preview says so in ``notes``); a rebalance already in flight counts from
the stable it started on. Where nothing else changes meanwhile, the leader's moves and final
assignment are exactly these (tests/integration/test_plan.py checks it on a live cluster).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, replace

from placement.core.layout import Moves
from placement.core.model import Peers, ZoneSpec
from placement.driver.core import (
    ClusterView,
    FleetLoads,
    ZoneView,
    current_loads,
    kept_partitions,
    zone_targets,
)
from placement.driver.datanodes import advance, holddown_remaining, matching_nodes
from placement.metastore.codec import DataNodes, LayoutValue, PrimaryLease
from placement.metastore.keys import AssignField


@dataclass(frozen=True, slots=True)
class PartitionChange:
    partition: int
    #: The replica set in force now (stable; ``()``: the partition does not exist yet).
    before: Peers
    #: Its target (``()``: the change removes the partition).
    after: Peers
    #: Bytes its joining replicas copy (its size, once per joining replica).
    bytes: int


@dataclass(frozen=True, slots=True)
class NodeLoad:
    node: str
    replicas_before: int
    replicas_after: int
    #: Unexpired primary leases it holds now that move first (a drained node's).
    leases_handed_over: int = 0


@dataclass(frozen=True, slots=True)
class ZonePreview:
    zone: str
    #: The config the preview applies (the altered one, or the zone's own for a drain).
    spec: ZoneSpec
    changes: tuple[PartitionChange, ...]
    loads: tuple[NodeLoad, ...]
    #: Rebalance bytes (every change's) plus a re-sharding's copy.
    bytes_to_move: int
    #: ``(source, target)`` partition counts when the change re-shards the zone.
    reshard: tuple[int, int] | None = None
    reshard_bytes: int = 0
    #: Why the zone cannot be placed ("" when it can): nothing would move.
    unplaceable: str = ""
    notes: tuple[str, ...] = ()

    @property
    def replicas_added(self) -> int:
        return sum(len(set(c.after) - set(c.before)) for c in self.changes)

    @property
    def replicas_removed(self) -> int:
        return sum(len(set(c.before) - set(c.after)) for c in self.changes)


@dataclass(frozen=True, slots=True)
class Preview:
    #: The etcd revision of the view it was decided on.
    revision: int
    zones: tuple[ZonePreview, ...]


def preview(
    view: ClusterView,
    now_ms: int,
    sizes: Callable[[str], Mapping[int, int]],
    *,
    specs: Mapping[str, ZoneSpec] | None = None,
    drain: Set[str] = frozenset(),
) -> Preview:
    """The preview of altering the zones in ``specs`` (name -> new config) and draining the
    nodes in ``drain``, on ``view`` at ``now_ms``. ``sizes(zone)``: partition -> bytes of its
    largest reported replica. The zones reported: every zone in ``specs``, and every zone where
    a drained node is a data node or holds a replica; those whose config is unreadable are
    left out (status reports them)."""
    altered = dict(specs or {})
    draining = view.draining | set(drain)
    zones = []
    for name in sorted(view.zones):
        zone = view.zones[name]
        if not isinstance(zone.spec, ZoneSpec):
            continue
        if name not in altered and not (drain and _touches(zone, drain)):
            continue
        zones.append(
            _zone_preview(view, zone, altered.get(name, zone.spec), draining, sizes(name), now_ms)
        )
    return Preview(view.revision, tuple(zones))


def _touches(zone: ZoneView, nodes: Set[str]) -> bool:
    applied = zone.datanodes.applied if isinstance(zone.datanodes, DataNodes) else ()
    if nodes & set(applied):
        return True
    return any(nodes & state.holders() for state in zone.partitions.values())


def _zone_preview(
    view: ClusterView,
    zone: ZoneView,
    spec: ZoneSpec,
    draining: Set[str],
    sizes: Mapping[int, int],
    now_ms: int,
) -> ZonePreview:
    """``zone`` (its config as stored) under config ``spec`` with ``draining`` out."""
    assert isinstance(zone.spec, ZoneSpec)
    old_count = _layout_count(zone, zone.spec)
    zone = replace(zone, spec=spec)
    notes: list[str] = []
    record = zone.datanodes if isinstance(zone.datanodes, DataNodes) else None
    eligible = matching_nodes(spec, (r for r in view.nodes.values() if r.name not in draining))
    if record is not None:
        # What the next pass makes of the membership under the new config: a change it holds
        # back (scale-up/scale-down delay) moves nothing until then — the alter's own, or one
        # already waiting. Drained nodes leave at once (no delay: the operator asked).
        membership = advance(spec, record, eligible, now_ms, frozenset(draining))
        held = holddown_remaining(spec, membership, now_ms)
        if held is not None:
            notes.append(
                f"a data-node change waits {held:.0f}s more (scale-up/scale-down delay) before"
                " it moves anything; the plan takes it as applied"
            )
    stable = {
        p: peers
        for p, state in zone.partitions.items()
        if (peers := state.peers(AssignField.STABLE)) is not None
    }
    reshard = (old_count, spec.partitions) if old_count != spec.partitions else None
    kept = kept_partitions(zone.layout, spec)
    # the fleet's other zones as they are now (a pass adds those it places before this one)
    fleet = FleetLoads().tally(view.zones).others(*current_loads(zone))
    targets = zone_targets(zone, spec, view.nodes, eligible, kept, view.cordoned, fleet)
    if isinstance(targets, str):
        before = Counter(n for peers in stable.values() for n in peers)
        loads = tuple(NodeLoad(n, before[n], before[n]) for n in sorted(before))
        return ZonePreview(zone.name, spec, (), loads, 0, reshard, 0, targets, tuple(notes))
    final = dict(targets)
    for p in set(stable) | set(final):
        if p >= spec.partitions:
            final[p] = ()  # retired: a shrink's after its clean-up, an aborted grow's new ones
    running = zone.layout.layout.reshard if isinstance(zone.layout, LayoutValue) else None
    if running is not None and reshard is None and spec.partitions == running.source:
        notes.append(
            f"aborts the re-sharding {running.source} -> {running.target}: the zone keeps"
            f" {running.source} partitions"
        )
    changes = []
    for p in sorted(set(final) | set(stable)):
        before_peers = stable.get(p, ())
        after = final.get(p, before_peers)
        if after == before_peers:
            continue
        joining = len(set(after) - set(before_peers)) if before_peers else 0
        changes.append(PartitionChange(p, before_peers, after, joining * sizes.get(p, 0)))
    before = Counter(n for peers in stable.values() for n in peers)
    after_load = Counter(n for p, peers in stable.items() if p not in final for n in peers)
    after_load.update(n for peers in final.values() for n in peers)
    handed = Counter(
        lease.value.node
        for lease in zone.primaries.values()
        if isinstance(lease.value, PrimaryLease)
        and view.lease_until(lease.value) > now_ms
        and lease.value.node in draining
    )
    loads = tuple(
        NodeLoad(n, before[n], after_load[n], handed[n])
        for n in sorted(set(before) | set(after_load) | set(eligible))
    )
    reshard_bytes = 0
    if reshard is not None:
        reshard_bytes = Moves(*reshard).moved(sizes)
        notes.append(
            f"re-shards {reshard[0]} -> {reshard[1]} partitions: about {reshard_bytes} bytes"
            " of keys copied between partitions"
        )
    moved = sum(c.bytes for c in changes) + reshard_bytes
    if len(eligible) < spec.replicas:
        notes.append(
            f"under-replicated: {len(eligible)} eligible node(s) for {spec.replicas} replicas"
        )
    return ZonePreview(
        zone.name, spec, tuple(changes), loads, moved, reshard, reshard_bytes, "", tuple(notes)
    )


def _layout_count(zone: ZoneView, spec: ZoneSpec) -> int:
    """The partition count the zone has now: its layout's (its config's when it has none)."""
    if isinstance(zone.layout, LayoutValue):
        return zone.layout.layout.partitions
    return spec.partitions
