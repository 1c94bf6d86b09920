"""What the dashboard shows, built from one consistent read of the whole prefix.

:func:`build_document` is pure: it takes the decoded view (``driver.core.build_view``) and the
raw keys of one read, and applies the API's own rules — each zone's status is
:func:`placement.api.service.status_on_view`, exactly what ``GetZoneStatus`` answers — so the
page never disagrees with ``placectl zone status``. :class:`DashboardSource` does the read (any
driver instance, leader or follower) and keeps a recent document for ``min_interval`` seconds,
so many open pages cost etcd one read per interval, not one per page.

Sections: zones (state, progress, ETA, details), nodes (replicas and unexpired primary leases,
per zone: the heat map), rebalances in flight (every pending assignment: from, to, joining and
leaving nodes, agents' DONE/FAILED reports) and recent changes — the latest write of each
placement key (etcd keeps a key's current value; its earlier values live in etcd's history,
which ``placectl pipeline export`` reads), newest first.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from placement.api.service import now_ms, status_on_view
from placement.core.model import ZoneSpec
from placement.driver.core import ClusterView, DecodeCache, ZoneView, build_view
from placement.metastore.codec import (
    Assignment,
    ControlMark,
    DataNodes,
    LayoutValue,
    LeaderRecord,
    PrimaryLease,
    decode_control,
    decode_leader,
)
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import AssignField, KeyKind, KeySpace
from placement.metastore.kv import KeyValue
from placement.metastore.readcache import ReadCache
from placement.metastore.transitions import PartitionState

#: Rows of in-flight rebalances the document carries (the page says how many more there are).
MAX_REBALANCES = 200
#: Recent changes the document carries.
MAX_HISTORY = 30


class Leading(Protocol):
    """What the dashboard asks the driver instance serving it (``driver.loop.Driver``)."""

    def fence(self) -> object | None:
        """Set while this instance leads."""
        ...


# -- the document ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ZoneRow:
    name: str
    #: READY, HOLDDOWN, REBALANCING, RESHARDING, NO_LEADER (GetZoneStatus), or UNREADABLE.
    state: str
    partitions: int
    replicas: int
    failure_domain: str | None
    partitions_done: int
    partitions_total: int
    holddown_remaining_s: float
    #: Seconds left of the rebalance or re-sharding at its rate so far; 0 = unknown.
    eta_s: float
    bytes_to_move: int
    off_target: int
    eligible_nodes: int
    under_replicated: bool
    #: Partitions with a pending assignment now.
    moving: int
    details: tuple[str, ...]
    #: ``{"phase", "source", "target", "bytes_copied", "bytes_to_copy"}`` while re-sharding.
    reshard: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class NodeRow:
    name: str
    address: str
    attributes: dict[str, str]
    registered: bool
    draining: bool
    stopping: bool
    #: Replicas in stable assignments and unexpired primary leases, over every zone.
    replicas: int
    primaries: int
    #: zone -> ``{"replicas": n, "primaries": n}`` (the heat map's row).
    zones: dict[str, dict[str, int]] = field(default_factory=dict)
    #: An operator cordons it: it takes no new replicas.
    cordoned: bool = False


@dataclass(frozen=True, slots=True)
class RebalanceRow:
    zone: str
    partition: int
    old: tuple[str, ...]
    new: tuple[str, ...]
    joining: tuple[str, ...]
    leaving: tuple[str, ...]
    #: The next target queued behind this move (planned), if any.
    planned: tuple[str, ...] | None
    cancelling: bool
    #: The pending key's mod revision (the move's identity) and when it was written (unix ms).
    revision: int
    started_ms: int
    #: Members whose agent reported the catch-up of this move DONE / FAILED.
    done: tuple[str, ...]
    failed: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Change:
    """The latest write of a placement key (or of a group: a round's switched partitions)."""

    revision: int
    #: When the writer stamped it (unix ms); 0 when the value carries no time.
    ts_ms: int
    kind: str
    zone: str | None
    text: str


@dataclass(frozen=True, slots=True)
class Document:
    revision: int
    generated_ms: int
    #: The instance serving the page, the elected leader (None: no leader) and the pause flag.
    driver: str
    leader: str | None
    leading: bool
    paused: bool
    zones: tuple[ZoneRow, ...]
    nodes: tuple[NodeRow, ...]
    rebalances: tuple[RebalanceRow, ...]
    rebalances_total: int
    history: tuple[Change, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# -- building it (pure) ------------------------------------------------------------------------


def _peers(state: PartitionState, f: AssignField) -> tuple[str, ...]:
    return tuple(state.peers(f) or ())


def _leader(keys: KeySpace, kvs: Mapping[bytes, KeyValue]) -> tuple[str | None, int]:
    """The elected leader's id and epoch: the lowest create revision under the leader prefix
    (``metastore.election.current_leader``'s rule)."""
    prefix = keys.leader_prefix()
    found = [kv for key, kv in kvs.items() if key.startswith(prefix)]
    if not found:
        return None, 0
    first = min(found, key=lambda kv: kv.create_revision)
    record = decode_leader(first.value)
    name = record.member_id if isinstance(record, LeaderRecord) else ""
    return name or "(unreadable)", first.create_revision


def _zone_row(
    keys: KeySpace,
    view: ClusterView,
    kvs: Mapping[bytes, KeyValue],
    zone: ZoneView,
    now: int,
    alarms: Sequence[str],
    cache: DecodeCache | None,
) -> ZoneRow:
    moving = sum(1 for s in zone.partitions.values() if s.pending is not None)
    spec = zone.spec
    status = status_on_view(keys, view, kvs, zone.name, now, alarms, cache)
    if status is None or not isinstance(spec, ZoneSpec):
        why = "its config is corrupt" if spec is not None else "it has keys but no config"
        return ZoneRow(
            zone.name, "UNREADABLE", 0, 0, None, 0, 0, 0.0, 0.0, 0, 0, 0, False, moving, (why,)
        )
    eta, to_move, reshard = 0.0, 0, None
    if status.rebalance is not None:
        eta, to_move = status.rebalance.eta_s, status.rebalance.bytes_to_move
    if status.reshard is not None:
        r = status.reshard
        eta = r.eta_s
        reshard = {
            "phase": r.reshard.phase.value,
            "source": r.reshard.source,
            "target": r.reshard.target,
            "bytes_copied": r.bytes_copied,
            "bytes_to_copy": r.bytes_to_copy,
        }
    return ZoneRow(
        zone.name,
        status.state,
        spec.partitions,
        spec.replicas,
        spec.failure_domain,
        status.partitions_done,
        status.partitions_total,
        status.holddown_remaining_s,
        eta,
        to_move,
        status.off_target,
        status.eligible_nodes,
        status.under_replicated,
        moving,
        status.details,
        reshard,
    )


def _node_rows(view: ClusterView, now: int) -> tuple[NodeRow, ...]:
    """Every registered node, and every node still named by an assignment or a drain mark."""
    replicas: Counter[tuple[str, str]] = Counter()
    primaries: Counter[tuple[str, str]] = Counter()
    for zone in view.zones.values():
        for state in zone.partitions.values():
            for node in _peers(state, AssignField.STABLE):
                replicas[node, zone.name] += 1
        for lease in zone.primaries.values():
            if isinstance(lease.value, PrimaryLease) and view.lease_until(lease.value) > now:
                primaries[lease.value.node, zone.name] += 1
    names = {*view.nodes, *view.draining, *(n for n, _ in replicas), *(n for n, _ in primaries)}
    rows = []
    for name in sorted(names):
        record = view.nodes.get(name)
        per_zone = {
            z: {"replicas": replicas[name, z], "primaries": primaries[name, z]}
            for z in view.zones
            if replicas[name, z] or primaries[name, z]
        }
        rows.append(
            NodeRow(
                name,
                record.address if record is not None else "",
                dict(sorted(record.attributes.items())) if record is not None else {},
                record is not None,
                name in view.draining,
                record is not None and record.stopping,
                sum(c["replicas"] for c in per_zone.values()),
                sum(c["primaries"] for c in per_zone.values()),
                per_zone,
                name in view.cordoned,
            )
        )
    return tuple(rows)


def _rebalances(view: ClusterView) -> list[RebalanceRow]:
    rows = []
    for zone in view.zones.values():
        for p, state in zone.partitions.items():
            pending = state.pending
            if pending is None:
                continue
            old, new = _peers(state, AssignField.STABLE), _peers(state, AssignField.PENDING)
            reports = view.reported(zone.name, p, pending.mod_revision)
            planned = state.peers(AssignField.PLANNED)
            rows.append(
                RebalanceRow(
                    zone.name,
                    p,
                    old,
                    new,
                    tuple(n for n in new if n not in old),
                    tuple(n for n in old if n not in new),
                    tuple(planned) if planned is not None else None,
                    state.cancel is not None,
                    pending.mod_revision,
                    pending.value.ts if isinstance(pending.value, Assignment) else 0,
                    tuple(sorted(n for n, r in reports.items() if r.phase == "DONE")),
                    tuple(sorted(n for n, r in reports.items() if r.phase != "DONE")),
                )
            )
    rows.sort(key=lambda r: (r.revision, r.zone, r.partition))
    return rows


def _assignment_changes(zone: ZoneView) -> Iterable[Change]:
    """A zone's stable and pending keys, grouped by the trigger revision that wrote them: one
    line per round ("N partitions switched", "N partitions started moving")."""
    groups: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    for p, state in zone.partitions.items():
        for f in (AssignField.STABLE, AssignField.PENDING):
            entry = state.pending if f is AssignField.PENDING else state.stable
            if entry is None or not isinstance(entry.value, Assignment):
                continue
            kind = f.value
            if f is AssignField.STABLE and entry.mod_revision == entry.create_revision:
                kind = "created"
            key = (kind, entry.value.trigger)
            groups.setdefault(key, []).append((entry.mod_revision, entry.value.ts, p))
    verbs = {
        "created": "placed (created)",
        "stable": "switched to their new replicas (rebalance done)",
        "pending": "started moving (rebalance begun)",
    }
    for (kind, trigger), found in groups.items():
        n = len(found)
        which = f"partition {found[0][2]}" if n == 1 else f"{n} partitions"
        yield Change(
            max(r for r, _, _ in found),
            max(ts for _, ts, _ in found),
            f"assignments:{kind}",
            zone.name,
            f"{which} {verbs[kind]}; trigger revision {trigger}",
        )


def _history(keys: KeySpace, view: ClusterView, kvs: Mapping[bytes, KeyValue]) -> list[Change]:
    changes: list[Change] = []
    for zone in view.zones.values():
        spec = zone.spec
        if isinstance(spec, ZoneSpec):
            shape = f"{spec.partitions} partitions × {spec.replicas} replicas"
            changes.append(Change(zone.zone_created, 0, "zone:created", zone.name, "created"))
            if zone.zone_mod != zone.zone_created:
                changes.append(
                    Change(zone.zone_mod, 0, "zone:altered", zone.name, f"altered: {shape}")
                )
        if isinstance(zone.datanodes, DataNodes):
            applied = ", ".join(zone.datanodes.applied) or "none"
            changes.append(
                Change(
                    zone.datanodes_mod,
                    zone.datanodes.ts,
                    "datanodes",
                    zone.name,
                    f"data nodes recorded: {applied}",
                )
            )
        if isinstance(zone.layout, LayoutValue) and zone.layout_mod:
            layout = zone.layout.layout
            text = f"layout generation {layout.generation}, {layout.partitions} partitions"
            if layout.reshard is not None:
                r = layout.reshard
                text += f"; re-sharding {r.source} → {r.target}: {r.phase.value}"
            changes.append(Change(zone.layout_mod, zone.layout.ts, "layout", zone.name, text))
        changes.extend(_assignment_changes(zone))
    for key, kv in kvs.items():
        parsed = keys.parse(key)
        if parsed is None:
            continue
        if parsed.kind is KeyKind.NODE:
            changes.append(
                Change(kv.create_revision, 0, "node", None, f"node {parsed.name} registered")
            )
        elif parsed.kind in (KeyKind.DRAIN, KeyKind.CONTROL):
            mark = decode_control(kv.value)
            ts = mark.ts if isinstance(mark, ControlMark) else 0
            text = (
                f"node {parsed.name} drained"
                if parsed.kind is KeyKind.DRAIN
                else "rebalancing paused"
            )
            changes.append(Change(kv.mod_revision, ts, parsed.kind.value, None, text))
    leader, epoch = _leader(keys, kvs)
    if leader is not None:
        changes.append(Change(epoch, 0, "leader", None, f"driver {leader} leads (epoch {epoch})"))
    changes.sort(key=lambda c: (-c.revision, c.kind, c.zone or ""))
    return changes[:MAX_HISTORY]


def build_document(
    keys: KeySpace,
    view: ClusterView,
    kvs: Mapping[bytes, KeyValue],
    now: int,
    *,
    driver: str,
    leading: bool,
    alarms: Sequence[str] = (),
    cache: DecodeCache | None = None,
) -> Document:
    """The dashboard's document on ``view`` (decoded from ``kvs``: the whole prefix at
    ``view.revision``) at unix ms ``now``, served by instance ``driver``; ``alarms``: etcd's
    raised alarms, one line each, in every zone's details; ``cache``: the one ``view`` was
    decoded with, so the zones' size keys are decoded once per change too."""
    leader, _ = _leader(keys, kvs)
    zones = tuple(
        _zone_row(keys, view, kvs, zone, now, alarms, cache) for zone in view.zones.values()
    )
    rebalances = _rebalances(view)
    return Document(
        view.revision,
        now,
        driver,
        leader,
        leading,
        view.paused,
        zones,
        _node_rows(view, now),
        tuple(rebalances[:MAX_REBALANCES]),
        len(rebalances),
        tuple(_history(keys, view, kvs)),
    )


# -- reading it --------------------------------------------------------------------------------


class DashboardSource:
    """Takes the whole prefix at one revision — from the driver's read cache when it is
    watching, else one paged etcd read — and builds the document; a document younger than
    ``min_interval`` seconds is served again (concurrent requests share one build)."""

    def __init__(
        self,
        client: EtcdClient,
        keys: KeySpace,
        driver: str,
        leadership: Leading | None = None,
        *,
        min_interval: float = 1.0,
        clock_ms: Callable[[], int] = now_ms,
        monotonic: Callable[[], float] = time.monotonic,
        cache: ReadCache | None = None,
        alarms: Callable[[], Sequence[str]] = tuple,
    ) -> None:
        self.client = client
        self.cache = cache
        self.alarms = alarms
        self.keys = keys
        self.driver = driver
        self.leadership = leadership
        self.min_interval = min_interval
        self._clock_ms = clock_ms
        self._monotonic = monotonic
        self._cache = DecodeCache()  # reused across reads: only changed keys are decoded
        self._lock = asyncio.Lock()
        self._last: tuple[float, Document] | None = None

    async def document(self) -> Document:
        async with self._lock:
            last = self._last
            if last is not None and self._monotonic() - last[0] < self.min_interval:
                return last[1]
            cache = self.cache
            if cache is not None and await cache.ready():
                revision, kvs = cache.revision, cache.all_kvs()  # live: no await below
            else:
                found = await self.client.list_prefix(self.keys.prefix.encode() + b"/")
                revision, kvs = found.revision, {kv.key: kv for kv in found.kvs}
            view = build_view(self.keys, kvs, revision, self._cache)
            leading = self.leadership is not None and self.leadership.fence() is not None
            document = build_document(
                self.keys,
                view,
                kvs,
                self._clock_ms(),
                driver=self.driver,
                leading=leading,
                alarms=self.alarms(),
                cache=self._cache,
            )
            self._last = (self._monotonic(), document)
            return document
