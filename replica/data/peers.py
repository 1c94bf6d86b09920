"""Replication between agents on the wire: the one place (besides the servicers) that builds or
reads ``Replicate``/``Fetch`` protobuf (design/data-plane.md, "The pair stream").

:class:`ReplicationPeers` sends plain :mod:`replica.data.model` messages to other agents over
channels from one :class:`~placement.rpc.ChannelPool` (``DATA_PROFILE``). Appends go through one
:class:`PairLink` per other node — the pair stream: every ``Append`` this agent's primaries have
for that node at a moment travels in one ``Replicate`` call (a few calls in flight, so batches
pipeline), and an idle link sends one empty call per heartbeat: the pair's liveness, instead of a
heartbeat per partition. The ``*_from_pb`` and ``*_to_pb`` functions convert for
:mod:`replica.data.servicers` on the receiving side.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from placement.aio import wait_event
from placement.core.retry import Clock
from placement.metrics import LINKS_DOWN
from placement.rpc import DATA_PROFILE, ChannelPool, pb_enum_values
from placement.security.tls import TlsMaterial
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

log = logging.getLogger(__name__)

_APPEND_OUTCOMES = pb_enum_values(AppendOutcome, data_pb2.AppendOutcome, "APPEND_")
_FETCH_OUTCOMES = pb_enum_values(FetchOutcome, data_pb2.FetchOutcome, "FETCH_")
_APPEND_FROM_PB = {v: k for k, v in _APPEND_OUTCOMES.items()}
_FETCH_FROM_PB = {v: k for k, v in _FETCH_OUTCOMES.items()}

#: Most appends one ``Replicate`` carries (the receiver refuses more).
MAX_BATCH_APPENDS = 4096
#: A batch closes once its entries pass this many bytes (far below the message limit).
MAX_BATCH_BYTES = 8 << 20
#: Requests one link keeps unanswered on its stream (batches pipeline behind each other).
MAX_IN_FLIGHT = 4
#: Seconds a link no longer wanted stays open after its last append (a new primary's first
#: appends, before it knows its members, keep using it).
LINGER = 30.0


@dataclass(frozen=True, slots=True)
class LinkConfig:
    """``heartbeat``: an idle link's empty call, seconds; ``down_after``: seconds without any
    answer after which the peer counts as down (its appends fail at once until it answers)."""

    heartbeat: float = 1.0
    down_after: float = 3.0


@dataclass(slots=True)
class _Pending:
    call: AppendCall
    future: asyncio.Future[AppendReply]
    deadline: float
    #: Streams this append was written to (a stream that broke is resent once).
    sent: int = 0


@dataclass(slots=True)
class _Stream:
    """One ``Replicate`` stream: the batches written to it and not answered yet, oldest first
    (the receiver answers in order, so each answer is for the oldest)."""

    call: Any
    batches: deque[list[_Pending]] = field(default_factory=deque)
    reader: asyncio.Task[None] | None = None


class PairLink:
    """The pair stream from this agent (``me``) to the agent ``peer`` at ``address``: one
    long-lived bidirectional ``Replicate`` stream (opened again on the next send after it
    breaks), every request a batch of appends, every answer in request order.

    States: UP (answered within ``down_after``) -> DOWN (no answer for ``down_after``:
    ``on_down(peer)`` is called once, appends fail at once) -> UP (any answer).
    """

    def __init__(
        self,
        pool: ChannelPool,
        me: str,
        peer: str,
        address: str,
        config: LinkConfig,
        on_down: Callable[[str], None],
        clock: Clock = time.monotonic,
    ) -> None:
        self.me, self.peer, self.address = me, peer, address
        self._pool = pool
        self._stub: Any = data_pb2_grpc.ReplicationServiceStub(pool.get(address))
        self._config = config
        self._on_down = on_down
        self._clock = clock
        self._queue: deque[_Pending] = deque()
        self._wake = asyncio.Event()
        self._stream: _Stream | None = None
        self._side: set[asyncio.Task[object]] = set()
        self.last_answer = clock()
        self.last_sent = clock()
        #: When an append was last queued (heartbeats do not count).
        self.last_used = clock()
        self.down = False
        #: Streams opened (the first, and one after each break).
        self.streams_opened = 0
        self._task = asyncio.create_task(self._run(), name=f"link {me}->{peer}")

    async def append(self, call: AppendCall, timeout: float) -> AppendReply:  # noqa: ASYNC109
        """Send ``call`` in the next batch; raises :class:`PeerUnreachable` when the peer is down
        or no answer came within ``timeout`` seconds."""
        if self.down:
            raise PeerUnreachable(
                f"{self.peer} has not answered for {self._config.down_after:g} s (DOWN)"
            )
        future: asyncio.Future[AppendReply] = asyncio.get_running_loop().create_future()
        self.last_used = self._clock()
        self._queue.append(_Pending(call, future, self._clock() + timeout))
        self._wake.set()
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise PeerUnreachable("DEADLINE_EXCEEDED") from None

    @property
    def in_flight(self) -> int:
        """Batches written to the stream and not answered yet."""
        return len(self._stream.batches) if self._stream is not None else 0

    def idle(self, now: float) -> bool:
        """No append queued, in flight or queued for ``LINGER`` seconds (heartbeats aside)."""
        return not self._queue and self.in_flight <= 1 and now - self.last_used > LINGER

    async def close(self) -> None:
        self._task.cancel()
        for task in self._side:
            task.cancel()
        await asyncio.gather(self._task, *self._side, return_exceptions=True)
        if self._stream is not None:
            self._break(self._stream, PeerUnreachable("the link closed"), resend=False)
        self._fail_queue(PeerUnreachable("the link closed"))

    async def _run(self) -> None:
        while True:
            await wait_event(self._wake, self._config.heartbeat)
            self._wake.clear()
            # Corked for one event-loop round: the appends of every primary woken in the same
            # round (by one group commit, say) share the request.
            await asyncio.sleep(0)
            self._check_down()
            while self._queue and self.in_flight < MAX_IN_FLIGHT:
                await self._send(self._take_batch())
            idle = self._clock() - self.last_sent >= self._config.heartbeat
            if idle and self.in_flight == 0 and not self._queue:
                await self._send([])  # the pair's heartbeat

    def _take_batch(self) -> list[_Pending]:
        batch: list[_Pending] = []
        size = 0
        while self._queue and len(batch) < MAX_BATCH_APPENDS and size < MAX_BATCH_BYTES:
            pending = self._queue.popleft()
            if pending.future.done():  # its sender stopped waiting
                continue
            batch.append(pending)
            size += sum(e.size for e in pending.call.entries)
        return batch

    def _spawn_side(self, work: Coroutine[Any, Any, object]) -> None:
        """Run ``work`` beside the link (cancelled when it closes)."""
        task = asyncio.create_task(work)
        self._side.add(task)
        task.add_done_callback(self._side.discard)

    def _open(self) -> _Stream:
        stream = _Stream(self._stub.Replicate())
        stream.reader = asyncio.create_task(self._read(stream), name=f"link {self.peer} answers")
        self._stream = stream
        self.streams_opened += 1
        return stream

    async def _send(self, batch: list[_Pending]) -> None:
        """Write ``batch`` (empty: a heartbeat) to the stream, opening one if there is none. A
        write the peer does not take within ``down_after`` (its flow-control window is full)
        breaks the stream."""
        stream = self._stream or self._open()
        request = data_pb2.ReplicateRequest(
            from_node=self.me, to_node=self.peer, appends=[append_call_to_pb(p.call) for p in batch]
        )
        for pending in batch:
            pending.sent += 1
        stream.batches.append(batch)
        self.last_sent = self._clock()
        try:
            async with asyncio.timeout(self._config.down_after):
                await stream.call.write(request)
        except TimeoutError:
            self._break(stream, PeerUnreachable("the peer takes no more data"), resend=False)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the link is closing
            # else the stream was broken (cancelled) under the write: its batches are dealt with
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # the stream ended under the write: its reader breaks it and says why

    async def _read(self, stream: _Stream) -> None:
        """Answer the stream's batches in order until it ends; then break it."""
        try:
            while True:
                reply = await stream.call.read()
                if reply is grpc.aio.EOF:
                    self._break(stream, PeerUnreachable("the peer ended the stream"), True)
                    return
                if not stream.batches:
                    why = "the peer answered a request it was not sent"
                    self._break(stream, PeerUnreachable(why), resend=False)
                    return
                self._answered(stream.batches.popleft(), reply)
        except grpc.aio.AioRpcError as e:
            # UNAVAILABLE: the connection broke (a restart, a reset) — or the peer answered
            # with an error it maps to UNAVAILABLE: what the stream carried is resent once on a
            # new stream (harmless either way: a follower skips entries it holds); any other
            # status is the peer's answer to these appends.
            resend = e.code() == grpc.StatusCode.UNAVAILABLE
            self._break(stream, PeerUnreachable(f"{e.code()}: {e.details()}"), resend)
            # A peer refusing this agent's certificate shows only as a closed socket: the pool's
            # probe says so in the log (ReplicationPeers), off this link's path.
            self._spawn_side(
                self._pool.refusal(self.address, e.details() or "", self._config.heartbeat)
            )

    def _answered(self, batch: list[_Pending], reply: data_pb2.ReplicateResponse) -> None:
        self.last_answer = self._clock()
        if self.down:
            self.down = False
            log.info("replication link to %s (%s) answers again", self.peer, self.address)
        replies = reply.replies
        for i, pending in enumerate(batch):
            if pending.future.done():
                continue
            if i < len(replies):
                pending.future.set_result(append_reply_from_pb(replies[i]))
            else:
                pending.future.set_exception(PeerUnreachable("the reply lacks this append"))
        if self._queue:
            self._wake.set()

    def _break(self, stream: _Stream, error: PeerUnreachable, resend: bool) -> None:
        """End ``stream``: its unanswered appends are queued again (``resend``, first stream
        only, before their deadline) or fail with ``error``; the next send opens a new one."""
        if self._stream is stream:
            self._stream = None
        stream.call.cancel()
        if stream.reader is not None and stream.reader is not asyncio.current_task():
            stream.reader.cancel()
        now = self._clock()
        again: list[_Pending] = []
        while stream.batches:
            for pending in stream.batches.popleft():
                if pending.future.done():
                    continue
                if resend and pending.sent < 2 and pending.deadline > now and not self.down:
                    again.append(pending)
                else:
                    pending.future.set_exception(error)
        self._queue.extendleft(reversed(again))
        if self._queue:
            self._wake.set()  # what waits behind the broken stream goes out on a new one

    def _fail_queue(self, error: PeerUnreachable) -> None:
        for pending in self._queue:
            if not pending.future.done():
                pending.future.set_exception(error)
        self._queue.clear()

    def _check_down(self) -> None:
        if not self.down and self._clock() - self.last_answer > self._config.down_after:
            self.down = True
            log.warning(
                "replication link to %s (%s): no answer for %.1f s; the peer is down",
                self.peer,
                self.address,
                self._config.down_after,
            )
            self._fail_queue(PeerUnreachable(f"{self.peer} is down"))
            if self._stream is not None and self._stream.batches:
                # a peer that hung with the connection open: its stream would only end by
                # keep-alive; the next heartbeat opens a new one (a resumed peer answers it)
                self._break(self._stream, PeerUnreachable(f"{self.peer} is down"), resend=False)
            LINKS_DOWN.inc()
            self._on_down(self.peer)


def _log_refusal(address: str, why: str) -> None:
    """One line per probe that finds a peer refusing this agent's certificate. The link still
    counts the peer as down: one misconfigured peer must not stop this agent."""
    log.error("replication to %s: %s", address, why)


class ReplicationPeers:
    """Appends (through one :class:`PairLink` per node) and ``Fetch`` to other agents."""

    def __init__(
        self,
        me: str = "",
        config: LinkConfig | None = None,
        on_down: Callable[[str], None] = lambda node: None,
        tls: TlsMaterial | None = None,
    ) -> None:
        self._pool = ChannelPool(DATA_PROFILE, tls, on_refused=_log_refusal)
        self._me = me
        self._config = config or LinkConfig()
        self._on_down = on_down
        self._links: dict[str, PairLink] = {}

    def link(self, node: str, address: str) -> PairLink:
        """The link to ``node`` at ``address`` (a new one when its address changed)."""
        found = self._links.get(node)
        if found is None or found.address != address:
            if found is not None:
                asyncio.get_running_loop().create_task(found.close())
            found = self._links[node] = PairLink(
                self._pool, self._me, node, address, self._config, self._on_down
            )
        return found

    def is_down(self, node: str) -> bool:
        link = self._links.get(node)
        return link is not None and link.down

    async def keep(self, nodes: Mapping[str, str]) -> None:
        """Keep (or open) the links to ``nodes`` (name -> address); close every other one once
        it is idle (a link in use — say by a new primary's first appends — stays)."""
        now = time.monotonic()
        for node, link in list(self._links.items()):
            if node not in nodes and link.idle(now):
                await self._links.pop(node).close()
        for node, address in nodes.items():
            if address:
                self.link(node, address)

    async def append(
        self, node: str, address: str, call: AppendCall, rpc_timeout: float
    ) -> AppendReply:
        return await self.link(node, address).append(call, rpc_timeout)

    async def fetch(self, address: str, call: FetchCall, rpc_timeout: float) -> FetchReply:
        stub: Any = data_pb2_grpc.ReplicationServiceStub(self._pool.get(address))
        try:
            reply = await stub.Fetch(fetch_call_to_pb(call), timeout=rpc_timeout)
        except grpc.aio.AioRpcError as e:
            raise PeerUnreachable(str(e.code())) from e
        return fetch_reply_from_pb(reply)

    async def close(self) -> None:
        links, self._links = list(self._links.values()), {}
        for link in links:
            await link.close()
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
        tail=call.tail,
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
        tail=request.tail,
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
    partitions, partition = call.select or (0, 0)
    if call.snapshot:
        return data_pb2.FetchRequest(
            partition=ref,
            node=call.node,
            snapshot=True,
            snapshot_after=call.snapshot_after,
            max_bytes=call.max_bytes,
            select_partitions=partitions,
            select_partition=partition,
        )
    return data_pb2.FetchRequest(
        partition=ref,
        node=call.node,
        seal_attempt=call.seal_attempt,
        after_index=call.after_index,
        max_bytes=call.max_bytes,
        select_partitions=partitions,
        select_partition=partition,
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
        select=(
            (request.select_partitions, request.select_partition)
            if request.select_partitions
            else None
        ),
        seal_attempt=request.seal_attempt,
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
        scanned_after=reply.scanned_after,
        scanned_to=reply.scanned_to,
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
        reply.scanned_after,
        reply.scanned_to,
    )
