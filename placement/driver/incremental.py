"""The leader's view, rebuilt only where etcd changed (design/control-plane.md, "Incremental
passes"). Pure: no I/O.

The leader's list-watch keeps its keys in groups (:func:`view_group`): one per zone for what the
zone is decided on, one per zone for its agents' replica sizes and one for their move reports,
one for the cluster-wide keys (registered nodes, drain and cordon marks, the pause flag) and one
for the nodes' lease terms — apart, so a round of term renewals leaves the nodes the same object
and :class:`~placement.driver.core.PlanMemo` keeps every zone's plan.
The list-watch stamps a group whenever one of its keys changes; :class:`ViewBuilder` decodes
again only the groups whose stamp moved (with :func:`~placement.driver.core.build_view`, the one
decoder) and reuses every other part — the same objects, so
:class:`~placement.driver.core.PlanMemo` reuses the plans of zones nothing happened to. The view
built is the one ``build_view`` gives on the whole prefix (tested:
``tests/unit/test_incremental.py``), except that a zone's partitions carry the revision at which
that zone last changed, not the view's (the keys are the same at both).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from types import MappingProxyType

from placement.driver.core import ClusterView, DecodeCache, ZoneView, build_view
from placement.metastore.codec import MoveReport
from placement.metastore.keys import KeyKind, KeySpace
from placement.metastore.kv import KeyValue

#: Group name prefixes (the zone's name follows) and the cluster-wide group.
ZONE_GROUP = "zone:"
SIZES_GROUP = "sizes:"
REPORTS_GROUP = "reports:"
CLUSTER_GROUP = "cluster"
TERMS_GROUP = "terms"

_ZONE_KINDS = frozenset(
    {
        KeyKind.ZONE,
        KeyKind.DATANODES,
        KeyKind.LAYOUT,
        KeyKind.ASSIGN,
        KeyKind.PRIMARY,
        KeyKind.ISR,
        KeyKind.RESHARD,
    }
)
_CLUSTER_KINDS = frozenset({KeyKind.NODE, KeyKind.DRAIN, KeyKind.CORDON, KeyKind.CONTROL})


def view_group(keys: KeySpace) -> Callable[[bytes], str | None]:
    """The list-watch's ``group`` function: which part of the view a key belongs to (None: a
    key the view ignores, e.g. the leader keys or one not of the layout)."""

    def group(key: bytes) -> str | None:
        parsed = keys.parse(key)
        if parsed is None:
            return None
        if parsed.kind in _ZONE_KINDS:
            return ZONE_GROUP + parsed.name
        if parsed.kind is KeyKind.SIZES:
            return SIZES_GROUP + parsed.name
        if parsed.kind is KeyKind.PROGRESS:
            return REPORTS_GROUP + parsed.name
        if parsed.kind in _CLUSTER_KINDS:
            return CLUSTER_GROUP
        if parsed.kind is KeyKind.TERM:
            return TERMS_GROUP
        return None

    return group


_EMPTY: Mapping[bytes, KeyValue] = MappingProxyType({})


class ReportsByZone(Mapping[tuple[str, int], Mapping[str, MoveReport]]):
    """``ClusterView.reports`` over each zone's own reports, without merging them: a report of
    one zone costs a pass the decoding of that zone's reports, not a copy of the fleet's."""

    def __init__(self, zones: Mapping[str, Mapping[tuple[str, int], Mapping[str, MoveReport]]]):
        self._zones = zones

    def __getitem__(self, key: tuple[str, int]) -> Mapping[str, MoveReport]:
        return self._zones[key[0]][key]

    def __iter__(self) -> Iterator[tuple[str, int]]:
        for zone in sorted(self._zones):
            yield from self._zones[zone]

    def __len__(self) -> int:
        return sum(len(found) for found in self._zones.values())


class ViewBuilder:
    """See the module docstring. ``decoded`` counts the groups decoded (for tests and the
    benchmark)."""

    def __init__(self, keys: KeySpace) -> None:
        self.keys = keys
        #: group -> (stamp, the view of that group's keys alone)
        self._parts: dict[str, tuple[int, ClusterView]] = {}
        self._caches: dict[str, DecodeCache] = {}
        #: zone -> (its zone part, has sizes, the merged zone view)
        self._zones: dict[str, tuple[ClusterView | None, bool, ZoneView]] = {}
        self._reports: Mapping[tuple[str, int], Mapping[str, MoveReport]] = MappingProxyType({})
        self._view: ClusterView | None = None
        self.decoded = 0

    def build(
        self,
        revision: int,
        groups: Mapping[str, Mapping[bytes, KeyValue]],
        stamps: Mapping[str, int],
    ) -> ClusterView:
        """The view of every group at ``revision`` (``groups`` and ``stamps`` as the list-watch
        holds them at that revision)."""
        changed: set[str] = set()
        for name, stamp in stamps.items():
            held = self._parts.get(name)
            if held is None or held[0] != stamp:
                cache = self._caches.setdefault(name, DecodeCache())
                part = build_view(self.keys, groups.get(name, _EMPTY), revision, cache)
                self._parts[name] = (stamp, part)
                changed.add(name)
                self.decoded += 1
        for name in [n for n in self._parts if n not in stamps]:
            del self._parts[name]
            self._caches.pop(name, None)
            changed.add(name)
        view = self._view
        if view is not None and not changed:
            if view.revision != revision:
                self._view = view = replace(view, revision=revision)
            return view
        if view is None or any(n.startswith(REPORTS_GROUP) for n in changed):
            self._reports = ReportsByZone(
                {
                    name[len(REPORTS_GROUP) :]: part.reports
                    for name, (_, part) in self._parts.items()
                    if name.startswith(REPORTS_GROUP)
                }
            )
        cluster = self._parts.get(CLUSTER_GROUP)
        if view is None or CLUSTER_GROUP in changed:
            nodes = cluster[1].nodes if cluster is not None else MappingProxyType({})
            paused = cluster[1].paused if cluster is not None else False
            draining = cluster[1].draining if cluster is not None else frozenset()
            cordoned = cluster[1].cordoned if cluster is not None else frozenset()
        else:
            nodes, paused = view.nodes, view.paused
            draining, cordoned = view.draining, view.cordoned
        held_terms = self._parts.get(TERMS_GROUP)
        if view is None or TERMS_GROUP in changed:
            terms = held_terms[1].terms if held_terms is not None else MappingProxyType({})
            term_until = (
                held_terms[1].term_until if held_terms is not None else MappingProxyType({})
            )
        else:
            terms, term_until = view.terms, view.term_until
        zones = self._zone_views()  # a term round: every zone the same object
        self._view = ClusterView(
            revision,
            zones,
            nodes,
            paused,
            self._reports,
            draining,
            cordoned,
            terms,
            term_until,
        )
        return self._view

    def _zone_views(self) -> Mapping[str, ZoneView]:
        names: set[str] = set()
        for name, (_, built) in self._parts.items():
            if name.startswith(ZONE_GROUP):
                names.update(built.zones)
            elif name.startswith(SIZES_GROUP) and built.zones:
                names.add(name[len(SIZES_GROUP) :])
        zones: dict[str, ZoneView] = {}
        for name in sorted(names):
            held = self._parts.get(ZONE_GROUP + name)
            part = held[1] if held is not None else None
            sizes = self._parts.get(SIZES_GROUP + name)
            has_sizes = sizes is not None and bool(sizes[1].zones)
            kept = self._zones.get(name)
            if kept is not None and kept[0] is part and kept[1] == has_sizes:
                zones[name] = kept[2]
                continue
            found = part.zones.get(name) if part is not None else None
            zone = (
                replace(found, has_sizes=has_sizes)
                if found is not None
                else ZoneView(
                    name,
                    None,
                    0,
                    None,
                    0,
                    MappingProxyType({}),
                    MappingProxyType({}),
                    has_sizes=has_sizes,
                )
            )
            self._zones[name] = (part, has_sizes, zone)
            zones[name] = zone
        for name in [n for n in self._zones if n not in zones]:
            del self._zones[name]
        return MappingProxyType(zones)
