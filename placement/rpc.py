"""The one factory for gRPC channels and servers (design/architecture.md, "One of each").

Every process builds its channels and servers here, so options, keep-alive, message limits, the
health service and reflection are set in one place (and credentials, once the product has TLS).

* **Channels** come from a :class:`ChannelPool` — one ``grpc.aio`` channel per address, created
  on first use — with a :class:`ChannelProfile`: keep-alive with a ping timeout, so a frozen peer
  is noticed within seconds, and a capped reconnect backoff, so a restarted peer is reached again
  quickly instead of after gRPC's default 2-minute sit-out.
* **Servers** come from :func:`bind_server` (bind first, so a taken address fails before any state
  is touched; ``SO_REUSEPORT`` off, so a second process cannot share the port silently) and
  :func:`start_server` (health, reflection, every service SERVING).
* **TLS**: given a :class:`~placement.security.tls.TlsMaterial`, a channel is mutual TLS (it
  presents its certificate, trusts only the CA) and a server requires a client certificate
  signed by the CA; without one, both are plaintext (design/deployment.md). A TLS server checks
  every call against the role table (:class:`RoleGuard`, ``placement.security.roles``).
* **Enums** of the domain map to protobuf enums by member name (:func:`pb_enum_values`).
* **Errors** of a servicer's domain become status codes through a :data:`StatusTable` and
  :func:`answer` / :func:`abort` (the message is the error's text).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeAlias, TypeVar

import grpc

from placement.errors import InvalidInput, PlacementError
from placement.security.pki import Identity, Role, identity_of
from placement.security.probe import PROBE_TIMEOUT, Prober
from placement.security.roles import denial, is_open
from placement.security.tls import TlsMaterial

if TYPE_CHECKING:
    from grpc_health.v1.health import HealthServicer

T = TypeVar("T")
E = TypeVar("E", bound=Enum)
V_co = TypeVar("V_co", covariant=True)

#: Largest message a channel or server accepts (scan and snapshot pages stay far below it).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ChannelProfile:
    """How a channel watches its peer and reconnects."""

    keepalive_ms: int
    ping_timeout_ms: int
    #: Ping even with no call open (only towards servers that permit it, like ours).
    ping_idle: bool = False
    max_reconnect_backoff_ms: int = 1_000
    max_message_bytes: int = MAX_MESSAGE_BYTES
    #: Extra raw options (e.g. etcd's limits on pings); they win over the derived ones.
    extra: tuple[tuple[str, int], ...] = ()

    def options(self) -> list[tuple[str, int]]:
        derived = {
            "grpc.keepalive_time_ms": self.keepalive_ms,
            "grpc.keepalive_timeout_ms": self.ping_timeout_ms,
            # Newer gRPC cores use this one for the ping-ack wait and ignore keepalive_timeout_ms.
            "grpc.http2.ping_timeout_ms": self.ping_timeout_ms,
            "grpc.keepalive_permit_without_calls": int(self.ping_idle),
            "grpc.initial_reconnect_backoff_ms": 100,
            "grpc.min_reconnect_backoff_ms": 100,
            "grpc.max_reconnect_backoff_ms": self.max_reconnect_backoff_ms,
            "grpc.max_receive_message_length": self.max_message_bytes,
            "grpc.max_send_message_length": self.max_message_bytes,
        }
        derived.update(self.extra)
        return list(derived.items())


#: Clients of the driver API (placectl, the API's forwarding to the leader).
API_PROFILE = ChannelProfile(
    keepalive_ms=10_000, ping_timeout_ms=5_000, ping_idle=True, max_reconnect_backoff_ms=2_000
)
#: The driver calling agents (Rebalance, Cancel, Retire): a frozen agent is noticed in ~8 s.
AGENT_PROFILE = ChannelProfile(keepalive_ms=5_000, ping_timeout_ms=3_000)
#: Data clients calling primaries, and agents replicating to each other.
DATA_PROFILE = ChannelProfile(keepalive_ms=10_000, ping_timeout_ms=3_000)


def channel(
    address: str, profile: ChannelProfile, tls: TlsMaterial | None = None
) -> grpc.aio.Channel:
    """One new channel to ``address`` with ``profile``'s options; mutual TLS with ``tls``."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=profile.options())
    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert
    )
    return grpc.aio.secure_channel(address, credentials, options=profile.options())


class ChannelPool:
    """One channel per address, created on first use and closed together."""

    def __init__(
        self,
        profile: ChannelProfile,
        tls: TlsMaterial | None = None,
        *,
        on_refused: Callable[[str, str], None] | None = None,
    ) -> None:
        self.profile = profile
        self.tls = tls
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._prober = Prober(tls, on_refused=on_refused)

    async def refusal(
        self, address: str, details: str, budget: float = PROBE_TIMEOUT
    ) -> str | None:
        """After a call to ``address`` failed with ``details``: why that server refuses this
        process's certificate (gRPC reports it only as a closed socket), or None; within
        ``budget`` seconds. Each address is probed at most every 30 s, its verdict kept
        meanwhile; ``on_refused(address, why)`` hears of each refusal a probe finds
        (:mod:`placement.security.probe`)."""
        return await self._prober.refusal(address, details, budget)

    def get(self, address: str) -> grpc.aio.Channel:
        found = self._channels.get(address)
        if found is None:
            found = self._channels[address] = channel(address, self.profile, self.tls)
        return found

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for c in channels:
            await c.close(None)


def split_listen(listen: str, option: str = "--listen") -> tuple[str, int]:
    """``HOST:PORT`` (port 0 = any free port) or an :class:`InvalidInput` naming ``option``."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise InvalidInput(option, f"{listen!r} is not HOST:PORT", "e.g. 127.0.0.1:0")
    return host.strip("[]"), int(port)


def join_host_port(host: str, port: int) -> str:
    """``HOST:PORT``, an IPv6 host in brackets (``[::1]:7400``) so peers can dial it."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_WILDCARDS = frozenset({"0.0.0.0", "::", "*", ""})


def advertised_address(
    listen: str, advertise: str | None, bound: str | None = None, option: str = "--advertise"
) -> str:
    """The address peers dial: ``advertise`` (its port 0 = the bound port), else the bound
    ``listen`` address. Refused (InvalidInput naming ``option``): advertising a wildcard host,
    and a wildcard ``listen`` without ``advertise`` — peers would dial themselves. Call it
    once before binding (``bound`` None: checks only) and once after."""
    if advertise is None:
        host, _ = split_listen(listen)
        if host in _WILDCARDS:
            raise InvalidInput(
                option,
                f"--listen {listen} binds every interface, which peers cannot dial",
                "add --advertise HOST:PORT, the address other processes reach this one at",
            )
        return bound or listen
    host, port = split_listen(advertise, option)
    if host in _WILDCARDS:
        raise InvalidInput(
            option,
            f"{advertise!r} is a wildcard address, which peers cannot dial",
            "give the host name or IP address other processes reach this one at",
        )
    if port == 0 and bound is not None:
        port = split_listen(bound)[1]
    return join_host_port(host, port)


def bind_server(
    listen: str, option: str = "--listen", tls: TlsMaterial | None = None
) -> tuple[grpc.aio.Server, str]:
    """A new server bound to ``listen``; returns it and the bound ``host:port``. With ``tls``
    it serves TLS with its certificate and requires every client to present one the CA
    signed."""
    host, port = split_listen(listen, option)
    server = grpc.aio.server(
        # The role check first: a caller that may not call the method learns nothing more.
        interceptors=[RoleGuard(), DecodeGuard()] if tls is not None else [DecodeGuard()],
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
    )
    try:
        if tls is None:
            bound = server.add_insecure_port(f"{host}:{port}")
        else:
            credentials = grpc.ssl_server_credentials(
                [(tls.key, tls.cert)], root_certificates=tls.ca, require_client_auth=True
            )
            bound = server.add_secure_port(f"{host}:{port}", credentials)
    except RuntimeError as e:
        raise InvalidInput(option, f"cannot bind {listen}: {e}", "pick a free port") from e
    return server, join_host_port(host, bound)


@functools.lru_cache(maxsize=1024)
def _identity_of(pem: bytes) -> Identity | None:
    try:
        return identity_of(pem)
    except InvalidInput:
        return None


def caller_identity(context: grpc.aio.ServicerContext[Any, Any]) -> Identity | None:
    """Who the caller's certificate names — its common name and role (None: a plaintext
    server, or a certificate without a role)."""
    pems = list(context.auth_context().get("x509_pem_cert") or [])
    return _identity_of(bytes(pems[0])) if pems else None


def caller_role(context: grpc.aio.ServicerContext[Any, Any]) -> Role | None:
    """The role the caller's certificate carries (None: no certificate, or none named)."""
    who = caller_identity(context)
    return who.role if who is not None else None


Check: TypeAlias = Callable[[Any, "grpc.aio.ServicerContext[Any, Any]"], Awaitable[None]]


def _rewrap(
    handler: grpc.RpcMethodHandler[Any, Any],
    *,
    before: Callable[[grpc.aio.ServicerContext[Any, Any]], Awaitable[None]] | None = None,
    each: Check | None = None,
    deserializer: Callable[[bytes], Any] | None = None,
) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` with ``before(context)`` awaited before its behavior runs, ``each(request,
    context)`` awaited on every request message before the behavior sees it (each of a
    stream's), and ``deserializer`` instead of its own — the one way the interceptors below
    wrap a handler, whatever its kind."""

    async def checked(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        async for request in requests:
            if each is not None:
                await each(request, context)
            yield request

    async def prepare(request: Any, context: Any, streamed: bool) -> Any:
        if before is not None:
            await before(context)
        if streamed:
            return checked(request, context)
        if each is not None:
            await each(request, context)
        return request

    def unary(behavior: Callable[..., Awaitable[Any]], streamed: bool) -> Callable[..., Any]:
        async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            return await behavior(await prepare(request, context, streamed), context)

        return guarded

    def streaming(
        behavior: Callable[..., AsyncIterator[Any]], streamed: bool
    ) -> Callable[..., Any]:
        async def guarded(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            async for item in behavior(await prepare(request, context, streamed), context):
                yield item

        return guarded

    kinds: dict[tuple[bool, bool], tuple[Callable[..., Any], Any, Callable[..., Any]]] = {
        (False, False): (grpc.unary_unary_rpc_method_handler, handler.unary_unary, unary),
        (False, True): (grpc.unary_stream_rpc_method_handler, handler.unary_stream, streaming),
        (True, False): (grpc.stream_unary_rpc_method_handler, handler.stream_unary, unary),
        (True, True): (grpc.stream_stream_rpc_method_handler, handler.stream_stream, streaming),
    }
    streamed = handler.request_streaming
    make, behavior, wrap = kinds[(streamed, handler.response_streaming)]
    wrapped: grpc.RpcMethodHandler[Any, Any] = make(
        wrap(behavior, streamed),
        request_deserializer=deserializer or handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
    return wrapped


Continuation: TypeAlias = Callable[
    [grpc.HandlerCallDetails], Awaitable["grpc.RpcMethodHandler[Any, Any] | None"]
]


class RoleGuard(grpc.aio.ServerInterceptor):
    """Checks every call against the role table before its handler runs: a caller whose role
    may not call the method gets PERMISSION_DENIED naming the roles it needs, and the handler
    never runs (nothing changes). Health and reflection are open (design/deployment.md)."""

    async def intercept_service(
        self, continuation: Continuation, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        method: str = details.method
        if handler is None or is_open(method):
            return handler

        async def check(context: grpc.aio.ServicerContext[Any, Any]) -> None:
            why = denial(method, caller_role(context))
            if why:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)

        return _rewrap(handler, before=check)


class _Undecodable:
    """A request message that did not decode (what :class:`DecodeGuard`'s deserializer
    returns instead of raising)."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


class DecodeGuard(grpc.aio.ServerInterceptor):
    """A request that does not decode as its method's message (random bytes, a truncated
    message) is answered INVALID_ARGUMENT saying so, and its handler never runs. Without it
    gRPC answers UNKNOWN and logs the decoder's traceback as a server error."""

    async def intercept_service(
        self, continuation: Continuation, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        decode = handler.request_deserializer
        method: str = details.method

        def deserialize(data: bytes) -> Any:
            try:
                return decode(data)
            except Exception as e:  # protobuf's DecodeError, or any decoder's
                return _Undecodable(
                    f"the request is not a valid message for {method} ({e}); send the"
                    " method's request message, serialized with protobuf"
                )

        async def check(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            if isinstance(request, _Undecodable):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.why)

        return _rewrap(handler, each=check, deserializer=deserialize)


async def add_health(server: grpc.aio.Server, services: Sequence[str]) -> HealthServicer:
    """Adds health and reflection for ``services`` (already added) and marks every one SERVING;
    the returned health servicer announces a graceful shutdown. The server is not started.
    (Imported here: clients, e.g. every ``placectl`` read, never load the server-side services.)"""
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection

    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [*services, health.SERVICE_NAME, reflection.SERVICE_NAME], server
    )
    for service in ("", *services):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    return health_servicer


async def set_serving(
    health_servicer: HealthServicer, services: Sequence[str], serving: bool
) -> None:
    """Every one of ``services`` (and the server as a whole, ``""``) SERVING or NOT_SERVING:
    what a process reports while it cannot do its work (a driver without an etcd quorum, an
    agent whose registration lapsed)."""
    from grpc_health.v1 import health_pb2

    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for service in ("", *services):
        await health_servicer.set(service, status)


async def start_server(server: grpc.aio.Server, services: Sequence[str]) -> HealthServicer:
    """:func:`add_health`, then starts the server."""
    health_servicer = await add_health(server, services)
    await server.start()
    return health_servicer


#: Domain error types and the status code each becomes; the first match wins.
StatusTable: TypeAlias = Sequence[tuple[type[PlacementError], grpc.StatusCode]]


def status_of(
    error: PlacementError, table: StatusTable, default: grpc.StatusCode
) -> grpc.StatusCode:
    """The code of the first entry of ``table`` that ``error`` is an instance of, or ``default``."""
    for kind, code in table:
        if isinstance(error, kind):
            return code
    return default


async def abort(
    context: grpc.aio.ServicerContext[Any, Any],
    error: PlacementError,
    table: StatusTable,
    default: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
) -> NoReturn:
    """Ends the call with ``error``'s status code (:func:`status_of`) and text."""
    await context.abort(status_of(error, table, default), str(error))
    raise AssertionError("unreachable: context.abort raises")


async def answer(
    context: grpc.aio.ServicerContext[Any, Any],
    work: Awaitable[T],
    table: StatusTable,
    default: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
) -> T:
    """``await work``; a :class:`PlacementError` ends the call through :func:`abort`."""
    try:
        return await work
    except PlacementError as e:
        await abort(context, e, table, default)


class PbEnum(Protocol[V_co]):
    """A generated protobuf enum (its ``Value(name)``)."""

    def Value(self, name: str) -> V_co: ...


def pb_enum_values(domain: type[E], pb_enum: PbEnum[V_co], prefix: str = "") -> dict[E, V_co]:
    """Every member of ``domain`` -> the value of ``pb_enum`` named ``prefix + member.name`` (a
    member without one fails on import)."""
    return {member: pb_enum.Value(prefix + member.name) for member in domain}
