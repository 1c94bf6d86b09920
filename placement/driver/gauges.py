"""The leader's state gauges (design/observability.md): computed from its latest view at every
scrape, on the metrics server's thread — which holds the interpreter's lock meanwhile, so the
driver's loop waits for it. At fleet size (100 zones × 1,000 partitions) a scrape walked every
partition and lease of every zone: seconds of the loop's time per scrape. :class:`GaugeMemo`
keeps each zone's counts while its view is the same object (the leader's incremental view
reuses an unchanged zone's), so a scrape walks only the zones that changed since the last one.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping

from placement import metrics
from placement.core.model import ZoneSpec
from placement.driver.core import ClusterView, TargetsMemo, ZoneView, view_zone_status
from placement.driver.status import ZoneStatusState
from placement.metastore.codec import PrimaryLease
from placement.metastore.keys import AssignField

#: Later than any lease's end: a zone's lease counts with no lease that can end.
_FOREVER = 2**63 - 1


class GaugeMemo:
    """Per zone, what the last scrape counted: its stable replicas per node (while its view is
    the same object) and its unexpired primary leases per node (while its view and the lease
    terms are the same objects and none of the counted leases has ended); and its placements
    (:class:`TargetsMemo`, for its status)."""

    def __init__(self) -> None:
        #: held by :func:`fleet_gauges`: two scrapes at once (two scrapers) take turns
        self.lock = threading.Lock()
        self.targets = TargetsMemo()
        self._replicas: dict[str, tuple[ZoneView, Counter[str]]] = {}
        self._primaries: dict[str, tuple[ZoneView, Mapping[str, int], int, Counter[str]]] = {}

    def retain(self, zones: Mapping[str, object]) -> None:
        """Forget zones no longer in the view."""
        self.targets.retain(zones)
        for held in (self._replicas, self._primaries):
            for name in [n for n in held if n not in zones]:
                del held[name]

    def replicas(self, zone: ZoneView) -> Counter[str]:
        held = self._replicas.get(zone.name)
        if held is None or held[0] is not zone:
            counts: Counter[str] = Counter()
            for state in zone.partitions.values():
                counts.update(state.peers(AssignField.STABLE) or ())
            held = (zone, counts)
            self._replicas[zone.name] = held
        return held[1]

    def primaries(self, view: ClusterView, zone: ZoneView, now_ms: int) -> Counter[str]:
        held = self._primaries.get(zone.name)
        if (
            held is None
            or held[0] is not zone
            or held[1] is not view.term_until
            or now_ms >= held[2]
        ):
            counts: Counter[str] = Counter()
            ends = _FOREVER
            for lease in zone.primaries.values():
                value = lease.value
                if isinstance(value, PrimaryLease) and (until := view.lease_until(value)) > now_ms:
                    counts[value.node] += 1
                    ends = min(ends, until)
            held = (zone, view.term_until, ends, counts)
            self._primaries[zone.name] = held
        return held[3]


def fleet_gauges(
    view: ClusterView, now_ms: int, memo: GaugeMemo, moving: Mapping[str, int]
) -> list[metrics.GaugeFamily]:
    """The gauges of the leader's ``view``: each zone's status (what GetZoneStatus says), its
    moves in flight (``moving``: zone -> partitions being moved), and per node the replicas in
    stable assignments and the unexpired primary leases over every zone."""
    with memo.lock:
        return _fleet_gauges(view, now_ms, memo, moving)


def _fleet_gauges(
    view: ClusterView, now_ms: int, memo: GaugeMemo, moving: Mapping[str, int]
) -> list[metrics.GaugeFamily]:
    memo.retain(view.zones)
    replicas: Counter[str] = Counter({node: 0 for node in view.nodes})
    primaries: Counter[str] = Counter({node: 0 for node in view.nodes})
    states: dict[tuple[str, ...], float] = {}
    for zone in view.zones.values():
        if not isinstance(zone.spec, ZoneSpec):
            continue
        replicas.update(memo.replicas(zone))
        primaries.update(memo.primaries(view, zone, now_ms))
        status = view_zone_status(view, zone.name, now_ms, memo=memo.targets)
        assert status is not None  # its config is readable (checked above)
        for state_name in ZoneStatusState:
            states[(zone.name, state_name.value)] = float(status.state is state_name)
    in_flight: dict[tuple[str, ...], float] = {(z,): moving.get(z, 0) for z in view.zones}
    return [
        metrics.GaugeFamily(
            "placement_zone_state",
            "1 for the zone's current status (READY, HOLDDOWN, REBALANCING, RESHARDING),"
            " 0 for the others; from the leader's view.",
            ("zone", "state"),
            states,
        ),
        metrics.GaugeFamily(
            "placement_driver_moves_in_flight",
            "Partitions of the zone being rebalanced now (a mover sending Rebalance or"
            " CancelRebalance).",
            ("zone",),
            in_flight,
        ),
        metrics.GaugeFamily(
            "placement_node_replicas",
            "Replicas the node holds in stable assignments, over every zone.",
            ("node",),
            {(n,): float(c) for n, c in replicas.items()},
        ),
        metrics.GaugeFamily(
            "placement_node_primaries",
            "Unexpired primary leases the node holds, over every zone.",
            ("node",),
            {(n,): float(c) for n, c in primaries.items()},
        ),
    ]
