"""The placement driver's decisions: one pass over an immutable view -> actions. Pure: no I/O.

The leader loop (:mod:`placement.driver.loop`) builds a :class:`ClusterView` from one list-watch
snapshot of the whole prefix (one etcd revision), calls :func:`plan_pass` and executes the
actions; every write it makes is a fenced, compare-guarded transaction, so deciding on a snapshot
that is already old is safe (the write is refused or re-decided by the metastore).

Per zone, in this order:

1. **Data nodes** (:mod:`.datanodes`): the matching registered set advanced through the
   holddown; a changed record -> :class:`WriteDataNodes` (CAS on the key's mod_revision). Nothing
   else is decided for that zone in the same pass (the trigger revision is about to change).
2. **Creation**: partitions ``0..P-1`` with no assignment key at all -> :class:`CreatePartitions`
   with their slice of the target (an empty partition needs no rebalance).
3. **Triggers**: ``target = place(spec, data nodes, current)`` with current = pending if a
   rebalance is in flight, else stable; partitions where rule 2 would write (pending or planned,
   or delete planned) with a trigger older than ``R = max(zone mod_revision, datanodes
   mod_revision)`` -> :class:`ApplyTriggers`. No-ops are not written at all.
4. **Driving** (skipped while paused): per partition with a decodable pending —

   ================  ====================================================  ==================
   rebalance state    condition                                             action
   ================  ====================================================  ==================
   IDLE               no pending                                            —
   MOVING             pending, no cancel                                    :class:`Drive`
   CANCELLING         pending and a cancel naming pending's mod_revision    :class:`Drive`
                                                                            (``cancel=True``)
   STUCK              pending undecodable (or a cancel for another rev.)     — (operator cancels)
   ================  ====================================================  ==================

   MOVING -> IDLE (finish: stable := pending) or -> MOVING (pending := planned), MOVING ->
   CANCELLING (cancel written), CANCELLING -> IDLE (finish_cancel).
5. **Primary leases** (:mod:`placement.driver.leases`): grants, renewals and moves — a new holder
   only from the live members of stable in the partition's in-sync set (``{p}/isr/...``, read
   into :attr:`ZoneView.isrs`), each move compare-guarded on the ISR key's mod_revision.
6. **Leftovers** of a dropped zone (no config, no assignment keys) — data nodes, primary leases,
   ISR, replica-size, layout and reshard-report keys -> :class:`DropLeftovers`.
7. **Layout** (design/resharding.md): :func:`placement.core.layout.next_step` on the layout, the
   config and the facts gathered from the partitions' state and the agents' reshard reports
   (:func:`reshard_facts`) -> :class:`WriteLayout` (the first layout, begin, advance, flip,
   abort, finish). Partitions beyond the ones the layout keeps (:func:`kept_partitions`: a
   shrink's removed ones after the flip, an aborted grow's new ones) -> :class:`RetirePartitions`.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections import Counter
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType

from placement.algo.fleet import FleetLoad, FleetTally, zone_loads
from placement.algo.place import Placement, place
from placement.core.layout import (
    SEAL_LAG,
    Reshard,
    ReshardFacts,
    ReshardPhase,
    Step,
    ZoneLayout,
    next_step,
)
from placement.core.model import Node, PartitionScoped, Peers, ZoneSpec
from placement.driver.datanodes import advance, holddown_remaining, matching_nodes
from placement.driver.leases import (
    LeaseConfig,
    corrupt_isrs,
    lease_holders,
    next_due_ms,
    plan_primaries,
    plan_terms,
    terms_due_ms,
)
from placement.driver.status import ZoneStatus, reshard_progress, zone_status
from placement.errors import InvalidInput
from placement.metastore.codec import (
    Assignment,
    CancelIntent,
    Corrupt,
    DataNodes,
    InSyncSet,
    LayoutValue,
    LeaseTerm,
    MoveReport,
    NodeRecord,
    PrimaryLease,
    ReshardReport,
    decode_control,
    decode_datanodes,
    decode_isr,
    decode_layout,
    decode_node,
    decode_primary,
    decode_report,
    decode_reshard_report,
    decode_size,
    decode_term,
    decode_zone_spec,
)
from placement.metastore.keys import AssignField, KeyKind, KeySpace, ParsedKey
from placement.metastore.kv import KeyValue
from placement.metastore.transitions import (
    LeaseWrite,
    PartitionState,
    TermWrite,
    TriggerAction,
    Versioned,
    assign_versioned,
    decide_trigger,
)

# -- the view ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ZoneView:
    """One zone as of the view's revision."""

    name: str
    spec: ZoneSpec | Corrupt | None
    zone_mod: int
    datanodes: DataNodes | Corrupt | None
    datanodes_mod: int
    partitions: Mapping[int, PartitionState]
    primaries: Mapping[int, Versioned[PrimaryLease]]
    #: The partitions' in-sync sets (``{p}/isr/{zone}/{partition}``); absent = no ISR key.
    isrs: Mapping[int, Versioned[InSyncSet | Corrupt]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    #: Some agent has a replica-size key (``{p}/sizes/{zone}/...``) of this zone.
    has_sizes: bool = False
    #: The zone config's create revision (0 = no config).
    zone_created: int = 0
    #: The layout key's value (None = absent) and mod revision (design/resharding.md).
    layout: LayoutValue | Corrupt | None = None
    layout_mod: int = 0
    #: The agents' reshard reports (``{p}/reshard/{zone}/{partition}``; corrupt ones left out).
    reshard_reports: Mapping[int, ReshardReport] = field(
        default_factory=lambda: MappingProxyType({})
    )


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Everything under the prefix at one ``revision``, decoded (corrupt values kept as such)."""

    revision: int
    zones: Mapping[str, ZoneView]
    nodes: Mapping[str, NodeRecord]
    paused: bool
    #: Agents' move reports: (zone, partition) -> node -> report (corrupt ones left out).
    reports: Mapping[tuple[str, int], Mapping[str, MoveReport]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    #: Nodes an operator drains (``{p}/drain/{node}``): leases, then replicas, move away.
    draining: frozenset[str] = frozenset()
    #: Nodes an operator cordons (``{p}/cordon/{node}``): they take no new replicas.
    cordoned: frozenset[str] = frozenset()
    #: Nodes' lease terms (``{p}/primary/@term/{node}``), as read (corrupt ones kept as such).
    terms: Mapping[str, Versioned[LeaseTerm | Corrupt]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    #: node -> its term's ``until`` (unix ms); a node without a readable term is absent.
    term_until: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def lease_until(self, lease: PrimaryLease) -> int:
        """When ``lease`` ends (unix ms): :meth:`PrimaryLease.until` with its holder's term."""
        return lease.until(self.term_until.get(lease.node, 0))

    @property
    def leaving(self) -> frozenset[str]:
        """Nodes whose primary leases are handed over now: drained, or their agent stopping."""
        return self.draining | {n for n, r in self.nodes.items() if r.stopping}

    def reported(self, zone: str, partition: int, revision: int) -> Mapping[str, MoveReport]:
        """node -> report, of the nodes whose catch-up of ``revision`` ended (DONE or FAILED)."""
        found = self.reports.get((zone, partition), {})
        return {n: r for n, r in found.items() if r.revision == revision}


class DecodeCache:
    """Decoded keys reused across passes while a key's ``mod_revision`` is unchanged.

    A key's value at a given mod_revision never changes (a rewrite or a re-creation gets a new
    one), so a hit is exactly what decoding again would give. The driver decodes its whole prefix
    every pass; with the cache a pass only decodes what changed since the last one.
    """

    def __init__(self) -> None:
        self._entries: dict[bytes, tuple[int, ParsedKey | None, object]] = {}

    def decode(self, keys: KeySpace, key: bytes, kv: KeyValue) -> tuple[ParsedKey | None, object]:
        """``(parsed key, decoded value)``; the value is ``None`` for keys the view ignores."""
        hit = self._entries.get(key)
        if hit is not None and hit[0] == kv.mod_revision:
            return hit[1], hit[2]
        parsed = keys.parse(key)
        value = _decode(parsed, kv)
        self._entries[key] = (kv.mod_revision, parsed, value)
        return parsed, value

    def retain(self, kvs: Mapping[bytes, KeyValue]) -> None:
        """Forget keys no longer present (called when many were deleted)."""
        self._entries = {k: v for k, v in self._entries.items() if k in kvs}

    def __len__(self) -> int:
        return len(self._entries)


def _decode(parsed: ParsedKey | None, kv: KeyValue) -> object:
    if parsed is None:
        return None
    if parsed.kind is KeyKind.ZONE:
        return decode_zone_spec(kv.value)
    if parsed.kind is KeyKind.NODE:
        return decode_node(kv.value)
    if parsed.kind is KeyKind.DATANODES:
        return decode_datanodes(kv.value)
    if parsed.kind is KeyKind.LAYOUT:
        return decode_layout(kv.value)
    if parsed.kind is KeyKind.RESHARD:
        return decode_reshard_report(kv.value)
    if parsed.kind in (KeyKind.DRAIN, KeyKind.CORDON):
        return decode_control(kv.value)
    if parsed.kind is KeyKind.TERM:
        return Versioned(decode_term(kv.value), kv.value, kv.mod_revision, kv.create_revision)
    if parsed.kind is KeyKind.PRIMARY:
        return Versioned(decode_primary(kv.value), kv.value, kv.mod_revision, kv.create_revision)
    if parsed.kind is KeyKind.ISR:
        return Versioned(decode_isr(kv.value), kv.value, kv.mod_revision, kv.create_revision)
    if parsed.kind is KeyKind.PROGRESS:
        return decode_report(kv.value)
    if parsed.kind is KeyKind.ASSIGN:
        assert parsed.field is not None
        return assign_versioned(parsed.field, kv)
    if parsed.kind is KeyKind.SIZES:
        return decode_size(kv.value)
    return None


def build_view(
    keys: KeySpace,
    kvs: Mapping[bytes, KeyValue],
    revision: int,
    cache: DecodeCache | None = None,
) -> ClusterView:
    """Decode a snapshot of the whole prefix into a :class:`ClusterView` (never raises).

    ``cache`` (optional) keeps decoded values between calls; the view is the same either way.
    """
    cache = cache if cache is not None else DecodeCache()
    if len(cache) > 2 * len(kvs) + 1024:
        cache.retain(kvs)
    specs: dict[str, tuple[ZoneSpec | Corrupt, int, int]] = {}
    layouts: dict[str, tuple[LayoutValue | Corrupt, int]] = {}
    reshard_reports: dict[str, dict[int, ReshardReport]] = {}
    datanodes: dict[str, tuple[DataNodes | Corrupt, int]] = {}
    fields: dict[str, dict[int, dict[str, Versioned[object]]]] = {}
    primaries: dict[str, dict[int, Versioned[PrimaryLease]]] = {}
    isrs: dict[str, dict[int, Versioned[InSyncSet | Corrupt]]] = {}
    sizes: set[str] = set()
    nodes: dict[str, NodeRecord] = {}
    reports: dict[tuple[str, int], dict[str, MoveReport]] = {}
    paused = False
    draining: set[str] = set()
    cordoned: set[str] = set()
    terms: dict[str, Versioned[LeaseTerm | Corrupt]] = {}
    for key, kv in kvs.items():
        parsed, value = cache.decode(keys, key, kv)
        if parsed is None:
            continue
        if parsed.kind is KeyKind.ZONE:
            specs[parsed.name] = (value, kv.mod_revision, kv.create_revision)  # type: ignore[assignment]
        elif parsed.kind is KeyKind.NODE:
            if isinstance(value, NodeRecord) and value.name == parsed.name:
                nodes[parsed.name] = value
        elif parsed.kind is KeyKind.DATANODES:
            datanodes[parsed.name] = (value, kv.mod_revision)  # type: ignore[assignment]
        elif parsed.kind is KeyKind.LAYOUT:
            layouts[parsed.name] = (value, kv.mod_revision)  # type: ignore[assignment]
        elif parsed.kind is KeyKind.RESHARD:
            assert parsed.partition is not None
            if isinstance(value, ReshardReport):
                reshard_reports.setdefault(parsed.name, {})[parsed.partition] = value
        elif parsed.kind is KeyKind.CONTROL:
            paused = True
        elif parsed.kind is KeyKind.DRAIN:
            draining.add(parsed.name)  # even a corrupt mark: the operator asked for it
        elif parsed.kind is KeyKind.CORDON:
            cordoned.add(parsed.name)  # likewise
        elif parsed.kind is KeyKind.TERM:
            terms[parsed.name] = value  # type: ignore[assignment]
        elif parsed.kind is KeyKind.PRIMARY:
            assert parsed.partition is not None
            primaries.setdefault(parsed.name, {})[parsed.partition] = value  # type: ignore[assignment]
        elif parsed.kind is KeyKind.ISR:
            assert parsed.partition is not None
            isrs.setdefault(parsed.name, {})[parsed.partition] = value  # type: ignore[assignment]
        elif parsed.kind is KeyKind.SIZES:
            sizes.add(parsed.name)
        elif parsed.kind is KeyKind.PROGRESS:
            assert parsed.partition is not None
            assert parsed.node is not None
            if isinstance(value, MoveReport):
                reports.setdefault((parsed.name, parsed.partition), {})[parsed.node] = value
        elif parsed.kind is KeyKind.ASSIGN:
            assert parsed.partition is not None
            assert parsed.field is not None
            fields.setdefault(parsed.name, {}).setdefault(parsed.partition, {})[
                parsed.field.value
            ] = value  # type: ignore[assignment]
    zones: dict[str, ZoneView] = {}
    for name in sorted({*specs, *fields, *datanodes, *primaries, *isrs, *sizes, *layouts}):
        spec, zone_mod, created = specs.get(name, (None, 0, 0))
        dn, dn_mod = datanodes.get(name, (None, 0))
        layout, layout_mod = layouts.get(name, (None, 0))
        parts = {
            p: PartitionState(name, p, revision, **f)  # type: ignore[arg-type]
            for p, f in sorted(fields.get(name, {}).items())
        }
        zones[name] = ZoneView(
            name,
            spec,
            zone_mod,
            dn,
            dn_mod,
            MappingProxyType(parts),
            MappingProxyType(primaries.get(name, {})),
            MappingProxyType(isrs.get(name, {})),
            name in sizes,
            created,
            layout,
            layout_mod,
            MappingProxyType(reshard_reports.get(name, {})),
        )
    return ClusterView(
        revision,
        MappingProxyType(zones),
        MappingProxyType(nodes),
        paused,
        MappingProxyType({k: MappingProxyType(v) for k, v in reports.items()}),
        frozenset(draining),
        frozenset(cordoned),
        MappingProxyType(terms),
        term_untils(terms),
    )


def term_untils(terms: Mapping[str, Versioned[LeaseTerm | Corrupt]]) -> Mapping[str, int]:
    """node -> ``until`` of its readable lease term (:attr:`ClusterView.term_until`)."""
    return MappingProxyType(
        {n: t.value.until for n, t in terms.items() if isinstance(t.value, LeaseTerm)}
    )


# -- actions -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WriteDataNodes:
    """CAS ``{p}/datanodes/{zone}`` from ``expected_mod`` (0 = absent) to ``record``."""

    zone: str
    record: DataNodes
    expected_mod: int


@dataclass(frozen=True, slots=True)
class CreatePartitions:
    zone: str
    stables: Mapping[int, Peers]
    trigger_revision: int


@dataclass(frozen=True, slots=True)
class ApplyTriggers:
    zone: str
    targets: Mapping[int, Peers]
    trigger_revision: int


@dataclass(frozen=True, slots=True)
class Drive(PartitionScoped):
    """Send Rebalance (or CancelRebalance when ``cancel``) ``old -> new`` for pending
    ``revision`` to every member of old ∪ new, until the agents' answers let it finish."""

    old: Peers
    new: Peers
    revision: int
    cancel: bool = False


@dataclass(frozen=True, slots=True)
class WritePrimaries:
    """CAS each ``{p}/primary/{zone}/{partition}`` from its expected mod_revision (0 = absent);
    a write that changes the holder also compares the partition's ISR key (``LeaseWrite.isr_mod``:
    ``mod_revision == isr_mod``, or ``version == 0`` when 0)."""

    zone: str
    leases: Mapping[int, LeaseWrite]


@dataclass(frozen=True, slots=True)
class WriteTerms:
    """CAS each ``{p}/primary/@term/{node}`` of ``writes`` from its expected mod_revision
    (0 = absent); delete each of ``drops`` (node -> its mod_revision): terms of nodes long gone
    that no lease names."""

    writes: Mapping[str, TermWrite]
    drops: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class DropLeftovers:
    """A dropped zone (no config, no assignment keys): delete its datanodes, primary, ISR,
    replica-size, layout and reshard-report keys."""

    zone: str


@dataclass(frozen=True, slots=True)
class RetirePartitions:
    """Partitions the layout no longer keeps (design/resharding.md): delete their assignment,
    primary, ISR, size and report keys (comparing the layout's mod revision), then Retire
    their replicas on the nodes that ``holders`` names."""

    zone: str
    holders: Mapping[int, tuple[str, ...]]
    expected_layout_mod: int


@dataclass(frozen=True, slots=True)
class WriteLayout:
    """A layout transition (design/resharding.md): ``step`` writes ``layout``, decided on the
    layout and config at ``expected_layout_mod`` / ``expected_zone_mod`` (both compared)."""

    zone: str
    step: Step
    layout: ZoneLayout
    expected_layout_mod: int
    expected_zone_mod: int


@dataclass(frozen=True, slots=True)
class CancelMove:
    """Write the cancel key of pending ``revision`` (``Metastore.cancel``): the move waits for a
    joining node that has left the zone's data nodes, and planned already names a target
    without it — only a cancel lets the partition move on (pending := planned)."""

    zone: str
    partition: int
    revision: int


#: The fields of a :class:`PassPlan` (and of a :class:`ZonePlan`) that write to etcd.
WRITE_FIELDS = (
    "datanodes",
    "creates",
    "triggers",
    "primaries",
    "drops",
    "cancels",
    "layouts",
    "retires",
)


@dataclass(frozen=True, slots=True)
class PassPlan:
    datanodes: tuple[WriteDataNodes, ...] = ()
    creates: tuple[CreatePartitions, ...] = ()
    triggers: tuple[ApplyTriggers, ...] = ()
    drives: tuple[Drive, ...] = ()
    primaries: tuple[WritePrimaries, ...] = ()
    #: Zones skipped and why (no data nodes, corrupt spec, placement refused).
    skipped: Mapping[str, str] = field(default_factory=dict)
    drops: tuple[DropLeftovers, ...] = ()
    cancels: tuple[CancelMove, ...] = ()
    #: Per zone, partitions whose ISR key is corrupt: their leases stay where they are.
    corrupt_isrs: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    layouts: tuple[WriteLayout, ...] = ()
    retires: tuple[RetirePartitions, ...] = ()
    #: The earliest time (unix ms) after the pass's ``now_ms`` at which a pass on the same view
    #: could decide something new (a lease due or expiring, a held-down change due); ``None``:
    #: only a change of the view can. The leader sleeps until then unless etcd changes first.
    next_due_ms: int | None = None
    #: Lease terms to write first (cluster-wide, not of a zone: ``leases.plan_terms``).
    terms: WriteTerms | None = None
    #: The next round of term renewals: (when, the live holders it may renew) — the leader
    #: health-checks them just before, off the pass (design/control-plane.md, "Primary
    #: leases"). None: no holder has a term to renew.
    term_round: tuple[int, frozenset[str]] | None = None
    #: Zones this pass's budget left for the next pass (:func:`plan_pass`), in name order.
    deferred: tuple[str, ...] = ()

    @property
    def writes(self) -> bool:
        return self.terms is not None or any(getattr(self, f) for f in WRITE_FIELDS)


# -- the pass ----------------------------------------------------------------------------------


def current_peers(state: PartitionState) -> Peers | None:
    """What placement should start from: pending if a rebalance is in flight, else stable."""
    return state.peers(AssignField.PENDING) or state.peers(AssignField.STABLE)


def current_loads(zone: ZoneView) -> tuple[Counter[str], Counter[str]]:
    """The zone's replicas and preferred primaries per node, counted on :func:`current_peers`."""
    return zone_loads(
        peers for state in zone.partitions.values() if (peers := current_peers(state))
    )


class FleetLoads:
    """Every zone's :func:`current_loads`, recounted only for the zones whose view changed
    (a new :class:`ZoneView` object), and their sum: a pass's starting tally."""

    def __init__(self) -> None:
        self._zones: dict[str, tuple[ZoneView, tuple[Counter[str], Counter[str]]]] = {}
        self._total = FleetTally()

    def tally(self, zones: Mapping[str, ZoneView]) -> FleetTally:
        """A fresh tally of ``zones`` (the caller's to change)."""
        none: tuple[Counter[str], Counter[str]] = (Counter(), Counter())
        for name in [n for n in self._zones if n not in zones]:
            self._total.placed(self._zones.pop(name)[1], none)
        for name, zone in zones.items():
            held = self._zones.get(name)
            if held is not None and held[0] is zone:
                continue
            own = current_loads(zone)
            self._total.placed(held[1] if held is not None else none, own)
            self._zones[name] = (zone, own)
        return self._total.copy()


def plan_zone_targets(
    zone: ZoneView,
    spec: ZoneSpec,
    nodes: Mapping[str, NodeRecord],
    applied: tuple[str, ...],
    kept: int = 0,
    cordoned: frozenset[str] = frozenset(),
    tally: FleetTally | None = None,
    memo: TargetsMemo | None = None,
) -> tuple[dict[int, Peers], dict[int, Peers], int] | str:
    """``(creates, triggers, R)`` for one zone, or a reason string when it cannot be placed.

    Partitions ``spec.partitions..kept-1`` are a shrink's removed ones (:func:`kept_partitions`):
    they hold keys until its clean-up, so one whose members include a node that is no longer a
    data node is re-placed — by the placement of all ``kept`` partitions, which replaces only
    the lost members — and the others stay where they are (design/resharding.md, PREPARE).

    ``tally``: the fleet's loads, zones placed so far in this pass counted with their targets
    (:class:`~placement.algo.fleet.FleetTally`); the zone's ties go to the nodes it loads
    least, and the tally then counts this zone's targets — unless ``memo`` held them: then they
    are the zone's current assignment, which the tally already counts."""
    own: tuple[Counter[str], Counter[str]] | None = None

    def fleet() -> FleetLoad | None:
        nonlocal own
        if tally is None:
            return None
        own = current_loads(zone)
        return tally.others(*own)

    targets = zone_targets(zone, spec, nodes, applied, kept, cordoned, memo=memo, fleet_of=fleet)
    if isinstance(targets, str):
        return targets
    if tally is not None and own is not None:
        after = {p: peers for p, s in zone.partitions.items() if (peers := current_peers(s))}
        after.update(targets)
        tally.placed(own, zone_loads(after.values()))
    return (*target_writes(zone, targets), max(zone.zone_mod, zone.datanodes_mod))


def target_writes(
    zone: ZoneView, targets: Mapping[int, Peers]
) -> tuple[dict[int, Peers], dict[int, Peers]]:
    """``(creates, triggers)``: the partitions of ``targets`` with no assignment key yet, and
    those where rule 2 would write (pending or planned, or delete planned) at the zone's trigger
    revision — the writes a pass makes to reach ``targets``."""
    revision = max(zone.zone_mod, zone.datanodes_mod)
    creates: dict[int, Peers] = {}
    triggers: dict[int, Peers] = {}
    for p, target in targets.items():
        found = zone.partitions.get(p)
        if found is None:
            creates[p] = target
            continue
        state = found
        action = decide_trigger(state, target, revision)
        if action is TriggerAction.WRITE_PLANNED and state.peers(AssignField.PLANNED) == target:
            continue  # already queued: rewriting it would move nothing
        if action in (
            TriggerAction.WRITE_PENDING,
            TriggerAction.WRITE_PLANNED,
            TriggerAction.DELETE_PLANNED,
            TriggerAction.RECOVER_PENDING,
        ):
            triggers[p] = target
    return creates, triggers


class TargetsMemo:
    """Each zone's targets from its last placement, with the inputs they were placed on:
    :func:`zone_targets` on the same inputs, once the zone's assignment (pending, else stable)
    equals them, returns them without placing again. Sound because placement's output fed back
    is a fixed point whatever the fleet's loads (design/placement.md, "Fleet-wide balance";
    ``tests/unit/test_placement_fleet.py``): placing the zone from its targets gives them back,
    and the zone's ties cannot change them. A pass after its own creations or triggers landed,
    one that grants or renews leases, or a status poll decides zones whose assignment is their
    target: this spares the placement, the largest part of those decisions
    (``bench/results/driver_pass.md``). An assignment that differs from the targets held (a
    move to another balanced set, say) is placed again."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[tuple[object, ...], dict[int, Peers]]] = {}
        self.reused = 0
        #: per zone: the inputs and the time-free part of its outlook (:func:`zone_outlook`):
        #: what a status poll or a scrape of an unchanged zone reuses
        self._outlooks: dict[str, tuple[tuple[object, ...], tuple[tuple[int, ...], int, str]]] = {}

    def outlook(
        self, name: str, inputs: tuple[object, ...]
    ) -> tuple[tuple[int, ...], int, str] | None:
        held = self._outlooks.get(name)
        if held is None or held[0] != inputs:
            return None
        return held[1]

    def put_outlook(
        self, name: str, inputs: tuple[object, ...], found: tuple[tuple[int, ...], int, str]
    ) -> None:
        self._outlooks[name] = (inputs, found)

    def get(
        self, name: str, inputs: tuple[object, ...], current: dict[int, Peers]
    ) -> dict[int, Peers] | None:
        held = self._held.get(name)
        if held is None or held[0] != inputs or held[1] != current:
            return None
        self.reused += 1
        return dict(held[1])

    def put(self, name: str, inputs: tuple[object, ...], targets: dict[int, Peers]) -> None:
        self._held[name] = (inputs, dict(targets))

    def retain(self, zones: Mapping[str, object]) -> None:
        """Forget zones no longer in the view."""
        for held in (self._held, self._outlooks):
            for name in [n for n in held if n not in zones]:
                del held[name]

    def forget(self, name: str) -> None:
        """Forget one zone (dropped)."""
        self._held.pop(name, None)
        self._outlooks.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._held or name in self._outlooks


def zone_targets(
    zone: ZoneView,
    spec: ZoneSpec,
    nodes: Mapping[str, NodeRecord],
    applied: tuple[str, ...],
    kept: int = 0,
    cordoned: frozenset[str] = frozenset(),
    fleet: FleetLoad | None = None,
    memo: TargetsMemo | None = None,
    fleet_of: Callable[[], FleetLoad | None] | None = None,
) -> dict[int, Peers] | str:
    """The placement target of every partition ``0..P-1`` of one zone on the data nodes
    ``applied`` (and of a shrink's removed partitions that lost a member, see
    :func:`plan_zone_targets`), or why it cannot be placed. Every caller that asks "where should
    the replicas be" — a pass, the status outlook, a dry-run plan — asks it here. Nodes in
    ``cordoned`` keep their replicas and take no new ones (design/placement.md, "Cordoned
    nodes"). ``fleet``: the other zones' loads, which break ties (design/placement.md,
    "Fleet-wide balance"); ``fleet_of``: asked for them instead, only when the zone is placed.
    ``memo``: see :class:`TargetsMemo`."""
    if not applied:
        return "no data nodes"
    current: dict[int, Peers] = {}
    for p, state in zone.partitions.items():
        peers = current_peers(state)
        if peers is not None and p < spec.partitions:
            current[p] = peers
    removed = {
        p: peers
        for p in range(spec.partitions, kept)
        if (found := zone.partitions.get(p)) is not None
        and (peers := current_peers(found)) is not None
    }
    lost = [p for p, peers in removed.items() if not set(peers) <= set(applied)]
    inputs = (spec, applied, cordoned, tuple(nodes.get(n) for n in applied))
    if memo is not None and not lost:
        held = memo.get(zone.name, inputs, current)
        if held is not None:
            return held
    # A data node whose record is gone (held down by the scale-down delay) matched the selector
    # when it was applied: it keeps matching it until the delay removes it.
    eligible = [
        Node(n, dict(nodes[n].attributes), nodes[n].weight)
        if n in nodes
        else Node(n, dict(spec.node_selector))
        for n in applied
    ]
    if fleet_of is not None:
        fleet = fleet_of()
    result = _placed(spec, eligible, current, cordoned, fleet)
    if isinstance(result, str):
        return result
    targets = dict(enumerate(result.assignments))
    if memo is not None and not lost:
        memo.put(zone.name, inputs, targets)
    if lost:
        wide = _placed(replace(spec, partitions=kept), eligible, current | removed, cordoned, fleet)
        if isinstance(wide, str):
            return wide
        targets.update((p, wide.assignments[p]) for p in lost)
    return targets


def _placed(
    spec: ZoneSpec,
    eligible: list[Node],
    current: dict[int, Peers],
    cordoned: frozenset[str],
    fleet: FleetLoad | None = None,
) -> Placement | str:
    """``place(...)``, or why not. Any other exception is a bug in placement: reported as the
    zone's reason (status shows it, the zone is left as it is) so that one zone never stops the
    driver placing the others."""
    try:
        return place(spec, eligible, current, cordoned, fleet)
    except InvalidInput as e:
        return f"placement refused: {e}"
    except Exception as e:  # contained per zone, named in its status
        return f"placement failed ({type(e).__name__}: {e}); the zone is left as it is — a bug"


def abandoned_moves(zone: ZoneView, applied: tuple[str, ...]) -> list[CancelMove]:
    """Moves that cannot finish: a member of pending — joining or staying — is no longer a data
    node (left after its scale-down delay), so it can never report DONE, and a planned target
    exists to move on to."""
    members = set(applied)
    found = []
    for state in zone.partitions.values():
        drive = drive_action(state)
        if drive is None or drive.cancel or state.planned is None:
            continue
        if any(n not in members for n in drive.new):
            found.append(CancelMove(zone.name, state.partition, drive.revision))
    return found


def drive_action(state: PartitionState) -> Drive | None:
    """The Drive a partition needs (see the table in the module docstring), or None."""
    pending = state.pending
    if pending is None or not isinstance(pending.value, Assignment):
        return None
    stable = state.peers(AssignField.STABLE) or ()
    revision = pending.mod_revision
    cancel = state.cancel
    if cancel is None:
        return Drive(state.zone, state.partition, stable, pending.value.peers, revision)
    if isinstance(cancel.value, CancelIntent) and cancel.value.pending_revision == revision:
        old = cancel.value.old or stable
        new = cancel.value.new or pending.value.peers
        return Drive(state.zone, state.partition, old, new, revision, cancel=True)
    return None


def layout_step(
    zone: ZoneView,
    spec: ZoneSpec,
    registered: set[str],
    now_ms: int,
    terms: Mapping[str, int] = MappingProxyType({}),
) -> WriteLayout | None:
    """The zone's due layout transition (design/resharding.md). A corrupt layout is left
    alone (reported by status)."""
    if isinstance(zone.layout, Corrupt):
        return None
    current = zone.layout.layout if zone.layout is not None else None
    reshard = current.reshard if current is not None else None
    facts = reshard_facts(zone, reshard, registered, now_ms, terms) if reshard else ReshardFacts()
    t = next_step(
        current,
        spec.partitions,
        facts,
        wanted_revision=zone.zone_mod,
        created_revision=zone.zone_created,
    )
    if t is None:
        return None
    return WriteLayout(zone.name, t.step, t.layout, zone.layout_mod, zone.zone_mod)


def kept_partitions(layout: LayoutValue | Corrupt | None, spec: ZoneSpec) -> int:
    """How many partitions (``0..n-1``) the zone keeps: both counts while a reshard runs up to
    its flip, the target's from then on, the source's while aborting; with no reshard the
    layout's and the config's (a change the next pass begins). Unknown layout: the config's
    and every partition that has keys stays (nothing is retired)."""
    if not isinstance(layout, LayoutValue):
        return spec.partitions
    current = layout.layout
    r = current.reshard
    if r is None:
        return max(current.partitions, spec.partitions)
    if r.phase is ReshardPhase.CLEANUP:
        return r.target
    if r.phase is ReshardPhase.ABORT:
        return r.source
    return max(r.source, r.target)


def reshard_facts(
    zone: ZoneView,
    reshard: Reshard,
    registered: set[str],
    now_ms: int,
    terms: Mapping[str, int] = MappingProxyType({}),
) -> ReshardFacts:
    """What the leader observes of ``reshard`` (design/resharding.md): destinations ready
    (stable, a live primary lease whose holder is in the partition's ISR), caught up and
    drained (their reports), and every partition the layout keeps purged with nothing left
    beyond it."""
    moves = reshard.moves

    def current(p: int, report: ReshardReport) -> bool:
        """Of this attempt, and from the partition's current primary or a newer one: a report
        put by a deposed primary that reached etcd late (it overwrites the key) says nothing."""
        lease = zone.primaries.get(p)
        held = lease.value.lease_epoch if lease and isinstance(lease.value, PrimaryLease) else 0
        return report.attempt == reshard.attempt and report.lease_epoch >= held

    reports = {p: r for p, r in zone.reshard_reports.items() if current(p, r)}

    def ready(q: int) -> bool:
        state = zone.partitions.get(q)
        lease = zone.primaries.get(q)
        isr = zone.isrs.get(q)
        return (
            state is not None
            and state.stable is not None
            and lease is not None
            and isinstance(lease.value, PrimaryLease)
            and lease.value.node in registered
            and lease.value.until(terms.get(lease.value.node, 0)) > now_ms
            and isr is not None
            and isinstance(isr.value, InSyncSet)
            # a primary that stepped down (its replica lacks committed entries) wrote an ISR
            # without itself and serves nothing until its lease moves
            and lease.value.node in isr.value.members
        )

    destinations = moves.destinations
    count = reshard.target if reshard.phase is ReshardPhase.CLEANUP else reshard.source
    beyond = any(p >= count for p in zone.partitions)
    return ReshardFacts(
        ready=all(ready(q) for q in destinations),
        caught_up=all(q in reports and reports[q].lag <= SEAL_LAG for q in destinations),
        drained=all(q in reports and reports[q].drained for q in destinations),
        purged=not beyond and all(p in reports and reports[p].purged for p in range(count)),
    )


def retire_step(zone: ZoneView, spec: ZoneSpec) -> RetirePartitions | None:
    """Partitions with keys beyond :func:`kept_partitions` (a shrink's removed ones after the
    flip, an aborted grow's new ones): retired, with the nodes that hold their replicas."""
    if not isinstance(zone.layout, LayoutValue):
        return None
    kept = kept_partitions(zone.layout, spec)
    gone = sorted(p for p in {*zone.partitions, *zone.primaries, *zone.isrs} if p >= kept)
    if not gone:
        return None
    holders: dict[int, tuple[str, ...]] = {}
    for p in gone:
        state = zone.partitions.get(p)
        nodes: set[str] = set()
        if state is not None:
            for f in (AssignField.STABLE, AssignField.PENDING, AssignField.PLANNED):
                nodes.update(state.peers(f) or ())
        holders[p] = tuple(sorted(nodes))
    return RetirePartitions(zone.name, MappingProxyType(holders), zone.layout_mod)


@dataclass(frozen=True, slots=True)
class ZoneOutlook:
    """What the leader would still do for one zone, decided on a view exactly as a pass decides
    (:func:`zone_outlook`): the input of an honest status (READY only when all is empty).

    ``datanodes_due``: the data-node record would change now (a registered node matching the
    selector, or one gone, not written yet — e.g. during a leaderless window); ``held_s``:
    seconds until a held membership change is due (None: none held), with the change counted
    from now when the record does not show it yet; ``eligible``: the data nodes placement would
    use; ``off_target``: partitions whose current assignment is not the target (creates and
    triggers a pass would write — e.g. left off target by a cancel); ``stuck``: moves waiting
    for a node that left (a pass would cancel them); ``unplaceable``: why the zone cannot be
    placed ("" when it can)."""

    datanodes_due: bool
    held_s: float | None
    eligible: tuple[str, ...]
    off_target: tuple[int, ...]
    stuck: int
    unplaceable: str = ""


def zone_outlook(
    view: ClusterView, name: str, now_ms: int, memo: TargetsMemo | None = None
) -> ZoneOutlook | None:
    """:class:`ZoneOutlook` of zone ``name`` in ``view`` (None: no readable config); ``memo``:
    the placements to reuse (:class:`TargetsMemo`)."""
    zone = view.zones.get(name)
    if zone is None or not isinstance(zone.spec, ZoneSpec):
        return None
    spec = zone.spec
    previous = zone.datanodes if isinstance(zone.datanodes, DataNodes) else None
    observed, drained = observed_nodes(view, zone, spec, now_ms)
    record = advance(spec, previous, observed, now_ms, drained)
    due = previous is None or record.applied != previous.applied
    held = holddown_remaining(spec, record, now_ms)
    applied = record.applied
    kept = kept_partitions(zone.layout, spec)
    # the zone and the nodes by identity (an unchanged zone's view is the same object)
    inputs = (_Same(zone), _Same(view.nodes), applied, view.cordoned, kept)
    found = memo.outlook(name, inputs) if memo is not None else None
    if found is None:
        found = _off_target(zone, spec, view, applied, kept, memo)
        if memo is not None:
            memo.put_outlook(name, inputs, found)
    off, stuck, unplaceable = found
    return ZoneOutlook(due, held, applied, off, stuck, unplaceable)


@dataclass(frozen=True, slots=True, eq=False)
class _Same:
    """A value compared by identity in a tuple compared with ``==``."""

    value: object

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


def _off_target(
    zone: ZoneView,
    spec: ZoneSpec,
    view: ClusterView,
    applied: tuple[str, ...],
    kept: int,
    memo: TargetsMemo | None,
) -> tuple[tuple[int, ...], int, str]:
    """The time-free part of :func:`zone_outlook`: the partitions off their targets, the stuck
    moves, and why the zone cannot be placed ("" when it can)."""
    targets = zone_targets(zone, spec, view.nodes, applied, kept, view.cordoned, memo=memo)
    if isinstance(targets, str):
        return (), 0, targets
    creates, triggers = target_writes(zone, targets)
    off = {*creates, *triggers}
    for p, target in targets.items():
        found = zone.partitions.get(p)
        if p < spec.partitions and (
            found is None or set(target) != set(current_peers(found) or ())
        ):
            off.add(p)
    return tuple(sorted(off)), len(abandoned_moves(zone, applied)), ""


def observed_nodes(
    view: ClusterView, zone: ZoneView, spec: ZoneSpec, now_ms: int
) -> tuple[tuple[str, ...], frozenset[str]]:
    """The registered nodes matching the zone's selector that count as its data nodes, and the
    drained ones to remove at once (no scale-down delay: the operator asked). A drained node
    stays while it holds an unexpired primary lease of the zone that another live in-sync
    member of stable could take — its leases move first, then its replicas (make-before-break,
    like every move). A lease no one can take yet (R=1, or the others not in sync) does not hold
    it back: the rebalance adds the new members, and the lease follows once they are in sync."""
    live, leaving = set(view.nodes), view.leaving
    leading = set()
    for p, lease in zone.primaries.items() if view.draining else ():
        value = lease.value
        if not isinstance(value, PrimaryLease) or value.node not in view.draining:
            continue  # only a draining holder can be held back
        if view.lease_until(value) <= now_ms:
            continue
        state = zone.partitions.get(p)
        peers = (state.peers(AssignField.STABLE) if state is not None else None) or ()
        isr = zone.isrs.get(p)
        members = set(peers)
        if isr is not None:
            members &= set(isr.value.members) if isinstance(isr.value, InSyncSet) else set()
        if members & live - leaving:  # someone can take it: the node waits for the hand-over
            leading.add(value.node)
    drained = frozenset(n for n in view.draining if n not in leading)
    nodes = [r for r in view.nodes.values() if r.name not in drained]
    return matching_nodes(spec, nodes), drained


def view_zone_status(
    view: ClusterView,
    name: str,
    now_ms: int,
    *,
    leader: bool = True,
    sizes: Mapping[int, int] | None = None,
    memo: TargetsMemo | None = None,
) -> ZoneStatus | None:
    """Zone ``name``'s status on ``view`` by the leader's own rules (its outlook, its reshard's
    progress): what GetZoneStatus answers and the leader's gauges show. None: no readable
    config. ``sizes``: partition -> bytes of its largest replica (progress and ETA); ``memo``:
    the placements to reuse (:class:`TargetsMemo`)."""
    zone = view.zones.get(name)
    if zone is None or not isinstance(zone.spec, ZoneSpec):
        return None
    progress = None
    if isinstance(zone.layout, LayoutValue):
        progress = reshard_progress(zone.layout, zone.reshard_reports, sizes or {}, now_ms)
    return zone_status(
        zone.spec,
        zone.partitions,
        zone.datanodes,
        now_ms / 1000,
        progress,
        outlook=zone_outlook(view, name, now_ms, memo),
        leader=leader,
        sizes=sizes,
        cordoned=view.cordoned,
    )


@dataclass(slots=True)
class ZonePlan:
    """One zone's part of a :class:`PassPlan` (see there); ``due``: its next due time."""

    datanodes: list[WriteDataNodes] = field(default_factory=list)
    creates: list[CreatePartitions] = field(default_factory=list)
    triggers: list[ApplyTriggers] = field(default_factory=list)
    drives: list[Drive] = field(default_factory=list)
    primaries: list[WritePrimaries] = field(default_factory=list)
    skipped: str | None = None
    drops: list[DropLeftovers] = field(default_factory=list)
    cancels: list[CancelMove] = field(default_factory=list)
    corrupt_isrs: tuple[int, ...] = ()
    layouts: list[WriteLayout] = field(default_factory=list)
    retires: list[RetirePartitions] = field(default_factory=list)
    due: list[int] = field(default_factory=list)
    #: Nodes whose lease terms this zone's leases need (``leases.lease_holders``).
    holders: frozenset[str] = frozenset()

    @property
    def writes(self) -> bool:
        return any(getattr(self, f) for f in WRITE_FIELDS)


def plan_zone(
    view: ClusterView,
    name: str,
    zone: ZoneView,
    now_ms: int,
    leases: LeaseConfig | None,
    silent: frozenset[str] = frozenset(),
    tally: Callable[[], FleetTally] | None = None,
    targets: TargetsMemo | None = None,
) -> ZonePlan:
    """Everything the leader should do now for zone ``name``, decided on ``view`` alone;
    ``silent``: registered nodes whose agents did not answer the leader's last probe — they get
    no lease and none of theirs is renewed (design/control-plane.md, "Primary leases");
    ``tally``: the pass's fleet tally, asked for when the zone is placed (design/placement.md,
    "Fleet-wide balance"); ``targets``: the placements to reuse (:class:`TargetsMemo`)."""
    plan = ZonePlan()
    spec = zone.spec
    if not view.paused:
        for state in zone.partitions.values():
            drive = drive_action(state)
            if drive is not None:
                plan.drives.append(drive)
    if not isinstance(spec, ZoneSpec):
        plan.skipped = "zone config absent" if spec is None else "zone config corrupt"
        if (
            spec is None
            and not zone.partitions
            and (zone.datanodes or zone.primaries or zone.isrs or zone.has_sizes or zone.layout)
        ):
            plan.drops.append(DropLeftovers(name))
        return plan
    # a lease ending changes what observed_nodes and reshard_facts see: at its cap (here) or
    # at its holder's term's end (a due time of the pass, plan_pass)
    expiries = [
        lease.value.expiry
        for lease in zone.primaries.values()
        if isinstance(lease.value, PrimaryLease) and lease.value.expiry > now_ms
    ]
    if expiries:
        plan.due.append(min(expiries))
    step = layout_step(zone, spec, set(view.nodes), now_ms, view.term_until)
    if step is not None:
        plan.layouts.append(step)
    retire = retire_step(zone, spec)
    if retire is not None:
        plan.retires.append(retire)
    kept = kept_partitions(zone.layout, spec)
    previous = zone.datanodes if isinstance(zone.datanodes, DataNodes) else None
    observed, drained = observed_nodes(view, zone, spec, now_ms)
    record = advance(spec, previous, observed, now_ms, drained)
    if previous is None or not record.same_content(previous):
        plan.datanodes.append(WriteDataNodes(name, record, zone.datanodes_mod))
        return plan
    held = holddown_remaining(spec, previous, now_ms)
    if held is not None:
        plan.due.append(now_ms + max(1, math.ceil(held * 1000)))
    if not view.paused:
        plan.cancels.extend(abandoned_moves(zone, previous.applied))
    decided = plan_zone_targets(
        zone,
        spec,
        view.nodes,
        previous.applied,
        kept,
        view.cordoned,
        tally() if tally is not None else None,
        targets,
    )
    if isinstance(decided, str):
        plan.skipped = decided
    else:
        create, trigger, revision = decided
        if create:
            plan.creates.append(CreatePartitions(name, MappingProxyType(create), revision))
        if trigger:
            plan.triggers.append(ApplyTriggers(name, MappingProxyType(trigger), revision))
    if leases is not None:
        stables = {
            p: peers
            for p, s in zone.partitions.items()
            if p < kept and (peers := s.peers(AssignField.STABLE)) is not None
        }
        isrs = {p: isr for p, isr in zone.isrs.items() if p in stables}
        live = set(view.nodes) - silent
        terms = view.term_until
        term_mods = {n: t.mod_revision for n, t in view.terms.items()}
        grants = plan_primaries(
            stables, zone.primaries, live, now_ms, leases, isrs, view.leaving, terms, term_mods
        )
        if grants:
            plan.primaries.append(WritePrimaries(name, MappingProxyType(grants)))
        plan.holders = lease_holders(stables, zone.primaries, grants, live, now_ms, terms)
        lease_due = next_due_ms(stables, zone.primaries, now_ms, leases)
        if lease_due is not None:
            plan.due.append(lease_due)
        plan.corrupt_isrs = tuple(corrupt_isrs(isrs))
    return plan


def _term_states(
    zone: ZoneView, term_until: Mapping[str, int], now_ms: int
) -> tuple[tuple[str, int], ...]:
    """For each node the zone's leases name: 0 no lease term, 1 its term has ended, 2 it lasts
    — all a zone's plan depends on of the terms (a lease's end is :meth:`PrimaryLease.until`:
    its cap alone without a term, else the earlier of the two; the caps are the plan's due
    times, the terms' ends the pass's)."""
    named = {e.value.node for e in zone.primaries.values() if isinstance(e.value, PrimaryLease)}
    return tuple(
        (n, 0 if until == 0 else 1 if until <= now_ms else 2)
        for n in sorted(named)
        for until in (term_until.get(n, 0),)
    )


class PlanMemo:
    """Zone plans kept between passes (the incremental pass, design/control-plane.md): a zone
    whose plan writes nothing is not decided again while its view, the registered nodes, the
    drain and cordon marks, the pause flag and the silent nodes are the same objects, the lease
    terms of the nodes its leases name are in the same state (none, ended, lasting: a round of
    renewals changes nothing) and its next due time has not come — :func:`plan_zone` would
    decide exactly the same (it depends on time only through what its due times and those
    states cover). A plan that writes is always decided again: its writes carry times."""

    def __init__(self) -> None:
        self._plans: dict[
            str,
            tuple[
                tuple[object, ...],
                ZonePlan,
                int | None,
                LeaseConfig | None,
                tuple[tuple[str, int], ...],
            ],
        ] = {}
        #: zones decided and zones reused, over the memo's life (for tests and benchmarks)
        self.decided = 0
        self.reused = 0
        #: every zone's current loads, for the passes' fleet tallies
        self.fleet = FleetLoads()
        #: the zones' placements, for the plans decided again (their leases changed, say)
        self.targets = TargetsMemo()
        #: Where the next pass starts deciding (the last zone a pass decided before it ran out
        #: of its budget; None: the first zone): see :func:`plan_pass`.
        self.cursor: str | None = None
        #: per deferred zone: what its deferred plan was made on (compared by identity), until
        #: when it holds, its drives and its holders (see :meth:`deferred`)
        self._deferred: dict[
            str, tuple[tuple[object, ...], int, tuple[Drive, ...], frozenset[str]]
        ] = {}

    def held(
        self,
        view: ClusterView,
        name: str,
        zone: ZoneView,
        now_ms: int,
        leases: LeaseConfig | None,
        silent: frozenset[str] = frozenset(),
    ) -> ZonePlan | None:
        """The zone's kept plan when it still holds (see the class), else None."""
        held = self._plans.get(name)
        if (
            held is not None
            and all(a is b for a, b in zip(held[0], _plan_inputs(view, zone, silent), strict=True))
            and held[3] == leases
            and (held[2] is None or now_ms < held[2])
            and held[4] == _term_states(zone, view.term_until, now_ms)
        ):
            self.reused += 1
            return held[1]
        return None

    def decide(
        self,
        view: ClusterView,
        name: str,
        zone: ZoneView,
        now_ms: int,
        leases: LeaseConfig | None,
        silent: frozenset[str] = frozenset(),
        tally: Callable[[], FleetTally] | None = None,
    ) -> ZonePlan:
        """The zone decided (:func:`plan_zone`), its plan kept when it writes nothing."""
        self.decided += 1
        plan = plan_zone(view, name, zone, now_ms, leases, silent, tally, self.targets)
        if plan.writes:
            self._plans.pop(name, None)
        else:
            states = _term_states(zone, view.term_until, now_ms)
            inputs = _plan_inputs(view, zone, silent)
            self._plans[name] = (inputs, plan, min(plan.due, default=None), leases, states)
        return plan

    def deferred(
        self,
        view: ClusterView,
        name: str,
        zone: ZoneView,
        now_ms: int,
        silent: frozenset[str],
        live: Set[str],
        leases: bool,
    ) -> ZonePlan:
        """The plan of a zone the pass's budget defers (:func:`_deferred`), due again at once.
        A pass defers most zones of a fleet while it creates or moves some, and a deferred
        zone's drives and holders are a walk over all its partitions: they are kept while its
        view, the nodes, the silent nodes, the pause flag and the terms are the same objects
        and no lease of its holders has ended."""
        inputs = (zone, view.nodes, silent, view.paused, view.term_until, leases)
        held = self._deferred.get(name)
        if (
            held is None
            or now_ms >= held[1]
            or any(a is not b for a, b in zip(held[0], inputs, strict=True))
        ):
            drives, holders, until = _deferred(view, zone, now_ms, live, leases)
            held = (inputs, until, drives, holders)
            self._deferred[name] = held
        return ZonePlan(drives=list(held[2]), holders=held[3], due=[now_ms])

    def retain(self, zones: Mapping[str, ZoneView]) -> None:
        """Forget zones no longer in the view."""
        for name in [n for n in self._plans if n not in zones]:
            del self._plans[name]
        for name in [n for n in self._deferred if n not in zones]:
            del self._deferred[name]
        self.targets.retain(zones)


def _plan_inputs(view: ClusterView, zone: ZoneView, silent: frozenset[str]) -> tuple[object, ...]:
    """What a kept plan was decided on, compared by identity (see :class:`PlanMemo`)."""
    return (zone, view.nodes, view.draining, view.cordoned, view.paused, silent)


def plan_pass(
    view: ClusterView,
    now_ms: int,
    leases: LeaseConfig | None = None,
    memo: PlanMemo | None = None,
    silent: frozenset[str] = frozenset(),
    budget: int | None = None,
) -> PassPlan:
    """Everything the leader should do now, decided on ``view`` alone (``memo``: reusing the
    plans of zones nothing happened to; the result is the same; ``silent``: see
    :func:`plan_zone`).

    Zones are decided in name order with one fleet tally (counted when a zone is first placed),
    so each zone's ties see the targets of the zones placed before it in the pass — the order
    and the tally of the pipeline's engines (``placement.pipeline.engines.plan_local``). A zone
    nothing happened to is a fixed point whatever the tally, so a memo's plan stays valid.

    ``budget`` (with a memo): the partitions this pass may decide — zones whose kept plan holds
    cost nothing, every zone decided costs its partition count, and the zone that crosses the
    budget is still decided. The zones left are **deferred**: they write nothing in this pass,
    their moves in flight are driven as before, the leases they hold count for the terms, and
    the pass is due again at once (``next_due_ms == now_ms``); the next one starts after the
    last zone decided (``PlanMemo.cursor``), so every zone is decided within
    ``⌈fleet partitions / budget⌉`` passes. The zones still go in name order: a later pass's
    tally counts the zones decided before it at their targets, as their writes land. Without
    a budget nothing is deferred."""
    if memo is not None:
        memo.retain(view.zones)
    fleet = memo.fleet if memo is not None else FleetLoads()
    tally = functools.cache(lambda: fleet.tally(view.zones))
    names = sorted(view.zones)
    if memo is not None and budget is not None and memo.cursor is not None:
        start = bisect.bisect_right(names, memo.cursor)
        names = names[start:] + names[:start]
    decided: dict[str, ZonePlan] = {}
    deferred: list[str] = []
    spent = 0
    for name in names:
        zone = view.zones[name]
        if memo is None:
            decided[name] = plan_zone(view, name, zone, now_ms, leases, silent, tally)
            continue
        kept = memo.held(view, name, zone, now_ms, leases, silent)
        if kept is not None:
            decided[name] = kept
        elif budget is not None and spent >= budget:
            deferred.append(name)
        else:
            decided[name] = memo.decide(view, name, zone, now_ms, leases, silent, tally)
            spent += _decision_size(zone)
            if budget is not None:
                memo.cursor = name
    live = set(view.nodes) - silent
    if memo is not None and not deferred:
        memo.cursor = None
    for name in deferred:
        assert memo is not None  # only a memo's budget defers
        zone = view.zones[name]
        decided[name] = memo.deferred(view, name, zone, now_ms, silent, live, leases is not None)
    plans = {name: decided[name] for name in view.zones}
    due = [t for plan in plans.values() for t in plan.due]
    terms = None
    term_round = None
    if leases is not None:
        holders = frozenset().union(*(plan.holders for plan in plans.values()))
        writes = plan_terms(view.terms, holders, live, now_ms, leases)
        drops = stale_terms(view, now_ms, leases)
        if writes or drops:
            terms = WriteTerms(MappingProxyType(writes), MappingProxyType(drops))
        term_due = terms_due_ms(view.term_until, holders & live, now_ms, leases)
        if term_due is not None:
            due.append(term_due)
        renewals = [
            at
            for n in holders & live
            if n in view.term_until
            and (at := view.term_until[n] - leases.renew_before_ms + 1) > now_ms
        ]
        if renewals:
            term_round = (min(renewals), frozenset(holders & live))
        # any term's end: the leases it carries end then (zone plans leave it to the pass)
        due.extend(until for until in view.term_until.values() if until > now_ms)
    return PassPlan(
        tuple(w for plan in plans.values() for w in plan.datanodes),
        tuple(c for plan in plans.values() for c in plan.creates),
        tuple(t for plan in plans.values() for t in plan.triggers),
        tuple(d for plan in plans.values() for d in plan.drives),
        tuple(p for plan in plans.values() for p in plan.primaries),
        MappingProxyType({n: p.skipped for n, p in plans.items() if p.skipped is not None}),
        tuple(d for plan in plans.values() for d in plan.drops),
        tuple(c for plan in plans.values() for c in plan.cancels),
        MappingProxyType({n: p.corrupt_isrs for n, p in plans.items() if p.corrupt_isrs}),
        tuple(lay for plan in plans.values() for lay in plan.layouts),
        tuple(r for plan in plans.values() for r in plan.retires),
        min(due, default=None),
        terms,
        term_round,
        tuple(sorted(deferred)),
    )


def _decision_size(zone: ZoneView) -> int:
    """What deciding ``zone`` counts against a pass's budget: its partitions (those it has, or
    those its config asks for), at least 1."""
    spec = zone.spec
    return max(1, len(zone.partitions), spec.partitions if isinstance(spec, ZoneSpec) else 0)


#: A time after every lease's end (a deferred zone's holders with no lease that can end).
_FOREVER = 2**63 - 1


def _deferred(
    view: ClusterView, zone: ZoneView, now_ms: int, live: Set[str], leases: bool
) -> tuple[tuple[Drive, ...], frozenset[str], int]:
    """What the plan of a zone a pass's budget defers (:func:`plan_pass`) carries — no write;
    its moves in flight still driven (a mover whose drive a pass leaves out exits); the
    holders of its standing leases, so their terms are renewed as before — and until when
    (ms) those holders stay the same on the same view: the earliest end of the leases they
    hold (an ended lease stays ended while the terms are the same)."""
    drives = (
        () if view.paused else tuple(d for s in zone.partitions.values() if (d := drive_action(s)))
    )
    if not leases or not isinstance(zone.spec, ZoneSpec):  # as plan_zone: no lease without
        return drives, frozenset(), _FOREVER
    kept = kept_partitions(zone.layout, zone.spec)
    stables = {
        p: peers
        for p, s in zone.partitions.items()
        if p < kept and (peers := s.peers(AssignField.STABLE)) is not None
    }
    holders = lease_holders(stables, zone.primaries, {}, live, now_ms, view.term_until)
    ends = (
        until
        for p in stables
        if (entry := zone.primaries.get(p)) is not None
        and isinstance(lease := entry.value, PrimaryLease)
        and lease.node in holders
        and (until := lease.until(view.term_until.get(lease.node, 0))) > now_ms
    )
    return drives, holders, min(ends, default=_FOREVER)


def stale_terms(view: ClusterView, now_ms: int, config: LeaseConfig) -> dict[str, int]:
    """Terms to delete (node -> mod_revision): of nodes not registered whose term ended more
    than a lease duration ago (or is corrupt), and that no lease of any zone names — so deleting
    one never changes when any lease ends."""
    gone = {
        n: t.mod_revision
        for n, t in view.terms.items()
        if n not in view.nodes
        and (not isinstance(t.value, LeaseTerm) or t.value.until + config.duration_ms <= now_ms)
    }
    if not gone:
        return {}
    for zone in view.zones.values():
        for lease in zone.primaries.values():
            if isinstance(lease.value, PrimaryLease):
                gone.pop(lease.value.node, None)
    return gone


# -- aggregating the agents' answers -----------------------------------------------------------


class Verdict(StrEnum):
    """What the answers of one send round allow."""

    #: Every member of new answered DONE: ``finish``.
    FINISH = "finish"
    #: Cancel: the group is back on old (some member CANCELLED, or the joining members had
    #: nothing to cancel): ``finish_cancel``.
    CANCEL_REVERTED = "cancel_reverted"
    #: Cancel: every joining member answered ALREADY_DONE: ``finish_cancel(already_done=True)``
    #: (a plain ``finish`` is refused while the cancel key exists — cancel wins in the store).
    CANCEL_ALREADY_DONE = "cancel_already_done"
    #: Not yet (ACCEPTED, FAILED, STALE, no answer): resend after a backoff.
    WAIT = "wait"


def aggregate(drive: Drive, answers: Mapping[str, str | None]) -> Verdict:
    """Decide from one round's answers: node -> outcome name, ``None`` = did not answer; a
    member with no node record (not registered: down) is absent from ``answers``.

    Rebalance: done only when every member of ``new`` answered DONE (leavers' answers do not
    matter: they keep their replicas until retired). Cancel: the registered *joining* members
    (new - old; all of new for a pure shrink) must all have answered (not CANCEL_STALE); then
    all ALREADY_DONE -> already done, anything else (CANCELLED, NOTHING_TO_CANCEL, mixed) ->
    reverted: the group stays on old, of which no member deleted anything.
    """
    if not drive.cancel:
        if all(answers.get(n) == "DONE" for n in drive.new):
            return Verdict.FINISH
        return Verdict.WAIT
    joining = [n for n in drive.new if n not in drive.old] or list(drive.new)
    got = [answers[n] for n in joining if n in answers]
    if any(a is None or a == "CANCEL_STALE" for a in got):
        return Verdict.WAIT
    if got and all(a == "ALREADY_DONE" for a in got):
        return Verdict.CANCEL_ALREADY_DONE
    return Verdict.CANCEL_REVERTED
