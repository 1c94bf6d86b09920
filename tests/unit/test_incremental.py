"""The incremental pass (placement.driver.incremental, PlanMemo): after any sequence of etcd
changes, the view rebuilt only where keys changed is the view decoded from the whole prefix, and a
pass that reuses the plans of untouched zones plans exactly what a pass deciding every zone does."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from placement.algo.place import place
from placement.core.layout import ZoneLayout
from placement.core.model import Node, Peers, ZoneSpec
from placement.driver.core import (
    ClusterView,
    PassPlan,
    PlanMemo,
    TargetsMemo,
    build_view,
    plan_pass,
    zone_outlook,
    zone_targets,
)
from placement.driver.gauges import GaugeMemo, fleet_gauges
from placement.driver.incremental import ViewBuilder, view_group
from placement.driver.leases import LeaseConfig
from placement.metastore.codec import (
    Assignment,
    ControlMark,
    DataNodes,
    InSyncSet,
    LayoutValue,
    LeaseTerm,
    MoveReport,
    NodeRecord,
    PrimaryLease,
    ReplicaSize,
    TriggerMark,
    encode_assignment,
    encode_control,
    encode_datanodes,
    encode_isr,
    encode_layout,
    encode_node,
    encode_primary,
    encode_report,
    encode_size,
    encode_term,
    encode_trigger,
    encode_zone_spec,
)
from placement.metastore.keys import AssignField, KeySpace
from placement.metastore.kv import KeyValue
from placement.metrics import GaugeFamily

KEYS = KeySpace("/t")
ZONES = ("z0", "z1")
NODES = ("n0", "n1", "n2")
JUNK = b"\xff not a value"


def _universe() -> list[tuple[bytes, tuple[bytes, ...]]]:
    """Every key the test may write, with the values it may take (valid ones and junk)."""
    out: list[tuple[bytes, tuple[bytes, ...]]] = []
    peers = (("n0", "n1"), ("n1", "n2"), ("n2", "n0"))
    assignments = tuple(encode_assignment(Assignment(p, 1, 1, 1)) for p in peers)
    for n in NODES:
        out.append((KEYS.node(n), (encode_node(NodeRecord(n, "127.0.0.1:1")), JUNK)))
        out.append((KEYS.drain(n), (encode_control(ControlMark(1, 1)),)))
        terms = tuple(encode_term(LeaseTerm(until)) for until in (500, 5000, 20_000))
        out.append((KEYS.term(n), (*terms, JUNK)))
    out.append((KEYS.paused(), (encode_control(ControlMark(1, 1)),)))
    out.append((KEYS.leader("d1"), (b"leader",)))
    for z in ZONES:
        out.append((KEYS.zone(z), (encode_zone_spec(ZoneSpec(z, 2, 2)), JUNK)))
        applied = DataNodes(NODES, NODES, None, None)
        out.append((KEYS.datanodes(z), (encode_datanodes(applied), JUNK)))
        out.append((KEYS.layout(z), (encode_layout(LayoutValue(ZoneLayout(1, 2), 1, 0)), JUNK)))
        for p in (0, 1):
            for f in (AssignField.STABLE, AssignField.PENDING, AssignField.PLANNED):
                out.append((KEYS.assign(z, p, f), (*assignments, JUNK)))
            out.append((KEYS.assign(z, p, AssignField.CANCEL), (JUNK,)))
            trigger = encode_trigger(TriggerMark(1, 1, 1))
            out.append((KEYS.assign(z, p, AssignField.TRIGGER), (trigger, JUNK)))
            leases = tuple(
                encode_primary(PrimaryLease(n, 1, expiry))
                for n in NODES
                for expiry in (0, 500, 5000)  # 0: no cap, it lasts with n's term
            )
            out.append((KEYS.primary(z, p), (*leases, JUNK)))
            isr = encode_isr(InSyncSet(("n0", "n1"), "n0", 1, 1))
            out.append((KEYS.isr(z, p), (isr, JUNK)))
            out.append((KEYS.reshard_report(z, p), (JUNK,)))
            for n in NODES[:2]:
                out.append((KEYS.size(z, p, n), (encode_size(ReplicaSize(1, 1, 1)), JUNK)))
                report = encode_report(MoveReport(7, 1, "DONE", "done", 1))
                out.append((KEYS.progress(z, p, n), (report, JUNK)))
    return out


UNIVERSE = _universe()


class Mirror:
    """What the leader's list-watch holds: keys, groups and stamps, changed batch by batch as
    the list-watch applies etcd's watch batches (placement.metastore.listwatch)."""

    def __init__(self) -> None:
        self.group = view_group(KEYS)
        self.kvs: dict[bytes, KeyValue] = {}
        self.groups: dict[str, dict[bytes, KeyValue]] = {}
        self.stamps: dict[str, int] = {}
        self.revision = 1
        self.batches = 0

    def put_all(self, puts: dict[bytes, bytes]) -> None:
        """One watch batch putting ``puts`` (keys of the universe or not)."""
        self.batches += 1
        for key, value in puts.items():
            self.revision += 1
            name = self.group(key)
            kv = KeyValue(key, value, self.revision, self.revision, 1, 0)
            self.kvs[key] = kv
            if name is not None:
                self.stamps[name] = self.batches
                self.groups.setdefault(name, {})[key] = kv

    def apply(self, changes: list[tuple[int, int | None]]) -> None:
        """One watch batch: (key index, value index, or None to delete) each."""
        self.batches += 1
        for key_index, value_index in changes:
            key, values = UNIVERSE[key_index % len(UNIVERSE)]
            name = self.group(key)
            self.revision += 1
            if name is not None:
                self.stamps[name] = self.batches
            if value_index is None:
                self.kvs.pop(key, None)
                if name is not None:
                    self.groups.get(name, {}).pop(key, None)
                continue
            old = self.kvs.get(key)
            kv = KeyValue(
                key,
                values[value_index % len(values)],
                old.create_revision if old else self.revision,
                self.revision,
                old.version + 1 if old else 1,
                0,
            )
            self.kvs[key] = kv
            if name is not None:
                self.groups.setdefault(name, {})[key] = kv


def _normalized(view: ClusterView) -> tuple[object, ...]:
    """The view with each partition's revision dropped (the incremental one carries the revision
    at which its zone last changed; the keys are the same at both)."""
    zones = {
        name: replace(
            zone, partitions={p: replace(s, revision=0) for p, s in zone.partitions.items()}
        )
        for name, zone in view.zones.items()
    }
    reports = {k: dict(v) for k, v in view.reports.items()}
    return (
        view.revision, zones, dict(view.nodes), view.paused, reports, view.draining,
        dict(view.terms), dict(view.term_until),
    )  # fmt: skip


changes = st.lists(
    st.tuples(st.integers(0, len(UNIVERSE) - 1), st.one_of(st.none(), st.integers(0, 20))),
    min_size=1,
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(changes, st.integers(0, 3000)), min_size=1, max_size=12))
def test_the_incremental_view_and_pass_equal_the_whole_ones(
    batches: list[tuple[list[tuple[int, int | None]], int]],
) -> None:
    mirror = Mirror()
    builder = ViewBuilder(KEYS)
    memo = PlanMemo()
    leases = LeaseConfig()
    now = 0
    for batch, elapsed in batches:
        mirror.apply(batch)
        now += elapsed
        view = builder.build(mirror.revision, mirror.groups, mirror.stamps)
        whole = build_view(KEYS, mirror.kvs, mirror.revision)
        assert _normalized(view) == _normalized(whole)
        # the pass on the incremental view, reusing plans, is the pass deciding every zone
        assert plan_pass(view, now, leases, memo) == plan_pass(whole, now, leases)
        # and again at the same view a little later (nothing changed: plans reused)
        assert plan_pass(view, now + 1, leases, memo) == plan_pass(whole, now + 1, leases)


def test_an_unchanged_zone_is_neither_decoded_nor_planned_again() -> None:
    mirror = Mirror()
    builder = ViewBuilder(KEYS)
    memo = PlanMemo()
    # zones with moves in flight and no config (their plans drive the moves and write nothing)
    moving = [
        i for i, (key, _) in enumerate(UNIVERSE) if b"/assign/" in key and b"cancel" not in key
    ]
    z0 = {i for i in moving if b"/z0/" in UNIVERSE[i][0]}
    z1 = {i for i in moving if b"/z1/" in UNIVERSE[i][0]}
    nodes = [i for i, (key, _) in enumerate(UNIVERSE) if b"/nodes/" in key]
    mirror.apply([(i, 0) for i in sorted(z0 | z1) + nodes])
    view = builder.build(mirror.revision, mirror.groups, mirror.stamps)
    first = plan_pass(view, 0, LeaseConfig(), memo)
    assert not first.writes
    assert len(first.drives) == 4
    decoded, decided = builder.decoded, memo.decided
    # a move report of z0 arrives: no zone is decoded or decided again
    report = next(i for i, (key, _) in enumerate(UNIVERSE) if b"/progress/z0/" in key)
    mirror.apply([(report, 0)])
    again = builder.build(mirror.revision, mirror.groups, mirror.stamps)
    assert again.zones["z0"] is view.zones["z0"]
    assert again.zones["z1"] is view.zones["z1"]
    assert again.reported("z0", 0, 7)
    assert builder.decoded == decoded + 1  # the reports' group only
    plan = plan_pass(again, 1, LeaseConfig(), memo)
    assert memo.decided == decided  # both zones' plans reused (they write nothing)
    assert plan == plan_pass(build_view(KEYS, mirror.kvs, mirror.revision), 1, LeaseConfig())
    # a key of z1 changes: z1 alone is decoded and decided again
    mirror.apply([(min(z1), 1)])
    third = builder.build(mirror.revision, mirror.groups, mirror.stamps)
    assert third.zones["z0"] is view.zones["z0"]
    assert third.zones["z1"] is not view.zones["z1"]
    plan_pass(third, 2, LeaseConfig(), memo)
    assert memo.decided == decided + 1


def settled_zone(term_until: int) -> tuple[Mirror, set[str]]:
    """A READY zone ``z`` of 4 × 2 on every node, each lease held by its preferred primary with
    no cap, the holders' terms lasting until ``term_until``: the mirror and the holders."""
    spec = ZoneSpec("z", 4, 2)
    mirror = Mirror()
    puts = {KEYS.node(n): encode_node(NodeRecord(n, "127.0.0.1:1")) for n in NODES}
    puts[KEYS.zone("z")] = encode_zone_spec(spec)
    puts[KEYS.layout("z")] = encode_layout(LayoutValue(ZoneLayout(1, 4), 1, 0))
    puts[KEYS.datanodes("z")] = encode_datanodes(DataNodes(NODES, NODES, None, None))
    holders: set[str] = set()
    for p, peers in enumerate(place(spec, [Node(n) for n in NODES]).assignments):
        puts[KEYS.assign("z", p, AssignField.STABLE)] = encode_assignment(
            Assignment(tuple(peers), 1, 1, 1)
        )
        puts[KEYS.assign("z", p, AssignField.TRIGGER)] = encode_trigger(TriggerMark(10**6, 1, 1))
        puts[KEYS.primary("z", p)] = encode_primary(PrimaryLease(peers[0], 1, 0))
        holders.add(peers[0])
    for n in holders:
        puts[KEYS.term(n)] = encode_term(LeaseTerm(term_until))
    mirror.put_all(puts)
    return mirror, holders


def test_a_reused_plan_expires_when_a_lease_falls_due() -> None:
    """A settled zone plans nothing while its leases last: the memo reuses its empty plan even
    when the holders' terms fall due (renewed by the pass, not by the zone's plan), and decides
    again from the time its leases end (the re-grants)."""
    mirror, holders = settled_zone(20_000)
    view = ViewBuilder(KEYS).build(mirror.revision, mirror.groups, mirror.stamps)
    assert view.term_until == dict.fromkeys(holders, 20_000)
    memo, leases = PlanMemo(), LeaseConfig()
    quiet = plan_pass(view, 0, leases, memo)
    assert not quiet.writes
    assert quiet.next_due_ms == 15_001  # the terms' renewal
    assert plan_pass(view, 15_000, leases, memo) == quiet
    assert (memo.decided, memo.reused) == (1, 1)
    renewal = plan_pass(view, 15_001, leases, memo)
    assert (memo.decided, memo.reused) == (1, 2)  # the zone's plan still holds
    assert renewal.terms is not None
    assert set(renewal.terms.writes) == holders
    assert not renewal.primaries  # no lease is written for it
    assert renewal == plan_pass(view, 15_001, leases)
    assert renewal.next_due_ms == 20_000  # the terms' end (the leases' too)
    # the terms were not renewed: the leases end at 20_000, and the zone is decided again
    assert plan_pass(view, 19_999, leases, memo).primaries == ()
    assert memo.decided == 1
    due = plan_pass(view, 20_000, leases, memo)
    assert memo.decided == 2
    assert due.primaries  # the re-grants, decided again at their due time
    assert due == plan_pass(view, 20_000, leases)


def test_a_round_of_term_renewals_decides_no_zone_again() -> None:
    """The terms are a group of their own: renewing them (written by the pass) leaves the
    nodes and every zone the same objects, decodes only the terms and reuses every zone's plan
    — a term only matters to a zone when it starts, ends or comes back, and then the zone is
    decided again."""
    mirror, holders = settled_zone(10_000)
    builder, memo, leases = ViewBuilder(KEYS), PlanMemo(), LeaseConfig()
    view = builder.build(mirror.revision, mirror.groups, mirror.stamps)
    assert not plan_pass(view, 0, leases, memo).writes
    decoded = builder.decoded
    renewal = plan_pass(view, 5_001, leases, memo)
    assert renewal.terms is not None
    assert set(renewal.terms.writes) == holders
    assert memo.decided == 1
    # the pass's term writes come back through the watch
    mirror.put_all({KEYS.term(n): encode_term(LeaseTerm(15_001)) for n in holders})
    after = builder.build(mirror.revision, mirror.groups, mirror.stamps)
    assert builder.decoded == decoded + 1  # the terms' group only
    assert after.nodes is view.nodes
    assert after.zones["z"] is view.zones["z"]
    assert after.term_until == dict.fromkeys(holders, 15_001)
    for now in (5_002, 9_999, 10_000, 10_001):  # past the old terms' end: nothing ended
        assert not plan_pass(after, now, leases, memo).writes
    again = plan_pass(after, 12_000, leases, memo)  # the next round: terms, no lease
    assert again.terms is not None
    assert again.primaries == ()
    assert memo.decided == 1
    # a term set back to a time passed (by hand, say): its leases have ended, the zone is
    # decided again
    gone = sorted(holders)[0]
    mirror.put_all({KEYS.term(gone): encode_term(LeaseTerm(1))})
    ended = builder.build(mirror.revision, mirror.groups, mirror.stamps)
    regrant = plan_pass(ended, 12_000, leases, memo)
    assert memo.decided == 2
    assert regrant == plan_pass(ended, 12_000, leases)
    assert regrant.primaries  # the leases of `gone` are granted again (a new epoch)


def test_a_zone_decided_again_at_its_targets_is_not_placed_again() -> None:
    """TargetsMemo: a zone decided again while its assignment still equals its last targets (its
    leases ended, say) reuses them — the plan is the one placing it again gives — and a zone
    whose placement inputs or assignment changed is placed again."""
    mirror, holders = settled_zone(20_000)
    builder, memo, leases = ViewBuilder(KEYS), PlanMemo(), LeaseConfig()
    view = builder.build(mirror.revision, mirror.groups, mirror.stamps)
    plan_pass(view, 0, leases, memo)
    assert memo.targets.reused == 0  # placed once, at its targets: held
    due = plan_pass(view, 20_000, leases, memo)  # the leases ended: re-decided, not re-placed
    assert due.primaries
    assert memo.targets.reused == 1
    assert due == plan_pass(view, 20_000, leases)
    # a node's weight changes: the zone's placement inputs differ, so it is placed again
    heavy = sorted(holders)[0]
    mirror.put_all({KEYS.node(heavy): encode_node(NodeRecord(heavy, "127.0.0.1:1", weight=3))})
    weighed = builder.build(mirror.revision, mirror.groups, mirror.stamps)
    moved = plan_pass(weighed, 20_000, leases, memo)
    assert memo.targets.reused == 1
    assert moved == plan_pass(weighed, 20_000, leases)
    # its targets now differ from its assignment (the weight moves replicas at the next trigger):
    # none are held, so it is placed again at every decision until the assignment follows
    plan_pass(weighed, 20_001, leases, memo)
    assert memo.targets.reused == 1


def test_targets_held_for_a_zone_are_not_reused_once_its_assignment_moved_off_them() -> None:
    """A move in flight to another balanced assignment (which placement keeps, being minimal)
    must not get the targets held from before it: they would move the partition back."""
    mirror, _ = settled_zone(20_000)
    view = ViewBuilder(KEYS).build(mirror.revision, mirror.groups, mirror.stamps)
    zone = view.zones["z"]
    assert isinstance(zone.spec, ZoneSpec)
    memo = TargetsMemo()
    held = zone_targets(zone, zone.spec, view.nodes, NODES, memo=memo)
    assert zone_targets(zone, zone.spec, view.nodes, NODES, memo=memo) == held
    assert memo.reused == 1
    stable = held[0]
    for peers in itertools.permutations(NODES, 2):
        mirror.put_all(
            {
                KEYS.assign("z", 0, AssignField.PENDING): encode_assignment(
                    Assignment(peers, 2, 2, 2)
                )
            }
        )
        moving = ViewBuilder(KEYS).build(mirror.revision, mirror.groups, mirror.stamps)
        fresh = zone_targets(moving.zones["z"], zone.spec, moving.nodes, NODES)
        assert not isinstance(fresh, str)
        if set(peers) != set(stable) and fresh[0] == peers:
            break
    else:
        raise AssertionError("no other balanced member set for partition 0")
    assert zone_targets(moving.zones["z"], zone.spec, moving.nodes, NODES, memo=memo) == fresh


def _state(mirror: Mirror) -> tuple[int, dict[str, dict[bytes, KeyValue]], dict[str, int]]:
    return mirror.revision, mirror.groups, mirror.stamps


def _creating(zones: int, partitions: int) -> Mirror:
    """``zones`` zones z0.. of ``partitions`` × 2 on every node, configs, layouts and data nodes
    written, no partition created yet."""
    mirror = Mirror()
    puts = {KEYS.node(n): encode_node(NodeRecord(n, "127.0.0.1:1")) for n in NODES}
    for z in range(zones):
        name = f"z{z}"
        puts[KEYS.zone(name)] = encode_zone_spec(ZoneSpec(name, partitions, 2))
        puts[KEYS.layout(name)] = encode_layout(LayoutValue(ZoneLayout(1, partitions), 1, 0))
        puts[KEYS.datanodes(name)] = encode_datanodes(DataNodes(NODES, NODES, None, None))
    mirror.put_all(puts)
    return mirror


def _land_creates(mirror: Mirror, plan: PassPlan) -> None:
    """The pass's partition creations, as its writes come back through the watch."""
    puts: dict[bytes, bytes] = {}
    for create in plan.creates:
        for p, peers in create.stables.items():
            puts[KEYS.assign(create.zone, p, AssignField.STABLE)] = encode_assignment(
                Assignment(tuple(peers), 1, 1, 1)
            )
            puts[KEYS.assign(create.zone, p, AssignField.TRIGGER)] = encode_trigger(
                TriggerMark(create.trigger_revision, 1, 1)
            )
    if puts:
        mirror.put_all(puts)


def test_a_budgeted_pass_defers_zones_and_decides_them_in_turn_as_one_pass_would() -> None:
    """A pass's budget bounds the partitions it decides; the zones left write nothing, make the
    pass due again at once, and are decided first by the next passes — which, each on a view
    holding the writes before it, create exactly what one pass deciding every zone creates
    (the same zone order, the same fleet tally). Leases aside (``leases=None``): a zone whose
    writes do not land is decided again, and so deferred again, for good."""
    whole = plan_pass(ViewBuilder(KEYS).build(*_state(_creating(6, 4))), 0, None, PlanMemo())
    assert len(whole.creates) == 6
    assert not whole.deferred
    mirror = _creating(6, 4)
    builder, memo = ViewBuilder(KEYS), PlanMemo()
    created: dict[str, Mapping[int, Peers]] = {}
    for _ in range(10):
        decided = memo.decided
        plan = plan_pass(builder.build(*_state(mirror)), 0, None, memo, budget=8)
        assert memo.decided - decided <= 2  # 4 partitions each: the second one crosses 8
        created.update((c.zone, c.stables) for c in plan.creates)
        assert not {c.zone for c in plan.creates} & set(plan.deferred)
        assert (plan.next_due_ms == 0) == bool(plan.deferred)  # due again at once
        _land_creates(mirror, plan)
        if not plan.deferred:
            break
    else:
        raise AssertionError("zones still deferred after 10 passes")
    assert created == {c.zone: c.stables for c in whole.creates}
    assert memo.cursor is None


def test_a_deferred_zone_keeps_its_moves_driven_and_its_holders_terms() -> None:
    """Deferred, a zone writes nothing, but its move in flight is still driven (a mover whose
    drive a pass leaves out would exit) and the holders of its leases count for the term
    round, as when it is decided."""
    mirror, holders = settled_zone(10_000)
    mirror.put_all(
        {
            KEYS.assign("z", 0, AssignField.PENDING): encode_assignment(
                Assignment(("n0", "n1"), 2, 2, 2)
            )
        }
    )
    for z in range(3):  # zones decided first (name order: "a…" before "z"), spending the budget
        name = f"a{z}"
        mirror.put_all(
            {
                KEYS.zone(name): encode_zone_spec(ZoneSpec(name, 4, 2)),
                KEYS.datanodes(name): encode_datanodes(DataNodes(NODES, NODES, None, None)),
            }
        )
    view = ViewBuilder(KEYS).build(*_state(mirror))
    leases = LeaseConfig()
    full = plan_pass(view, 5_001, leases)
    plan = plan_pass(view, 5_001, leases, PlanMemo(), budget=4)
    assert "z" in plan.deferred
    assert [d for d in plan.drives if d.zone == "z"] == [d for d in full.drives if d.zone == "z"]
    assert [d for d in plan.drives if d.zone == "z"]
    assert plan.terms is not None
    assert full.terms is not None
    assert holders <= set(plan.terms.writes) == set(full.terms.writes)
    assert not [w for w in plan.primaries if w.zone == "z"]


def test_a_deferred_zones_drives_and_holders_are_kept_until_a_lease_ends_or_its_view_moves() -> (
    None
):
    """A zone deferred pass after pass is not walked again while its view is the same: its
    drives and holders are kept — until a holder's lease ends (then it is no holder) or the
    zone's view changes (a new move to drive)."""
    mirror, holders = settled_zone(10_000)
    pending = encode_assignment(Assignment(("n0", "n1"), 2, 2, 2))
    mirror.put_all({KEYS.assign("z", 0, AssignField.PENDING): pending})
    builder, memo = ViewBuilder(KEYS), PlanMemo()
    view = builder.build(*_state(mirror))
    zone, live = view.zones["z"], set(view.nodes)
    silent: frozenset[str] = frozenset()  # one object: inputs are compared by identity
    first = memo.deferred(view, "z", zone, 5_001, silent, live, True)
    assert first.holders == holders
    assert [d.partition for d in first.drives] == [0]
    assert first.due == [5_001]
    kept = memo.deferred(view, "z", zone, 9_999, silent, live, True)
    assert (kept.holders, kept.drives, kept.due) == (holders, first.drives, [9_999])
    ended = memo.deferred(view, "z", zone, 10_000, silent, live, True)
    assert ended.holders == frozenset()  # every lease ended with its holder's term
    mirror.put_all({KEYS.assign("z", 1, AssignField.PENDING): pending})
    moved = builder.build(*_state(mirror))
    again = memo.deferred(moved, "z", moved.zones["z"], 5_002, silent, live, True)
    assert sorted(d.partition for d in again.drives) == [0, 1]
    assert again.holders == holders


def _samples(families: list[GaugeFamily]) -> dict[str, Mapping[tuple[str, ...], float]]:
    return {f.name: f.samples for f in families}


def test_the_gauges_keep_a_zones_counts_until_its_view_moves_or_a_counted_lease_ends() -> None:
    """A scrape counts what a fresh one would: a zone's replicas and leases are kept while its
    view is the same object, and counted again once a counted lease ended or the zone moved."""
    mirror, _ = settled_zone(10_000)
    builder, memo = ViewBuilder(KEYS), GaugeMemo()
    view = builder.build(*_state(mirror))
    for now in (5_000, 9_999, 10_000):
        kept = _samples(fleet_gauges(view, now, memo, {}))
        assert kept == _samples(fleet_gauges(view, now, GaugeMemo(), {}))
        leases = sum(kept["placement_node_primaries"].values())
        assert leases == (4 if now < 10_000 else 0)  # every lease ends with its holder's term
    assert sum(kept["placement_node_replicas"].values()) == 8
    before = kept["placement_node_replicas"]
    moved = encode_assignment(Assignment(("n2", "n1"), 2, 2, 2))  # partition 0: n0 → n2
    mirror.put_all({KEYS.assign("z", 0, AssignField.STABLE): moved})
    after = builder.build(*_state(mirror))
    counted = _samples(fleet_gauges(after, 10_000, memo, {"z": 1}))
    assert counted == _samples(fleet_gauges(after, 10_000, GaugeMemo(), {"z": 1}))
    assert counted["placement_node_replicas"][("n0",)] == before[("n0",)] - 1
    assert counted["placement_driver_moves_in_flight"] == {("z",): 1}
    # a node joins: the zone's status (its outlook, kept with the targets) is decided again
    mirror.put_all({KEYS.node("n3"): encode_node(NodeRecord("n3", "127.0.0.1:1"))})
    joined = builder.build(*_state(mirror))
    states = _samples(fleet_gauges(joined, 10_000, memo, {}))["placement_zone_state"]
    assert states == _samples(fleet_gauges(joined, 10_000, GaugeMemo(), {}))["placement_zone_state"]
    assert states[("z", "READY")] == 0.0
    assert counted["placement_zone_state"][("z", "READY")] == 1.0


def test_a_zones_outlook_is_kept_only_while_its_view_is_the_same() -> None:
    """The targets' part of a zone's outlook (off-target partitions, stuck moves) is kept with
    its placement while the zone, the nodes and the cordons are the same objects: the same
    answer as deciding it afresh, before and after two partitions are moved off balance."""
    mirror, _ = settled_zone(10_000)
    builder, memo = ViewBuilder(KEYS), TargetsMemo()
    view = builder.build(*_state(mirror))
    settled = zone_outlook(view, "z", 5_000, memo)
    assert settled == zone_outlook(view, "z", 5_000)
    assert settled is not None
    assert settled.off_target == ()
    assert zone_outlook(view, "z", 5_000, memo) == settled
    crowded = encode_assignment(Assignment(("n1", "n2"), 2, 2, 2))
    mirror.put_all({KEYS.assign("z", p, AssignField.STABLE): crowded for p in (0, 1)})
    moved = builder.build(*_state(mirror))
    off = zone_outlook(moved, "z", 5_000, memo)
    assert off == zone_outlook(moved, "z", 5_000)
    assert off is not None
    assert off.off_target  # n1 holds 4 of 8 replicas, n0 1: some partition must move


def test_a_budget_decides_every_zone_in_turn_even_while_the_first_keep_writing() -> None:
    """Zones whose writes have not landed yet are decided again at every pass; the budget still
    reaches every other zone within ⌈partitions / budget⌉ passes (the next pass starts after
    the last zone decided)."""
    builder, memo = ViewBuilder(KEYS), PlanMemo()
    view = builder.build(*_state(_creating(6, 4)))
    seen: set[str] = set()
    for _ in range(3):
        plan = plan_pass(view, 0, LeaseConfig(), memo, budget=8)
        seen |= {c.zone for c in plan.creates}
    assert seen == {f"z{z}" for z in range(6)}
