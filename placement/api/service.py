"""The client/operator API served by every placement-driver instance (``PlacementService``).

Two layers:

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
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol, TypeVar

import grpc
from grpc_health.v1 import health

from placement.core.model import ZoneSpec
from placement.core.names import validate_name
from placement.core.zonespec import ALTERABLE, validate_zone_spec
from placement.driver.status import zone_status
from placement.errors import (
    Compacted,
    Conflict,
    InvalidInput,
    NotLeader,
    PlacementError,
    StoreUnavailable,
)
from placement.metastore.codec import (
    Assignment,
    Corrupt,
    LeaderRecord,
    NodeRecord,
    PrimaryLease,
    decode_assignment,
    decode_datanodes,
    decode_leader,
    decode_primary,
)
from placement.metastore.election import current_leader
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import AssignField, KeyKind, KeySpace, prefix_range_end
from placement.metastore.kv import Range
from placement.metastore.store import Metastore
from placement.metastore.transitions import Fence, Outcome, PartitionState, ZoneRecord
from placement.rpc import API_PROFILE, ChannelPool, StatusTable, abort, add_health
from placement.v1 import common_pb2, driver_pb2, driver_pb2_grpc

SERVICE_NAME: str = driver_pb2.DESCRIPTOR.services_by_name["PlacementService"].full_name
DEFAULT_PAGE_SIZE = 1000
#: Metadata set on a forwarded call, so that it is forwarded at most once.
FORWARDED = "x-placement-forwarded"
MAX_PAGE_SIZE = 10_000
#: How ZoneConfig names the ZoneSpec fields it names differently.
_PROTO_FIELD = {
    "scale_up_delay": "scale_up_delay_seconds",
    "scale_down_delay": "scale_down_delay_seconds",
}


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
class ZoneStatusView:
    """``state`` is READY, HOLDDOWN or REBALANCING."""

    name: str
    state: str
    partitions_total: int
    partitions_done: int
    holddown_remaining_s: float
    revision: int


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


def _primary(raw: bytes | None) -> tuple[str, int]:
    """The primary lease's holder and expiry (unix ms); ``("", 0)`` when absent or corrupt."""
    if raw is None:
        return "", 0
    lease = decode_primary(raw)
    return (lease.node, lease.expiry) if isinstance(lease, PrimaryLease) else ("", 0)


def now_ms() -> int:
    return int(time.time() * 1000)


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
    ) -> None:
        self.client = client
        self.keys = keys
        self.store = Metastore(client, keys)
        self.leadership = leadership
        self._clock_ms = clock_ms

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
        """Read-modify-write under a mod_revision CAS; ``change`` validates before any write."""
        fence = await self._fence()
        for _ in range(8):
            record = await self.get_zone(name)
            if isinstance(record.spec, Corrupt):
                raise InvalidInput("name", f"zone {name!r} has a corrupt config", "drop it")
            spec = change(record.spec)
            result = await self.store.update_zone(spec, record.mod_revision, fence)
            if result.applied:
                return ZoneRecord(name, spec, result.revision, record.create_revision)
            if result.current is None:
                raise ZoneNotFound(name)
        raise Conflict(f"zone {name!r} changed concurrently too often; retry")

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

    async def zone_status(self, name: str) -> ZoneStatusView:
        """`driver.status.zone_status` over the zone's keys (any instance answers)."""
        record = await self.get_zone(name)
        if isinstance(record.spec, Corrupt):
            raise InvalidInput("name", f"zone {name!r} has a corrupt config", "drop it")
        zone = await self.store.read_zone(name)
        found = await self.client.get(self.keys.datanodes(name), revision=zone.revision)
        kv = found.first()
        datanodes = decode_datanodes(kv.value) if kv is not None else None
        status = zone_status(record.spec, zone.partitions, datanodes, self._clock_ms() / 1000)
        return ZoneStatusView(
            name,
            status.state.value,
            status.partitions_total,
            status.partitions_done,
            status.holddown_remaining_s,
            zone.revision,
        )

    async def list_nodes(self) -> tuple[int, tuple[NodeRecord, ...]]:
        revision, entries = await self.store.list_nodes()
        return revision, tuple(e.record for e in entries if isinstance(e.record, NodeRecord))

    async def assignments(
        self, zone: str, *, partition: int | None = None, start: int = 0, limit: int = 0
    ) -> tuple[int, list[PartitionView], int | None]:
        """Partitions ``start..`` (at most ``limit``) at one revision, and the next start."""
        record = await self.get_zone(zone)
        total = record.spec.partitions if isinstance(record.spec, ZoneSpec) else 0
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
            revision = await self.client.current_revision()
            return revision, [], None
        revision, assign, primaries = await self.store.read_assignment_page(zone, first, last)
        views = self._views(zone, assign, primaries, range(first, last))
        following = last if partition is None and last < total else None
        return revision, views, following

    def _views(
        self, zone: str, assign: Range, primaries: Range, partitions: range
    ) -> list[PartitionView]:
        by_partition: dict[int, dict[AssignField, bytes]] = {}
        for kv in assign.kvs:
            parsed = self.keys.parse(kv.key)
            if parsed is None or parsed.kind is not KeyKind.ASSIGN or parsed.name != zone:
                continue
            assert parsed.partition is not None
            assert parsed.field is not None
            by_partition.setdefault(parsed.partition, {})[parsed.field] = kv.value
        primary_of: dict[int, bytes] = {}
        base = self.keys.zone_primary_prefix(zone)
        for kv in primaries.kvs:
            tail = kv.key[len(base) :]
            if tail.isdigit():
                primary_of[int(tail)] = kv.value
        views = []
        for p in partitions:
            found = by_partition.get(p, {})
            node, expiry = _primary(primary_of.get(p))
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
        """Every change of the zone's assignment keys after ``from_revision`` (0 = from now):
        the partition as it is at the revision of the change. Raises Compacted (re-read)."""
        validate_name(zone, "zone")
        if from_revision < 0:
            raise InvalidInput("from_revision", "is negative", "use 0 (now) or a revision")
        prefix = self.keys.zone_assign_prefix(zone)
        start = from_revision + 1 if from_revision else 0
        async with self.client.watch(
            prefix, prefix_range_end(prefix), start_revision=start, prev_kv=False
        ) as watch:
            async for batch in watch:
                touched = sorted(
                    {
                        parsed.partition
                        for e in batch.events
                        if (parsed := self.keys.parse(e.kv.key)) is not None
                        and parsed.partition is not None
                    }
                )
                for p in touched:
                    begin = self.keys.partition_prefix(zone, p)
                    found = await self.client.range(
                        begin, prefix_range_end(begin), revision=batch.revision
                    )
                    empty = Range((), batch.revision)
                    (view,) = self._views(zone, found, empty, range(p, p + 1))
                    yield batch.revision, view

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

    async def set_paused(self, paused: bool) -> bool:
        fence = await self._fence()
        await self.store.set_paused(paused, fence, self._clock_ms())
        return paused


# -- the gRPC edge -----------------------------------------------------------------------------

STATUS_OF: StatusTable = (
    (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (ZoneNotFound, grpc.StatusCode.NOT_FOUND),
    (ZoneExists, grpc.StatusCode.ALREADY_EXISTS),
    (Conflict, grpc.StatusCode.ABORTED),
    (Compacted, grpc.StatusCode.OUT_OF_RANGE),
    (NotLeader, grpc.StatusCode.UNAVAILABLE),
    (Forward, grpc.StatusCode.UNAVAILABLE),
    (StoreUnavailable, grpc.StatusCode.UNAVAILABLE),
)


def zone_pb(record: ZoneRecord) -> driver_pb2.Zone:
    spec = record.spec
    if isinstance(spec, Corrupt):
        return driver_pb2.Zone(name=record.name, revision=record.mod_revision)
    config = driver_pb2.ZoneConfig(
        partitions=spec.partitions,
        replicas=spec.replicas,
        node_selector=dict(spec.node_selector),
        failure_domain=spec.failure_domain or "",
        scale_up_delay_seconds=spec.scale_up_delay,
        scale_down_delay_seconds=spec.scale_down_delay,
        min_in_sync=spec.min_in_sync or 0,
    )
    return driver_pb2.Zone(name=record.name, config=config, revision=record.mod_revision)


def _fields_from_pb(config: driver_pb2.ZoneConfig) -> dict[str, Any]:
    """Every alterable ZoneSpec field as ``config`` gives it (not validated); 0 / "" on the
    wire mean "unset" for ``failure_domain`` and ``min_in_sync``."""
    found: dict[str, Any] = {f: getattr(config, _PROTO_FIELD.get(f, f)) for f in ALTERABLE}
    found["partitions"] = int(found["partitions"])
    found["replicas"] = int(found["replicas"])
    found["node_selector"] = dict(found["node_selector"])
    found["failure_domain"] = found["failure_domain"] or None
    found["min_in_sync"] = int(found["min_in_sync"]) or None
    return found


def spec_from_pb(name: str, config: driver_pb2.ZoneConfig) -> ZoneSpec:
    return make_spec(name, **_fields_from_pb(config))


def altered(spec: ZoneSpec, config: driver_pb2.ZoneConfig, update: Sequence[str]) -> ZoneSpec:
    """``spec`` with the fields named in ``update`` taken from ``config`` (validated)."""
    if not update:
        raise InvalidInput(
            "update_fields", "names no field", f"name some of {', '.join(ALTERABLE)}"
        )
    unknown = [f for f in update if f not in ALTERABLE]
    if unknown:
        raise InvalidInput(
            "update_fields", f"unknown field {unknown[0]!r}", f"use {', '.join(ALTERABLE)}"
        )
    given = _fields_from_pb(config)
    current: dict[str, Any] = {f: getattr(spec, f) for f in ALTERABLE}
    current.update({f: given[f] for f in update})
    return make_spec(spec.name, **current)


def partition_pb(view: PartitionView) -> driver_pb2.PartitionAssignment:
    return driver_pb2.PartitionAssignment(
        partition=view.partition,
        stable=common_pb2.Peers(names=view.stable or ()),
        pending=common_pb2.Peers(names=view.pending or ()),
        planned=common_pb2.Peers(names=view.planned or ()),
        primary=view.primary,
        primary_lease_expiry_unix_ms=view.primary_expiry_ms,
        has_pending=view.pending is not None,
        has_planned=view.planned is not None,
    )


Req = TypeVar("Req")
Resp = TypeVar("Resp")
StubCall = Callable[[driver_pb2_grpc.PlacementServiceStub], Callable[..., Awaitable[Any]]]


class PlacementServicer(driver_pb2_grpc.PlacementServiceServicer):
    """Protobuf <-> :class:`PlacementAPI`; errors through :data:`STATUS_OF`; writes forwarded."""

    def __init__(self, api: PlacementAPI, *, forward_timeout: float = 10.0) -> None:
        self.api = api
        self.forward_timeout = forward_timeout
        self._channels = ChannelPool(API_PROFILE)

    async def close(self) -> None:
        await self._channels.close()

    @staticmethod
    async def _abort(
        context: grpc.aio.ServicerContext[Any, Any], error: PlacementError
    ) -> NoReturn:
        await abort(context, error, STATUS_OF, grpc.StatusCode.INTERNAL)

    async def _run(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        work: Callable[[], Awaitable[Resp]],
        request: Any = None,
        forward: str | None = None,
    ) -> Resp:
        try:
            return await work()
        except Forward as e:
            metadata = context.invocation_metadata() or ()
            if forward is None or e.address is None or any(m[0] == FORWARDED for m in metadata):
                await self._abort(context, e)
            forwarded: Resp = await self._forward(context, e.address, forward, request)
            return forwarded
        except PlacementError as e:
            await self._abort(context, e)

    async def _forward(
        self, context: grpc.aio.ServicerContext[Any, Any], address: str, method: str, request: Any
    ) -> Any:
        stub = driver_pb2_grpc.PlacementServiceStub(self._channels.get(address))
        try:
            return await getattr(stub, method)(
                request,
                timeout=self.forward_timeout,
                metadata=((FORWARDED, "1"),),
            )
        except grpc.aio.AioRpcError as e:
            code = e.code()
            if code == grpc.StatusCode.UNAVAILABLE or code == grpc.StatusCode.DEADLINE_EXCEEDED:
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"leader at {address} did not answer ({e.details()}); retry",
                )
            await context.abort(code, e.details() or code.name)

    # -- zones ---------------------------------------------------------------------------------

    async def CreateZone(
        self, request: driver_pb2.CreateZoneRequest, context: Any
    ) -> driver_pb2.Zone:
        async def work() -> driver_pb2.Zone:
            spec = spec_from_pb(request.name, request.config)
            return zone_pb(await self.api.create_zone(spec))

        return await self._run(context, work, request, "CreateZone")

    async def AlterZone(
        self, request: driver_pb2.AlterZoneRequest, context: Any
    ) -> driver_pb2.Zone:
        async def work() -> driver_pb2.Zone:
            validate_name(request.name, "zone")
            fields_ = list(request.update_fields)
            altered(
                ZoneSpec(request.name, 1, 1), request.config, fields_
            )  # validate before any leadership or write
            record = await self.api.alter_zone(
                request.name, lambda spec: altered(spec, request.config, fields_)
            )
            return zone_pb(record)

        return await self._run(context, work, request, "AlterZone")

    async def DropZone(
        self, request: driver_pb2.DropZoneRequest, context: Any
    ) -> driver_pb2.DropZoneResponse:
        async def work() -> driver_pb2.DropZoneResponse:
            validate_name(request.name, "zone")
            await self.api.drop_zone(request.name)
            return driver_pb2.DropZoneResponse()

        return await self._run(context, work, request, "DropZone")

    async def GetZone(self, request: driver_pb2.GetZoneRequest, context: Any) -> driver_pb2.Zone:
        async def work() -> driver_pb2.Zone:
            return zone_pb(await self.api.get_zone(request.name))

        return await self._run(context, work)

    async def ListZones(
        self, request: driver_pb2.ListZonesRequest, context: Any
    ) -> driver_pb2.ListZonesResponse:
        async def work() -> driver_pb2.ListZonesResponse:
            _, records = await self.api.list_zones()
            return driver_pb2.ListZonesResponse(zones=[zone_pb(r) for r in records])

        return await self._run(context, work)

    async def GetZoneStatus(
        self, request: driver_pb2.GetZoneRequest, context: Any
    ) -> driver_pb2.ZoneStatus:
        async def work() -> driver_pb2.ZoneStatus:
            s = await self.api.zone_status(request.name)
            return driver_pb2.ZoneStatus(
                name=s.name,
                state=driver_pb2.ZoneState.Value(s.state),
                partitions_total=s.partitions_total,
                partitions_done=s.partitions_done,
                holddown_remaining_seconds=s.holddown_remaining_s,
                revision=s.revision,
            )

        return await self._run(context, work)

    async def ListNodes(
        self, request: driver_pb2.ListNodesRequest, context: Any
    ) -> driver_pb2.ListNodesResponse:
        async def work() -> driver_pb2.ListNodesResponse:
            _, nodes = await self.api.list_nodes()
            return driver_pb2.ListNodesResponse(
                nodes=[
                    driver_pb2.Node(
                        name=n.name,
                        address=n.address,
                        attributes=dict(n.attributes),
                        weight=n.weight,
                    )
                    for n in nodes
                ]
            )

        return await self._run(context, work)

    async def GetAssignments(
        self, request: driver_pb2.GetAssignmentsRequest, context: Any
    ) -> driver_pb2.GetAssignmentsResponse:
        async def work() -> driver_pb2.GetAssignmentsResponse:
            if request.page_size > MAX_PAGE_SIZE:
                raise InvalidInput("page_size", "is too large", f"use 1..{MAX_PAGE_SIZE}")
            token = request.page_token
            if token and not token.isdigit():
                raise InvalidInput("page_token", f"{token!r} is not a token", "pass one back as is")
            revision, views, following = await self.api.assignments(
                request.zone,
                partition=request.partition if request.HasField("partition") else None,
                start=int(token or 0),
                limit=request.page_size,
            )
            return driver_pb2.GetAssignmentsResponse(
                assignments=[partition_pb(v) for v in views],
                revision=revision,
                next_page_token="" if following is None else str(following),
            )

        return await self._run(context, work)

    async def WatchAssignments(
        self, request: driver_pb2.WatchAssignmentsRequest, context: Any
    ) -> AsyncIterator[driver_pb2.AssignmentEvent]:
        try:
            await self.api.get_zone(request.zone)
            async for revision, view in self.api.watch_assignments(
                request.zone, request.from_revision
            ):
                yield driver_pb2.AssignmentEvent(assignment=partition_pb(view), revision=revision)
        except PlacementError as e:
            await self._abort(context, e)

    # -- rebalance control -----------------------------------------------------------------------

    async def CancelRebalance(
        self, request: common_pb2.PartitionRef, context: Any
    ) -> driver_pb2.CancelRebalanceReply:
        async def work() -> driver_pb2.CancelRebalanceReply:
            validate_name(request.zone, "zone")
            accepted, detail = await self.api.cancel(request.zone, request.partition)
            return driver_pb2.CancelRebalanceReply(accepted=accepted, detail=detail)

        return await self._run(context, work, request, "CancelRebalance")

    async def PauseRebalancing(
        self, request: driver_pb2.PauseRequest, context: Any
    ) -> driver_pb2.PauseReply:
        return await self._set_paused(request, context, True, "PauseRebalancing")

    async def ResumeRebalancing(
        self, request: driver_pb2.PauseRequest, context: Any
    ) -> driver_pb2.PauseReply:
        return await self._set_paused(request, context, False, "ResumeRebalancing")

    async def _set_paused(
        self, request: driver_pb2.PauseRequest, context: Any, paused: bool, method: str
    ) -> driver_pb2.PauseReply:
        async def work() -> driver_pb2.PauseReply:
            return driver_pb2.PauseReply(paused=await self.api.set_paused(paused))

        return await self._run(context, work, request, method)


class DriverLike(Leadership, Protocol):
    """A driver instance as ``placectl driver run`` hands it over (``driver.loop.Driver``)."""

    @property
    def client(self) -> EtcdClient: ...

    @property
    def keys(self) -> KeySpace: ...


def add_servicer(server: grpc.aio.Server, api: PlacementAPI) -> PlacementServicer:
    """Add PlacementService on ``api`` to ``server`` (health and reflection are
    :func:`placement.rpc.add_health`'s); call ``servicer.close()`` after ``server.stop()``."""
    servicer = PlacementServicer(api)
    driver_pb2_grpc.add_PlacementServiceServicer_to_server(servicer, server)
    return servicer


def add_to_server(server: grpc.aio.Server, driver: DriverLike) -> Sequence[str]:
    """The hook ``placectl driver run`` calls (health and reflection come from
    :mod:`placement.rpc`): adds PlacementService on ``driver``'s client, key space and
    leadership; returns its full name."""
    add_servicer(server, PlacementAPI(driver.client, driver.keys, driver))
    return [SERVICE_NAME]


async def register(
    server: grpc.aio.Server, api: PlacementAPI
) -> tuple[PlacementServicer, health.aio.HealthServicer]:
    """Add PlacementService, standard health checking (SERVING) and reflection to ``server``.

    Call before ``server.start()``; call ``servicer.close()`` after ``server.stop()``.
    """
    servicer = add_servicer(server, api)
    return servicer, await add_health(server, [SERVICE_NAME])


__all__ = [
    "Forward",
    "Leadership",
    "PlacementAPI",
    "PlacementServicer",
    "ZoneExists",
    "ZoneNotFound",
    "add_servicer",
    "add_to_server",
    "register",
]
