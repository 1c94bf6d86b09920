"""Replication between agents on the wire: the one place (besides the servicers) that builds or
reads ``Append``/``Fetch`` protobuf (design/data-plane.md).

:class:`ReplicationPeers` sends plain :mod:`replica.data.model` messages to other agents over
channels from one :class:`~placement.rpc.ChannelPool` (``DATA_PROFILE``); the ``*_from_pb`` and
``*_to_pb`` functions convert for :mod:`replica.data.servicers` on the receiving side.
"""

from __future__ import annotations

from typing import Any

import grpc

from placement.rpc import DATA_PROFILE, ChannelPool, pb_enum_values
from placement.v1 import common_pb2, data_pb2, data_pb2_grpc
from replica.data.model import (
    AppendCall,
    AppendOutcome,
    AppendReply,
    FetchCall,
    FetchOutcome,
    FetchReply,
    PeerUnreachable,
)
from replica.data.storage import Entry

_APPEND_OUTCOMES = pb_enum_values(AppendOutcome, data_pb2.AppendOutcome, "APPEND_")
_FETCH_OUTCOMES = pb_enum_values(FetchOutcome, data_pb2.FetchOutcome, "FETCH_")
_APPEND_FROM_PB = {v: k for k, v in _APPEND_OUTCOMES.items()}
_FETCH_FROM_PB = {v: k for k, v in _FETCH_OUTCOMES.items()}


class ReplicationPeers:
    """``Append`` and ``Fetch`` to other agents by address; one channel per address."""

    def __init__(self) -> None:
        self._pool = ChannelPool(DATA_PROFILE)

    def _stub(self, address: str) -> data_pb2_grpc.ReplicationServiceAsyncStub:
        return data_pb2_grpc.ReplicationServiceStub(
            self._pool.get(address)
        )  # an AsyncStub on an aio channel

    async def _call(self, address: str, method: str, request: Any, rpc_timeout: float) -> Any:
        """One unary call; a gRPC failure is :class:`PeerUnreachable`."""
        try:
            return await getattr(self._stub(address), method)(request, timeout=rpc_timeout)
        except grpc.aio.AioRpcError as e:
            raise PeerUnreachable(str(e.code())) from e

    async def append(self, address: str, call: AppendCall, rpc_timeout: float) -> AppendReply:
        request = append_call_to_pb(call)
        return append_reply_from_pb(await self._call(address, "Append", request, rpc_timeout))

    async def fetch(self, address: str, call: FetchCall, rpc_timeout: float) -> FetchReply:
        request = fetch_call_to_pb(call)
        return fetch_reply_from_pb(await self._call(address, "Fetch", request, rpc_timeout))

    async def close(self) -> None:
        await self._pool.close()


def entry_from_pb(e: data_pb2.LogEntry) -> Entry:
    return Entry(e.index, e.epoch, e.key, e.value, e.delete)


def entry_to_pb(e: Entry) -> data_pb2.LogEntry:
    return data_pb2.LogEntry(
        index=e.index, epoch=e.epoch, key=e.key, value=e.value, delete=e.delete
    )


def append_call_to_pb(call: AppendCall) -> data_pb2.AppendRequest:
    return data_pb2.AppendRequest(
        partition=common_pb2.PartitionRef(zone=call.zone, partition=call.partition),
        lease_epoch=call.lease_epoch,
        primary=call.primary,
        prev_index=call.prev_index,
        prev_epoch=call.prev_epoch,
        entries=[entry_to_pb(e) for e in call.entries],
        commit_index=call.commit_index,
    )


def append_call_from_pb(request: data_pb2.AppendRequest) -> AppendCall:
    return AppendCall(
        zone=request.partition.zone,
        partition=request.partition.partition,
        lease_epoch=request.lease_epoch,
        primary=request.primary,
        prev_index=request.prev_index,
        prev_epoch=request.prev_epoch,
        entries=tuple(entry_from_pb(e) for e in request.entries),
        commit_index=request.commit_index,
    )


def append_reply_to_pb(reply: AppendReply) -> data_pb2.AppendResponse:
    return data_pb2.AppendResponse(
        outcome=_APPEND_OUTCOMES[reply.outcome],
        last_index=reply.last_index,
        last_epoch=reply.last_epoch,
        lease_epoch=reply.lease_epoch,
    )


def append_reply_from_pb(reply: data_pb2.AppendResponse) -> AppendReply:
    """An unknown outcome is a mismatch: the primary resends from the member's last index."""
    return AppendReply(
        _APPEND_FROM_PB.get(reply.outcome, AppendOutcome.MISMATCH),
        reply.last_index,
        reply.last_epoch,
        reply.lease_epoch,
    )


def fetch_call_to_pb(call: FetchCall) -> data_pb2.FetchRequest:
    ref = common_pb2.PartitionRef(zone=call.zone, partition=call.partition)
    if call.snapshot:
        return data_pb2.FetchRequest(
            partition=ref,
            node=call.node,
            snapshot=True,
            snapshot_after=call.snapshot_after,
            max_bytes=call.max_bytes,
        )
    return data_pb2.FetchRequest(
        partition=ref, node=call.node, after_index=call.after_index, max_bytes=call.max_bytes
    )


def fetch_call_from_pb(request: data_pb2.FetchRequest) -> FetchCall:
    return FetchCall(
        zone=request.partition.zone,
        partition=request.partition.partition,
        node=request.node,
        snapshot=request.snapshot,
        snapshot_after=request.snapshot_after,
        after_index=request.after_index,
        max_bytes=request.max_bytes,
    )


def fetch_reply_to_pb(reply: FetchReply) -> data_pb2.FetchResponse:
    if reply.outcome is not FetchOutcome.OK:
        return data_pb2.FetchResponse(outcome=_FETCH_OUTCOMES[reply.outcome])
    return data_pb2.FetchResponse(
        outcome=data_pb2.FETCH_OK,
        items=[data_pb2.KeyValue(key=k, value=v) for k, v in reply.items],
        entries=[entry_to_pb(e) for e in reply.entries],
        snapshot_done=reply.snapshot_done,
        snapshot_index=reply.snapshot_index,
        snapshot_epoch=reply.snapshot_epoch,
        commit_index=reply.commit_index,
        lease_epoch=reply.lease_epoch,
    )


def fetch_reply_from_pb(reply: data_pb2.FetchResponse) -> FetchReply:
    """An unknown outcome reads as OK (the learner applies whatever the reply carries)."""
    return FetchReply(
        _FETCH_FROM_PB.get(reply.outcome, FetchOutcome.OK),
        tuple((i.key, i.value) for i in reply.items),
        tuple(entry_from_pb(e) for e in reply.entries),
        reply.snapshot_done,
        reply.snapshot_index,
        reply.snapshot_epoch,
        reply.commit_index,
        reply.lease_epoch,
    )
