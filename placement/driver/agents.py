"""The driver's gRPC client of replica agents (``ReplicaService``). Protobuf stays in here.

One channel per agent address from :class:`placement.rpc.ChannelPool` with
:data:`~placement.rpc.AGENT_PROFILE` (keepalive **and** a ping timeout, so a SIGSTOPped agent is
noticed; a capped reconnect backoff), and a deadline on every call. Transport failures raise
:class:`AgentUnavailable`; answers come back as :class:`AgentAnswer` with the outcome's enum name
(``ACCEPTED``/``DONE``/``STALE``/``FAILED``; ``CANCELLED``/``NOTHING_TO_CANCEL``/
``ALREADY_DONE``/``CANCEL_STALE``; ``RETIRED``/``KEPT``/``RETIRE_STALE``).

Rebalance and Retire requests to one agent are batched (:class:`placement.aio.Coalescer` per
address and kind): the ones made while a ``RebalanceBatch`` / ``RetireBatch`` call to that agent
is in flight go out together in the next, so a thousand concurrent moves cost a few calls per
agent, not a thousand (an agent that does not know the batch call gets single calls).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import grpc

from placement.aio import Coalescer
from placement.core.model import Peers
from placement.errors import PlacementError
from placement.rpc import AGENT_PROFILE, ChannelPool
from placement.security.tls import TlsMaterial
from placement.v1 import common_pb2, replica_pb2, replica_pb2_grpc

log = logging.getLogger(__name__)


class AgentUnavailable(PlacementError):
    """The agent did not answer (down, frozen, refused): retry with backoff."""


@dataclass(frozen=True, slots=True)
class AgentAnswer:
    outcome: str
    accepted_revision: int
    accepted_epoch: int
    detail: str = ""


class AgentClient:
    """Calls agents by address; ``timeout`` is every call's deadline in seconds; ``tls``: the
    driver's certificate (mutual TLS), None for plaintext."""

    def __init__(self, *, timeout: float = 3.0, tls: TlsMaterial | None = None) -> None:
        self.timeout = timeout
        self._channels = ChannelPool(AGENT_PROFILE, tls, on_refused=_log_refusal)
        #: (address, single method) -> its batcher
        self._batches: dict[tuple[str, str], Coalescer[Any, AgentAnswer | AgentUnavailable]] = {}
        #: (address, single method) of agents that answered its batch call UNIMPLEMENTED.
        self._unbatched: set[tuple[str, str]] = set()
        #: Batch calls made and the requests they carried (for tests and benchmarks).
        self.batch_calls = 0
        self.batched = 0

    def _stub(self, address: str) -> replica_pb2_grpc.ReplicaServiceAsyncStub:
        # an AsyncStub on an aio channel
        return replica_pb2_grpc.ReplicaServiceStub(self._channels.get(address))

    async def close(self) -> None:
        for batches in self._batches.values():
            await batches.close()
        self._batches.clear()
        await self._channels.close()

    async def _call(self, address: str, method: str, request: Any, outcomes: Any) -> AgentAnswer:
        """One unary call; every gRPC failure is :class:`AgentUnavailable` (the caller retries)."""
        try:
            response = await getattr(self._stub(address), method)(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as e:
            raise await self._unavailable(address, method, e) from e
        return AgentAnswer(
            outcomes.Name(response.outcome),
            response.accepted_revision,
            response.accepted_epoch,
            response.detail,
        )

    async def rebalance(
        self,
        address: str,
        zone: str,
        partition: int,
        old: Peers,
        new: Peers,
        revision: int,
        epoch: int,
        *,
        cancel: bool = False,
    ) -> AgentAnswer:
        """Send ``Rebalance`` ``old -> new`` (``CancelRebalance`` of that move when ``cancel``)."""
        method, request_type, outcomes = _CANCEL if cancel else _REBALANCE
        request = request_type(
            partition=common_pb2.PartitionRef(zone=zone, partition=partition),
            old_peers=common_pb2.Peers(names=list(old)),
            new_peers=common_pb2.Peers(names=list(new)),
            revision=revision,
            epoch=epoch,
        )
        if cancel:
            return await self._call(address, method, request, outcomes)
        return await self._batched(address, _REBALANCE_BATCH, request)

    async def _batched(self, address: str, kind: _Batch, request: Any) -> AgentAnswer:
        """``request`` in the next batch call of its kind to ``address`` (single calls to an
        agent that does not know the batch call)."""
        if (address, kind.single) in self._unbatched:
            return await self._call(address, kind.single, request, kind.outcomes)
        batches = self._batches.get((address, kind.single))
        if batches is None:
            batches = self._batches[address, kind.single] = Coalescer(
                lambda requests: self._batch(address, kind, requests),
                limit=BATCH_LIMIT,
                name=f"{kind.method} {address}",
            )
        result = await batches.submit(request)
        if isinstance(result, AgentUnavailable):
            raise result
        return result

    async def _batch(
        self, address: str, kind: _Batch, requests: list[Any]
    ) -> list[AgentAnswer | AgentUnavailable]:
        """One batch call; a transport failure fails every request of it."""
        if (address, kind.single) in self._unbatched:  # learnt while this batch waited
            return await self._singles(address, kind, requests)
        self.batch_calls += 1
        self.batched += len(requests)
        # the agent decides a batch's requests concurrently, yet each may read its in-sync set
        # and they share its store thread: the deadline grows with the batch
        timeout = self.timeout + BATCH_SECONDS_PER_REQUEST * len(requests)
        try:
            response = await getattr(self._stub(address), kind.method)(
                kind.request(requests=requests), timeout=timeout
            )
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                self._unbatched.add((address, kind.single))
                return await self._singles(address, kind, requests)
            error = await self._unavailable(address, kind.method, e)
            return [error] * len(requests)
        if len(response.responses) != len(requests):
            error = AgentUnavailable(
                f"{address}: {kind.method}: {len(response.responses)} answers "
                f"to {len(requests)} requests"
            )
            return [error] * len(requests)
        return [
            AgentAnswer(
                kind.outcomes.Name(r.outcome), r.accepted_revision, r.accepted_epoch, r.detail
            )
            if r.outcome != 0  # the enum's UNSPECIFIED: refused, the reason in detail
            else AgentUnavailable(f"{address}: {kind.single}: {r.detail}")
            for r in response.responses
        ]

    async def _singles(
        self, address: str, kind: _Batch, requests: list[Any]
    ) -> list[AgentAnswer | AgentUnavailable]:
        """The batch's requests as single calls, concurrently (an agent without the batch
        call)."""

        async def single(request: Any) -> AgentAnswer | AgentUnavailable:
            try:
                return await self._call(address, kind.single, request, kind.outcomes)
            except AgentUnavailable as e:
                return e

        return list(await asyncio.gather(*(single(r) for r in requests)))

    async def retire(
        self,
        address: str,
        zone: str,
        partition: int,
        stable: Peers,
        revision: int,
        epoch: int,
    ) -> AgentAnswer:
        """Tell a node that left stable (as of etcd ``revision``) to drop its replica."""
        request = replica_pb2.RetireRequest(
            partition=common_pb2.PartitionRef(zone=zone, partition=partition),
            stable_peers=common_pb2.Peers(names=list(stable)),
            revision=revision,
            epoch=epoch,
        )
        return await self._batched(address, _RETIRE_BATCH, request)

    async def answers(self, address: str, timeout: float) -> bool:  # noqa: ASYNC109
        """Whether the agent's process answers a health check within ``timeout`` seconds (any
        answer counts, even NOT_SERVING or UNIMPLEMENTED: only a transport failure or no
        answer in time means it is not there)."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self._channels.get(address))
        try:
            await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.aio.AioRpcError as e:
            return e.code() not in SILENT_CODES
        return True

    async def hosted_partitions(self, address: str) -> set[tuple[str, int]]:
        """Every (zone, partition) the agent holds a complete replica of."""
        try:
            response = await self._stub(address).ListHosted(
                replica_pb2.ListHostedRequest(), timeout=self.timeout
            )
        except grpc.aio.AioRpcError as e:
            raise await self._unavailable(address, "ListHosted", e) from e
        return {(p.zone, p.partition) for p in response.partitions}

    async def hosted(self, address: str, zone: str, partition: int) -> bool:
        """Whether the agent holds a complete replica of the partition (False if unknown)."""
        request = replica_pb2.GetPartitionStateRequest(
            partition=common_pb2.PartitionRef(zone=zone, partition=partition)
        )
        try:
            response = await self._stub(address).GetPartitionState(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return False
            raise await self._unavailable(address, "GetPartitionState", e) from e
        return response.hosted

    async def _unavailable(
        self, address: str, method: str, error: grpc.aio.AioRpcError
    ) -> AgentUnavailable:
        """The error to retry later; when the agent refuses the driver's certificate (gRPC
        shows only a closed socket) it says so, naming the flag to fix (and the pool logs it
        as an error, once per probe). The driver keeps running: one misconfigured agent must
        not stop the control plane (design/deployment.md, "Credential errors")."""
        why = await self._channels.refusal(address, error.details() or "", self.timeout)
        if why is not None:
            return AgentUnavailable(f"{address}: {method}: {why}")
        return AgentUnavailable(f"{address}: {method}: {error.code().name} {error.details()}")


#: A health check failing with one of these did not reach a live process.
SILENT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

#: Requests per batch call, and what each adds to the call's deadline.
BATCH_LIMIT = 256
BATCH_SECONDS_PER_REQUEST = 0.01


@dataclass(frozen=True, slots=True)
class _Batch:
    """A call the client batches: the single method, its batch method and request message,
    and the single answer's outcome enum."""

    single: str
    method: str
    request: Any
    outcomes: Any


_REBALANCE_BATCH = _Batch(
    "Rebalance",
    "RebalanceBatch",
    replica_pb2.RebalanceBatchRequest,
    replica_pb2.RebalanceOutcome,
)
_RETIRE_BATCH = _Batch(
    "Retire", "RetireBatch", replica_pb2.RetireBatchRequest, replica_pb2.RetireOutcome
)


def _log_refusal(address: str, why: str) -> None:
    log.error("agent %s: %s", address, why)


# (method, request message, outcome enum) of a move and of its cancellation
_REBALANCE: tuple[str, Any, Any] = (
    "Rebalance",
    replica_pb2.RebalanceRequest,
    replica_pb2.RebalanceOutcome,
)
_CANCEL: tuple[str, Any, Any] = (
    "CancelRebalance",
    replica_pb2.CancelRebalanceRequest,
    replica_pb2.CancelOutcome,
)
