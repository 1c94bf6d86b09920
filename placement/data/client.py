"""The routing client of the data plane: put, get, delete and scan by key, sent to the primary.

A client learns, per zone and from the placement drivers (``GetZone``, ``GetAssignments``,
``ListNodes``), the zone's layout in force (generation and partition count), each partition's
primary and stable members and every node's address, and caches them (:class:`ZoneRoutes`). A key
goes to ``partition_of(key, P)``'s primary, P being the layout's count.

Answers and what the client does (:func:`decide`, pure):

* ``FAILED_PRECONDITION`` with trailing ``x-primary = NODE@HOST:PORT``: the agent is not the
  primary and names it: retry there at once (at most ``MAX_REDIRECTS`` hops in a row, then as
  below). Without a usable hint: the same as unavailable.
* ``FAILED_PRECONDITION`` with trailing ``x-layout = GENERATION/PARTITIONS``: the request was
  routed under another layout generation than the agent's (design/resharding.md): re-read the
  zone's layout and route again at once (counted like a redirect). Every request carries the
  generation its routes were read under. When the agent also names, in ``x-primary``, the
  primary of the key's partition under its layout, the request goes there at once under that
  layout, and the zone's routes are re-read beside it (calls keep the cached table meanwhile):
  after a re-sharding's flip no write waits for the drivers.
* ``UNAVAILABLE`` with trailing ``x-retry-after-ms = N`` (a write refused while its partition
  is sealed for a re-sharding cut-over, which lasts a fraction of a second): retry at the same
  target after N ms (at most ``MAX_RETRY_AFTER``), routes kept, no backoff.
* ``UNAVAILABLE``, ``DEADLINE_EXCEEDED``, ``ABORTED``, ``NOT_FOUND``, ``CANCELLED`` (the agent
  stopped the call: its server shutting down after a SIGTERM — as after a dropped connection,
  the write may or may not have been applied, and a put or delete sent again is the same
  write), a connection error, or no primary known: re-read the routes from the drivers and
  retry with capped, jittered exponential backoff until ``deadline`` (default 15 s) has passed
  since the call began; then :class:`DataUnavailable` names the operation, partition, target
  and last error. (A call this client cancels itself raises ``asyncio.CancelledError``, never
  this code.)
* ``INVALID_ARGUMENT``: :class:`~placement.errors.InvalidInput` (after one route refresh, in case
  the zone's partition count changed under a cached table).
* ``PERMISSION_DENIED``, ``UNAUTHENTICATED``, or a TLS handshake that refused a certificate:
  :class:`~placement.errors.CredentialError` at once (retrying cannot help).
* Anything else: :class:`DataRequestFailed`.

Writes to one agent travel together: every put and delete a client has ready for an agent while
its previous ``WriteBatch`` to that agent is in flight goes out in the next one (no timer: a lone
write goes at once; at most ``WRITE_BATCH_OPS`` writes and about ``WRITE_BATCH_BYTES`` per
call). Each write is answered on its own, with what ``Put`` or ``Delete`` would have answered, and
goes through the rules above alone. An agent that does not know ``WriteBatch`` (UNIMPLEMENTED)
gets single calls for ``UNBATCHED_FOR`` seconds, then is tried again.

A retried ``put`` is idempotent (a whole-value write); a retried ``delete`` may report
``existed=False`` when an earlier, unanswered attempt already removed the key. An error after an
unanswered attempt means the outcome is unknown, never that nothing happened.

One gRPC channel per agent address, reused by every call. Protobuf stays in this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol, TypeVar

import grpc

from placement.aio import Coalescer
from placement.api.client import ApiError, PlacementClient, parse_endpoints
from placement.core.closing import AsyncClosing
from placement.core.retry import Clock, RetryPolicy, Rng
from placement.data.partitioning import partition_of, validate_key, validate_value
from placement.errors import CredentialError, InvalidInput, PlacementError
from placement.rpc import DATA_PROFILE, ChannelPool
from placement.security.credentials import handshake_refused
from placement.security.tls import TlsMaterial
from placement.v1 import common_pb2, data_pb2, data_pb2_grpc, driver_pb2

if TYPE_CHECKING:
    DataStub = data_pb2_grpc.DataServiceAsyncStub
    ReplicationStub = data_pb2_grpc.ReplicationServiceAsyncStub

T = TypeVar("T")

#: Redirect hops followed without a pause before the client backs off and refreshes instead.
MAX_REDIRECTS = 3
#: Scan page size asked of the agents (their default is 1000 too).
SCAN_PAGE = 1000
#: Partitions whose first scan page is fetched concurrently.
SCAN_FANOUT = 16
PRIMARY_HEADER = "x-primary"
LAYOUT_HEADER = "x-layout"
RETRY_AFTER_HEADER = "x-retry-after-ms"
#: The longest ``x-retry-after-ms`` honoured (a larger or malformed one means: back off).
MAX_RETRY_AFTER = 1.0
WRITES = frozenset({"put", "delete"})
#: Most writes one WriteBatch carries (the agents' own bound), and about most bytes.
WRITE_BATCH_OPS = 1024
WRITE_BATCH_BYTES = 4 << 20
#: Seconds an agent that does not know WriteBatch gets single calls before it is tried again.
UNBATCHED_FOR = 60.0

RETRY_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.CANCELLED,
    }
)
#: Codes that say the caller's certificate (its role) is refused.
CREDENTIAL_CODES = frozenset({grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED})


# -- errors ------------------------------------------------------------------------------------


class DataUnavailable(PlacementError):
    """No primary of the partition answered before the deadline; the outcome of a write that was
    sent at least once is unknown."""

    def __init__(self, op: str, zone: str, partition: int | None, last: str, waited: float) -> None:
        self.op = op
        self.zone = zone
        self.partition = partition
        self.last = last
        where = f"{zone}/{partition}" if partition is not None else zone
        unknown = "; the write may or may not have happened" if op in WRITES else ""
        super().__init__(f"{op} {where}: gave up after {waited:.1f}s (last: {last}){unknown}")


class LayoutMoved(PlacementError):
    """A call pinned to a layout generation found the zone at another one (a re-sharding
    flipped; design/resharding.md): the caller starts over under the new layout."""

    def __init__(self, zone: str, pinned: int, now: int) -> None:
        self.zone = zone
        super().__init__(f"zone {zone} moved from layout generation {pinned} to {now}")


class ClientClosed(PlacementError):
    """The :class:`DataClient` was closed while the call was under way."""


class DataRequestFailed(PlacementError):
    """An agent answered with an error that retrying does not fix (``code``, ``detail``)."""

    def __init__(self, op: str, zone: str, code: grpc.StatusCode, detail: str, target: str) -> None:
        self.code = code
        self.detail = detail
        super().__init__(f"{op} {zone}: {target} answered {code.name}: {detail or 'no detail'}")


# -- domain values -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WriteResult:
    """An acknowledged write: its replication-log ``index`` and primary ``lease_epoch``."""

    index: int
    lease_epoch: int
    existed: bool = False


@dataclass(frozen=True, slots=True)
class PrimaryHint:
    """A parsed ``x-primary`` value: ``node`` serves at ``address`` (HOST:PORT)."""

    node: str
    address: str


@dataclass(frozen=True, slots=True)
class PartitionRoute:
    """``primary`` = node name ("" = none known); ``stable`` = the replicas, preferred first."""

    primary: str = ""
    stable: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ZoneRoutes:
    """One zone's routing table as read from the drivers (``routes[p]`` for partition ``p``)."""

    zone: str
    partitions: int
    routes: tuple[PartitionRoute, ...]
    addresses: Mapping[str, str]
    generation: int = 0
    #: The zone's layout generation the table was read under (design/resharding.md); every
    #: request carries it (0: the zone has no layout yet).
    layout: int = 0

    def route(self, partition: int) -> PartitionRoute:
        if 0 <= partition < len(self.routes):
            return self.routes[partition]
        return PartitionRoute()

    def with_primary(self, partition: int, hint: PrimaryHint) -> ZoneRoutes:
        """The table after an agent named ``hint`` as ``partition``'s primary (same generation)."""
        routes = list(self.routes)
        while len(routes) <= partition:
            routes.append(PartitionRoute())
        routes[partition] = replace(routes[partition], primary=hint.node)
        addresses = {**self.addresses, hint.node: hint.address}
        return replace(self, routes=tuple(routes), addresses=addresses)


@dataclass(frozen=True, slots=True)
class ReplicaCopy:
    """One replica's own data as ``ReadReplica`` returned it (``hosted=False``: no copy)."""

    node: str
    hosted: bool
    items: Mapping[bytes, bytes]
    last_index: int = 0
    commit_index: int = 0


# -- pure decisions ----------------------------------------------------------------------------


def parse_primary_hint(text: str | None) -> PrimaryHint | None:
    """``"NODE@HOST:PORT"`` -> hint; ``None`` for absent, empty or malformed values."""
    if not text:
        return None
    node, sep, address = text.strip().partition("@")
    if not sep or not node:
        return None
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return PrimaryHint(node, address)


def header_value(metadata: Iterable[tuple[str, str | bytes]] | None, name: str) -> str | None:
    """The first value of header ``name`` (case-insensitive) in gRPC metadata, or None."""
    if metadata is None:
        return None
    wanted = name.lower()
    for key, value in metadata:
        if key.lower() == wanted:
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return None


@dataclass(frozen=True, slots=True)
class Redirect:
    """Retry at once at the named primary."""

    hint: PrimaryHint


@dataclass(frozen=True, slots=True)
class Retry:
    """Refresh the routes, back off, retry (``reason`` is kept for the final error)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Relayout:
    """The agent is at another layout generation: re-read the zone's layout and route again
    at once (design/resharding.md). With ``layout`` (the agent's ``(generation, partitions)``)
    and ``hint`` (the primary, in the agent's view, of the key's partition under it): send the
    request there at once under that layout while the zone's routes are re-read beside it."""

    reason: str
    layout: tuple[int, int] | None = None
    hint: PrimaryHint | None = None


def parse_layout(text: str | None) -> tuple[int, int] | None:
    """``"GENERATION/PARTITIONS"`` -> ``(generation, partitions)``; None when absent or
    malformed."""
    generation, sep, partitions = (text or "").strip().partition("/")
    if not (sep and generation.isdigit() and partitions.isdigit()):
        return None
    g, p = int(generation), int(partitions)
    return (g, p) if g > 0 and p > 0 else None


@dataclass(frozen=True, slots=True)
class Wait:
    """Retry at the same target after ``delay`` seconds, routes kept (``x-retry-after-ms``)."""

    reason: str
    delay: float


@dataclass(frozen=True, slots=True)
class Fail:
    """Stop: the answer does not change by retrying."""

    code: grpc.StatusCode
    detail: str


Action = Redirect | Relayout | Wait | Retry | Fail


def decide(
    code: grpc.StatusCode,
    detail: str,
    x_primary: str | None,
    *,
    target: str,
    redirects: int,
    max_redirects: int = MAX_REDIRECTS,
    x_layout: str | None = None,
    x_retry_after: str | None = None,
) -> Action:
    """What to do after the agent at ``target`` answered ``code`` (see the module docstring)."""
    reason = f"{target}: {code.name} {detail}".rstrip()
    if handshake_refused(detail):
        return Fail(code, detail)  # a certificate refused: retrying cannot help
    if code == grpc.StatusCode.UNAVAILABLE and x_retry_after is not None:
        delay = _retry_after(x_retry_after)
        if delay is not None:
            return Wait(reason, delay)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        if x_layout and redirects < max_redirects:
            layout, hint = parse_layout(x_layout), parse_primary_hint(x_primary)
            if layout is None or hint is None:
                return Relayout(reason)
            return Relayout(reason, layout, hint)
        hint = parse_primary_hint(x_primary)
        if hint is not None and hint.address != target and redirects < max_redirects:
            return Redirect(hint)
        return Retry(reason)
    if code in RETRY_CODES:
        return Retry(reason)
    return Fail(code, detail)


def _retry_after(text: str) -> float | None:
    """``x-retry-after-ms`` in seconds, or None when malformed or above ``MAX_RETRY_AFTER``."""
    try:
        ms = int(text)
    except ValueError:
        return None
    return ms / 1000 if 0 <= ms <= MAX_RETRY_AFTER * 1000 else None


def pick_target(routes: ZoneRoutes, partition: int, attempt: int) -> tuple[str, str] | None:
    """``(node, address)`` to send ``partition``'s request to: its primary when known and
    addressable, else its stable members in turn (any agent redirects to the primary it knows)."""
    route = routes.route(partition)
    if route.primary and route.primary in routes.addresses:
        return route.primary, routes.addresses[route.primary]
    members = [n for n in route.stable if n in routes.addresses]
    if not members:
        return None
    node = members[attempt % len(members)]
    return node, routes.addresses[node]


def build_routes(
    zone: str,
    partitions: int,
    assignments: Iterable[tuple[int, str, Sequence[str]]],
    nodes: Iterable[tuple[str, str]],
    generation: int = 0,
    layout: int = 0,
) -> ZoneRoutes:
    """The routing table from ``(partition, primary, stable)`` rows and ``(node, address)`` pairs;
    partitions without a row get an empty route (they are not assigned yet)."""
    routes = [PartitionRoute() for _ in range(partitions)]
    for p, primary, stable in assignments:
        if 0 <= p < partitions:
            routes[p] = PartitionRoute(primary, tuple(stable))
    addresses = {name: address for name, address in nodes if address}
    return ZoneRoutes(zone, partitions, tuple(routes), addresses, generation, layout)


class ScanProtocolError(PlacementError):
    """An agent's scan page broke the contract (unordered keys, or empty yet ``more``)."""


class ScanMerge:
    """A k-way merge of per-partition scan pages into one key-ordered stream. Pure.

    Drive it: while :meth:`needs` names partitions, fetch each one's next page (keys after
    ``after[p]``) and :meth:`feed` it; then :meth:`pop` gives the next item, or None at the end.
    Every partition holds a disjoint key set, so the merge is a total order. Invariant: an item is
    popped only when every partition that may still have keys has at least one buffered, so no
    smaller key can arrive later.
    """

    def __init__(self, partitions: Iterable[int], start_after: bytes = b"") -> None:
        self._buffers: dict[int, deque[tuple[bytes, bytes]]] = {}
        self._more: dict[int, bool] = {}
        self.after: dict[int, bytes] = {}
        self._heap: list[tuple[bytes, int]] = []
        for p in partitions:
            self._buffers[p] = deque()
            self._more[p] = True
            self.after[p] = start_after

    def needs(self) -> list[int]:
        return [p for p, buf in self._buffers.items() if not buf and self._more[p]]

    def feed(self, partition: int, items: Sequence[tuple[bytes, bytes]], more: bool) -> None:
        buf = self._buffers[partition]
        if buf or not self._more[partition]:
            raise ValueError(f"partition {partition} was not waiting for a page")
        last = self.after[partition]
        for key, _ in items:
            if last and key <= last:
                raise ScanProtocolError(
                    f"partition {partition}: scan page keys out of order at {key!r}"
                )
            last = key
        if more and not items:
            raise ScanProtocolError(f"partition {partition}: empty scan page that says more")
        buf.extend(items)
        self._more[partition] = more
        if items:
            self.after[partition] = items[-1][0]
            heapq.heappush(self._heap, (items[0][0], partition))

    def pop(self) -> tuple[bytes, bytes] | None:
        if self.needs():
            raise ValueError("pop before every waiting partition was fed")
        if not self._heap:
            return None
        _, p = heapq.heappop(self._heap)
        buf = self._buffers[p]
        item = buf.popleft()
        if buf:
            heapq.heappush(self._heap, (buf[0][0], p))
        return item


# -- I/O: connections, routes, the call loop ---------------------------------------------------


class Connector(Protocol):
    """Stubs by agent address (one channel each, reused)."""

    def data(self, address: str) -> DataStub: ...

    def replication(self, address: str) -> ReplicationStub: ...

    async def refusal(self, address: str, detail: str, budget: float) -> str | None:
        """After a call to ``address`` failed with ``detail``: why the agent refuses this
        client's certificate, or None (an outage, or not a TLS matter); within ``budget``
        seconds."""
        ...

    async def close(self) -> None: ...


class GrpcConnector:
    """One channel per agent address from the one factory (:data:`placement.rpc.DATA_PROFILE`)."""

    def __init__(self, tls: TlsMaterial | None = None) -> None:
        self._pool = ChannelPool(DATA_PROFILE, tls)

    def data(self, address: str) -> DataStub:
        return data_pb2_grpc.DataServiceStub(self._pool.get(address))

    def replication(self, address: str) -> ReplicationStub:
        return data_pb2_grpc.ReplicationServiceStub(self._pool.get(address))

    async def refusal(self, address: str, detail: str, budget: float) -> str | None:
        return await self._pool.refusal(address, detail, budget)

    async def close(self) -> None:
        await self._pool.close()


class RouteSource(Protocol):
    """Where routing tables come from (the drivers in production, a fake in unit tests)."""

    async def load(self, zone: str) -> ZoneRoutes: ...

    async def close(self) -> None: ...


class DriverRoutes:
    """Routing tables read from the placement drivers' API (any instance)."""

    def __init__(
        self,
        endpoints: Sequence[str] | str,
        *,
        deadline: float = 5.0,
        tls: TlsMaterial | None = None,
    ) -> None:
        self._client = PlacementClient(
            endpoints, call_timeout=min(5.0, deadline), deadline=deadline, tls=tls
        )

    async def load(self, zone: str) -> ZoneRoutes:
        got_zone, rows, nodes = await asyncio.gather(
            self._client.read(
                lambda s, t: s.GetZone(driver_pb2.GetZoneRequest(name=zone), timeout=t)
            ),
            self._assignments(zone),
            self._client.read(lambda s, t: s.ListNodes(driver_pb2.ListNodesRequest(), timeout=t)),
        )
        layout = got_zone.layout if got_zone.HasField("layout") else None
        return build_routes(
            zone,
            layout.partitions if layout is not None else got_zone.config.partitions,
            rows,
            ((n.name, n.address) for n in nodes.nodes),
            layout=layout.generation if layout is not None else 0,
        )

    async def _assignments(self, zone: str) -> list[tuple[int, str, Sequence[str]]]:
        rows: list[tuple[int, str, Sequence[str]]] = []
        token = ""
        while True:
            request = driver_pb2.GetAssignmentsRequest(zone=zone, page_token=token)
            page = await self._client.read(
                lambda s, t, r=request: s.GetAssignments(r, timeout=t)  # type: ignore[misc]
            )
            rows.extend((a.partition, a.primary, list(a.stable.names)) for a in page.assignments)
            token = page.next_page_token
            if not token:
                return rows

    async def close(self) -> None:
        await self._client.close()


def _rpc_failure(
    e: grpc.aio.AioRpcError,
) -> tuple[grpc.StatusCode, str, str | None, str | None, str | None]:
    """``(code, detail, x-primary, x-layout, x-retry-after-ms)`` of a failed call."""
    trailers = e.trailing_metadata()
    return (
        e.code(),
        e.details() or "",
        header_value(trailers, PRIMARY_HEADER),
        header_value(trailers, LAYOUT_HEADER),
        header_value(trailers, RETRY_AFTER_HEADER),
    )


#: The client's retry backoff: capped at 1 s, so a moved primary is found again quickly.
DEFAULT_BACKOFF = RetryPolicy(cap=1.0)


class DataClient(AsyncClosing):
    """``async with DataClient(["127.0.0.1:7400"]) as c: await c.put("orders", b"k", b"v")``.

    ``deadline`` bounds each operation (retries included); ``call_timeout`` each RPC. ``clock``
    is monotonic seconds; ``sleep`` and ``rng`` are injectable for tests.
    """

    def __init__(
        self,
        driver_endpoints: Sequence[str] | str,
        *,
        deadline: float = 15.0,
        call_timeout: float = 5.0,
        backoff: RetryPolicy = DEFAULT_BACKOFF,
        route_source: RouteSource | None = None,
        connector: Connector | None = None,
        clock: Clock = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: Rng = random.random,
        tls: TlsMaterial | None = None,
    ) -> None:
        if not (deadline > 0 and call_timeout > 0):
            raise InvalidInput("deadline", "must be positive", "e.g. 15")
        self.endpoints = parse_endpoints(driver_endpoints)
        self.deadline = deadline
        self.call_timeout = call_timeout
        self._backoff = backoff
        self._source = route_source or DriverRoutes(
            self.endpoints, deadline=min(5.0, deadline), tls=tls
        )
        self._connector: Connector = connector or GrpcConnector(tls)
        self._clock = clock
        self._sleep = sleep
        self._rng = rng
        self._routes: dict[str, ZoneRoutes] = {}
        self._stale: set[str] = set()
        self._locks: dict[str, asyncio.Lock] = {}
        #: zone -> its routes being re-read beside the calls (after a layout hint)
        self._rereads: dict[str, asyncio.Task[None]] = {}
        self._generation = 0
        self._batches: dict[str, Coalescer[_QueuedWrite, data_pb2.WriteOutcome]] = {}
        #: agents that answered WriteBatch UNIMPLEMENTED -> when (monotonic): single calls
        #: to them until ``UNBATCHED_FOR`` seconds later (a rolling upgrade may replace them)
        self._unbatched: dict[str, float] = {}

    async def close(self) -> None:
        for task in list(self._rereads.values()):
            task.cancel()
        await asyncio.gather(*self._rereads.values(), return_exceptions=True)
        for batches in self._batches.values():
            await batches.close(ClientClosed("the data client was closed under this write"))
        await self._connector.close()
        await self._source.close()

    def write_batches(self) -> tuple[int, int]:
        """``(calls, writes)``: WriteBatch calls sent so far and the writes they carried."""
        return (
            sum(b.flushes for b in self._batches.values()),
            sum(b.items for b in self._batches.values()),
        )

    # -- routes --

    async def routes(self, zone: str, *, refresh: bool = False) -> ZoneRoutes:
        """The cached routing table of ``zone``, read from the drivers when missing or stale.

        Raises InvalidInput for an unknown zone, :class:`~placement.api.client.ApiError` when no
        driver answers. Concurrent callers share one refresh.
        """
        if refresh:
            self._invalidate(zone, None)
        cached = self._routes.get(zone)
        if cached is not None and zone not in self._stale:
            return cached
        lock = self._locks.setdefault(zone, asyncio.Lock())
        async with lock:
            cached = self._routes.get(zone)
            if cached is not None and zone not in self._stale:
                return cached
            return await self._load(zone)

    async def _load(self, zone: str) -> ZoneRoutes:
        """Read ``zone``'s routes from the drivers and cache them (the zone's lock held)."""
        try:
            loaded = await self._source.load(zone)
        except ApiError as e:
            if e.code == grpc.StatusCode.NOT_FOUND:
                raise InvalidInput("zone", e.detail or f"{zone!r} does not exist") from e
            raise
        self._generation += 1
        loaded = replace(loaded, generation=self._generation)
        self._routes[zone] = loaded
        self._stale.discard(zone)
        return loaded

    def _reread(self, zone: str, layout: int) -> None:
        """Re-read ``zone``'s routes beside the calls, which keep the cached table meanwhile
        (one re-read at a time): an agent named the zone's new ``layout`` and where a key goes
        under it, so no call has to wait for the drivers. A failed re-read is left to the next
        hint, or to a call's own refresh."""
        if zone in self._rereads:
            return

        async def reread() -> None:
            async with self._locks.setdefault(zone, asyncio.Lock()):
                cached = self._routes.get(zone)
                if cached is None or cached.layout < layout or zone in self._stale:
                    with contextlib.suppress(PlacementError):
                        await self._load(zone)

        task = asyncio.create_task(reread(), name=f"routes of {zone}")
        self._rereads[zone] = task
        task.add_done_callback(lambda _: self._rereads.pop(zone, None))

    def _invalidate(self, zone: str, seen: ZoneRoutes | None) -> None:
        """Mark ``zone``'s table stale unless it was refreshed since ``seen`` was read."""
        current = self._routes.get(zone)
        if seen is None or current is None or current.generation == seen.generation:
            self._stale.add(zone)

    def _learn_primary(self, zone: str, partition: int, hint: PrimaryHint) -> None:
        current = self._routes.get(zone)
        if current is not None:
            self._routes[zone] = current.with_primary(partition, hint)

    # -- the call loop --

    async def _call(
        self,
        op: str,
        zone: str,
        locate: Callable[[ZoneRoutes], int],
        invoke: Callable[[DataStub, str, common_pb2.PartitionRef, float], Awaitable[T]],
        *,
        layout: int = 0,
    ) -> T:
        """Send ``invoke(stub, address, partition reference, timeout)`` to the partition's
        primary (the reference carries the layout generation the routes were read under), following
        redirects and retrying unavailability until the deadline (see the module docstring).
        With ``layout`` (a generation) the call is pinned to it: routes of another generation
        raise :class:`LayoutMoved` instead of being followed."""
        start = self._clock()
        give_up = start + self.deadline
        attempt = 0
        redirects = 0
        redirect: PrimaryHint | None = None
        #: (generation, partitions) an agent named (with the key's primary under it), used
        #: until the cached routes catch up with it or an attempt needs a refresh
        relayout: tuple[int, int] | None = None
        refreshed_for_invalid = False
        last = "no attempt made"
        partition: int | None = None
        while True:
            try:
                routes = await self.routes(zone)
            except ApiError as e:
                if not e.unavailable:
                    raise
                routes, last = None, f"placement drivers: {e.detail or e.code.name}"
            if routes is not None:
                if layout and routes.layout != layout:
                    raise LayoutMoved(zone, layout, routes.layout)
                if relayout is not None and routes.layout < relayout[0]:
                    # the agent's newer layout until the re-read routes catch up with it: no
                    # route of the old table applies (the hint, or a redirect, is the target)
                    routes = replace(routes, partitions=relayout[1], layout=relayout[0], routes=())
                else:
                    relayout = None
                partition = locate(routes)
                target = (
                    (redirect.node, redirect.address)
                    if redirect is not None
                    else pick_target(routes, partition, attempt)
                )
                redirect = None
                if target is None:
                    last = f"no primary or replica address known for partition {partition}"
                else:
                    node, address = target
                    remaining = give_up - self._clock()
                    if remaining <= 0:
                        raise DataUnavailable(op, zone, partition, last, self._clock() - start)
                    try:
                        return await invoke(
                            self._connector.data(address),
                            address,
                            _ref(zone, partition, routes.layout),
                            min(self.call_timeout, remaining),
                        )
                    except grpc.aio.AioRpcError as e:
                        code, detail, x_primary, x_layout, x_retry = _rpc_failure(e)
                        if code == grpc.StatusCode.UNAVAILABLE:
                            why = await self._connector.refusal(
                                address, detail, give_up - self._clock()
                            )
                            if why is not None:
                                raise CredentialError(f"{op} {zone}: {why}") from e
                    action = decide(
                        code,
                        detail,
                        x_primary,
                        target=address,
                        redirects=redirects,
                        x_layout=x_layout,
                        x_retry_after=x_retry,
                    )
                    where = f"{node}@{address}"
                    failure = f"{where}: {code.name}" + (f" {detail}" if detail else "")
                    if isinstance(action, Wait):
                        last = failure
                        if self._clock() + action.delay >= give_up:
                            raise DataUnavailable(op, zone, partition, last, self._clock() - start)
                        redirect = PrimaryHint(node, address)
                        await self._sleep(action.delay)
                        continue
                    if isinstance(action, Redirect):
                        redirects += 1
                        redirect = action.hint
                        if relayout is None:  # not a partition of the newer layout's
                            self._learn_primary(zone, partition, action.hint)
                        continue
                    if isinstance(action, Relayout):
                        redirects += 1
                        if (
                            action.layout is not None
                            and action.hint is not None
                            and action.layout[0] > routes.layout  # not an agent lagging behind
                            and not layout
                        ):
                            # straight to the key's new primary; the routes re-read beside
                            relayout, redirect = action.layout, action.hint
                            self._reread(zone, action.layout[0])
                        else:
                            self._invalidate(zone, routes)
                        continue
                    if isinstance(action, Fail):
                        if code == grpc.StatusCode.INVALID_ARGUMENT:
                            if not refreshed_for_invalid:
                                refreshed_for_invalid = True
                                fresh = await self.routes(zone, refresh=True)
                                if fresh.partitions != routes.partitions:
                                    continue
                            raise InvalidInput(f"{op} {zone}/{partition}", detail or "rejected")
                        if code in CREDENTIAL_CODES or handshake_refused(detail):
                            raise CredentialError(
                                f"{op} {zone}: {where} refused this caller's credential "
                                f"({code.name}: {detail}); check --cert/--key (its role) "
                                "and --cacert"
                            )
                        raise DataRequestFailed(op, zone, code, detail, where)
                    last = failure
            redirects = 0
            relayout = None
            if routes is not None:
                self._invalidate(zone, routes)
            delay = self._backoff.delay(attempt, self._rng)
            attempt += 1
            if self._clock() + delay >= give_up:
                raise DataUnavailable(op, zone, partition, last, self._clock() - start)
            await self._sleep(delay)

    # -- the data API --

    async def put(self, zone: str, key: bytes, value: bytes) -> WriteResult:
        """Write ``value`` under ``key``; returns once every in-sync replica persisted it."""
        validate_key(key)
        validate_value(value)

        async def invoke(
            stub: DataStub, address: str, ref: common_pb2.PartitionRef, t: float
        ) -> WriteResult:
            op = data_pb2.WriteOp(partition=ref, key=key, value=value)
            return await self._write(stub, address, op, t)

        return await self._call("put", zone, lambda r: partition_of(key, r.partitions), invoke)

    async def delete_with_result(self, zone: str, key: bytes) -> WriteResult:
        """Delete ``key``; the result carries the log position and whether the key existed."""
        validate_key(key)

        async def invoke(
            stub: DataStub, address: str, ref: common_pb2.PartitionRef, t: float
        ) -> WriteResult:
            op = data_pb2.WriteOp(partition=ref, key=key, delete=True)
            return await self._write(stub, address, op, t)

        return await self._call("delete", zone, lambda r: partition_of(key, r.partitions), invoke)

    async def _write(
        self, stub: DataStub, address: str, op: data_pb2.WriteOp, within: float
    ) -> WriteResult:
        """``op`` in the next WriteBatch to ``address`` (see the module docstring); its failure
        raised as the AioRpcError Put or Delete would have raised."""
        since = self._unbatched.get(address)
        if since is not None:
            if time.monotonic() - since < UNBATCHED_FOR:
                return await _write_alone(stub, op, within)
            del self._unbatched[address]
        batches = self._batches.get(address)
        if batches is None:
            batches = self._batches[address] = Coalescer(
                lambda writes: self._send_batch(address, writes),
                limit=WRITE_BATCH_OPS,
                name=f"writes to {address}",
                size=_QueuedWrite.size,
                max_size=WRITE_BATCH_BYTES,
            )
        try:
            deadline = time.monotonic() + within
            async with asyncio.timeout(within):
                outcome = await batches.submit(_QueuedWrite(op, deadline, stub))
        except TimeoutError:
            raise _status_error(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer within {within:.3g} s"
            ) from None
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            self._unbatched[address] = time.monotonic()  # an agent from before WriteBatch
            return await _write_alone(stub, op, max(0.001, deadline - time.monotonic()))
        if outcome.code != 0:
            raise _status_error(
                _STATUS_BY_VALUE.get(outcome.code, grpc.StatusCode.UNKNOWN),
                outcome.detail,
                (PRIMARY_HEADER, outcome.primary),
                (LAYOUT_HEADER, outcome.layout),
                (RETRY_AFTER_HEADER, str(outcome.retry_after_ms) if outcome.retry_after_ms else ""),
            )
        r = outcome.result
        return WriteResult(r.index, r.lease_epoch, r.existed)

    async def _send_batch(
        self, address: str, writes: list[_QueuedWrite]
    ) -> Sequence[data_pb2.WriteOutcome]:
        request = data_pb2.WriteBatchRequest(ops=[w.op for w in writes])
        # the longest any of them may still wait (the agent parks a sealed write for half)
        timeout = max(0.001, max(w.deadline for w in writes) - time.monotonic())
        reply = await writes[0].stub.WriteBatch(request, timeout=timeout)
        if len(reply.outcomes) != len(writes):
            raise _status_error(
                grpc.StatusCode.UNKNOWN,
                f"{address} answered {len(reply.outcomes)} outcomes for {len(writes)} writes",
            )
        return reply.outcomes

    async def delete(self, zone: str, key: bytes) -> bool:
        """Delete ``key``; True when it existed (see the module docstring on retries)."""
        return (await self.delete_with_result(zone, key)).existed

    async def get(self, zone: str, key: bytes) -> bytes | None:
        """The committed value of ``key``, or None when absent."""
        validate_key(key)

        async def invoke(
            stub: DataStub, _: str, ref: common_pb2.PartitionRef, t: float
        ) -> bytes | None:
            reply = await stub.Get(data_pb2.GetRequest(partition=ref, key=key), timeout=t)
            return reply.value if reply.found else None

        return await self._call("get", zone, lambda r: partition_of(key, r.partitions), invoke)

    async def scan_partition(
        self,
        zone: str,
        partition: int,
        *,
        prefix: bytes = b"",
        after: bytes = b"",
        limit: int = 0,
        layout: int = 0,
    ) -> tuple[list[tuple[bytes, bytes]], bool]:
        """One page of ``partition``'s keys after ``after``: ``(items, more)``; with ``layout``
        (a generation), :class:`LayoutMoved` once the zone is at another one."""

        async def invoke(
            stub: DataStub, _: str, ref: common_pb2.PartitionRef, t: float
        ) -> tuple[list[tuple[bytes, bytes]], bool]:
            request = data_pb2.ScanRequest(
                partition=ref, prefix=prefix, start_after=after, limit=limit
            )
            reply = await stub.Scan(request, timeout=t)
            return [(kv.key, kv.value) for kv in reply.items], reply.more

        return await self._call("scan", zone, lambda r: partition, invoke, layout=layout)

    async def scan(
        self, zone: str, prefix: bytes = b"", *, page_size: int = SCAN_PAGE
    ) -> AsyncIterator[tuple[bytes, bytes]]:
        """Every ``(key, value)`` of ``zone`` whose key starts with ``prefix``, in key order.

        Pages through every partition of one layout (each page a separate committed read: not a
        point-in-time snapshot of the zone) and merges them; at most one page per partition is
        buffered. When the zone's layout changes meanwhile (a re-sharding's flip), the scan goes
        on under the new layout after the last key it gave: partitions of two layouts are never
        mixed (design/resharding.md, "Routing").
        """
        if not isinstance(prefix, bytes):
            raise InvalidInput("prefix", f"{prefix!r} is not bytes", "UTF-8 encode text")
        last = b""
        while True:
            routes = await self.routes(zone)
            merge = ScanMerge(range(routes.partitions), start_after=last)
            try:
                async for key, value in self._scan_layout(zone, prefix, page_size, routes, merge):
                    last = key
                    yield key, value
                return
            except LayoutMoved:
                continue  # the routes are fresh: go on under the new layout

    async def _scan_layout(
        self, zone: str, prefix: bytes, page_size: int, routes: ZoneRoutes, merge: ScanMerge
    ) -> AsyncIterator[tuple[bytes, bytes]]:
        semaphore = asyncio.Semaphore(SCAN_FANOUT)

        async def fetch(p: int) -> tuple[int, list[tuple[bytes, bytes]], bool]:
            async with semaphore:
                items, more = await self.scan_partition(
                    zone,
                    p,
                    prefix=prefix,
                    after=merge.after[p],
                    limit=page_size,
                    layout=routes.layout,
                )
            return p, items, more

        while True:
            needed = merge.needs()
            if needed:
                for p, items, more in await asyncio.gather(*(fetch(p) for p in needed)):
                    merge.feed(p, items, more)
                continue
            item = merge.pop()
            if item is None:
                return
            yield item

    # -- replicas (the checker) --

    async def read_replica(
        self, zone: str, partition: int, node: str, address: str, *, page: int = SCAN_PAGE
    ) -> ReplicaCopy:
        """``node``'s own copy of the partition, all pages (``ReadReplica``; not routed)."""
        stub = self._connector.replication(address)
        items: dict[bytes, bytes] = {}
        after = b""
        while True:
            request = data_pb2.ReadReplicaRequest(
                partition=_ref(zone, partition), start_after=after, limit=page
            )
            try:
                reply = await stub.ReadReplica(request, timeout=self.call_timeout)
            except grpc.aio.AioRpcError as e:
                raise DataRequestFailed(
                    "read-replica", zone, e.code(), e.details() or "", f"{node}@{address}"
                ) from e
            if not reply.hosted:
                return ReplicaCopy(node, False, {})
            for kv in reply.items:
                items[kv.key] = kv.value
            if not reply.more or not reply.items:
                return ReplicaCopy(node, True, items, reply.last_index, reply.commit_index)
            after = reply.items[-1].key


@dataclass(frozen=True, slots=True)
class _QueuedWrite:
    op: data_pb2.WriteOp
    #: when the write's attempt gives up (``time.monotonic()``)
    deadline: float = field(compare=False)
    #: the agent's stub as the write's attempt got it
    stub: DataStub = field(compare=False)

    def size(self) -> int:
        return len(self.op.key) + len(self.op.value) + 64


_STATUS_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}


def _status_error(
    code: grpc.StatusCode, detail: str, *trailers: tuple[str, str]
) -> grpc.aio.AioRpcError:
    """A failed call's error as gRPC raises it (the trailers with a value)."""
    pairs = [(name, value) for name, value in trailers if value]
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*pairs), detail)


async def _write_alone(stub: DataStub, op: data_pb2.WriteOp, within: float) -> WriteResult:
    """``op`` as one Put or Delete call."""
    if op.delete:
        request = data_pb2.DeleteRequest(partition=op.partition, key=op.key)
        reply = await stub.Delete(request, timeout=within)
    else:
        put = data_pb2.PutRequest(partition=op.partition, key=op.key, value=op.value)
        reply = await stub.Put(put, timeout=within)
    return WriteResult(reply.index, reply.lease_epoch, reply.existed)


def _ref(zone: str, partition: int, layout: int = 0) -> common_pb2.PartitionRef:
    return common_pb2.PartitionRef(zone=zone, partition=partition, generation=layout)
