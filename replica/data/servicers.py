"""The data plane's gRPC edge: ``DataService`` (clients) and ``ReplicationService`` (agents).

Protobuf in, domain calls on :class:`~replica.data.plane.DataPlane`, protobuf out (replication
messages convert in :mod:`replica.data.peers`); every domain
error becomes a status code in one place (``_call``). A request that is not for this node's
primary gets FAILED_PRECONDITION with trailing metadata ``x-primary`` = ``NODE@HOST:PORT`` (empty
when unknown), so clients retry there.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeAlias, TypeVar

import grpc

from placement.data.partitioning import validate_key, validate_value
from placement.errors import InvalidInput, PlacementError
from placement.v1 import data_pb2, data_pb2_grpc
from replica.data.model import NotPrimary, Unavailable, UnknownZone
from replica.data.peers import (
    append_call_from_pb,
    append_reply_to_pb,
    fetch_call_from_pb,
    fetch_reply_to_pb,
)
from replica.data.plane import DataPlane
from replica.protocol import validate_partition_key

T = TypeVar("T")
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

#: Scan's page size when the request asks for 0, and its cap.
DEFAULT_SCAN_LIMIT = 1000  # pages are also capped at 1 MiB of keys plus values
MAX_SCAN_LIMIT = 10_000
PRIMARY_METADATA = "x-primary"


def _limit(limit: int) -> int:
    return DEFAULT_SCAN_LIMIT if limit == 0 else min(limit, MAX_SCAN_LIMIT)


class DataServicer(data_pb2_grpc.DataServiceServicer):
    def __init__(self, plane: DataPlane) -> None:
        self._plane = plane

    async def Put(self, request: data_pb2.PutRequest, context: Context) -> data_pb2.WriteResponse:
        ref = request.partition

        async def work() -> tuple[int, int, bool]:
            validate_partition_key(ref.zone, ref.partition)
            key = validate_key(request.key)
            value = validate_value(request.value)
            return await self._plane.write(ref.zone, ref.partition, key, value)

        index, epoch, _ = await _call(context, work())
        return data_pb2.WriteResponse(index=index, lease_epoch=epoch)

    async def Delete(
        self, request: data_pb2.DeleteRequest, context: Context
    ) -> data_pb2.WriteResponse:
        ref = request.partition

        async def work() -> tuple[int, int, bool]:
            validate_partition_key(ref.zone, ref.partition)
            return await self._plane.write(ref.zone, ref.partition, validate_key(request.key), None)

        index, epoch, existed = await _call(context, work())
        return data_pb2.WriteResponse(index=index, lease_epoch=epoch, existed=existed)

    async def Get(self, request: data_pb2.GetRequest, context: Context) -> data_pb2.GetResponse:
        ref = request.partition

        async def work() -> bytes | None:
            validate_partition_key(ref.zone, ref.partition)
            return await self._plane.get(ref.zone, ref.partition, validate_key(request.key))

        value = await _call(context, work())
        return data_pb2.GetResponse(found=value is not None, value=value or b"")

    async def Scan(self, request: data_pb2.ScanRequest, context: Context) -> data_pb2.ScanResponse:
        ref = request.partition

        async def work() -> tuple[list[tuple[bytes, bytes]], bool]:
            validate_partition_key(ref.zone, ref.partition)
            return await self._plane.scan(
                ref.zone, ref.partition, request.prefix, request.start_after, _limit(request.limit)
            )

        items, more = await _call(context, work())
        return data_pb2.ScanResponse(
            items=[data_pb2.KeyValue(key=k, value=v) for k, v in items], more=more
        )


class ReplicationServicer(data_pb2_grpc.ReplicationServiceServicer):
    def __init__(self, plane: DataPlane) -> None:
        self._plane = plane

    async def Append(
        self, request: data_pb2.AppendRequest, context: Context
    ) -> data_pb2.AppendResponse:
        ref = request.partition

        async def work() -> data_pb2.AppendResponse:
            validate_partition_key(ref.zone, ref.partition)
            return append_reply_to_pb(await self._plane.append(append_call_from_pb(request)))

        return await _call(context, work())

    async def Fetch(
        self, request: data_pb2.FetchRequest, context: Context
    ) -> data_pb2.FetchResponse:
        ref = request.partition

        async def work() -> data_pb2.FetchResponse:
            validate_partition_key(ref.zone, ref.partition)
            return fetch_reply_to_pb(await self._plane.fetch(fetch_call_from_pb(request)))

        try:
            return await _call(context, work(), not_primary_aborts=False)
        except NotPrimary as e:
            context.set_trailing_metadata(((PRIMARY_METADATA, e.primary),))
            return data_pb2.FetchResponse(outcome=data_pb2.FETCH_NOT_PRIMARY)

    async def ReadReplica(
        self, request: data_pb2.ReadReplicaRequest, context: Context
    ) -> data_pb2.ReadReplicaResponse:
        ref = request.partition

        async def work() -> data_pb2.ReadReplicaResponse:
            validate_partition_key(ref.zone, ref.partition)
            page = await self._plane.read_replica(
                ref.zone, ref.partition, request.start_after, _limit(request.limit)
            )
            return data_pb2.ReadReplicaResponse(
                hosted=page.hosted,
                items=[data_pb2.KeyValue(key=k, value=v) for k, v in page.items],
                more=page.more,
                last_index=page.last_index,
                commit_index=page.commit_index,
            )

        return await _call(context, work())


async def _call(context: Context, work: Awaitable[T], *, not_primary_aborts: bool = True) -> T:
    """The one translation table from domain errors to gRPC status codes."""
    try:
        return await work
    except NotPrimary as e:
        if not not_primary_aborts:
            raise
        context.set_trailing_metadata(((PRIMARY_METADATA, e.primary),))
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
    except InvalidInput as e:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
    except UnknownZone as e:
        await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
    except Unavailable as e:
        await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
    except PlacementError as e:
        await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
    raise AssertionError("unreachable: context.abort raises")
