"""gRPC client of ``PlacementService`` for the CLI and other services.

* Several endpoints (any driver instance answers): a call that meets ``UNAVAILABLE`` or a deadline
  moves to the next endpoint and is retried there, at most once per endpoint, then with capped
  backoff (:data:`BACKOFF`: 0.1 s doubling to 2 s, no jitter) until ``deadline`` seconds have
  passed; other errors are final.
* Every call carries ``call_timeout``; channels come from the one factory
  (:data:`placement.rpc.API_PROFILE`: keepalive with a ping timeout, so a frozen peer is noticed,
  and a capped reconnect backoff, so there is no long sit-out after an outage).
* Errors leave as :class:`ApiError` carrying the gRPC status code and the server's one-line detail.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import grpc

from placement.core.closing import AsyncClosing
from placement.core.retry import Backoff, RetryPolicy
from placement.errors import CredentialError, InvalidInput, PlacementError
from placement.rpc import API_PROFILE, ChannelPool
from placement.security.credentials import handshake_refused
from placement.security.tls import TlsMaterial
from placement.v1 import driver_pb2_grpc

#: Pause between rounds over every endpoint: 0.1 s, 0.2 s, ... capped at 2 s, no jitter.
BACKOFF = RetryPolicy(initial=0.1, cap=2.0, floor=1.0)
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
    """``async with PlacementClient(["h:p"]) as c: await c.call(lambda s, t: s.ListZones(..))``."""

    def __init__(
        self,
        endpoints: Sequence[str] | str,
        *,
        call_timeout: float = 5.0,
        deadline: float = 15.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        tls: TlsMaterial | None = None,
    ) -> None:
        self.endpoints = parse_endpoints(endpoints)
        self.call_timeout = call_timeout
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

    async def call(self, method: Callable[[Stub, float], Awaitable[T]]) -> T:
        """Run ``method(stub, timeout)``, failing over between endpoints while unavailable."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.deadline
        backoff = Backoff(BACKOFF)
        last: ApiError | None = None
        while True:
            for _ in range(len(self.endpoints)):
                endpoint = self.active_endpoint
                try:
                    return await method(self._stub(endpoint), self.call_timeout)
                except grpc.aio.AioRpcError as e:
                    last = ApiError(e.code(), e.details() or "", endpoint)
                    if handshake_refused(last.detail):
                        raise CredentialError(
                            f"the TLS handshake with {endpoint} failed ({last.detail}); check "
                            "--cacert (the CA that signed the drivers' certificates) and that "
                            "the drivers serve TLS"
                        ) from e
                    if e.code() not in RETRYABLE:
                        raise last from e
                    why = await self._channels.refusal(endpoint, last.detail, give_up - loop.time())
                    if why is not None:
                        raise CredentialError(why) from e
                    self._active = (self._active + 1) % len(self.endpoints)
            delay = backoff.next()
            if loop.time() + delay >= give_up:
                assert last is not None
                raise ApiError(
                    last.code,
                    f"no placement driver answered at {','.join(self.endpoints)} "
                    f"({last.detail or last.code.name.lower()})",
                )
            await self._sleep(delay)
