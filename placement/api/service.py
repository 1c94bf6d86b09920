"""The client/operator API served by every placement-driver instance (``PlacementService``).

Two layers (this module holds the first; :mod:`placement.api.servicer` the second):

* :class:`PlacementAPI` — domain in, domain out: validates, reads etcd directly (any instance
  answers reads), and performs writes (zone create/alter/drop, cancel, pause/resume) with the
  leader's :class:`~placement.metastore.transitions.Fence`. On a follower a write raises
  :class:`Forward` naming the leader's API address.
* :class:`PlacementServicer` — the thin gRPC edge: protobuf -> domain, domain -> protobuf, and one
  error table (:data:`STATUS_OF`). A :class:`Forward` is answered by calling the same RPC on the
  leader (one hop); when no leader is known the client gets ``UNAVAILABLE`` and retries.

Bad input is rejected with ``INVALID_ARGUMENT`` naming the field *before* anything is written.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from placement.core.layout import cancel_reshard, check_alter
from placement.core.model import ZoneSpec
from placement.core.names import validate_name
from placement.core.zonespec import validate_zone_spec
from placement.driver.core import (
    ClusterView,
    DecodeCache,
    TargetsMemo,
    build_view,
    view_zone_status,
)
from placement.driver.preview import Preview, preview
from placement.driver.status import (
    RebalanceProgress,
    ReshardProgress,
)
from placement.errors import (
    Conflict,
    InvalidInput,
    PlacementError,
)
from placement.metastore.codec import (
    Assignment,
    Corrupt,
    LayoutValue,
    LeaderRecord,
    NodeRecord,
    PrimaryLease,
    ReplicaSize,
    decode_assignment,
    decode_leader,
    decode_node,
    decode_primary,
    decode_zone_spec,
    term_until,
)
from placement.metastore.election import current_leader
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import AssignField, KeyKind, KeySpace, prefix_range_end
from placement.metastore.kv import KeyValue
from placement.metastore.readcache import ReadCache
from placement.metastore.store import Metastore
from placement.metastore.transitions import Fence, Outcome, PartitionState, ZoneRecord

DEFAULT_PAGE_SIZE = 1000
MAX_PAGE_SIZE = 10_000


class Leadership(Protocol):
    """What the driver exposes to the API (design/control-plane.md, "Leadership object")."""

    def fence(self) -> Fence | None:
        """This instance's fence while it leads, else None."""
        ...

    def leader_api(self) -> str | None:
        """The current leader's API address (HOST:PORT), if known."""
        ...


class ZoneNotFound(PlacementError):
    def __init__(self, zone: str) -> None:
        self.zone = zone
        super().__init__(f"zone {zone!r} does not exist (see 'placectl zone list')")


class ZoneExists(PlacementError):
    def __init__(self, zone: str) -> None:
        self.zone = zone
        super().__init__(f"zone {zone!r} already exists (alter it, or drop it first)")


class Forward(PlacementError):
    """This instance does not lead: the write must go to ``address`` (None = no leader known)."""

    def __init__(self, address: str | None) -> None:
        self.address = address
        where = f"the leader at {address}" if address else "a leader (none elected yet; retry)"
        super().__init__(f"not the leader; send writes to {where}")


# -- domain values -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionView:
    """What clients see of one partition: the assignment keys and the primary lease."""

    partition: int
    stable: tuple[str, ...] | None
    pending: tuple[str, ...] | None
    planned: tuple[str, ...] | None
    primary: str
    primary_expiry_ms: int


@dataclass(frozen=True, slots=True)
class NodeStatusView:
    """A node as the drain sees it: ``safe_to_stop`` when drained and holding nothing."""

    node: str
    registered: bool
    draining: bool
    stopping: bool
    replicas: int
    primaries: int
    safe_to_stop: bool
    revision: int
    cordoned: bool = False


@dataclass(frozen=True, slots=True)
class ZoneStatusView:
    """``state`` is READY, HOLDDOWN, REBALANCING, RESHARDING (then ``reshard`` is set) or
    NO_LEADER; ``rebalance``: bytes left and ETA while REBALANCING."""

    name: str
    state: str
    partitions_total: int
    partitions_done: int
    holddown_remaining_s: float
    revision: int
    reshard: ReshardProgress | None = None
    details: tuple[str, ...] = ()
    eligible_nodes: int = 0
    under_replicated: bool = False
    off_target: int = 0
    rebalance: RebalanceProgress | None = None


def make_spec(
    name: str,
    partitions: int,
    replicas: int,
    node_selector: Mapping[str, str],
    failure_domain: str | None,
    scale_up_delay: float,
    scale_down_delay: float,
    min_in_sync: int | None = None,
) -> ZoneSpec:
    """Validate every field (naming it on error) and build the spec; nothing is written here.

    ``min_in_sync`` None = the zone default (2, at most ``replicas``)."""
    return validate_zone_spec(
        ZoneSpec(
            name=name,
            partitions=partitions,
            replicas=replicas,
            node_selector=dict(sorted(node_selector.items())),
            failure_domain=failure_domain,
            scale_up_delay=float(scale_up_delay),
            scale_down_delay=float(scale_down_delay),
            min_in_sync=min_in_sync,
        ),
        user_input=True,
    )


def _peers(raw: bytes | None) -> tuple[str, ...] | None:
    if raw is None:
        return None
    decoded = decode_assignment(raw)
    return decoded.peers if isinstance(decoded, Assignment) else ()


def _primary(raw: bytes | None, terms: Mapping[str, int]) -> tuple[str, int]:
    """The primary lease's holder and when it ends (unix ms, :meth:`PrimaryLease.until` with the
    holder's term in ``terms``: node -> until); ``("", 0)`` when absent or corrupt."""
    if raw is None:
        return "", 0
    lease = decode_primary(raw)
    if not isinstance(lease, PrimaryLease):
        return "", 0
    return lease.node, lease.until(terms.get(lease.node, 0))


def _term_untils(kvs: Iterable[KeyValue | None]) -> dict[str, int]:
    """node -> ``until`` of each readable lease term among ``kvs``
    (``{p}/primary/@term/{node}``)."""
    found = ((kv.key, term_until(kv.value)) for kv in kvs if kv is not None)
    return {key.rsplit(b"/", 1)[1].decode(): until for key, until in found if until is not None}


def _holder(raw: bytes) -> tuple[str, int] | None:
    """Who holds a primary lease and at which epoch (None: corrupt)."""
    lease = decode_primary(raw)
    return (lease.node, lease.lease_epoch) if isinstance(lease, PrimaryLease) else None


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """How fresh a read must be (design/control-plane.md, "Reads from memory"): at least
    ``min_revision``; ``linearizable``: every write committed before the call."""

    min_revision: int = 0
    linearizable: bool = False


#: The assignment keys a partition's view shows.
VIEWED_FIELDS = (AssignField.STABLE, AssignField.PENDING, AssignField.PLANNED)


def _readable(zone: str, kv: KeyValue | None, strict: bool = True) -> ZoneSpec | Corrupt:
    """Zone ``zone``'s config from its key (ZoneNotFound when absent); ``strict``: a corrupt
    one is InvalidInput."""
    if kv is None:
        raise ZoneNotFound(zone)
    spec = decode_zone_spec(kv.value)
    if strict and isinstance(spec, Corrupt):
        raise InvalidInput("name", f"zone {zone!r} has a corrupt config", "drop it")
    return spec


def _check_revision(revision: int, read: ReadOptions) -> None:
    """A read from etcd at ``revision`` cannot answer a ``min_revision`` beyond it."""
    if read.min_revision > revision:
        raise InvalidInput(
            "read.min_revision",
            f"{read.min_revision} is ahead of the store's revision {revision}",
            "use a revision an answer or a write returned",
        )


def now_ms() -> int:
    return int(time.time() * 1000)


def replica_sizes(
    keys: KeySpace, kvs: Mapping[bytes, KeyValue], zone: str, cache: DecodeCache | None = None
) -> dict[int, int]:
    """Partition -> bytes of its largest replica, from the agents' size keys in ``kvs``;
    ``cache``: the decoded keys of an earlier call (the zone's :class:`DecodeCache`), so a size
    key is parsed and decoded once per change, not once per status call."""
    sizes: dict[int, int] = {}
    sizes_prefix = keys.sizes_prefix() + zone.encode() + b"/"
    cache = cache if cache is not None else DecodeCache()
    for key, kv in kvs.items():
        if not key.startswith(sizes_prefix):
            continue
        parsed, size = cache.decode(keys, key, kv)
        if parsed is not None and parsed.partition is not None and isinstance(size, ReplicaSize):
            sizes[parsed.partition] = max(sizes.get(parsed.partition, 0), size.bytes)
    return sizes


def status_on_view(
    keys: KeySpace,
    view: ClusterView,
    kvs: Mapping[bytes, KeyValue],
    name: str,
    now_ms: int,
    alarms: Sequence[str] = (),
    cache: DecodeCache | None = None,
    memo: TargetsMemo | None = None,
) -> ZoneStatusView | None:
    """Zone ``name``'s status as GetZoneStatus answers it, on ``view`` (built from ``kvs``, one
    read at ``view.revision`` holding at least what ``Metastore.read_zone_snapshot`` reads):
    ``driver.core.view_zone_status`` with the replicas' sizes and NO_LEADER when no leader key
    is in ``kvs``; ``alarms`` (etcd's raised alarms, one line each) lead its details. None: no
    readable config."""
    leaders = keys.leader_prefix()
    leader = any(key.startswith(leaders) for key in kvs)
    sizes = replica_sizes(keys, kvs, name, cache)
    status = view_zone_status(view, name, now_ms, leader=leader, sizes=sizes, memo=memo)
    if status is None:
        return None
    return ZoneStatusView(
        name,
        status.state.value,
        status.partitions_total,
        status.partitions_done,
        status.holddown_remaining_s,
        view.revision,
        status.reshard,
        (*alarms, *status.details),
        status.eligible_nodes or 0,
        status.under_replicated,
        status.off_target,
        status.rebalance,
    )


# -- the domain API ----------------------------------------------------------------------------


class PlacementAPI:
    """Reads from etcd on any instance; writes only when :meth:`Leadership.fence` is set."""

    def __init__(
        self,
        client: EtcdClient,
        keys: KeySpace,
        leadership: Leadership | None = None,
        *,
        clock_ms: Callable[[], int] = now_ms,
        cache: ReadCache | None = None,
        alarms: Callable[[], Sequence[str]] = tuple,
    ) -> None:
        self.client = client
        #: etcd's raised alarms, one line each (``EtcdHealth.details``): zone status shows them.
        self.alarms = alarms
        self.keys = keys
        self.store = Metastore(client, keys)
        self.leadership = leadership
        self.cache = cache
        self._clock_ms = clock_ms
        self._decoded: dict[str, DecodeCache] = {}  # per zone: only changed keys decoded again
        self._placed = TargetsMemo()  # zones polled at their targets are not placed again
        # Per zone and partition: the view made from the cache and its keys' mod revisions,
        # and the partition's keys (see _cached_views). A zone the cache no longer holds is
        # forgotten when it is next asked for.
        self._memo: dict[
            str, dict[int, tuple[tuple[int, ...], PartitionView, tuple[bytes, int]]]
        ] = {}
        self._partition_keys: dict[str, dict[int, tuple[bytes, ...]]] = {}

    # -- leadership ------------------------------------------------------------------------------

    async def _fence(self) -> Fence:
        fence = self.leadership.fence() if self.leadership is not None else None
        if fence is not None:
            return fence
        address = self.leadership.leader_api() if self.leadership is not None else None
        if address is None:
            address = await self.leader_address()
        raise Forward(address)

    async def leader_address(self) -> str | None:
        """The API address in the current leader's election value ``{"id":..,"api":..}``."""
        kv = await current_leader(self.client, self.keys)
        record = decode_leader(kv.value) if kv is not None else None
        return record.api or None if isinstance(record, LeaderRecord) else None

    # -- zones -----------------------------------------------------------------------------------

    async def create_zone(self, spec: ZoneSpec) -> ZoneRecord:
        fence = await self._fence()
        result = await self.store.create_zone(spec, fence)
        if not result.applied:
            raise ZoneExists(spec.name)
        return ZoneRecord(spec.name, spec, result.revision, result.revision)

    async def get_zone(self, name: str) -> ZoneRecord:
        validate_name(name, "zone")
        record = await self.store.get_zone(name)
        if record is None:
            raise ZoneNotFound(name)
        return record

    async def alter_zone(self, name: str, change: Callable[[ZoneSpec], ZoneSpec]) -> ZoneRecord:
        """Read-modify-write under a CAS of the config's and the layout's mod revisions;
        ``change`` validates, and a partition count the running reshard cannot take raises
        :class:`ReshardRunning` (design/resharding.md), before any write."""
        fence = await self._fence()
        for _ in range(8):
            record = await self.get_zone(name)
            if isinstance(record.spec, Corrupt):
                raise InvalidInput("name", f"zone {name!r} has a corrupt config", "drop it")
            spec = change(record.spec)
            layout = record.layout.layout if isinstance(record.layout, LayoutValue) else None
            check_alter(layout, name, record.spec.partitions, spec.partitions)
            result = await self.store.update_zone(
                spec, record.mod_revision, fence, record.layout_revision
            )
            if result.applied:
                return replace(record, spec=spec, mod_revision=result.revision)
            if result.current is None:
                raise ZoneNotFound(name)
        raise Conflict(f"zone {name!r} changed concurrently too often; retry")

    async def cancel_reshard(self, name: str) -> tuple[bool, str]:
        """Abort zone ``name``'s re-sharding before its flip by altering its partition count back
        to the reshard's source (:func:`~placement.core.layout.cancel_reshard`), through
        :meth:`alter_zone`: the same guarded write and checks as an operator's alter back."""
        record = await self.get_zone(name)
        layout = record.layout.layout if isinstance(record.layout, LayoutValue) else None
        decision = cancel_reshard(layout, name)
        count = decision.count
        if count is not None:
            await self.alter_zone(name, lambda spec: replace(spec, partitions=count))
        return decision.accepted, decision.detail

    async def drop_zone(self, name: str) -> None:
        fence = await self._fence()
        for _ in range(8):
            record = await self.get_zone(name)
            result = await self.store.delete_zone(name, record.mod_revision, fence)
            if result.applied:
                return
            if result.current is None:
                raise ZoneNotFound(name)
        raise Conflict(f"zone {name!r} changed concurrently too often; retry")

    async def list_zones(self) -> tuple[int, tuple[ZoneRecord, ...]]:
        return await self.store.list_zones()

    # -- status, nodes, assignments ----------------------------------------------------------------

    async def zone_status(self, name: str, read: ReadOptions = ReadOptions()) -> ZoneStatusView:
        """`driver.status.zone_status` of zone ``name`` as the leader would see it (any instance
        answers): one consistent read of everything a pass decides the zone on, the pass's own
        rules applied to it (``driver.core.zone_outlook``), so READY means nothing is left to
        do — and NO_LEADER while no driver leads. From the read cache when it can answer
        ``read``, else from etcd."""
        validate_name(name, "zone")
        cache = await self._cache(read, name)
        if cache is not None:
            revision, kvs = cache.revision, cache.zone_kvs(name)
            _readable(name, kvs.get(self.keys.zone(name)))
        else:
            revision, kvs = await self.store.read_zone_snapshot(name)
            _check_revision(revision, read)
            if kvs.get(self.keys.zone(name)) is None:
                self._forget(name)
            _readable(name, kvs.get(self.keys.zone(name)))
        decoded = self._decoded.setdefault(name, DecodeCache())
        view = build_view(self.keys, kvs, revision, decoded)
        status = status_on_view(
            self.keys, view, kvs, name, self._clock_ms(), self.alarms(), decoded, self._placed
        )
        if status is None:
            self._forget(name)
            raise ZoneNotFound(name)  # dropped between the two reads
        return status

    async def plan_alter(self, name: str, change: Callable[[ZoneSpec], ZoneSpec]) -> Preview:
        """What altering zone ``name`` by ``change`` would make the leader do (its moves, loads
        and bytes; :mod:`placement.driver.preview`), decided on one consistent read of
        everything a pass decides the zone on. Writes nothing; ``change`` validates, and the
        running reshard's refusal is raised, exactly as :meth:`alter_zone` would."""
        validate_name(name, "zone")
        revision, kvs = await self.store.read_zone_snapshot(name)  # one read decides it all
        current = _readable(name, kvs.get(self.keys.zone(name)))
        assert isinstance(current, ZoneSpec)  # strict: a corrupt one raised
        view = build_view(self.keys, kvs, revision)
        spec = change(current)
        stored = view.zones[name].layout
        layout = stored.layout if isinstance(stored, LayoutValue) else None
        check_alter(layout, name, current.partitions, spec.partitions)
        return preview(
            view,
            self._clock_ms(),
            lambda zone: replica_sizes(self.keys, kvs, zone),
            specs={name: spec},
        )

    async def plan_drain(self, node: str) -> Preview:
        """What draining ``node`` would make the leader do over every zone (its leases handed
        over, its replicas moved away), decided on one consistent read of the whole prefix.
        Writes nothing."""
        validate_name(node, "drain_node")
        revision, kvs = await self.store.read_cluster_snapshot()
        view = build_view(self.keys, kvs, revision)
        if node not in view.nodes and not any(
            node in state.holders() for z in view.zones.values() for state in z.partitions.values()
        ):
            raise InvalidInput(
                "drain_node",
                f"{node!r} is not registered and holds nothing",
                "name a registered node",
            )
        return preview(
            view,
            self._clock_ms(),
            lambda zone: replica_sizes(self.keys, kvs, zone),
            drain={node},
        )

    async def list_nodes(
        self, read: ReadOptions = ReadOptions()
    ) -> tuple[int, tuple[NodeRecord, ...]]:
        """Every registered node (name order) and the revision the answer reflects."""
        cache = await self._cache(read)
        if cache is not None:
            prefix = self.keys.nodes_prefix()
            found = sorted(
                (key, kv) for key, kv in cache.global_kvs().items() if key.startswith(prefix)
            )
            records = (decode_node(kv.value) for _, kv in found)
            return cache.revision, tuple(r for r in records if isinstance(r, NodeRecord))
        revision, entries = await self.store.list_nodes()
        _check_revision(revision, read)
        return revision, tuple(e.record for e in entries if isinstance(e.record, NodeRecord))

    def holds(self, zone: str) -> bool:
        """Whether anything is kept for ``zone`` between reads (decoded keys, views, targets)."""
        memos = (self._memo, self._partition_keys, self._decoded)
        return zone in self._placed or any(zone in memo for memo in memos)

    def _forget(self, zone: str) -> None:
        """Drop what is kept for a zone that no longer exists."""
        for memo in (self._memo, self._partition_keys, self._decoded):
            memo.pop(zone, None)
        self._placed.forget(zone)

    async def _cache(self, read: ReadOptions, zone: str | None = None) -> ReadCache | None:
        """The read cache when it may answer ``read`` now (None: read etcd). A ``zone`` it does
        not hold is read from etcd, which says for sure: a client that created it a moment ago
        on another instance finds it."""
        if read.min_revision < 0:
            raise InvalidInput("read.min_revision", "is negative", "use 0 or a revision")
        cache = self.cache
        if cache is None or not await cache.ready(read.min_revision, read.linearizable):
            return None
        if zone is not None and cache.get(self.keys.zone(zone)) is None:
            self._forget(zone)
            return None
        return cache

    async def assignments(
        self,
        zone: str,
        *,
        partition: int | None = None,
        start: int = 0,
        limit: int = 0,
        read: ReadOptions = ReadOptions(),
    ) -> tuple[int, list[PartitionView], int | None]:
        """Partitions ``start..`` (at most ``limit``) at one revision, and the next start; from
        the read cache when it can answer ``read``, else from etcd."""
        validate_name(zone, "zone")
        cache = await self._cache(read, zone)
        if cache is not None:
            spec = _readable(zone, cache.get(self.keys.zone(zone)), strict=False)
        else:
            spec = (await self.get_zone(zone)).spec
        total = spec.partitions if isinstance(spec, ZoneSpec) else 0
        limit = limit or DEFAULT_PAGE_SIZE
        if partition is not None:
            if partition >= max(total, 1):
                raise InvalidInput(
                    "partition",
                    f"{partition} is not a partition of {zone!r}",
                    f"use 0..{total - 1}",
                )
            first, last = partition, partition + 1
        else:
            first, last = start, min(total, start + limit)
        if first >= last:
            if cache is not None:
                return cache.revision, [], None
            revision = await self.client.current_revision(self.keys.zone(zone))
            _check_revision(revision, read)
            return revision, [], None
        partitions = range(first, last)
        if cache is not None:
            revision, views = cache.revision, self._cached_views(cache, zone, partitions)
        else:
            revision, found, held, terms = await self.store.read_assignment_page(zone, first, last)
            _check_revision(revision, read)
            views = self._views(zone, found.kvs, held.kvs, partitions, _term_untils(terms.kvs))
        following = last if partition is None and last < total else None
        return revision, views, following

    def _cached_views(self, cache: ReadCache, zone: str, partitions: range) -> list[PartitionView]:
        """The partitions' views from the read cache. Each view is kept with the mod revisions
        of the keys it was made from — its four keys and its lease holder's term — and reused
        while they are unchanged (the same object: the servicer reuses its protobuf too), so a
        read decodes only what changed since the last one — typically the leases of the nodes
        whose terms were renewed meanwhile."""
        memo = self._memo.setdefault(zone, {})
        key_memo = self._partition_keys.setdefault(zone, {})
        get = cache.get
        views = []
        for p in partitions:
            keys = key_memo.get(p)
            if keys is None:
                keys = key_memo[p] = (
                    *(self.keys.assign(zone, p, f) for f in VIEWED_FIELDS),
                    self.keys.primary(zone, p),
                )
            kvs = [get(k) for k in keys]
            stamp = tuple(kv.mod_revision if kv is not None else 0 for kv in kvs)
            hit = memo.get(p)
            if hit is not None and hit[0] == stamp:
                term_key, term_mod = hit[2]
                found = get(term_key) if term_key else None
                if (found.mod_revision if found is not None else 0) == term_mod:
                    views.append(hit[1])
                    continue
            raw = [kv.value if kv is not None else None for kv in kvs]
            stable, pending, planned = (_peers(r) for r in raw[:3])
            holder = _holder(raw[3]) if raw[3] is not None else None
            term_key = self.keys.term(holder[0]) if holder is not None else b""
            term = get(term_key) if term_key else None
            view = PartitionView(
                p, stable, pending, planned, *_primary(raw[3], _term_untils((term,)))
            )
            memo[p] = (stamp, view, (term_key, term.mod_revision if term is not None else 0))
            views.append(view)
        return views

    def _views(
        self,
        zone: str,
        assign: Iterable[KeyValue],
        primaries: Iterable[KeyValue],
        partitions: range,
        terms: Mapping[str, int],
    ) -> list[PartitionView]:
        by_partition: dict[int, dict[AssignField, bytes]] = {}
        for kv in assign:
            parsed = self.keys.parse(kv.key)
            if parsed is None or parsed.kind is not KeyKind.ASSIGN or parsed.name != zone:
                continue
            assert parsed.partition is not None
            assert parsed.field is not None
            by_partition.setdefault(parsed.partition, {})[parsed.field] = kv.value
        primary_of: dict[int, bytes] = {}
        base = self.keys.zone_primary_prefix(zone)
        for kv in primaries:
            tail = kv.key[len(base) :]
            if tail.isdigit():
                primary_of[int(tail)] = kv.value
        views = []
        for p in partitions:
            found = by_partition.get(p, {})
            node, expiry = _primary(primary_of.get(p), terms)
            views.append(
                PartitionView(
                    p,
                    _peers(found.get(AssignField.STABLE)),
                    _peers(found.get(AssignField.PENDING)),
                    _peers(found.get(AssignField.PLANNED)),
                    node,
                    expiry,
                )
            )
        return views

    async def watch_assignments(
        self, zone: str, from_revision: int
    ) -> AsyncIterator[tuple[int, PartitionView]]:
        """Every change after ``from_revision`` (0 = from now) of the zone's assignment keys and
        of its primary leases' holders (a new node or lease epoch — not the renewals, which
        change only the expiry): the partition as it is at the revision of the change, in
        revision order, so a client resumes exactly with ``from_revision`` = the last revision
        it saw. Raises Compacted (re-read).

        One etcd watch on the whole prefix, filtered here: a single stream keeps assignment and
        lease events in etcd's order (two watches could deliver them out of order)."""
        validate_name(zone, "zone")
        if from_revision < 0:
            raise InvalidInput("from_revision", "is negative", "use 0 (now) or a revision")
        base = self.keys.prefix.encode() + b"/"
        assign = self.keys.zone_assign_prefix(zone)
        leases = self.keys.zone_primary_prefix(zone)
        start = from_revision or await self.client.current_revision(self.keys.zone(zone))
        held = await self.client.range(leases, prefix_range_end(leases), revision=start)
        holders = {kv.key: _holder(kv.value) for kv in held.kvs}
        async with self.client.watch(
            base, prefix_range_end(base), start_revision=start + 1, prev_kv=False
        ) as watch:
            async for batch in watch:
                # One etcd response may carry several revisions (a resumed watch catches up in
                # one): each change is the partition as it is at its own revision.
                touched: dict[int, set[int]] = {}
                for e in batch.events:
                    key = e.kv.key
                    if key.startswith(leases):
                        holder = _holder(e.kv.value) if e.kv.value else None
                        if holders.get(key) == holder:
                            continue  # a renewal: same node and epoch
                        holders[key] = holder
                    elif not key.startswith(assign):
                        continue
                    parsed = self.keys.parse(key)
                    if parsed is not None and parsed.partition is not None:
                        touched.setdefault(e.kv.mod_revision, set()).add(parsed.partition)
                for revision in sorted(touched):
                    for p in sorted(touched[revision]):
                        begin = self.keys.partition_prefix(zone, p)
                        found = await self.client.range(
                            begin, prefix_range_end(begin), revision=revision
                        )
                        lease_key = self.keys.primary(zone, p)
                        lease = await self.client.get(lease_key, revision=revision)
                        holder = _holder(lease.kvs[0].value) if lease.kvs else None
                        terms: dict[str, int] = {}
                        if holder is not None:
                            term_key = self.keys.term(holder[0])
                            term = await self.client.get(term_key, revision=revision)
                            terms = _term_untils(term.kvs)
                        (view,) = self._views(zone, found.kvs, lease.kvs, range(p, p + 1), terms)
                        yield revision, view

    # -- rebalance control -----------------------------------------------------------------------

    async def cancel(self, zone: str, partition: int) -> tuple[bool, str]:
        """Write the cancel intent, guarded by the pending key's mod_revision as read."""
        fence = await self._fence()
        record = await self.get_zone(zone)
        total = record.spec.partitions if isinstance(record.spec, ZoneSpec) else 0
        if partition >= total:
            raise InvalidInput(
                "partition", f"{partition} is not a partition of {zone!r}", f"use 0..{total - 1}"
            )
        state: PartitionState = await self.store.read_partition(zone, partition)
        if state.pending is None:
            return False, "no rebalance in progress for this partition"
        result = await self.store.cancel(
            zone, partition, state.pending.mod_revision, fence, self._clock_ms()
        )
        if result.outcome is Outcome.APPLIED:
            return True, f"cancel recorded for pending revision {state.pending.mod_revision}"
        return False, f"not cancelled: {result.outcome.value} (the rebalance finished or changed)"

    async def drain(self, node: str, drain: bool) -> NodeStatusView:
        """Write (or delete) the node's drain mark through the leader; then its status."""
        validate_name(node, "node")
        fence = await self._fence()
        await self.store.set_drain(node, drain, fence, self._clock_ms())
        return await self.node_status(node)

    async def cordon(self, node: str, cordon: bool) -> NodeStatusView:
        """Write (or delete) the node's cordon mark through the leader; then its status."""
        validate_name(node, "node")
        fence = await self._fence()
        await self.store.set_cordon(node, cordon, fence, self._clock_ms())
        return await self.node_status(node)

    async def node_status(self, node: str) -> NodeStatusView:
        """What ``node`` still holds over every zone (one consistent read)."""
        validate_name(node, "node")
        revision, kvs = await self.store.read_node_snapshot(node)
        view = build_view(self.keys, kvs, revision)
        now = self._clock_ms()
        replicas = primaries = 0
        for zone in view.zones.values():
            for state in zone.partitions.values():
                replicas += node in state.holders()
            for lease in zone.primaries.values():
                value = lease.value
                primaries += (
                    isinstance(value, PrimaryLease)
                    and value.node == node
                    and view.lease_until(value) > now
                )
        record = view.nodes.get(node)
        draining = node in view.draining
        return NodeStatusView(
            node,
            record is not None,
            draining,
            record is not None and record.stopping,
            replicas,
            primaries,
            draining and replicas == 0 and primaries == 0,
            revision,
            node in view.cordoned,
        )

    async def set_paused(self, paused: bool) -> bool:
        fence = await self._fence()
        await self.store.set_paused(paused, fence, self._clock_ms())
        return paused
