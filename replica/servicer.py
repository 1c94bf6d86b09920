"""The gRPC edge of the rebalance protocol: ``ReplicaService`` over a :class:`ReplicaAgent`.

The only module of the agent's rebalance side that reads or builds protobuf (design/architecture.md,
"Protobuf at the edges"); validation and decisions stay in :mod:`replica.protocol` and
:mod:`replica.service`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable
from typing import Any, TypeAlias

import grpc

from placement.errors import InvalidInput, PlacementError
from placement.rpc import StatusTable, answer, pb_enum_values, status_of
from placement.v1 import common_pb2, replica_pb2, replica_pb2_grpc
from replica.protocol import (
    CancelOutcome,
    Decision,
    MoveRequest,
    Phase,
    RebalanceOutcome,
    RetireOutcome,
    RetireRequest,
)
from replica.service import ReplicaAgent, UnknownPartition

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

log = logging.getLogger(__name__)


_REBALANCE_OUTCOMES = pb_enum_values(RebalanceOutcome, replica_pb2.RebalanceOutcome)
_CANCEL_OUTCOMES = pb_enum_values(CancelOutcome, replica_pb2.CancelOutcome)
_RETIRE_OUTCOMES = pb_enum_values(RetireOutcome, replica_pb2.RetireOutcome)
_PHASES = pb_enum_values(Phase, replica_pb2.MovePhase, "MOVE_PHASE_")


def _move_request(
    msg: replica_pb2.RebalanceRequest | replica_pb2.CancelRebalanceRequest,
) -> MoveRequest:
    return MoveRequest(
        zone=msg.partition.zone,
        partition=msg.partition.partition,
        old_peers=tuple(msg.old_peers.names),
        new_peers=tuple(msg.new_peers.names),
        revision=msg.revision,
        epoch=msg.epoch,
    )


def _retire_request(msg: replica_pb2.RetireRequest) -> RetireRequest:
    return RetireRequest(
        zone=msg.partition.zone,
        partition=msg.partition.partition,
        stable_peers=tuple(msg.stable_peers.names),
        revision=msg.revision,
        epoch=msg.epoch,
    )


async def _each(work: Iterable[Awaitable[Decision[Any]]]) -> list[Decision[Any] | str]:
    """The decisions of a batch call, concurrently (their commits share the agent's group
    commits), in order; a request refused as the single call would refuse it is the status and
    reason instead (answered with outcome UNSPECIFIED), the others unaffected."""
    decided = await asyncio.gather(*work, return_exceptions=True)
    out: list[Decision[Any] | str] = []
    for d in decided:
        if isinstance(d, PlacementError):
            out.append(f"{status_of(d, STATUS_OF, grpc.StatusCode.UNAVAILABLE).name}: {d}")
        elif isinstance(d, Exception):  # a bug in one decision fails that one alone
            log.error("a batched request failed", exc_info=d)
            out.append(f"INTERNAL: {type(d).__name__}: {d}")
        elif isinstance(d, BaseException):
            raise d
        else:
            out.append(d)
    return out


def _accepted(d: Decision[Any]) -> dict[str, Any]:
    """The fields every decision answer carries besides its outcome."""
    return {
        "accepted_revision": d.record.accepted_revision,
        "accepted_epoch": d.record.accepted_epoch,
        "detail": d.detail,
    }


#: The agent's errors as status codes (any other :class:`PlacementError` is UNAVAILABLE).
STATUS_OF: StatusTable = (
    (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (UnknownPartition, grpc.StatusCode.NOT_FOUND),
)


class ReplicaServicer(replica_pb2_grpc.ReplicaServiceServicer):
    """Protobuf ↔ domain at the edge; errors to status codes in one place (:data:`STATUS_OF`)."""

    def __init__(self, agent: ReplicaAgent) -> None:
        self._agent = agent

    async def Rebalance(
        self, request: replica_pb2.RebalanceRequest, context: Context
    ) -> replica_pb2.RebalanceResponse:
        d = await answer(context, self._agent.rebalance(_move_request(request)), STATUS_OF)
        return replica_pb2.RebalanceResponse(outcome=_REBALANCE_OUTCOMES[d.outcome], **_accepted(d))

    async def RebalanceBatch(
        self, request: replica_pb2.RebalanceBatchRequest, context: Context
    ) -> replica_pb2.RebalanceBatchResponse:
        """Every request decided as :meth:`Rebalance` decides it (:func:`_each`)."""
        decided = await _each(self._agent.rebalance(_move_request(r)) for r in request.requests)
        return replica_pb2.RebalanceBatchResponse(
            responses=[
                replica_pb2.RebalanceResponse(detail=d)
                if isinstance(d, str)
                else replica_pb2.RebalanceResponse(
                    outcome=_REBALANCE_OUTCOMES[d.outcome], **_accepted(d)
                )
                for d in decided
            ]
        )

    async def RetireBatch(
        self, request: replica_pb2.RetireBatchRequest, context: Context
    ) -> replica_pb2.RetireBatchResponse:
        """Every request decided as :meth:`Retire` decides it (:func:`_each`)."""
        decided = await _each(self._agent.retire(_retire_request(r)) for r in request.requests)
        return replica_pb2.RetireBatchResponse(
            responses=[
                replica_pb2.RetireResponse(detail=d)
                if isinstance(d, str)
                else replica_pb2.RetireResponse(outcome=_RETIRE_OUTCOMES[d.outcome], **_accepted(d))
                for d in decided
            ]
        )

    async def CancelRebalance(
        self, request: replica_pb2.CancelRebalanceRequest, context: Context
    ) -> replica_pb2.CancelRebalanceResponse:
        d = await answer(context, self._agent.cancel(_move_request(request)), STATUS_OF)
        return replica_pb2.CancelRebalanceResponse(
            outcome=_CANCEL_OUTCOMES[d.outcome], **_accepted(d)
        )

    async def Retire(
        self, request: replica_pb2.RetireRequest, context: Context
    ) -> replica_pb2.RetireResponse:
        d = await answer(context, self._agent.retire(_retire_request(request)), STATUS_OF)
        return replica_pb2.RetireResponse(outcome=_RETIRE_OUTCOMES[d.outcome], **_accepted(d))

    async def ListHosted(
        self, request: replica_pb2.ListHostedRequest, context: Context
    ) -> replica_pb2.ListHostedResponse:
        hosted = await answer(context, self._agent.hosted(), STATUS_OF)
        return replica_pb2.ListHostedResponse(
            partitions=[common_pb2.PartitionRef(zone=z, partition=p) for z, p in hosted]
        )

    async def GetPartitionState(
        self, request: replica_pb2.GetPartitionStateRequest, context: Context
    ) -> replica_pb2.GetPartitionStateResponse:
        ref = request.partition
        record = await answer(context, self._agent.state(ref.zone, ref.partition), STATUS_OF)
        move = record.move
        return replica_pb2.GetPartitionStateResponse(
            current_peers=common_pb2.Peers(names=record.config),
            rebalance_in_progress=move is not None and move.phase is Phase.IN_PROGRESS,
            accepted_revision=record.accepted_revision,
            accepted_epoch=record.accepted_epoch,
            phase=replica_pb2.MOVE_PHASE_IDLE if move is None else _PHASES[move.phase],
            detail="" if move is None else f"move of revision {move.revision}: {move.phase.value}",
            hosted=record.hosted,
        )
