"""gRPC client of ``PlacementService`` for the CLI and other services.

* Several endpoints (any driver instance answers): a call that meets ``UNAVAILABLE`` or a deadline
  moves to the next endpoint and is retried there, at most once per endpoint, then with capped
  backoff (:data:`BACKOFF`: 0.1 s doubling to 2 s, no jitter) until ``deadline`` seconds have
  passed; other errors are final.
* A read (:meth:`PlacementClient.read`: any driver answers it the same way) is **hedged**: when
  the endpoint asked has not answered within ``hedge_after`` seconds, the next one is asked too
  and the first answer wins (the other call is cancelled), so a frozen driver (SIGSTOP, a stalled
  host: it accepts the call and never answers) costs a read ``hedge_after``, not ``call_timeout``.
  Writes (:meth:`PlacementClient.call`) are never sent twice at once.
* Every call carries ``call_timeout``; channels come from the one factory
  (:data:`placement.rpc.API_PROFILE`: keepalive with a ping timeout, so a frozen peer is noticed,
  and a capped reconnect backoff, so there is no long sit-out after an outage).
* Errors leave as :class:`ApiError` carrying the gRPC status code and the server's one-line detail.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import grpc

from placement.core.closing import AsyncClosing
from placement.core.retry import Backoff, RetryPolicy
from placement.errors import CredentialError, InvalidInput, PlacementError
from placement.rpc import API_PROFILE, ChannelPool
from placement.security.credentials import handshake_refused
from placement.security.tls import TlsMaterial
from placement.v1 import driver_pb2, driver_pb2_grpc

#: Pause between rounds over every endpoint: 0.1 s, 0.2 s, ... capped at 2 s, no jitter.
BACKOFF = RetryPolicy(initial=0.1, cap=2.0, floor=1.0)
#: The PlacementService methods that change nothing (``Plan`` computes a dry run): safe to hedge.
READS = frozenset(
    {
        "GetZone",
        "ListZones",
        "GetZoneStatus",
        "ListNodes",
        "GetAssignments",
        "GetNodeStatus",
        "Plan",
    }
)
#: Seconds a read waits for the endpoint it asked before it asks the next one as well.
HEDGE_AFTER = 0.5
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

T = TypeVar("T")
if TYPE_CHECKING:
    Stub = driver_pb2_grpc.PlacementServiceAsyncStub


class ApiError(PlacementError):
    """A call failed: ``code`` is the gRPC status, ``detail`` the server's message."""

    def __init__(self, code: grpc.StatusCode, detail: str, endpoint: str = "") -> None:
        self.code = code
        self.detail = detail
        self.endpoint = endpoint
        super().__init__(detail or code.name.lower())

    @property
    def unavailable(self) -> bool:
        return self.code in RETRYABLE


def parse_endpoints(text: str | Sequence[str]) -> tuple[str, ...]:
    """``HOST:PORT[,HOST:PORT...]`` -> a tuple; raises InvalidInput naming ``--endpoint``."""
    items = text.split(",") if isinstance(text, str) else list(text)
    endpoints = tuple(e.strip() for e in items if e.strip())
    if not endpoints:
        raise InvalidInput("--endpoint", "no address given", "pass HOST:PORT[,HOST:PORT...]")
    for e in endpoints:
        host, sep, port = e.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidInput("--endpoint", f"{e!r} is not HOST:PORT", "e.g. 127.0.0.1:7400")
    return endpoints


class PlacementClient(AsyncClosing):
    """``async with PlacementClient(["h:p"]) as c: await c.read(lambda s, t: s.ListZones(..))``."""

    def __init__(
        self,
        endpoints: Sequence[str] | str,
        *,
        call_timeout: float = 5.0,
        deadline: float = 15.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        tls: TlsMaterial | None = None,
        hedge_after: float = HEDGE_AFTER,
    ) -> None:
        self.endpoints = parse_endpoints(endpoints)
        self.call_timeout = call_timeout
        self.hedge_after = hedge_after
        self.deadline = deadline
        self._sleep = sleep
        self._active = 0
        self._channels = ChannelPool(API_PROFILE, tls)

    async def close(self) -> None:
        await self._channels.close()

    @property
    def active_endpoint(self) -> str:
        return self.endpoints[self._active]

    def _stub(self, endpoint: str) -> Stub:
        return driver_pb2_grpc.PlacementServiceStub(self._channels.get(endpoint))

    async def _retryable(self, endpoint: str, e: grpc.aio.AioRpcError, budget: float) -> ApiError:
        """``e`` from ``endpoint`` as an ApiError to retry on the next endpoint (which becomes
        the active one); raises it instead when retrying cannot help (a refused credential, a
        status other than unavailable)."""
        error = ApiError(e.code(), e.details() or "", endpoint)
        if handshake_refused(error.detail):
            raise CredentialError(
                f"the TLS handshake with {endpoint} failed ({error.detail}); check "
                "--cacert (the CA that signed the drivers' certificates) and that "
                "the drivers serve TLS"
            ) from e
        if e.code() not in RETRYABLE:
            raise error from e
        why = await self._channels.refusal(endpoint, error.detail, budget)
        if why is not None:
            raise CredentialError(why) from e
        self._active = (self._active + 1) % len(self.endpoints)
        return error

    async def watch_assignments(
        self, zone: str, from_revision: int = 0
    ) -> AsyncIterator[driver_pb2.AssignmentEvent]:
        """Zone ``zone``'s assignment and primary changes after ``from_revision`` (0 = from
        now), for ever: a broken stream is opened again — on the next endpoint while one is
        unavailable — from the last revision delivered, so nothing is missed or repeated. Gives
        up like :meth:`call` when no endpoint answers within ``deadline``."""
        loop = asyncio.get_running_loop()
        backoff = Backoff(BACKOFF)
        revision = from_revision
        if not revision:  # "now", pinned here: a stream that breaks at once must not re-pick it
            status = await self.read(
                lambda s, t: s.GetZoneStatus(
                    driver_pb2.GetZoneRequest(
                        name=zone, read=driver_pb2.ReadOptions(linearizable=True)
                    ),
                    timeout=t,
                )
            )
            revision = status.revision
        sent: set[int] = set()  # partitions delivered at ``revision`` (one revision may hold many)
        give_up: float | None = None  # set at the first failure since a stream last opened
        while True:
            endpoint = self.active_endpoint
            resume = revision - 1 if sent else revision
            request = driver_pb2.WatchAssignmentsRequest(zone=zone, from_revision=resume)
            try:
                stream = self._stub(endpoint).WatchAssignments(request)
                await stream.wait_for_connection()
                give_up = None  # opened: a quiet zone is not a failure
                backoff.reset()
                async for event in stream:
                    partition = event.assignment.partition
                    if event.revision < revision or (
                        event.revision == revision and partition in sent
                    ):
                        continue  # delivered before the stream broke
                    if event.revision > revision:
                        revision, sent = event.revision, set()
                    sent.add(partition)
                    yield event
            except grpc.aio.AioRpcError as e:
                give_up = give_up if give_up is not None else loop.time() + self.deadline
                last = await self._retryable(endpoint, e, give_up - loop.time())
                delay = backoff.next()
                if loop.time() + delay >= give_up:
                    raise ApiError(
                        last.code,
                        f"no placement driver answered at {','.join(self.endpoints)} "
                        f"({last.detail or last.code.name.lower()})",
                    ) from e
                await self._sleep(delay)

    async def call(self, method: Callable[[Stub, float], Awaitable[T]]) -> T:
        """Run ``method(stub, timeout)``, failing over between endpoints while unavailable."""
        return await self._rounds(method, hedged=False)

    async def read(self, method: Callable[[Stub, float], Awaitable[T]]) -> T:
        """:meth:`call` for a read, hedged (module docstring): ``method`` may run on two
        endpoints at once, so it must change nothing."""
        return await self._rounds(method, hedged=True)

    async def _rounds(self, method: Callable[[Stub, float], Awaitable[T]], hedged: bool) -> T:
        """Rounds over every endpoint, with capped backoff between them, until one answers or
        ``deadline`` has passed."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.deadline
        backoff = Backoff(BACKOFF)
        last: ApiError | None = None
        while True:
            # A write's round is the same round never hedged: the next endpoint only on failure.
            hedge = self.hedge_after if hedged else None
            found, last = await self._round(method, give_up, hedge)
            if last is None:
                return found  # type: ignore[return-value]
            delay = backoff.next()
            if loop.time() + delay >= give_up:
                assert last is not None
                raise ApiError(
                    last.code,
                    f"no placement driver answered at {','.join(self.endpoints)} "
                    f"({last.detail or last.code.name.lower()})",
                )
            await self._sleep(delay)

    async def _round(
        self, method: Callable[[Stub, float], Awaitable[T]], give_up: float, hedge: float | None
    ) -> tuple[T | None, ApiError | None]:
        """One round over every endpoint, from the active one: the next endpoint is asked when
        the ones asked so far have not answered within ``hedge`` s (None: never) or have all
        failed; the first answer wins (its endpoint becomes the active one) and the calls still
        running are cancelled. ``(answer, None)``, or ``(None, the last retryable error)`` when
        every endpoint failed; a final error is raised."""
        loop = asyncio.get_running_loop()
        first = self._active
        queue = [
            self.endpoints[(first + i) % len(self.endpoints)] for i in range(len(self.endpoints))
        ]
        running: dict[asyncio.Future[T], str] = {}
        last: ApiError | None = None
        try:
            while queue or running:
                if queue:
                    endpoint = queue.pop(0)
                    started = asyncio.ensure_future(method(self._stub(endpoint), self.call_timeout))
                    running[started] = endpoint
                done, _ = await asyncio.wait(
                    running, timeout=hedge if queue else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )  # fmt: skip
                for ended in done:
                    endpoint = running.pop(ended)
                    try:
                        found = ended.result()
                    except grpc.aio.AioRpcError as e:
                        last = await self._retryable(endpoint, e, give_up - loop.time())
                        continue
                    self._active = self.endpoints.index(endpoint)
                    return found, None
            return None, last
        finally:
            for left in running:
                left.cancel()
            await asyncio.gather(*running, return_exceptions=True)
