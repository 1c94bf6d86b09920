"""The pair stream and hibernation (design/data-plane.md, "The pair stream", "Hibernation").

* a :class:`PairLink` against a real gRPC server: concurrent appends of many partitions travel in
  few requests of one long-lived ``Replicate`` stream, each answered in order; an idle link sends
  only heartbeats; a peer that stops answering is DOWN after ``down_after`` (``on_down`` once,
  appends fail at once, its hung stream given up) and UP again when it answers on a new one; a
  stream that breaks is opened again, what it carried resent once;
* a READY cluster at rest (real etcd, driver, agents as subprocesses): no replica's database is
  written and no in-sync set changes — idle partitions send nothing; a write wakes its partition;
* a member SIGKILLed while no client writes: every in-sync set drops it anyway (its registration
  lease expires, its primaries are woken), without any write.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from test_data_plane import LEASES, Agents, all_in_sync, isr_of, put
from test_data_plane import agents as agents  # the fixture
from test_driver import TIMEOUT, eventually, leader_fence, running_driver

from placement.core.model import ZoneSpec
from placement.metastore.etcd import EtcdClient
from placement.metastore.keys import KeySpace
from placement.metastore.store import Metastore
from placement.rpc import DATA_PROFILE, ChannelPool
from placement.v1 import data_pb2, data_pb2_grpc
from replica.data.model import AppendCall, AppendOutcome, AppendReply, PeerUnreachable
from replica.data.peers import LinkConfig, PairLink, append_reply_to_pb


class Follower(data_pb2_grpc.ReplicationServiceServicer):
    """A real ``ReplicationService`` that records each request of its ``Replicate`` streams and
    answers every append OK at its ``prev_index`` + number of entries — or, while ``paused``,
    does not answer; ``end_next`` ends the stream with that status on the next request."""

    def __init__(self) -> None:
        self.calls: list[int] = []  # appends per request (0 = heartbeat)
        self.streams = 0
        self.running = asyncio.Event()
        self.running.set()
        self.end_next: grpc.StatusCode | None = None

    async def Replicate(
        self, requests: AsyncIterator[data_pb2.ReplicateRequest], context: Any
    ) -> AsyncIterator[data_pb2.ReplicateResponse]:
        self.streams += 1
        async for request in requests:
            await self.running.wait()
            self.calls.append(len(request.appends))
            assert request.to_node == "b"
            assert request.from_node == "a"
            if self.end_next is not None and request.appends:
                code, self.end_next = self.end_next, None
                await context.abort(code, "ended by the test")
            yield data_pb2.ReplicateResponse(
                replies=[
                    append_reply_to_pb(
                        AppendReply(
                            AppendOutcome.OK, a.prev_index + len(a.entries), 0, a.lease_epoch
                        )
                    )
                    for a in request.appends
                ]
            )


@pytest.fixture
async def follower() -> Any:
    servicer = Follower()
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    data_pb2_grpc.add_ReplicationServiceServicer_to_server(servicer, server)
    await server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        servicer.running.set()
        await server.stop(None)


def call(partition: int, prev: int) -> AppendCall:
    return AppendCall("z", partition, 3, "a", prev, 3, (), prev)


async def test_a_pair_link_batches_answers_in_order_and_detects_a_silent_peer(
    follower: tuple[Follower, str],
) -> None:
    servicer, address = follower
    pool = ChannelPool(DATA_PROFILE)
    downs: list[str] = []
    down_at: list[float] = []

    def on_down(node: str) -> None:
        downs.append(node)
        down_at.append(time.monotonic())

    link = PairLink(pool, "a", "b", address, LinkConfig(heartbeat=0.2, down_after=1.0), on_down)
    try:
        # 200 partitions' appends at once: few calls, each reply for its own append.
        replies = await asyncio.gather(*(link.append(call(p, p * 10), 5.0) for p in range(200)))
        assert [r.last_index for r in replies] == [p * 10 for p in range(200)]
        data_calls = [n for n in servicer.calls if n]
        assert sum(data_calls) == 200
        assert len(data_calls) <= 20, data_calls  # batched, not one request per partition
        assert servicer.streams == link.streams_opened == 1  # one long-lived stream

        # Idle: only empty calls (heartbeats), about one per heartbeat interval.
        servicer.calls.clear()
        await asyncio.sleep(1.0)
        assert servicer.calls, "an idle link sent no heartbeat"
        assert all(n == 0 for n in servicer.calls), servicer.calls
        assert len(servicer.calls) <= 8, servicer.calls

        # The peer stops answering: DOWN after down_after, on_down once, appends fail at once.
        servicer.running.clear()
        started = time.monotonic()
        await eventually_true(lambda: link.down, 5.0)
        assert downs == ["b"]
        assert down_at[0] - link.last_answer >= 1.0  # silent for down_after, not less
        assert down_at[0] - started <= 3.0
        t = time.monotonic()
        with pytest.raises(PeerUnreachable, match="DOWN"):
            await link.append(call(1, 10), 5.0)
        assert time.monotonic() - t < 0.5

        # It answers again: UP, and appends go through.
        servicer.running.set()
        await eventually_true(lambda: not link.down, 5.0)
        assert (await link.append(call(1, 10), 5.0)).last_index == 10
        assert downs == ["b"]
        # the hung stream was given up when the peer went DOWN; a new one carried the rest
        assert servicer.streams == link.streams_opened == 2
    finally:
        await link.close()
        await pool.close()


async def test_a_broken_pair_stream_is_opened_again_and_its_appends_resent_once(
    follower: tuple[Follower, str],
) -> None:
    """A stream that breaks with UNAVAILABLE (a reset connection) is opened again on the next
    send, and the appends it carried unanswered are resent once on the new stream; a stream
    ended with any other status fails its appends with that status, unsent again."""
    servicer, address = follower
    pool = ChannelPool(DATA_PROFILE)
    link = PairLink(pool, "a", "b", address, LinkConfig(heartbeat=0.2, down_after=2.0), print)
    try:
        assert (await link.append(call(1, 10), 5.0)).last_index == 10
        servicer.calls.clear()
        servicer.end_next = grpc.StatusCode.UNAVAILABLE
        assert (await link.append(call(2, 20), 5.0)).last_index == 20
        assert servicer.streams == link.streams_opened == 2
        assert [n for n in servicer.calls if n] == [1, 1]  # sent, broken, resent: answered

        servicer.calls.clear()
        servicer.end_next = grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(PeerUnreachable, match="PERMISSION_DENIED"):
            await link.append(call(3, 30), 5.0)
        assert [n for n in servicer.calls if n] == [1]  # not resent
        assert (await link.append(call(4, 40), 5.0)).last_index == 40
        assert servicer.streams == link.streams_opened == 3
        assert not link.down
    finally:
        await link.close()
        await pool.close()


async def eventually_true(check: Any, within: float) -> None:
    end = time.monotonic() + within
    while not check():
        assert time.monotonic() < end, "condition never held"
        await asyncio.sleep(0.02)


def wal_marks(agents: Agents) -> dict[str, tuple[int, int]]:
    """(mtime_ns, size) of every agent's sqlite write-ahead log: a commit changes it."""
    marks = {}
    for node in agents.procs:
        wal = Path(agents.data_dir(node)) / "agent.db-wal"
        stat = wal.stat()
        marks[node] = (stat.st_mtime_ns, stat.st_size)
    return marks


async def isr_revisions(client: EtcdClient, keys: KeySpace) -> dict[bytes, int]:
    found = await client.list_prefix(keys.isr_prefix())
    return {kv.key: kv.mod_revision for kv in found.kvs}


@contextlib.asynccontextmanager
async def zone_in_sync(
    etcd: object,
    agents: Agents,
    client: EtcdClient,
    keys: KeySpace,
    nodes: tuple[str, ...],
    partitions: int,
) -> AsyncIterator[None]:
    """Agents ``nodes``, a driver, zone ``kv`` (``partitions`` × 3) with every ISR = stable."""
    for n in nodes:
        await agents.start(n)
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    async with running_driver(endpoint, keys, leases=LEASES) as driver:
        store = Metastore(client, keys)
        spec = ZoneSpec("kv", partitions=partitions, replicas=3)
        assert (await store.create_zone(spec, await leader_fence(driver))).applied
        await eventually(lambda: all_in_sync(client, keys, store, spec), "ISR = stable")
        yield


async def test_an_idle_cluster_writes_nothing_and_a_write_wakes_its_partition(
    etcd: object, agents: Agents, client: EtcdClient, keys: KeySpace
) -> None:
    async with zone_in_sync(etcd, agents, client, keys, ("n1", "n2", "n3"), 12):
        await put(agents, client, keys, "kv", 12, b"first", b"v1")
        await asyncio.sleep(2.5)  # the commit notices go out after 1 s of quiet; then hibernation
        wal, isrs = wal_marks(agents), await isr_revisions(client, keys)
        await asyncio.sleep(4.0)  # several lease renewals (3 s leases) and pair heartbeats
        assert wal_marks(agents) == wal, "an idle replica wrote to its database"
        assert await isr_revisions(client, keys) == isrs, "an in-sync set changed at rest"
        # A write wakes its partition: acknowledged, so on every member's disk.
        await put(agents, client, keys, "kv", 12, b"second", b"v2")
        after = wal_marks(agents)
        assert sum(after[n] != wal[n] for n in after) == 3


async def test_a_killed_member_leaves_every_idle_in_sync_set(
    etcd: object, agents: Agents, client: EtcdClient, keys: KeySpace
) -> None:
    async with zone_in_sync(etcd, agents, client, keys, ("n1", "n2", "n3", "n4"), 8):
        victim = "n2"
        hosted = []
        for p in range(8):
            isr = await isr_of(client, keys, "kv", p)
            assert isr is not None
            if victim in isr.members:
                hosted.append(p)
        assert hosted
        agents.procs[victim].send_signal(signal.SIGKILL)
        await agents.procs[victim].wait()

        async def dropped() -> bool:
            for p in hosted:
                isr = await isr_of(client, keys, "kv", p)
                if isr is None or victim in isr.members:
                    return False
            return True

        # No client writes at all: the wake-ups alone shrink the sets (to 2 >= min in-sync).
        await eventually(dropped, f"{victim} out of every in-sync set", within=TIMEOUT)
