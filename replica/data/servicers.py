"""The data plane's gRPC edge: ``DataService`` (clients) and ``ReplicationService`` (agents).

Protobuf in, domain calls on :class:`~replica.data.plane.DataPlane`, protobuf out (replication
messages convert in :mod:`replica.data.peers`); every domain error becomes a status code in one
place (``_call``, :data:`STATUS_OF`). A request that is not for this node's primary gets
FAILED_PRECONDITION with trailing metadata ``x-primary`` = ``NODE@HOST:PORT`` (empty when
unknown), so clients retry there; one routed under another layout generation than the agent's
gets FAILED_PRECONDITION with ``x-layout`` = ``GENERATION/PARTITIONS`` (design/resharding.md)
and, for a request with a key, ``x-primary`` naming the key's primary under that layout, so
clients retry there at once and re-read the zone's layout; a write refused by a re-sharding seal
waits (up to half its deadline) for the cut-over, then gets UNAVAILABLE with
``x-retry-after-ms`` if the seal still holds, so clients retry that soon instead of backing off.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import grpc

from placement.data.partitioning import validate_key, validate_value
from placement.errors import InvalidInput, PlacementError
from placement.metrics import DATA_SECONDS
from placement.rpc import StatusTable, abort, caller_identity, status_of
from placement.v1 import common_pb2, data_pb2, data_pb2_grpc
from replica.data.model import (
    NotPrimary,
    Sealed,
    Unavailable,
    UnknownZone,
    WrongLayout,
    WrongNode,
)
from replica.data.peers import (
    append_call_from_pb,
    append_reply_to_pb,
    fetch_call_from_pb,
    fetch_reply_to_pb,
)
from replica.data.plane import SEAL_PARK, DataPlane
from replica.protocol import validate_partition_key

log = logging.getLogger(__name__)
T = TypeVar("T")
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

#: Scan's page size when the request asks for 0, and its cap.
DEFAULT_SCAN_LIMIT = 1000  # pages are also capped at 1 MiB of keys plus values
MAX_SCAN_LIMIT = 10_000
PRIMARY_METADATA = "x-primary"
#: Trailing metadata of a request routed under another layout: ``GENERATION/PARTITIONS``.
LAYOUT_METADATA = "x-layout"
#: Trailing metadata of an UNAVAILABLE answer that will change soon: retry after this many ms.
RETRY_AFTER_METADATA = "x-retry-after-ms"
#: Most writes one WriteBatch may carry.
MAX_WRITE_BATCH = 1024


def _limit(limit: int) -> int:
    return DEFAULT_SCAN_LIMIT if limit == 0 else min(limit, MAX_SCAN_LIMIT)


class NotTheCaller(PlacementError):
    """A replication request names another node than the caller's certificate."""


#: The data plane's errors as status codes (any other :class:`PlacementError` is UNAVAILABLE).
STATUS_OF: StatusTable = (
    (NotPrimary, grpc.StatusCode.FAILED_PRECONDITION),
    (WrongLayout, grpc.StatusCode.FAILED_PRECONDITION),
    (WrongNode, grpc.StatusCode.FAILED_PRECONDITION),
    (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (UnknownZone, grpc.StatusCode.NOT_FOUND),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (NotTheCaller, grpc.StatusCode.PERMISSION_DENIED),
)


def _park(context: Context) -> float:
    """How long a sealed write may wait at the agent for the cut-over: half the call's
    remaining deadline (so its answer is never late), at most the plane's own bound."""
    remaining = context.time_remaining()
    return SEAL_PARK if remaining is None else min(SEAL_PARK, remaining / 2)


class DataServicer(data_pb2_grpc.DataServiceServicer):
    def __init__(self, plane: DataPlane) -> None:
        self._plane = plane

    async def Put(self, request: data_pb2.PutRequest, context: Context) -> data_pb2.WriteResponse:
        ref = request.partition
        index, epoch, _ = await _call(
            context,
            ref,
            lambda: self._plane.write(
                ref.zone,
                ref.partition,
                validate_key(request.key),
                validate_value(request.value),
                ref.generation,
                _park(context),
            ),
            op="put",
        )
        return data_pb2.WriteResponse(index=index, lease_epoch=epoch)

    async def Delete(
        self, request: data_pb2.DeleteRequest, context: Context
    ) -> data_pb2.WriteResponse:
        ref = request.partition
        index, epoch, existed = await _call(
            context,
            ref,
            lambda: self._plane.write(
                ref.zone,
                ref.partition,
                validate_key(request.key),
                None,
                ref.generation,
                _park(context),
            ),
            op="delete",
        )
        return data_pb2.WriteResponse(index=index, lease_epoch=epoch, existed=existed)

    async def WriteBatch(
        self, request: data_pb2.WriteBatchRequest, context: Context
    ) -> data_pb2.WriteBatchResponse:
        count = len(request.ops)
        if not 1 <= count <= MAX_WRITE_BATCH:
            error = InvalidInput("ops", f"holds {count} writes", f"send 1..{MAX_WRITE_BATCH}")
            await abort(context, error, STATUS_OF)
        park = _park(context)
        outcomes = await asyncio.gather(*(self._outcome(op, park) for op in request.ops))
        return data_pb2.WriteBatchResponse(outcomes=outcomes)

    async def _outcome(self, op: data_pb2.WriteOp, park: float) -> data_pb2.WriteOutcome:
        """One op of a WriteBatch, answered as Put or Delete would answer it alone."""
        ref = op.partition
        started = time.monotonic()
        name = "delete" if op.delete else "put"
        outcome = "ok"
        try:
            validate_partition_key(ref.zone, ref.partition)
            index, epoch, existed = await self._plane.write(
                ref.zone,
                ref.partition,
                validate_key(op.key),
                None if op.delete else validate_value(op.value),
                ref.generation,
                park,
            )
            result = data_pb2.WriteResponse(index=index, lease_epoch=epoch, existed=existed)
            return data_pb2.WriteOutcome(result=result)
        except PlacementError as e:
            code, trailers = _refusal(e)
            outcome = code.name.lower()
            return data_pb2.WriteOutcome(
                code=code.value[0],
                detail=str(e),
                primary=trailers.get(PRIMARY_METADATA, ""),
                layout=trailers.get(LAYOUT_METADATA, ""),
                retry_after_ms=int(trailers.get(RETRY_AFTER_METADATA, "0")),
            )
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except Exception as e:  # a bug: this op's alone, never its neighbours' (applied or not)
            log.exception("%s %s/%s in a WriteBatch failed", name, ref.zone, ref.partition)
            outcome = "unknown"
            return data_pb2.WriteOutcome(
                code=grpc.StatusCode.UNKNOWN.value[0], detail=f"{type(e).__name__}: {e}"
            )
        finally:
            DATA_SECONDS.labels(name, outcome).observe(time.monotonic() - started)

    async def Get(self, request: data_pb2.GetRequest, context: Context) -> data_pb2.GetResponse:
        ref = request.partition
        value = await _call(
            context,
            ref,
            lambda: self._plane.get(
                ref.zone, ref.partition, validate_key(request.key), ref.generation
            ),
            op="get",
        )
        return data_pb2.GetResponse(found=value is not None, value=value or b"")

    async def Scan(self, request: data_pb2.ScanRequest, context: Context) -> data_pb2.ScanResponse:
        ref = request.partition
        items, more = await _call(
            context,
            ref,
            lambda: self._plane.scan(
                ref.zone,
                ref.partition,
                request.prefix,
                request.start_after,
                _limit(request.limit),
                ref.generation,
            ),
            op="scan",
        )
        return data_pb2.ScanResponse(
            items=[data_pb2.KeyValue(key=k, value=v) for k, v in items], more=more
        )


def _speaks_for_itself(context: Context, node: str, field: str) -> None:
    """Over TLS a node speaks only for itself: ``node`` (a replication request's sender, or a
    learner fetching to join the in-sync set) must be the name in the caller's certificate;
    else :class:`NotTheCaller` naming ``field`` (PERMISSION_DENIED)."""
    who = caller_identity(context)
    if who is not None and who.name != node:
        raise NotTheCaller(
            f"{field} {node!r} is not the caller: its certificate names {who.name!r}"
        )


#: Requests of one ``Replicate`` stream answered at once (the sender keeps fewer unanswered); the
#: stream is not read further until the oldest is answered.
STREAM_AHEAD = 8


class ReplicationServicer(data_pb2_grpc.ReplicationServiceServicer):
    def __init__(self, plane: DataPlane) -> None:
        self._plane = plane
        self._streams: set[asyncio.Queue[asyncio.Task[data_pb2.ReplicateResponse] | None]] = set()
        self._closing = False

    async def Replicate(
        self, requests: AsyncIterator[data_pb2.ReplicateRequest], context: Context
    ) -> AsyncIterator[data_pb2.ReplicateResponse]:
        """The pair stream: each request's appends are answered in one group commit (an empty
        request is the pair's heartbeat). Requests are answered concurrently (at most
        ``STREAM_AHEAD`` at once: the stream is not read further meanwhile), so batches
        pipeline, and the answers go out in request order. A request that is not the sender's
        to make or not for this node ends the stream with its status; :meth:`close` (the agent
        stops) ends every stream, so the server's stop does not wait out its grace for them."""
        slots = asyncio.Semaphore(STREAM_AHEAD)
        answers: asyncio.Queue[asyncio.Task[data_pb2.ReplicateResponse] | None] = asyncio.Queue()
        self._streams.add(answers)

        async def read() -> None:
            try:
                async for request in requests:
                    await slots.acquire()  # before the task: none is left unowned
                    answers.put_nowait(asyncio.create_task(self._answer(request, context)))
            finally:
                answers.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (answer := await answers.get()) is not None:
                try:
                    reply = await answer
                except PlacementError as e:
                    await abort(context, e, STATUS_OF)
                finally:
                    slots.release()
                yield reply
            if not self._closing:
                await reader  # the request stream's own error, if any
        finally:
            self._streams.discard(answers)
            reader.cancel()
            left: list[asyncio.Task[object]] = [reader]
            while not answers.empty():
                if (task := answers.get_nowait()) is not None:
                    task.cancel()
                    left.append(task)
            await asyncio.gather(*left, return_exceptions=True)  # retrieved, never logged

    def close(self) -> None:
        """End every pair stream (the agent stops): the senders see it end and fail over."""
        self._closing = True
        for answers in list(self._streams):
            answers.put_nowait(None)

    async def _answer(
        self, request: data_pb2.ReplicateRequest, context: Context
    ) -> data_pb2.ReplicateResponse:
        self._plane.check_replicate(request.from_node, request.to_node, len(request.appends))
        _speaks_for_itself(context, request.from_node, "from_node")
        if not request.appends:
            return data_pb2.ReplicateResponse()
        for i, append in enumerate(request.appends):
            try:
                validate_partition_key(append.partition.zone, append.partition.partition)
            except InvalidInput as e:
                raise InvalidInput(f"appends[{i}].partition.{e.field}", e.problem, e.fix) from e
        replies = await self._plane.append_many(
            [append_call_from_pb(append) for append in request.appends], request.from_node
        )
        return data_pb2.ReplicateResponse(replies=[append_reply_to_pb(r) for r in replies])

    async def Fetch(
        self, request: data_pb2.FetchRequest, context: Context
    ) -> data_pb2.FetchResponse:
        try:
            _speaks_for_itself(context, request.node, "node")
        except NotTheCaller as e:
            await abort(context, e, STATUS_OF)
        try:
            reply = await _call(
                context,
                request.partition,
                lambda: self._plane.fetch(fetch_call_from_pb(request)),
                not_primary_aborts=False,
            )
        except NotPrimary as e:
            context.set_trailing_metadata(((PRIMARY_METADATA, e.primary),))
            return data_pb2.FetchResponse(outcome=data_pb2.FETCH_NOT_PRIMARY)
        return fetch_reply_to_pb(reply)

    async def ReadReplica(
        self, request: data_pb2.ReadReplicaRequest, context: Context
    ) -> data_pb2.ReadReplicaResponse:
        ref = request.partition
        page = await _call(
            context,
            ref,
            lambda: self._plane.read_replica(
                ref.zone, ref.partition, request.start_after, _limit(request.limit)
            ),
        )
        return data_pb2.ReadReplicaResponse(
            hosted=page.hosted,
            items=[data_pb2.KeyValue(key=k, value=v) for k, v in page.items],
            more=page.more,
            last_index=page.last_index,
            commit_index=page.commit_index,
        )


async def _call(
    context: Context,
    ref: common_pb2.PartitionRef,
    work: Callable[[], Awaitable[T]],
    *,
    not_primary_aborts: bool = True,
    op: str | None = None,
) -> T:
    """``work()`` on the partition ``ref`` (validated first), its errors as status codes
    (:data:`STATUS_OF`); NOT-primary also names the primary in ``x-primary`` — or is raised to
    the caller when not ``not_primary_aborts``. With ``op``, its latency and outcome go to
    ``placement_data_request_seconds``."""
    started = time.monotonic()
    outcome = "ok"
    try:
        return await _answered(context, ref, work, not_primary_aborts)
    except asyncio.CancelledError:
        outcome = "cancelled"  # the caller went away (or its deadline passed)
        raise
    except BaseException:
        code = context.code()
        outcome = code.name.lower() if code not in (None, grpc.StatusCode.OK) else "error"
        raise
    finally:
        if op is not None:
            DATA_SECONDS.labels(op, outcome).observe(time.monotonic() - started)


def _refusal(error: PlacementError) -> tuple[grpc.StatusCode, dict[str, str]]:
    """The status code of a refused data request and the trailing metadata that tells the
    client where to go next (the primary, the layout, when to retry)."""
    trailers: dict[str, str] = {}
    if isinstance(error, NotPrimary):
        trailers[PRIMARY_METADATA] = error.primary
    elif isinstance(error, WrongLayout):
        trailers[LAYOUT_METADATA] = error.layout
        if error.primary:
            trailers[PRIMARY_METADATA] = error.primary
    elif isinstance(error, Sealed):
        trailers[RETRY_AFTER_METADATA] = str(error.retry_after_ms)
    return status_of(error, STATUS_OF, grpc.StatusCode.UNAVAILABLE), trailers


async def _answered(
    context: Context,
    ref: common_pb2.PartitionRef,
    work: Callable[[], Awaitable[T]],
    not_primary_aborts: bool,
) -> T:
    try:
        validate_partition_key(ref.zone, ref.partition)
        return await work()
    except PlacementError as e:
        if isinstance(e, NotPrimary) and not not_primary_aborts:
            raise
        code, trailers = _refusal(e)
        if trailers:
            context.set_trailing_metadata(tuple(trailers.items()))
        await context.abort(code, str(e))
        raise AssertionError("unreachable: context.abort raises") from e
