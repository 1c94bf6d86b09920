"""The driver's pure decisions: view building, the pass plan, answer aggregation, primary leases."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from placement.algo.fleet import FleetTally
from placement.algo.place import place
from placement.core.layout import Reshard, ReshardPhase, Step, ZoneLayout
from placement.core.model import Node, ZoneSpec
from placement.driver.core import (
    ClusterView,
    DecodeCache,
    Drive,
    Verdict,
    aggregate,
    build_view,
    plan_pass,
    view_zone_status,
)
from placement.driver.leases import LeaseConfig, lease_holders, plan_primaries, plan_terms
from placement.metastore.codec import (
    Assignment,
    CancelIntent,
    ControlMark,
    Corrupt,
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
    encode_cancel,
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
from placement.metastore.transitions import LeaseWrite, TermWrite, Versioned

KEYS = KeySpace("/t")
NODES = ("n0", "n1", "n2", "n3")


class Store:
    """A fake *snapshot* (a dict of KeyValues with revisions), not a fake etcd."""

    def __init__(self) -> None:
        self.kvs: dict[bytes, KeyValue] = {}
        self.revision = 1

    def put(self, key: bytes, value: bytes) -> int:
        self.revision += 1
        old = self.kvs.get(key)
        self.kvs[key] = KeyValue(
            key,
            value,
            old.create_revision if old else self.revision,
            self.revision,
            (old.version + 1) if old else 1,
            0,
        )
        return self.revision

    def view(self) -> ClusterView:
        return build_view(KEYS, self.kvs, self.revision)


def cluster(spec: ZoneSpec, *, datanodes: bool = True, layout: bool = True) -> Store:
    store = Store()
    for n in NODES:
        store.put(KEYS.node(n), encode_node(NodeRecord(n, f"127.0.0.1:{n[1:]}")))
    created = store.put(KEYS.zone(spec.name), encode_zone_spec(spec))
    if layout:
        value = LayoutValue(ZoneLayout(created, spec.partitions), 1, 0)
        store.put(KEYS.layout(spec.name), encode_layout(value))
    if datanodes:
        store.put(KEYS.datanodes(spec.name), encode_datanodes(DataNodes(NODES, NODES, None, None)))
    return store


def test_a_zone_without_a_layout_gets_its_first_generation_from_its_create_revision() -> None:
    store = cluster(ZoneSpec("z", 4, 2), layout=False)
    view = store.view()
    created = view.zones["z"].zone_created
    (write,) = plan_pass(view, now_ms=0).layouts
    assert write.step is Step.INIT
    assert write.layout == ZoneLayout(created, 4)
    assert (write.expected_layout_mod, write.expected_zone_mod) == (0, view.zones["z"].zone_mod)
    store.put(KEYS.layout("z"), encode_layout(LayoutValue(write.layout, 1, 0)))
    assert not plan_pass(store.view(), now_ms=0).layouts
    store.put(KEYS.layout("z"), b"garbage")  # corrupt: left alone, not overwritten
    assert not plan_pass(store.view(), now_ms=0).layouts


def test_a_dropped_zone_with_only_a_layout_left_is_cleaned_up() -> None:
    store = Store()
    store.put(KEYS.layout("gone"), encode_layout(LayoutValue(ZoneLayout(3, 4), 1, 0)))
    plan = plan_pass(store.view(), now_ms=0)
    assert [d.zone for d in plan.drops] == ["gone"]
    assert not plan.layouts


def test_a_new_zone_first_gets_its_data_nodes_written_and_nothing_else() -> None:
    plan = plan_pass(cluster(ZoneSpec("z", 4, 2), datanodes=False).view(), now_ms=0)
    assert [w.zone for w in plan.datanodes] == ["z"]
    assert plan.datanodes[0].record.applied == NODES
    assert plan.datanodes[0].expected_mod == 0
    assert not plan.creates
    assert not plan.triggers


def test_an_empty_zone_is_created_directly_with_the_placement_target() -> None:
    spec = ZoneSpec("z", 6, 2)
    store = cluster(spec)
    plan = plan_pass(store.view(), now_ms=0)
    (create,) = plan.creates
    target = place(spec, [Node(n) for n in NODES])
    assert dict(create.stables) == dict(enumerate(target.assignments))
    assert create.trigger_revision == store.revision  # max(zone mod, datanodes mod)
    assert not plan.triggers
    assert not plan.drives


def write_stables(store: Store, spec: ZoneSpec) -> None:
    for p, peers in enumerate(place(spec, [Node(n) for n in NODES]).assignments):
        store.put(
            KEYS.assign(spec.name, p, AssignField.STABLE),
            encode_assignment(Assignment(peers, 1, 0, 2)),
        )
        store.put(
            KEYS.assign(spec.name, p, AssignField.TRIGGER), encode_trigger(TriggerMark(2, 1, 0))
        )


def test_a_held_down_node_keeps_its_replicas_in_a_zone_with_a_node_selector() -> None:
    """A data node whose agent went away is held down by the scale-down delay: placement keeps
    placing on it although its record (and so its attributes) is gone — it matched the zone's
    selector when it was applied."""
    spec = ZoneSpec("z", 6, 2, node_selector={"rack": "a"}, scale_down_delay=60)
    store = Store()
    for n in NODES:
        store.put(KEYS.node(n), encode_node(NodeRecord(n, "127.0.0.1:1", {"rack": "a"})))
    created = store.put(KEYS.zone("z"), encode_zone_spec(spec))
    store.put(KEYS.layout("z"), encode_layout(LayoutValue(ZoneLayout(created, 6), 1, 0)))
    down = DataNodes(NODES, NODES[:-1], None, 1_000)  # the last node went away at 1 s
    store.put(KEYS.datanodes("z"), encode_datanodes(down))
    nodes = [Node(n, {"rack": "a"}) for n in NODES]
    for p, peers in enumerate(place(spec, nodes).assignments):
        stable = encode_assignment(Assignment(peers, 1, 0, 2))
        store.put(KEYS.assign("z", p, AssignField.STABLE), stable)
        store.put(KEYS.assign("z", p, AssignField.TRIGGER), encode_trigger(TriggerMark(2, 1, 0)))
    del store.kvs[KEYS.node(NODES[-1])]
    plan = plan_pass(store.view(), now_ms=2_000)
    assert not plan.datanodes
    assert not plan.triggers  # the replicas on the held-down node stay where they are
    assert plan.next_due_ms is not None


def test_nothing_is_written_when_the_target_equals_stable() -> None:
    spec = ZoneSpec("z", 6, 2)
    store = cluster(spec)
    write_stables(store, spec)
    plan = plan_pass(store.view(), now_ms=0)
    assert not plan.writes or plan.primaries
    assert not plan.triggers
    assert not plan.creates


def test_a_replica_count_change_triggers_every_partition_with_minimal_moves() -> None:
    spec = ZoneSpec("z", 6, 2)
    store = cluster(spec)
    write_stables(store, spec)
    store.put(KEYS.zone("z"), encode_zone_spec(ZoneSpec("z", 6, 3)))
    plan = plan_pass(store.view(), now_ms=0)
    (trig,) = plan.triggers
    assert sorted(trig.targets) == list(range(6))
    assert trig.trigger_revision == store.revision
    view = store.view()
    for p, target in trig.targets.items():
        stable = view.zones["z"].partitions[p].peers(AssignField.STABLE)
        assert stable is not None
        assert set(stable) < set(target)  # R -> R+1 adds exactly one copy per partition


def test_pending_is_driven_and_a_cancel_switches_the_drive_and_pause_stops_both() -> None:
    spec = ZoneSpec("z", 2, 2)
    store = cluster(spec)
    write_stables(store, spec)
    stable = store.view().zones["z"].partitions[0].peers(AssignField.STABLE)
    assert stable is not None
    new = (*stable, next(n for n in NODES if n not in stable))
    rev = store.put(
        KEYS.assign("z", 0, AssignField.PENDING), encode_assignment(Assignment(new, 1, 0, 9))
    )
    (drive,) = plan_pass(store.view(), now_ms=0).drives
    assert drive == Drive("z", 0, stable, new, rev)
    store.put(
        KEYS.assign("z", 0, AssignField.CANCEL), encode_cancel(CancelIntent(stable, new, rev, 1, 0))
    )
    (cancel,) = plan_pass(store.view(), now_ms=0).drives
    assert cancel == Drive("z", 0, stable, new, rev, cancel=True)
    store.put(KEYS.paused(), encode_control(ControlMark(1, 0)))
    assert store.view().paused
    assert plan_pass(store.view(), now_ms=0).drives == ()


def test_a_cancel_of_another_revision_is_not_driven() -> None:
    spec = ZoneSpec("z", 1, 2)
    store = cluster(spec)
    write_stables(store, spec)
    rev = store.put(
        KEYS.assign("z", 0, AssignField.PENDING), encode_assignment(Assignment(NODES[:3], 1, 0, 9))
    )
    store.put(
        KEYS.assign("z", 0, AssignField.CANCEL),
        encode_cancel(CancelIntent((), (), rev + 100, 1, 0)),
    )
    assert plan_pass(store.view(), now_ms=0).drives == ()


def test_corrupt_values_never_raise() -> None:
    spec = ZoneSpec("z", 1, 2)
    store = cluster(spec)
    store.put(KEYS.assign("z", 0, AssignField.PENDING), b"\xff garbage")
    store.put(KEYS.zone("y"), b"{}")
    plan = plan_pass(store.view(), now_ms=0)
    assert plan.skipped.get("y") == "zone config corrupt"
    assert plan.drives == ()


def test_aggregate_rebalance_needs_done_from_every_member_of_new() -> None:
    d = Drive("z", 0, ("a", "b"), ("a", "b", "c"), 7)
    assert aggregate(d, {"a": "DONE", "b": "DONE", "c": "DONE"}) is Verdict.FINISH
    assert aggregate(d, {"a": "DONE", "b": "DONE", "c": "ACCEPTED"}) is Verdict.WAIT
    assert aggregate(d, {"a": "DONE", "b": "DONE", "c": None}) is Verdict.WAIT
    assert aggregate(d, {"a": "DONE", "b": "DONE"}) is Verdict.WAIT  # c unregistered
    leave = Drive("z", 0, ("a", "b", "c"), ("a", "b"), 7)
    assert aggregate(leave, {"a": "DONE", "b": "DONE", "c": None}) is Verdict.FINISH


def test_aggregate_cancel_outcomes() -> None:
    d = Drive("z", 0, ("a", "b"), ("a", "b", "c"), 7, cancel=True)
    assert aggregate(d, {"a": "NOTHING_TO_CANCEL", "c": "CANCELLED"}) is Verdict.CANCEL_REVERTED
    assert aggregate(d, {"a": "ALREADY_DONE", "c": "ALREADY_DONE"}) is Verdict.CANCEL_ALREADY_DONE
    assert aggregate(d, {"a": "ALREADY_DONE", "c": "NOTHING_TO_CANCEL"}) is Verdict.CANCEL_REVERTED
    assert aggregate(d, {"a": "ALREADY_DONE", "c": None}) is Verdict.WAIT
    assert aggregate(d, {"a": "ALREADY_DONE", "c": "CANCEL_STALE"}) is Verdict.WAIT
    assert aggregate(d, {"a": "ALREADY_DONE"}) is Verdict.CANCEL_REVERTED  # joiner gone


def lease(
    node: str, epoch: int, expiry: int = 0, mod: int = 5, ts: int = 0
) -> Versioned[PrimaryLease]:
    """A lease as read, written at ``ts``; ``expiry`` 0: no cap (it lasts with its holder's
    term)."""
    value = PrimaryLease(node, epoch, expiry, 0, ts)
    return Versioned(value, b"", mod, mod)


def test_primary_leases_are_balanced_and_prefer_the_first_member() -> None:
    nodes = [Node(f"n{i}") for i in range(5)]
    result = place(ZoneSpec("z", 50, 3), nodes)
    stables = dict(enumerate(result.assignments))
    grants = plan_primaries(stables, {}, {n.name for n in nodes}, 0, LeaseConfig(10_000, 5_000))
    assert sorted(grants) == list(range(50))
    counts = Counter(w.lease.node for w in grants.values())
    assert max(counts.values()) - min(counts.values()) <= 1, counts
    assert all(w.lease.node == stables[p][0] for p, w in grants.items())
    assert all(w.lease.lease_epoch == 1 and w.expected_mod == 0 for w in grants.values())
    assert all(w.isr_mod == 0 for w in grants.values())  # no ISR key: compared as absent


def test_a_kept_primary_lease_is_not_written_and_moves_when_the_holder_leaves() -> None:
    stables = {0: ("a", "b"), 1: ("b", "a")}
    current = {0: lease("a", 3), 1: lease("b", 1, mod=9)}
    terms = {"a": 20_000, "b": 11_000}
    cfg = LeaseConfig(10_000, 5_000)
    live = {"a", "b"}
    for now in (0, 7_000):  # at 7_000 b's term is due: the term is renewed, not the lease
        writes = plan_primaries(stables, current, live, now, cfg, terms=terms)
        assert writes == {}
        assert lease_holders(stables, current, writes, live, now, terms) == {"a", "b"}
    # b's node record is gone: its lease moves only once its term has ended (b's own clock)
    assert 1 not in plan_primaries(stables, current, {"a"}, 7_000, cfg, terms=terms)
    assert lease_holders(stables, current, {}, {"a"}, 7_000, terms) == {"a"}
    moved = plan_primaries(stables, current, {"a"}, 11_000, cfg, terms=terms)
    assert moved[1] == LeaseWrite(PrimaryLease("a", 2, 0), 9, 0)
    # the holder left stable: moved at once
    left = plan_primaries({0: ("b", "c")}, current, {"a", "b", "c"}, 0, cfg, terms=terms)
    assert left[0] == LeaseWrite(PrimaryLease("b", 4, 0), 5, 0)
    ended = plan_primaries({0: ("a", "b")}, current, live, 25_000, cfg, terms=terms)
    assert ended[0].lease.lease_epoch == 4


def test_primary_leases_follow_the_preferred_primaries_after_a_join() -> None:
    cfg = LeaseConfig(10_000, 5_000)
    before = [Node(f"n{i}") for i in range(4)]
    first = place(ZoneSpec("z", 40, 3), before).assignments
    live = {n.name for n in before}
    grants = plan_primaries(dict(enumerate(first)), {}, live, 0, cfg)
    current = {  # written at 0
        p: lease(w.lease.node, w.lease.lease_epoch, w.lease.expiry) for p, w in grants.items()
    }
    terms = dict.fromkeys(live, 10_000)
    after = [*before, Node("n4")]
    stables = dict(
        enumerate(place(ZoneSpec("z", 40, 3), after, dict(enumerate(first))).assignments)
    )
    live.add("n4")
    # written less than a period (duration - renew_before) ago: nothing moves early
    assert plan_primaries(stables, current, live, 1_000, cfg, terms=terms) == {}
    assert plan_primaries(stables, current, live, 4_999, cfg, terms=terms) == {}
    due = plan_primaries(stables, current, live, 5_000, cfg, terms=terms)
    assert due
    holders = {p: (due[p].lease if p in due else current[p].value) for p in stables}
    counts = Counter(h.node for h in holders.values() if isinstance(h, PrimaryLease))
    assert set(counts) == live
    assert max(counts.values()) - min(counts.values()) <= 1, counts
    for p, write in due.items():  # hand-overs only
        grant = write.lease
        old = current[p].value
        assert isinstance(old, PrimaryLease)
        assert grant.node == stables[p][0] != old.node
        assert grant.lease_epoch == old.lease_epoch + 1
        assert grant.expiry == 0
    # the new holder n4 needs a term: written with the hand-overs (aligned: the others' too)
    needed = lease_holders(stables, current, due, live, 5_000, terms)
    assert needed == live
    read: dict[str, Versioned[LeaseTerm | Corrupt]] = {
        n: Versioned(LeaseTerm(u), b"", 7, 7) for n, u in terms.items()
    }
    renew = plan_terms(read, needed, live, 5_000, cfg)
    assert renew["n4"] == TermWrite(LeaseTerm(15_000), 0)
    assert renew["n0"] == TermWrite(LeaseTerm(15_000), 7)


def _value(peers: tuple[str, ...]) -> bytes:
    return encode_assignment(Assignment(peers, 1, 0, 2))


def test_a_decode_cache_gives_the_same_view_and_sees_every_change() -> None:
    spec = ZoneSpec("z", 6, 2)
    store = cluster(spec)
    for p in range(6):
        peers = (NODES[p % 3], NODES[(p + 1) % 3])
        store.put(
            KEYS.assign("z", p, AssignField.STABLE), encode_assignment(Assignment(peers, 1, 0, 2))
        )
    cache = DecodeCache()
    assert build_view(KEYS, store.kvs, store.revision, cache) == store.view()
    # rewrite one stable, add a pending, corrupt another key: the cached view follows each change
    store.put(
        KEYS.assign("z", 0, AssignField.STABLE), encode_assignment(Assignment(NODES[1:3], 1, 0, 3))
    )
    store.put(
        KEYS.assign("z", 1, AssignField.PENDING), encode_assignment(Assignment(NODES[:2], 1, 0, 3))
    )
    store.put(KEYS.assign("z", 2, AssignField.STABLE), b"not json")
    cached = build_view(KEYS, store.kvs, store.revision, cache)
    assert cached == store.view()
    assert cached.zones["z"].partitions[0].peers(AssignField.STABLE) == NODES[1:3]
    assert cached.zones["z"].partitions[2].peers(AssignField.STABLE) is None
    del store.kvs[KEYS.assign("z", 1, AssignField.PENDING)]
    assert build_view(KEYS, store.kvs, store.revision, cache) == store.view()


def test_a_dropped_zone_has_its_leftovers_deleted() -> None:
    store = Store()
    store.put(KEYS.datanodes("gone"), encode_datanodes(DataNodes(NODES, NODES, None, None)))
    plan = plan_pass(store.view(), now_ms=0)
    assert [d.zone for d in plan.drops] == ["gone"]
    assert plan.writes


def test_a_move_waiting_for_a_joining_node_that_left_is_cancelled_once_planned_exists() -> None:
    spec = ZoneSpec("z", 1, 2)
    store = cluster(spec)
    write_stables(store, spec)
    stable = store.view().zones["z"].partitions[0].peers(AssignField.STABLE)
    assert stable is not None
    ghost = ("ghost", *stable)
    rev = store.put(
        KEYS.assign("z", 0, AssignField.PENDING), encode_assignment(Assignment(ghost, 1, 0, 9))
    )
    assert plan_pass(store.view(), now_ms=0).cancels == ()  # no planned yet: keep waiting
    store.put(
        KEYS.assign("z", 0, AssignField.PLANNED), encode_assignment(Assignment(stable, 1, 0, 10))
    )
    (cancel,) = plan_pass(store.view(), now_ms=0).cancels
    assert (cancel.zone, cancel.partition, cancel.revision) == ("z", 0, rev)


def test_move_reports_are_in_the_view_by_partition_and_node() -> None:
    spec = ZoneSpec("z", 2, 2)
    store = cluster(spec)
    store.put(KEYS.progress("z", 0, "n0"), encode_report(MoveReport(7, 1, "DONE", "", 5)))
    store.put(KEYS.progress("z", 0, "n1"), encode_report(MoveReport(6, 1, "FAILED", "x", 5)))
    store.put(KEYS.progress("z", 1, "n2"), b"not json")  # corrupt: left out, never raises
    cache = DecodeCache()
    view = build_view(KEYS, store.kvs, store.revision, cache)
    assert view == store.view()
    assert view.reports[("z", 0)]["n0"] == MoveReport(7, 1, "DONE", "", 5)
    assert ("z", 1) not in view.reports
    assert dict(view.reported("z", 0, 7)) == {"n0": MoveReport(7, 1, "DONE", "", 5)}
    assert dict(view.reported("z", 0, 6)) == {"n1": MoveReport(6, 1, "FAILED", "x", 5)}
    assert not view.reported("z", 0, 8)
    assert not view.reported("z", 1, 7)
    # reports are not placement state: no zone appears for them, nothing is planned from them
    assert set(view.zones) == {"z"}
    # the cache sees a rewrite (same key, new mod_revision) and a deletion
    store.put(KEYS.progress("z", 0, "n0"), encode_report(MoveReport(8, 1, "DONE", "", 6)))
    del store.kvs[KEYS.progress("z", 0, "n1")]
    view = build_view(KEYS, store.kvs, store.revision, cache)
    assert view == store.view()
    assert dict(view.reported("z", 0, 8)) == {"n0": MoveReport(8, 1, "DONE", "", 6)}
    assert not view.reported("z", 0, 6)


def test_isr_keys_are_in_the_view_and_steer_the_lease_grants() -> None:
    spec = ZoneSpec("z", 3, 2)
    store = cluster(spec)
    write_stables(store, spec)
    stables = {
        p: s.peers(AssignField.STABLE) for p, s in store.view().zones["z"].partitions.items()
    }
    # partition 0: only the second member is in sync; 1: no ISR key; 2: corrupt ISR
    second = stables[0][1]  # type: ignore[index]
    isr_rev = store.put(KEYS.isr("z", 0), encode_isr(InSyncSet((second,), second, 1, 0)))
    store.put(KEYS.isr("z", 2), b"not json")
    store.put(KEYS.size("z", 0, "n0"), encode_size(ReplicaSize(10, 1, 0)))
    cache = DecodeCache()
    view = build_view(KEYS, store.kvs, store.revision, cache)
    assert view == store.view()
    isrs = view.zones["z"].isrs
    assert isrs[0].value == InSyncSet((second,), second, 1, 0)
    assert isrs[0].mod_revision == isr_rev
    assert 1 not in isrs
    assert isinstance(isrs[2].value, Corrupt)
    plan = plan_pass(view, now_ms=0, leases=LeaseConfig())
    (write,) = plan.primaries
    assert set(write.leases) == {0, 1}  # the corrupt ISR names nobody to grant to
    assert write.leases[0].lease.node == second
    assert write.leases[0].isr_mod == isr_rev
    assert write.leases[1].lease.node == stables[1][0]  # type: ignore[index]
    assert write.leases[1].isr_mod == 0
    assert dict(plan.corrupt_isrs) == {"z": (2,)}


def test_a_dropped_zone_with_only_isr_or_size_keys_left_is_cleaned_up() -> None:
    store = Store()
    store.put(KEYS.isr("gone", 0), encode_isr(InSyncSet(("n0",), "n0", 1, 0)))
    store.put(KEYS.size("sized", 3, "n1"), encode_size(ReplicaSize(1, 1, 0)))
    plan = plan_pass(store.view(), now_ms=0)
    assert sorted(d.zone for d in plan.drops) == ["gone", "sized"]


def _pending_move(old: tuple[str, ...], new: tuple[str, ...], *, planned: bool) -> Store:
    spec = ZoneSpec("z", 1, 3)
    store = cluster(spec)
    store.put(KEYS.assign("z", 0, AssignField.STABLE), encode_assignment(Assignment(old, 1, 0, 2)))
    store.put(KEYS.assign("z", 0, AssignField.PENDING), encode_assignment(Assignment(new, 1, 0, 3)))
    if planned:
        store.put(
            KEYS.assign("z", 0, AssignField.PLANNED), encode_assignment(Assignment(old, 1, 0, 4))
        )
    return store


def test_a_move_whose_staying_or_joining_member_left_is_abandoned_once_planned_exists() -> None:
    from placement.driver.core import abandoned_moves

    # n1 stays in the move n0,n1,n2 -> n0,n1,n3 but left the data nodes: it can never say DONE.
    store = _pending_move(("n0", "n1", "n2"), ("n0", "n1", "n3"), planned=True)
    zone = store.view().zones["z"]
    (cancel,) = abandoned_moves(zone, ("n0", "n2", "n3"))
    assert cancel.partition == 0
    (cancel,) = abandoned_moves(zone, ("n0", "n1", "n2"))  # the joining n3 left
    assert cancel.partition == 0
    assert abandoned_moves(zone, ("n0", "n2", "n1", "n3")) == []  # everyone still there
    assert abandoned_moves(zone, ("n0", "n1", "n3")) == []  # the leaving n2 is not needed
    no_plan = _pending_move(("n0", "n1", "n2"), ("n0", "n1", "n3"), planned=False).view()
    assert abandoned_moves(no_plan.zones["z"], ("n0", "n2", "n3")) == []  # nothing to move on to


def test_the_plan_says_when_a_pass_is_next_needed_without_a_change() -> None:
    spec = ZoneSpec("z", 2, 2, scale_up_delay=30.0)
    store = cluster(spec)
    write_stables(store, spec)
    cfg = LeaseConfig(10_000, 5_000)
    # no lease yet: granted now, with terms for their holders; nothing time-driven left
    plan = plan_pass(store.view(), now_ms=1_000, leases=cfg)
    assert plan.primaries
    assert plan.terms is not None
    holders = {w.lease.node for w in plan.primaries[0].leases.values()}
    assert dict(plan.terms.writes) == {n: TermWrite(LeaseTerm(11_000), 0) for n in holders}
    assert plan.next_due_ms is None
    for p, write in plan.primaries[0].leases.items():
        store.put(KEYS.primary("z", p), encode_primary(replace(write.lease, ts=1_000)))
    for n, term in plan.terms.writes.items():
        store.put(KEYS.term(n), encode_term(term.term))
    # held leases (each by its preferred primary): next due when less than renew_before is
    # left of the holders' terms (until 11_000)
    plan = plan_pass(store.view(), now_ms=1_500, leases=cfg)
    assert not plan.writes
    assert plan.next_due_ms == 6_001
    assert not plan_pass(store.view(), now_ms=6_000, leases=cfg).writes
    renewal = plan_pass(store.view(), now_ms=6_001, leases=cfg)
    assert not renewal.primaries  # the terms are renewed, not the leases
    assert renewal.terms is not None
    assert set(renewal.terms.writes) == holders
    # a held-down addition is due at up_since + scale_up_delay, after the terms here
    held = DataNodes(NODES, (*NODES, "n4"), up_since=1_000, down_since=None)
    store.put(KEYS.node("n4"), encode_node(NodeRecord("n4", "127.0.0.1:4")))
    store.put(KEYS.datanodes("z"), encode_datanodes(held))
    plan = plan_pass(store.view(), now_ms=1_500, leases=cfg)
    assert not plan.datanodes
    assert plan.next_due_ms == 6_001
    # the terms ran out (not renewed): the leases re-granted now, only the holddown is ahead
    plan = plan_pass(store.view(), now_ms=12_000, leases=cfg)
    assert plan.primaries
    assert all(w.lease.lease_epoch == 2 for w in plan.primaries[0].leases.values())
    assert plan.terms is not None
    assert not plan.datanodes
    assert plan.next_due_ms == 31_000


def test_a_pass_renews_the_holders_terms_not_the_leases_and_drops_stale_unnamed_terms() -> None:
    spec = ZoneSpec("z", 2, 2)
    store = cluster(spec)
    write_stables(store, spec)
    stables = {
        p: s.peers(AssignField.STABLE) for p, s in store.view().zones["z"].partitions.items()
    }
    holders = {peers[0] for peers in stables.values() if peers is not None}
    assert len(holders) == 2, stables  # two registered nodes hold nothing
    idle, other = sorted(set(NODES) - holders)
    for p, peers in stables.items():
        assert peers is not None
        store.put(KEYS.primary("z", p), encode_primary(PrimaryLease(peers[0], 1, 0, 1, 20_000)))
    mods = {n: store.put(KEYS.term(n), encode_term(LeaseTerm(31_000, 1, 20_000))) for n in holders}
    store.put(KEYS.term(idle), encode_term(LeaseTerm(1_000)))  # registered, holds nothing
    store.put(KEYS.term(other), b"not json")  # registered, corrupt, holds none
    gone = store.put(KEYS.term("gone"), encode_term(LeaseTerm(16_500)))  # ended a duration ago
    store.put(KEYS.term("lately"), encode_term(LeaseTerm(16_501)))  # ended less long ago
    junk = store.put(KEYS.term("junk"), b"not json")  # unregistered and corrupt
    view = store.view()
    assert view.term_until == {**dict.fromkeys(holders, 31_000), idle: 1_000, "gone": 16_500,
                               "lately": 16_501}  # fmt: skip
    assert isinstance(view.terms[other].value, Corrupt)
    cfg = LeaseConfig(10_000, 5_000)
    # 4_500 left of the holders' terms: due; the leases themselves are not written
    plan = plan_pass(view, now_ms=26_500, leases=cfg)
    assert not plan.primaries
    assert plan.terms is not None
    assert dict(plan.terms.writes) == {n: TermWrite(LeaseTerm(36_500), mods[n]) for n in holders}
    assert dict(plan.terms.drops) == {"gone": gone, "junk": junk}
    assert plan.writes
    # the next round (the holders' renewal at 31_000 - 5_000 + 1): when the leader health-checks
    # them ahead of it, off the pass — this pass's round is under way, so the one after
    early = plan_pass(view, now_ms=20_000, leases=cfg)
    assert early.terms is not None
    assert not early.terms.writes  # (the junk term is dropped at any time)
    assert early.term_round == (26_001, frozenset(holders))
    assert plan.term_round is None  # at 26_500 the round is this pass's writes
    later = plan_pass(view, now_ms=26_501, leases=cfg).terms
    assert later is not None
    assert set(later.drops) == {"gone", "junk", "lately"}
    # a silent holder's term is not renewed (its leases run out)
    silent = min(holders)
    quiet = plan_pass(view, now_ms=26_500, leases=cfg, silent=frozenset({silent}))
    assert quiet.terms is not None
    assert set(quiet.terms.writes) == holders - {silent}
    # a lease still naming a gone node (a dropped zone's leftover) keeps its term
    store.put(KEYS.primary("old", 0), encode_primary(PrimaryLease("gone", 1, 0)))
    named = plan_pass(store.view(), now_ms=26_500, leases=cfg)
    assert [d.zone for d in named.drops] == ["old"]
    assert named.terms is not None
    assert dict(named.terms.drops) == {"junk": junk}
    del store.kvs[KEYS.primary("old", 0)]
    # nothing due and nothing stale: no terms to write, nothing written
    del store.kvs[KEYS.term("gone")]
    del store.kvs[KEYS.term("junk")]
    calm = plan_pass(store.view(), now_ms=22_000, leases=cfg)
    assert calm.terms is None
    assert not calm.writes
    assert calm.next_due_ms == 26_001


def test_a_shrinks_removed_partitions_that_lost_a_member_are_re_placed_the_others_stay() -> None:
    """A shrink 6 → 2 in COPY: partitions 2..5 are removed but hold keys until the clean-up.
    n3 is no longer a data node: the removed partitions it held get a replacement for n3 only,
    the removed ones without n3 are left alone, and with no reshard running nothing beyond the
    zone's count is touched."""
    old = ZoneSpec("z", 6, 2)
    store = cluster(ZoneSpec("z", 2, 2), datanodes=False, layout=False)
    created = store.view().zones["z"].zone_created
    shrink = ZoneLayout(created, 6, Reshard(created, 6, 2, ReshardPhase.COPY))
    store.put(KEYS.layout("z"), encode_layout(LayoutValue(shrink, 1, 0)))
    live = tuple(n for n in NODES if n != "n3")
    store.put(KEYS.datanodes("z"), encode_datanodes(DataNodes(live, live, None, None)))
    del store.kvs[KEYS.node("n3")]
    stables = place(old, [Node(n) for n in NODES]).assignments
    for p, peers in enumerate(stables):
        store.put(KEYS.assign("z", p, AssignField.STABLE), _value(peers))
    plan = plan_pass(store.view(), now_ms=0)
    targets = {p: t for trigger in plan.triggers for p, t in trigger.targets.items()}
    lost = {p for p in range(2, 6) if "n3" in stables[p]}
    assert lost, "the example needs a removed partition on n3"
    assert {p for p in targets if p >= 2} == lost
    for p in lost:
        assert "n3" not in targets[p]
        assert set(stables[p]) - {"n3"} <= set(targets[p])
        assert len(targets[p]) == 2
    store.put(KEYS.layout("z"), encode_layout(LayoutValue(ZoneLayout(created, 2), 1, 0)))
    done = plan_pass(store.view(), now_ms=0)
    assert not [p for trigger in done.triggers for p in trigger.targets if p >= 2]


def test_a_placement_failure_in_one_zone_is_its_status_and_the_others_are_placed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One zone's placement raising (a bug) must never stop the pass: that zone is skipped with
    the error as its reason, every other zone is planned as usual."""
    import placement.driver.core as core

    good, bad = ZoneSpec("good", 6, 2), ZoneSpec("bad", 6, 2)
    store = cluster(good)
    created = store.put(KEYS.zone("bad"), encode_zone_spec(bad))
    store.put(KEYS.layout("bad"), encode_layout(LayoutValue(ZoneLayout(created, 6), 1, 0)))
    store.put(KEYS.datanodes("bad"), encode_datanodes(DataNodes(NODES, NODES, None, None)))
    real = core.place

    def buggy(
        spec: ZoneSpec,
        nodes: object,
        current: object = None,
        cordoned: object = frozenset(),
        fleet: object = None,
    ) -> object:
        if spec.name == "bad":
            raise AssertionError("placement core: no augmenting path although holes remain")
        return real(spec, nodes, current, cordoned, fleet)  # type: ignore[arg-type]

    monkeypatch.setattr(core, "place", buggy)
    plan = plan_pass(store.view(), now_ms=0)
    assert [c.zone for c in plan.creates] == ["good"]
    assert plan.skipped["bad"].startswith("placement failed (AssertionError: placement core:")
    assert "good" not in plan.skipped


def test_a_cordoned_node_gets_nothing_of_a_new_zone_and_the_zone_reads_ready() -> None:
    """The cordon mark reaches placement through the view (``ClusterView.cordoned``): a zone
    created while n2 is cordoned is placed on the three others; once its stables are written it
    is READY although the data node n2 holds nothing (``triggered`` counts it as done)."""
    store = cluster(ZoneSpec("z", 6, 3))
    store.put(KEYS.cordon("n2"), encode_control(ControlMark(1, 0)))
    view = store.view()
    assert view.cordoned == frozenset({"n2"})
    (create,) = plan_pass(view, now_ms=0).creates
    assert len(create.stables) == 6
    assert all("n2" not in peers for peers in create.stables.values())
    for p, peers in create.stables.items():
        store.put(
            KEYS.assign("z", p, AssignField.STABLE),
            encode_assignment(Assignment(tuple(peers), 1, 0, 2)),
        )
        store.put(KEYS.assign("z", p, AssignField.TRIGGER), encode_trigger(TriggerMark(2, 1, 0)))
    status = view_zone_status(store.view(), "z", 0)
    assert status is not None
    assert status.state.value == "READY", status
    assert not plan_pass(store.view(), now_ms=0).triggers


def test_zones_created_in_one_pass_are_balanced_across_the_fleet_as_the_pipeline_plans_them() -> (
    None
):
    """design/placement.md, "Fleet-wide balance": a pass places zones in name order, each
    with the fleet's loads — the targets of the zones before it, the current loads of the
    others — the feed of the pipeline's engines, so the plans are the same."""
    specs = [ZoneSpec(f"z{k:02d}", 5, 1 + k % 2) for k in range(12)]
    store = cluster(specs[0])
    for spec in specs[1:]:
        created = store.put(KEYS.zone(spec.name), encode_zone_spec(spec))
        value = LayoutValue(ZoneLayout(created, spec.partitions), 1, 0)
        store.put(KEYS.layout(spec.name), encode_layout(value))
        store.put(KEYS.datanodes(spec.name), encode_datanodes(DataNodes(NODES, NODES, None, None)))
    plan = plan_pass(store.view(), now_ms=0)
    created = {c.zone: dict(c.stables) for c in plan.creates}
    assert sorted(created) == [s.name for s in specs]
    nodes = [Node(n) for n in NODES]
    tally = FleetTally()
    for spec in sorted(specs, key=lambda s: s.name):  # the pipeline's order and feed
        expected = place(spec, nodes, fleet=tally.others(Counter(), Counter()))
        assert created[spec.name] == dict(enumerate(expected.assignments))
        tally.add(expected.loads, expected.primary_loads)
    loads = Counter(n for stables in created.values() for peers in stables.values() for n in peers)
    leads = Counter(peers[0] for stables in created.values() for peers in stables.values())
    assert max(loads.values()) - min(loads.values()) <= 1
    assert max(leads.values()) - min(leads.values()) <= 2
    plain = Counter(n for s in specs for peers in place(s, nodes).assignments for n in peers)
    assert max(plain.values()) - min(plain.values()) > 1  # what the fleet's ties avoid


def test_replica_sizes_from_a_decode_cache_equal_a_fresh_decode_and_follow_every_change() -> None:
    from placement.api.service import replica_sizes

    store = cluster(ZoneSpec("z", 3, 2))
    store.put(KEYS.size("z", 0, "n0"), encode_size(ReplicaSize(10, 1, 0)))
    store.put(KEYS.size("z", 0, "n1"), encode_size(ReplicaSize(30, 2, 0)))
    store.put(KEYS.size("z", 1, "n2"), b"not json")  # corrupt: left out
    store.put(KEYS.size("other", 2, "n0"), encode_size(ReplicaSize(99, 1, 0)))  # another zone
    cache = DecodeCache()
    assert replica_sizes(KEYS, store.kvs, "z", cache) == {0: 30}
    assert len(cache) == 3  # the zone's size keys, decoded once
    # a rewrite (new mod_revision) and a deletion are seen, as a fresh decode sees them
    store.put(KEYS.size("z", 0, "n0"), encode_size(ReplicaSize(50, 1, 1)))
    store.put(KEYS.size("z", 1, "n2"), encode_size(ReplicaSize(7, 1, 1)))
    del store.kvs[KEYS.size("z", 0, "n1")]
    assert replica_sizes(KEYS, store.kvs, "z", cache) == {0: 50, 1: 7}
    assert replica_sizes(KEYS, store.kvs, "z") == {0: 50, 1: 7}
