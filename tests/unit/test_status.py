"""Zone status from etcd-derived values: READY only once stable reflects config and data nodes."""

from __future__ import annotations

from dataclasses import replace

from placement.core.layout import Reshard, ReshardPhase, ZoneLayout
from placement.core.model import Peers, ZoneSpec
from placement.driver.core import (
    ClusterView,
    ZoneOutlook,
    ZoneView,
    observed_nodes,
    reshard_facts,
    zone_outlook,
)
from placement.driver.status import (
    ZoneStatus,
    ZoneStatusState,
    rebalance_progress,
    reshard_progress,
    zone_status,
)
from placement.metastore.codec import (
    Assignment,
    DataNodes,
    InSyncSet,
    LayoutValue,
    NodeRecord,
    PrimaryLease,
    ReshardReport,
)
from placement.metastore.transitions import PartitionState, Versioned


def _state(p: int, stable: Peers, pending: Peers | None = None) -> PartitionState:
    def entry(peers: Peers, rev: int) -> Versioned[Assignment]:
        return Versioned(Assignment(peers, epoch=1, ts=0, trigger=1), b"", rev, rev)

    return PartitionState(
        "z", p, 10, stable=entry(stable, 5), pending=entry(pending, 6) if pending else None
    )


def _nodes(applied: tuple[str, ...], observed: tuple[str, ...] | None = None) -> DataNodes:
    return DataNodes(applied, observed if observed is not None else applied, None, None)


SPEC = ZoneSpec("z", partitions=3, replicas=2)
BALANCED = {0: ("a", "b"), 1: ("b", "c"), 2: ("c", "a")}


def _status(stables: dict[int, Peers], applied: tuple[str, ...], spec: ZoneSpec = SPEC) -> str:
    partitions = {p: _state(p, peers) for p, peers in stables.items()}
    return zone_status(spec, partitions, _nodes(applied), 0.0).state.value


def test_ready_when_stable_reflects_config_and_data_nodes() -> None:
    assert _status(BALANCED, ("a", "b", "c")) == ZoneStatusState.READY


def test_a_pending_key_is_rebalancing_with_progress() -> None:
    partitions = {p: _state(p, peers) for p, peers in BALANCED.items()}
    partitions[1] = _state(1, ("b", "c"), pending=("b", "d"))
    status = zone_status(SPEC, partitions, _nodes(("a", "b", "c", "d")), 0.0)
    assert status.state is ZoneStatusState.REBALANCING
    assert (status.partitions_done, status.partitions_total) == (2, 3)


def test_a_change_not_yet_turned_into_pending_is_not_ready() -> None:
    # a joined data node holding nothing, a left one still in stable, a replica-count change,
    # and a partition still being created: each means the driver has work it has not written yet
    assert _status(BALANCED, ("a", "b", "c", "d")) == "REBALANCING"
    assert _status(BALANCED, ("a", "b")) == "REBALANCING"
    assert _status(BALANCED, ("a", "b", "c"), ZoneSpec("z", 3, 3)) == "REBALANCING"
    assert _status({0: ("a", "b"), 1: ("b", "c")}, ("a", "b", "c")) == "REBALANCING"


def test_more_nodes_than_replicas_leaves_some_empty_and_ready() -> None:
    # 1 partition x 2 replicas over 3 nodes: one node must hold nothing, and that is READY
    assert _status({0: ("a", "b")}, ("a", "b", "c"), ZoneSpec("z", 1, 2)) == "READY"


def test_a_change_inside_its_delay_is_holddown() -> None:
    partitions = {p: _state(p, peers) for p, peers in BALANCED.items()}
    held = DataNodes(("a", "b", "c"), ("a", "b"), None, down_since=0)
    spec = ZoneSpec("z", 3, 2, scale_down_delay=60.0)
    status = zone_status(spec, partitions, held, 1.0)
    assert status.state is ZoneStatusState.HOLDDOWN
    assert 0 < status.holddown_remaining_s <= 60


def test_a_reshard_is_resharding_with_what_it_copied_and_is_expected_to_copy() -> None:
    grow = LayoutValue(ZoneLayout(7, 4, Reshard(9, 4, 8, ReshardPhase.COPY)), 1, ts=10_000)
    reports = {
        4: ReshardReport(9, 1, keys=30, bytes=3_000),
        5: ReshardReport(9, 1, keys=10, bytes=1_000),
        6: ReshardReport(8, 1, keys=99, bytes=99_000),  # an older attempt: not counted
    }
    sizes = {0: 8_000, 1: 8_000, 2: 8_000, 3: 8_000, 4: 4_000}  # 4: a destination's own size
    progress = reshard_progress(grow, reports, sizes, now_ms=12_000)
    assert progress is not None
    assert (progress.keys_copied, progress.bytes_copied) == (40, 4_000)
    assert progress.bytes_to_copy == 16_000  # half of every source moves in 4 -> 8
    assert progress.eta_s == 6.0  # 12,000 bytes left at 2,000 bytes/s
    status = zone_status(ZoneSpec("z", 8, 2), {}, None, 12.0, progress)
    assert status.state is ZoneStatusState.RESHARDING
    assert status.reshard == progress
    shrink = LayoutValue(ZoneLayout(7, 8, Reshard(9, 8, 5, ReshardPhase.SEAL)), 1, ts=10_000)
    moved = reshard_progress(shrink, {}, {p: 1_000 for p in range(8)}, now_ms=12_000)
    assert moved is not None
    assert (moved.bytes_to_copy, moved.eta_s) == (3_000, 0.0)  # the removed 5, 6, 7 move whole
    assert reshard_progress(LayoutValue(ZoneLayout(7, 8)), {}, {}, 0) is None


# -- honest status: what a pass would still do (driver.core.zone_outlook) -------------------------


def _view(
    stables: dict[int, Peers], applied: tuple[str, ...], registered: tuple[str, ...]
) -> ClusterView:
    zone = ZoneView(
        "z",
        SPEC,
        1,
        _nodes(applied),
        2,
        {p: _state(p, peers) for p, peers in stables.items()},
        {},
    )
    nodes = {n: NodeRecord(n, f"{n}:1", {}) for n in registered}
    return ClusterView(10, {"z": zone}, nodes, False)


def _honest(view: ClusterView, *, leader: bool = True) -> ZoneStatus:
    zone = view.zones["z"]
    outlook = zone_outlook(view, "z", 1_000_000)
    assert outlook is not None
    return zone_status(
        SPEC, zone.partitions, zone.datanodes, 1000.0, outlook=outlook, leader=leader
    )


def test_a_registered_node_the_data_nodes_do_not_hold_yet_is_not_ready() -> None:
    """The leaderless window after a node registers (scale-up delay 0): the data-node record
    does not name it yet, the stored view alone says READY — the outlook says a change is due."""
    stored = _view(BALANCED, ("a", "b", "c"), ("a", "b", "c", "d"))
    status = _honest(stored)
    assert status.state is ZoneStatusState.REBALANCING
    assert any("data-node change" in d for d in status.details)
    settled = _honest(_view(BALANCED, ("a", "b", "c"), ("a", "b", "c")))
    assert settled.state is ZoneStatusState.READY
    assert settled.eligible_nodes == 3


def test_no_leader_says_so_whatever_else_holds() -> None:
    status = _honest(_view(BALANCED, ("a", "b", "c"), ("a", "b", "c")), leader=False)
    assert status.state is ZoneStatusState.NO_LEADER
    assert "else READY" in status.details[0]


def test_off_target_partitions_and_under_replication_are_shown() -> None:
    # stable fits the data nodes' count but not the placement (a cancelled move left it)
    skewed = {0: ("a", "b"), 1: ("a", "b"), 2: ("a", "b")}
    status = _honest(_view(skewed, ("a", "b", "c"), ("a", "b", "c")))
    assert status.state is ZoneStatusState.REBALANCING
    assert status.off_target >= 1
    assert any("off target" in d for d in status.details)
    lone = _honest(_view({0: ("a",), 1: ("a",), 2: ("a",)}, ("a",), ("a",)))
    assert lone.under_replicated
    assert lone.state is ZoneStatusState.READY
    assert any("under-replicated" in d for d in lone.details)


def test_an_outlook_with_a_held_change_not_recorded_yet_is_holddown() -> None:
    outlook = ZoneOutlook(False, 12.5, ("a", "b", "c"), (), 0)
    partitions = {p: _state(p, peers) for p, peers in BALANCED.items()}
    status = zone_status(SPEC, partitions, _nodes(("a", "b", "c")), 0.0, outlook=outlook)
    assert status.state is ZoneStatusState.HOLDDOWN
    assert status.holddown_remaining_s == 12.5


def test_a_rebalance_eta_from_the_round_s_finished_moves() -> None:
    def entry(peers: Peers, trigger: int, ts: int) -> Versioned[Assignment]:
        return Versioned(Assignment(peers, epoch=1, ts=ts, trigger=trigger), b"", 7, 7)

    finished = PartitionState("z", 0, 10, stable=entry(("a", "c"), 9, 20_000))
    moving = PartitionState(
        "z", 1, 10, stable=entry(("a", "b"), 1, 0), pending=entry(("a", "c"), 9, 10_000)
    )
    waiting = PartitionState(
        "z", 2, 10, stable=entry(("b", "a"), 1, 0), pending=entry(("c", "b"), 9, 10_000)
    )
    parts = {0: finished, 1: moving, 2: waiting}
    sizes = {0: 1000, 1: 1000, 2: 3000}
    # 1000 B finished in the 20 s since the round began (t=10 s): 50 B/s; 4000 B left -> 80 s
    progress = rebalance_progress(parts, sizes, 30_000)
    assert progress is not None
    assert progress.bytes_to_move == 1000 * 1 + 3000 * 1
    assert progress.eta_s == 80.0
    assert rebalance_progress({0: finished}, sizes, 30_000) is None
    # nothing finished yet: no estimate
    unknown = rebalance_progress({1: moving, 2: waiting}, sizes, 30_000)
    assert unknown is not None
    assert unknown.eta_s == 0.0


def test_a_drained_node_stays_a_data_node_until_its_leases_moved() -> None:
    """Leases first, then replicas: a drained node that still holds an unexpired lease of the
    zone stays observed; once it holds none it is removed at once (no scale-down delay)."""
    view = _view(BALANCED, ("a", "b", "c"), ("a", "b", "c"))
    zone = view.zones["z"]
    held = Versioned(PrimaryLease("a", 1, 2_000_000), b"", 3, 3)
    leading = replace(zone, primaries={0: held})
    draining = replace(view, zones={"z": leading}, draining=frozenset({"a"}))
    assert observed_nodes(draining, leading, SPEC, 1_000_000) == (("a", "b", "c"), frozenset())
    handed = replace(draining, zones={"z": zone})
    assert observed_nodes(handed, zone, SPEC, 1_000_000) == (("b", "c"), frozenset({"a"}))
    outlook = zone_outlook(handed, "z", 1_000_000)
    assert outlook is not None
    assert outlook.datanodes_due
    assert outlook.eligible == ("b", "c")


def test_a_lease_no_one_can_take_does_not_hold_a_drained_node_back() -> None:
    """R=1, or the others out of sync: the lease has no taker until the rebalance adds one, so
    waiting for its hand-over would never end — the node leaves at once and the lease follows."""
    view = _view(BALANCED, ("a", "b", "c"), ("a", "b", "c"))
    zone = view.zones["z"]
    held = Versioned(PrimaryLease("a", 1, 2_000_000), b"", 3, 3)
    alone = Versioned(InSyncSet(("a",), "a", 1, 0), b"", 4, 4)
    stuck = replace(zone, primaries={0: held}, isrs={0: alone})
    draining = replace(view, zones={"z": stuck}, draining=frozenset({"a"}))
    assert observed_nodes(draining, stuck, SPEC, 1_000_000) == (("b", "c"), frozenset({"a"}))


def test_a_reshard_report_from_a_deposed_primary_counts_for_nothing() -> None:
    """A report put by an older primary that reached etcd late overwrites the key (the
    re-sharding SIGKILL test caught one): its lease epoch is below the partition's lease, so
    the leader ignores it and waits for the current primary's (which is put again every 2 s)."""
    reshard = Reshard(7, 2, 4, ReshardPhase.CLEANUP)
    stables = {p: ("a", "b") for p in range(4)}
    view = _view(stables, ("a", "b"), ("a", "b"))
    zone = view.zones["z"]
    leases = {p: Versioned(PrimaryLease("a", 2, 2_000_000), b"", 3, 3) for p in range(4)}
    fresh = {p: ReshardReport(7, 2, purged=True) for p in range(4)}
    stale = {**fresh, 3: ReshardReport(7, 1, purged=True)}
    current = replace(zone, primaries=leases, reshard_reports=fresh)
    late = replace(zone, primaries=leases, reshard_reports=stale)
    assert reshard_facts(current, reshard, {"a", "b"}, 1_000_000).purged
    assert not reshard_facts(late, reshard, {"a", "b"}, 1_000_000).purged


def test_a_destination_whose_primary_left_its_isr_is_not_ready() -> None:
    """A primary whose replica lacks committed entries steps down: it writes the ISR without
    itself and serves nothing while its lease runs out (design/data-plane.md, "A primary that
    lacks committed entries"). The leader must not count that destination as ready."""
    reshard = Reshard(7, 2, 4, ReshardPhase.PREPARE)
    stables = {p: ("a", "b") for p in range(4)}
    view = _view(stables, ("a", "b"), ("a", "b"))
    zone = view.zones["z"]
    leases = {p: Versioned(PrimaryLease("a", 2, 2_000_000), b"", 3, 3) for p in range(4)}
    serving = {p: Versioned(InSyncSet(("a", "b"), "a", 2, 0), b"", 4, 4) for p in range(4)}
    stepped_down = {**serving, 3: Versioned(InSyncSet(("b",), "a", 2, 0), b"", 5, 5)}
    ready = replace(zone, primaries=leases, isrs=serving)
    lacking = replace(zone, primaries=leases, isrs=stepped_down)
    assert reshard_facts(ready, reshard, {"a", "b"}, 1_000_000).ready
    assert not reshard_facts(lacking, reshard, {"a", "b"}, 1_000_000).ready
