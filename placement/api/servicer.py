"""The gRPC edge of the placement API: ``PlacementService`` over a :class:`PlacementAPI`.

Protobuf -> domain, domain -> protobuf, one error table (:data:`STATUS_OF`), forwarding of writes
to the leader (one hop), and the server hooks the driver process uses (design/control-plane.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

import grpc
from grpc_health.v1 import health

from placement.api.service import (
    MAX_PAGE_SIZE,
    Forward,
    Leadership,
    NodeStatusView,
    PartitionView,
    PlacementAPI,
    ReadOptions,
    ZoneExists,
    ZoneNotFound,
    make_spec,
)
from placement.core.layout import Reshard, ReshardRunning, ZoneLayout
from placement.core.model import ZoneSpec
from placement.core.names import validate_name
from placement.core.zonespec import ALTERABLE
from placement.driver.preview import Preview
from placement.errors import (
    Compacted,
    Conflict,
    InvalidInput,
    NotLeader,
    PlacementError,
    StoreFull,
    StoreUnavailable,
)
from placement.metastore.codec import Corrupt, LayoutValue
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeySpace
from placement.metastore.readcache import ReadCache
from placement.metastore.transitions import ZoneRecord
from placement.rpc import API_PROFILE, ChannelPool, StatusTable, abort, add_health
from placement.security.tls import TlsMaterial
from placement.v1 import common_pb2, driver_pb2, driver_pb2_grpc

if TYPE_CHECKING:
    from placement.driver.health import EtcdHealth

#: How ZoneConfig names the ZoneSpec fields it names differently.
_PROTO_FIELD = {
    "scale_up_delay": "scale_up_delay_seconds",
    "scale_down_delay": "scale_down_delay_seconds",
}

#: Metadata set on a forwarded call, so that it is forwarded at most once.
FORWARDED = "x-placement-forwarded"

SERVICE_NAME: str = driver_pb2.DESCRIPTOR.services_by_name["PlacementService"].full_name

# -- the gRPC edge -----------------------------------------------------------------------------

STATUS_OF: StatusTable = (
    (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (ReshardRunning, grpc.StatusCode.FAILED_PRECONDITION),
    (ZoneNotFound, grpc.StatusCode.NOT_FOUND),
    (ZoneExists, grpc.StatusCode.ALREADY_EXISTS),
    (Conflict, grpc.StatusCode.ABORTED),
    (Compacted, grpc.StatusCode.OUT_OF_RANGE),
    (NotLeader, grpc.StatusCode.UNAVAILABLE),
    (Forward, grpc.StatusCode.UNAVAILABLE),
    # Every driver shares the one etcd: another endpoint cannot help, the operator must.
    (StoreFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (StoreUnavailable, grpc.StatusCode.UNAVAILABLE),
)


def config_pb(spec: ZoneSpec) -> driver_pb2.ZoneConfig:
    return driver_pb2.ZoneConfig(
        partitions=spec.partitions,
        replicas=spec.replicas,
        node_selector=dict(spec.node_selector),
        failure_domain=spec.failure_domain or "",
        scale_up_delay_seconds=spec.scale_up_delay,
        scale_down_delay_seconds=spec.scale_down_delay,
        min_in_sync=spec.min_in_sync or 0,
    )


def zone_pb(record: ZoneRecord) -> driver_pb2.Zone:
    spec = record.spec
    if isinstance(spec, Corrupt):
        return driver_pb2.Zone(name=record.name, revision=record.mod_revision)
    return driver_pb2.Zone(
        name=record.name,
        config=config_pb(spec),
        revision=record.mod_revision,
        layout=layout_pb(record.layout.layout) if isinstance(record.layout, LayoutValue) else None,
    )


def reshard_pb(r: Reshard) -> driver_pb2.Reshard:
    return driver_pb2.Reshard(
        attempt=r.attempt, source=r.source, target=r.target, phase=r.phase.value
    )


def layout_pb(layout: ZoneLayout) -> driver_pb2.ZoneLayout:
    r = layout.reshard
    return driver_pb2.ZoneLayout(
        generation=layout.generation,
        partitions=layout.partitions,
        reshard=None if r is None else reshard_pb(r),
    )


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

    def __init__(
        self,
        api: PlacementAPI,
        *,
        forward_timeout: float = 10.0,
        tls: TlsMaterial | None = None,
    ) -> None:
        self.api = api
        self.forward_timeout = forward_timeout
        self._channels = ChannelPool(API_PROFILE, tls)
        # (zone, partition) -> the last view converted and its message: the API hands out the
        # same view object while the partition is unchanged (PlacementAPI._cached_views).
        self._messages: dict[
            tuple[str, int], tuple[PartitionView, driver_pb2.PartitionAssignment]
        ] = {}

    async def close(self) -> None:
        await self._channels.close()

    def _partition_pb(self, zone: str, view: PartitionView) -> driver_pb2.PartitionAssignment:
        at = (zone, view.partition)
        hit = self._messages.get(at)
        if hit is None or hit[0] is not view:
            if len(self._messages) > MESSAGE_MEMO:
                self._messages.clear()  # a bound, not a policy: rebuilt on the next reads
            hit = self._messages[at] = (view, partition_pb(view))
        return hit[1]

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
            s = await self.api.zone_status(request.name, read_options(request.read))
            status = driver_pb2.ZoneStatus(
                name=s.name,
                state=driver_pb2.ZoneState.Value(s.state),
                partitions_total=s.partitions_total,
                partitions_done=s.partitions_done,
                holddown_remaining_seconds=s.holddown_remaining_s,
                revision=s.revision,
                details=list(s.details),
                eligible_nodes=s.eligible_nodes,
                under_replicated=s.under_replicated,
                partitions_off_target=s.off_target,
            )
            if s.rebalance is not None:
                status.bytes_to_move = s.rebalance.bytes_to_move
                status.eta_seconds = s.rebalance.eta_s
            if s.reshard is not None:
                r = s.reshard
                status.reshard.CopyFrom(reshard_pb(r.reshard))
                status.keys_copied = r.keys_copied
                status.bytes_copied = r.bytes_copied
                status.bytes_to_copy = r.bytes_to_copy
                status.eta_seconds = r.eta_s
            return status

        return await self._run(context, work)

    async def ListNodes(
        self, request: driver_pb2.ListNodesRequest, context: Any
    ) -> driver_pb2.ListNodesResponse:
        async def work() -> driver_pb2.ListNodesResponse:
            revision, nodes = await self.api.list_nodes(read_options(request.read))
            return driver_pb2.ListNodesResponse(
                revision=revision,
                nodes=[
                    driver_pb2.Node(
                        name=n.name,
                        address=n.address,
                        attributes=dict(n.attributes),
                        weight=n.weight,
                    )
                    for n in nodes
                ],
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
                read=read_options(request.read),
            )
            return driver_pb2.GetAssignmentsResponse(
                assignments=[self._partition_pb(request.zone, v) for v in views],
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

    async def CancelReshard(
        self, request: driver_pb2.CancelReshardRequest, context: Any
    ) -> driver_pb2.CancelRebalanceReply:
        async def work() -> driver_pb2.CancelRebalanceReply:
            validate_name(request.zone, "zone")
            accepted, detail = await self.api.cancel_reshard(request.zone)
            return driver_pb2.CancelRebalanceReply(accepted=accepted, detail=detail)

        return await self._run(context, work, request, "CancelReshard")

    async def PauseRebalancing(
        self, request: driver_pb2.PauseRequest, context: Any
    ) -> driver_pb2.PauseReply:
        return await self._set_paused(request, context, True, "PauseRebalancing")

    async def ResumeRebalancing(
        self, request: driver_pb2.PauseRequest, context: Any
    ) -> driver_pb2.PauseReply:
        return await self._set_paused(request, context, False, "ResumeRebalancing")

    async def DrainNode(
        self, request: driver_pb2.DrainNodeRequest, context: Any
    ) -> driver_pb2.NodeStatus:
        async def work() -> driver_pb2.NodeStatus:
            return node_status_pb(await self.api.drain(request.node, request.drain))

        return await self._run(context, work, request, "DrainNode")

    async def CordonNode(
        self, request: driver_pb2.CordonNodeRequest, context: Any
    ) -> driver_pb2.NodeStatus:
        async def work() -> driver_pb2.NodeStatus:
            return node_status_pb(await self.api.cordon(request.node, request.cordon))

        return await self._run(context, work, request, "CordonNode")

    async def GetNodeStatus(
        self, request: driver_pb2.GetNodeStatusRequest, context: Any
    ) -> driver_pb2.NodeStatus:
        async def work() -> driver_pb2.NodeStatus:
            return node_status_pb(await self.api.node_status(request.node))

        return await self._run(context, work)

    async def Plan(self, request: driver_pb2.PlanRequest, context: Any) -> driver_pb2.PlanReply:
        async def work() -> driver_pb2.PlanReply:
            which = request.WhichOneof("change")
            if which == "alter_zone":
                alter = request.alter_zone
                validate_name(alter.name, "alter_zone.name")
                fields_ = list(alter.update_fields)
                altered(ZoneSpec(alter.name, 1, 1), alter.config, fields_)  # validate first
                found = await self.api.plan_alter(
                    alter.name, lambda spec: altered(spec, alter.config, fields_)
                )
            elif which == "drain_node":
                found = await self.api.plan_drain(request.drain_node)
            else:
                raise InvalidInput("change", "is not set", "set alter_zone or drain_node")
            return plan_pb(found)

        return await self._run(context, work)

    async def _set_paused(
        self, request: driver_pb2.PauseRequest, context: Any, paused: bool, method: str
    ) -> driver_pb2.PauseReply:
        async def work() -> driver_pb2.PauseReply:
            return driver_pb2.PauseReply(paused=await self.api.set_paused(paused))

        return await self._run(context, work, request, method)


#: Converted partition messages kept at most (a fleet's worth of partitions read through one
#: instance); beyond it the memo starts over.
MESSAGE_MEMO = 200_000


def read_options(read: driver_pb2.ReadOptions) -> ReadOptions:
    return ReadOptions(read.min_revision, read.linearizable)


def plan_pb(found: Preview) -> driver_pb2.PlanReply:
    return driver_pb2.PlanReply(
        revision=found.revision,
        zones=[
            driver_pb2.ZonePlan(
                zone=z.zone,
                config=config_pb(z.spec),
                moves=[
                    driver_pb2.PlannedMove(
                        partition=c.partition,
                        before=common_pb2.Peers(names=c.before),
                        after=common_pb2.Peers(names=c.after),
                        bytes=c.bytes,
                    )
                    for c in z.changes
                ],
                loads=[
                    driver_pb2.NodeLoad(
                        node=n.node,
                        replicas_before=n.replicas_before,
                        replicas_after=n.replicas_after,
                        leases_handed_over=n.leases_handed_over,
                    )
                    for n in z.loads
                ],
                replicas_added=z.replicas_added,
                replicas_removed=z.replicas_removed,
                bytes_to_move=z.bytes_to_move,
                reshard_source=z.reshard[0] if z.reshard else 0,
                reshard_target=z.reshard[1] if z.reshard else 0,
                reshard_bytes=z.reshard_bytes,
                unplaceable=z.unplaceable,
                notes=z.notes,
            )
            for z in found.zones
        ],
    )


def node_status_pb(s: NodeStatusView) -> driver_pb2.NodeStatus:
    return driver_pb2.NodeStatus(
        node=s.node,
        registered=s.registered,
        draining=s.draining,
        stopping=s.stopping,
        replicas=s.replicas,
        primaries=s.primaries,
        safe_to_stop=s.safe_to_stop,
        revision=s.revision,
        cordoned=s.cordoned,
    )


class DriverLike(Leadership, Protocol):
    """A driver instance as ``placectl driver run`` hands it over (``driver.loop.Driver``)."""

    @property
    def client(self) -> EtcdClient: ...

    @property
    def keys(self) -> KeySpace: ...

    @property
    def tls(self) -> TlsMaterial | None: ...

    @property
    def etcd_health(self) -> EtcdHealth: ...


def add_servicer(
    server: grpc.aio.Server, api: PlacementAPI, tls: TlsMaterial | None = None
) -> PlacementServicer:
    """Add PlacementService on ``api`` to ``server`` (health and reflection are
    :func:`placement.rpc.add_health`'s); call ``servicer.close()`` after ``server.stop()``.
    ``tls``: the certificate it forwards writes to the leader with."""
    servicer = PlacementServicer(api, tls=tls)
    driver_pb2_grpc.add_PlacementServiceServicer_to_server(servicer, server)
    return servicer


def add_to_server(
    server: grpc.aio.Server, driver: DriverLike, cache: ReadCache | None = None
) -> Sequence[str]:
    """The hook ``placectl driver run`` calls (health and reflection come from
    :mod:`placement.rpc`): adds PlacementService on ``driver``'s client, key space and
    leadership, answering reads from ``cache`` when given; returns its full name."""
    api = PlacementAPI(
        driver.client, driver.keys, driver, cache=cache, alarms=driver.etcd_health.details
    )
    add_servicer(server, api, driver.tls)
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
