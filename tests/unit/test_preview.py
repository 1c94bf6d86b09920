"""The dry run (placement.driver.preview): on a view, its final assignment is what the pass
writes once the change is stored, with loads, bytes and leases accounted; it writes nothing."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from test_driver_core import KEYS, NODES, cluster, write_stables

from placement.core.layout import Reshard, ReshardPhase, ZoneLayout
from placement.core.model import ZoneSpec
from placement.driver.core import plan_pass
from placement.driver.preview import preview
from placement.metastore.codec import (
    ControlMark,
    DataNodes,
    LayoutValue,
    NodeRecord,
    PrimaryLease,
    encode_control,
    encode_datanodes,
    encode_layout,
    encode_node,
    encode_primary,
    encode_zone_spec,
)
from placement.metastore.keys import AssignField

SIZES = {p: 1000 * (p + 1) for p in range(16)}


def _sizes(zone: str) -> dict[int, int]:
    return SIZES if zone == "z" else {}


def _stables(store: object, zone: str = "z") -> dict[int, tuple[str, ...]]:
    view = store.view()  # type: ignore[attr-defined]
    return {
        p: peers
        for p, s in view.zones[zone].partitions.items()
        if (peers := s.peers(AssignField.STABLE)) is not None
    }


@settings(max_examples=60, deadline=None)
@given(
    partitions=st.integers(1, 12),
    replicas=st.integers(1, 4),
    new_replicas=st.integers(1, 4),
)
def test_an_alter_preview_is_what_the_pass_triggers_once_the_config_is_stored(
    partitions: int, replicas: int, new_replicas: int
) -> None:
    spec = ZoneSpec("z", partitions, replicas)
    store = cluster(spec)
    write_stables(store, spec)
    before = _stables(store)
    new = ZoneSpec("z", partitions, new_replicas)
    revision = store.revision
    (zone,) = preview(store.view(), 0, _sizes, specs={"z": new}).zones
    assert store.revision == revision  # wrote nothing
    store.put(KEYS.zone("z"), encode_zone_spec(new))
    triggered = {
        p: t for trig in plan_pass(store.view(), now_ms=0).triggers for p, t in trig.targets.items()
    }
    after = {c.partition: c.after for c in zone.changes}
    assert after == triggered  # the same partitions, the same ordered targets
    for c in zone.changes:
        assert c.before == before[c.partition]
        joining = len(set(c.after) - set(c.before))
        assert c.bytes == joining * SIZES[c.partition]
    assert zone.bytes_to_move == sum(c.bytes for c in zone.changes)
    final = {p: after.get(p, peers) for p, peers in before.items()}
    load = Counter(n for peers in final.values() for n in peers)
    assert {n.node: n.replicas_after for n in zone.loads if n.replicas_after} == dict(load)
    assert zone.replicas_added - zone.replicas_removed == partitions * (
        min(new_replicas, len(NODES)) - min(replicas, len(NODES))
    )


def test_a_drain_preview_moves_every_replica_off_the_node_and_counts_its_leases() -> None:
    spec = ZoneSpec("z", 8, 2)
    store = cluster(spec)
    write_stables(store, spec)
    before = _stables(store)
    held = [p for p, peers in before.items() if "n1" in peers]
    store.put(KEYS.primary("z", held[0]), encode_primary(PrimaryLease("n1", 1, 10_000)))
    store.put(KEYS.primary("z", held[1]), encode_primary(PrimaryLease("n1", 1, 10)))
    (zone,) = preview(store.view(), 100, _sizes, drain={"n1"}).zones
    assert {c.partition for c in zone.changes} == set(held)
    assert all("n1" not in c.after and len(c.after) == 2 for c in zone.changes)
    loads = {n.node: n for n in zone.loads}
    assert loads["n1"].replicas_before == len(held)
    assert loads["n1"].replicas_after == 0
    assert loads["n1"].leases_handed_over == 1  # the other lease has expired
    # Stored, the drain hands n1's lease over, drops n1 from the data nodes, then triggers
    # these targets.
    store.put(KEYS.drain("n1"), encode_control(ControlMark(1, 0)))
    other = next(n for n in before[held[0]] if n != "n1")
    store.put(KEYS.primary("z", held[0]), encode_primary(PrimaryLease(other, 2, 10_000)))
    rest = tuple(n for n in NODES if n != "n1")
    store.put(KEYS.datanodes("z"), encode_datanodes(DataNodes(rest, rest, None, None)))
    triggered = {
        p: t
        for trig in plan_pass(store.view(), now_ms=100).triggers
        for p, t in trig.targets.items()
    }
    assert triggered == {c.partition: c.after for c in zone.changes}


def test_a_drain_preview_leaves_out_zones_the_node_has_nothing_in() -> None:
    spec = ZoneSpec("z", 4, 2, node_selector={"rack": "a"})
    store = cluster(spec, datanodes=False)
    store.put(KEYS.datanodes("z"), encode_datanodes(DataNodes((), (), None, None)))
    assert preview(store.view(), 0, _sizes, drain={"n1"}).zones == ()


def test_a_shrink_preview_removes_the_partitions_and_estimates_the_copy() -> None:
    spec = ZoneSpec("z", 8, 2)
    store = cluster(spec)
    write_stables(store, spec)
    (zone,) = preview(store.view(), 0, _sizes, specs={"z": ZoneSpec("z", 6, 2)}).zones
    removed = [c for c in zone.changes if not c.after]
    assert [c.partition for c in removed] == [6, 7]
    assert zone.reshard == (8, 6)
    assert zone.reshard_bytes == SIZES[6] + SIZES[7]  # a shrink copies the removed ones' keys
    assert zone.bytes_to_move == zone.reshard_bytes + sum(c.bytes for c in zone.changes)
    assert any("re-shards 8 -> 6" in note for note in zone.notes)


def test_a_grow_preview_creates_the_new_partitions_from_the_layout_count() -> None:
    spec = ZoneSpec("z", 4, 2)
    store = cluster(spec)
    write_stables(store, spec)
    store.put(KEYS.layout("z"), encode_layout(LayoutValue(ZoneLayout(2, 4), 1, 0)))
    (zone,) = preview(store.view(), 0, _sizes, specs={"z": ZoneSpec("z", 8, 2)}).zones
    created = [c for c in zone.changes if not c.before]
    assert [c.partition for c in created] == [4, 5, 6, 7]
    assert all(len(c.after) == 2 and c.bytes == 0 for c in created)
    assert zone.reshard == (4, 8)
    assert zone.reshard_bytes == sum(SIZES[p] for p in range(4)) // 2


def test_a_held_membership_change_and_under_replication_are_noted() -> None:
    spec = ZoneSpec("z", 4, 5, scale_up_delay=60)
    store = cluster(spec)
    write_stables(store, spec)
    held = DataNodes(NODES[:3], NODES, up_since=0, down_since=None)
    store.put(KEYS.datanodes("z"), encode_datanodes(held))
    (zone,) = preview(store.view(), 1000, _sizes, specs={"z": spec}).zones
    assert any("waits 59s more" in note for note in zone.notes)
    assert any("under-replicated: 4 eligible node(s) for 5 replicas" in n for n in zone.notes)


def test_altering_back_during_a_grow_aborts_it_and_removes_the_new_partitions() -> None:
    spec = ZoneSpec("z", 8, 2)
    store = cluster(spec)
    write_stables(store, spec)  # partitions 0..7: the grow created 4..7
    running = Reshard(attempt=5, source=4, target=8, phase=ReshardPhase.COPY)
    store.put(KEYS.layout("z"), encode_layout(LayoutValue(ZoneLayout(2, 4, running), 1, 0)))
    (zone,) = preview(store.view(), 0, _sizes, specs={"z": ZoneSpec("z", 4, 2)}).zones
    assert {c.partition for c in zone.changes if not c.after} == {4, 5, 6, 7}
    assert sum(n.replicas_after for n in zone.loads) == 4 * 2
    assert zone.reshard is None
    assert any("aborts the re-sharding 4 -> 8" in note for note in zone.notes)


def test_a_selector_change_notes_the_delay_it_starts() -> None:
    spec = ZoneSpec("z", 4, 2, scale_down_delay=300)
    store = cluster(spec)
    write_stables(store, spec)
    narrower = ZoneSpec("z", 4, 2, node_selector={"rack": "r1"}, scale_down_delay=300)
    store.put(KEYS.node("n3"), encode_node(NodeRecord("n3", "127.0.0.1:3", {"rack": "r1"})))
    store.put(KEYS.node("n2"), encode_node(NodeRecord("n2", "127.0.0.1:2", {"rack": "r1"})))
    (zone,) = preview(store.view(), 0, _sizes, specs={"z": narrower}).zones
    assert all(set(c.after) <= {"n2", "n3"} for c in zone.changes)
    assert any("waits 300s more" in note for note in zone.notes), zone.notes
    (drained,) = preview(store.view(), 0, _sizes, drain={"n0"}).zones
    assert not any("waits" in note for note in drained.notes)  # a drain has no delay
